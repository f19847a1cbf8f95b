//! Message security of secure conversation chunks (Part 6 §6.7.2 - §6.7.5):
//! signing, padding and encryption of outgoing chunks ([`Protection`]) and
//! the reverse for incoming ones ([`open_symmetric`], [`open_asymmetric`]),
//! usable by the server and the client alike; plus the server's security
//! configuration ([`ServerSecurity`]) and what a channel secured with
//! ([`ChannelSecurity`]).
//!
//! Chunk layout when secured (everything after the security header is
//! encrypted in SignAndEncrypt, and always for OPN chunks):
//!
//! ```text
//! | msg header | channel id | security header | seq no | request id | body |
//!   padding size | padding ... | [extra padding size] | signature |
//! ```
//!
//! The signature covers everything before it, with the message size field
//! already holding the final (encrypted) size. Padding makes the encrypted
//! part a whole number of cipher blocks; its bytes all hold the low byte of
//! the padding size, and the extra byte (the high byte) is present only when
//! the receiver's RSA key is longer than 2048 bits. Sign-only chunks carry
//! no padding.
//!
//! ECC policies (Part 6 §6.8): the OPN is signed, never encrypted, and
//! carries no padding (a trailing stray byte, which open62541 writes, is
//! ignored by the decoder); with SecureChannelEnhancements the first OPN
//! response is signed over the response chunk followed by the request's
//! signature, and its signature becomes the ChannelThumbprint. Symmetric
//! chunks of the AEAD policies carry no padding and a 16-byte tag instead
//! of the HMAC; the IV is masked with the TokenId and the sequence number
//! of the sender's previous chunk.

use std::fmt;
use std::sync::Arc;

use uascale_crypto::ecc::{EccCurve, EccPrivateKey, EccPublicKey, EphemeralKey, Secret};
use uascale_crypto::policy::{
    derive_ecc_keys, AeadChunk, ChannelKeys, SecurityPolicy, SymmetricKeys, AEAD_TAG_LEN, AES_BLOCK,
};
use uascale_crypto::rsa::{RsaPrivateKey, RsaPublicKey};
use uascale_crypto::x509::{Certificate, PeerCertificate};
use uascale_crypto::CryptoError;
use uascale_types::{MessageSecurityMode, StatusCode};

use crate::error::ChannelError;
use crate::tcp::HEADER_LEN;

/// Bytes of the sequence header (sequence number, request id).
pub const SEQUENCE_HEADER_LEN: usize = 8;

impl From<CryptoError> for ChannelError {
    fn from(e: CryptoError) -> Self {
        match e {
            CryptoError::Config { what } => ChannelError::Resource {
                status: StatusCode::BadConfigurationError,
                what,
            },
            CryptoError::Peer { status, what } | CryptoError::Certificate { status, what } => {
                ChannelError::Peer { status, what }
            }
            _ => ChannelError::Peer {
                status: e.status_code(),
                what: "security check failed",
            },
        }
    }
}

fn checks_failed(what: &'static str) -> ChannelError {
    ChannelError::Peer {
        status: StatusCode::BadSecurityChecksFailed,
        what,
    }
}

/// The private key of an application instance certificate.
pub enum PrivateKey {
    /// RSA (the RSA policies).
    Rsa(RsaPrivateKey),
    /// P-256, P-384 or Ed25519 (the ECC policies).
    Ecc(EccPrivateKey),
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrivateKey::Rsa(k) => k.fmt(f),
            PrivateKey::Ecc(k) => k.fmt(f),
        }
    }
}

impl PrivateKey {
    /// From PKCS#8 DER (RSA, P-256, P-384 or Ed25519) or PKCS#1 DER (RSA).
    pub fn from_der(der: &[u8]) -> Result<Self, CryptoError> {
        match RsaPrivateKey::from_der(der) {
            Ok(k) => Ok(PrivateKey::Rsa(k)),
            Err(_) => EccPrivateKey::from_pkcs8_der(der)
                .map(PrivateKey::Ecc)
                .map_err(|_| CryptoError::Config {
                    what: "private key is neither RSA (PKCS#8, PKCS#1) nor ECC (PKCS#8)",
                }),
        }
    }

    /// The DER SubjectPublicKeyInfo of the public half.
    pub fn spki_der(&self) -> &[u8] {
        match self {
            PrivateKey::Rsa(k) => k.public_key().spki_der(),
            PrivateKey::Ecc(k) => k.public_key().spki_der(),
        }
    }

    /// Signature length in bytes.
    pub fn signature_length(&self) -> usize {
        match self {
            PrivateKey::Rsa(k) => k.size(),
            PrivateKey::Ecc(k) => k.signature_length(),
        }
    }

    /// Signs `message` with the asymmetric signature of `policy` and
    /// appends the signature to `out`. A key of the wrong kind for the
    /// policy is a configuration error.
    pub fn sign(
        &self,
        policy: SecurityPolicy,
        message: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        match (self, policy.asymmetric_signature()) {
            (PrivateKey::Rsa(k), Some(scheme)) => k.sign(scheme, message, out),
            (PrivateKey::Ecc(k), None) if policy.is_ecc() => k.sign(message, out),
            _ => Err(CryptoError::Config {
                what: "application key does not suit the security policy",
            }),
        }
    }

