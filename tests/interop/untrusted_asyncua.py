"""A client whose certificate the server does not trust: OpenSecureChannel
fails with BadCertificateUntrusted (the server copies the certificate to
rejected/certs, which the Rust test checks).

usage: untrusted_asyncua.py URL DIR [trusted]   (DIR/stranger.der, DIR/stranger.pem)
With "trusted" (after the operator moved the certificate to trusted/certs)
the same client must connect and read.
"""
import asyncio
import sys

from asyncua import Client, ua
from common import check


async def main(url, d, trusted):
    client = Client(url, timeout=10)
    client.application_uri = "urn:test:stranger"
    await client.set_security_string(f"Basic256Sha256,SignAndEncrypt,{d}/stranger.der,{d}/stranger.pem")
    if trusted:
        async with client:
            state = await client.get_node("i=2259").read_value()
            check(state == 0, f"ServerState {state}")
        print("asyncua trusted after all ok")
        return
    try:
        await client.connect()
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadCertificateUntrusted, f"untrusted client gave {e}")
    else:
        check(False, "untrusted client connected")
    finally:
        try:
            await client.disconnect()
        except Exception:
            pass
    print("asyncua untrusted ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["trusted"]))
