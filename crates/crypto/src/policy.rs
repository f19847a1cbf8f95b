//! Security policies (Part 7 profiles), symmetric keys and key derivation
//! (Part 6 §6.7.5).
//!
//! A [`SecurityPolicy`] names the algorithms of one policy and its limits
//! (key sizes, nonce length, signature sizes); it is a plain `Copy` value,
//! so the channel matches on nothing and asks the policy for everything.
//! [`SymmetricKeys`] hold one direction's keys for one security token,
//! derived once per token by [`derive_keys`].
//!
//! | Policy | symmetric | asymmetric signature | asymmetric encryption | RSA bits |
//! |---|---|---|---|---|
//! | Basic256Sha256 | HMAC-SHA256, AES-256-CBC | PKCS#1 v1.5 SHA-256 | OAEP SHA-1 | 2048..=4096 |
//! | Aes128_Sha256_RsaOaep | HMAC-SHA256, AES-128-CBC | PKCS#1 v1.5 SHA-256 | OAEP SHA-1 | 2048..=4096 |
//! | Aes256_Sha256_RsaPss | HMAC-SHA256, AES-256-CBC | PSS SHA-256 | OAEP SHA-256 | 2048..=4096 |
//!
//! The deprecated Basic128Rsa15 and Basic256 are not offered.

use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey, AES_128,
    AES_256,
};
use aws_lc_rs::hmac;
use aws_lc_rs::iv::FixedLength;
use std::sync::OnceLock;
use uascale_types::StatusCode;

use crate::rsa::{EncryptionPadding, SignatureScheme};
use crate::CryptoError;

/// AES block size: the symmetric encryption block and IV length.
pub const AES_BLOCK: usize = 16;
/// HMAC-SHA256 output: the symmetric signature size of every RSA policy.
pub const HMAC_SHA256_LEN: usize = 32;

/// A security policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SecurityPolicy {
    /// No security.
    None,
    /// `http://opcfoundation.org/UA/SecurityPolicy#Basic256Sha256`.
    Basic256Sha256,
    /// `http://opcfoundation.org/UA/SecurityPolicy#Aes128_Sha256_RsaOaep`.
    Aes128Sha256RsaOaep,
    /// `http://opcfoundation.org/UA/SecurityPolicy#Aes256_Sha256_RsaPss`.
    Aes256Sha256RsaPss,
}

impl SecurityPolicy {
    /// Every policy offered, None first.
    pub const ALL: [SecurityPolicy; 4] = [
        SecurityPolicy::None,
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
    ];