    /// True when this key can serve `policy`.
    pub fn suits(&self, policy: SecurityPolicy) -> bool {
        match self {
            PrivateKey::Rsa(k) => policy.is_rsa() && policy.check_key_bits(k.bits()).is_ok(),
            // Our own key signs with the policy's hash, so it must be on the
            // policy's curve (aws-lc cannot sign ECDSA-SHA256 with P-384;
            // a peer's P-384 key on nistP256 is accepted on verify).
            PrivateKey::Ecc(k) => policy.curve() == Some(k.curve()),
        }
    }
}

/// A peer's public key from its certificate.
#[derive(Debug, Clone)]
pub enum PublicKey {
    /// RSA.
    Rsa(Arc<RsaPublicKey>),
    /// P-256, P-384 or Ed25519.
    Ecc(Arc<EccPublicKey>),
}

impl PublicKey {
    /// The key of `certificate`, checked against `policy`: an RSA key of
    /// the allowed size for RSA policies, a key on the policy's curve for
    /// ECC ones; else `BadCertificatePolicyCheckFailed` (or
    /// `BadCertificateInvalid` when the key does not parse).
    pub fn of_certificate(
        certificate: &Certificate,
        policy: SecurityPolicy,
    ) -> Result<Self, CryptoError> {
        Self::of_parts(
            certificate.ecc_curve(),
            certificate.key_bits(),
            certificate.subject_public_key_info_der(),
            policy,
        )
    }

    /// The key of a channel's peer certificate, checked against `policy`
    /// as [`PublicKey::of_certificate`] does.
    pub fn of_peer(peer: &PeerCertificate, policy: SecurityPolicy) -> Result<Self, CryptoError> {
        Self::of_parts(
            peer.ecc_curve(),
            peer.key_bits(),
            peer.subject_public_key_info_der(),
            policy,
        )
    }

    fn of_parts(
        curve: Option<EccCurve>,
        key_bits: usize,
        spki: &[u8],
        policy: SecurityPolicy,
    ) -> Result<Self, CryptoError> {
        if policy.is_ecc() {
            let curve = curve.ok_or(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "certificate key is not an ECC key of a supported curve",
            })?;
            policy.check_key_curve(curve)?;
            let key = EccPublicKey::from_spki_der(spki)?;
            return Ok(PublicKey::Ecc(Arc::new(key)));
        }
        // Before the key is loaded: aws-lc refuses short keys with a
        // vaguer error.
        policy.check_key_bits(key_bits)?;
        let key = RsaPublicKey::from_spki_der(spki)?;
        policy.check_key_bits(key.bits())?;
        Ok(PublicKey::Rsa(Arc::new(key)))
    }

    /// The RSA key, if it is one.
    pub fn rsa(&self) -> Option<&RsaPublicKey> {
        match self {
            PublicKey::Rsa(k) => Some(k),
            PublicKey::Ecc(_) => None,
        }
    }

    /// The ECC key, if it is one.
    pub fn ecc(&self) -> Option<&EccPublicKey> {
        match self {
            PublicKey::Ecc(k) => Some(k),
            PublicKey::Rsa(_) => None,
        }
    }

    /// Checks `signature` over `message` with the asymmetric signature of
    /// `policy`; a mismatch is `BadSecurityChecksFailed`.
    pub fn verify(
        &self,
        policy: SecurityPolicy,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), CryptoError> {
        match (self, policy.asymmetric_signature(), policy.curve()) {
            (PublicKey::Rsa(k), Some(scheme), _) => k.verify(scheme, message, signature),
            (PublicKey::Ecc(k), None, Some(curve)) => k.verify(curve, message, signature),
            _ => Err(CryptoError::Peer {
                status: StatusCode::BadSecurityChecksFailed,
                what: "key does not suit the security policy",
            }),
        }
    }
}

/// An application instance certificate with its private key.
pub struct Identity {
    certificate: Certificate,
    private_key: PrivateKey,
    thumbprint: [u8; 20],
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("certificate", &self.certificate)
            .field("key", &self.private_key)
            .finish()
    }
}

impl Identity {
    /// Pairs a certificate with its RSA private key; fails when the key is
    /// not the certificate's.
    pub fn new(certificate: Certificate, private_key: RsaPrivateKey) -> Result<Self, CryptoError> {
        Self::with_key(certificate, PrivateKey::Rsa(private_key))
    }

    /// Pairs a certificate with its private key (RSA or ECC); fails when
    /// the key is not the certificate's.
    pub fn with_key(
        certificate: Certificate,
        private_key: PrivateKey,
    ) -> Result<Self, CryptoError> {
        if certificate.subject_public_key_info_der() != private_key.spki_der() {
            return Err(CryptoError::Config {
                what: "private key does not belong to the certificate",
            });
        }
        let thumbprint = certificate.thumbprint();
        Ok(Identity {
            certificate,
            private_key,
            thumbprint,
        })
    }

    /// The certificate.
    pub fn certificate(&self) -> &Certificate {
        &self.certificate
    }

    /// The private key.
    pub fn key(&self) -> &PrivateKey {
        &self.private_key
    }

