//! The refusal a stage answers with: the status, the retry-after hint
//! ([`super::hint`]) and the retry ticket ([`super::ticket`]).

use std::time::Duration;

use uascale_types::StatusCode;

/// A busy refusal: the status to answer with and the retry-after hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// `BadTcpServerTooBusy` for an ERR at the transport (connections,
    /// channels, OpenSecureChannel), `BadServerTooBusy` for a ServiceFault
    /// (session establishment).
    pub status: StatusCode,
    /// When the client may try again.
    pub retry_after: Duration,
    /// The retry ticket of the slot promised at `retry_after`, when the
    /// stage issues them (docs/scalability.md, "Retry tickets").
    pub ticket: Option<super::ticket::Ticket>,
}

impl Refusal {
    /// This refusal answered with `status`.
    pub fn with_status(self, status: StatusCode) -> Self {
        Refusal { status, ..self }
    }

    /// A refusal with `status` and the hint `retry_after`, no ticket.
    pub fn new(status: StatusCode, retry_after: Duration) -> Self {
        Refusal {
            status,
            retry_after,
            ticket: None,
        }
    }
}
