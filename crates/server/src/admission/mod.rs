//! Admission control (docs/scalability.md §2): decisions taken **before** the
//! work they protect, each refusal a fast busy answer with a retry-after
//! hint.
//!
//! Every stage is plain data on a passed-in clock (`Instant` arguments, no
//! clock read, no runtime), so each is unit-tested on a simulated clock:
//!
//! - [`bucket`]: the token bucket of the connection rate;
//! - [`address`]: per-source-address buckets (IPv4 address, IPv6 /64) in a
//!   table bounded in memory, and per-address counts;
//! - [`gate`]: the OpenSecureChannel handshakes in flight
//!   ([`HandshakeGate`]) and session establishment ([`EstablishmentGate`],
//!   with its waiting room);
//! - [`channels`]: the `max_channel_count` policy ([`ChannelCount`]);
//! - [`schedule`]: a stage's measured service rate and the slots promised
//!   to refused clients (the hints);
//! - [`room`]: the waiting room of the handshake and establishment stages;
//! - [`ticket`]: retry tickets (keyed, single use, bounded);
//! - [`hint`]: the retry-after hint's clamps, the completion-rate average,
//!   the jitter and the [`Refusal`] that carries a hint;
//! - [`service_level`]: the load-based `Server.ServiceLevel`;
//! - [`host`]: the CPUs the process may use and the open-files limit.
//!
//! [`Admission`] composes them from the `[admission]` configuration. What
//! the network layer calls: [`Admission::on_accept`] for each accepted TCP
//! connection, before the sans-IO connection is created
//! ([`uascale_proto::PendingConnection::accept`] or `refuse`);
//! [`Admission::connection_closed`] when one closes;
//! [`Admission::channel_decision`] when a channel opens;
//! [`Admission::handshakes`] around the asymmetric work of
//! OpenSecureChannel; and the services: [`Admission::establishment`] around
//! CreateSession (the session-count check of
//! [`crate::session::SessionTable::reserve`] stays where it is).
//!
//! The handshake and establishment stages are asked through
//! [`Admission::handshake`] and [`Admission::establish`]: each answers
//! [`StageDecision::Admit`], [`StageDecision::Wait`] (await the future,
//! at most until the instant given; then [`Admission::handshake_timed_out`]
//! or [`Admission::establishment_timed_out`]) or
//! [`StageDecision::Refuse`] with the hint and a retry ticket.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

use crate::config::ServerConfig;

pub mod address;
pub mod bucket;
pub mod channels;
pub mod gate;
pub mod hint;
pub mod host;
pub mod refusal;
pub mod room;
pub mod schedule;
pub mod service_level;
pub mod ticket;

pub use channels::{ChannelCount, ChannelDecision};
pub use gate::{EstablishmentGate, EstablishmentGuard, HandshakeGate, HandshakeGuard};
pub use refusal::Refusal;
pub use service_level::ServiceLevel;

use address::{AddressBuckets, AddressVerdict, DEFAULT_ADDRESS_TABLE_CAPACITY};
use bucket::TokenBucket;
use gate::{Enter, HandshakeWait, Verdict};
use hint::{CompletionRate, Jitter};
use ticket::{Presented, Ticket, TicketBook, TicketCounts, TicketStage, DEFAULT_TICKET_CAPACITY};

/// The retry-after hint of `BadTooManySessions` (the server holds
/// `max_session_count` sessions): sessions end at no rate the server can
/// measure ahead, so a fixed second, as the hint's fallback.
pub const SESSION_FULL_RETRY_AFTER: Duration = hint::HINT_FALLBACK;

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
        /// Which check refused it (for the metrics' reason label).
        by: AcceptCheck,
    },
}

/// The checks of [`Admission::on_accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcceptCheck {
    /// Too few file descriptors would remain.
    OpenFiles,
    /// The source address's bucket was empty.
    AddressRate,
    /// The global bucket was empty.
    Rate,
}

impl Decision {
    fn refuse(r: Refusal, by: AcceptCheck) -> Self {
        Decision::Refuse {
            status: r.status,
            retry_after: r.retry_after,
            by,
        }
    }
}

/// A stage whose hint [`Admission::hint`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The global connection bucket at accept.
    Accept,
    /// OpenSecureChannel handshakes in flight.
    Handshake,
    /// Session establishment.
    Establishment,
    /// Connections closing: what frees channels (`max_channel_count`) and
    /// descriptors (`open_files_headroom`).
    Connections,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct AcceptState {
    global: TokenBucket,
    /// The global bucket's next token not yet promised to a refused
    /// connection (slots at the bucket's rate, each refusal booking the
    /// share of refused clients that come back).
    next_free: Option<Instant>,
    addresses: AddressBuckets,
    jitter: Jitter,
}

/// What a handshake or establishment stage decided.
#[derive(Debug)]
pub enum StageDecision<G, W> {
    /// A place now.
    Admit(G),
    /// Await `waiting` for the place, at most until `until`; then ask the
    /// stage's `timed_out` for the refusal.
    Wait {
        /// The future of the place (runtime-free).
        waiting: W,
        /// When to stop waiting.
        until: Instant,
    },
    /// Refused: the status, the hint (the time until the client's slot)
    /// and its retry ticket.
    Refuse(Refusal),
}

