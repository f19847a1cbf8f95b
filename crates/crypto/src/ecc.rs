//! Elliptic-curve primitives of the ECC security policies (Part 6 §6.8):
//! ephemeral keys carried in the OpenSecureChannel nonces, ECDH, HKDF,
//! ECDSA with raw `r||s` signatures and Ed25519.
//!
//! Byte layouts (where stacks could disagree, the choice is written here):
//! - a NIST ephemeral key travels as `X||Y`, the uncompressed point without
//!   its `0x04` prefix (64 bytes for P-256, 96 for P-384); an X25519 key as
//!   its raw 32 bytes;
//! - the ECDH secret is the x-coordinate alone (32 / 48 bytes), the raw
//!   X25519 output for curve25519;
//! - an ECDSA signature is `r||s`, each left-padded to the field size
//!   (64 bytes for P-256, 96 for P-384), never DER;
//! - Ed25519 is pure Ed25519 (64 bytes).
//!
//! Brainpool and curve448 are not here: aws-lc has neither curve.

use aws_lc_rs::agreement::{self, UnparsedPublicKey, ECDH_P256, ECDH_P384, X25519};
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::hmac;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING,
    ECDSA_P384_SHA384_FIXED_SIGNING,
};
use uascale_types::StatusCode;

use crate::CryptoError;

/// A curve of the ECC policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EccCurve {
    /// NIST P-256 (secp256r1): ECDH, ECDSA-SHA256.
    NistP256,
    /// NIST P-384 (secp384r1): ECDH, ECDSA-SHA384.
    NistP384,
    /// X25519 for the key agreement, Ed25519 for signatures.
    Curve25519,
}

impl EccCurve {
    /// Bytes of an ephemeral public key as carried in a nonce.
    pub const fn nonce_length(self) -> usize {
        match self {
            EccCurve::NistP256 => 64,
            EccCurve::NistP384 => 96,
            EccCurve::Curve25519 => 32,
        }
    }

    /// Bytes of the ECDH secret (the x-coordinate for NIST curves).
    pub const fn secret_length(self) -> usize {
        match self {
            EccCurve::NistP256 | EccCurve::Curve25519 => 32,
            EccCurve::NistP384 => 48,
        }
    }

    /// Bytes of an asymmetric signature made with a key on this curve.
    pub const fn signature_length(self) -> usize {
        match self {
            EccCurve::NistP256 | EccCurve::Curve25519 => 64,
            EccCurve::NistP384 => 96,
        }
    }

    fn agreement(self) -> &'static agreement::Algorithm {
        match self {
            EccCurve::NistP256 => &ECDH_P256,
            EccCurve::NistP384 => &ECDH_P384,
            EccCurve::Curve25519 => &X25519,
        }
    }

    const fn is_nist(self) -> bool {
        !matches!(self, EccCurve::Curve25519)
    }
}

fn config(what: &'static str) -> CryptoError {
    CryptoError::Config { what }
}

fn nonce_invalid(what: &'static str) -> CryptoError {
    CryptoError::Peer {
        status: StatusCode::BadNonceInvalid,
        what,
    }
}

fn checks_failed(what: &'static str) -> CryptoError {
    CryptoError::Peer {
        status: StatusCode::BadSecurityChecksFailed,
        what,
    }
}

