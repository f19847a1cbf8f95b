"""Helpers shared by the interop scripts."""
import sys

from asyncua import ua


def check(cond, what):
    """Exit 1 with a message when `cond` is false."""
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


async def expect_status(coro, code, what):
    """Await `coro` and require that it fails with StatusCode `code`."""
    try:
        await coro
    except ua.UaStatusCodeError as e:
        check(e.code == code, f"{what}: got {e}")
        return
    check(False, f"{what}: no error")
