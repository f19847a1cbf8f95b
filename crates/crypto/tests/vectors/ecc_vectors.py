#!/usr/bin/env python3
"""Independent ECC vectors for uascale-crypto (Part 6 §6.8), computed with
Python `cryptography` only; `ecc_vectors.txt` beside this script is its output
and `crates/crypto/tests/ecc_vectors.rs` reads it.

Run from this directory:  python3 ecc_vectors.py > ecc_vectors.txt

Every value is fixed (private scalars are constants), except the ECDSA
signatures, which are randomised; those are checked by verifying, not by
comparing bytes.
"""
import hashlib
import hmac
import struct

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

OUT = []


def emit(name, value):
    OUT.append(f"{name}={value.hex() if isinstance(value, (bytes, bytearray)) else value}")


def scalar(seed, curve):
    """A fixed private scalar below the order, from a label."""
    n = {"P256": 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
         "P384": int("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF"
                     "581A0DB248B0A77AECEC196ACCC52973", 16)}[curve]
    size = 32 if curve == "P256" else 48
    d = int.from_bytes(hashlib.sha512(seed.encode()).digest()[:size], "big") % (n - 1) + 1
    return d.to_bytes(size, "big")


def nist_pair(seed, curve):
    crv = ec.SECP256R1() if curve == "P256" else ec.SECP384R1()
    d = scalar(seed, curve)
    key = ec.derive_private_key(int.from_bytes(d, "big"), crv)
    point = key.public_key().public_bytes(serialization.Encoding.X962,
                                          serialization.PublicFormat.UncompressedPoint)
    assert point[0] == 4
    return d, key, point[1:]  # nonce = X || Y, no 0x04


def x25519_pair(seed):
    d = hashlib.sha256(seed.encode()).digest()
    key = x25519.X25519PrivateKey.from_private_bytes(d)
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return d, key, pub


def hkdf(hash_alg, salt, ikm, info, length):
    return HKDF(algorithm=hash_alg, length=length, salt=salt, info=info).derive(ikm)


def salt(length, label, first, second):
    return struct.pack("<H", length) + label + first + second


# name, curve, hash, signing key, encrypting key, IV
POLICIES = [
    ("ECC_nistP256", "P256", hashes.SHA256(), 32, 16, 16),
    ("ECC_nistP384", "P384", hashes.SHA384(), 48, 32, 16),
    ("ECC_curve25519", "X25519", hashes.SHA256(), 32, 32, 12),
    ("ECC_nistP256_AesGcm", "P256", hashes.SHA256(), 0, 16, 12),
    ("ECC_nistP256_ChaChaPoly", "P256", hashes.SHA256(), 0, 32, 12),
]

for name, curve, h, sk, ek, iv in POLICIES:
    p = name
    if curve == "X25519":
        cd, ckey, cn = x25519_pair(p + "/client")
        sd, skey, sn = x25519_pair(p + "/server")
        z = skey.exchange(x25519.X25519PublicKey.from_public_bytes(cn))
        assert z == ckey.exchange(x25519.X25519PublicKey.from_public_bytes(sn))
    else:
        cd, ckey, cn = nist_pair(p + "/client", curve)
        sd, skey, sn = nist_pair(p + "/server", curve)
        z = skey.exchange(ec.ECDH(), ckey.public_key())  # x-coordinate only
        assert z == ckey.exchange(ec.ECDH(), skey.public_key())
    length = sk + ek + iv
    csalt = salt(length, b"opcua-client", cn, sn)
    ssalt = salt(length, b"opcua-server", sn, cn)
    emit(f"{p}.client_private", cd)
    emit(f"{p}.server_private", sd)
    emit(f"{p}.client_nonce", cn)
    emit(f"{p}.server_nonce", sn)
    emit(f"{p}.shared_secret", z)
    emit(f"{p}.client_salt", csalt)
    emit(f"{p}.client_keys", hkdf(h, csalt, z, csalt, length))
    emit(f"{p}.server_keys", hkdf(h, ssalt, z, ssalt, length))
    # A renewal that chains the secret (SecureChannelEnhancements, Part 6
    # 1.05.07 §6.8.1 step 2): IKM_1 = Z_1 XOR IKM_0, with IKM_0 = Z_0.
    if curve == "X25519":
        cd2, ckey2, cn2 = x25519_pair(p + "/client2")
        sd2, skey2, sn2 = x25519_pair(p + "/server2")
        z2 = skey2.exchange(x25519.X25519PublicKey.from_public_bytes(cn2))
    else:
        cd2, ckey2, cn2 = nist_pair(p + "/client2", curve)
        sd2, skey2, sn2 = nist_pair(p + "/server2", curve)
        z2 = skey2.exchange(ec.ECDH(), ckey2.public_key())
    emit(f"{p}.renew_client_private", cd2)
    emit(f"{p}.renew_server_private", sd2)
    chained = bytes(a ^ b for a, b in zip(z, z2))
    csalt2 = salt(length, b"opcua-client", cn2, sn2)
    emit(f"{p}.renew_chained_ikm", chained)
    emit(f"{p}.renew_client_keys_chained",
         hkdf(h, csalt2, chained, csalt2, length))