/// A secret that is overwritten with zeros when dropped (ECDH outputs, the
/// chained input keying material).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        Secret(bytes)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `self XOR previous` (SecureChannelEnhancements renewal, Part 6
    /// 1.05.07 §6.8.1 step 2); a previous secret of another length is a
    /// local error.
    pub fn chained(&self, previous: &Secret) -> Result<Secret, CryptoError> {
        if previous.0.len() != self.0.len() {
            return Err(config("chained secrets differ in length"));
        }
        Ok(Secret(
            self.0.iter().zip(&previous.0).map(|(a, b)| a ^ b).collect(),
        ))
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.fill(0);
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Checks a peer's ephemeral key as found in a nonce: the length of the
/// curve and, for NIST curves, a point on the curve. Anything else is
/// `BadNonceInvalid`.
pub fn check_ephemeral(curve: EccCurve, nonce: &[u8]) -> Result<(), CryptoError> {
    peer_key(curve, nonce).map(|_| ())
}

fn peer_key(curve: EccCurve, nonce: &[u8]) -> Result<agreement::ParsedPublicKey, CryptoError> {
    if nonce.len() != curve.nonce_length() {
        return Err(nonce_invalid(
            "ephemeral key length does not match the curve",
        ));
    }
    let encoded;
    let bytes = if curve.is_nist() {
        let mut e = Vec::with_capacity(nonce.len() + 1);
        e.push(0x04);
        e.extend_from_slice(nonce);
        encoded = e;
        encoded.as_slice()
    } else {
        nonce
    };
    agreement::ParsedPublicKey::try_from(&UnparsedPublicKey::new(curve.agreement(), bytes))
        .map_err(|_| nonce_invalid("ephemeral key is not a point on the curve"))
}

/// An ephemeral key pair for one key agreement (one OpenSecureChannel, or
/// one session ECDHKey). Reusable: the agreement does not consume it.
pub struct EphemeralKey {
    curve: EccCurve,
    key: agreement::PrivateKey,
    public: Vec<u8>,
}

impl std::fmt::Debug for EphemeralKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EphemeralKey({:?})", self.curve)
    }
}

impl EphemeralKey {
    fn from_key(curve: EccCurve, key: agreement::PrivateKey) -> Result<Self, CryptoError> {
        let public = key
            .compute_public_key()
            .map_err(|_| config("ephemeral public key"))?;
        let bytes = public.as_ref();
        let public = if curve.is_nist() {
            bytes.get(1..).unwrap_or_default().to_vec()
        } else {
            bytes.to_vec()
        };
        if public.len() != curve.nonce_length() {
            return Err(config("ephemeral public key has an unexpected length"));
        }
        Ok(EphemeralKey { curve, key, public })
    }

    /// A fresh key pair.
    pub fn generate(curve: EccCurve) -> Result<Self, CryptoError> {
        let key = agreement::PrivateKey::generate(curve.agreement())
            .map_err(|_| config("ephemeral key generation failed"))?;
        Self::from_key(curve, key)
    }

    /// The private half as [`EphemeralKey::from_private_bytes`] takes it
    /// (big-endian scalar of the field size, or the X25519 private key):
    /// for a cluster node to hand a session's key to the node taking the
    /// session over.
    pub fn private_bytes(&self) -> Result<Vec<u8>, CryptoError> {
        use aws_lc_rs::encoding::{AsBigEndian, Curve25519SeedBin, EcPrivateKeyBin};
        let bytes = if self.curve.is_nist() {
            AsBigEndian::<EcPrivateKeyBin<'static>>::as_be_bytes(&self.key)
                .map(|b| b.as_ref().to_vec())
        } else {
            AsBigEndian::<Curve25519SeedBin<'static>>::as_be_bytes(&self.key)
                .map(|b| b.as_ref().to_vec())
        };
        bytes.map_err(|_| config("ephemeral private key export failed"))
    }

    /// From a fixed private scalar (big-endian, field size) or X25519
    /// private key: for tests against known vectors, and a session's key
    /// taken over from another cluster node.
    pub fn from_private_bytes(curve: EccCurve, private: &[u8]) -> Result<Self, CryptoError> {
        let key = agreement::PrivateKey::from_private_key(curve.agreement(), private)
            .map_err(|_| config("ephemeral private key rejected"))?;
        Self::from_key(curve, key)
    }

    /// The curve.
    pub fn curve(&self) -> EccCurve {
        self.curve
    }

    /// The public key as it travels in a nonce (`X||Y` or raw X25519).
    pub fn public_nonce(&self) -> &[u8] {
        &self.public
    }

    /// ECDH with the peer's key from its nonce: the x-coordinate (NIST) or
    /// the X25519 output. A nonce of the wrong length or not on the curve
    /// is `BadNonceInvalid`.
    pub fn agree(&self, peer_nonce: &[u8]) -> Result<Secret, CryptoError> {
        let peer = peer_key(self.curve, peer_nonce)?;
        agreement::agree(
            &self.key,
            peer,
            nonce_invalid("key agreement with the peer's ephemeral key failed"),
            |z| Ok(Secret(z.to_vec())),
        )
    }
}

/// The HMAC of the HKDF: SHA-256, or SHA-384 for P-384.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HkdfHash {
    /// HMAC-SHA256.
    Sha256,
    /// HMAC-SHA384.
    Sha384,
}

