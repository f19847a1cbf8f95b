//! The ECC primitives against vectors computed independently with Python
//! `cryptography` (`tests/vectors/ecc_vectors.py`, whose output is
//! `tests/vectors/ecc_vectors.txt`): nonce layout (X||Y without 0x04), ECDH
//! x-coordinate, HKDF with the Part 6 salt layout, chained renewal secrets,
//! raw r||s ECDSA (P-384 certificate on a P-256 policy too), Ed25519 and
//! the AEAD chunk layout with the masked IV.

use std::collections::HashMap;

use uascale_crypto::ecc::{hkdf, EccCurve, EccPrivateKey, EccPublicKey, EphemeralKey, HkdfHash};
use uascale_crypto::policy::{derive_ecc_keys, AeadChunk, SecurityPolicy, SymmetricKeys};
use uascale_types::StatusCode;

fn vectors() -> HashMap<String, Vec<u8>> {
    let text = include_str!("vectors/ecc_vectors.txt");
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let bytes = (0..v.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
                .collect();
            (k.to_owned(), bytes)
        })
        .collect()
}

fn get<'a>(v: &'a HashMap<String, Vec<u8>>, k: &str) -> &'a [u8] {
    v.get(k).unwrap_or_else(|| panic!("no vector {k}"))
}

/// Encrypts one block of zeros with the keys' CBC key or seals an empty
/// AEAD chunk, so that two key sets can be compared through behaviour.
fn fingerprint(k: &SymmetricKeys) -> Vec<u8> {
    let mut out = Vec::new();
    if k.is_aead() {
        let mut chunk = vec![0u8; 16 + 8 + 16];
        let how = AeadChunk {
            head_len: 16,
            encrypt: true,
            token_id: 1,
            previous_sequence_number: 0,
        };
        k.seal_aead(&mut chunk, how).unwrap();
        out.extend_from_slice(&chunk);
        let mut chunk = vec![0u8; 16 + 8 + 16];
        k.seal_aead(
            &mut chunk,
            AeadChunk {
                encrypt: false,
                ..how
            },
        )
        .unwrap();
        out.extend_from_slice(&chunk);
    } else {
        let mut block = [0u8; 32];
        k.encrypt(&mut block).unwrap();
        out.extend_from_slice(&block);
        k.sign(b"x", &mut out).unwrap();
    }
    out
}

#[test]
fn key_derivation_matches_the_python_vectors() {
    let v = vectors();
    for policy in SecurityPolicy::ECC {
        let p = policy.uri().rsplit('#').next().unwrap();
        let curve = policy.curve().unwrap();
        let client =
            EphemeralKey::from_private_bytes(curve, get(&v, &format!("{p}.client_private")))
                .unwrap();
        let server =
            EphemeralKey::from_private_bytes(curve, get(&v, &format!("{p}.server_private")))
                .unwrap();
        // Nonce layout: X || Y without the 0x04 prefix (raw for X25519).
        assert_eq!(client.public_nonce(), get(&v, &format!("{p}.client_nonce")));
        assert_eq!(server.public_nonce(), get(&v, &format!("{p}.server_nonce")));
        // ECDH: the x-coordinate only.
        let z = server.agree(client.public_nonce()).unwrap();
        assert_eq!(z.as_bytes(), get(&v, &format!("{p}.shared_secret")));
        assert_eq!(client.agree(server.public_nonce()).unwrap(), z);
        // HKDF with salt = info = L || label || nonces.
        let keys =
            derive_ecc_keys(policy, &z, client.public_nonce(), server.public_nonce()).unwrap();
        let material = |name: &str| {
            let m = get(&v, &format!("{p}.{name}"));
            let s = policy.signing_key_length();
            let e = policy.encrypting_key_length();
            assert_eq!(m.len(), s + e + policy.iv_length());
            SymmetricKeys::new(policy, &m[..s], &m[s..s + e], &m[s + e..]).unwrap()
        };
        assert_eq!(
            fingerprint(&keys.client),
            fingerprint(&material("client_keys")),
            "{p} client keys"
        );
        assert_eq!(
            fingerprint(&keys.server),
            fingerprint(&material("server_keys")),
            "{p} server keys"
        );
        assert_ne!(fingerprint(&keys.client), fingerprint(&keys.server));
        // The salt layout, byte for byte.
        let len = policy.signing_key_length() + policy.encrypting_key_length() + policy.iv_length();
        let salt = uascale_crypto::ecc::salt(
            len,
            b"opcua-client",
            client.public_nonce(),
            server.public_nonce(),
        );
        assert_eq!(salt, get(&v, &format!("{p}.client_salt")));
        // A chained renewal: IKM_1 = Z_1 XOR Z_0, then the same HKDF.
        let c1 =
            EphemeralKey::from_private_bytes(curve, get(&v, &format!("{p}.renew_client_private")))
                .unwrap();
        let s1 =
            EphemeralKey::from_private_bytes(curve, get(&v, &format!("{p}.renew_server_private")))
                .unwrap();
        let ikm = s1.agree(c1.public_nonce()).unwrap().chained(&z).unwrap();
        assert_eq!(ikm.as_bytes(), get(&v, &format!("{p}.renew_chained_ikm")));
        let renewed = derive_ecc_keys(policy, &ikm, c1.public_nonce(), s1.public_nonce()).unwrap();
        assert_eq!(
            fingerprint(&renewed.client),
            fingerprint(&material("renew_client_keys_chained")),
            "{p} chained renewal keys"
        );
    }
}

