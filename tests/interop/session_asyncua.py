"""Session establishment against a uascale server with Python asyncua.

usage: session_asyncua.py URL
CreateSession + ActivateSession (anonymous) through asyncua's own connect(),
a Read on the session, a forged authentication token refused with
BadSessionIdInvalid, QueryFirst (not implemented) answered with
BadServiceUnsupported, and CloseSession through disconnect().
"""
import asyncio
import sys

from asyncua import Client, ua
from common import check



async def main(url):
    client = Client(url, timeout=10)
    await client.connect()
    ns = await client.nodes.namespace_array.read_value()
    check(ns == ["http://opcfoundation.org/UA/", "urn:uascale:server", "urn:uascale:demo", "http://uascale.example/Devices/", "http://uascale.example/Machines/"], f"NamespaceArray {ns} (demo, then the test nodesets)")
    try:
        await client.uaclient.protocol.send_request(ua.QueryFirstRequest())
        check(False, "the Query service set is not implemented and must fault")
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadServiceUnsupported, f"QueryFirst fault {e}")
    # The same request with a token the server never issued.
    real = client.uaclient.protocol.authentication_token
    client.uaclient.protocol.authentication_token = ua.NodeId(b"forged-token-forged-token-forged", 0, ua.NodeIdType.ByteString)
    try:
        await client.nodes.namespace_array.read_value()
        check(False, "a forged token must be refused")
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadSessionIdInvalid, f"forged token fault {e}")
    client.uaclient.protocol.authentication_token = real
    await client.disconnect()
    print("asyncua session ok")


asyncio.run(main(sys.argv[1]))