impl HkdfHash {
    fn algorithm(self) -> hmac::Algorithm {
        match self {
            HkdfHash::Sha256 => hmac::HMAC_SHA256,
            HkdfHash::Sha384 => hmac::HMAC_SHA384,
        }
    }
}

/// HKDF (RFC 5869) extract and expand: fills `out` (at most 255 hash
/// blocks) from the input keying material.
pub fn hkdf(hash: HkdfHash, salt: &[u8], ikm: &[u8], info: &[u8], out: &mut [u8]) {
    let prk = hmac::sign(&hmac::Key::new(hash.algorithm(), salt), ikm);
    let key = hmac::Key::new(hash.algorithm(), prk.as_ref());
    let mut previous: Option<hmac::Tag> = None;
    for (i, block) in out
        .chunks_mut(hash.algorithm().digest_algorithm().output_len)
        .enumerate()
    {
        let mut ctx = hmac::Context::with_key(&key);
        if let Some(t) = &previous {
            ctx.update(t.as_ref());
        }
        ctx.update(info);
        ctx.update(&[u8::try_from(i + 1).unwrap_or(u8::MAX)]);
        let t = ctx.sign();
        let n = block.len();
        block.copy_from_slice(t.as_ref().get(..n).unwrap_or_default());
        previous = Some(t);
    }
}

/// The hash of a certificate in channel-bound session signatures
/// (SecureChannelEnhancements): SHA-384 for P-384 policies, SHA-256
/// otherwise.
pub fn certificate_hash(policy_curve: EccCurve, der: &[u8]) -> Vec<u8> {
    let alg = match policy_curve {
        EccCurve::NistP384 => &aws_lc_rs::digest::SHA384,
        _ => &aws_lc_rs::digest::SHA256,
    };
    aws_lc_rs::digest::digest(alg, der).as_ref().to_vec()
}

/// The salt (also the info) of the ECC key derivation (Part 6 §6.8.1):
/// `u16le(length) || label || first || second`.
pub fn salt(length: usize, label: &[u8], first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(2 + label.len() + first.len() + second.len());
    s.extend_from_slice(&u16::try_from(length).unwrap_or(u16::MAX).to_le_bytes());
    s.extend_from_slice(label);
    s.extend_from_slice(first);
    s.extend_from_slice(second);
    s
}

enum Signer {
    Ecdsa(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// An ECC private key (ours): ECDSA P-256/P-384 or Ed25519.
pub struct EccPrivateKey {
    curve: EccCurve,
    signer: Signer,
    public: EccPublicKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for EccPrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EccPrivateKey({:?})", self.curve)
    }
}

impl EccPrivateKey {
    fn from_signer(curve: EccCurve, signer: Signer) -> Result<Self, CryptoError> {
        let spki = match &signer {
            Signer::Ecdsa(k) => {
                AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(k.public_key())
                    .map(|d| d.as_ref().to_vec())
            }
            Signer::Ed25519(k) => {
                AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(k.public_key())
                    .map(|d| d.as_ref().to_vec())
            }
        }
        .map_err(|_| config("ECC public key cannot be encoded"))?;
        let public = EccPublicKey::from_spki_der(&spki)?;
        Ok(EccPrivateKey {
            curve,
            signer,
            public,
            rng: SystemRandom::new(),
        })
    }