    /// The private key when it is RSA.
    pub fn rsa_key(&self) -> Option<&RsaPrivateKey> {
        match &self.private_key {
            PrivateKey::Rsa(k) => Some(k),
            PrivateKey::Ecc(_) => None,
        }
    }

    /// The private key when it is ECC.
    pub fn ecc_key(&self) -> Option<&EccPrivateKey> {
        match &self.private_key {
            PrivateKey::Ecc(k) => Some(k),
            PrivateKey::Rsa(_) => None,
        }
    }

    /// True when this identity can serve `policy` (RSA key of an allowed
    /// size, or a key on the policy's curve).
    pub fn suits(&self, policy: SecurityPolicy) -> bool {
        self.private_key.suits(policy)
    }

    /// SHA-1 of the certificate DER.
    pub fn thumbprint(&self) -> &[u8; 20] {
        &self.thumbprint
    }
}

/// Decides whether a peer's certificate is trusted (trust lists,
/// revocation, validity, ApplicationUri...). The channel calls it once per
/// OpenSecureChannel Issue with the sender certificate (the leaf of the
/// chain) and the whole chain as sent; the error's status goes into the ERR
/// message (`BadCertificateUntrusted`, `BadCertificateTimeInvalid`, ...).
pub trait CertificateValidator: Send + Sync + fmt::Debug {
    /// Ok when the certificate may open a channel under `policy`.
    fn validate(
        &self,
        certificate: &Certificate,
        chain: &[u8],
        policy: SecurityPolicy,
    ) -> Result<(), CryptoError>;
}

/// Trusts every certificate that parses: for tests and for operators who
/// name the risk (`trust_all_client_certificates`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrustAllCertificates;

impl CertificateValidator for TrustAllCertificates {
    fn validate(&self, _: &Certificate, _: &[u8], _: SecurityPolicy) -> Result<(), CryptoError> {
        Ok(())
    }
}

/// The server's security settings for its connections.
#[derive(Debug, Clone)]
pub struct ServerSecurity {
    /// The server's certificate and key; required by every policy but None.
    /// For RSA policies (or the ECC policies its key suits).
    pub identity: Option<Arc<Identity>>,
    /// ECC certificates and keys beside `identity` (one per curve): an ECC
    /// endpoint is served with the first one whose curve suits its policy.
    pub ecc_identities: Vec<Arc<Identity>>,
    /// The (policy, mode) pairs the endpoints offer. Default: None/None only,
    /// since no certificate exists until one is configured.
    pub endpoints: Vec<(SecurityPolicy, MessageSecurityMode)>,
    /// Judges client certificates. `None` trusts none: every secured
    /// channel is refused with `BadCertificateUntrusted`.
    pub validator: Option<Arc<dyn CertificateValidator>>,
}

impl Default for ServerSecurity {
    fn default() -> Self {
        ServerSecurity {
            identity: None,
            ecc_identities: Vec::new(),
            endpoints: vec![(SecurityPolicy::None, MessageSecurityMode::None)],
            validator: None,
        }
    }
}

impl ServerSecurity {
    /// True when some endpoint offers `policy`.
    pub fn offers_policy(&self, policy: SecurityPolicy) -> bool {
        self.endpoints.iter().any(|(p, _)| *p == policy)
    }

    /// True when some endpoint offers `policy` with `mode`.
    pub fn offers(&self, policy: SecurityPolicy, mode: MessageSecurityMode) -> bool {
        self.endpoints.contains(&(policy, mode))
    }

    /// The certificate and key that serve `policy`: `identity` when it
    /// suits, else the first suitable one of `ecc_identities`.
    pub fn identity_for(&self, policy: SecurityPolicy) -> Option<&Arc<Identity>> {
        self.identity
            .iter()
            .chain(&self.ecc_identities)
            .find(|i| i.suits(policy))
    }
}

/// What a secure channel was opened with; the session layer needs it for
/// CreateSession (the client certificate) and ActivateSession (the client's
/// signature).
#[derive(Debug, Clone)]
pub struct ChannelSecurity {
    /// The security policy.
    pub policy: SecurityPolicy,
    /// The message security mode.
    pub mode: MessageSecurityMode,
    /// What the channel keeps of the peer's certificate (None for
    /// SecurityPolicy None); its DER only under ECC policies.
    pub remote_certificate: Option<Arc<PeerCertificate>>,
    /// The ChannelThumbprint (SecureChannelEnhancements: the signature of
    /// the first OPN response); None otherwise. Session signatures are
    /// bound to it. (Shared, not owned: this struct is cloned per request
    /// and sits in every connection; an `Arc<Vec>`, one pointer, rather
    /// than an `Arc<[u8]>` of two: 8 bytes less in every connection, for
    /// a field only ECC policies use.)
    pub channel_thumbprint: Option<Arc<Vec<u8>>>,
}

impl ChannelSecurity {
    /// SecurityPolicy None.
    pub fn none() -> Self {
        ChannelSecurity {
            policy: SecurityPolicy::None,
            mode: MessageSecurityMode::None,
            remote_certificate: None,
            channel_thumbprint: None,
        }
    }