    /// The SecurityPolicyUri.
    pub const fn uri(self) -> &'static str {
        match self {
            SecurityPolicy::None => "http://opcfoundation.org/UA/SecurityPolicy#None",
            SecurityPolicy::Basic256Sha256 => {
                "http://opcfoundation.org/UA/SecurityPolicy#Basic256Sha256"
            }
            SecurityPolicy::Aes128Sha256RsaOaep => {
                "http://opcfoundation.org/UA/SecurityPolicy#Aes128_Sha256_RsaOaep"
            }
            SecurityPolicy::Aes256Sha256RsaPss => {
                "http://opcfoundation.org/UA/SecurityPolicy#Aes256_Sha256_RsaPss"
            }
        }
    }

    /// The policy with this URI, if offered.
    pub fn from_uri(uri: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.uri() == uri)
    }

    /// True for SecurityPolicy None.
    pub const fn is_none(self) -> bool {
        matches!(self, SecurityPolicy::None)
    }

    /// Length of the client and server nonces (0 for None).
    pub const fn nonce_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ => 32,
        }
    }

    /// Smallest RSA key accepted, in bits.
    pub const fn min_asymmetric_key_bits(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ => 2048,
        }
    }

    /// Largest RSA key accepted, in bits.
    pub const fn max_asymmetric_key_bits(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ => 4096,
        }
    }

    /// The asymmetric signature scheme (None for SecurityPolicy None).
    pub const fn asymmetric_signature(self) -> Option<SignatureScheme> {
        match self {
            SecurityPolicy::None => None,
            SecurityPolicy::Basic256Sha256 | SecurityPolicy::Aes128Sha256RsaOaep => {
                Some(SignatureScheme::Pkcs1Sha256)
            }
            SecurityPolicy::Aes256Sha256RsaPss => Some(SignatureScheme::PssSha256),
        }
    }

    /// The asymmetric encryption padding (None for SecurityPolicy None).
    pub const fn asymmetric_encryption(self) -> Option<EncryptionPadding> {
        match self {
            SecurityPolicy::None => None,
            SecurityPolicy::Basic256Sha256 | SecurityPolicy::Aes128Sha256RsaOaep => {
                Some(EncryptionPadding::OaepSha1)
            }
            SecurityPolicy::Aes256Sha256RsaPss => Some(EncryptionPadding::OaepSha256),
        }
    }

    /// Symmetric signature size in bytes (0 for None).
    pub const fn symmetric_signature_size(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ => HMAC_SHA256_LEN,
        }
    }

    /// Length of the derived symmetric signing key.
    pub const fn signing_key_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ => 32,
        }
    }

    /// Length of the derived symmetric encryption key (AES-128: 16, AES-256: 32).
    pub const fn encrypting_key_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            SecurityPolicy::Aes128Sha256RsaOaep => 16,
            _ => 32,
        }
    }

    /// Symmetric encryption block size (1 for None: no alignment).
    pub const fn symmetric_block_size(self) -> usize {
        match self {
            SecurityPolicy::None => 1,
            _ => AES_BLOCK,
        }
    }

    /// Checks a peer's nonce: exactly [`SecurityPolicy::nonce_length`]
    /// bytes, else `BadNonceInvalid`.
    pub fn check_nonce(self, nonce: &[u8]) -> Result<(), CryptoError> {
        if nonce.len() == self.nonce_length() {
            Ok(())
        } else {
            Err(CryptoError::Peer {
                status: StatusCode::BadNonceInvalid,
                what: "nonce length does not match the security policy",
            })
        }
    }

    /// Checks an RSA key size against the policy (Part 4 §6.1.3, "Security
    /// Policy Check"): `BadCertificatePolicyCheckFailed` outside the range.
    pub fn check_key_bits(self, bits: usize) -> Result<(), CryptoError> {
        if (self.min_asymmetric_key_bits()..=self.max_asymmetric_key_bits()).contains(&bits) {
            Ok(())
        } else {
            Err(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "certificate key size not allowed by the security policy",
            })
        }
    }

    /// A fresh random nonce of [`SecurityPolicy::nonce_length`] bytes.
    pub fn random_nonce(self) -> Result<Vec<u8>, CryptoError> {
        let mut n = vec![0u8; self.nonce_length()];
        aws_lc_rs::rand::fill(&mut n).map_err(|_| CryptoError::Config {
            what: "random number generator failed",
        })?;
        Ok(n)
    }
}

/// P_SHA256 (RFC 5246 §5, Part 6 §6.7.5): fills `out` with
/// HMAC(secret, A(1) + seed) || HMAC(secret, A(2) + seed) || ...,
/// where A(0) = seed and A(i) = HMAC(secret, A(i-1)).
pub fn p_sha256(secret: &[u8], seed: &[u8], out: &mut [u8]) {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut a = hmac::sign(&key, seed);
    for block in out.chunks_mut(HMAC_SHA256_LEN) {
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(a.as_ref());
        ctx.update(seed);
        let t = ctx.sign();
        let n = block.len();
        block.copy_from_slice(t.as_ref().get(..n).unwrap_or_default());
        a = hmac::sign(&key, a.as_ref());
    }
}

/// One direction's symmetric keys for one security token: the HMAC key,
/// the AES key and the IV. The AES key schedules (about 500 bytes each)
/// are built on first use: a side only ever encrypts with one direction's
/// keys and decrypts with the other's, so half of them are never built.
pub struct SymmetricKeys {
    policy: SecurityPolicy,
    signing: hmac::Key,
    aes: &'static aws_lc_rs::cipher::Algorithm,
    aes_key: [u8; 32],
    encrypting: OnceLock<EncryptingKey>,
    decrypting: OnceLock<DecryptingKey>,
    iv: [u8; AES_BLOCK],
}

