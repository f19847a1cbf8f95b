//! The OPC UA Connection Protocol (UACP, Part 6 §7.1): the 8-byte message
//! header shared with secure conversation, Hello, Acknowledge, Error and
//! ReverseHello, and buffer/limit negotiation.

use uascale_types::encoding::Limit;
use uascale_types::{
    BinaryDecode, BinaryEncode, DecodeError, DecodeLimits, Reader, StatusCode, UaString,
};

use crate::error::ChannelError;

/// Size of every UACP / secure conversation message header.
pub const HEADER_LEN: usize = 8;
/// The UACP protocol version of this specification.
pub const PROTOCOL_VERSION: u32 = 0;
/// Smallest chunk buffer a peer may offer (Part 6 §7.1.2.3; 1024 is allowed
/// for ECC policies only, 8192 otherwise - we accept the ECC floor).
pub const MIN_BUFFER_SIZE: u32 = 1024;
/// Largest EndpointUrl / reason string in HEL, RHE and ERR, in bytes.
pub const MAX_URL_LENGTH: usize = 4096;

/// The three-byte message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// `HEL`
    Hello,
    /// `ACK`
    Acknowledge,
    /// `ERR`
    Error,
    /// `RHE`
    ReverseHello,
    /// `MSG` (secure conversation)
    Message,
    /// `OPN` (secure conversation)
    OpenSecureChannel,
    /// `CLO` (secure conversation)
    CloseSecureChannel,
}

impl MessageType {
    /// The wire bytes.
    pub const fn code(self) -> [u8; 3] {
        match self {
            MessageType::Hello => *b"HEL",
            MessageType::Acknowledge => *b"ACK",
            MessageType::Error => *b"ERR",
            MessageType::ReverseHello => *b"RHE",
            MessageType::Message => *b"MSG",
            MessageType::OpenSecureChannel => *b"OPN",
            MessageType::CloseSecureChannel => *b"CLO",
        }
    }

    fn from_code(c: [u8; 3]) -> Option<Self> {
        Some(match &c {
            b"HEL" => MessageType::Hello,
            b"ACK" => MessageType::Acknowledge,
            b"ERR" => MessageType::Error,
            b"RHE" => MessageType::ReverseHello,
            b"MSG" => MessageType::Message,
            b"OPN" => MessageType::OpenSecureChannel,
            b"CLO" => MessageType::CloseSecureChannel,
            _ => return None,
        })
    }

    /// True for the secure conversation types (MSG, OPN, CLO).
    pub const fn is_secure(self) -> bool {
        matches!(
            self,
            MessageType::Message | MessageType::OpenSecureChannel | MessageType::CloseSecureChannel
        )
    }
}

/// The chunk type byte of a secure conversation header (Part 6 §6.7.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkType {
    /// `F`: the final chunk (and the only one of a UACP message).
    Final,
    /// `C`: an intermediate chunk.
    Intermediate,
    /// `A`: the sender aborts the message.
    Abort,
}

impl ChunkType {
    /// The wire byte.
    pub const fn code(self) -> u8 {
        match self {
            ChunkType::Final => b'F',
            ChunkType::Intermediate => b'C',
            ChunkType::Abort => b'A',
        }
    }
}

/// A parsed message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader {
    /// The message type.
    pub message_type: MessageType,
    /// The chunk type.
    pub chunk_type: ChunkType,
    /// Total length including this header.
    pub message_size: u32,
}