    /// The ChannelThumbprint, empty when the channel has none.
    pub fn thumbprint(&self) -> &[u8] {
        self.channel_thumbprint
            .as_deref()
            .map_or(&[][..], Vec::as_slice)
    }

    /// The peer certificate's key checked against the policy (RSA or ECC);
    /// None under SecurityPolicy None.
    pub fn remote_public_key(&self) -> Result<Option<PublicKey>, CryptoError> {
        match &self.remote_certificate {
            None => Ok(None),
            Some(cert) => PublicKey::of_peer(cert, self.policy).map(Some),
        }
    }

    /// The peer certificate's public key (None under SecurityPolicy None),
    /// parsed from the certificate at each call. It is needed only when the
    /// channel is opened or renewed and when a session is activated; kept
    /// parsed, aws-lc's key object and the Montgomery caches its first
    /// operations build would hold about 4.5 KB per channel in between.
    pub fn remote_key(&self) -> Result<Option<RsaPublicKey>, CryptoError> {
        match &self.remote_certificate {
            None => Ok(None),
            Some(cert) => RsaPublicKey::from_spki_der(cert.subject_public_key_info_der()).map(Some),
        }
    }
}

/// The first certificate of a chain sent as concatenated DER certificates
/// (Part 6 §6.7.2.3): its outer SEQUENCE header says how long it is.
pub fn leaf_certificate(chain: &[u8]) -> Result<&[u8], ChannelError> {
    let bad = ChannelError::Peer {
        status: StatusCode::BadCertificateInvalid,
        what: "sender certificate is not DER",
    };
    let (tag, first) = match chain {
        [tag, first, ..] => (*tag, *first),
        _ => return Err(bad),
    };
    if tag != 0x30 {
        return Err(bad);
    }
    let (len, at) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 3 {
            return Err(bad);
        }
        let bytes = chain.get(2..2 + n).ok_or(bad.clone())?;
        (
            bytes.iter().fold(0usize, |a, b| (a << 8) | usize::from(*b)),
            2 + n,
        )
    };
    chain.get(..at + len).ok_or(bad)
}

