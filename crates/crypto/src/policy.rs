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
//!
//! The ECC policies (Part 6 §6.8) have no asymmetric encryption: the
//! OpenSecureChannel is signed only, the nonces are ephemeral public keys
//! and the symmetric keys come from ECDH + HKDF ([`derive_ecc_keys`]):
//!
//! | Policy | curve | asymmetric signature | symmetric | sig/enc/IV key bytes |
//! |---|---|---|---|---|
//! | ECC_nistP256 | P-256 | ECDSA-SHA256 | HMAC-SHA256, AES-128-CBC | 32/16/16 |
//! | ECC_nistP384 | P-384 | ECDSA-SHA384 | HMAC-SHA384, AES-256-CBC | 48/32/16 |
//! | ECC_curve25519 | X25519 | Ed25519 | ChaCha20-Poly1305 | 32/32/12 |
//! | ECC_nistP256_AesGcm | P-256 | ECDSA-SHA256 | AES-128-GCM | 0/16/12 |
//! | ECC_nistP256_ChaChaPoly | P-256 | ECDSA-SHA256 | ChaCha20-Poly1305 | 0/32/12 |
//!
//! For the AEAD policies the symmetric "signature" is the 16-byte tag; in
//! mode Sign the whole chunk is authenticated data, in SignAndEncrypt the
//! unencrypted headers are. The curve25519 signing key (used for the tag in
//! mode Sign) follows open62541, the one peer that implements the policy.
//! Brainpool and curve448 are not offered (aws-lc implements neither).

use std::sync::OnceLock;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::{digest, hmac};
use uascale_types::StatusCode;

use crate::aes_cbc::{CbcSchedule, Direction};
use crate::ecc::{hkdf, salt, EccCurve, HkdfHash, Secret};
use crate::rsa::{EncryptionPadding, SignatureScheme};
use crate::CryptoError;

/// AES block size: the symmetric encryption block and IV length.
pub const AES_BLOCK: usize = 16;
/// HMAC-SHA256 output: the symmetric signature size of every RSA policy.
pub const HMAC_SHA256_LEN: usize = 32;
/// AEAD tag length (AES-GCM, ChaCha20-Poly1305).
pub const AEAD_TAG_LEN: usize = 16;
/// AEAD IV (nonce) length.
pub const AEAD_IV_LEN: usize = 12;

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
    /// `http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP256`.
    EccNistP256,
    /// `http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP384`.
    EccNistP384,
    /// `http://opcfoundation.org/UA/SecurityPolicy#ECC_curve25519`.
    EccCurve25519,
    /// `http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP256_AesGcm`
    /// (SecureChannelEnhancements).
    EccNistP256AesGcm,
    /// `http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP256_ChaChaPoly`
    /// (SecureChannelEnhancements).
    EccNistP256ChaChaPoly,
}

impl SecurityPolicy {
    /// Every policy offered, None first.
    pub const ALL: [SecurityPolicy; 9] = [
        SecurityPolicy::None,
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
        SecurityPolicy::EccNistP256,
        SecurityPolicy::EccNistP384,
        SecurityPolicy::EccCurve25519,
        SecurityPolicy::EccNistP256AesGcm,
        SecurityPolicy::EccNistP256ChaChaPoly,
    ];

    /// The RSA policies.
    pub const RSA: [SecurityPolicy; 3] = [
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
    ];