    /// From a PKCS#8 `PrivateKeyInfo` DER of a P-256, P-384 or Ed25519 key.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, CryptoError> {
        if let Ok(k) = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der) {
            return Self::from_signer(EccCurve::NistP256, Signer::Ecdsa(k));
        }
        if let Ok(k) = EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, der) {
            return Self::from_signer(EccCurve::NistP384, Signer::Ecdsa(k));
        }
        if let Ok(k) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der) {
            return Self::from_signer(EccCurve::Curve25519, Signer::Ed25519(k));
        }
        Err(config("not a P-256, P-384 or Ed25519 PKCS#8 private key"))
    }

    /// A new key on `curve`.
    pub fn generate(curve: EccCurve) -> Result<Self, CryptoError> {
        let signer = match curve {
            EccCurve::NistP256 => EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING)
                .map(Signer::Ecdsa)
                .map_err(|_| config("ECDSA key generation failed"))?,
            EccCurve::NistP384 => EcdsaKeyPair::generate(&ECDSA_P384_SHA384_FIXED_SIGNING)
                .map(Signer::Ecdsa)
                .map_err(|_| config("ECDSA key generation failed"))?,
            EccCurve::Curve25519 => Ed25519KeyPair::generate()
                .map(Signer::Ed25519)
                .map_err(|_| config("Ed25519 key generation failed"))?,
        };
        Self::from_signer(curve, signer)
    }

    /// The key as PKCS#8 DER.
    pub fn to_pkcs8_der(&self) -> Result<Vec<u8>, CryptoError> {
        match &self.signer {
            Signer::Ecdsa(k) => k.to_pkcs8v1().map(|d| d.as_ref().to_vec()),
            Signer::Ed25519(k) => k.to_pkcs8v1().map(|d| d.as_ref().to_vec()),
        }
        .map_err(|_| config("ECC private key cannot be encoded"))
    }

    /// The curve.
    pub fn curve(&self) -> EccCurve {
        self.curve
    }

    /// The public half.
    pub fn public_key(&self) -> &EccPublicKey {
        &self.public
    }

    /// Signature length in bytes.
    pub fn signature_length(&self) -> usize {
        self.curve.signature_length()
    }

    /// Signs `message` (ECDSA with the curve's hash, raw `r||s`; or
    /// Ed25519) and appends the signature to `out`.
    pub fn sign(&self, message: &[u8], out: &mut Vec<u8>) -> Result<(), CryptoError> {
        match &self.signer {
            Signer::Ecdsa(k) => {
                let sig = k
                    .sign(&self.rng, message)
                    .map_err(|_| config("ECDSA signing failed"))?;
                out.extend_from_slice(sig.as_ref());
            }
            Signer::Ed25519(k) => out.extend_from_slice(k.sign(message).as_ref()),
        }
        Ok(())
    }

    /// The pairwise consistency check: a signature made with this key
    /// verifies under its public half (with the key's own curve as the
    /// policy's). A key that fails is unusable (`CryptoError::Config`).
    /// Run when a server loads its own key; like
    /// [`crate::rsa::RsaPrivateKey::check_pair`] it also does the one-time
    /// seeding of aws-lc's random generator at load.
    pub fn check_pair(&self) -> Result<(), CryptoError> {
        let message = b"uascale pairwise consistency check";
        let mut sig = Vec::with_capacity(self.signature_length());
        self.sign(message, &mut sig)?;
        self.public
            .verify(self.curve, message, &sig)
            .map_err(|_| config("ECC private key fails its pairwise consistency check"))
    }
}

/// An ECC public key (a peer's, from its certificate).
#[derive(Clone)]
pub struct EccPublicKey {
    curve: EccCurve,
    spki: Vec<u8>,
    /// The key itself: the uncompressed point (NIST) or the raw Ed25519 key.
    point: Vec<u8>,
}

impl std::fmt::Debug for EccPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EccPublicKey({:?})", self.curve)
    }
}

