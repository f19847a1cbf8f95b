//! The request lifecycle without sockets, clocks or tasks: between the
//! shell ([`crate::net`]: listener, connection tasks, runtime) and the
//! services. What quinn-proto's `Endpoint` is to quinn.
//!
//! It owns:
//! - the connection table ([`Endpoint::accept`] registers a [`Channel`]
//!   after admission's connection stages; [`Endpoint::teardown`] is the one
//!   way out, whether the connection closed or its task panicked);
//! - what a decoded request becomes ([`submit::submit`], reached through
//!   [`Endpoint::handle_events`], and [`submit::Job`] for the queue): run
//!   now, queue, park, hold a worker, answer later, or shed;
//! - the one table of each channel's outstanding requests (queued,
//!   running, held), where Cancel and teardown look;
//! - the admission checks of accept and OpenSecureChannel, each refusal a
//!   [`Shed`] counted once.
//!
//! It returns what to do - bytes to send (into the [`ServerConnection`]),
//! a task to spawn, an ERR to close with - and the shell does it. Every
//! method takes the time it runs at; nothing here reads a clock.

pub mod channel;
pub mod drain;
pub mod handshake;
pub mod https;
pub mod probes;
pub mod proxy;
pub mod submit;
#[cfg(test)]
mod tests;
pub mod timers;
#[cfg(feature = "https")]
pub mod tls;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use uascale_proto::{Event, Now, PendingConnection, ServerConnection};
use uascale_types::{DateTime, StatusCode};

pub use channel::Channel;
pub use handshake::{HandshakeDecision, HandshakePlace, HandshakeWork, Step};
pub use submit::{Job, Submit};
// The scheduler's side of the runtime, which the shell implements.
pub use crate::scheduler::{Scheduler, Spawn, Workers};

use crate::admission::address::{AddressKey, PerAddressCount};
use crate::admission::channels::ChannelDecision;
use crate::admission::{AcceptCheck, Decision};
use crate::context::ServiceContext;
use crate::reply::ResponseSink;
use crate::session::SessionEvent;
use crate::shed::{Reason, Shed, Stage};
use crate::state::ServerState;

/// The server's request lifecycle (see the module documentation).
#[derive(Debug)]
pub struct Endpoint {
    state: Arc<ServerState>,
    /// Every registered connection, by channel id.
    connections: Mutex<crate::fxhash::FxHashMap<u32, Weak<Channel>>>,
    next_channel_id: AtomicU32,
    /// Set once shutdown began: a connection registering later is told to
    /// close at once.
    stopping: AtomicBool,
    /// The soft open-files limit (admission keeps headroom below it).
    open_files_soft: Option<u64>,
    /// Connections without an activated session yet, per source address
    /// (`max_unfinished_handshakes_per_address`).
    unfinished: Mutex<PerAddressCount>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // One insert, removal or scan at a time: a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Endpoint {
    /// The endpoint of `state` on this host: under the process's soft
    /// open-files limit as it is now.
    pub fn for_host(state: Arc<ServerState>) -> Arc<Self> {
        Self::new(state, crate::admission::host::OpenFiles::current().soft)
    }

    /// The endpoint of `state`, under a soft open-files limit of
    /// `open_files_soft` (`None`: unknown, not checked). It listens to the
    /// session table's transitions (which channels carry activated
    /// sessions).
    pub fn new(state: Arc<ServerState>, open_files_soft: Option<u64>) -> Arc<Self> {
        let endpoint = Arc::new(Endpoint {
            state,
            connections: Mutex::default(),
            next_channel_id: AtomicU32::new(1),
            stopping: AtomicBool::new(false),
            open_files_soft,
            unfinished: Mutex::default(),
        });
        let weak = Arc::downgrade(&endpoint);
        endpoint
            .state
            .sessions
            .listen(Arc::new(move |event: &SessionEvent| {
                if let Some(e) = weak.upgrade() {
                    e.session_event(event);
                }
            }));
        endpoint
    }

    /// The server's state.
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Connections registered now.
    pub fn connection_count(&self) -> usize {
        lock(&self.connections).len()
    }

