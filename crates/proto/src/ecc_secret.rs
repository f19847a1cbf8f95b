//! The EccEncryptedSecret (Part 4 §7.40.2.5, Part 6 §6.8.3): how a
//! UserName password travels under an ECC policy. The client encrypts it
//! for the server's session ephemeral key (the ECDHKey it got in the
//! CreateSession or ActivateSession response header) with a fresh
//! ephemeral key of its own, and signs the whole with its application key.
//!
//! ```text
//! TypeId             NodeId     i=17546 (EccEncryptedSecret)
//! EncodingMask       Byte       0x01
//! Length             UInt32     bytes after this field, through the signature
//! SecurityPolicyUri  String
//! SigningCertificate ByteString the sender's application certificate
//! SigningTime        DateTime
//! KeyDataLength      UInt16     size of the two ByteStrings that follow
//! SenderPublicKey    ByteString the client's ephemeral key (X||Y)
//! ReceiverPublicKey  ByteString the server's ECDHKey
//! -- encrypted (CBC, or AEAD with everything above as AAD and the tag after) --
//! Nonce              ByteString the last ServerNonce of the session
//! Secret             ByteString the password
//! Padding            Byte[n]    each n & 0xff
//! PaddingSize        UInt16     n; the encrypted part is a whole number of
//!                               16-byte blocks, and n + len(Secret) >= 16
//! -- end of encrypted part --
//! Signature          Byte[]     over everything before it
//! ```
//!
//! The key and IV: HKDF(salt = info = `u16le(L) || "opcua-secret" ||
//! SenderPublicKey || ReceiverPublicKey`, IKM = ECDH), L = key + IV length;
//! the AEAD IV is used unmasked. The receiver checks the signature before
//! it decrypts, then the nonce, then the padding.

use uascale_crypto::ecc::{hkdf, salt, EccPrivateKey, EccPublicKey, EphemeralKey};
use uascale_crypto::policy::{AeadChunk, SecurityPolicy, SymmetricKeys, AEAD_TAG_LEN};
use uascale_crypto::CryptoError;
use uascale_types::{
    AdditionalParametersType, BinaryDecode, BinaryEncode, ByteString, DateTime, DecodeLimits,
    EphemeralKeyType, ExtensionObject, KeyValuePair, NodeId, QualifiedName, Reader, StatusCode,
    UaString, Variant,
};

/// The DataType id of EccEncryptedSecret.
pub const ECC_ENCRYPTED_SECRET: u32 = 17546;

/// Alignment of the encrypted part.
const BLOCK: usize = 16;

fn invalid(what: &'static str) -> CryptoError {
    CryptoError::Peer {
        status: StatusCode::BadIdentityTokenInvalid,
        what,
    }
}

/// The symmetric keys for the secret: a throwaway signing key of the
/// policy's length (never used), the derived encrypting key and IV.
fn secret_keys(
    policy: SecurityPolicy,
    agreement: &[u8],
    sender_public: &[u8],
    receiver_public: &[u8],
) -> Result<SymmetricKeys, CryptoError> {
    let e = policy.encrypting_key_length();
    let len = e + policy.iv_length();
    let s = salt(len, b"opcua-secret", sender_public, receiver_public);
    let mut material = [0u8; 32 + 16];
    let out = material.get_mut(..len).unwrap_or_default();
    hkdf(policy.hkdf_hash(), &s, agreement, &s, out);
    let unused_signing = vec![0u8; policy.signing_key_length()];
    let keys = SymmetricKeys::new(
        policy,
        &unused_signing,
        out.get(..e).unwrap_or_default(),
        out.get(e..).unwrap_or_default(),
    );
    material.fill(0);
    keys
}

