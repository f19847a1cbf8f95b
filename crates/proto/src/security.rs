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

use std::fmt;
use std::sync::Arc;

use uascale_crypto::policy::{SecurityPolicy, SymmetricKeys, AES_BLOCK};
use uascale_crypto::rsa::{RsaPrivateKey, RsaPublicKey};
use uascale_crypto::x509::Certificate;
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

/// An application instance certificate with its private key.
pub struct Identity {
    certificate: Certificate,
    private_key: RsaPrivateKey,
    thumbprint: [u8; 20],
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("certificate", &self.certificate)
            .field("key_bits", &self.private_key.bits())
            .finish()
    }
}

impl Identity {
    /// Pairs a certificate with its private key; fails when the key is not
    /// the certificate's.
    pub fn new(certificate: Certificate, private_key: RsaPrivateKey) -> Result<Self, CryptoError> {
        if certificate.subject_public_key_info_der() != private_key.public_key().spki_der() {
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
    pub fn private_key(&self) -> &RsaPrivateKey {
        &self.private_key
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
    pub identity: Option<Arc<Identity>>,
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
    /// The peer's certificate (None for SecurityPolicy None).
    pub remote_certificate: Option<Arc<Certificate>>,
}

impl ChannelSecurity {
    /// SecurityPolicy None.
    pub fn none() -> Self {
        ChannelSecurity {
            policy: SecurityPolicy::None,
            mode: MessageSecurityMode::None,
            remote_certificate: None,
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
            Protection::SignAndEncrypt(k) => (avail / AES_BLOCK * AES_BLOCK)
                .saturating_sub(SEQUENCE_HEADER_LEN + k.signature_size() + 1),
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
/// `msg[..len]` parses as a plain chunk.
pub fn open_symmetric(
    keys: &SymmetricKeys,
    encrypted: bool,
    msg: &mut [u8],
    head_len: usize,
) -> Result<usize, ChannelError> {
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
            let len = open_symmetric(keys, encrypted, &mut m, head).unwrap();
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
                let e = open_symmetric(&keys.client, encrypted, &mut m, SYMMETRIC_HEAD_LEN);
                assert_eq!(
                    e.unwrap_err().status_code(),
                    StatusCode::BadSecurityChecksFailed
                );
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
