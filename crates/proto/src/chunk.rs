//! Secure conversation chunks (Part 6 §6.7.2): the header after the UACP
//! header (secure channel id, then the asymmetric or symmetric security
//! header, then the sequence header), and splitting an outgoing message into
//! chunks.
//!
//! Signing and encryption are [`crate::security`]'s: [`write_chunks_protected`]
//! seals each chunk it writes, and the channel opens received chunks before
//! [`Chunk::parse`] sees them.

use uascale_types::{
    BinaryDecode, BinaryEncode, ByteString, DecodeLimits, Reader, StatusCode, UaString,
};

use crate::error::ChannelError;
use crate::security::Protection;
use crate::tcp::{finish_message, ChunkType, MessageHeader, MessageType, HEADER_LEN};

/// The SecurityPolicyUri of SecurityPolicy None.
pub const POLICY_NONE_URI: &str = "http://opcfoundation.org/UA/SecurityPolicy#None";
/// Largest SecurityPolicyUri accepted (Part 6 §6.7.2.3: 255 bytes).
pub const MAX_POLICY_URI: usize = 255;
/// Largest certificate (chain) accepted in an asymmetric header.
pub const MAX_CERTIFICATE: usize = 32 * 1024;

/// Bytes of the symmetric chunk header: UACP header, channel id, token id,
/// sequence number, request id.
pub const SYMMETRIC_OVERHEAD: usize = HEADER_LEN + 4 + 4 + 8;

/// The asymmetric algorithm security header of OPN chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsymmetricHeader {
    /// The SecurityPolicyUri.
    pub policy_uri: UaString,
    /// The sender's certificate (chain); null for None.
    pub sender_certificate: ByteString,
    /// SHA-1 thumbprint of the receiver's certificate; null for None.
    pub receiver_thumbprint: ByteString,
}

impl AsymmetricHeader {
    /// The header of SecurityPolicy None.
    pub fn none() -> Self {
        AsymmetricHeader {
            policy_uri: UaString::from(POLICY_NONE_URI),
            sender_certificate: ByteString::null(),
            receiver_thumbprint: ByteString::null(),
        }
    }

    fn encode(&self, w: &mut Vec<u8>) {
        self.policy_uri.encode(w);
        self.sender_certificate.encode(w);
        self.receiver_thumbprint.encode(w);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, ChannelError> {
        // Cut short is a decoding error; only a field over its limit says
        // something about the policy or the certificate.
        let over_limit = |e: &uascale_types::DecodeError| {
            e.status_code() == StatusCode::BadEncodingLimitsExceeded
        };
        let policy_uri = UaString::decode(r).map_err(|e| {
            if over_limit(&e) {
                ChannelError::Peer {
                    status: StatusCode::BadSecurityPolicyRejected,
                    what: "SecurityPolicyUri longer than 255 bytes",
                }
            } else {
                ChannelError::decode(e)
            }
        })?;
        let sender_certificate = ByteString::decode(r).map_err(|e| {
            if over_limit(&e) {
                ChannelError::Peer {
                    status: StatusCode::BadCertificateInvalid,
                    what: "sender certificate too large",
                }
            } else {
                ChannelError::decode(e)
            }
        })?;
        let receiver_thumbprint = ByteString::decode(r).map_err(ChannelError::decode)?;
        Ok(AsymmetricHeader {
            policy_uri,
            sender_certificate,
            receiver_thumbprint,
        })
    }
}

/// The security header of one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecurityHeader {
    /// OPN chunks.
    Asymmetric(AsymmetricHeader),
    /// MSG and CLO chunks: the token id.
    Symmetric(u32),
}

/// One received secure conversation chunk, split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// MSG, OPN or CLO.
    pub message_type: MessageType,
    /// F, C or A.
    pub chunk_type: ChunkType,
    /// The secure channel id (0 in the first OPN).
    pub channel_id: u32,
    /// The security header.
    pub security: SecurityHeader,
    /// The sequence number.
    pub sequence_number: u32,
    /// The request id.
    pub request_id: u32,
    /// The body part of this chunk.
    pub body: &'a [u8],
}

fn header_limits() -> DecodeLimits {
    DecodeLimits {
        max_string_length: MAX_POLICY_URI,
        max_byte_string_length: MAX_CERTIFICATE,
        ..DecodeLimits::default()
    }
}