/// Encrypts `secret` for the server: `receiver_public` is the server's
/// ECDHKey, `server_nonce` the session's last ServerNonce, `signer` and
/// `signer_certificate` our application key and certificate.
pub fn encrypt(
    policy: SecurityPolicy,
    signer: &EccPrivateKey,
    signer_certificate: &[u8],
    receiver_public: &[u8],
    server_nonce: &[u8],
    secret: &[u8],
    signing_time: DateTime,
) -> Result<Vec<u8>, CryptoError> {
    let curve = policy.curve().ok_or(CryptoError::Config {
        what: "EccEncryptedSecret under a policy that is not ECC",
    })?;
    let ephemeral = EphemeralKey::generate(curve)?;
    let z = ephemeral.agree(receiver_public)?;
    let keys = secret_keys(
        policy,
        z.as_bytes(),
        ephemeral.public_nonce(),
        receiver_public,
    )?;

    let base = 4 + server_nonce.len() + 4 + secret.len();
    let mut padding = (BLOCK - (base + 2) % BLOCK) % BLOCK;
    if padding + secret.len() < BLOCK {
        padding += BLOCK;
    }
    let tag = if policy.is_aead() { AEAD_TAG_LEN } else { 0 };

    let mut key_data = Vec::new();
    ByteString::new(ephemeral.public_nonce().to_vec()).encode(&mut key_data);
    ByteString::new(receiver_public.to_vec()).encode(&mut key_data);

    let mut out = Vec::new();
    NodeId::numeric(0, ECC_ENCRYPTED_SECRET).encode(&mut out);
    out.push(0x01);
    let length_at = out.len();
    0u32.encode(&mut out);
    UaString::from(policy.uri()).encode(&mut out);
    ByteString::new(signer_certificate.to_vec()).encode(&mut out);
    signing_time.encode(&mut out);
    u16::try_from(key_data.len())
        .map_err(|_| invalid("key data too long"))?
        .encode(&mut out);
    out.extend_from_slice(&key_data);
    let payload_at = out.len();
    ByteString::new(server_nonce.to_vec()).encode(&mut out);
    ByteString::new(secret.to_vec()).encode(&mut out);
    out.resize(out.len() + padding, (padding & 0xff) as u8);
    u16::try_from(padding)
        .map_err(|_| invalid("padding"))?
        .encode(&mut out);
    // The length counts everything after its own field, signature included.
    let total = out.len() + tag + signer.signature_length();
    let length = u32::try_from(total - length_at - 4).map_err(|_| invalid("too long"))?;
    if let Some(f) = out.get_mut(length_at..length_at + 4) {
        f.copy_from_slice(&length.to_le_bytes());
    }
    if policy.is_aead() {
        out.resize(out.len() + AEAD_TAG_LEN, 0);
        keys.seal_aead(
            &mut out,
            AeadChunk {
                head_len: payload_at,
                encrypt: true,
                token_id: 0,
                previous_sequence_number: 0,
            },
        )?;
    } else {
        keys.encrypt(out.get_mut(payload_at..).unwrap_or_default())?;
    }
    signer.sign(&out.clone(), &mut out)?;
    Ok(out)
}

/// What a server's check of an EccEncryptedSecret found.
#[derive(Debug)]
pub struct Decrypted {
    /// The password.
    pub secret: Vec<u8>,
    /// The SigningCertificate in the header (the caller compares it with
    /// the session's client certificate).
    pub signing_certificate: Vec<u8>,
}

