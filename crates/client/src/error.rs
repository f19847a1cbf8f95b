//! The client's error type.

use std::fmt;

use uascale_types::{DecodeError, StatusCode};

/// Why a client operation failed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientError {
    /// The endpoint URL is not `opc.tcp://host:port[/path]`.
    BadUrl(String),
    /// The TCP connection failed or broke (the OS error, as text).
    Io(String),
    /// The server closed the connection or channel (its ERR, or a protocol
    /// violation we detected).
    Channel {
        /// The status (from the ERR message or our own check).
        status: StatusCode,
        /// The server's reason text.
        reason: String,
        /// The server's `RetryAfterMs` hint.
        retry_after_ms: Option<u64>,
    },
    /// The server answered with a ServiceFault (or a Bad serviceResult).
    Service {
        /// The serviceResult.
        status: StatusCode,
        /// The `RetryAfterMs` hint of the response header, if any.
        retry_after_ms: Option<u64>,
        /// The `RetryTicket` of the response header, if any (what the next
        /// CreateSession echoes).
        retry_ticket: Option<String>,
    },
    /// No answer within the request timeout.
    Timeout,
    /// The response did not decode or was of the wrong type.
    Decode(String),
    /// The client was closed.
    Closed,
    /// A security check failed on our side (the server's certificate or
    /// signature), or our security settings are unusable.
    Security {
        /// The status it stands for.
        status: StatusCode,
        /// What failed.
        reason: String,
    },
    /// The server offers no endpoint with the requested policy and mode.
    EndpointNotFound {
        /// The policy and mode asked for.
        wanted: String,
        /// What the server offers (`policy:mode` each).
        offered: Vec<String>,
    },
}

impl ClientError {
    /// The StatusCode this error stands for.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ClientError::BadUrl(_) => StatusCode::BadTcpEndpointUrlInvalid,
            ClientError::Io(_) => StatusCode::BadCommunicationError,
            ClientError::Channel { status, .. } | ClientError::Service { status, .. } => *status,
            ClientError::Timeout => StatusCode::BadTimeout,
            ClientError::Decode(_) => StatusCode::BadDecodingError,
            ClientError::Closed => StatusCode::BadSecureChannelClosed,
            ClientError::Security { status, .. } => *status,
            ClientError::EndpointNotFound { .. } => StatusCode::BadSecurityPolicyRejected,
        }
    }

    /// The server's retry-after hint, when it sent one.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ClientError::Channel { retry_after_ms, .. }
            | ClientError::Service { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// The server's `RetryTicket`, if any: in a busy ERR's reason (what
    /// the next Hello echoes) or a ServiceFault's header (what the next
    /// CreateSession echoes).
    pub fn retry_ticket(&self) -> Option<&str> {
        match self {
            ClientError::Service { retry_ticket, .. } => retry_ticket.as_deref(),
            ClientError::Channel { reason, .. } => reason
                .split_whitespace()
                .find_map(|w| w.strip_prefix("RetryTicket="))
                .filter(|t| {
                    !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_hexdigit())
                }),
            _ => None,
        }
    }

    pub(crate) fn decode(e: DecodeError) -> Self {
        ClientError::Decode(e.to_string())
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::BadUrl(u) => write!(
                f,
                "invalid endpoint URL {u:?}: expected opc.tcp://host:port[/path]"
            ),
            ClientError::Io(e) => write!(f, "connection failed: {e}"),
            ClientError::Channel { status, reason, .. } => {
                if reason.is_empty() {
                    write!(f, "channel closed: {status}")
                } else {
                    write!(f, "channel closed: {status}: {reason}")
                }
            }
            ClientError::Service { status, .. } => write!(f, "service failed: {status}"),
            ClientError::Timeout => f.write_str("no response in time"),
            ClientError::Decode(e) => write!(f, "undecodable response: {e}"),
            ClientError::Closed => f.write_str("client closed"),
            ClientError::Security { status, reason } => {
                write!(f, "security check failed: {status}: {reason}")
            }
            ClientError::EndpointNotFound { wanted, offered } => write!(
                f,
                "the server offers no endpoint {wanted}; it offers: {}",
                offered.join(", ")
            ),
        }
    }
}

impl std::error::Error for ClientError {}