impl MessageHeader {
    /// Parses the first 8 bytes; `Ok(None)` when fewer are buffered.
    ///
    /// Fails with `BadTcpMessageTypeInvalid` for an unknown type or a chunk
    /// byte the type does not allow, and `BadTcpMessageTooLarge` when the size
    /// is smaller than a header or larger than `max_size` (the negotiated
    /// receive buffer).
    pub fn parse(buf: &[u8], max_size: u32) -> Result<Option<Self>, ChannelError> {
        let Some(h) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let code = [h[0], h[1], h[2]];
        let message_type = MessageType::from_code(code).ok_or(ChannelError::Peer {
            status: StatusCode::BadTcpMessageTypeInvalid,
            what: "unknown message type",
        })?;
        let chunk_type = match (h[3], message_type) {
            (b'F', _) => ChunkType::Final,
            (b'C', MessageType::Message) => ChunkType::Intermediate,
            (b'A', MessageType::Message) => ChunkType::Abort,
            _ => {
                return Err(ChannelError::Peer {
                    status: StatusCode::BadTcpMessageTypeInvalid,
                    what: "chunk type not allowed for this message type",
                })
            }
        };
        let message_size = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if (message_size as usize) < HEADER_LEN {
            // Not a message at all: too short to hold its own header.
            return Err(ChannelError::Peer {
                status: StatusCode::BadTcpMessageTypeInvalid,
                what: "message size smaller than its header",
            });
        }
        if message_size > max_size {
            return Err(ChannelError::Peer {
                status: StatusCode::BadTcpMessageTooLarge,
                what: "message larger than the receive buffer",
            });
        }
        Ok(Some(MessageHeader {
            message_type,
            chunk_type,
            message_size,
        }))
    }

    /// Writes a header with a size placeholder; [`finish_message`] fills it in.
    pub fn write_start(w: &mut Vec<u8>, message_type: MessageType, chunk_type: ChunkType) {
        w.extend_from_slice(&message_type.code());
        w.push(chunk_type.code());
        w.extend_from_slice(&[0; 4]);
    }
}

/// The whole message at the front of `buf` (header checked against
/// `max_size`) and its bytes, which the caller may open in place; `Ok(None)`
/// until all of it is buffered. Both sides of a connection frame their input
/// with it.
pub fn next_message(
    buf: &mut [u8],
    max_size: u32,
) -> Result<Option<(MessageHeader, &mut [u8])>, ChannelError> {
    let Some(header) = MessageHeader::parse(buf, max_size)? else {
        return Ok(None);
    };
    let size = header.message_size as usize;
    Ok(buf.get_mut(..size).map(|msg| (header, msg)))
}

/// Fills in the size of the message that starts at `start` in `w`.
pub fn finish_message(w: &mut [u8], start: usize) {
    let len = u32::try_from(w.len() - start).unwrap_or(u32::MAX);
    if let Some(size) = w.get_mut(start + 4..start + 8) {
        size.copy_from_slice(&len.to_le_bytes());
    }
}

/// Limits for the UACP strings, whatever the channel's own limits are.
fn uacp_limits() -> DecodeLimits {
    DecodeLimits {
        max_string_length: MAX_URL_LENGTH,
        ..DecodeLimits::default()
    }
}

fn decode_body<T>(
    body: &[u8],
    f: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<T, ChannelError> {
    let limits = uacp_limits();
    let mut r = Reader::new(body, &limits).map_err(ChannelError::decode)?;
    let v = f(&mut r).map_err(|e| match e.kind() {
        uascale_types::DecodeErrorKind::LimitExceeded {
            limit: Limit::StringLength,
            ..
        } => ChannelError::Peer {
            status: StatusCode::BadTcpEndpointUrlInvalid,
            what: "URL or reason longer than 4096 bytes",
        },
        _ => ChannelError::decode(e),
    })?;
    r.finish().map_err(ChannelError::decode)?;
    Ok(v)
}

/// The client's Hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Requested protocol version.
    pub protocol_version: u32,
    /// Largest chunk the client can receive.
    pub receive_buffer_size: u32,
    /// Largest chunk the client will send.
    pub send_buffer_size: u32,
    /// Largest response message the client accepts; 0 = no limit.
    pub max_message_size: u32,
    /// Most chunks per response; 0 = no limit.
    pub max_chunk_count: u32,
    /// The endpoint the client wants.
    pub endpoint_url: UaString,
}

impl Hello {
    /// Encodes the whole message, header included.
    pub fn encode_message(&self, w: &mut Vec<u8>) {
        let start = w.len();
        MessageHeader::write_start(w, MessageType::Hello, ChunkType::Final);
        self.protocol_version.encode(w);
        self.receive_buffer_size.encode(w);
        self.send_buffer_size.encode(w);
        self.max_message_size.encode(w);
        self.max_chunk_count.encode(w);
        self.endpoint_url.encode(w);
        finish_message(w, start);
    }