/// OIDs as DER contents (without tag and length).
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// Splits one DER TLV off the front: (tag, contents, rest). Short forms and
/// lengths up to 2 bytes only (an SPKI is small).
fn tlv(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = d.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        n if n < 0x80 => (usize::from(n), rest),
        0x81 => (usize::from(*rest.first()?), rest.get(1..)?),
        0x82 => (
            usize::from(*rest.first()?) << 8 | usize::from(*rest.get(1)?),
            rest.get(2..)?,
        ),
        _ => return None,
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// (curve, key bytes) of a DER SubjectPublicKeyInfo.
fn parse_spki(der: &[u8]) -> Option<(EccCurve, Vec<u8>)> {
    let (0x30, spki, []) = tlv(der)? else {
        return None;
    };
    let (0x30, alg, rest) = tlv(spki)? else {
        return None;
    };
    let (0x03, bits, []) = tlv(rest)? else {
        return None;
    };
    let (0x06, oid, params) = tlv(alg)? else {
        return None;
    };
    let (&0, key) = bits.split_first()? else {
        return None;
    };
    let curve = if oid == OID_EC_PUBLIC_KEY {
        let (0x06, named, []) = tlv(params)? else {
            return None;
        };
        match named {
            OID_P256 => EccCurve::NistP256,
            OID_P384 => EccCurve::NistP384,
            _ => return None,
        }
    } else if oid == OID_ED25519 && params.is_empty() {
        EccCurve::Curve25519
    } else {
        return None;
    };
    Some((curve, key.to_vec()))
}

/// DER `ECDSA-Sig-Value` from a raw `r||s` signature.
fn raw_to_der(raw: &[u8]) -> Vec<u8> {
    let (r, s) = raw.split_at(raw.len() / 2);
    let int = |v: &[u8]| {
        let v = &v[v
            .iter()
            .take_while(|b| **b == 0)
            .count()
            .min(v.len().saturating_sub(1))..];
        let mut out = vec![0x02];
        let pad = v.first().is_some_and(|b| b & 0x80 != 0);
        out.push(u8::try_from(v.len() + usize::from(pad)).unwrap_or(0));
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
        out
    };
    let body = [int(r), int(s)].concat();
    let mut out = vec![0x30];
    if body.len() >= 0x80 {
        out.push(0x81);
    }
    out.push(u8::try_from(body.len()).unwrap_or(0));
    out.extend_from_slice(&body);
    out
}

impl EccPublicKey {
    /// From a DER SubjectPublicKeyInfo of a P-256, P-384 or Ed25519 key;
    /// anything else is `BadCertificateInvalid`.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, CryptoError> {
        let (curve, point) = parse_spki(der).ok_or(CryptoError::Certificate {
            status: StatusCode::BadCertificateInvalid,
            what: "public key is not a P-256, P-384 or Ed25519 SubjectPublicKeyInfo",
        })?;
        let expected = match curve {
            EccCurve::NistP256 => 65,
            EccCurve::NistP384 => 97,
            EccCurve::Curve25519 => 32,
        };
        if point.len() != expected || (curve.is_nist() && point.first() != Some(&0x04)) {
            return Err(CryptoError::Certificate {
                status: StatusCode::BadCertificateInvalid,
                what: "ECC public key is not an uncompressed point",
            });
        }
        Ok(EccPublicKey {
            curve,
            spki: der.to_vec(),
            point,
        })
    }

    /// The curve of the key.
    pub fn curve(&self) -> EccCurve {
        self.curve
    }

    /// The DER SubjectPublicKeyInfo.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    /// Signature length of this key (64 for P-256 and Ed25519, 96 for P-384).
    pub fn signature_length(&self) -> usize {
        self.curve.signature_length()
    }

    /// Checks `signature` over `message`. The hash follows the policy's
    /// curve `policy_curve` (SHA-256 for P-256 policies, SHA-384 for P-384),
    /// so that a P-384 certificate signs a nistP256 policy's messages with
    /// ECDSA-SHA256 and a 96-byte signature. A mismatch or a signature of
    /// the wrong length is `BadSecurityChecksFailed`.
    pub fn verify(
        &self,
        policy_curve: EccCurve,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), CryptoError> {
        if signature.len() != self.signature_length() {
            return Err(checks_failed("ECC signature has the wrong length"));
        }
        let bad = |_| checks_failed("ECC signature does not verify");
        match (self.curve, policy_curve) {
            (EccCurve::NistP256, EccCurve::NistP256) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &self.point)
                    .verify(message, signature)
                    .map_err(bad)
            }
            (EccCurve::NistP384, EccCurve::NistP384) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, &self.point)
                    .verify(message, signature)
                    .map_err(bad)
            }
            (EccCurve::NistP384, EccCurve::NistP256) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P384_SHA256_ASN1, &self.point)
                    .verify(message, &raw_to_der(signature))
                    .map_err(bad)
            }
            (EccCurve::Curve25519, EccCurve::Curve25519) => {
                signature::UnparsedPublicKey::new(&signature::ED25519, &self.point)
                    .verify(message, signature)
                    .map_err(bad)
            }
            _ => Err(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "certificate key curve not allowed by the security policy",
            }),
        }
    }
}

#[cfg(test)]
mod tests {

    /// A key handed to another node is the same key: same public half,
    /// same agreement with a peer.
    #[test]
    fn an_ephemeral_key_survives_its_private_bytes() {
        for curve in [EccCurve::NistP256, EccCurve::NistP384, EccCurve::Curve25519] {
            let key = EphemeralKey::generate(curve).unwrap();
            let bytes = key.private_bytes().unwrap();
            let back = EphemeralKey::from_private_bytes(curve, &bytes).unwrap();
            assert_eq!(back.public_nonce(), key.public_nonce(), "{curve:?}");
            let peer = EphemeralKey::generate(curve).unwrap();
            assert_eq!(
                back.agree(peer.public_nonce()).unwrap().as_bytes(),
                key.agree(peer.public_nonce()).unwrap().as_bytes()
            );
            assert!(EphemeralKey::from_private_bytes(curve, &bytes[1..]).is_err());
        }
    }
    use super::*;

