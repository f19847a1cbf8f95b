//! What the server counts about itself, for its diagnostics and - with the
//! admission issue - a Prometheus endpoint (`opcua_server_..._total`).
//!
//! Counters are plain relaxed atomics fed by the events of the layers
//! that own the facts (today: the session transitions of
//! [`crate::session`]); reading them never takes a lock, and the read path
//! of a request adds nothing to them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::session::SessionEvent;

/// Every counter of the server.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Session transitions.
    pub sessions: SessionCounters,
}

/// Session transitions counted since start.
#[derive(Debug, Default)]
pub struct SessionCounters {
    created: AtomicU64,
    activated: AtomicU64,
    moved: AtomicU64,
    closed: AtomicU64,
    timed_out: AtomicU64,
    orphaned: AtomicU64,
}

/// A copy of [`SessionCounters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounts {
    /// Sessions created (CreateSession succeeded).
    pub created: u64,
    /// First activations.
    pub activated: u64,
    /// Activations on another channel (reconnects, takeovers).
    pub moved: u64,
    /// Sessions closed by CloseSession.
    pub closed: u64,
    /// Activated sessions closed after their timeout passed without a request.
    pub timed_out: u64,
    /// Sessions closed at the activation deadline without ever being
    /// activated (orphans of a client that gave up or retried).
    pub orphaned: u64,
}

impl SessionCounters {
    /// Counts `event`.
    pub fn record(&self, event: &SessionEvent) {
        let counter = match event {
            SessionEvent::Created { .. } => &self.created,
            SessionEvent::Activated { .. } => &self.activated,
            SessionEvent::Moved { .. } => &self.moved,
            SessionEvent::Closed { .. } => &self.closed,
            SessionEvent::TimedOut {
                activated: true, ..
            } => &self.timed_out,
            SessionEvent::TimedOut {
                activated: false, ..
            } => &self.orphaned,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> SessionCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SessionCounts {
            created: get(&self.created),
            activated: get(&self.activated),
            moved: get(&self.moved),
            closed: get(&self.closed),
            timed_out: get(&self.timed_out),
            orphaned: get(&self.orphaned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::NodeId;

    #[test]
    fn each_transition_has_its_counter_and_orphans_are_apart() {
        let c = SessionCounters::default();
        let id = NodeId::ns0(1);
        for e in [
            SessionEvent::Created {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Activated {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Reactivated {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Moved {
                session_id: id.clone(),
                from: 1,
                to: 2,
            },
            SessionEvent::TimedOut {
                session_id: id.clone(),
                channel_id: 2,
                activated: false,
            },
            SessionEvent::TimedOut {
                session_id: id.clone(),
                channel_id: 2,
                activated: true,
            },
            SessionEvent::Closed {
                session_id: id.clone(),
                channel_id: 2,
                activated: true,
                delete_subscriptions: true,
            },
        ] {
            c.record(&e);
        }
        assert_eq!(
            c.snapshot(),
            SessionCounts {
                created: 1,
                activated: 1,
                moved: 1,
                closed: 1,
                timed_out: 1,
                orphaned: 1,
            }
        );
    }
}