    /// Decodes the body (after the header).
    pub fn decode_body(body: &[u8]) -> Result<Self, ChannelError> {
        decode_body(body, |r| {
            Ok(Hello {
                protocol_version: u32::decode(r)?,
                receive_buffer_size: u32::decode(r)?,
                send_buffer_size: u32::decode(r)?,
                max_message_size: u32::decode(r)?,
                max_chunk_count: u32::decode(r)?,
                endpoint_url: UaString::decode(r)?,
            })
        })
    }
}

/// The server's Acknowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledge {
    /// The protocol version the server will use.
    pub protocol_version: u32,
    /// Largest chunk the server can receive.
    pub receive_buffer_size: u32,
    /// Largest chunk the server will send.
    pub send_buffer_size: u32,
    /// Largest request message the server accepts; 0 = no limit.
    pub max_message_size: u32,
    /// Most chunks per request; 0 = no limit.
    pub max_chunk_count: u32,
}

impl Acknowledge {
    /// Encodes the whole message, header included.
    pub fn encode_message(&self, w: &mut Vec<u8>) {
        let start = w.len();
        MessageHeader::write_start(w, MessageType::Acknowledge, ChunkType::Final);
        self.protocol_version.encode(w);
        self.receive_buffer_size.encode(w);
        self.send_buffer_size.encode(w);
        self.max_message_size.encode(w);
        self.max_chunk_count.encode(w);
        finish_message(w, start);
    }

    /// Decodes the body (after the header).
    pub fn decode_body(body: &[u8]) -> Result<Self, ChannelError> {
        decode_body(body, |r| {
            Ok(Acknowledge {
                protocol_version: u32::decode(r)?,
                receive_buffer_size: u32::decode(r)?,
                send_buffer_size: u32::decode(r)?,
                max_message_size: u32::decode(r)?,
                max_chunk_count: u32::decode(r)?,
            })
        })
    }
}

/// An Error message: the status and a reason, then the sender closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorMessage {
    /// Why.
    pub error: StatusCode,
    /// Human-readable detail; busy answers carry `RetryAfterMs=N` here.
    pub reason: UaString,
}

impl ErrorMessage {
    /// Encodes the whole message, header included. A reason over 4096
    /// bytes is cut at a character boundary.
    pub fn encode_message(&self, w: &mut Vec<u8>) {
        let start = w.len();
        MessageHeader::write_start(w, MessageType::Error, ChunkType::Final);
        self.error.encode(w);
        match self.reason.as_str() {
            Some(s) if s.len() > MAX_URL_LENGTH => {
                let mut end = MAX_URL_LENGTH;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                UaString::from(&s[..end]).encode(w);
            }
            _ => self.reason.encode(w),
        }
        finish_message(w, start);
    }

    /// Decodes the body (after the header).
    pub fn decode_body(body: &[u8]) -> Result<Self, ChannelError> {
        decode_body(body, |r| {
            Ok(ErrorMessage {
                error: StatusCode::decode(r)?,
                reason: UaString::decode(r)?,
            })
        })
    }

    /// The `RetryAfterMs=N` hint of a busy answer, if the reason has one.
    pub fn retry_after_ms(&self) -> Option<u64> {
        let reason = self.reason.as_str()?;
        let at = reason.find("RetryAfterMs=")? + "RetryAfterMs=".len();
        let digits: String = reason[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    }
}

/// A server's ReverseHello (Part 6 §7.1.2.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseHello {
    /// The server's ApplicationUri.
    pub server_uri: UaString,
    /// The endpoint the client is to connect back to.
    pub endpoint_url: UaString,
}

impl ReverseHello {
    /// Encodes the whole message, header included.
    pub fn encode_message(&self, w: &mut Vec<u8>) {
        let start = w.len();
        MessageHeader::write_start(w, MessageType::ReverseHello, ChunkType::Final);
        self.server_uri.encode(w);
        self.endpoint_url.encode(w);
        finish_message(w, start);
    }