/// Opens an EccEncryptedSecret: checks the header against `policy`, the
/// ReceiverPublicKey against our `ephemeral` key, the signature with
/// `sender` (the client certificate's key) before anything is decrypted,
/// then the nonce against `server_nonce` and the padding. Every failure
/// is `BadIdentityTokenInvalid`, and no input panics.
pub fn decrypt(
    policy: SecurityPolicy,
    sender: &EccPublicKey,
    ephemeral: &EphemeralKey,
    server_nonce: &[u8],
    data: &[u8],
) -> Result<Decrypted, CryptoError> {
    let limits = DecodeLimits::default();
    let mut r = Reader::new(data, &limits).map_err(|_| invalid("reader"))?;
    let bad = |_| invalid("EccEncryptedSecret header does not decode");
    let type_id = NodeId::decode(&mut r).map_err(bad)?;
    if type_id != NodeId::numeric(0, ECC_ENCRYPTED_SECRET) {
        return Err(invalid("not an EccEncryptedSecret"));
    }
    if u8::decode(&mut r).map_err(bad)? != 0x01 {
        return Err(invalid("EccEncryptedSecret encoding mask"));
    }
    let length = usize::try_from(u32::decode(&mut r).map_err(bad)?).unwrap_or(usize::MAX);
    let end = r
        .position()
        .checked_add(length)
        .filter(|e| *e <= data.len())
        .ok_or(invalid("EccEncryptedSecret length beyond the data"))?;
    let uri = UaString::decode(&mut r).map_err(bad)?;
    if uri.as_str() != Some(policy.uri()) {
        return Err(invalid("EccEncryptedSecret under another policy"));
    }
    let signing_certificate = ByteString::decode(&mut r).map_err(bad)?;
    DateTime::decode(&mut r).map_err(bad)?;
    let key_data_len = usize::from(u16::decode(&mut r).map_err(bad)?);
    let key_data_at = r.position();
    let sender_public = ByteString::decode(&mut r).map_err(bad)?;
    let receiver_public = ByteString::decode(&mut r).map_err(bad)?;
    let payload_at = r.position();
    if payload_at - key_data_at != key_data_len {
        return Err(invalid("EccEncryptedSecret key data length"));
    }
    if receiver_public.as_bytes() != Some(ephemeral.public_nonce()) {
        return Err(invalid("EccEncryptedSecret is not for our ephemeral key"));
    }
    let sig_at = end
        .checked_sub(sender.signature_length())
        .filter(|s| *s > payload_at)
        .ok_or(invalid("EccEncryptedSecret too short for its signature"))?;
    let curve = policy.curve().ok_or(invalid("policy is not ECC"))?;
    sender
        .verify(
            curve,
            data.get(..sig_at).unwrap_or_default(),
            data.get(sig_at..end).unwrap_or_default(),
        )
        .map_err(|_| invalid("EccEncryptedSecret signature does not verify"))?;
    let sender_public = sender_public.as_bytes().unwrap_or_default();
    let z = ephemeral
        .agree(sender_public)
        .map_err(|_| invalid("EccEncryptedSecret sender key is not on the curve"))?;
    let keys = secret_keys(
        policy,
        z.as_bytes(),
        sender_public,
        ephemeral.public_nonce(),
    )?;
    let mut buf = data.get(..sig_at).unwrap_or_default().to_vec();
    let plain_end = if policy.is_aead() {
        keys.open_aead(
            &mut buf,
            AeadChunk {
                head_len: payload_at,
                encrypt: true,
                token_id: 0,
                previous_sequence_number: 0,
            },
        )
        .map_err(|_| invalid("EccEncryptedSecret does not authenticate"))?
    } else {
        keys.decrypt(buf.get_mut(payload_at..).unwrap_or_default())
            .map_err(|_| invalid("EccEncryptedSecret does not decrypt"))?;
        buf.len()
    };
    let payload = buf.get(payload_at..plain_end).unwrap_or_default();
    let mut p = Reader::new(payload, &limits).map_err(|_| invalid("reader"))?;
    let nonce = ByteString::decode(&mut p).map_err(bad)?;
    let secret = ByteString::decode(&mut p).map_err(bad)?;
    if nonce.as_bytes().unwrap_or_default() != server_nonce || server_nonce.is_empty() {
        return Err(invalid("EccEncryptedSecret nonce is not the session's"));
    }
    let rest = payload.get(p.position()..).unwrap_or_default();
    let (pad, size) = rest
        .split_last_chunk::<2>()
        .ok_or(invalid("EccEncryptedSecret without padding size"))?;
    let n = usize::from(u16::from_le_bytes(*size));
    if pad.len() != n || pad.iter().any(|b| usize::from(*b) != n & 0xff) {
        return Err(invalid("EccEncryptedSecret padding"));
    }
    Ok(Decrypted {
        secret: secret.as_bytes().unwrap_or_default().to_vec(),
        signing_certificate: signing_certificate.as_bytes().unwrap_or_default().to_vec(),
    })
}