/// Parses the unencrypted front of a chunk: the secure channel id and the
/// security header. Returns them with the offset where the (possibly
/// encrypted) sequence header starts.
pub fn parse_security_header(
    header: &MessageHeader,
    bytes: &[u8],
) -> Result<(u32, SecurityHeader, usize), ChannelError> {
    let limits = header_limits();
    let rest = bytes.get(HEADER_LEN..).unwrap_or(&[]);
    let mut r = Reader::new(rest, &limits).map_err(ChannelError::decode)?;
    let channel_id = u32::decode(&mut r).map_err(truncated)?;
    let security = match header.message_type {
        MessageType::OpenSecureChannel => {
            SecurityHeader::Asymmetric(AsymmetricHeader::decode(&mut r)?)
        }
        MessageType::Message | MessageType::CloseSecureChannel => {
            SecurityHeader::Symmetric(u32::decode(&mut r).map_err(truncated)?)
        }
        _ => {
            return Err(ChannelError::Peer {
                status: StatusCode::BadTcpMessageTypeInvalid,
                what: "not a secure conversation message",
            })
        }
    };
    Ok((channel_id, security, HEADER_LEN + r.position()))
}

fn truncated<E>(_: E) -> ChannelError {
    ChannelError::Peer {
        status: StatusCode::BadTcpMessageTooLarge,
        what: "chunk shorter than its headers",
    }
}

impl<'a> Chunk<'a> {
    /// Parses a whole plain (or already decrypted, padding and signature
    /// removed) chunk.
    pub fn parse(header: &MessageHeader, bytes: &'a [u8]) -> Result<Self, ChannelError> {
        let (channel_id, security, at) = parse_security_header(header, bytes)?;
        let seq = bytes.get(at..at + 8).ok_or_else(|| truncated(()))?;
        let word = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(seq.get(i..i + 4).unwrap_or(&[0; 4]));
            u32::from_le_bytes(b)
        };
        Ok(Chunk {
            message_type: header.message_type,
            chunk_type: header.chunk_type,
            channel_id,
            security,
            sequence_number: word(0),
            request_id: word(4),
            body: bytes.get(at + 8..).unwrap_or(&[]),
        })
    }
}

/// Sequence numbers of one direction (Part 6 §6.7.2.4). Legacy numbering
/// (None and the RSA policies) starts at 1 and wraps after
/// `u32::MAX - 1024` to a value below 1024; the ECC policies
/// (LegacySequenceNumbers = false) start at 0 and wrap from `u32::MAX`
/// to 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceNumbers {
    next: u32,
    legacy: bool,
}

/// The last sequence number before a wrap.
const WRAP_AT: u32 = u32::MAX - 1024;

impl SequenceNumbers {
    /// Legacy numbering starting at `first`.
    pub const fn starting_at(first: u32) -> Self {
        SequenceNumbers {
            next: first,
            legacy: true,
        }
    }

    /// The numbering of `policy` from its first number (1 legacy, 0 not).
    pub const fn for_policy(policy: uascale_crypto::policy::SecurityPolicy) -> Self {
        let legacy = policy.legacy_sequence_numbers();
        SequenceNumbers {
            next: if legacy { 1 } else { 0 },
            legacy,
        }
    }

    /// Takes the next number to send.
    pub fn take(&mut self) -> u32 {
        let n = self.next;
        self.next = if !self.legacy {
            n.wrapping_add(1)
        } else if n >= WRAP_AT {
            1
        } else {
            n + 1
        };
        n
    }

    /// Checks a received number against the expected one (legacy):
    /// `received` must follow `last`, or be below 1024 right after a wrap.
    pub fn follows(last: u32, received: u32) -> bool {
        if last >= WRAP_AT {
            received < 1024
        } else {
            received == last.wrapping_add(1)
        }
    }

    /// [`SequenceNumbers::follows`] for legacy numbering; without it,
    /// `received` is exactly `last + 1`, wrapping from `u32::MAX` to 0.
    pub fn follows_in(legacy: bool, last: u32, received: u32) -> bool {
        if legacy {
            Self::follows(last, received)
        } else {
            received == last.wrapping_add(1)
        }
    }
}

/// Limits on one outgoing message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendLimits {
    /// Largest chunk (the peer's receive buffer).
    pub max_chunk_size: usize,
    /// Largest message body; 0 = no limit.
    pub max_message_size: usize,
    /// Most chunks; 0 = no limit.
    pub max_chunk_count: usize,
}

/// Splits `body` into plain (SecurityPolicy None) chunks of `message_type`
/// and appends them to `out`; see [`write_chunks_protected`].
#[allow(clippy::too_many_arguments)]
pub fn write_chunks(
    out: &mut Vec<u8>,
    message_type: MessageType,
    channel_id: u32,
    security: &SecurityHeader,
    seq: &mut SequenceNumbers,
    request_id: u32,
    body: &[u8],
    limits: &SendLimits,
) -> Result<(), ChannelError> {
    write_chunks_protected(
        out,
        message_type,
        channel_id,
        security,
        &Protection::None,
        seq,
        request_id,
        body,
        limits,
    )
}

