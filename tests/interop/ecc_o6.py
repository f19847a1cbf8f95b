"""ECC sessions with o6 (open62541 1.5 inside) against `uascale serve`:
ECC_nistP256_AesGcm, ECC_nistP256_ChaChaPoly and ECC_curve25519 (what o6
offers), Sign and SignAndEncrypt, Anonymous and UserName (an
EccEncryptedSecret), Read/Write/Browse; one session per policy lives
through two token renewals (short lifetime; the server allows it). Then a
Basic256Sha256 session on the same server: RSA and ECC endpoints side by
side.

usage: ecc_o6.py URL DIR SERVER_PKI
  DIR holds client_ec-p256.{der,pem}, client_ed25519.{der,pem},
  client_rsa.{der,pem} and password.txt; SERVER_PKI/own/certs holds the
  server's certificates (cert.der RSA, cert_KEY.der ECC).
"""
import sys
import time

import o6
from common import check

POLICIES = [
    ("ECC_nistP256_AesGcm", "ec-p256"),
    ("ECC_nistP256_ChaChaPoly", "ec-p256"),
    ("ECC_curve25519", "ed25519"),
]
MODES = [o6.SecurityMode.SIGN, o6.SecurityMode.SIGN_AND_ENCRYPT]
URI = "http://opcfoundation.org/UA/SecurityPolicy#"


def session(url, d, pki, policy, key, mode, identity, password, renew):
    client = o6.Client(
        url,
        certificate=f"{d}/client_{key}.der",
        privateKey=f"{d}/client_{key}.pem",
        trustList=[f"{pki}/own/certs/" + ("cert.der" if key == "rsa" else f"cert_{key}.der")],
        securityMode=mode,
        securityPolicy=URI + policy,
        applicationUri="urn:test:interop-client",
    )
    if identity == "username":
        client.config.setUsernamePassword("operator", password)
    if renew:
        client.config.secureChannelLifeTime = 2500
    what = f"{policy}/{mode.name}/{identity}"
    client.connect(createDefaultSubscription=False)
    try:
        rounds = 3 if renew else 1
        for i in range(rounds):
            if i:
                # Past 75 % of the token lifetime: the next request renews.
                time.sleep(2.2)
            state = client.read("i=2259")
            check(state == 0, f"{what}: ServerState {state}")
            text = f"o6 {what} {i}"
            client.write("ns=2;s=Demo.Static.Scalar.String", text)
            back = client.read("ns=2;s=Demo.Static.Scalar.String")
            check(back == text, f"{what}: wrote {text!r}, read {back!r}")
        refs = client.browse("i=85", resultMask=63)
        names = [r.browseName.name for r in refs]
        check("Server" in names, f"{what}: Objects has {names}")
        print(f"ok {what}{' renewed' if renew else ''}", flush=True)
    finally:
        client.disconnect()


def main(url, d, pki):
    password = open(f"{d}/password.txt").read().strip()
    for policy, key in POLICIES:
        for mode in MODES:
            for identity in ["anonymous", "username"]:
                session(url, d, pki, policy, key, mode, identity, password, False)
        session(url, d, pki, policy, key, o6.SecurityMode.SIGN_AND_ENCRYPT,
                "username", password, True)
    session(url, d, pki, "Basic256Sha256", "rsa", o6.SecurityMode.SIGN_AND_ENCRYPT,
            "username", password, False)
    print("o6 ecc ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
