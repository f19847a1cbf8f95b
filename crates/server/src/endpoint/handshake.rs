//! A secured OpenSecureChannel between admission and the answer: what
//! admission decided ([`HandshakeDecision`]), the place it gave
//! ([`HandshakePlace`]), and the asymmetric work itself in the steps the
//! shell runs where its crypto runs ([`HandshakeWork`]).

use std::sync::Arc;
use std::time::Instant;

use uascale_proto::{ChannelError, Now, ReceivedOpen, ServerConnection};

use crate::shed::Shed;
use crate::state::ServerState;

/// What [`Endpoint::handshake`] decided.
pub enum HandshakeDecision {
    /// The handshake's work may run now.
    Admit(HandshakePlace),
    /// A place is expected soon: await `waiting`
    /// ([`Endpoint::handshake_admitted`]) until `until`.
    Wait {
        /// Ready with the place.
        waiting: std::pin::Pin<Box<crate::admission::gate::HandshakeWait>>,
        /// When to give up ([`Endpoint::handshake_timed_out`]).
        until: Instant,
    },
    /// Refused: close the connection with the shed's ERR.
    Refuse(Shed),
}

impl std::fmt::Debug for HandshakeDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeDecision::Admit(p) => f.debug_tuple("Admit").field(p).finish(),
            HandshakeDecision::Wait { until, .. } => f
                .debug_struct("Wait")
                .field("until", until)
                .finish_non_exhaustive(),
            HandshakeDecision::Refuse(s) => f.debug_tuple("Refuse").field(s).finish(),
        }
    }
}

/// A place among the handshakes in flight, given back when dropped (or
/// [`finished`](HandshakePlace::finish), which feeds the completion rate
/// the hints divide by).
#[derive(Debug)]
pub struct HandshakePlace {
    pub(super) guard: Option<crate::admission::HandshakeGuard>,
    pub(super) state: Arc<ServerState>,
}

impl HandshakePlace {
    /// The handshake's work completed at `now`.
    pub fn finish(mut self, now: Instant) {
        if let Some(g) = self.guard.take() {
            g.finish(now);
        }
    }
}

impl Drop for HandshakePlace {
    fn drop(&mut self) {
        // Counted out however the work ended (it may have panicked).
        self.state.metrics.handshakes_in_flight(-1);
    }
}

/// The asymmetric work of a secured OpenSecureChannel (RSA: two
/// private-key operations to receive it, one to answer), then what
/// followed it in the same bytes. The shell runs [`HandshakeWork::step`]
/// where its handshake crypto runs until it is [`Step::Done`]; an error
/// closes the connection (and is logged).
pub struct HandshakeWork {
    conn: ServerConnection,
    bytes: Vec<u8>,
    /// Received, to be answered in the next step.
    received: Option<ReceivedOpen>,
    in_two_steps: bool,
}

/// What a [`HandshakeWork::step`] left.
pub enum Step {
    /// Received: the answer is the next step.
    More(HandshakeWork),
    /// Done: the connection, and what is left of the bytes.
    Done(ServerConnection, Vec<u8>),
}

impl HandshakeWork {
    /// The work of the OpenSecureChannel at the start of `bytes`. In two
    /// steps (receiving, then answering), what waits for the end of a step
    /// waits for less; in one, there is one handoff less.
    pub fn new(conn: ServerConnection, bytes: Vec<u8>, in_two_steps: bool) -> Self {
        HandshakeWork {
            conn,
            bytes,
            received: None,
            in_two_steps,
        }
    }

    /// The next step, each part stamped by `clock` as it runs.
    pub fn step(mut self, clock: fn() -> Now) -> Step {
        if let Some(received) = self.received.take() {
            return self.answer(Ok(Some(received)), clock);
        }
        match self.conn.receive_open(clock(), &mut self.bytes) {
            Ok(Some(received)) if self.in_two_steps => {
                self.received = Some(received);
                Step::More(self)
            }
            other => self.answer(other, clock),
        }
    }

    fn answer(
        mut self,
        received: Result<Option<ReceivedOpen>, ChannelError>,
        clock: fn() -> Now,
    ) -> Step {
        let done = match received {
            Ok(Some(received)) => self
                .conn
                .answer_open(clock(), received)
                .and_then(|()| self.conn.handle_input(clock(), &mut self.bytes)),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            tracing::debug!(channel = self.conn.channel_id(), error = %e, "closing connection");
        }
        Step::Done(self.conn, self.bytes)
    }
}
