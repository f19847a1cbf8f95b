"""Secured sessions with Python asyncua against uascale serve: every RSA
policy in Sign and SignAndEncrypt, each with the Anonymous, UserName and
X509 identities, doing Read, Write and Browse; a wrong password answered
BadUserAccessDenied; an X509 user the server does not trust refused.

usage: security_asyncua.py URL DIR
  DIR holds client.der / client.pem (application instance certificate,
  trusted by the server, applicationUri urn:test:interop-client),
  user.der / user.pem (trusted user certificate), stranger.der /
  stranger.pem (untrusted), and password.txt for user "operator".
"""
import asyncio
import sys

from asyncua import Client, ua
from common import check, expect_status

# asyncua's names (set_security_string) and the policy URIs' names.
POLICIES = {
    "Basic256Sha256": "Basic256Sha256",
    "Aes128Sha256RsaOaep": "Aes128_Sha256_RsaOaep",
    "Aes256Sha256RsaPss": "Aes256_Sha256_RsaPss",
}
MODES = ["Sign", "SignAndEncrypt"]
CLIENT_URI = "urn:test:interop-client"


async def client_for(url, d, policy, mode):
    client = Client(url, timeout=10)
    client.application_uri = CLIENT_URI
    await client.set_security_string(f"{policy},{mode},{d}/client.der,{d}/client.pem")
    return client


async def work(client, what):
    """Read, Write, Browse on the session."""
    state = await client.get_node("i=2259").read_value()
    check(state == 0, f"{what}: ServerState {state}")
    node = client.get_node("ns=2;s=Demo.Static.Scalar.Int32")
    value = hash(what) % 1000000
    await node.write_value(ua.DataValue(ua.Variant(value, ua.VariantType.Int32)))
    back = await node.read_value()
    check(back == value, f"{what}: wrote {value}, read {back}")
    names = [(await c.read_browse_name()).Name for c in await client.nodes.objects.get_children()]
    check("Server" in names, f"{what}: Objects has {names}")


async def one(url, d, policy, mode, password):
    what = f"{policy}/{mode}"
    # Anonymous.
    client = await client_for(url, d, policy, mode)
    async with client:
        await work(client, f"{what} anonymous")
    # UserName: a wrong password first (BadUserAccessDenied), then the right one.
    client = await client_for(url, d, policy, mode)
    client.set_user("operator")
    client.set_password("not the password")
    try:
        await client.connect()
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadUserAccessDenied, f"{what}: wrong password gave {e}")
    else:
        check(False, f"{what}: wrong password accepted")
    finally:
        await client.disconnect()
    client = await client_for(url, d, policy, mode)
    client.set_user("operator")
    client.set_password(password)
    async with client:
        await work(client, f"{what} username")
    # X509 user.
    client = await client_for(url, d, policy, mode)
    await client.load_client_certificate(f"{d}/user.der")
    await client.load_private_key(f"{d}/user.pem")
    async with client:
        await work(client, f"{what} x509")


async def main(url, d):
    password = open(f"{d}/password.txt").read().strip()
    # The endpoints: None plus every policy in both modes, each with the
    # three token types.
    probe = Client(url, timeout=10)
    eps = await probe.connect_and_get_server_endpoints()
    pairs = sorted((e.SecurityPolicyUri.split("#")[1], e.SecurityMode.name) for e in eps)
    want = sorted([("None", "None_")] + [(p, m) for p in POLICIES.values() for m in MODES])
    check(pairs == want, f"endpoints {pairs}")
    for e in eps:
        if e.SecurityMode != ua.MessageSecurityMode.None_:
            check(len(e.ServerCertificate) > 0, "endpoint carries the server certificate")
            kinds = sorted(t.TokenType.name for t in e.UserIdentityTokens)
            check(kinds == ["Anonymous", "Certificate", "UserName"], f"token policies {kinds}")
    for policy in POLICIES:
        for mode in MODES:
            await one(url, d, policy, mode, password)
    # An X509 user certificate nobody trusts.
    client = await client_for(url, d, "Basic256Sha256", "SignAndEncrypt")
    await client.load_client_certificate(f"{d}/stranger.der")
    await client.load_private_key(f"{d}/stranger.pem")
    try:
        await client.connect()
    except ua.UaStatusCodeError as e:
        check(e.code == ua.StatusCodes.BadUserAccessDenied, f"untrusted X509 user gave {e}")
    else:
        check(False, "untrusted X509 user accepted")
    finally:
        await client.disconnect()
    print("asyncua security ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