/// How outgoing chunks are secured.
#[derive(Debug, Clone, Copy)]
pub enum Protection<'a> {
    /// SecurityPolicy None: plain chunks.
    None,
    /// Symmetric, mode Sign: HMAC appended.
    Sign(&'a SymmetricKeys),
    /// Symmetric, mode SignAndEncrypt: padding, HMAC, AES-CBC.
    SignAndEncrypt(&'a SymmetricKeys),
    /// Asymmetric (OpenSecureChannel): padding, RSA signature with our key,
    /// RSA encryption with the peer's key.
    Asymmetric {
        /// The policy naming the algorithms.
        policy: SecurityPolicy,
        /// Our private key (signs).
        local: &'a RsaPrivateKey,
        /// The peer's public key (encrypts).
        remote: &'a RsaPublicKey,
    },
    /// Asymmetric under an ECC policy: signed with our key, not encrypted,
    /// no padding.
    EccAsymmetric {
        /// The policy naming the algorithms.
        policy: SecurityPolicy,
        /// Our private key (signs).
        local: &'a EccPrivateKey,
        /// Bytes signed after the chunk but not sent: the request's
        /// signature in the first OPN response under
        /// SecureChannelEnhancements; empty otherwise.
        signed_suffix: &'a [u8],
    },
}

impl Protection<'_> {
    /// The largest body that fits one chunk of `chunk_size` bytes whose
    /// unencrypted headers (message header, channel id, security header)
    /// take `head_len` bytes.
    pub fn max_body(&self, chunk_size: usize, head_len: usize) -> usize {
        let avail = chunk_size.saturating_sub(head_len);
        match self {
            Protection::None => avail.saturating_sub(SEQUENCE_HEADER_LEN),
            Protection::Sign(k) => avail
                .saturating_sub(SEQUENCE_HEADER_LEN)
                .saturating_sub(k.signature_size()),
            Protection::SignAndEncrypt(k) if k.is_aead() => {
                avail.saturating_sub(SEQUENCE_HEADER_LEN + AEAD_TAG_LEN)
            }
            Protection::SignAndEncrypt(k) => (avail / AES_BLOCK * AES_BLOCK)
                .saturating_sub(SEQUENCE_HEADER_LEN + k.signature_size() + 1),
            Protection::EccAsymmetric { local, .. } => {
                avail.saturating_sub(SEQUENCE_HEADER_LEN + local.signature_length())
            }
            Protection::Asymmetric {
                policy,
                local,
                remote,
            } => {
                let Some(padding) = policy.asymmetric_encryption() else {
                    return 0;
                };
                let blocks = avail / remote.size().max(1);
                let plain = blocks * remote.plaintext_block_size(padding);
                plain.saturating_sub(
                    SEQUENCE_HEADER_LEN + local.size() + 1 + extra_padding(remote.bits()),
                )
            }
        }
    }

    /// Secures the chunk at `out[start..]` (headers, sequence header and
    /// body, `head_len` bytes of unencrypted headers) in place: padding,
    /// final size, signature, encryption.
    pub fn seal(
        &self,
        out: &mut Vec<u8>,
        start: usize,
        head_len: usize,
    ) -> Result<(), ChannelError> {
        match self {
            Protection::None => {
                let size = out.len() - start;
                set_size(out, start, size);
            }
            Protection::Sign(k) | Protection::SignAndEncrypt(k) if k.is_aead() => {
                let size = out.len() - start + AEAD_TAG_LEN;
                set_size(out, start, size);
                let word = |at: usize| {
                    let mut b = [0u8; 4];
                    if let Some(w) = out.get(start + at..start + at + 4) {
                        b.copy_from_slice(w);
                    }
                    u32::from_le_bytes(b)
                };
                let how = AeadChunk {
                    head_len,
                    encrypt: matches!(self, Protection::SignAndEncrypt(_)),
                    token_id: word(head_len.saturating_sub(4)),
                    previous_sequence_number: word(head_len).wrapping_sub(1),
                };
                out.resize(out.len() + AEAD_TAG_LEN, 0);
                k.seal_aead(out.get_mut(start..).unwrap_or_default(), how)?;
            }
            Protection::Sign(k) => {
                let sig = k.signature_size();
                let size = out.len() - start + sig;
                set_size(out, start, size);
                let at = out.len();
                out.resize(at + sig, 0);
                k.sign_in_place(out.get_mut(start..).unwrap_or_default(), at - start)?;
            }
            Protection::SignAndEncrypt(k) => {
                let sig = k.signature_size();
                let plain = out.len() - start - head_len;
                let pad = (AES_BLOCK - (plain + 1 + sig) % AES_BLOCK) % AES_BLOCK;
                out.resize(out.len() + pad + 1, pad as u8);
                let size = out.len() - start + sig;
                set_size(out, start, size);
                let at = out.len();
                out.resize(at + sig, 0);
                k.sign_in_place(out.get_mut(start..).unwrap_or_default(), at - start)?;
                k.encrypt(out.get_mut(start + head_len..).unwrap_or_default())?;
            }
            Protection::Asymmetric {
                policy,
                local,
                remote,
            } => {
                let (Some(padding), Some(scheme)) = (
                    policy.asymmetric_encryption(),
                    policy.asymmetric_signature(),
                ) else {
                    return Err(ChannelError::Resource {
                        status: StatusCode::BadInternalError,
                        what: "asymmetric protection under SecurityPolicy None",
                    });
                };
                let block = remote.plaintext_block_size(padding).max(1);
                let extra = extra_padding(remote.bits());
                let sig = local.size();
                let plain = out.len() - start - head_len;
                let pad = (block - (plain + 1 + extra + sig) % block) % block;
                out.resize(out.len() + pad + 1, (pad & 0xff) as u8);
                if extra == 1 {
                    out.push((pad >> 8) as u8);
                }
                let blocks = (out.len() - start - head_len + sig) / block;
                set_size(out, start, head_len + blocks * remote.size());
                let signed = out.get(start..).unwrap_or_default().to_vec();
                local.sign(scheme, &signed, out)?;
                let tail = out.split_off(start + head_len);
                remote.encrypt(padding, &tail, out)?;
            }
            Protection::EccAsymmetric {
                policy: _,
                local,
                signed_suffix,
            } => {
                let size = out.len() - start + local.signature_length();
                set_size(out, start, size);
                let at = out.len();
                let signed = if signed_suffix.is_empty() {
                    out.get(start..).unwrap_or_default().to_vec()
                } else {
                    [out.get(start..).unwrap_or_default(), signed_suffix].concat()
                };
                local.sign(&signed, out)?;
                if out.len() != at + local.signature_length() {
                    return Err(ChannelError::Resource {
                        status: StatusCode::BadInternalError,
                        what: "ECC signature of an unexpected length",
                    });
                }
            }
        }
        Ok(())
    }
}

/// 1 when the receiver's key is longer than 2048 bits (Part 6 §6.7.2.5).
fn extra_padding(receiver_bits: usize) -> usize {
    usize::from(receiver_bits > 2048)
}

fn set_size(out: &mut [u8], start: usize, size: usize) {
    let size = u32::try_from(size).unwrap_or(u32::MAX);
    if let Some(field) = out.get_mut(start + 4..start + 8) {
        field.copy_from_slice(&size.to_le_bytes());
    }
}

/// Verifies (and, with `encrypted`, first decrypts) the symmetric chunk
/// `msg` in place; `head_len` is the length of its unencrypted headers.
/// Returns the length of the chunk without padding and signature, so that
/// `msg[..len]` parses as a plain chunk. `last_received` is the sequence
/// number of the peer's previous chunk (the AEAD policies mask the IV
/// with it; the others ignore it).
pub fn open_symmetric(
    keys: &SymmetricKeys,
    encrypted: bool,
    msg: &mut [u8],
    head_len: usize,
    last_received: u32,
) -> Result<usize, ChannelError> {
    if keys.is_aead() {
        if msg.len() < head_len + SEQUENCE_HEADER_LEN + AEAD_TAG_LEN {
            return Err(checks_failed("chunk too short for its tag"));
        }
        let token: [u8; 4] = msg
            .get(head_len.saturating_sub(4)..head_len)
            .and_then(|t| t.try_into().ok())
            .unwrap_or_default();
        let how = AeadChunk {
            head_len,
            encrypt: encrypted,
            token_id: u32::from_le_bytes(token),
            previous_sequence_number: last_received,
        };
        return Ok(keys.open_aead(msg, how)?);
    }
    let sig = keys.signature_size();
    let min = head_len + SEQUENCE_HEADER_LEN + sig + usize::from(encrypted);
    if msg.len() < min {
        return Err(checks_failed("chunk too short for its signature"));
    }
    if encrypted {
        keys.decrypt(msg.get_mut(head_len..).unwrap_or_default())?;
    }
    let at = msg.len() - sig;
    let (signed, signature) = msg.split_at(at);
    keys.verify(signed, signature)?;
    if !encrypted {
        return Ok(at);
    }
    let pad = usize::from(signed.last().copied().unwrap_or_default());
    let end = at
        .checked_sub(pad + 1)
        .filter(|e| *e >= head_len + SEQUENCE_HEADER_LEN)
        .ok_or(checks_failed("padding longer than the chunk"))?;
    Ok(end)
}

