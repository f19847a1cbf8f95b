//! One name for one idea: a refusal. Every stage that turns work away -
//! admission at accept, the channel count, the handshakes in flight,
//! session establishment, the request queue and its protected and parked
//! stages - answers with a [`Shed`]: the stage that refused, why, and when
//! the client may come back. The metrics' `stage` and `reason` labels are
//! the names of [`Stage`] and [`Reason`], so a label that is documented is
//! one a refusal can carry, and every refusal is counted the same way
//! ([`crate::metrics::ServerMetrics::shed`]).

use std::time::Duration;

use uascale_types::StatusCode;

/// The stage that refused: the `stage` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// At accept, before any byte is read (rate buckets, open files).
    Accept,
    /// The secure channel count (`max_channel_count`).
    Channel,
    /// OpenSecureChannel handshakes (asymmetric work) in flight, and the
    /// unfinished handshakes of one source address.
    Handshake,
    /// Session establishment (CreateSession, ActivateSession) and the
    /// session count.
    Establishment,
    /// The request queue's shared places (`max_queued_request_count`).
    Queue,
    /// The protected places of bootstrap requests.
    Bootstrap,
    /// The protected places of reconnect requests.
    Reconnect,
    /// The protected places of control requests.
    Control,
    /// Held Publishes (`max_parked_request_count`).
    Parked,
    /// The opc.https listener's own limits: its connection count and the
    /// per-session and per-address request buckets (answered HTTP 429),
    /// and the requests it refuses while the server shuts down (503).
    Https,
}

impl Stage {
    /// Every stage, in index order.
    pub const ALL: [Stage; 10] = [
        Stage::Accept,
        Stage::Channel,
        Stage::Handshake,
        Stage::Establishment,
        Stage::Queue,
        Stage::Bootstrap,
        Stage::Reconnect,
        Stage::Control,
        Stage::Parked,
        Stage::Https,
    ];

    /// The stages of the request queue (the `opcua_server_isolation_*`
    /// families).
    pub const QUEUE: [Stage; 5] = [
        Stage::Queue,
        Stage::Bootstrap,
        Stage::Reconnect,
        Stage::Control,
        Stage::Parked,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Accept => "accept",
            Stage::Channel => "channel",
            Stage::Handshake => "handshake",
            Stage::Establishment => "establishment",
            Stage::Queue => "queue",
            Stage::Bootstrap => "bootstrap",
            Stage::Reconnect => "reconnect",
            Stage::Control => "control",
            Stage::Parked => "parked",
            Stage::Https => "https",
        }
    }

    /// True for the stages that refuse a connection with an ERR at the
    /// transport (counted as shed connections too).
    pub const fn is_transport(self) -> bool {
        matches!(self, Stage::Accept | Stage::Channel | Stage::Handshake)
    }
}

/// Why a stage refused: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The listener's overall connection-rate bucket was empty.
    Rate,
    /// The connecting address's own rate bucket was empty.
    AddressRate,
    /// Too few file descriptors left.
    OpenFiles,
    /// The secure channel limit, with nothing to evict.
    ChannelLimit,
    /// An idle channel without a session was closed to make room for a
    /// newer one (the evicted channel gets the busy ERR).
    Evicted,
    /// Too many OpenSecureChannel handshakes in flight (refused at the
    /// OpenSecureChannel, or at the Hello that would bring one).
    HandshakeLimit,
    /// Too many unfinished handshakes from one source address
    /// (`max_unfinished_handshakes_per_address`).
    AddressHandshakes,
    /// Too many sessions being established at once.
    EstablishmentLimit,
    /// `max_session_count` sessions open.
    SessionLimit,
    /// Every place of a request-queue stage is taken.
    Full,
    /// The owner has `max_queued_requests_per_owner` requests waiting.
    OwnerLimit,
    /// The requests waiting hold `max_retained_request_bytes`.
    RetainedBytes,
    /// The places left are reserved for trusted owners.
    Reserved,
    /// The cluster's store did not answer (a session takeover).
    StoreUnavailable,
    /// A cluster node shutting down takes no new session (its clients go
    /// to a node that serves on).
    ShuttingDown,
    /// A session's own HTTPS request bucket was empty
    /// (`[https] session_rate`).
    SessionRate,
    /// `[https] max_connections` connections open.
    ConnectionLimit,
}