    /// Decodes the body (after the header).
    pub fn decode_body(body: &[u8]) -> Result<Self, ChannelError> {
        decode_body(body, |r| {
            Ok(ReverseHello {
                server_uri: UaString::decode(r)?,
                endpoint_url: UaString::decode(r)?,
            })
        })
    }
}

/// What the server offers before it sees a Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportLimits {
    /// Largest chunk we receive. Default 65,535 (the common choice of the
    /// .NET and open62541 stacks; one read syscall holds a chunk).
    pub receive_buffer_size: u32,
    /// Largest chunk we send. Default 65,535.
    pub send_buffer_size: u32,
    /// Largest message we accept; 0 = no limit. Default 16 MiB.
    pub max_message_size: u32,
    /// Most chunks per message we accept; 0 = no limit. Default 4096.
    pub max_chunk_count: u32,
}

impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits {
            receive_buffer_size: 65_535,
            send_buffer_size: 65_535,
            max_message_size: 16 << 20,
            max_chunk_count: 4096,
        }
    }
}

/// The limits both sides use after HEL/ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Largest chunk we accept (and the peer sends).
    pub receive_buffer_size: u32,
    /// Largest chunk we send.
    pub send_buffer_size: u32,
    /// Largest message we accept; 0 = no limit.
    pub recv_max_message_size: u32,
    /// Most chunks per message we accept; 0 = no limit.
    pub recv_max_chunk_count: u32,
    /// Largest message the peer accepts; 0 = no limit.
    pub send_max_message_size: u32,
    /// Most chunks per message the peer accepts; 0 = no limit.
    pub send_max_chunk_count: u32,
}

impl TransportLimits {
    /// The server side of negotiation: validates the Hello and answers with
    /// the Acknowledge to send.
    ///
    /// Errors: `BadProtocolVersionUnsupported` is never returned because
    /// version 0 is the lowest; a buffer below 1024 bytes gives
    /// `BadConnectionRejected`.
    pub fn negotiate(&self, hello: &Hello) -> Result<(Acknowledge, Negotiated), ChannelError> {
        if hello.receive_buffer_size < MIN_BUFFER_SIZE || hello.send_buffer_size < MIN_BUFFER_SIZE {
            return Err(ChannelError::Peer {
                status: StatusCode::BadConnectionRejected,
                what: "Hello buffer size below 1024 bytes",
            });
        }
        // We receive what the client sends: no more than it will send.
        let receive = self.receive_buffer_size.min(hello.send_buffer_size);
        let send = self.send_buffer_size.min(hello.receive_buffer_size);
        let ack = Acknowledge {
            protocol_version: PROTOCOL_VERSION,
            receive_buffer_size: receive,
            send_buffer_size: send,
            max_message_size: self.max_message_size,
            max_chunk_count: self.max_chunk_count,
        };
        Ok((
            ack,
            Negotiated {
                receive_buffer_size: receive,
                send_buffer_size: send,
                recv_max_message_size: self.max_message_size,
                recv_max_chunk_count: self.max_chunk_count,
                send_max_message_size: hello.max_message_size,
                send_max_chunk_count: hello.max_chunk_count,
            },
        ))
    }
}