/// Decrypts and verifies an asymmetric (OPN) chunk: `msg` is the whole
/// chunk, `head_len` its unencrypted headers. Returns the chunk without
/// padding and signature, decrypted, ready for [`crate::chunk::Chunk::parse`].
pub fn open_asymmetric(
    policy: SecurityPolicy,
    local: &RsaPrivateKey,
    remote: &RsaPublicKey,
    msg: &[u8],
    head_len: usize,
) -> Result<Vec<u8>, ChannelError> {
    let (Some(padding), Some(scheme)) = (
        policy.asymmetric_encryption(),
        policy.asymmetric_signature(),
    ) else {
        return Err(ChannelError::Resource {
            status: StatusCode::BadInternalError,
            what: "asymmetric security under SecurityPolicy None",
        });
    };
    let (head, encrypted) = msg.split_at(head_len.min(msg.len()));
    let mut plain = Vec::with_capacity(msg.len());
    plain.extend_from_slice(head);
    local.decrypt(padding, encrypted, &mut plain)?;
    let sig = remote.size();
    let extra = extra_padding(local.bits());
    let len = plain.len();
    if len < head_len + SEQUENCE_HEADER_LEN + 1 + extra + sig {
        return Err(checks_failed("OPN chunk too short for its signature"));
    }
    let at = len - sig;
    let (signed, signature) = plain.split_at(at);
    remote.verify(scheme, signed, signature)?;
    let low = usize::from(signed.get(at - 1 - extra).copied().unwrap_or_default());
    let high = if extra == 1 {
        usize::from(signed.get(at - 1).copied().unwrap_or_default())
    } else {
        0
    };
    let pad = (high << 8) | low;
    let end = at
        .checked_sub(pad + 1 + extra)
        .filter(|e| *e >= head_len + SEQUENCE_HEADER_LEN)
        .ok_or(checks_failed("padding longer than the OPN chunk"))?;
    plain.truncate(end);
    Ok(plain)
}

/// Verifies an asymmetric (OPN) chunk of an ECC policy: `msg` is the whole
/// chunk, signed and not encrypted, with no padding; the signature is as
/// long as the sender's key makes it (96 bytes for a P-384 certificate on
/// a P-256 policy). `signed_suffix` is appended to the signed bytes (the
/// request signature when verifying a first OPN response under
/// SecureChannelEnhancements). Returns the length of the chunk without
/// the signature.
pub fn open_asymmetric_ecc(
    policy: SecurityPolicy,
    remote: &EccPublicKey,
    msg: &[u8],
    head_len: usize,
    signed_suffix: &[u8],
) -> Result<usize, ChannelError> {
    let Some(curve) = policy.curve() else {
        return Err(ChannelError::Resource {
            status: StatusCode::BadInternalError,
            what: "ECC security under a policy that is not ECC",
        });
    };
    let sig = remote.signature_length();
    let at = msg
        .len()
        .checked_sub(sig)
        .filter(|at| *at >= head_len + SEQUENCE_HEADER_LEN)
        .ok_or(checks_failed("OPN chunk too short for its signature"))?;
    let (signed, signature) = msg.split_at(at);
    if signed_suffix.is_empty() {
        remote.verify(curve, signed, signature)?;
    } else {
        remote.verify(curve, &[signed, signed_suffix].concat(), signature)?;
    }
    Ok(at)
}

/// One ECC key agreement of an OpenSecureChannel: the ECDH of our
/// ephemeral key with the peer's nonce (a nonce not on the curve is
/// `BadNonceInvalid`), chained with the previous token's input keying
/// material when the policy has SecureChannelEnhancements, then HKDF.
/// Returns both directions' keys and the input keying material to chain
/// the next renewal with.
pub fn ecc_token_keys(
    policy: SecurityPolicy,
    ephemeral: &EphemeralKey,
    peer_nonce: &[u8],
    client_nonce: &[u8],
    server_nonce: &[u8],
    previous: Option<&Secret>,
) -> Result<(ChannelKeys, Secret), ChannelError> {
    let z = ephemeral.agree(peer_nonce)?;
    let ikm = match previous {
        Some(p) if policy.secure_channel_enhancements() => z.chained(p)?,
        _ => z,
    };
    let keys = derive_ecc_keys(policy, &ikm, client_nonce, server_nonce)?;
    Ok((keys, ikm))
}