impl Reason {
    /// Every reason, in index order.
    pub const ALL: [Reason; 17] = [
        Reason::Rate,
        Reason::AddressRate,
        Reason::OpenFiles,
        Reason::ChannelLimit,
        Reason::Evicted,
        Reason::HandshakeLimit,
        Reason::AddressHandshakes,
        Reason::EstablishmentLimit,
        Reason::SessionLimit,
        Reason::Full,
        Reason::OwnerLimit,
        Reason::RetainedBytes,
        Reason::Reserved,
        Reason::StoreUnavailable,
        Reason::ShuttingDown,
        Reason::SessionRate,
        Reason::ConnectionLimit,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Rate => "rate",
            Reason::AddressRate => "address_rate",
            Reason::OpenFiles => "open_files",
            Reason::ChannelLimit => "channel_limit",
            Reason::Evicted => "evicted",
            Reason::HandshakeLimit => "handshake_limit",
            Reason::AddressHandshakes => "address_handshakes",
            Reason::EstablishmentLimit => "establishment_limit",
            Reason::SessionLimit => "session_limit",
            Reason::Full => "full",
            Reason::OwnerLimit => "owner_limit",
            Reason::RetainedBytes => "retained_bytes",
            Reason::Reserved => "reserved",
            Reason::StoreUnavailable => "store_unavailable",
            Reason::ShuttingDown => "shutting_down",
            Reason::SessionRate => "session_rate",
            Reason::ConnectionLimit => "connection_limit",
        }
    }
}

/// A refusal: the stage, the reason and the retry-after hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    /// The stage that refused.
    pub stage: Stage,
    /// Why.
    pub reason: Reason,
    /// When the client may try again.
    pub retry_after: Duration,
    /// The retry ticket of the slot promised at `retry_after`, when the
    /// stage issues them (docs/scalability.md, "Retry tickets").
    pub ticket: Option<crate::admission::ticket::Ticket>,
}

impl Shed {
    /// A refusal at `stage` for `reason` with the hint `retry_after`.
    pub const fn new(stage: Stage, reason: Reason, retry_after: Duration) -> Self {
        Shed {
            stage,
            reason,
            retry_after,
            ticket: None,
        }
    }

    /// Admission's `refusal` at `stage` for `reason`: its hint and ticket.
    pub const fn refused(
        stage: Stage,
        reason: Reason,
        refusal: &crate::admission::Refusal,
    ) -> Self {
        Shed {
            stage,
            reason,
            retry_after: refusal.retry_after,
            ticket: refusal.ticket,
        }
    }

    /// The StatusCode the refusal is answered with: `BadTcpServerTooBusy`
    /// in the ERR of a transport stage, `BadTooManySessions` at the
    /// session count, `BadServerTooBusy` in the ServiceFault of the rest.
    pub const fn status(&self) -> StatusCode {
        match (self.stage, self.reason) {
            (_, Reason::SessionLimit) => StatusCode::BadTooManySessions,
            (s, _) if s.is_transport() => StatusCode::BadTcpServerTooBusy,
            _ => StatusCode::BadServerTooBusy,
        }
    }

    /// The reason text of the ERR a transport stage sends: the hint as the
    /// token `RetryAfterMs=N` (milliseconds, rounded up) that clients parse.
    pub fn err_reason(&self) -> String {
        let mut r = busy_reason(self.retry_after);
        if let Some(t) = &self.ticket {
            r.push_str(&format!(" RetryTicket={t}"));
        }
        r
    }
}

/// The reason text of a busy ERR with the hint `retry_after`.
pub fn busy_reason(retry_after: Duration) -> String {
    let ms = retry_after.as_nanos().div_ceil(1_000_000);
    format!("server too busy; RetryAfterMs={ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_statuses_follow_the_stage() {
        let mut names: Vec<_> = Stage::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Stage::ALL.len());
        let mut names: Vec<_> = Reason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?} out of index order");
        }
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of index order");
        }
        let ms = Duration::from_millis(1);
        assert_eq!(
            Shed::new(Stage::Handshake, Reason::HandshakeLimit, ms).status(),
            StatusCode::BadTcpServerTooBusy
        );
        assert_eq!(
            Shed::new(Stage::Establishment, Reason::SessionLimit, ms).status(),
            StatusCode::BadTooManySessions
        );
        assert_eq!(
            Shed::new(Stage::Queue, Reason::OwnerLimit, ms).status(),
            StatusCode::BadServerTooBusy
        );
        assert_eq!(
            Shed::new(Stage::Accept, Reason::Rate, Duration::from_micros(1_200)).err_reason(),
            "server too busy; RetryAfterMs=2"
        );
    }
}
