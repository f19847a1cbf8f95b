"""A peer OPC UA server for the uascale client's interop tests.

usage: peer_server.py asyncua|o6 PORT
       peer_server.py asyncua-secure PORT CERT.der KEY.pem
       peer_server.py o6-ecc PORT CERT.der KEY.pem APPLICATION_URI

Serves namespace 0 plus one writable Double variable, `Temperature` (20.5),
under Objects, in namespace 1 with the string NodeId "Temperature"; prints
READY when it accepts connections and runs until stdin closes (the test
ends it by closing the pipe or killing it).

`asyncua-secure` serves with the given certificate and key on two
endpoints, None (for GetEndpoints) and Basic256Sha256 SignAndEncrypt, and
accepts any client certificate (asyncua's default without a validator), the
anonymous identity and the user `peer` with the password `peer-pass`.
"""

import asyncio
import sys


class PeerUsers:
    """Accepts anonymous sessions and one user name with its password."""

    def get_user(self, iserver, username=None, password=None, certificate=None):
        from asyncua.crypto.permission_rules import User, UserRole

        # (asyncua passes the channel's client certificate along for
        # anonymous sessions too.)
        if username is None:
            return User(role=UserRole.User)
        if username == "peer" and password == "peer-pass":
            return User(role=UserRole.User, name=username)
        return None


async def asyncua_server(port: int, cert=None, key=None):
    from asyncua import Server, ua

    server = Server(user_manager=PeerUsers() if cert else None)
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/")
    if cert:
        await server.load_certificate(cert)
        await server.load_private_key(key)
        server.set_security_policy(
            [
                ua.SecurityPolicyType.NoSecurity,
                ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
            ]
        )
    else:
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    idx = await server.register_namespace("urn:peer:test")
    assert idx == 2, idx
    objects = server.nodes.objects
    var = await objects.add_variable(ua.NodeId("Temperature", 1), "Temperature", 20.5)
    await var.set_writable()
    # Events from the Server object every 200 ms (for event subscriptions).
    evgen = await server.get_event_generator()

    async def events():
        n = 0
        while True:
            await asyncio.sleep(0.2)
            n += 1
            evgen.event.Message = ua.LocalizedText(f"peer event {n}")
            evgen.event.Severity = 500
            await evgen.trigger()

    async with server:
        ticker = asyncio.create_task(events())
        print("READY", flush=True)
        await wait_stdin_closed()
        ticker.cancel()


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


def o6_ecc_server(port: int, cert: str, key: str, uri: str):
    """o6 with an ECC certificate: a P-256 one offers ECC_nistP256_AesGcm
    and ECC_nistP256_ChaChaPoly, an Ed25519 one ECC_curve25519 (open62541
    picks the policies from the key). User `peer` / `peer-pass`."""
    import o6

    class Users(o6.AccessControl):
        def __init__(self):
            super().__init__(anonymous=True, username=True)

        def activateSession(self, endpoint, remoteCertificate, session, token):
            name = getattr(token, "userName", None)
            if name is None:
                return None
            if name == "peer" and bytes(token.password) == b"peer-pass":
                return None
            raise o6.StatusCodeError(0x801F0000)  # BadUserAccessDenied

    server = o6.Server(
        port=port,
        certificate=cert,
        privateKey=key,
        acceptAllCertificates=True,
        applicationUri=uri,
        accessControl=Users(),
    )
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
    elif kind == "asyncua-secure":
        asyncio.run(asyncua_server(port, sys.argv[3], sys.argv[4]))
    elif kind == "o6":
        o6_server(port)
    elif kind == "o6-ecc":
        o6_ecc_server(port, sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        sys.exit(f"unknown peer {kind!r}")


if __name__ == "__main__":
    main()