/// The AdditionalHeader key naming the policy of the wanted ECDHKey.
pub const ECDH_POLICY_URI: &str = "ECDHPolicyUri";
/// The AdditionalHeader key of the server's EphemeralKeyType.
pub const ECDH_KEY: &str = "ECDHKey";

fn parameter(key: &str, value: Variant) -> KeyValuePair {
    KeyValuePair {
        key: QualifiedName {
            namespace_index: 0,
            name: UaString::from(key),
        },
        value,
    }
}

fn parameters(header: &ExtensionObject) -> &[KeyValuePair] {
    header
        .downcast_ref::<AdditionalParametersType>()
        .and_then(|a| a.parameters.as_deref())
        .unwrap_or_default()
}

fn find<'a>(header: &'a ExtensionObject, key: &str) -> Option<&'a Variant> {
    parameters(header)
        .iter()
        .find(|p| p.key.namespace_index == 0 && p.key.name.as_str() == Some(key))
        .map(|p| &p.value)
}

/// The RequestHeader.additionalHeader a client sends on CreateSession and
/// ActivateSession to get the server's next ECDHKey for `policy`.
pub fn ecdh_request(policy: SecurityPolicy) -> ExtensionObject {
    ExtensionObject::new(AdditionalParametersType {
        parameters: Some(vec![parameter(
            ECDH_POLICY_URI,
            Variant::String(UaString::from(policy.uri())),
        )]),
    })
}

/// What a request's additionalHeader asks for: None when it asks for no
/// ECDHKey, `Some(policy)` when it names a policy (None inside when the
/// URI is not one this stack knows).
pub fn requested_ecdh_policy(header: &ExtensionObject) -> Option<Option<SecurityPolicy>> {
    find(header, ECDH_POLICY_URI).map(|v| match v {
        Variant::String(s) => s.as_str().and_then(SecurityPolicy::from_uri),
        _ => None,
    })
}

/// The ResponseHeader.additionalHeader carrying the server's ECDHKey: the
/// ephemeral public key and its signature with the server's application
/// key (raw `r||s` or Ed25519).
pub fn ecdh_response(
    policy: SecurityPolicy,
    ephemeral: &EphemeralKey,
    signer: &EccPrivateKey,
) -> Result<ExtensionObject, CryptoError> {
    let mut signature = Vec::new();
    signer.sign(ephemeral.public_nonce(), &mut signature)?;
    Ok(ExtensionObject::new(AdditionalParametersType {
        parameters: Some(vec![
            parameter(
                ECDH_POLICY_URI,
                Variant::String(UaString::from(policy.uri())),
            ),
            parameter(
                ECDH_KEY,
                Variant::ExtensionObject(Box::new(ExtensionObject::new(EphemeralKeyType {
                    public_key: ByteString::new(ephemeral.public_nonce().to_vec()),
                    signature: ByteString::new(signature),
                }))),
            ),
        ]),
    }))
}

/// The ResponseHeader.additionalHeader refusing an ECDHKey for a policy
/// the server cannot serve: `ECDHKey` holds the StatusCode
/// `BadSecurityPolicyRejected` instead of a key.
pub fn ecdh_refusal(requested_uri: &str) -> ExtensionObject {
    ExtensionObject::new(AdditionalParametersType {
        parameters: Some(vec![
            parameter(
                ECDH_POLICY_URI,
                Variant::String(UaString::from(requested_uri)),
            ),
            parameter(
                ECDH_KEY,
                Variant::StatusCode(StatusCode::BadSecurityPolicyRejected),
            ),
        ]),
    })
}