    /// The ECC policies.
    pub const ECC: [SecurityPolicy; 5] = [
        SecurityPolicy::EccNistP256,
        SecurityPolicy::EccNistP384,
        SecurityPolicy::EccCurve25519,
        SecurityPolicy::EccNistP256AesGcm,
        SecurityPolicy::EccNistP256ChaChaPoly,
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
            SecurityPolicy::EccNistP256 => {
                "http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP256"
            }
            SecurityPolicy::EccNistP384 => {
                "http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP384"
            }
            SecurityPolicy::EccCurve25519 => {
                "http://opcfoundation.org/UA/SecurityPolicy#ECC_curve25519"
            }
            SecurityPolicy::EccNistP256AesGcm => {
                "http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP256_AesGcm"
            }
            SecurityPolicy::EccNistP256ChaChaPoly => {
                "http://opcfoundation.org/UA/SecurityPolicy#ECC_nistP256_ChaChaPoly"
            }
        }
    }

    /// The curve of an ECC policy (None for None and the RSA policies).
    pub const fn curve(self) -> Option<EccCurve> {
        match self {
            SecurityPolicy::EccNistP256
            | SecurityPolicy::EccNistP256AesGcm
            | SecurityPolicy::EccNistP256ChaChaPoly => Some(EccCurve::NistP256),
            SecurityPolicy::EccNistP384 => Some(EccCurve::NistP384),
            SecurityPolicy::EccCurve25519 => Some(EccCurve::Curve25519),
            _ => None,
        }
    }

    /// True for the ECC policies.
    pub const fn is_ecc(self) -> bool {
        self.curve().is_some()
    }

    /// True for the RSA policies.
    pub const fn is_rsa(self) -> bool {
        !self.is_none() && !self.is_ecc()
    }

    /// True when the symmetric algorithm is an AEAD (AES-GCM,
    /// ChaCha20-Poly1305): no padding, a 16-byte tag as the signature.
    pub const fn is_aead(self) -> bool {
        matches!(
            self,
            SecurityPolicy::EccCurve25519
                | SecurityPolicy::EccNistP256AesGcm
                | SecurityPolicy::EccNistP256ChaChaPoly
        )
    }

    /// SecureChannelEnhancements (Part 6 1.05.07): the first OPN response
    /// is signed over the request's signature too (its signature is the
    /// ChannelThumbprint), session signatures are channel-bound and each
    /// renewal chains the previous secret into the new keys.
    pub const fn secure_channel_enhancements(self) -> bool {
        matches!(
            self,
            SecurityPolicy::EccNistP256AesGcm | SecurityPolicy::EccNistP256ChaChaPoly
        )
    }

    /// LegacySequenceNumbers: true for None and RSA (start at 1, wrap below
    /// 1024), false for ECC (start at 0, wrap from `u32::MAX` to 0).
    pub const fn legacy_sequence_numbers(self) -> bool {
        !self.is_ecc()
    }

    /// Length of the nonces a session's CreateSession exchanges (random
    /// bytes for every policy, 32 unless None).
    pub const fn session_nonce_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ => 32,
        }
    }

    /// Length of the derived IV (AES block for CBC, 12 for AEAD).
    pub const fn iv_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            _ if self.is_aead() => AEAD_IV_LEN,
            _ => AES_BLOCK,
        }
    }

    /// The HKDF hash of an ECC policy.
    pub const fn hkdf_hash(self) -> HkdfHash {
        match self {
            SecurityPolicy::EccNistP384 => HkdfHash::Sha384,
            _ => HkdfHash::Sha256,
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

    /// Length of the client and server nonces of the OpenSecureChannel
    /// (0 for None, 32 random bytes for RSA, the ephemeral key for ECC).
    pub const fn nonce_length(self) -> usize {
        match self.curve() {
            Some(c) => c.nonce_length(),
            None if self.is_none() => 0,
            None => 32,
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

    /// The RSA signature scheme (None for SecurityPolicy None and ECC).
    pub const fn asymmetric_signature(self) -> Option<SignatureScheme> {
        match self {
            SecurityPolicy::None => None,
            SecurityPolicy::Basic256Sha256 | SecurityPolicy::Aes128Sha256RsaOaep => {
                Some(SignatureScheme::Pkcs1Sha256)
            }
            SecurityPolicy::Aes256Sha256RsaPss => Some(SignatureScheme::PssSha256),
            _ => None,
        }
    }

    /// The asymmetric encryption padding (None for SecurityPolicy None and
    /// the ECC policies, which encrypt nothing asymmetrically).
    pub const fn asymmetric_encryption(self) -> Option<EncryptionPadding> {
        match self {
            SecurityPolicy::None => None,
            SecurityPolicy::Basic256Sha256 | SecurityPolicy::Aes128Sha256RsaOaep => {
                Some(EncryptionPadding::OaepSha1)
            }
            SecurityPolicy::Aes256Sha256RsaPss => Some(EncryptionPadding::OaepSha256),
            _ => None,
        }
    }

    /// Symmetric signature size in bytes (0 for None; the HMAC or the AEAD
    /// tag).
    pub const fn symmetric_signature_size(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            SecurityPolicy::EccNistP384 => 48,
            _ if self.is_aead() => AEAD_TAG_LEN,
            _ => HMAC_SHA256_LEN,
        }
    }

    /// Length of the derived symmetric signing key (0 for the AEAD
    /// policies with SecureChannelEnhancements, which sign with the tag of
    /// the encrypting key).
    pub const fn signing_key_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            SecurityPolicy::EccNistP384 => 48,
            SecurityPolicy::EccNistP256AesGcm | SecurityPolicy::EccNistP256ChaChaPoly => 0,
            _ => 32,
        }
    }

    /// Length of the derived symmetric encryption key (AES-128: 16,
    /// AES-256 and ChaCha20: 32).
    pub const fn encrypting_key_length(self) -> usize {
        match self {
            SecurityPolicy::None => 0,
            SecurityPolicy::Aes128Sha256RsaOaep
            | SecurityPolicy::EccNistP256
            | SecurityPolicy::EccNistP256AesGcm => 16,
            _ => 32,
        }
    }

    /// Symmetric encryption block size (1 for None and AEAD: no alignment).
    pub const fn symmetric_block_size(self) -> usize {
        match self {
            SecurityPolicy::None => 1,
            _ if self.is_aead() => 1,
            _ => AES_BLOCK,
        }
    }

    /// Checks a peer's nonce: exactly [`SecurityPolicy::nonce_length`]
    /// bytes and, for ECC, a point on the curve; else `BadNonceInvalid`.
    pub fn check_nonce(self, nonce: &[u8]) -> Result<(), CryptoError> {
        if let Some(curve) = self.curve() {
            return crate::ecc::check_ephemeral(curve, nonce);
        }
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
    /// Policy Check"): `BadCertificatePolicyCheckFailed` outside the range
    /// (and for every RSA key under an ECC policy).
    pub fn check_key_bits(self, bits: usize) -> Result<(), CryptoError> {
        if !self.is_ecc()
            && (self.min_asymmetric_key_bits()..=self.max_asymmetric_key_bits()).contains(&bits)
        {
            Ok(())
        } else {
            Err(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "certificate key size not allowed by the security policy",
            })
        }
    }

    /// Checks that a certificate key on `curve` may be used with this ECC
    /// policy: its own curve, or a P-384 key under a P-256 policy (.NET
    /// allows it; the signature is then 96 bytes). Anything else is
    /// `BadCertificatePolicyCheckFailed`.
    pub fn check_key_curve(self, curve: EccCurve) -> Result<(), CryptoError> {
        match (self.curve(), curve) {
            (Some(p), c) if p == c => Ok(()),
            (Some(EccCurve::NistP256), EccCurve::NistP384) => Ok(()),
            _ => Err(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "certificate key curve not allowed by the security policy",
            }),
        }
    }

    /// A fresh random nonce of [`SecurityPolicy::session_nonce_length`]
    /// bytes under ECC (sessions), [`SecurityPolicy::nonce_length`] under
    /// RSA.
    pub fn random_nonce(self) -> Result<Vec<u8>, CryptoError> {
        let len = if self.is_ecc() {
            self.session_nonce_length()
        } else {
            self.nonce_length()
        };
        let mut n = vec![0u8; len];
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
/// the AES key and the IV (CBC policies), or the AEAD keys and IV. The AES
/// key schedules (248 bytes each) are built on first use: a side only
/// ever encrypts with one direction's keys and decrypts with the other's,
/// so half of them are never built.
pub struct SymmetricKeys {
    policy: SecurityPolicy,
    inner: Inner,
}

/// CBC keys inline (the RSA policies' hot path, as before the AEAD
/// policies came), AEAD keys boxed.
#[allow(clippy::large_enum_variant)] // on purpose: no extra indirection for CBC
enum Inner {
    Cbc(CbcKeys),
    Aead(Box<AeadKeys>),
}

/// The raw key material only (about 120 bytes): the HMAC is computed from
/// the raw key for each message, and the AES key schedule is built when a
/// message needs it. Precomputed, they took 2.3 KB per direction (an HMAC
/// context of 1,232 bytes and two aws-lc-rs AES keys of 504) - most of a secured
/// session's memory - and building them costs a fraction of a microsecond
/// against the several the message's own HMAC and AES take (`cargo bench
/// -p uascale-crypto`). The algorithms follow from the key lengths.
struct CbcKeys {
    /// HMAC-SHA256 (32-byte keys) or HMAC-SHA384 (48, ECC_nistP384).
    signing_key: [u8; MAX_SIGNING_KEY],
    signing_key_len: u8,
    /// AES-128 (16 bytes) or AES-256 (32).
    aes_key: [u8; 32],
    aes_key_len: u8,
    iv: [u8; AES_BLOCK],
    /// The AES key schedule of the one operation this side does with
    /// these keys (a side encrypts with one direction's keys and decrypts
    /// with the other's), built on first use (boxed: 248 bytes) and
    /// dropped again by [`SymmetricKeys::release_schedules`]. The other
    /// operation, which only tests ask for, builds a schedule per call.
    schedule: OnceLock<Box<CbcSchedule>>,
}

/// The longest symmetric signing key of a CBC policy (ECC_nistP384).
const MAX_SIGNING_KEY: usize = 48;

struct AeadKeys {
    /// Tags of mode Sign (the signing key when the policy has one, else
    /// the encrypting key).
    signing: LessSafeKey,
    encrypting: LessSafeKey,
    iv: [u8; AEAD_IV_LEN],
}

impl std::fmt::Debug for SymmetricKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SymmetricKeys({:?})", self.policy)
    }
}