impl std::fmt::Debug for SymmetricKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SymmetricKeys({:?})", self.policy)
    }
}

fn local(what: &'static str) -> CryptoError {
    CryptoError::Config { what }
}

impl SymmetricKeys {
    /// From the derived key material: signing key, encrypting key, IV.
    pub fn new(
        policy: SecurityPolicy,
        signing_key: &[u8],
        encrypting_key: &[u8],
        iv: &[u8],
    ) -> Result<Self, CryptoError> {
        let alg = match policy.encrypting_key_length() {
            16 => &AES_128,
            32 => &AES_256,
            _ => return Err(local("no symmetric keys for SecurityPolicy None")),
        };
        if signing_key.len() != policy.signing_key_length() {
            return Err(local("signing key length does not match the policy"));
        }
        let iv: [u8; AES_BLOCK] = iv
            .try_into()
            .map_err(|_| local("IV must be one AES block"))?;
        if encrypting_key.len() != policy.encrypting_key_length() {
            return Err(local("AES key rejected"));
        }
        let mut aes_key = [0u8; 32];
        aes_key
            .get_mut(..encrypting_key.len())
            .ok_or(local("AES key rejected"))?
            .copy_from_slice(encrypting_key);
        // Checked once here, so that building it later cannot fail.
        UnboundCipherKey::new(alg, encrypting_key).map_err(|_| local("AES key rejected"))?;
        Ok(SymmetricKeys {
            policy,
            signing: hmac::Key::new(hmac::HMAC_SHA256, signing_key),
            aes: alg,
            aes_key,
            encrypting: OnceLock::new(),
            decrypting: OnceLock::new(),
            iv,
        })
    }

    fn aes_key(&self) -> &[u8] {
        self.aes_key
            .get(..self.policy.encrypting_key_length())
            .unwrap_or(&self.aes_key)
    }

    fn encrypting_key(&self) -> Result<&EncryptingKey, CryptoError> {
        if let Some(k) = self.encrypting.get() {
            return Ok(k);
        }
        let k = UnboundCipherKey::new(self.aes, self.aes_key())
            .and_then(EncryptingKey::cbc)
            .map_err(|_| local("AES key rejected"))?;
        Ok(self.encrypting.get_or_init(|| k))
    }

    fn decrypting_key(&self) -> Result<&DecryptingKey, CryptoError> {
        if let Some(k) = self.decrypting.get() {
            return Ok(k);
        }
        let k = UnboundCipherKey::new(self.aes, self.aes_key())
            .and_then(DecryptingKey::cbc)
            .map_err(|_| local("AES key rejected"))?;
        Ok(self.decrypting.get_or_init(|| k))
    }

    /// The policy these keys belong to.
    pub fn policy(&self) -> SecurityPolicy {
        self.policy
    }

    /// Signature size in bytes.
    pub fn signature_size(&self) -> usize {
        HMAC_SHA256_LEN
    }

    /// Appends the HMAC-SHA256 of `data` to `out`.
    pub fn sign(&self, data: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(hmac::sign(&self.signing, data).as_ref());
    }

    /// Signs `buf[..at]` and writes the signature into `buf[at..at + 32]`.
    pub fn sign_in_place(&self, buf: &mut [u8], at: usize) -> Result<(), CryptoError> {
        let tag = hmac::sign(&self.signing, buf.get(..at).unwrap_or_default());
        let dst = buf
            .get_mut(at..at + HMAC_SHA256_LEN)
            .ok_or(local("no room for the signature"))?;
        dst.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Checks `signature` over `data` in constant time; a mismatch is
    /// `BadSecurityChecksFailed`.
    pub fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), CryptoError> {
        hmac::verify(&self.signing, data, signature).map_err(|_| CryptoError::Peer {
            status: StatusCode::BadSecurityChecksFailed,
            what: "symmetric signature does not verify",
        })
    }

