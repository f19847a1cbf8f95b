"""Transport and decoding limits with Python asyncua: an over-long string is a
per-request ServiceFault (the session lives on); a message over the
negotiated MaxMessageSize is a transport error that closes the channel.
HistoryRead answers that the node keeps no history.

usage: limits_asyncua.py URL
"""
import asyncio
import sys

from asyncua import Client, ua
from common import check



async def main(url):
    client = Client(url, timeout=10)
    await client.connect()
    node = client.get_node("ns=2;s=Demo.Static.Scalar.String")
    try:
        await node.read_raw_history()
        check(False, "HistoryRead must fail")
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadHistoryOperationUnsupported, f"HistoryRead {e}")
    try:
        await node.write_value(ua.DataValue(ua.Variant("x" * (2 << 20), ua.VariantType.String)))
        check(False, "a 2 MiB string must be refused")
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadEncodingLimitsExceeded, f"2 MiB string {e}")
    check(await node.read_value() != "", "session still works after the fault")
    try:
        await node.write_value(ua.DataValue(ua.Variant("x" * (17 << 20), ua.VariantType.String)))
        check(False, "a 17 MiB message must be refused")
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadRequestTooLarge, f"17 MiB message {e}")
    try:
        await client.disconnect()
    except Exception:
        pass  # the server closed the channel, as it must
    print("asyncua limits ok")


asyncio.run(main(sys.argv[1]))