# HKDF itself (RFC 5869 test case 1, recomputed here with HMAC by hand).
ikm = bytes([0x0b] * 22)
s = bytes(range(13))
info = bytes(range(0xf0, 0xfa))
prk = hmac.new(s, ikm, hashlib.sha256).digest()
t, okm = b"", b""
for i in range(1, 4):
    t = hmac.new(prk, t + info + bytes([i]), hashlib.sha256).digest()
    okm += t
emit("hkdf_sha256.okm42", okm[:42])
assert okm[:42] == hkdf(hashes.SHA256(), s, ikm, info, 42)

# ECDSA: raw r||s signatures, fixed width.
MSG = b"uascale ECC vector message"
emit("message", MSG)
for curve, crv, h, size in [("P256", ec.SECP256R1(), hashes.SHA256(), 32),
                            ("P384", ec.SECP384R1(), hashes.SHA384(), 48),
                            ("P384_SHA256", ec.SECP384R1(), hashes.SHA256(), 48)]:
    base = "P384" if curve.startswith("P384") else "P256"
    key = ec.derive_private_key(int.from_bytes(scalar("sig/" + base, base), "big"), crv)
    der = key.sign(MSG, ec.ECDSA(h))
    r, s_ = decode_dss_signature(der)
    raw = r.to_bytes(size, "big") + s_.to_bytes(size, "big")
    emit(f"ecdsa_{curve}.pkcs8", key.private_bytes(serialization.Encoding.DER,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    emit(f"ecdsa_{curve}.spki", key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))
    emit(f"ecdsa_{curve}.signature", raw)

# Ed25519 is deterministic: the signature itself is the vector.
ek = ed25519.Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"sig/ed25519").digest())
emit("ed25519.pkcs8", ek.private_bytes(serialization.Encoding.DER,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
emit("ed25519.spki", ek.public_key().public_bytes(
    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))
emit("ed25519.signature", ek.sign(MSG))

# AEAD chunks: IV masked with TokenId (bytes 0..4) and the previous sequence
# number (bytes 4..8), both little-endian; SignAndEncrypt authenticates the
# 16 header bytes and encrypts the rest; Sign authenticates the whole chunk.
def masked(iv, token, prev_seq):
    m = bytearray(iv)
    for i, b in enumerate(struct.pack("<II", token, prev_seq)):
        m[i] ^= b
    return bytes(m)


for name, cls, klen in [("aesgcm", AESGCM, 16), ("chacha", ChaCha20Poly1305, 32)]:
    key = bytes(range(klen))
    iv = bytes(range(100, 112))
    token, seq = 7, 5
    body = b"sequence+request+body of an AEAD chunk"
    plain = struct.pack("<II", seq, 99) + body
    total = 16 + len(plain) + 16
    head = b"MSGF" + struct.pack("<III", total, 3, token)
    enc = cls(key).encrypt(masked(iv, token, seq - 1), plain, head)
    emit(f"aead_{name}.key", key)
    emit(f"aead_{name}.iv", iv)
    emit(f"aead_{name}.plain_chunk", head + plain)
    emit(f"aead_{name}.encrypted_chunk", head + enc)
    signed = head + plain
    tag = cls(key).encrypt(masked(iv, token, seq - 1), b"", signed)
    emit(f"aead_{name}.signed_chunk", signed + tag)

print("\n".join(OUT))
