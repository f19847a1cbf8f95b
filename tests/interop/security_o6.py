"""Secured sessions with o6 (open62541's client) against uascale serve: every
RSA policy in Sign and SignAndEncrypt with the Anonymous, UserName and X509
identities, doing Read, Write and Browse. (connect() is asked not to create
its default subscription.)

usage: security_o6.py URL DIR SERVER_CERT  (DIR as for security_asyncua.py)
"""
import sys

import o6
from common import check

POLICIES = [
    o6.SecurityPolicy.BASIC256SHA256,
    o6.SecurityPolicy.AES128_SHA256_RSAOAEP,
    o6.SecurityPolicy.AES256_SHA256_RSAPSS,
]
MODES = [o6.SecurityMode.SIGN, o6.SecurityMode.SIGN_AND_ENCRYPT]


def session(url, d, server_cert, policy, mode, identity, password):
    client = o6.Client(
        url,
        certificate=f"{d}/client.der",
        privateKey=f"{d}/client.pem",
        trustList=[server_cert],
        securityMode=mode,
        securityPolicy=policy,
        applicationUri="urn:test:interop-client",
    )
    if identity == "username":
        client.config.setUsernamePassword("operator", password)
    elif identity == "x509":
        with open(f"{d}/user.der", "rb") as c, open(f"{d}/user.pem", "rb") as k:
            client.config.setAuthenticationCert(c.read(), k.read())
    what = f"{policy.name}/{mode.name}/{identity}"
    client.connect(createDefaultSubscription=False)
    try:
        state = client.read("i=2259")
        check(state == 0, f"{what}: ServerState {state}")
        text = f"o6 {what}"
        client.write("ns=2;s=Demo.Static.Scalar.String", text)
        back = client.read("ns=2;s=Demo.Static.Scalar.String")
        check(back == text, f"{what}: wrote {text!r}, read {back!r}")
        refs = client.browse("i=85", resultMask=63)  # BrowseResultMask All
        names = [r.browseName.name for r in refs]
        check("Server" in names, f"{what}: Objects has {names}")
    finally:
        client.disconnect()


def main(url, d, server_cert):
    password = open(f"{d}/password.txt").read().strip()
    for policy in POLICIES:
        for mode in MODES:
            for identity in ["anonymous", "username", "x509"]:
                session(url, d, server_cert, policy, mode, identity, password)
    print("o6 security ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