/// Splits `body` into chunks of `message_type`, secures each with
/// `protection` and appends them to `out`.
///
/// Fails with `BadResponseTooLarge` (nothing written) when the body exceeds
/// the peer's message size or chunk count; the caller then answers with a
/// ServiceFault instead.
#[allow(clippy::too_many_arguments)]
pub fn write_chunks_protected(
    out: &mut Vec<u8>,
    message_type: MessageType,
    channel_id: u32,
    security: &SecurityHeader,
    protection: &Protection<'_>,
    seq: &mut SequenceNumbers,
    request_id: u32,
    body: &[u8],
    limits: &SendLimits,
) -> Result<(), ChannelError> {
    // The symmetric header (every MSG) stays on the stack; only OPN allocates.
    let token_bytes;
    let asymmetric;
    let header: &[u8] = match security {
        SecurityHeader::Asymmetric(a) => {
            let mut h = Vec::with_capacity(64);
            a.encode(&mut h);
            asymmetric = h;
            &asymmetric
        }
        SecurityHeader::Symmetric(token) => {
            token_bytes = token.to_le_bytes();
            &token_bytes
        }
    };
    let head_len = HEADER_LEN + 4 + header.len();
    let room = protection.max_body(limits.max_chunk_size, head_len);
    if room == 0 {
        return Err(ChannelError::Resource {
            status: StatusCode::BadTcpInternalError,
            what: "chunk size leaves no room for a body",
        });
    }
    let chunks = body.len().div_ceil(room).max(1);
    let too_large = (limits.max_message_size != 0 && body.len() > limits.max_message_size)
        || (limits.max_chunk_count != 0 && chunks > limits.max_chunk_count)
        || (message_type != MessageType::Message && chunks > 1);
    if too_large {
        return Err(ChannelError::Resource {
            status: StatusCode::BadResponseTooLarge,
            what: "message exceeds the peer's limits",
        });
    }
    let start = out.len();
    out.reserve(body.len() + chunks * (limits.max_chunk_size - room));
    let mut parts = body.chunks(room).peekable();
    let mut write = |out: &mut Vec<u8>, ct: ChunkType, part: &[u8]| {
        let at = out.len();
        MessageHeader::write_start(out, message_type, ct);
        channel_id.encode(out);
        out.extend_from_slice(header);
        seq.take().encode(out);
        request_id.encode(out);
        out.extend_from_slice(part);
        protection.seal(out, at, head_len)
    };
    let mut result = if body.is_empty() {
        write(out, ChunkType::Final, &[])
    } else {
        Ok(())
    };
    while let (Ok(()), Some(part)) = (&result, parts.next()) {
        let ct = if parts.peek().is_some() {
            ChunkType::Intermediate
        } else {
            ChunkType::Final
        };
        result = write(out, ct, part);
    }
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Writes an abort chunk (`MSGA`) carrying an Error body (Part 6 §6.7.3).
pub fn write_abort(
    out: &mut Vec<u8>,
    channel_id: u32,
    token_id: u32,
    seq: &mut SequenceNumbers,
    request_id: u32,
    status: StatusCode,
    reason: &str,
) {
    let mut body = Vec::new();
    status.encode(&mut body);
    UaString::from(reason).encode(&mut body);
    let start = out.len();
    MessageHeader::write_start(out, MessageType::Message, ChunkType::Abort);
    channel_id.encode(out);
    token_id.encode(out);
    seq.take().encode(out);
    request_id.encode(out);
    out.extend_from_slice(&body);
    finish_message(out, start);
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_crypto::policy::SecurityPolicy;

    fn parse_all(bytes: &[u8]) -> Vec<Chunk<'_>> {
        crate::tcp::split_messages(bytes)
            .into_iter()
            .map(|(h, m)| Chunk::parse(&h, m).unwrap())
            .collect()
    }

    #[test]
    fn splits_into_chunks_that_fit() {
        let body: Vec<u8> = (0..100u8).collect();
        let mut out = Vec::new();
        let mut seq = SequenceNumbers::starting_at(5);
        let limits = SendLimits {
            max_chunk_size: SYMMETRIC_OVERHEAD + 30,
            max_message_size: 0,
            max_chunk_count: 0,
        };
        write_chunks(
            &mut out,
            MessageType::Message,
            9,
            &SecurityHeader::Symmetric(3),
            &mut seq,
            77,
            &body,
            &limits,
        )
        .unwrap();
        let chunks = parse_all(&out);
        assert_eq!(chunks.len(), 4);
        assert!(chunks[..3]
            .iter()
            .all(|c| c.chunk_type == ChunkType::Intermediate));
        assert_eq!(chunks[3].chunk_type, ChunkType::Final);
        assert_eq!(
            chunks.iter().map(|c| c.sequence_number).collect::<Vec<_>>(),
            [5, 6, 7, 8]
        );
        assert!(chunks
            .iter()
            .all(|c| c.request_id == 77 && c.channel_id == 9));
        assert_eq!(chunks[0].security, SecurityHeader::Symmetric(3));
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.body.iter().copied()).collect();
        assert_eq!(joined, body);
    }

    #[test]
    fn refuses_what_the_peer_cannot_take() {
        let mut out = Vec::new();
        let mut seq = SequenceNumbers::starting_at(1);
        let limits = SendLimits {
            max_chunk_size: SYMMETRIC_OVERHEAD + 10,
            max_message_size: 0,
            max_chunk_count: 2,
        };
        let e = write_chunks(
            &mut out,
            MessageType::Message,
            1,
            &SecurityHeader::Symmetric(1),
            &mut seq,
            1,
            &[0; 21],
            &limits,
        )
        .unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadResponseTooLarge);
        assert!(out.is_empty());
        assert_eq!(seq.take(), 1, "no sequence number spent");
    }

    #[test]
    fn opn_header_round_trip() {
        let mut out = Vec::new();
        let mut seq = SequenceNumbers::starting_at(1);
        let limits = SendLimits {
            max_chunk_size: 8192,
            max_message_size: 0,
            max_chunk_count: 0,
        };
        let sec = SecurityHeader::Asymmetric(AsymmetricHeader::none());
        write_chunks(
            &mut out,
            MessageType::OpenSecureChannel,
            0,
            &sec,
            &mut seq,
            1,
            b"body",
            &limits,
        )
        .unwrap();
        let c = &parse_all(&out)[0];
        assert_eq!(c.security, sec);
        assert_eq!(c.body, b"body");
    }

    #[test]
    fn sequence_numbers_wrap_below_1024() {
        let mut s = SequenceNumbers::starting_at(WRAP_AT);
        assert_eq!(s.take(), WRAP_AT);
        assert_eq!(s.take(), 1);
        assert!(SequenceNumbers::follows(WRAP_AT, 0));
        assert!(SequenceNumbers::follows(WRAP_AT, 1023));
        assert!(!SequenceNumbers::follows(WRAP_AT, 1024));
        assert!(SequenceNumbers::follows(41, 42));
        assert!(!SequenceNumbers::follows(41, 41), "replay");
        assert!(!SequenceNumbers::follows(41, 43), "gap");
        // Non-legacy (ECC): from 0, wrapping from u32::MAX to 0 only.
        let mut s = SequenceNumbers::for_policy(SecurityPolicy::EccNistP256);
        assert_eq!(s.take(), 0);
        assert_eq!(s.take(), 1);
        let mut s = SequenceNumbers {
            next: u32::MAX,
            legacy: false,
        };
        assert_eq!(s.take(), u32::MAX);
        assert_eq!(s.take(), 0);
        assert!(SequenceNumbers::follows_in(false, u32::MAX, 0));
        assert!(!SequenceNumbers::follows_in(false, WRAP_AT, 5));
        assert!(!SequenceNumbers::follows_in(false, u32::MAX, 1));
        assert!(SequenceNumbers::follows_in(true, WRAP_AT, 5));
        assert_eq!(
            SequenceNumbers::for_policy(SecurityPolicy::Basic256Sha256).take(),
            1
        );
    }

    /// A hostile-input finding: an OPN whose SecurityPolicyUri is cut short is a
    /// decoding error, not a rejected policy; one over 255 bytes is a
    /// rejected policy.
    #[test]
    fn a_truncated_policy_uri_is_a_decoding_error() {
        let opn = |tail: &[u8]| {
            let mut m = b"OPNF\0\0\0\0".to_vec();
            m.extend_from_slice(&0u32.to_le_bytes()); // channel id
            m.extend_from_slice(tail);
            let len = m.len() as u32;
            m[4..8].copy_from_slice(&len.to_le_bytes());
            m
        };
        let status = |m: &[u8]| {
            let h = MessageHeader::parse(m, u32::MAX).unwrap().unwrap();
            parse_security_header(&h, m).unwrap_err().status_code()
        };
        // The string says 40 bytes; 10 follow.
        let mut cut = 40i32.to_le_bytes().to_vec();
        cut.extend_from_slice(b"http://opc");
        assert_eq!(status(&opn(&cut)), StatusCode::BadDecodingError);
        // Two bytes of a four-byte length.
        assert_eq!(status(&opn(&[5, 0])), StatusCode::BadDecodingError);
        let mut long = 300i32.to_le_bytes().to_vec();
        long.extend_from_slice(&[b'a'; 300]);
        assert_eq!(status(&opn(&long)), StatusCode::BadSecurityPolicyRejected);
    }

    #[test]
    fn truncated_chunk_is_an_error() {
        let h = MessageHeader::parse(b"MSGF\x0c\0\0\0", u32::MAX)
            .unwrap()
            .unwrap();
        let e = Chunk::parse(&h, b"MSGF\x0c\0\0\0\x01\0\0\0").unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadTcpMessageTooLarge);
    }
}