    /// AES-CBC encrypts `data` in place; its length must be a multiple of
    /// the block size (the chunk carries its own padding).
    pub fn encrypt(&self, data: &mut [u8]) -> Result<(), CryptoError> {
        if data.len() % AES_BLOCK != 0 {
            return Err(local("plaintext is not a whole number of AES blocks"));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.encrypting_key()?
            .less_safe_encrypt(data, EncryptionContext::Iv128(FixedLength::from(self.iv)))
            .map(|_| ())
            .map_err(|_| local("AES encryption failed"))
    }

    /// AES-CBC decrypts `data` in place; a length that is not a multiple of
    /// the block size is `BadSecurityChecksFailed`.
    pub fn decrypt(&self, data: &mut [u8]) -> Result<(), CryptoError> {
        if data.len() % AES_BLOCK != 0 {
            return Err(CryptoError::Peer {
                status: StatusCode::BadSecurityChecksFailed,
                what: "ciphertext is not a whole number of AES blocks",
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        self.decrypting_key()?
            .decrypt(data, DecryptionContext::Iv128(FixedLength::from(self.iv)))
            .map(|_| ())
            .map_err(|_| CryptoError::Peer {
                status: StatusCode::BadSecurityChecksFailed,
                what: "AES decryption failed",
            })
    }
}

/// The keys of both directions for one token.
#[derive(Debug)]
pub struct ChannelKeys {
    /// Keys the client signs/encrypts with (and the server verifies/decrypts with).
    pub client: SymmetricKeys,
    /// Keys the server signs/encrypts with (and the client verifies/decrypts with).
    pub server: SymmetricKeys,
}

/// Derives both directions' keys from the nonces (Part 6 §6.7.5):
/// the client's keys are P_SHA256(ServerNonce, ClientNonce), the server's
/// P_SHA256(ClientNonce, ServerNonce), each cut into signing key,
/// encrypting key and IV in that order. Nonces of the wrong length are
/// `BadNonceInvalid`.
pub fn derive_keys(
    policy: SecurityPolicy,
    client_nonce: &[u8],
    server_nonce: &[u8],
) -> Result<ChannelKeys, CryptoError> {
    policy.check_nonce(client_nonce)?;
    policy.check_nonce(server_nonce)?;
    let s = policy.signing_key_length();
    let e = policy.encrypting_key_length();
    let mut buf = [0u8; 32 + 32 + AES_BLOCK];
    let len = s + e + AES_BLOCK;
    let one = |secret: &[u8], seed: &[u8], buf: &mut [u8; 80]| {
        let out = buf.get_mut(..len).unwrap_or_default();
        p_sha256(secret, seed, out);
        SymmetricKeys::new(
            policy,
            out.get(..s).unwrap_or_default(),
            out.get(s..s + e).unwrap_or_default(),
            out.get(s + e..).unwrap_or_default(),
        )
    };
    let client = one(server_nonce, client_nonce, &mut buf)?;
    let server = one(client_nonce, server_nonce, &mut buf)?;
    buf.fill(0);
    Ok(ChannelKeys { client, server })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Vector computed independently with Python's hmac/hashlib (a one-off
    /// script implementing RFC 5246 P_hash):
    /// secret = bytes(range(32)), seed = bytes(range(32, 64)), 80 bytes.
    #[test]
    fn p_sha256_known_vector() {
        let secret: Vec<u8> = (0..32).collect();
        let seed: Vec<u8> = (32..64).collect();
        let mut out = [0u8; 80];
        p_sha256(&secret, &seed, &mut out);
        assert_eq!(out.to_vec(), hex(P_SHA256_80));
        // A prefix of a longer output is the shorter output.
        let mut short = [0u8; 20];
        p_sha256(&secret, &seed, &mut short);
        assert_eq!(short[..], out[..20]);
    }

    const P_SHA256_80: &str = "b72593c43fee5fafa0256cd6bb904ff40c066a225db95f66dd744e20858a2220ddf75067e3d76ac714c08e24eabd85ff425d7f5fb25e6e083b94b174e29db89bc513e9172274d5ed54e52a3552901ae0";

    #[test]
    fn policies_round_trip_their_uris() {
        for p in SecurityPolicy::ALL {
            assert_eq!(SecurityPolicy::from_uri(p.uri()), Some(p));
        }
        assert_eq!(
            SecurityPolicy::from_uri("http://opcfoundation.org/UA/SecurityPolicy#Basic128Rsa15"),
            None
        );
    }

    #[test]
    fn nonce_and_key_size_checks() {
        let p = SecurityPolicy::Basic256Sha256;
        assert!(p.check_nonce(&[0; 32]).is_ok());
        for bad in [0, 16, 31, 33, 64] {
            let e = p.check_nonce(&vec![0; bad]).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadNonceInvalid);
        }
        assert!(SecurityPolicy::None.check_nonce(&[]).is_ok());
        for bits in [2048, 3072, 4096] {
            assert!(p.check_key_bits(bits).is_ok());
        }
        for bits in [1024, 2047, 4097, 8192] {
            let e = p.check_key_bits(bits).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadCertificatePolicyCheckFailed);
        }
        assert_eq!(p.random_nonce().unwrap().len(), 32);
        assert_ne!(p.random_nonce().unwrap(), p.random_nonce().unwrap());
    }

    #[test]
    fn derived_keys_work_both_ways() {
        for p in [
            SecurityPolicy::Basic256Sha256,
            SecurityPolicy::Aes128Sha256RsaOaep,
            SecurityPolicy::Aes256Sha256RsaPss,
        ] {
            let cn = [1u8; 32];
            let sn = [2u8; 32];
            let a = derive_keys(p, &cn, &sn).unwrap();
            let b = derive_keys(p, &cn, &sn).unwrap();
            let mut msg = [7u8; 64];
            a.client.encrypt(&mut msg).unwrap();
            assert_ne!(msg, [7u8; 64]);
            // The other direction's keys do not decrypt it.
            let mut wrong = msg;
            b.server.decrypt(&mut wrong).unwrap();
            assert_ne!(wrong, [7u8; 64]);
            b.client.decrypt(&mut msg).unwrap();
            assert_eq!(msg, [7u8; 64]);
            let mut sig = Vec::new();
            a.server.sign(b"data", &mut sig);
            assert_eq!(sig.len(), 32);
            b.server.verify(b"data", &sig).unwrap();
            let e = b.client.verify(b"data", &sig).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
            assert!(b.server.verify(b"datb", &sig).is_err());
            assert!(b.server.verify(b"data", &sig[..31]).is_err());
            let e = b.client.decrypt(&mut [0u8; 15]).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
            let e = derive_keys(p, &cn[..31], &sn).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadNonceInvalid);
        }
        assert!(derive_keys(SecurityPolicy::None, &[], &[]).is_err());
    }

    /// The derived keys are the P_SHA256 output cut in order: signing key,
    /// encrypting key, IV (checked through the AES-CBC IV: decrypting the
    /// first block with a zero IV differs from the real one by exactly the IV).
    #[test]
    fn derivation_order_matches_part_6() {
        let p = SecurityPolicy::Aes128Sha256RsaOaep;
        let cn: Vec<u8> = (0..32).collect();
        let sn: Vec<u8> = (100..132).collect();
        let mut material = [0u8; 64];
        p_sha256(&sn, &cn, &mut material);
        let keys = derive_keys(p, &cn, &sn).unwrap();
        let manual =
            SymmetricKeys::new(p, &material[..32], &material[32..48], &material[48..64]).unwrap();
        let mut a = [9u8; 32];
        let mut b = [9u8; 32];
        keys.client.encrypt(&mut a).unwrap();
        manual.encrypt(&mut b).unwrap();
        assert_eq!(a, b);
        let mut s1 = Vec::new();
        let mut s2 = Vec::new();
        keys.client.sign(b"x", &mut s1);
        manual.sign(b"x", &mut s2);
        assert_eq!(s1, s2);
    }
}