fn local(what: &'static str) -> CryptoError {
    CryptoError::Config { what }
}

fn checks_failed(what: &'static str) -> CryptoError {
    CryptoError::Peer {
        status: StatusCode::BadSecurityChecksFailed,
        what,
    }
}

/// Where an AEAD chunk's tag goes and what it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AeadChunk {
    /// Bytes of unencrypted headers at the front (authenticated data in
    /// SignAndEncrypt).
    pub head_len: usize,
    /// SignAndEncrypt (true) or Sign (false: everything is authenticated
    /// data, nothing is encrypted).
    pub encrypt: bool,
    /// The TokenId masked into IV bytes 0..4.
    pub token_id: u32,
    /// The sequence number masked into IV bytes 4..8: that of the chunk
    /// the sender sent before this one (what open62541 does).
    pub previous_sequence_number: u32,
}

impl SymmetricKeys {
    /// True for keys whose AES key schedules are built on first use and can
    /// be released with [`SymmetricKeys::release_schedules`] (the CBC
    /// policies); AEAD keys are built whole when derived.
    pub fn releases_schedules(&self) -> bool {
        matches!(self.inner, Inner::Cbc(_))
    }

    /// Drops the AES key schedule built so far (248 bytes); the next
    /// message that needs one builds it again from the raw key. A channel
    /// that has gone quiet calls this. Returns whether one was held.
    pub fn release_schedules(&mut self) -> bool {
        match &mut self.inner {
            Inner::Cbc(k) => k.schedule.take().is_some(),
            Inner::Aead(_) => false,
        }
    }