/// What a CreateSession ServerSignature signs (Part 4 §5.6.2, and the
/// channel-bound form of SecureChannelEnhancements):
///
/// ```text
/// classic:  ClientCertificate || ClientNonce
/// bound:    ChannelThumbprint || ClientNonce || H(ServerChannelCert)
///           || H(ClientChannelCert) || ServerNonce
/// ```
///
/// The bound form applies when `thumbprint` is not empty (only channels of
/// enhanced policies have one); H is SHA-256 (SHA-384 for P-384).
pub fn create_session_signed_data(
    policy: SecurityPolicy,
    thumbprint: &[u8],
    client_nonce: &[u8],
    server_nonce: &[u8],
    server_channel_cert: &[u8],
    client_channel_cert: &[u8],
) -> Vec<u8> {
    match policy.curve().filter(|_| !thumbprint.is_empty()) {
        Some(curve) => {
            let h = |der: &[u8]| uascale_crypto::ecc::certificate_hash(curve, der);
            [
                thumbprint,
                client_nonce,
                &h(server_channel_cert),
                &h(client_channel_cert),
                server_nonce,
            ]
            .concat()
        }
        None => [client_channel_cert, client_nonce].concat(),
    }
}

/// What an ActivateSession ClientSignature signs:
///
/// ```text
/// classic:  ServerCertificate || ServerNonce
/// bound:    ChannelThumbprint || ServerNonce || H(ServerCert)
///           || H(ServerChannelCert) || H(ClientChannelCert) || ClientNonce
/// ```
///
/// `server_nonce` is the last nonce the server gave, `client_nonce` the
/// CreateSession ClientNonce.
pub fn activate_session_signed_data(
    policy: SecurityPolicy,
    thumbprint: &[u8],
    server_nonce: &[u8],
    client_nonce: &[u8],
    server_cert: &[u8],
    server_channel_cert: &[u8],
    client_channel_cert: &[u8],
) -> Vec<u8> {
    match policy.curve().filter(|_| !thumbprint.is_empty()) {
        Some(curve) => {
            let h = |der: &[u8]| uascale_crypto::ecc::certificate_hash(curve, der);
            [
                thumbprint,
                server_nonce,
                &h(server_cert),
                &h(server_channel_cert),
                &h(client_channel_cert),
                client_nonce,
            ]
            .concat()
        }
        None => [server_cert, server_nonce].concat(),
    }
}

/// What an X509 user token's signature (ActivateSession UserTokenSignature)
/// signs:
///
/// ```text
/// classic:  ServerCertificate || ServerNonce
/// bound:    ChannelThumbprint || ServerNonce || H(ServerCert)
///           || H(ServerChannelCert) || H(ClientCert) || H(ClientChannelCert)
///           || ClientNonce
/// ```
#[allow(clippy::too_many_arguments)]
pub fn user_token_signed_data(
    policy: SecurityPolicy,
    thumbprint: &[u8],
    server_nonce: &[u8],
    client_nonce: &[u8],
    server_cert: &[u8],
    server_channel_cert: &[u8],
    client_cert: &[u8],
    client_channel_cert: &[u8],
) -> Vec<u8> {
    match policy.curve().filter(|_| !thumbprint.is_empty()) {
        Some(curve) => {
            let h = |der: &[u8]| uascale_crypto::ecc::certificate_hash(curve, der);
            [
                thumbprint,
                server_nonce,
                &h(server_cert),
                &h(server_channel_cert),
                &h(client_cert),
                &h(client_channel_cert),
                client_nonce,
            ]
            .concat()
        }
        None => [server_cert, server_nonce].concat(),
    }
}