    /// A new connection from `peer`, arrived on the local address `local`
    /// at `now`: admission's connection stages - open-files headroom, the
    /// per-address and global buckets, the unfinished handshakes of the
    /// address, then `max_channel_count` (the oldest channel without an
    /// activated session is told to close to make room when there is one).
    /// Admitted: the connection's record, registered. Refused: the
    /// [`Shed`] to answer with (an ERR, then close, nothing parsed).
    pub fn accept(
        &self,
        peer: SocketAddr,
        local: Option<IpAddr>,
        now: Instant,
    ) -> Result<Arc<Channel>, Shed> {
        let metrics = &self.state.metrics;
        metrics.connection_accepted();
        let refused = |shed: Shed| {
            metrics.shed(&shed);
            metrics.connection_closed();
            Err(shed)
        };
        let admission = &self.state.admission;
        let open = self.connection_count() + 1;
        if let Decision::Refuse {
            retry_after, by, ..
        } = admission.on_accept(peer, now, open, self.open_files_soft)
        {
            let reason = match by {
                AcceptCheck::OpenFiles => Reason::OpenFiles,
                AcceptCheck::AddressRate => Reason::AddressRate,
                AcceptCheck::Rate => Reason::Rate,
            };
            // Out of descriptors every connection is refused: not ready.
            self.state.set_shedding_all(by == AcceptCheck::OpenFiles);
            return refused(Shed::new(Stage::Accept, reason, retry_after));
        }
        self.state.set_shedding_all(false);
        let counted = admission.is_enabled();
        if counted {
            let limit = self
                .state
                .config
                .admission
                .max_unfinished_handshakes_per_address;
            if !lock(&self.unfinished).try_add(AddressKey::of(peer.ip()), limit) {
                let hint = admission.hint(crate::admission::Stage::Handshake, now);
                return refused(Shed::new(Stage::Handshake, Reason::AddressHandshakes, hint));
            }
        }
        // `open` counts this connection; the channel decision wants the
        // channels already open.
        if admission.channel_decision(open - 1, true) != ChannelDecision::Admit {
            let hint = admission.channel_refusal(now).retry_after;
            match self.oldest_sessionless() {
                Some(victim) => {
                    let shed = Shed::new(Stage::Channel, Reason::Evicted, hint);
                    metrics.shed(&shed);
                    victim.close_with(shed.status(), shed.err_reason());
                }
                None => {
                    if counted {
                        lock(&self.unfinished).remove(AddressKey::of(peer.ip()));
                    }
                    return refused(Shed::new(Stage::Channel, Reason::ChannelLimit, hint));
                }
            }
        }
        let id = self.next_channel_id.fetch_add(1, Ordering::Relaxed).max(1);
        let channel = Arc::new(Channel::new(id, Some(peer.ip()), local));
        channel.unfinished.store(counted, Ordering::Relaxed);
        lock(&self.connections).insert(id, Arc::downgrade(&channel));
        if self.stopping.load(Ordering::Acquire) {
            channel.close_with(StatusCode::BadShutdown, "server shutting down".into());
        }
        Ok(channel)
    }

    /// The protocol state of an accepted connection, at `now`.
    pub fn connection(&self, channel: &Channel, now: Now) -> ServerConnection {
        PendingConnection::new().accept(
            now,
            channel.id(),
            Arc::clone(&self.state.channel_config),
            Arc::clone(&self.state.budget),
        )
    }

    /// The bytes of the ERR refusing a connection with `shed`.
    pub fn refusal(shed: &Shed) -> Vec<u8> {
        PendingConnection::new().refuse(shed.status(), &shed.err_reason())
    }

    fn oldest_sessionless(&self) -> Option<Arc<Channel>> {
        lock(&self.connections)
            .iter()
            .filter_map(|(id, c)| {
                let c = c.upgrade()?;
                (!c.has_activated_session()).then_some((*id, c))
            })
            .min_by_key(|(id, _)| *id)
            .map(|(_, c)| c)
    }

    /// Decides on the OpenSecureChannel handshake of `channel`'s connection
    /// at `now`, before anything is decrypted or verified; `ticket` is the
    /// `RetryTicket` its Hello echoed, if any. Admitted: the place. To
    /// wait: the future of the place and the instant to give up at (then
    /// [`Endpoint::handshake_timed_out`]), for the shell to await with its
    /// timer. Refused: the [`Shed`] (counted) to close it with.
    pub fn handshake(
        &self,
        channel: &Channel,
        ticket: Option<&str>,
        now: Instant,
    ) -> HandshakeDecision {
        use crate::admission::StageDecision;
        match self.state.admission.handshake(channel.peer, ticket, now) {
            StageDecision::Admit(guard) => HandshakeDecision::Admit(self.place(guard)),
            StageDecision::Wait { waiting, until } => HandshakeDecision::Wait {
                waiting: Box::pin(waiting),
                until,
            },
            StageDecision::Refuse(refusal) => {
                HandshakeDecision::Refuse(self.handshake_shed(&refusal))
            }
        }
    }