    /// True while an AES key schedule is built (CBC keys only).
    pub fn holds_schedules(&self) -> bool {
        match &self.inner {
            Inner::Cbc(k) => k.schedule.get().is_some(),
            Inner::Aead(_) => false,
        }
    }

    /// From the derived key material: signing key, encrypting key, IV.
    pub fn new(
        policy: SecurityPolicy,
        signing_key: &[u8],
        encrypting_key: &[u8],
        iv: &[u8],
    ) -> Result<Self, CryptoError> {
        if signing_key.len() != policy.signing_key_length() {
            return Err(local("signing key length does not match the policy"));
        }
        if encrypting_key.len() != policy.encrypting_key_length() || policy.is_none() {
            return Err(local("no symmetric keys for SecurityPolicy None"));
        }
        if policy.is_aead() {
            let alg = match policy {
                SecurityPolicy::EccNistP256AesGcm => &aead::AES_128_GCM,
                _ => &aead::CHACHA20_POLY1305,
            };
            let key = |k: &[u8]| {
                UnboundKey::new(alg, k)
                    .map(LessSafeKey::new)
                    .map_err(|_| local("AEAD key rejected"))
            };
            let signing = if signing_key.is_empty() {
                key(encrypting_key)?
            } else {
                key(signing_key)?
            };
            return Ok(SymmetricKeys {
                policy,
                inner: Inner::Aead(Box::new(AeadKeys {
                    signing,
                    encrypting: key(encrypting_key)?,
                    iv: iv
                        .try_into()
                        .map_err(|_| local("AEAD IV must be 12 bytes"))?,
                })),
            });
        }
        let mut aes_key = [0u8; 32];
        aes_key
            .get_mut(..encrypting_key.len())
            .ok_or(local("AES key rejected"))?
            .copy_from_slice(encrypting_key);
        let iv: [u8; AES_BLOCK] = iv
            .try_into()
            .map_err(|_| local("IV must be one AES block"))?;
        let mut raw_signing = [0u8; MAX_SIGNING_KEY];
        raw_signing
            .get_mut(..signing_key.len())
            .ok_or(local("signing key longer than 48 bytes"))?
            .copy_from_slice(signing_key);
        let keys = CbcKeys {
            signing_key: raw_signing,
            // At most 48 and 32 (checked by the copies above).
            signing_key_len: signing_key.len() as u8,
            aes_key,
            aes_key_len: encrypting_key.len() as u8,
            iv,
            schedule: OnceLock::new(),
        };
        // Checked once here, so that building it later cannot fail.
        CbcSchedule::new(keys.key(), Direction::Encrypt).ok_or(local("AES key rejected"))?;
        Ok(SymmetricKeys {
            policy,
            inner: Inner::Cbc(keys),
        })
    }

