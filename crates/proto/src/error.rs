//! The protocol layer's error: what ends a connection, and the code the ERR
//! message carries.

use std::fmt;

use uascale_types::{DecodeError, StatusCode};

/// Why a connection or secure channel must close.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelError {
    /// The peer broke the protocol; the status goes into the ERR message.
    Peer {
        /// The code for the ERR message.
        status: StatusCode,
        /// What was wrong, for logs.
        what: &'static str,
    },
    /// A message body that did not decode.
    Decode(DecodeError),
    /// A local limit or budget refused the work (not the peer's fault alone).
    Resource {
        /// The code for the ERR message.
        status: StatusCode,
        /// Which limit.
        what: &'static str,
    },
}

impl ChannelError {
    /// Wraps a decoding failure.
    pub fn decode(e: DecodeError) -> Self {
        ChannelError::Decode(e)
    }

    /// The StatusCode for the ERR message.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ChannelError::Peer { status, .. } | ChannelError::Resource { status, .. } => *status,
            ChannelError::Decode(e) => e.status_code(),
        }
    }
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Peer { status, what } => write!(f, "{what} ({status})"),
            ChannelError::Decode(e) => write!(f, "{e} ({})", e.status_code()),
            ChannelError::Resource { status, what } => write!(f, "{what} ({status})"),
        }
    }
}

impl std::error::Error for ChannelError {}