/// The server's ECDHKey from a response's additionalHeader, its signature
/// checked with the server certificate's key; None when there is none (or
/// the server refused one with a StatusCode), an error when it does not
/// verify or is not a point on the curve.
pub fn ecdh_key_of_response(
    policy: SecurityPolicy,
    header: &ExtensionObject,
    server: &EccPublicKey,
) -> Result<Option<Vec<u8>>, CryptoError> {
    let Some(Variant::ExtensionObject(key)) = find(header, ECDH_KEY) else {
        return Ok(None);
    };
    let key = key
        .downcast_ref::<EphemeralKeyType>()
        .ok_or(invalid("ECDHKey is not an EphemeralKeyType"))?;
    let public = key.public_key.as_bytes().unwrap_or_default();
    let curve = policy.curve().ok_or(invalid("policy is not ECC"))?;
    server.verify(curve, public, key.signature.as_bytes().unwrap_or_default())?;
    uascale_crypto::ecc::check_ephemeral(curve, public)?;
    Ok(Some(public.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_for_every_ecc_policy_and_refuses_changes() {
        for policy in SecurityPolicy::ECC {
            let curve = policy.curve().unwrap();
            let client = EccPrivateKey::generate(curve).unwrap();
            let server_eph = EphemeralKey::generate(curve).unwrap();
            let nonce = [7u8; 32];
            for secret in [&b""[..], b"pw", b"a password of more than sixteen bytes"] {
                let data = encrypt(
                    policy,
                    &client,
                    b"certificate",
                    server_eph.public_nonce(),
                    &nonce,
                    secret,
                    DateTime::from_ticks(5),
                )
                .unwrap();
                let d = decrypt(policy, client.public_key(), &server_eph, &nonce, &data).unwrap();
                assert_eq!(d.secret, secret);
                assert_eq!(d.signing_certificate, b"certificate");
                // Another nonce, another receiver, any flipped byte: refused.
                let e =
                    decrypt(policy, client.public_key(), &server_eph, &[8; 32], &data).unwrap_err();
                assert_eq!(e.status_code(), StatusCode::BadIdentityTokenInvalid);
                let other = EphemeralKey::generate(curve).unwrap();
                assert!(decrypt(policy, client.public_key(), &other, &nonce, &data).is_err());
                for at in (0..data.len()).step_by(7) {
                    let mut t = data.clone();
                    t[at] ^= 0x10;
                    assert!(
                        decrypt(policy, client.public_key(), &server_eph, &nonce, &t).is_err(),
                        "{policy:?} byte {at}"
                    );
                }
                for len in 0..data.len() {
                    // Every truncation is refused.
                    assert!(decrypt(
                        policy,
                        client.public_key(),
                        &server_eph,
                        &nonce,
                        &data[..len]
                    )
                    .is_err());
                }
            }
        }
    }
}

#[cfg(test)]
mod header_tests {
    use super::*;

    #[test]
    fn ecdh_headers_round_trip_and_check_the_signature() {
        let policy = SecurityPolicy::EccNistP256AesGcm;
        let req = ecdh_request(policy);
        assert_eq!(requested_ecdh_policy(&req), Some(Some(policy)));
        assert_eq!(requested_ecdh_policy(&ExtensionObject::default()), None);
        let server = EccPrivateKey::generate(uascale_crypto::ecc::EccCurve::NistP256).unwrap();
        let eph = EphemeralKey::generate(uascale_crypto::ecc::EccCurve::NistP256).unwrap();
        let resp = ecdh_response(policy, &eph, &server).unwrap();
        // Through the wire encoding and back.
        let mut bytes = Vec::new();
        resp.encode(&mut bytes);
        let limits = DecodeLimits::default();
        let mut r = Reader::new(&bytes, &limits).unwrap();
        let decoded = ExtensionObject::decode(&mut r).unwrap();
        let key = ecdh_key_of_response(policy, &decoded, server.public_key()).unwrap();
        assert_eq!(key.as_deref(), Some(eph.public_nonce()));
        let other = EccPrivateKey::generate(uascale_crypto::ecc::EccCurve::NistP256).unwrap();
        assert!(ecdh_key_of_response(policy, &decoded, other.public_key()).is_err());
        assert_eq!(
            ecdh_key_of_response(policy, &ExtensionObject::default(), server.public_key()).unwrap(),
            None
        );
    }
}