/// A stage's counts of waits and returns (the metrics read them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageCounts {
    /// Requests that waited in the room.
    pub waited: u64,
    /// Waits given up at their limit (then refused with a ticket).
    pub wait_timeouts: u64,
    /// Tickets presented within their window (returns at the hint).
    pub returns_at_hint: u64,
    /// Of those, admitted at once or to the waiting room.
    pub returns_admitted: u64,
    /// The stage's tickets.
    pub tickets: TicketCounts,
}

#[derive(Debug)]
struct TicketDesk {
    book: TicketBook,
    waited: u64,
    wait_timeouts: u64,
    returns_at_hint: u64,
    returns_admitted: u64,
}

impl TicketDesk {
    fn new() -> Self {
        TicketDesk {
            book: TicketBook::random(DEFAULT_TICKET_CAPACITY),
            waited: 0,
            wait_timeouts: 0,
            returns_at_hint: 0,
            returns_admitted: 0,
        }
    }
}

#[derive(Debug)]
struct Closes {
    rate: CompletionRate,
    jitter: Jitter,
}

/// The admission stages of a server (docs/scalability.md §2), built from the
/// `[admission]` section. Shared by every connection task: `&self`
/// methods, each stage behind its own short mutex.
///
/// Disabled (`enabled = false`, or [`Admission::disabled`]), every
/// connection, channel, handshake and establishment is admitted; the gates
/// still count.
#[derive(Debug)]
pub struct Admission {
    enabled: bool,
    /// `refuse_at_hello`.
    refuse_at_hello: bool,
    accept: Mutex<AcceptState>,
    handshakes: HandshakeGate,
    establishment: EstablishmentGate,
    channels: ChannelCount,
    open_files_headroom: u64,
    closes: Mutex<Closes>,
    handshake_desk: Mutex<TicketDesk>,
    establishment_desk: Mutex<TicketDesk>,
}

impl Default for Admission {
    /// [`Admission::disabled`].
    fn default() -> Self {
        Admission::disabled()
    }
}

/// A seed for the hints' jitter that differs between processes.
fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    match getrandom::getrandom(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => u64::from(std::process::id()) | 1 << 40,
    }
}