    /// Decides on the Hello of `channel`'s connection at `now`
    /// ([`crate::admission::Admission::hello`]): acknowledged, or closed
    /// with the shed's ERR (counted) before the client works on an
    /// OpenSecureChannel that would be refused.
    fn hello(&self, conn: &mut ServerConnection, channel: &Channel, now: Instant) {
        if !conn.is_hello_held() {
            return;
        }
        let ticket = conn.hello_retry_ticket();
        match self.state.admission.hello(channel.peer, ticket, now) {
            None => conn.acknowledge(),
            Some(refusal) => {
                let shed = self.handshake_shed(&refusal);
                conn.close_with(shed.status(), &shed.err_reason());
            }
        }
    }

    /// The place a handshake that waited got (`guard`).
    pub fn handshake_admitted(&self, guard: crate::admission::HandshakeGuard) -> HandshakePlace {
        self.place(guard)
    }

    /// A handshake's wait given up at `now` (its `until` passed): the
    /// refusal (counted), with a slot and a ticket.
    pub fn handshake_timed_out(&self, channel: &Channel, now: Instant) -> Shed {
        let refusal = self.state.admission.handshake_timed_out(channel.peer, now);
        self.handshake_shed(&refusal)
    }

    fn place(&self, guard: crate::admission::HandshakeGuard) -> HandshakePlace {
        self.state.metrics.handshakes_in_flight(1);
        HandshakePlace {
            guard: Some(guard),
            state: Arc::clone(&self.state),
        }
    }

    fn handshake_shed(&self, refusal: &crate::admission::Refusal) -> Shed {
        let shed = Shed::refused(Stage::Handshake, Reason::HandshakeLimit, refusal);
        self.state.metrics.shed(&shed);
        shed
    }

    /// Hands each event `conn` yielded to its place: requests to
    /// [`submit::submit`] (their answers into `conn`, their tasks to
    /// `spawn`), channel events to the counters. `now` is when the bytes
    /// that brought them were read.
    pub fn handle_events(
        &self,
        conn: &mut ServerConnection,
        channel: &Arc<Channel>,
        now: Now,
        spawn: &mut dyn FnMut(Spawn),
    ) {
        let mut ctx: Option<ServiceContext> = None;
        while let Some(event) = conn.poll_event() {
            let (request_id, body) = match event {
                Event::Request { request_id, body } => (request_id, body),
                Event::Hello => {
                    self.hello(conn, channel, now.instant);
                    continue;
                }
                Event::Opened { .. } => {
                    if !channel.channel_open.swap(true, Ordering::Relaxed) {
                        self.state.metrics.channel_opened();
                    }
                    continue;
                }
                Event::Renewed { token_id } => {
                    tracing::debug!(
                        channel_id = conn.channel_id(),
                        token_id,
                        policy = conn.security().policy.uri(),
                        "security token renewed"
                    );
                    continue;
                }
                _ => continue,
            };
            // One context for the requests that arrived together.
            let ctx = ctx.get_or_insert_with(|| {
                let mut ctx = ServiceContext::new(
                    Arc::clone(&self.state),
                    conn.channel_id(),
                    conn.security().clone(),
                    now,
                    Some(Arc::clone(channel) as Arc<dyn ResponseSink>),
                );
                ctx.local_ip = channel.local;
                ctx.peer_ip = channel.peer;
                ctx
            });
            ctx.request_id = request_id;
            match submit::submit(ctx, channel, &body) {
                Submit::Answer(message) => send_or_fault(conn, request_id, &message, now.utc),
                Submit::Spawn(task) => spawn(task),
                Submit::Queued | Submit::Parked => {}
            }
        }
    }

    /// Sends what was answered away from the connection's task (workers,
    /// tasks, parked Publishes) into `conn`, and closes it when it was told
    /// to (shutdown, eviction). `now` stamps a fault for a response too
    /// large for the client.
    pub fn deliver(&self, conn: &mut ServerConnection, channel: &Channel, now: DateTime) {
        let (answers, close) = channel.take();
        for (request_id, message) in answers {
            send_or_fault(conn, request_id, &message, now);
        }
        if let Some((status, reason)) = close {
            conn.close_with(status, &reason);
        }
    }