/// Splits well-formed output into its messages (for tests of this crate).
#[cfg(test)]
pub(crate) fn split_messages(bytes: &[u8]) -> Vec<(MessageHeader, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let h = MessageHeader::parse(&bytes[at..], u32::MAX)
            .unwrap()
            .unwrap();
        let end = at + h.message_size as usize;
        out.push((h, &bytes[at..end]));
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            protocol_version: 0,
            receive_buffer_size: 65_536,
            send_buffer_size: 8192,
            max_message_size: 0,
            max_chunk_count: 0,
            endpoint_url: UaString::from("opc.tcp://localhost:4840"),
        }
    }

    #[test]
    fn hello_round_trip_and_header() {
        let mut w = Vec::new();
        hello().encode_message(&mut w);
        assert_eq!(&w[..4], b"HELF");
        let h = MessageHeader::parse(&w, 8192).unwrap().unwrap();
        assert_eq!(h.message_type, MessageType::Hello);
        assert_eq!(h.message_size as usize, w.len());
        assert_eq!(Hello::decode_body(&w[HEADER_LEN..]).unwrap(), hello());
        assert_eq!(MessageHeader::parse(&w[..7], 8192).unwrap(), None);
    }

    #[test]
    fn bad_headers() {
        let cases: [(&[u8], StatusCode); 5] = [
            (b"XYZF\x08\0\0\0", StatusCode::BadTcpMessageTypeInvalid),
            (b"HELC\x08\0\0\0", StatusCode::BadTcpMessageTypeInvalid),
            // A hostile-input finding: a size too small to hold the header is
            // not a message (it was answered "too large").
            (b"MSGF\x04\0\0\0", StatusCode::BadTcpMessageTypeInvalid),
            (b"HELF\x07\0\0\0", StatusCode::BadTcpMessageTypeInvalid),
            (b"MSGC\x00\x00\x01\x00", StatusCode::BadTcpMessageTooLarge),
        ];
        for (bytes, status) in cases {
            let e = MessageHeader::parse(bytes, 8192).unwrap_err();
            assert_eq!(e.status_code(), status, "{bytes:?}");
        }
        assert!(MessageHeader::parse(b"MSGA\x10\0\0\0", 8192).is_ok());
    }

    #[test]
    fn long_endpoint_url_is_rejected_with_its_code() {
        let mut h = hello();
        h.endpoint_url = UaString::new("x".repeat(5000));
        let mut w = Vec::new();
        h.encode_message(&mut w);
        let e = Hello::decode_body(&w[HEADER_LEN..]).unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadTcpEndpointUrlInvalid);
    }

    #[test]
    fn negotiation_takes_the_smaller_buffers() {
        let (ack, n) = TransportLimits::default().negotiate(&hello()).unwrap();
        assert_eq!(
            ack.receive_buffer_size, 8192,
            "limited by the client's send buffer"
        );
        assert_eq!(
            ack.send_buffer_size, 65_535,
            "limited by our own send buffer"
        );
        assert_eq!(n.send_max_message_size, 0);
        let mut small = hello();
        small.receive_buffer_size = 512;
        assert_eq!(
            TransportLimits::default()
                .negotiate(&small)
                .unwrap_err()
                .status_code(),
            StatusCode::BadConnectionRejected
        );
        let mut w = Vec::new();
        ack.encode_message(&mut w);
        assert_eq!(Acknowledge::decode_body(&w[HEADER_LEN..]).unwrap(), ack);
    }

    #[test]
    fn error_message_and_retry_hint() {
        let e = ErrorMessage {
            error: StatusCode::BadTcpServerTooBusy,
            reason: UaString::from("connection rate limit; RetryAfterMs=250"),
        };
        let mut w = Vec::new();
        e.encode_message(&mut w);
        let back = ErrorMessage::decode_body(&w[HEADER_LEN..]).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.retry_after_ms(), Some(250));
        let long = ErrorMessage {
            error: StatusCode::BadTcpInternalError,
            reason: UaString::new("é".repeat(3000)),
        };
        let mut w = Vec::new();
        long.encode_message(&mut w);
        let back = ErrorMessage::decode_body(&w[HEADER_LEN..]).unwrap();
        assert!(back.reason.as_str().unwrap().len() <= MAX_URL_LENGTH);
    }

    #[test]
    fn reverse_hello_round_trip() {
        let r = ReverseHello {
            server_uri: UaString::from("urn:uascale:server"),
            endpoint_url: UaString::from("opc.tcp://host:4840"),
        };
        let mut w = Vec::new();
        r.encode_message(&mut w);
        assert_eq!(&w[..4], b"RHEF");
        assert_eq!(ReverseHello::decode_body(&w[HEADER_LEN..]).unwrap(), r);
    }
}