/// A different seed per stage from one seed (splitmix64's increment).
fn stage_seed(seed: u64, stage: u64) -> u64 {
    seed.wrapping_add(stage.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

impl Admission {
    /// Every stage open: the behaviour before admission control, and of
    /// `enabled = false`.
    pub fn disabled() -> Self {
        Admission {
            enabled: false,
            refuse_at_hello: false,
            accept: Mutex::new(AcceptState {
                global: TokenBucket::new(u32::MAX, u32::MAX),
                next_free: None,
                addresses: AddressBuckets::new(u32::MAX, u32::MAX, 8),
                jitter: Jitter::new(1),
            }),
            handshakes: HandshakeGate::unlimited(),
            establishment: EstablishmentGate::unlimited(),
            channels: ChannelCount::new(usize::MAX),
            open_files_headroom: 0,
            closes: Mutex::new(Closes {
                rate: CompletionRate::default(),
                jitter: Jitter::new(1),
            }),
            handshake_desk: Mutex::new(TicketDesk::new()),
            establishment_desk: Mutex::new(TicketDesk::new()),
        }
    }

    /// The stages of `config`'s `[admission]` section, its derived values
    /// resolved with `cpus` ([`ServerConfig::resolved`]), the hints' jitter
    /// seeded at random.
    pub fn new(config: &ServerConfig, cpus: usize) -> Self {
        Self::with_seed(config, cpus, random_seed())
    }

    /// [`Admission::new`] with the jitter seeded by `seed` (tests).
    pub fn with_seed(config: &ServerConfig, cpus: usize, seed: u64) -> Self {
        let resolved = config.resolved(cpus);
        let a = resolved.admission;
        if !a.enabled {
            return Self::disabled();
        }
        let e = a.effective(resolved.server.max_session_count, cpus);
        let per_address_rate = e.connections_per_second_per_address;
        let per_address_burst = e.connection_burst_per_address;
        Admission {
            enabled: true,
            refuse_at_hello: a.refuse_at_hello,
            accept: Mutex::new(AcceptState {
                global: TokenBucket::new(a.connections_per_second, a.connection_burst),
                next_free: None,
                addresses: AddressBuckets::new(
                    per_address_rate,
                    per_address_burst,
                    DEFAULT_ADDRESS_TABLE_CAPACITY,
                ),
                jitter: Jitter::new(stage_seed(seed, 1)),
            }),
            handshakes: HandshakeGate::with_wait(
                e.max_concurrent_handshakes,
                a.max_unfinished_handshakes_per_address,
                Duration::from_millis(a.handshake_wait_ms.into()),
                stage_seed(seed, 2),
            ),
            establishment: EstablishmentGate::with_wait(
                e.max_concurrent_session_establishment,
                a.session_establishment_queue_limit,
                Duration::from_millis(a.establishment_wait_ms.into()),
            ),
            channels: ChannelCount::new(e.max_channel_count),
            open_files_headroom: a.open_files_headroom.into(),
            closes: Mutex::new(Closes {
                rate: CompletionRate::default(),
                jitter: Jitter::new(stage_seed(seed, 4)),
            }),
            handshake_desk: Mutex::new(TicketDesk::new()),
            establishment_desk: Mutex::new(TicketDesk::new()),
        }
    }

    /// Whether admission control is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Decides on a connection from `peer` accepted at `now`, while
    /// `open_connections` connections are open (this one included) and the
    /// soft open-files limit is `open_files_soft_limit` (from
    /// [`host::raise_open_files_limit`] at start; `None` = unlimited or
    /// unknown, no check). In order:
    ///
    /// 1. open files: refused when fewer than `open_files_headroom`
    ///    descriptors would remain (`open_connections` stands for the
    ///    descriptors in use; the headroom covers the rest);
    /// 2. the bucket of `peer`'s address (IPv4 address, IPv6 /64), only
    ///    while the global bucket is contended (less than half its burst
    ///    left): alone, one host may connect at the global rate;
    /// 3. the global bucket (a refusal here gives the address its token
    ///    back).
    ///
    /// A refusal is `BadTcpServerTooBusy` with the stage's hint: the time
    /// until a token of the bucket not yet promised to an earlier refused
    /// connection (each refusal books the share of refused clients that
    /// come back, as the establishment stage's tickets measure it).
    pub fn on_accept(
        &self,
        peer: SocketAddr,
        now: Instant,
        open_connections: usize,
        open_files_soft_limit: Option<u64>,
    ) -> Decision {
        if !self.enabled {
            return Decision::Admit;
        }
        if let Some(soft) = open_files_soft_limit {
            let remaining = soft.saturating_sub(open_connections as u64);
            // A quarter of a small limit at most: a process started with
            // 64 descriptors still serves.
            let headroom = self.open_files_headroom.min(soft / 4);
            if remaining < headroom {
                // The connections that must close first.
                let backlog = (headroom - remaining) as f64;
                return Decision::refuse(self.closes_refusal(backlog, now), AcceptCheck::OpenFiles);
            }
        }
        let returns = self.establishment.returns();
        let mut s = lock(&self.accept);
        let s = &mut *s;
        let contended = s.global.tokens(now) < f64::from(s.global.burst()) / 2.0;
        let mut took_address = false;
        if contended {
            match s.addresses.try_take(peer.ip(), now) {
                AddressVerdict::Refuse { wait, refused } => {
                    let rate = s.addresses.rate_per_s();
                    return Decision::refuse(
                        Refusal::new(
                            StatusCode::BadTcpServerTooBusy,
                            bucket_hint(wait, refused * returns, rate, &mut s.jitter),
                        ),
                        AcceptCheck::AddressRate,
                    );
                }
                AddressVerdict::Admit => took_address = true,
            }
        }
        match s.global.try_take(now) {
            Ok(()) => Decision::Admit,
            Err(wait) => {
                if took_address {
                    s.addresses.give_back(peer.ip());
                }
                let rate = f64::from(s.global.rate_per_s().max(1));
                let earliest = now + wait.clamp(hint::HINT_MIN, hint::HINT_MAX);
                let slot = s
                    .next_free
                    .map_or(earliest, |f| f.max(earliest))
                    .min(now + hint::HINT_MAX);
                s.next_free = Some(slot + Duration::from_secs_f64(returns / rate));
                let base = slot.saturating_duration_since(now);
                Decision::refuse(
                    Refusal::new(
                        StatusCode::BadTcpServerTooBusy,
                        hint::jittered(base, &mut s.jitter),
                    ),
                    AcceptCheck::Rate,
                )
            }
        }
    }

    /// A connection closed at `now`: feeds the rate that the hints of
    /// `max_channel_count` and `open_files_headroom` refusals divide by.
    pub fn connection_closed(&self, now: Instant) {
        lock(&self.closes).rate.record(now);
    }

    /// What to do with a new secure channel while `open` channels are open
    /// and `has_sessionless` says whether one has no session
    /// ([`ChannelCount::decide`]); always `Admit` when disabled. On
    /// `Refuse`, answer with [`Admission::channel_refusal`].
    pub fn channel_decision(&self, open: usize, has_sessionless: bool) -> ChannelDecision {
        if !self.enabled {
            return ChannelDecision::Admit;
        }
        self.channels.decide(open, has_sessionless)
    }

    /// The refusal of a channel over `max_channel_count`:
    /// `BadTcpServerTooBusy`, the hint one connection's closing away.
    pub fn channel_refusal(&self, now: Instant) -> Refusal {
        self.closes_refusal(1.0, now)
    }

    fn closes_refusal(&self, backlog: f64, now: Instant) -> Refusal {
        let mut c = lock(&self.closes);
        let c = &mut *c;
        let rate = c.rate.per_second(now);
        Refusal::new(
            StatusCode::BadTcpServerTooBusy,
            hint::retry_after(backlog, rate, &mut c.jitter),
        )
    }

    /// The OpenSecureChannel gate (`max_concurrent_handshakes`,
    /// `max_unfinished_handshakes_per_address`).
    pub fn handshakes(&self) -> &HandshakeGate {
        &self.handshakes
    }

    /// The session-establishment gate
    /// (`max_concurrent_session_establishment`,
    /// `session_establishment_queue_limit`).
    pub fn establishment(&self) -> &EstablishmentGate {
        &self.establishment
    }

    /// Decides on the asymmetric work of a secured OpenSecureChannel from
    /// `peer` at `now`, before anything is decrypted; `ticket` is the
    /// `RetryTicket` the client echoed in its Hello's endpoint URL, if any.
    /// A ticket back within its window queues ahead of clients without
    /// one; one back well before its slot is refused at once with the time
    /// left until its slot - moved later by as much as it came early - and
    /// the same ticket, consuming nothing. A refusal is
    /// `BadTcpServerTooBusy` with the time until the client's promised slot
    /// and a new ticket for it.
    pub fn handshake(
        &self,
        peer: Option<IpAddr>,
        ticket: Option<&str>,
        now: Instant,
    ) -> StageDecision<HandshakeGuard, HandshakeWait> {
        let peer = peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let gate = &self.handshakes;
        let mut desk = lock(&self.handshake_desk);
        gate.tickets_unused(desk.book.take_expired());
        let priority = match self.present(&mut desk, TicketStage::Handshake, ticket, peer, now) {
            Err(early) => {
                return StageDecision::Refuse(early.with_status(StatusCode::BadTcpServerTooBusy))
            }
            Ok(p) => p,
        };
        if priority {
            gate.ticket_returned();
        }
        // Disabled, the gate is unlimited: counted, never refused.
        let verdict = gate.decide(peer, priority, now);
        Self::settle(
            &mut desk,
            TicketStage::Handshake,
            StatusCode::BadTcpServerTooBusy,
            peer,
            priority,
            now,
            verdict,
        )
    }

    /// Decides on a Hello from `peer` at `now` (`ticket`: the
    /// `RetryTicket` its endpoint URL echoed, if any), before the client
    /// spends work on an OpenSecureChannel: the refusal, with a slot and a
    /// ticket, when the handshake stage would refuse a secured
    /// OpenSecureChannel without priority coming now (see
    /// [`HandshakeGate::refuses_now`]); `None` to acknowledge it. A ticket
    /// holder within its window passes (its OpenSecureChannel presents the
    /// ticket); one early for its slot is answered as its
    /// OpenSecureChannel would be, its own slot moved back.
    pub fn hello(
        &self,
        peer: Option<IpAddr>,
        ticket: Option<&str>,
        now: Instant,
    ) -> Option<Refusal> {
        if !self.refuse_at_hello {
            return None;
        }
        let peer = peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let mut desk = lock(&self.handshake_desk);
        if let Some(t) = ticket.and_then(Ticket::parse) {
            if desk
                .book
                .would_honour(TicketStage::Handshake, &t, peer, now)
            {
                return None;
            }
            if let Presented::Early { wait } =
                desk.book.present(TicketStage::Handshake, &t, peer, now)
            {
                return Some(Refusal {
                    status: StatusCode::BadTcpServerTooBusy,
                    retry_after: wait,
                    ticket: Some(t),
                });
            }
        }
        let slot = self.handshakes.refuses_now(now)?;
        Some(Self::refuse_with_ticket(
            &mut desk,
            TicketStage::Handshake,
            StatusCode::BadTcpServerTooBusy,
            peer,
            now,
            slot,
        ))
    }

    /// A handshake's wait given up at `now` (its `until` passed): the
    /// refusal, with a slot and a ticket.
    pub fn handshake_timed_out(&self, peer: Option<IpAddr>, now: Instant) -> Refusal {
        let peer = peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let slot = self.handshakes.timed_out(now);
        let mut desk = lock(&self.handshake_desk);
        desk.wait_timeouts += 1;
        Self::refuse_with_ticket(
            &mut desk,
            TicketStage::Handshake,
            StatusCode::BadTcpServerTooBusy,
            peer,
            now,
            slot,
        )
    }

    /// Decides on a CreateSession from `peer` at `now`, before any
    /// certificate or signature work; `ticket` is the `RetryTicket` the
    /// client echoed in the request header's additionalHeader, if any.
    /// As [`Admission::handshake`]; a refusal is `BadServerTooBusy`.
    pub fn establish(
        &self,
        peer: Option<IpAddr>,
        ticket: Option<&str>,
        now: Instant,
    ) -> StageDecision<EstablishmentGuard, Enter> {
        let peer = peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let gate = &self.establishment;
        let mut desk = lock(&self.establishment_desk);
        gate.tickets_unused(desk.book.take_expired());
        let priority = match self.present(&mut desk, TicketStage::Establishment, ticket, peer, now)
        {
            Err(early) => {
                return StageDecision::Refuse(early.with_status(StatusCode::BadServerTooBusy))
            }
            Ok(p) => p,
        };
        if priority {
            gate.ticket_returned();
        }
        let verdict = gate.decide(priority, now);
        Self::settle(
            &mut desk,
            TicketStage::Establishment,
            StatusCode::BadServerTooBusy,
            peer,
            priority,
            now,
            verdict,
        )
    }

    /// An establishment's wait given up at `now`: the refusal, with a slot
    /// and a ticket.
    pub fn establishment_timed_out(&self, peer: Option<IpAddr>, now: Instant) -> Refusal {
        let peer = peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let slot = self.establishment.timed_out(now);
        let mut desk = lock(&self.establishment_desk);
        desk.wait_timeouts += 1;
        Self::refuse_with_ticket(
            &mut desk,
            TicketStage::Establishment,
            StatusCode::BadServerTooBusy,
            peer,
            now,
            slot,
        )
    }

    /// Whether `ticket` makes the request a ticket holder back in its
    /// window (`Ok(true)`), counts as none (`Ok(false)`), or came early
    /// (`Err`: the refusal to answer at once, status set by the caller).
    fn present(
        &self,
        desk: &mut TicketDesk,
        stage: TicketStage,
        ticket: Option<&str>,
        peer: IpAddr,
        now: Instant,
    ) -> Result<bool, Refusal> {
        let Some(text) = ticket else {
            return Ok(false);
        };
        let Some(t) = Ticket::parse(text) else {
            desk.book.note_forged();
            return Ok(false);
        };
        match desk.book.present(stage, &t, peer, now) {
            Presented::Honoured => {
                desk.returns_at_hint += 1;
                Ok(true)
            }
            Presented::Early { wait } => Err(Refusal {
                status: StatusCode::BadServerTooBusy,
                retry_after: wait,
                ticket: Some(t),
            }),
            Presented::Expired | Presented::Replayed | Presented::Forged => Ok(false),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn settle<G, W>(
        desk: &mut TicketDesk,
        stage: TicketStage,
        status: StatusCode,
        peer: IpAddr,
        priority: bool,
        now: Instant,
        verdict: Verdict<G, W>,
    ) -> StageDecision<G, W> {
        match verdict {
            Verdict::Admit(g) => {
                desk.returns_admitted += u64::from(priority);
                StageDecision::Admit(g)
            }
            Verdict::Wait { waiting, until } => {
                desk.returns_admitted += u64::from(priority);
                desk.waited += 1;
                StageDecision::Wait { waiting, until }
            }
            Verdict::Refuse { slot } => StageDecision::Refuse(Self::refuse_with_ticket(
                desk, stage, status, peer, now, slot,
            )),
        }
    }

    fn refuse_with_ticket(
        desk: &mut TicketDesk,
        stage: TicketStage,
        status: StatusCode,
        peer: IpAddr,
        now: Instant,
        slot: Instant,
    ) -> Refusal {
        let ticket = desk.book.issue(stage, peer, now, slot);
        Refusal {
            status,
            retry_after: slot.saturating_duration_since(now),
            ticket: Some(ticket),
        }
    }

    /// The counts of the handshake (`Stage::Handshake`) or establishment
    /// (`Stage::Establishment`) stage; zeros for the others.
    pub fn stage_counts(&self, stage: Stage) -> StageCounts {
        let desk = match stage {
            Stage::Handshake => &self.handshake_desk,
            Stage::Establishment => &self.establishment_desk,
            _ => return StageCounts::default(),
        };
        let d = lock(desk);
        StageCounts {
            waited: d.waited,
            wait_timeouts: d.wait_timeouts,
            returns_at_hint: d.returns_at_hint,
            returns_admitted: d.returns_admitted,
            tickets: d.book.counts(),
        }
    }

    /// The `max_channel_count` policy.
    pub fn channels(&self) -> ChannelCount {
        self.channels
    }

    /// The hint `stage` would give at `now` (jittered; docs/scalability.md,
    /// "The retry-after hint").
    pub fn hint(&self, stage: Stage, now: Instant) -> Duration {
        match stage {
            Stage::Accept => {
                let mut s = lock(&self.accept);
                let s = &mut *s;
                let earliest = now + s.global.wait(now).clamp(hint::HINT_MIN, hint::HINT_MAX);
                let slot = s
                    .next_free
                    .map_or(earliest, |f| f.max(earliest))
                    .min(now + hint::HINT_MAX);
                hint::jittered(slot.saturating_duration_since(now), &mut s.jitter)
            }
            Stage::Handshake => self.handshakes.jittered_hint(now),
            Stage::Establishment => self.establishment.hint(now),
            Stage::Connections => self.closes_refusal(1.0, now).retry_after,
        }
    }
}

/// A bucket's hint: the refused demand (a fading count of the refusals of
/// the last few seconds, which will come back) over the bucket's rate, and
/// at least the time until its next token; clamped and jittered as every
/// hint.
fn bucket_hint(wait: Duration, refused: f64, rate_per_s: u32, jitter: &mut Jitter) -> Duration {
    let spread = hint::base_retry_after(refused, Some(f64::from(rate_per_s)));
    let base = spread.max(wait.clamp(hint::HINT_MIN, hint::HINT_MAX));
    hint::jittered(base, jitter)
}

/// The reason text of a busy ERR: the hint as the token `RetryAfterMs=N`
/// (milliseconds, rounded up) that clients parse.
pub fn busy_reason(retry_after: Duration) -> String {
    let ms = retry_after.as_nanos().div_ceil(1_000_000);
    format!("server too busy; RetryAfterMs={ms}")
}

/// The reason text of a busy ERR for `refusal`: [`busy_reason`], and when
/// it has a ticket the token `RetryTicket=<34 hex digits>` after it.
pub fn refusal_reason(refusal: &Refusal) -> String {
    let mut r = busy_reason(refusal.retry_after);
    if let Some(t) = &refusal.ticket {
        r.push_str(&format!(" RetryTicket={t}"));
    }
    r
}

/// The value of `RetryTicket=` in the query of an endpoint URL (where a
/// client echoes its ticket in the Hello), if any.
pub fn ticket_in_url(url: &str) -> Option<&str> {
    let (_, query) = url.split_once('?')?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("RetryTicket="))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn peer(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), 50_000)
    }

    impl Admission {
        /// [`Admission::on_accept`] without the open-files check.
        fn on_connection(&self, peer: SocketAddr, now: Instant) -> Decision {
            self.on_accept(peer, now, 0, None)
        }
    }

    fn refused(d: Decision) -> Duration {
        match d {
            Decision::Refuse {
                status,
                retry_after,
                ..
            } => {
                assert_eq!(status, StatusCode::BadTcpServerTooBusy);
                retry_after
            }
            Decision::Admit => panic!("admitted"),
        }
    }

    fn config(f: impl FnOnce(&mut crate::config::AdmissionSection)) -> ServerConfig {
        let mut c = ServerConfig::default();
        f(&mut c.admission);
        c
    }

    #[test]
    fn the_busy_reason_carries_the_hint_rounded_up() {
        assert_eq!(
            busy_reason(Duration::from_micros(2_001)),
            "server too busy; RetryAfterMs=3"
        );
    }

    #[test]
    fn disabled_admits_everything() {
        let t0 = Instant::now();
        for a in [
            Admission::disabled(),
            Admission::with_seed(&config(|a| a.enabled = false), 2, 1),
        ] {
            assert!(!a.is_enabled());
            for i in 0..10_000u64 {
                let d = a.on_accept(peer("192.0.2.1"), t0 + ms(i / 100), 1 << 20, Some(10));
                assert_eq!(d, Decision::Admit);
            }
            assert_eq!(
                a.channel_decision(usize::MAX - 1, false),
                ChannelDecision::Admit
            );
            let _g: Vec<_> = (0..1000)
                .map(|_| {
                    a.handshakes()
                        .try_begin(peer("192.0.2.1").ip(), t0)
                        .unwrap()
                })
                .collect();
            let _e: Vec<_> = (0..1000)
                .map(|_| a.establishment().try_enter(t0).unwrap())
                .collect();
        }
    }

    #[test]
    fn the_configuration_sizes_the_stages() {
        let a = Admission::with_seed(&ServerConfig::default(), 4, 1);
        assert!(a.is_enabled());
        assert_eq!(a.handshakes().capacity(), 8);
        assert_eq!(a.establishment().capacity(), 128);
        assert_eq!(a.channels().max(), 22_000);
        let a = Admission::with_seed(
            &config(|a| {
                a.max_concurrent_handshakes = Some(3);
                a.max_channel_count = Some(5);
                a.max_concurrent_session_establishment = Some(7);
            }),
            4,
            1,
        );
        assert_eq!(a.handshakes().capacity(), 3);
        assert_eq!(a.establishment().capacity(), 7);
        assert_eq!(
            a.channel_decision(5, true),
            ChannelDecision::EvictOldestSessionless
        );
        assert_eq!(a.channel_decision(5, false), ChannelDecision::Refuse);
        assert_eq!(a.channel_decision(4, false), ChannelDecision::Admit);
        let r = a.channel_refusal(Instant::now());
        assert_eq!(r.status, StatusCode::BadTcpServerTooBusy);
        assert!(r.retry_after >= ms(800) && r.retry_after <= ms(1200));
    }

    #[test]
    fn one_address_gets_its_share_and_the_rest_the_global_bucket() {
        let t0 = Instant::now();
        // 500/s burst 1000 overall; the derived 62/s burst 125 per
        // address, applied once the global bucket is under half full.
        let mut config = ServerConfig::default();
        config.admission.connections_per_second = 500;
        config.admission.connection_burst = 1000;
        let a = Admission::with_seed(&config, 2, 7);
        let one = peer("198.51.100.7");
        let admitted = (0..1000)
            .filter(|_| a.on_connection(one, t0) == Decision::Admit)
            .count();
        assert_eq!(admitted, 501 + 125);
        // Other addresses still get in: the rest of the global bucket.
        let mut admitted = 0;
        for i in 0..2000u32 {
            let p = SocketAddr::new(std::net::Ipv4Addr::from(0xC633_6400 + i).into(), 1);
            if a.on_connection(p, t0) == Decision::Admit {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 374);
        // Refilled at 500/s: a second later 500 more.
        let t1 = t0 + Duration::from_secs(1);
        let mut admitted = 0;
        for i in 0..1000u32 {
            let p = SocketAddr::new(std::net::Ipv4Addr::from(0xCB00_7100 + i).into(), 1);
            if a.on_connection(p, t1) == Decision::Admit {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 500);
    }

    #[test]
    fn a_refusal_by_the_global_bucket_gives_the_address_its_token_back() {
        let t0 = Instant::now();
        let a = Admission::with_seed(
            &config(|a| {
                a.connections_per_second = 1;
                a.connection_burst = 1;
            }),
            2,
            7,
        );
        assert_eq!(a.on_connection(peer("192.0.2.1"), t0), Decision::Admit);
        // 192.0.2.2 is refused by the global bucket only ...
        refused(a.on_connection(peer("192.0.2.2"), t0));
        // ... so a second later, with one global token, it gets in.
        assert_eq!(
            a.on_connection(peer("192.0.2.2"), t0 + Duration::from_secs(1)),
            Decision::Admit
        );
    }

    #[test]
    fn the_accept_hint_spreads_the_refused_demand_over_the_rate() {
        let t0 = Instant::now();
        let a = Admission::with_seed(
            &config(|a| {
                a.connections_per_second = 100;
                a.connection_burst = 100;
            }),
            2,
            7,
        );
        let mut i = 0u32;
        let mut next = || {
            i += 1;
            SocketAddr::new(std::net::Ipv4Addr::from(0x0A00_0000 + i).into(), 1)
        };
        for _ in 0..100 {
            assert_eq!(a.on_connection(next(), t0), Decision::Admit);
        }
        // The first refusal: the next token is 10 ms away, so the minimum.
        let first = refused(a.on_connection(next(), t0));
        assert!(first >= ms(80) && first <= ms(120), "{first:?}");
        // 1000 more refused at once: 1001 waiting at 100 a second, 10 s.
        let mut last = Duration::ZERO;
        for _ in 0..1000 {
            last = refused(a.on_connection(next(), t0));
        }
        assert!(last >= ms(8000) && last <= ms(12_100), "{last:?}");
        let h = a.hint(Stage::Accept, t0);
        assert!(h >= ms(8000) && h <= ms(12_100), "{h:?}");
        // The refused demand fades: 20 s later the hint is short again.
        let later = a.hint(Stage::Accept, t0 + Duration::from_secs(20));
        assert!(later <= ms(300), "{later:?}");
    }

    #[test]
    fn the_open_files_headroom_refuses_near_the_limit() {
        let t0 = Instant::now();
        let a = Admission::with_seed(&config(|a| a.open_files_headroom = 64), 2, 7);
        let p = peer("192.0.2.1");
        assert_eq!(a.on_accept(p, t0, 1000 - 64, Some(1000)), Decision::Admit);
        let wait = refused(a.on_accept(p, t0, 1000 - 63, Some(1000)));
        assert!(wait >= ms(800) && wait <= ms(1200), "{wait:?}");
        // No limit known, or headroom 0: no check.
        assert_eq!(a.on_accept(p, t0, 5000, None), Decision::Admit);
        let off = Admission::with_seed(&config(|a| a.open_files_headroom = 0), 2, 7);
        assert_eq!(off.on_accept(p, t0, 1000, Some(1000)), Decision::Admit);
        // With connections closing at 10 a second, 10 over the line wait
        // about a second.
        let mut t = t0;
        for _ in 0..100 {
            t += ms(100);
            a.connection_closed(t);
        }
        let wait = refused(a.on_accept(p, t, 1000 - 54, Some(1000)));
        assert!(wait >= ms(800) && wait <= ms(1250), "{wait:?}");
        let h = a.hint(Stage::Connections, t);
        assert!(h >= ms(80) && h <= ms(125), "{h:?}");
    }

    #[test]
    fn tickets_put_returning_clients_first_and_early_ones_back() {
        let t0 = Instant::now();
        let a = Admission::with_seed(
            &config(|a| {
                a.max_concurrent_handshakes = Some(1);
                a.handshake_wait_ms = 0;
            }),
            2,
            7,
        );
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let StageDecision::Admit(held) = a.handshake(Some(ip), None, t0) else {
            panic!("a free place")
        };
        // 30 refused: the last one's slot is 30 slots (10 ms each, nothing
        // measured yet) away.
        let mut last = None;
        for _ in 0..30 {
            let StageDecision::Refuse(r) = a.handshake(Some(ip), None, t0) else {
                panic!("full")
            };
            last = Some(r);
        }
        let r = last.unwrap();
        assert!(r.retry_after >= ms(350), "{r:?}");
        assert_eq!(r.status, StatusCode::BadTcpServerTooBusy);
        let ticket = r.ticket.expect("a ticket").to_string();
        let reason = refusal_reason(&r);
        assert!(
            reason.contains(&format!("RetryTicket={ticket}")),
            "{reason}"
        );
        assert_eq!(
            ticket_in_url(&format!("opc.tcp://h:4840/x?a=1&RetryTicket={ticket}")),
            Some(ticket.as_str())
        );
        // Back far too early: a longer hint at once, the same ticket, and
        // no slot booked (the next refusal's hint did not grow).
        let hint_before = a.handshakes().hint(t0);
        let StageDecision::Refuse(early) = a.handshake(Some(ip), Some(&ticket), t0) else {
            panic!("early")
        };
        assert!(early.retry_after > r.retry_after, "{early:?} {r:?}");
        assert_eq!(early.ticket.map(|t| t.to_string()), Some(ticket.clone()));
        assert_eq!(a.handshakes().hint(t0), hint_before);
        // Back at its (moved) slot while the place is still taken: a ticket
        // holder waits for it even with no waiting room for the others.
        let back = t0 + early.retry_after;
        let StageDecision::Wait { waiting, .. } = a.handshake(Some(ip), Some(&ticket), back) else {
            panic!("a ticket holder waits")
        };
        assert!(matches!(
            a.handshake(Some(ip), None, back),
            StageDecision::Refuse(_)
        ));
        // Replayed: no priority.
        assert!(matches!(
            a.handshake(Some(ip), Some(&ticket), back),
            StageDecision::Refuse(_)
        ));
        // Forged: no priority either.
        assert!(matches!(
            a.handshake(Some(ip), Some("00"), back),
            StageDecision::Refuse(_)
        ));
        drop((held, waiting));
        let c = a.stage_counts(Stage::Handshake);
        assert_eq!(c.returns_at_hint, 1);
        assert_eq!(c.returns_admitted, 1);
        assert_eq!(c.waited, 1);
        assert_eq!(c.tickets.honoured, 1);
        assert_eq!(c.tickets.replayed, 1);
        assert_eq!(c.tickets.forged, 1);
        assert_eq!(c.tickets.early, 1);
        assert_eq!(a.stage_counts(Stage::Accept), StageCounts::default());
    }

    /// A Hello is refused exactly when a secured OpenSecureChannel coming
    /// now would be: acknowledged while the stage has room or its waiting
    /// room is short; refused with a slot and a ticket when full, the slot
    /// booked as the OpenSecureChannel's refusal would be; a ticket holder
    /// at its slot is acknowledged without using its ticket, which its
    /// OpenSecureChannel then presents; `refuse_at_hello = false`
    /// acknowledges every Hello.
    #[test]
    fn a_hello_is_refused_when_its_handshake_would_be() {
        let t0 = Instant::now();
        let full = |refuse_at_hello| {
            Admission::with_seed(
                &config(|a| {
                    a.max_concurrent_handshakes = Some(1);
                    a.handshake_wait_ms = 0;
                    a.refuse_at_hello = refuse_at_hello;
                }),
                2,
                7,
            )
        };
        let a = full(true);
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        assert!(a.hello(Some(ip), None, t0).is_none(), "room: acknowledged");
        let StageDecision::Admit(held) = a.handshake(Some(ip), None, t0) else {
            panic!("a free place")
        };
        let first = a.hello(Some(ip), None, t0).expect("full: refused");
        assert_eq!(first.status, StatusCode::BadTcpServerTooBusy);
        // Each Hello's refusal booked its slot: the later ones are later
        // (30 slots of 10 ms each, nothing measured yet).
        let mut r = first;
        for _ in 0..29 {
            r = a.hello(Some(ip), None, t0).expect("refused");
        }
        assert!(
            r.retry_after >= first.retry_after + ms(250),
            "{r:?} {first:?}"
        );
        let ticket = r.ticket.expect("a ticket").to_string();
        // Early with the ticket: refused, its own slot moved back.
        let early = a.hello(Some(ip), Some(&ticket), t0).expect("early");
        assert!(early.retry_after > r.retry_after, "{early:?}");
        // At its slot: acknowledged, the ticket still good for the
        // OpenSecureChannel, which waits for the place as a ticket holder.
        let back = t0 + early.retry_after;
        assert!(a.hello(Some(ip), Some(&ticket), back).is_none());
        assert!(
            a.hello(Some(ip), None, back).is_some(),
            "the others still refused"
        );
        let StageDecision::Wait { waiting, .. } = a.handshake(Some(ip), Some(&ticket), back) else {
            panic!("the ticket holder's OpenSecureChannel waits")
        };
        assert_eq!(a.stage_counts(Stage::Handshake).tickets.honoured, 1);
        drop((held, waiting));
        // Off: every Hello acknowledged, even with the stage full.
        let off = full(false);
        let StageDecision::Admit(held) = off.handshake(Some(ip), None, t0) else {
            panic!("a free place")
        };
        assert!(off.hello(Some(ip), None, t0).is_none());
        drop(held);
    }

    #[test]
    fn every_stage_has_a_hint_in_range() {
        let t0 = Instant::now();
        let a = Admission::with_seed(&ServerConfig::default(), 2, 7);
        for stage in [
            Stage::Accept,
            Stage::Handshake,
            Stage::Establishment,
            Stage::Connections,
        ] {
            let h = a.hint(stage, t0);
            assert!(
                h >= ms(80) && h <= Duration::from_secs(36),
                "{stage:?} {h:?}"
            );
        }
        assert_eq!(
            Decision::refuse(
                Refusal::new(StatusCode::BadTcpServerTooBusy, ms(5)),
                AcceptCheck::Rate
            ),
            Decision::Refuse {
                status: StatusCode::BadTcpServerTooBusy,
                retry_after: ms(5),
                by: AcceptCheck::Rate
            }
        );
    }
}
