//! Admission control (SCALABILITY.md §2): decisions taken **before** the
//! work they protect, each refusal a fast busy answer with a retry-after
//! hint.
//!
//! What is here now: the [`Decision`] the network layer asks for when a
//! TCP connection arrives, before the sans-IO connection is created
//! ([`uascale_proto::PendingConnection::accept`] or `refuse`), and the
//! session-count check that CreateSession makes before any certificate or
//! signature work ([`crate::session::SessionTable::reserve`]).
//!
//! What lands here with the admission issue: the global and per-address
//! token buckets at accept, the handshake and session-establishment
//! permits, `max_channel_count` with eviction, the open-files headroom,
//! and the hint formula - all plain data on a passed-in clock, so each
//! stage is unit-tested without a runtime.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

/// The retry-after hint of `BadTooManySessions` (the server holds
/// `max_session_count` sessions). Fixed until the admission issue derives
/// hints from each stage's backlog and completion rate.
pub const SESSION_FULL_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take it into work.
    Admit,
    /// Answer ERR `status` with `RetryAfterMs=<retry_after>` in the reason
    /// and close, without parsing more than the Hello.
    Refuse {
        /// The ERR's status (`BadTcpServerTooBusy`).
        status: StatusCode,
        /// The hint.
        retry_after: Duration,
    },
}

/// The stages a connection passes at accept.
#[derive(Debug, Default)]
pub struct Admission {
    _private: (),
}

impl Admission {
    /// The connection stages for a server: none is configured yet, so
    /// every connection is admitted (the behaviour before the admission
    /// issue; the listen backlog and `max_session_count` still bound).
    pub fn new() -> Self {
        Admission { _private: () }
    }

    /// Decides on a connection from `peer` arriving at `now`.
    pub fn on_connection(&self, peer: SocketAddr, now: Instant) -> Decision {
        let _ = (peer, now);
        Decision::Admit
    }
}

/// The reason text of a busy ERR: the hint as the token `RetryAfterMs=N`
/// (milliseconds, rounded up) that clients parse.
pub fn busy_reason(retry_after: Duration) -> String {
    let ms = retry_after.as_nanos().div_ceil(1_000_000);
    format!("server too busy; RetryAfterMs={ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_reason_carries_the_hint_rounded_up() {
        assert_eq!(
            busy_reason(Duration::from_micros(2_001)),
            "server too busy; RetryAfterMs=3"
        );
    }
}
