"""Python asyncua through the cluster's front end: a session made through
HAProxy, its node killed, then a new channel through HAProxy and
ActivateSession of the same session on whichever node answers.

asyncua 2.1 makes a new session when it reconnects; this script drives its
own steps instead (connect_socket, send_hello, open_secure_channel,
activate_session) with the old session's authentication token and last
nonce, as a client that keeps its session would.

Usage: cluster_asyncua.py URL. Prints READY after the first Read, waits
for a line on stdin (the test kills the node then), prints OK
after the Read on the moved session.
"""
import asyncio
import sys

from asyncua import Client, ua

from common import check

CURRENT_TIME = ua.NodeId(2258, 0)


async def main(url):
    first = Client(url, timeout=10)
    await first.connect()
    before = await first.get_node(CURRENT_TIME).read_value()
    token = first.uaclient.protocol.authentication_token
    nonce = first._server_nonce
    policies = first._policy_ids
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    # The old channel is dead: a new one through the front end, and the
    # same session activated on it.
    moved = Client(url, timeout=10)
    await moved.connect_socket()
    await moved.send_hello()
    await moved.open_secure_channel()
    moved.uaclient.protocol.authentication_token = token
    moved._server_nonce = nonce
    moved._policy_ids = policies
    result = await moved.activate_session()
    check(result.ServerNonce and result.ServerNonce != nonce, "a fresh nonce")
    after = await moved.get_node(CURRENT_TIME).read_value()
    check(after >= before, f"the server's time goes on: {before} then {after}")
    print("OK", flush=True)
    await moved.close_session()
    moved.disconnect_socket()


asyncio.run(main(sys.argv[1]))