    fn cbc(&self) -> Result<&CbcKeys, CryptoError> {
        match &self.inner {
            Inner::Cbc(k) => Ok(k),
            Inner::Aead(_) => Err(local("AEAD keys used as CBC/HMAC keys")),
        }
    }

    /// The policy these keys belong to.
    pub fn policy(&self) -> SecurityPolicy {
        self.policy
    }

    /// True for AEAD keys (seal and open whole chunks with
    /// [`SymmetricKeys::seal_aead`] / [`SymmetricKeys::open_aead`]).
    pub fn is_aead(&self) -> bool {
        matches!(self.inner, Inner::Aead(_))
    }

    /// Signature size in bytes (HMAC output or AEAD tag).
    pub fn signature_size(&self) -> usize {
        self.policy.symmetric_signature_size()
    }

    /// Appends the HMAC of `data` to `out`.
    pub fn sign(&self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CryptoError> {
        out.extend_from_slice(self.cbc()?.hmac(data).as_ref());
        Ok(())
    }

    /// Signs `buf[..at]` and writes the HMAC into `buf[at..]`.
    pub fn sign_in_place(&self, buf: &mut [u8], at: usize) -> Result<(), CryptoError> {
        let tag = self.cbc()?.hmac(buf.get(..at).unwrap_or_default());
        let dst = buf
            .get_mut(at..at + tag.as_ref().len())
            .ok_or(local("no room for the signature"))?;
        dst.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Checks the HMAC `signature` over `data` in constant time; a
    /// mismatch is `BadSecurityChecksFailed`.
    pub fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), CryptoError> {
        let tag = self.cbc()?.hmac(data);
        aws_lc_rs::constant_time::verify_slices_are_equal(tag.as_ref(), signature)
            .map_err(|_| checks_failed("symmetric signature does not verify"))
    }

    /// AES-CBC encrypts `data` in place; its length must be a multiple of
    /// the block size (the chunk carries its own padding).
    pub fn encrypt(&self, data: &mut [u8]) -> Result<(), CryptoError> {
        let k = self.cbc()?;
        if data.len() % AES_BLOCK != 0 {
            return Err(local("plaintext is not a whole number of AES blocks"));
        }
        if data.is_empty() {
            return Ok(());
        }
        k.with_schedule(Direction::Encrypt, |key| key.apply(&k.iv, data))?
            .ok_or(local("AES encryption failed"))
    }

    /// AES-CBC decrypts `data` in place; a length that is not a multiple of
    /// the block size is `BadSecurityChecksFailed`.
    pub fn decrypt(&self, data: &mut [u8]) -> Result<(), CryptoError> {
        let k = self.cbc()?;
        if data.len() % AES_BLOCK != 0 {
            return Err(checks_failed(
                "ciphertext is not a whole number of AES blocks",
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        k.with_schedule(Direction::Decrypt, |key| key.apply(&k.iv, data))?
            .ok_or(checks_failed("AES decryption failed"))
    }

    fn aead(&self) -> Result<&AeadKeys, CryptoError> {
        match &self.inner {
            Inner::Aead(k) => Ok(k),
            Inner::Cbc(_) => Err(local("CBC keys used as AEAD keys")),
        }
    }

    /// Seals the chunk `chunk` in place: its last [`AEAD_TAG_LEN`] bytes are
    /// room for the tag; everything before is the plain chunk (headers
    /// with the final message size already set, sequence header, body).
    pub fn seal_aead(&self, chunk: &mut [u8], how: AeadChunk) -> Result<(), CryptoError> {
        let k = self.aead()?;
        let end = chunk
            .len()
            .checked_sub(AEAD_TAG_LEN)
            .filter(|e| *e >= how.head_len)
            .ok_or(local("AEAD chunk shorter than its headers"))?;
        let (data, tag_room) = chunk.split_at_mut(end);
        let nonce = k.nonce(how.token_id, how.previous_sequence_number);
        let tag = if how.encrypt {
            let (head, plain) = data.split_at_mut(how.head_len);
            k.encrypting
                .seal_in_place_separate_tag(nonce, Aad::from(&*head), plain)
        } else {
            k.signing
                .seal_in_place_separate_tag(nonce, Aad::from(&*data), &mut [])
        }
        .map_err(|_| local("AEAD sealing failed"))?;
        tag_room.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens (authenticates, and decrypts in SignAndEncrypt) the chunk
    /// `chunk` in place and returns the length of the plain chunk without
    /// the tag. A wrong tag is `BadSecurityChecksFailed`.
    pub fn open_aead(&self, chunk: &mut [u8], how: AeadChunk) -> Result<usize, CryptoError> {
        let k = self.aead()?;
        let end = chunk
            .len()
            .checked_sub(AEAD_TAG_LEN)
            .filter(|e| *e >= how.head_len)
            .ok_or(checks_failed("AEAD chunk shorter than its tag"))?;
        let nonce = k.nonce(how.token_id, how.previous_sequence_number);
        if how.encrypt {
            let (head, rest) = chunk.split_at_mut(how.head_len);
            k.encrypting
                .open_in_place(nonce, Aad::from(&*head), rest)
                .map_err(|_| checks_failed("AEAD chunk does not authenticate"))?;
        } else {
            let (data, tag) = chunk.split_at(end);
            let mut tag_copy = [0u8; AEAD_TAG_LEN];
            tag_copy.copy_from_slice(tag);
            k.signing
                .open_in_place(nonce, Aad::from(data), &mut tag_copy)
                .map_err(|_| checks_failed("AEAD chunk signature does not verify"))?;
        }
        Ok(end)
    }
}

impl Drop for CbcKeys {
    /// The raw keys are wiped when the channel lets them go.
    fn drop(&mut self) {
        self.signing_key = [0; MAX_SIGNING_KEY];
        self.aes_key = [0; 32];
        // Observed, so the stores are not elided as dead.
        std::hint::black_box((&self.signing_key, &self.aes_key));
    }
}

impl CbcKeys {
    fn key(&self) -> &[u8] {
        self.aes_key
            .get(..usize::from(self.aes_key_len))
            .unwrap_or(&self.aes_key)
    }

    fn hmac_algorithm(&self) -> &'static digest::Algorithm {
        if usize::from(self.signing_key_len) == MAX_SIGNING_KEY {
            &digest::SHA384
        } else {
            &digest::SHA256
        }
    }

    /// Runs `f` with the key schedule for `direction`: the kept one, built
    /// and kept when none is, or one built for this call when the kept one
    /// runs the other way.
    fn with_schedule<R>(
        &self,
        direction: Direction,
        f: impl FnOnce(&CbcSchedule) -> R,
    ) -> Result<R, CryptoError> {
        let build = || CbcSchedule::new(self.key(), direction).ok_or(local("AES key rejected"));
        if self.schedule.get().is_none() {
            // Err: another thread set one first; it is used or passed over below.
            let _ = self.schedule.set(Box::new(build()?));
        }
        match self.schedule.get() {
            Some(kept) if kept.direction() == direction => Ok(f(kept)),
            _ => Ok(f(&build()?)),
        }
    }

    /// HMAC (RFC 2104) of `data` under the signing key, from the raw key:
    /// H((K ^ opad) || H((K ^ ipad) || data)). The keys of every policy
    /// (32 or 48 bytes) are shorter than the hash's block, so K is the key
    /// padded with zeros. Two compressions more than a precomputed context,
    /// which would cost 1,232 bytes per direction and channel to keep.
    fn hmac(&self, data: &[u8]) -> digest::Digest {
        let key = self
            .signing_key
            .get(..usize::from(self.signing_key_len))
            .unwrap_or(&self.signing_key);
        let alg = self.hmac_algorithm();
        let block = alg.block_len();
        let mut pad = [0u8; 128];
        let pad = pad.get_mut(..block).unwrap_or_default();
        for (p, k) in pad.iter_mut().zip(key.iter().chain(std::iter::repeat(&0))) {
            *p = k ^ 0x36;
        }
        let mut inner = digest::Context::new(alg);
        inner.update(pad);
        inner.update(data);
        let inner = inner.finish();
        for p in pad.iter_mut() {
            *p ^= 0x36 ^ 0x5c;
        }
        let mut outer = digest::Context::new(alg);
        outer.update(pad);
        outer.update(inner.as_ref());
        outer.finish()
    }
}

impl AeadKeys {
    /// The IV with bytes 0..4 XOR TokenId and 4..8 XOR the sequence number,
    /// both little-endian.
    fn nonce(&self, token_id: u32, sequence_number: u32) -> Nonce {
        let mut iv = self.iv;
        for (b, m) in iv.iter_mut().zip(
            token_id
                .to_le_bytes()
                .into_iter()
                .chain(sequence_number.to_le_bytes()),
        ) {
            *b ^= m;
        }
        Nonce::assume_unique_for_key(iv)
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

impl ChannelKeys {
    /// Drops both directions' built AES key schedules
    /// ([`SymmetricKeys::release_schedules`]); returns whether one was held.
    pub fn release_schedules(&mut self) -> bool {
        let client = self.client.release_schedules();
        let server = self.server.release_schedules();
        client || server
    }
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
    if policy.is_ecc() {
        return Err(local("ECC policies derive keys with derive_ecc_keys"));
    }
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

/// Derives both directions' keys of an ECC policy (Part 6 §6.8.1) from the
/// ECDH secret (or, on a chained renewal, the chained input keying
/// material) and both ephemeral keys as sent:
///
/// ```text
/// L          = u16le(signing key + encrypting key + IV length)
/// ClientSalt = L || "opcua-client" || ClientNonce || ServerNonce
/// ServerSalt = L || "opcua-server" || ServerNonce || ClientNonce
/// keys       = HKDF(salt = info = Salt, IKM = secret, L bytes)
///              cut into signing key | encrypting key | IV
/// ```
pub fn derive_ecc_keys(
    policy: SecurityPolicy,
    secret: &Secret,
    client_nonce: &[u8],
    server_nonce: &[u8],
) -> Result<ChannelKeys, CryptoError> {
    if !policy.is_ecc() {
        return Err(local("ECC key derivation for a policy that is not ECC"));
    }
    let s = policy.signing_key_length();
    let e = policy.encrypting_key_length();
    let len = s + e + policy.iv_length();
    let mut buf = [0u8; 48 + 32 + AES_BLOCK];
    let mut one = |label: &[u8], first: &[u8], second: &[u8]| {
        let salt = salt(len, label, first, second);
        let out = buf.get_mut(..len).unwrap_or_default();
        hkdf(policy.hkdf_hash(), &salt, secret.as_bytes(), &salt, out);
        let keys = SymmetricKeys::new(
            policy,
            out.get(..s).unwrap_or_default(),
            out.get(s..s + e).unwrap_or_default(),
            out.get(s + e..).unwrap_or_default(),
        );
        out.fill(0);
        keys
    };
    let client = one(b"opcua-client", client_nonce, server_nonce)?;
    let server = one(b"opcua-server", server_nonce, client_nonce)?;
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
            a.server.sign(b"data", &mut sig).unwrap();
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

    /// Released AES schedules are built again from the raw key: what is
    /// encrypted and decrypted after a release is what it was before.
    #[test]
    fn released_schedules_are_built_again_alike() {
        for p in [
            SecurityPolicy::Basic256Sha256,
            SecurityPolicy::Aes128Sha256RsaOaep,
            SecurityPolicy::EccNistP256,
            SecurityPolicy::EccNistP384,
        ] {
            let (cn, sn) = ([1u8; 32], [2u8; 32]);
            let mut a = if p.is_ecc() {
                let material = [5u8; 128];
                let l = (p.signing_key_length(), p.encrypting_key_length());
                let keys = |m: &[u8]| {
                    SymmetricKeys::new(p, &m[..l.0], &m[l.0..l.0 + l.1], &m[l.0 + l.1..][..16])
                };
                ChannelKeys {
                    client: keys(&material).unwrap(),
                    server: keys(&material).unwrap(),
                }
            } else {
                derive_keys(p, &cn, &sn).unwrap()
            };
            assert!(a.client.releases_schedules());
            assert!(!a.client.holds_schedules());
            assert!(!a.release_schedules());
            let mut before = [7u8; 64];
            a.client.encrypt(&mut before).unwrap();
            assert!(a.client.holds_schedules());
            assert!(a.release_schedules());
            assert!(!a.client.holds_schedules() && !a.server.holds_schedules());
            let mut after = [7u8; 64];
            a.client.encrypt(&mut after).unwrap();
            assert_eq!(before, after);
            // The other operation builds a schedule for the call; the
            // kept one stays.
            a.client.decrypt(&mut after).unwrap();
            assert_eq!(after, [7u8; 64]);
            assert!(a.release_schedules());
            // Decrypting first keeps the decrypting schedule.
            a.server.encrypt(&mut after).unwrap();
            assert!(a.release_schedules());
            a.server.decrypt(&mut after).unwrap();
            assert_eq!(after, [7u8; 64]);
            assert!(a.server.holds_schedules());
            // Signatures come from the raw key alike before and after.
            let mut sig = Vec::new();
            a.server.sign(b"data", &mut sig).unwrap();
            assert_eq!(sig.len(), p.symmetric_signature_size());
            assert!(a.release_schedules());
            a.server.verify(b"data", &sig).unwrap();
        }
        let mut aead = SymmetricKeys::new(
            SecurityPolicy::EccNistP256AesGcm,
            &[],
            &[4u8; 16],
            &[0u8; AEAD_IV_LEN],
        )
        .unwrap();
        assert!(!aead.releases_schedules());
        assert!(!aead.release_schedules());
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
        keys.client.sign(b"x", &mut s1).unwrap();
        manual.sign(b"x", &mut s2).unwrap();
        assert_eq!(s1, s2);
    }
}

#[cfg(test)]
mod hmac_tests {
    use super::*;

    /// The HMAC built from the raw key matches aws-lc's HMAC for both
    /// hashes, every key length a policy uses and data around the block
    /// sizes; verification takes exactly the right tag.
    #[test]
    fn raw_key_hmac_matches_aws_lc() {
        for (policy, alg) in [
            (SecurityPolicy::Basic256Sha256, hmac::HMAC_SHA256),
            (SecurityPolicy::Aes128Sha256RsaOaep, hmac::HMAC_SHA256),
            (SecurityPolicy::EccNistP384, hmac::HMAC_SHA384),
        ] {
            let s = policy.signing_key_length();
            let signing: Vec<u8> = (0..s).map(|i| (i * 7 + 1) as u8).collect();
            let enc = vec![9u8; policy.encrypting_key_length()];
            let keys = SymmetricKeys::new(policy, &signing, &enc, &[3u8; AES_BLOCK]).unwrap();
            let reference = hmac::Key::new(alg, &signing);
            for len in [0usize, 1, 55, 63, 64, 65, 127, 128, 129, 1000] {
                let data: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
                let mut out = Vec::new();
                keys.sign(&data, &mut out).unwrap();
                assert_eq!(
                    out,
                    hmac::sign(&reference, &data).as_ref(),
                    "{policy:?} {len}"
                );
                keys.verify(&data, &out).unwrap();
                let mut wrong = out.clone();
                wrong[0] ^= 1;
                assert!(keys.verify(&data, &wrong).is_err());
                assert!(keys.verify(&data, &out[..out.len() - 1]).is_err());
            }
        }
    }
}