#[test]
fn hkdf_matches_rfc_5869_case_1() {
    let v = vectors();
    let mut out = [0u8; 42];
    let salt: Vec<u8> = (0..13).collect();
    let info: Vec<u8> = (0xf0..0xfa).collect();
    hkdf(HkdfHash::Sha256, &salt, &[0x0b; 22], &info, &mut out);
    assert_eq!(&out[..], get(&v, "hkdf_sha256.okm42"));
}

#[test]
fn python_signatures_verify_raw_r_s() {
    let v = vectors();
    let msg = get(&v, "message");
    for (name, curve, policy_curve) in [
        ("P256", EccCurve::NistP256, EccCurve::NistP256),
        ("P384", EccCurve::NistP384, EccCurve::NistP384),
        // A P-384 certificate on ECC_nistP256: ECDSA-SHA256, 96 bytes.
        ("P384_SHA256", EccCurve::NistP384, EccCurve::NistP256),
        ("ed25519", EccCurve::Curve25519, EccCurve::Curve25519),
    ] {
        let prefix = if name == "ed25519" {
            "ed25519".to_owned()
        } else {
            format!("ecdsa_{name}")
        };
        let public = EccPublicKey::from_spki_der(get(&v, &format!("{prefix}.spki"))).unwrap();
        assert_eq!(public.curve(), curve);
        let sig = get(&v, &format!("{prefix}.signature"));
        assert_eq!(sig.len(), curve.signature_length());
        public.verify(policy_curve, msg, sig).unwrap();
        let mut bad = sig.to_vec();
        bad[0] ^= 1;
        let e = public.verify(policy_curve, msg, &bad).unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
        // Our key from the same PKCS#8 signs what Python's key verifies.
        let private = EccPrivateKey::from_pkcs8_der(get(&v, &format!("{prefix}.pkcs8"))).unwrap();
        assert_eq!(private.public_key().spki_der(), public.spki_der());
        let mut ours = Vec::new();
        private.sign(msg, &mut ours).unwrap();
        if name == "ed25519" {
            // Deterministic: the same bytes.
            assert_eq!(ours, sig);
        }
        if name != "P384_SHA256" {
            public.verify(policy_curve, msg, &ours).unwrap();
        }
    }
}

#[test]
fn aead_chunks_match_the_python_vectors() {
    let v = vectors();
    for (name, policy) in [
        ("aesgcm", SecurityPolicy::EccNistP256AesGcm),
        ("chacha", SecurityPolicy::EccNistP256ChaChaPoly),
    ] {
        let keys = SymmetricKeys::new(
            policy,
            &[],
            get(&v, &format!("aead_{name}.key")),
            get(&v, &format!("aead_{name}.iv")),
        )
        .unwrap();
        let plain = get(&v, &format!("aead_{name}.plain_chunk"));
        let how = AeadChunk {
            head_len: 16,
            encrypt: true,
            token_id: 7,
            previous_sequence_number: 4,
        };
        for (encrypt, expected) in [
            (true, get(&v, &format!("aead_{name}.encrypted_chunk"))),
            (false, get(&v, &format!("aead_{name}.signed_chunk"))),
        ] {
            let how = AeadChunk { encrypt, ..how };
            let mut chunk = plain.to_vec();
            chunk.extend_from_slice(&[0; 16]);
            keys.seal_aead(&mut chunk, how).unwrap();
            assert_eq!(chunk, expected, "{name} encrypt={encrypt}");
            let len = keys.open_aead(&mut chunk, how).unwrap();
            assert_eq!(&chunk[..len], plain);
            // Tampering with any byte, or another sequence number, fails.
            for at in [0, 10, 16, 30, expected.len() - 1] {
                let mut t = expected.to_vec();
                t[at] ^= 0x40;
                let e = keys.open_aead(&mut t, how).unwrap_err();
                assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
            }
            let mut t = expected.to_vec();
            let wrong = AeadChunk {
                previous_sequence_number: 5,
                ..how
            };
            assert!(keys.open_aead(&mut t, wrong).is_err());
        }
    }
}