    #[test]
    fn agreement_is_symmetric_and_checks_the_point() {
        for curve in [EccCurve::NistP256, EccCurve::NistP384, EccCurve::Curve25519] {
            let a = EphemeralKey::generate(curve).unwrap();
            let b = EphemeralKey::generate(curve).unwrap();
            assert_eq!(a.public_nonce().len(), curve.nonce_length());
            let z1 = a.agree(b.public_nonce()).unwrap();
            let z2 = b.agree(a.public_nonce()).unwrap();
            assert_eq!(z1, z2);
            assert_eq!(z1.as_bytes().len(), curve.secret_length());
            // Reusable (the session ECDHKey is used more than once).
            assert_eq!(a.agree(b.public_nonce()).unwrap(), z1);
            for len in [0, curve.nonce_length() - 1, curve.nonce_length() + 1] {
                let e = a.agree(&vec![1; len]).unwrap_err();
                assert_eq!(e.status_code(), StatusCode::BadNonceInvalid);
            }
        }
        // (1, 1) is not on P-256.
        let mut off = vec![0u8; 64];
        off[31] = 1;
        off[63] = 1;
        let a = EphemeralKey::generate(EccCurve::NistP256).unwrap();
        let e = a.agree(&off).unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadNonceInvalid);
        assert!(check_ephemeral(EccCurve::NistP256, &off).is_err());
    }

    #[test]
    fn a_loaded_key_passes_its_pairwise_check() {
        for curve in [EccCurve::NistP256, EccCurve::NistP384, EccCurve::Curve25519] {
            let k = EccPrivateKey::generate(curve).unwrap();
            k.check_pair().unwrap();
            let again = EccPrivateKey::from_pkcs8_der(&k.to_pkcs8_der().unwrap()).unwrap();
            again.check_pair().unwrap();
        }
    }

    #[test]
    fn signatures_round_trip_and_fail_on_tampering() {
        for curve in [EccCurve::NistP256, EccCurve::NistP384, EccCurve::Curve25519] {
            let k = EccPrivateKey::generate(curve).unwrap();
            let again = EccPrivateKey::from_pkcs8_der(&k.to_pkcs8_der().unwrap()).unwrap();
            assert_eq!(again.public_key().spki_der(), k.public_key().spki_der());
            let mut sig = Vec::new();
            k.sign(b"message", &mut sig).unwrap();
            assert_eq!(sig.len(), curve.signature_length());
            k.public_key().verify(curve, b"message", &sig).unwrap();
            let e = k.public_key().verify(curve, b"messagf", &sig).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
            assert!(k.public_key().verify(curve, b"message", &sig[1..]).is_err());
            sig[5] ^= 1;
            assert!(k.public_key().verify(curve, b"message", &sig).is_err());
        }
        let ed = EccPrivateKey::generate(EccCurve::Curve25519).unwrap();
        let e = ed
            .public_key()
            .verify(EccCurve::NistP256, b"m", &[0; 64])
            .unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadCertificatePolicyCheckFailed);
        assert!(EccPublicKey::from_spki_der(b"\x30\x00").is_err());
        assert!(EccPrivateKey::from_pkcs8_der(b"junk").is_err());
    }

    #[test]
    fn raw_signatures_convert_to_der() {
        let mut raw = vec![0u8; 64];
        raw[31] = 0x80;
        raw[63] = 0x01;
        let der = raw_to_der(&raw);
        assert_eq!(der, [0x30, 0x07, 0x02, 0x02, 0x00, 0x80, 0x02, 0x01, 0x01]);
    }

    #[test]
    fn chaining_xors_and_checks_lengths() {
        let a = Secret::new(vec![0xf0, 0x0f]);
        let b = Secret::new(vec![0xff, 0xff]);
        assert_eq!(a.chained(&b).unwrap().as_bytes(), [0x0f, 0xf0]);
        assert!(a.chained(&Secret::new(vec![1])).is_err());
    }
}
