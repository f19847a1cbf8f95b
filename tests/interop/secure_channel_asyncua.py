"""Secure channels opened by Python asyncua (a client nobody here wrote)
against the proto-level harness of crates/proto/tests/asyncua_secure_channel.rs.

The harness speaks only the secure channel: it answers every service request
with a ServiceFault (BadServiceUnsupported) whose string table is large when
the request was large, so a fault that decodes proves that signing and
encryption work both ways, over several chunks.

For every policy and mode: HEL/ACK, OPN Issue, a small and a chunked request,
an OPN Renew, a request under the new token, CLO.

usage: secure_channel_asyncua.py URL DIR (DIR holds server.der, client.der,
client_key.der)
"""

import asyncio
import sys

from asyncua import Client, ua
from asyncua.crypto import security_policies as sp

POLICIES = [
    sp.SecurityPolicyBasic256Sha256,
    sp.SecurityPolicyAes128Sha256RsaOaep,
    sp.SecurityPolicyAes256Sha256RsaPss,
]
MODES = [ua.MessageSecurityMode.Sign, ua.MessageSecurityMode.SignAndEncrypt]


async def expect_fault(client, uris, what):
    params = ua.FindServersParameters()
    params.EndpointUrl = client.server_url.geturl()
    params.ServerUris = uris
    try:
        await client.uaclient.find_servers(params)
    except ua.UaStatusCodeError as e:
        if e.code != ua.StatusCodes.BadServiceUnsupported:
            raise AssertionError(f"{what}: unexpected code {e}") from e
        return
    raise AssertionError(f"{what}: the harness answered with success")


async def one(url, d, policy, mode):
    client = Client(url, timeout=10)
    await client.set_security(
        policy,
        f"{d}/client.der",
        f"{d}/client_key.der",
        server_certificate=f"{d}/server.der",
        mode=mode,
    )
    name = f"{policy.__name__}/{mode.name}"
    await client.connect_socket()
    try:
        await client.send_hello()
        await client.open_secure_channel()
        await expect_fault(client, [], f"{name} small")
        # About 50 KB: several 8 KiB chunks; the harness answers with a
        # 120 KB string table, several chunks back.
        await expect_fault(client, [f"urn:x:{i:06d}" for i in range(3000)], f"{name} chunked")
        await client.open_secure_channel(renew=True)
        client.uaclient.revolve_security_token()
        await expect_fault(client, [f"urn:y:{i}" for i in range(10)], f"{name} after renew")
        await client.close_secure_channel()
    finally:
        client.disconnect_socket()
    print(f"ok {name}", flush=True)


async def main():
    url, d = sys.argv[1], sys.argv[2]
    for policy in POLICIES:
        for mode in MODES:
            await asyncio.wait_for(one(url, d, policy, mode), 30)
    print("all ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