    /// The connection of `channel` is gone (closed, or its task panicked)
    /// at `now`: its outstanding requests are dropped (queued ones leave
    /// the queue, running ones are aborted), its admission places given
    /// back, its record deregistered and counted out.
    pub fn teardown(&self, channel: &Arc<Channel>, now: Instant) {
        channel.close(&self.state.scheduler);
        self.state.admission.connection_closed(now);
        self.handshake_finished(channel);
        {
            let mut all = lock(&self.connections);
            if all
                .get(&channel.id())
                .is_some_and(|c| std::ptr::eq(c.as_ptr(), Arc::as_ptr(channel)))
            {
                all.remove(&channel.id());
            }
        }
        if channel.channel_open.load(Ordering::Relaxed) {
            self.state.metrics.channel_closed();
        }
        self.state.metrics.connection_closed();
    }

    /// The connection of `channel` is no longer an unfinished handshake
    /// (its first session was activated, or it closed).
    fn handshake_finished(&self, channel: &Channel) {
        if channel.unfinished.swap(false, Ordering::AcqRel) {
            if let Some(ip) = channel.peer {
                lock(&self.unfinished).remove(AddressKey::of(ip));
            }
        }
    }

    /// Keeps each channel's count of activated sessions (the reassembly
    /// budget's headroom, the eviction order, unfinished handshakes).
    fn session_event(&self, event: &SessionEvent) {
        let (up, down) = match event {
            SessionEvent::Activated { channel_id, .. } => (Some(*channel_id), None),
            SessionEvent::Moved { from, to, .. } => (Some(*to), Some(*from)),
            SessionEvent::Closed {
                channel_id,
                activated: true,
                ..
            }
            | SessionEvent::TimedOut {
                channel_id,
                activated: true,
                ..
            } => (None, Some(*channel_id)),
            _ => return,
        };
        let find = |id: u32| lock(&self.connections).get(&id).and_then(Weak::upgrade);
        if let Some(c) = up.and_then(find) {
            c.session_moved(true);
            self.handshake_finished(&c);
        }
        if let Some(c) = down.and_then(find) {
            c.session_moved(false);
        }
    }

    /// The ids of the channels open now, in no particular order.
    pub fn channel_ids(&self) -> Vec<u32> {
        lock(&self.connections).keys().copied().collect()
    }

    /// Tells channel `id`, if it is still open, to close with
    /// `BadShutdown` (a drain closing the channels in batches).
    pub fn stop_channel(&self, id: u32) {
        let channel = lock(&self.connections).get(&id).and_then(Weak::upgrade);
        if let Some(c) = channel {
            c.close_with(StatusCode::BadShutdown, "server shutting down".into());
        }
    }

    /// Shutdown began: every connection is told to close with
    /// `BadShutdown`, and so is every one that registers later.
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::Release);
        let all: Vec<_> = lock(&self.connections)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for c in all {
            c.close_with(StatusCode::BadShutdown, "server shutting down".into());
        }
    }
}

/// Sends a response; one too large for the client's limits becomes a
/// `BadResponseTooLarge` ServiceFault stamped `now`.
fn send_or_fault(conn: &mut ServerConnection, request_id: u32, message: &[u8], now: DateTime) {
    if let Err(e) = conn.send_response(request_id, message) {
        if e.status_code() == StatusCode::BadResponseTooLarge {
            let small = crate::dispatch::encoded_fault(
                now,
                peek_response_handle(message),
                StatusCode::BadResponseTooLarge,
            );
            let _ = conn.send_response(request_id, &small);
        }
    }
}

/// The requestHandle of an encoded response (its ResponseHeader starts the
/// body after the encoding id, and the handle follows the timestamp).
fn peek_response_handle(message: &[u8]) -> u32 {
    use uascale_types::{BinaryDecode, NodeId, Reader};
    let limits = uascale_types::DecodeLimits::default();
    let Ok(mut r) = Reader::new(message, &limits) else {
        return 0;
    };
    if NodeId::decode(&mut r).is_err() || DateTime::decode(&mut r).is_err() {
        return 0;
    }
    u32::decode(&mut r).unwrap_or(0)
}
