"""A peer OPC UA server for the uascale client's interop tests.

usage: peer_server.py asyncua|o6 PORT

Serves namespace 0 plus one writable Double variable, `Temperature` (20.5),
under Objects, in namespace 1 with the string NodeId "Temperature"; prints
READY when it accepts connections and runs until stdin closes (the test
ends it by closing the pipe or killing it).
"""

import asyncio
import sys


async def asyncua_server(port: int):
    from asyncua import Server, ua

    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/")
    server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    idx = await server.register_namespace("urn:peer:test")
    assert idx == 2, idx
    objects = server.nodes.objects
    var = await objects.add_variable(ua.NodeId("Temperature", 1), "Temperature", 20.5)
    await var.set_writable()
    async with server:
        print("READY", flush=True)
        await wait_stdin_closed()


def o6_server(port: int):
    import o6

    server = o6.Server(port=port)
    server.addVariable(
        "Temperature", server.objectsNode, 20.5, nodeId="ns=1;s=Temperature"
    )
    server.start()
    print("READY", flush=True)
    sys.stdin.read()
    server.stop()


async def wait_stdin_closed():
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


def main():
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "asyncua":
        asyncio.run(asyncua_server(port))
    elif kind == "o6":
        o6_server(port)
    else:
        sys.exit(f"unknown peer {kind!r}")


if __name__ == "__main__":
    main()