/// Bytes of the unencrypted headers of a symmetric chunk.
pub const SYMMETRIC_HEAD_LEN: usize = HEADER_LEN + 4 + 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{
        parse_security_header, write_chunks_protected, AsymmetricHeader, Chunk, SecurityHeader,
        SendLimits, SequenceNumbers,
    };
    use crate::tcp::{split_messages, ChunkType, MessageType};
    use uascale_crypto::policy::derive_keys;

    const POLICIES: [SecurityPolicy; 3] = [
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
    ];

    /// Seals `body` into chunks of at most `chunk`, checks every size, opens
    /// them again and returns the reassembled body.
    fn round_trip(keys: &SymmetricKeys, encrypted: bool, body: &[u8], chunk: usize) -> Vec<u8> {
        let protection = if encrypted {
            Protection::SignAndEncrypt(keys)
        } else {
            Protection::Sign(keys)
        };
        let mut out = Vec::new();
        let limits = SendLimits {
            max_chunk_size: chunk,
            max_message_size: 0,
            max_chunk_count: 0,
        };
        let mut seq = SequenceNumbers::starting_at(1);
        write_chunks_protected(
            &mut out,
            MessageType::Message,
            5,
            &SecurityHeader::Symmetric(9),
            &protection,
            &mut seq,
            3,
            body,
            &limits,
        )
        .unwrap();
        let mut joined = Vec::new();
        let msgs = split_messages(&out);
        let n = msgs.len();
        for (i, (h, m)) in msgs.into_iter().enumerate() {
            assert!(m.len() <= chunk, "{} > {chunk}", m.len());
            if i + 1 < n {
                // Only the last chunk may be short by more than one block
                // (plus the padding-size byte when encrypted).
                assert!(m.len() + AES_BLOCK + 1 > chunk, "{} of {chunk}", m.len());
            }
            let mut m = m.to_vec();
            let (_, _, head) = parse_security_header(&h, &m).unwrap();
            assert_eq!(head, SYMMETRIC_HEAD_LEN);
            let len = open_symmetric(keys, encrypted, &mut m, head, 0).unwrap();
            let c = Chunk::parse(&h, &m[..len]).unwrap();
            assert_eq!(
                c.chunk_type == ChunkType::Final,
                i + 1 == n,
                "only the last chunk is final"
            );
            joined.extend_from_slice(c.body);
        }
        joined
    }

    #[test]
    fn symmetric_chunks_fit_and_round_trip_for_every_length() {
        for policy in POLICIES {
            let keys = derive_keys(policy, &[3; 32], &[4; 32]).unwrap();
            for encrypted in [false, true] {
                for chunk in [1024usize, 1500, 8192] {
                    for len in (0..2100).step_by(7).chain([2047, 2048, 2049]) {
                        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                        assert_eq!(round_trip(&keys.client, encrypted, &body, chunk), body);
                    }
                }
            }
        }
    }

    #[test]
    fn opening_garbage_is_an_error_not_a_panic() {
        let keys = derive_keys(SecurityPolicy::Basic256Sha256, &[3; 32], &[4; 32]).unwrap();
        for len in 0..200 {
            for encrypted in [false, true] {
                let mut m = vec![0xffu8; len];
                let e = open_symmetric(&keys.client, encrypted, &mut m, SYMMETRIC_HEAD_LEN, 0);
                assert_eq!(
                    e.unwrap_err().status_code(),
                    StatusCode::BadSecurityChecksFailed
                );
            }
        }
        // AEAD keys, any length and any header length (even absurd ones).
        for policy in [
            SecurityPolicy::EccNistP256AesGcm,
            SecurityPolicy::EccNistP256ChaChaPoly,
            SecurityPolicy::EccCurve25519,
        ] {
            let s = policy.signing_key_length();
            let k = SymmetricKeys::new(
                policy,
                &vec![1; s],
                &vec![2; policy.encrypting_key_length()],
                &[3; 12],
            )
            .unwrap();
            for len in 0..80 {
                for head in [0usize, 2, 16, 40, 100] {
                    for encrypted in [false, true] {
                        let mut m = vec![0x5au8; len];
                        let e = open_symmetric(&k, encrypted, &mut m, head, 7);
                        assert_eq!(
                            e.unwrap_err().status_code(),
                            StatusCode::BadSecurityChecksFailed
                        );
                    }
                }
            }
        }
        let a = RsaPrivateKey::generate(2048).unwrap();
        let b = RsaPrivateKey::generate(2048).unwrap();
        for len in [0usize, 1, 20, 255, 256, 257, 512, 600] {
            let m = vec![0x30u8; len];
            let e = open_asymmetric(SecurityPolicy::Basic256Sha256, &a, b.public_key(), &m, 16);
            assert!(e.is_err());
        }
        assert!(leaf_certificate(b"\x30\x84\0\0\0\x01\0").is_err());
        assert!(leaf_certificate(b"\x30\x82\x01").is_err());
        assert_eq!(
            leaf_certificate(b"\x30\x01\x05\x30").unwrap(),
            b"\x30\x01\x05"
        );
    }

    #[test]
    fn asymmetric_chunk_fits_the_buffer_at_its_limit() {
        let a = RsaPrivateKey::generate(2048).unwrap();
        let b = RsaPrivateKey::generate(2048).unwrap();
        let policy = SecurityPolicy::Aes256Sha256RsaPss;
        let protection = Protection::Asymmetric {
            policy,
            local: &a,
            remote: b.public_key(),
        };
        let header = SecurityHeader::Asymmetric(AsymmetricHeader::none());
        let head = HEADER_LEN + 4 + 4 + POLICY_LEN + 4 + 4;
        let room = protection.max_body(8192, head);
        for (len, fits) in [(room, true), (room + 1, false)] {
            let mut out = Vec::new();
            let r = write_chunks_protected(
                &mut out,
                MessageType::OpenSecureChannel,
                0,
                &header,
                &protection,
                &mut SequenceNumbers::starting_at(1),
                1,
                &vec![1; len],
                &SendLimits {
                    max_chunk_size: 8192,
                    max_message_size: 0,
                    max_chunk_count: 0,
                },
            );
            assert_eq!(r.is_ok(), fits, "{len}");
            if fits {
                assert!(out.len() <= 8192 && out.len() > 8192 - 256, "{}", out.len());
                let plain = open_asymmetric(policy, &b, a.public_key(), &out, head).unwrap();
                assert_eq!(plain.len(), head + SEQUENCE_HEADER_LEN + len);
            }
        }
    }

    const POLICY_LEN: usize = "http://opcfoundation.org/UA/SecurityPolicy#None".len();
}
