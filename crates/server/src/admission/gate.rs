//! Concurrency gates: OpenSecureChannel handshakes in flight
//! ([`HandshakeGate`]) and session establishment ([`EstablishmentGate`]).
//! Each has a waiting room ([`super::room`]) for requests that would wait
//! less than the stage's wait limit, ticket holders first, and a
//! [`SlotSchedule`] whose slots are the hints of the requests it refuses.
//! Plain data behind a mutex (std, no runtime); the places are RAII guards
//! and the waits runtime-free futures, `Send + 'static`, so they can
//! travel with the work to another thread.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

use super::address::{AddressKey, PerAddressCount};
use super::hint::Jitter;
use super::refusal::Refusal;
use super::room::{wake_all, Room};
use super::schedule::SlotSchedule;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent between statements; a panic elsewhere
    // while it was held leaves nothing half-done.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A ticket holder back at its slot may wait this many times the stage's
/// wait limit (at least [`PRIORITY_WAIT_MIN`]): it was promised the place.
pub const PRIORITY_WAIT_FACTOR: u32 = 4;

/// The least wait of a ticket holder back at its slot.
pub const PRIORITY_WAIT_MIN: Duration = Duration::from_secs(1);

/// What a gate decided on a request.
#[derive(Debug)]
pub enum Verdict<G, W> {
    /// A place now.
    Admit(G),
    /// A place within the wait limit: await `waiting` (which yields the
    /// place), giving up at `until` (then ask the gate's `timed_out` for
    /// the refusal).
    Wait {
        /// The future of the place.
        waiting: W,
        /// When the shell stops waiting.
        until: Instant,
    },
    /// No place within the wait limit: the client's promised slot (its
    /// hint is `slot - now`).
    Refuse {
        /// The slot booked for the client.
        slot: Instant,
    },
}

/// The wait a request of `priority` may make at a stage whose limit is
/// `limit`.
fn wait_limit(limit: Duration, priority: bool) -> Duration {
    if priority {
        (limit * PRIORITY_WAIT_FACTOR).max(PRIORITY_WAIT_MIN)
    } else {
        limit
    }
}

/// The concurrent OpenSecureChannel handshakes (`max_concurrent_handshakes`)
/// and the share one source address may hold
/// (`max_unfinished_handshakes_per_address`), with the waiting room of
/// `handshake_wait_ms`.
///
/// The network layer asks [`HandshakeGate::decide`] when a secured
/// OpenSecureChannel request (Issue or Renew) arrives, before anything is
/// decrypted, and moves the asymmetric work to the crypto workers with the
/// guard; "in flight" is waiting for a worker plus running. The guard is
/// finished ([`HandshakeGuard::finish`]) when the work completes, which
/// feeds the stage's service rate (the hint); dropped without that, it
/// frees its place without a sample (the connection went away, the work
/// failed). Cloning gives another handle on the same gate.
#[derive(Debug, Clone)]
pub struct HandshakeGate {
    inner: Arc<HandshakeInner>,
}

#[derive(Debug)]
struct HandshakeInner {
    capacity: usize,
    per_address: u32,
    wait: Duration,
    state: Mutex<HandshakeState>,
}

#[derive(Debug)]
struct HandshakeState {
    in_flight: usize,
    /// In flight and waiting, per address.
    by_address: PerAddressCount,
    room: Room,
    schedule: SlotSchedule,
    jitter: Jitter,
}

impl HandshakeState {
    fn ahead(&self, priority: bool) -> usize {
        self.in_flight + self.room.ahead_of(priority)
    }

    /// Whether a request (with `priority` or not) that finds every place
    /// taken at `now` may wait: its predicted wait is within the room's
    /// limit `wait` (its own for a ticket holder). The limit when so.
    fn may_wait(
        &self,
        cap: usize,
        wait: Duration,
        priority: bool,
        now: Instant,
    ) -> Option<Duration> {
        let rate = self.schedule.rate(now, self.in_flight, cap);
        let limit = wait_limit(wait, priority);
        (!limit.is_zero() && SlotSchedule::wait(self.ahead(priority), cap, rate) <= limit)
            .then_some(limit)
    }

    /// Hands free places to waiters; the wakers to wake once unlocked.
    fn hand_over(&mut self, capacity: usize) -> Vec<Option<std::task::Waker>> {
        let mut wake = Vec::new();
        while self.in_flight < capacity {
            let Some(w) = self.room.grant_next() else {
                break;
            };
            self.in_flight += 1;
            wake.push(w);
        }
        wake
    }
}

impl HandshakeGate {
    /// At most `capacity` handshakes in flight, `per_address` of them from
    /// one source address, no waiting; `seed` seeds the hint's jitter.
    pub fn new(capacity: usize, per_address: u32, seed: u64) -> Self {
        Self::with_wait(capacity, per_address, Duration::ZERO, seed)
    }

    /// [`HandshakeGate::new`] with a waiting room: a request waits for a
    /// place when it would wait at most `wait`.
    pub fn with_wait(capacity: usize, per_address: u32, wait: Duration, seed: u64) -> Self {
        HandshakeGate {
            inner: Arc::new(HandshakeInner {
                capacity,
                per_address,
                wait,
                state: Mutex::new(HandshakeState {
                    in_flight: 0,
                    by_address: PerAddressCount::new(),
                    room: Room::default(),
                    schedule: SlotSchedule::default(),
                    jitter: Jitter::new(seed),
                }),
            }),
        }
    }

    /// A gate that never refuses (admission disabled); it still counts.
    pub fn unlimited() -> Self {
        Self::new(usize::MAX, u32::MAX, 1)
    }

    /// The most handshakes in flight.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// The waiting room's limit (`handshake_wait_ms`).
    pub fn wait_limit(&self) -> Duration {
        self.inner.wait
    }

    /// Handshakes in flight now.
    pub fn in_flight(&self) -> usize {
        lock(&self.inner.state).in_flight
    }

    /// Handshakes waiting for a place now.
    pub fn waiting(&self) -> usize {
        lock(&self.inner.state).room.len()
    }

    /// Handshakes in flight or waiting from `peer`'s address.
    pub fn in_flight_from(&self, peer: IpAddr) -> u32 {
        lock(&self.inner.state).by_address.get(AddressKey::of(peer))
    }

    /// Decides on a handshake from `peer` at `now`; `priority` for a ticket
    /// holder back at its slot (it queues ahead of the others and may wait
    /// longer). Over the address's share or the wait limit: a slot is
    /// promised and booked.
    pub fn decide(
        &self,
        peer: IpAddr,
        priority: bool,
        now: Instant,
    ) -> Verdict<HandshakeGuard, HandshakeWait> {
        let key = AddressKey::of(peer);
        let cap = self.inner.capacity;
        let mut s = lock(&self.inner.state);
        let s = &mut *s;
        if !s.by_address.try_add(key, self.inner.per_address) {
            let ahead = s.ahead(false);
            let slot = s.schedule.promise(now, ahead, s.in_flight, cap);
            return Verdict::Refuse { slot };
        }
        if s.in_flight < cap && s.room.is_empty() {
            s.in_flight += 1;
            if s.in_flight == cap {
                s.schedule.note_full(now);
            }
            return Verdict::Admit(HandshakeGuard {
                inner: Some(Arc::clone(&self.inner)),
                key,
                since: Some(now),
            });
        }
        s.schedule.note_full(now);
        if let Some(limit) = s.may_wait(cap, self.inner.wait, priority, now) {
            let id = s.room.push(priority);
            return Verdict::Wait {
                waiting: HandshakeWait {
                    gate: self.clone(),
                    id: Some(id),
                    key,
                },
                until: now + limit * 2,
            };
        }
        s.by_address.remove(key);
        let ahead = s.ahead(priority);
        let slot = s.schedule.promise(now, ahead, s.in_flight, cap);
        Verdict::Refuse { slot }
    }

    /// Whether a handshake without priority that came at `now` would be
    /// refused ([`HandshakeGate::decide`]'s refusal for a full gate whose
    /// waiting room would keep it too long): the slot promised to it if
    /// so, booked as that refusal's would be; `None` if it would be
    /// admitted or wait. Takes no place and leaves no trace otherwise, so
    /// a connection can be refused at its Hello, before the client works
    /// on an OpenSecureChannel that would be refused.
    pub fn refuses_now(&self, now: Instant) -> Option<Instant> {
        let cap = self.inner.capacity;
        let mut s = lock(&self.inner.state);
        if s.in_flight < cap && s.room.is_empty() {
            return None;
        }
        if s.may_wait(cap, self.inner.wait, false, now).is_some() {
            return None;
        }
        let (ahead, in_flight) = (s.ahead(false), s.in_flight);
        Some(s.schedule.promise(now, ahead, in_flight, cap))
    }

    /// A wait given up at `now` (the shell's `until` passed): the slot
    /// promised instead.
    pub fn timed_out(&self, now: Instant) -> Instant {
        let mut s = lock(&self.inner.state);
        let ahead = s.ahead(false);
        let in_flight = s.in_flight;
        s.schedule
            .promise(now, ahead, in_flight, self.inner.capacity)
    }

    /// A place for a handshake from `peer` at `now`, or at once a refusal
    /// (`BadTcpServerTooBusy` and the hint, no ticket); never waits.
    pub fn try_begin(&self, peer: IpAddr, now: Instant) -> Result<HandshakeGuard, Refusal> {
        match self.decide(peer, false, now) {
            Verdict::Admit(g) => Ok(g),
            Verdict::Wait { waiting, .. } => {
                drop(waiting);
                Err(self.refusal(self.timed_out(now), now))
            }
            Verdict::Refuse { slot } => Err(self.refusal(slot, now)),
        }
    }

    fn refusal(&self, slot: Instant, now: Instant) -> Refusal {
        Refusal::new(
            StatusCode::BadTcpServerTooBusy,
            slot.saturating_duration_since(now),
        )
    }

    /// The stage's hint at `now`, without booking a slot: the time until
    /// the next slot a refusal would be promised (docs/scalability.md).
    pub fn hint(&self, now: Instant) -> Duration {
        let s = lock(&self.inner.state);
        s.schedule
            .next_slot(now, s.ahead(false), s.in_flight, self.inner.capacity)
            .saturating_duration_since(now)
    }

    /// The stage's hint at `now`, jittered (for refusals that promise no
    /// slot: the per-address count of unfinished connections at accept).
    pub fn jittered_hint(&self, now: Instant) -> Duration {
        let base = self.hint(now);
        let mut s = lock(&self.inner.state);
        super::hint::jittered(base, &mut s.jitter)
    }

    /// The estimated service rate at `now`, handshakes a second.
    pub fn service_rate(&self, now: Instant) -> f64 {
        let s = lock(&self.inner.state);
        s.schedule.rate(now, s.in_flight, self.inner.capacity)
    }

    /// Handshakes completed per second at `now`, when measured.
    pub fn completion_rate(&self, now: Instant) -> Option<f64> {
        let s = lock(&self.inner.state);
        s.schedule.measured_completions(now)
    }

    /// A ticket of this stage was honoured.
    pub fn ticket_returned(&self) {
        lock(&self.inner.state).schedule.returned();
    }

    /// `n` tickets of this stage expired unused.
    pub fn tickets_unused(&self, n: u64) {
        if n > 0 {
            lock(&self.inner.state).schedule.unused(n);
        }
    }
}

/// A handshake's place in the [`HandshakeGate`]; `Send + 'static`.
#[derive(Debug)]
#[must_use = "dropping the guard frees the place at once"]
pub struct HandshakeGuard {
    inner: Option<Arc<HandshakeInner>>,
    key: AddressKey,
    /// When it got its place (`None`: handed over by a drop, not known).
    since: Option<Instant>,
}

impl HandshakeGuard {
    /// The handshake's work completed at `now`: frees the place and feeds
    /// the service rate.
    pub fn finish(mut self, now: Instant) {
        if let Some(inner) = self.inner.take() {
            let wake = {
                let mut s = lock(&inner.state);
                match self.since {
                    Some(since) => s.schedule.completed(since, now),
                    None => s.schedule.completed_now(now),
                }
                s.in_flight -= 1;
                s.by_address.remove(self.key);
                s.hand_over(inner.capacity)
            };
            wake_all(wake);
        }
    }
}

impl Drop for HandshakeGuard {
    /// Frees the place without a rate sample.
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let wake = {
                let mut s = lock(&inner.state);
                s.in_flight -= 1;
                s.by_address.remove(self.key);
                s.hand_over(inner.capacity)
            };
            wake_all(wake);
        }
    }
}

/// A handshake waiting for a place ([`Verdict::Wait`]): a future yielding
/// the place, woken when one is handed to it; no runtime needed. Dropping
/// it gives up its turn (or the place it was just handed).
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct HandshakeWait {
    gate: HandshakeGate,
    id: Option<u64>,
    key: AddressKey,
}

impl Future for HandshakeWait {
    type Output = HandshakeGuard;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HandshakeGuard> {
        let this = self.get_mut();
        let Some(id) = this.id else {
            return Poll::Pending;
        };
        let inner = &this.gate.inner;
        if lock(&inner.state).room.poll(id, cx.waker()) {
            this.id = None;
            // Counted in flight when it was handed over.
            return Poll::Ready(HandshakeGuard {
                inner: Some(Arc::clone(inner)),
                key: this.key,
                since: None,
            });
        }
        Poll::Pending
    }
}

impl Drop for HandshakeWait {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let inner = &self.gate.inner;
        let wake = {
            let mut s = lock(&inner.state);
            s.by_address.remove(self.key);
            if s.room.leave(id) {
                // Handed a place it will not use: pass it on.
                s.in_flight -= 1;
                s.hand_over(inner.capacity)
            } else {
                Vec::new()
            }
        };
        wake_all(wake);
    }
}

/// Session establishment (`max_concurrent_session_establishment`, with a
/// waiting room of at most `session_establishment_queue_limit` requests
/// that would wait at most `establishment_wait_ms`).
///
/// Occupancy counts sessions created and not yet settled
/// ([`session_created`](Self::session_created) /
/// [`session_settled`](Self::session_settled)) plus establishment calls in
/// progress (an [`EstablishmentGuard`] each). The services take a guard
/// with [`decide`](Self::decide) (a place, a wait, or a promised slot),
/// [`try_enter`](Self::try_enter) (refuse at once) or
/// [`enter`](Self::enter) (wait when the room has space) before any
/// certificate check or signature of CreateSession - and of an
/// ActivateSession that moves a session to a new channel. The first
/// ActivateSession of a session counted by `session_created` is already
/// counted and must not be gated: refusing it would hold its place until
/// the activation deadline. A session settles when it is activated (a rate
/// sample: the stage's completions are activations) or closed or timed
/// out before that (no sample).
///
/// Places go to waiters ticket holders first, then first come, first
/// served; a newcomer never overtakes a waiter. Cloning gives another
/// handle on the same gate.
#[derive(Debug, Clone)]
pub struct EstablishmentGate {
    inner: Arc<EstablishmentInner>,
}

#[derive(Debug)]
struct EstablishmentInner {
    capacity: usize,
    queue_limit: usize,
    wait: Duration,
    state: Mutex<EstablishmentState>,
}

#[derive(Debug)]
struct EstablishmentState {
    /// Sessions created and not yet settled.
    created: usize,
    /// Guards out, including places handed to waiters not yet polled.
    in_progress: usize,
    room: Room,
    schedule: SlotSchedule,
}

impl EstablishmentState {
    fn occupancy(&self) -> usize {
        self.created.saturating_add(self.in_progress)
    }

    fn ahead(&self, priority: bool) -> usize {
        self.occupancy()
            .saturating_add(self.room.ahead_of(priority))
    }

    /// Hands free places to waiters; the wakers to wake once unlocked.
    fn hand_over(&mut self, capacity: usize) -> Vec<Option<std::task::Waker>> {
        let mut wake = Vec::new();
        while self.occupancy() < capacity {
            let Some(w) = self.room.grant_next() else {
                break;
            };
            self.in_progress += 1;
            wake.push(w);
        }
        wake
    }

    fn promise(&mut self, now: Instant, capacity: usize) -> Instant {
        let ahead = self.ahead(false);
        let occupancy = self.occupancy();
        self.schedule.promise(now, ahead, occupancy, capacity)
    }
}

impl EstablishmentGate {
    /// At most `capacity` establishments at once, `queue_limit` waiting
    /// (0: refuse at once) whatever their wait; `seed` is kept for the
    /// signature of the other gates (the hints are slots, not jittered).
    pub fn new(capacity: usize, queue_limit: usize, _seed: u64) -> Self {
        Self::with_wait(capacity, queue_limit, Duration::MAX)
    }

    /// At most `capacity` establishments at once, at most `queue_limit`
    /// waiting, each only when it would wait at most `wait`.
    pub fn with_wait(capacity: usize, queue_limit: usize, wait: Duration) -> Self {
        EstablishmentGate {
            inner: Arc::new(EstablishmentInner {
                capacity,
                queue_limit,
                wait,
                state: Mutex::new(EstablishmentState {
                    created: 0,
                    in_progress: 0,
                    room: Room::default(),
                    schedule: SlotSchedule::default(),
                }),
            }),
        }
    }

    /// A gate that never refuses (admission disabled); it still counts.
    pub fn unlimited() -> Self {
        Self::new(usize::MAX, 0, 1)
    }

    /// The most establishments at once.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// How many may wait for a place (0: none, refuse at once).
    pub fn queue_limit(&self) -> usize {
        self.inner.queue_limit
    }

    /// Establishments now: sessions created and not settled plus calls in
    /// progress.
    pub fn occupancy(&self) -> usize {
        lock(&self.inner.state).occupancy()
    }

    /// Calls waiting for a place.
    pub fn waiting(&self) -> usize {
        lock(&self.inner.state).room.len()
    }

    /// Whether the stage is contended: half its places or more taken, or
    /// anyone waiting. Per-address limits in front of it apply only then,
    /// so a host establishing sessions alone goes at the stage's pace.
    pub fn is_contended(&self) -> bool {
        let s = lock(&self.inner.state);
        !s.room.is_empty() || s.occupancy() >= self.inner.capacity.div_ceil(2)
    }

    fn guard(&self) -> EstablishmentGuard {
        EstablishmentGuard {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Decides on an establishment call at `now`; `priority` for a ticket
    /// holder back at its slot. Beyond the wait limit (or a full room): a
    /// slot is promised and booked.
    pub fn decide(&self, priority: bool, now: Instant) -> Verdict<EstablishmentGuard, Enter> {
        let cap = self.inner.capacity;
        let mut s = lock(&self.inner.state);
        if s.occupancy() < cap && s.room.is_empty() {
            s.in_progress += 1;
            if s.occupancy() == cap {
                s.schedule.note_full(now);
            }
            return Verdict::Admit(self.guard());
        }
        s.schedule.note_full(now);
        let ahead = s.ahead(priority);
        let rate = s.schedule.rate(now, s.occupancy(), cap);
        let wait = SlotSchedule::wait(ahead, cap, rate);
        let limit = wait_limit(self.inner.wait, priority);
        let room =
            s.room.len() < self.inner.queue_limit || (priority && self.inner.queue_limit > 0);
        if room && !limit.is_zero() && wait <= limit {
            let id = s.room.push(priority);
            return Verdict::Wait {
                waiting: Enter {
                    gate: self.clone(),
                    now,
                    queued: Some(id),
                },
                until: now
                    .checked_add(limit.saturating_mul(2))
                    .unwrap_or(now + wait * 2),
            };
        }
        Verdict::Refuse {
            slot: s.promise(now, cap),
        }
    }

    /// A wait given up at `now`: the slot promised instead.
    pub fn timed_out(&self, now: Instant) -> Instant {
        lock(&self.inner.state).promise(now, self.inner.capacity)
    }

    fn refusal(slot: Instant, now: Instant) -> Refusal {
        Refusal::new(
            StatusCode::BadServerTooBusy,
            slot.saturating_duration_since(now),
        )
    }

    /// A place at `now`, or at once a refusal (`BadServerTooBusy` and the
    /// hint) when none is free; never waits.
    pub fn try_enter(&self, now: Instant) -> Result<EstablishmentGuard, Refusal> {
        let cap = self.inner.capacity;
        let mut s = lock(&self.inner.state);
        if s.occupancy() < cap && s.room.is_empty() {
            s.in_progress += 1;
            if s.occupancy() == cap {
                s.schedule.note_full(now);
            }
            return Ok(self.guard());
        }
        Err(Self::refusal(s.promise(now, cap), now))
    }

    /// A place, waiting for one in the waiting room when none is free; a
    /// refusal (with the hint at `now`) when the room is full too. The
    /// future needs no runtime: it is woken when a place is handed to it.
    /// Dropping it gives up its turn (or the place it was just handed).
    pub fn enter(&self, now: Instant) -> Enter {
        Enter {
            gate: self.clone(),
            now,
            queued: None,
        }
    }

    /// A session was created (CreateSession succeeded): it holds a place
    /// until it settles.
    pub fn session_created(&self) {
        lock(&self.inner.state).created += 1;
    }

    /// A session created earlier settled at `now`: activated (a
    /// completion, sampled for the hint) or not (closed or timed out
    /// first). Its place goes to the first waiter.
    pub fn session_settled(&self, now: Instant, activated: bool) {
        let wake = {
            let mut s = lock(&self.inner.state);
            s.created = s.created.saturating_sub(1);
            if activated {
                s.schedule.completed_now(now);
            }
            s.hand_over(self.inner.capacity)
        };
        wake_all(wake);
    }

    /// The stage's hint at `now`, without booking a slot
    /// (docs/scalability.md).
    pub fn hint(&self, now: Instant) -> Duration {
        let s = lock(&self.inner.state);
        s.schedule
            .next_slot(now, s.ahead(false), s.occupancy(), self.inner.capacity)
            .saturating_duration_since(now)
    }

    /// Sessions activated per second at `now`, when measured.
    pub fn completion_rate(&self, now: Instant) -> Option<f64> {
        lock(&self.inner.state).schedule.measured_completions(now)
    }

    /// A ticket of this stage was honoured.
    pub fn ticket_returned(&self) {
        lock(&self.inner.state).schedule.returned();
    }

    /// `n` tickets of this stage expired unused.
    pub fn tickets_unused(&self, n: u64) {
        if n > 0 {
            lock(&self.inner.state).schedule.unused(n);
        }
    }

    /// The share of this stage's promised slots that are used, as
    /// estimated.
    pub fn returns(&self) -> f64 {
        lock(&self.inner.state).schedule.returns()
    }
}

/// An establishment call's place in the [`EstablishmentGate`], freed on
/// drop; `Send + 'static`.
#[derive(Debug)]
#[must_use = "dropping the guard frees the place at once"]
pub struct EstablishmentGuard {
    inner: Arc<EstablishmentInner>,
}

impl Drop for EstablishmentGuard {
    fn drop(&mut self) {
        let wake = {
            let mut s = lock(&self.inner.state);
            s.in_progress -= 1;
            s.hand_over(self.inner.capacity)
        };
        wake_all(wake);
    }
}

/// The future of [`EstablishmentGate::enter`] and of an establishment's
/// [`Verdict::Wait`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Enter {
    gate: EstablishmentGate,
    now: Instant,
    /// The waiter's id once it waits.
    queued: Option<u64>,
}

impl Future for Enter {
    type Output = Result<EstablishmentGuard, Refusal>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let inner = &this.gate.inner;
        let mut s = lock(&inner.state);
        match this.queued {
            None => {
                if s.occupancy() < inner.capacity && s.room.is_empty() {
                    s.in_progress += 1;
                    return Poll::Ready(Ok(this.gate.guard()));
                }
                if s.room.len() >= inner.queue_limit {
                    let slot = s.promise(this.now, inner.capacity);
                    return Poll::Ready(Err(EstablishmentGate::refusal(slot, this.now)));
                }
                let id = s.room.push(false);
                s.room.poll(id, cx.waker());
                this.queued = Some(id);
                Poll::Pending
            }
            Some(id) => {
                if s.room.poll(id, cx.waker()) {
                    this.queued = None;
                    // The place was counted when it was handed over.
                    return Poll::Ready(Ok(this.gate.guard()));
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        let Some(id) = self.queued.take() else {
            return;
        };
        let inner = &self.gate.inner;
        let wake = {
            let mut s = lock(&inner.state);
            if s.room.leave(id) {
                // Handed a place it will not use: pass it on.
                s.in_progress -= 1;
                s.hand_over(inner.capacity)
            } else {
                Vec::new()
            }
        };
        wake_all(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (Arc::clone(&c), Waker::from(c))
    }

    fn poll(f: &mut Enter, w: &Waker) -> Poll<Result<EstablishmentGuard, Refusal>> {
        Pin::new(f).poll(&mut Context::from_waker(w))
    }

    fn is_send_static<T: Send + 'static>() {}

    #[test]
    fn guards_and_futures_travel() {
        is_send_static::<HandshakeGuard>();
        is_send_static::<EstablishmentGuard>();
        is_send_static::<Enter>();
        is_send_static::<HandshakeGate>();
        is_send_static::<EstablishmentGate>();
    }

    #[test]
    fn handshakes_are_limited_overall_and_per_address() {
        let t0 = Instant::now();
        let gate = HandshakeGate::new(4, 2, 9);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let c: IpAddr = "::ffff:192.0.2.3".parse().unwrap();
        let a1 = gate.try_begin(a, t0).unwrap();
        let a2 = gate.try_begin(a, t0).unwrap();
        // A third from a is over its share, though the gate has room.
        let r = gate.try_begin(a, t0).unwrap_err();
        assert_eq!(r.status, StatusCode::BadTcpServerTooBusy);
        assert_eq!(gate.in_flight_from(a), 2);
        let b1 = gate.try_begin(b, t0).unwrap();
        let c1 = gate.try_begin(c, t0).unwrap();
        assert_eq!(gate.in_flight(), 4);
        let r = gate
            .try_begin("192.0.2.4".parse().unwrap(), t0)
            .unwrap_err();
        assert_eq!(r.status, StatusCode::BadTcpServerTooBusy);
        // No rate measured yet: places of 10 ms assumed, so the shortest
        // hint.
        // (the per-address refusal before it booked one slot, 2.5 ms).
        assert!(
            r.retry_after >= ms(100) && r.retry_after <= ms(105),
            "{r:?}"
        );
        // A finished handshake frees its place; so does a dropped one.
        a1.finish(t0 + ms(10));
        drop(c1);
        assert_eq!(gate.in_flight(), 2);
        assert_eq!(gate.in_flight_from(a), 1);
        let a3 = gate.try_begin(a, t0 + ms(10)).unwrap();
        let _d = gate
            .try_begin("192.0.2.4".parse().unwrap(), t0 + ms(10))
            .unwrap();
        drop((a2, a3, b1));
        assert_eq!(gate.in_flight_from(a), 0);
        assert_eq!(gate.in_flight(), 1);
    }

    #[test]
    fn the_handshake_hint_follows_the_completion_rate() {
        let t0 = Instant::now();
        let gate = HandshakeGate::new(8, 8, 3);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        // 20 handshakes a second complete (one every 50 ms), 8 in flight.
        let mut t = t0;
        let mut held: VecDeque<HandshakeGuard> = VecDeque::new();
        for _ in 0..8 {
            held.push_back(gate.try_begin(ip, t).unwrap());
        }
        for _ in 0..400 {
            t += ms(50);
            held.pop_front().unwrap().finish(t);
            held.push_back(gate.try_begin(ip, t).unwrap());
        }
        let rate = gate.completion_rate(t).unwrap();
        assert!((rate - 20.0).abs() < 1.0, "{rate}");
        // 8 in flight at 20 a second: the first refused gets the next
        // place, 50 ms away (the shortest hint, 100 ms); each later one a
        // slot 50 ms after the one before (every refused client is still
        // expected back).
        let mut hints = Vec::new();
        for _ in 0..20 {
            hints.push(gate.try_begin(ip, t).unwrap_err().retry_after);
        }
        assert_eq!(hints[0], ms(100));
        let step = hints[19] - hints[18];
        assert!(step >= ms(45) && step <= ms(55), "{hints:?}");
        // A dropped guard is no completion.
        let before = gate.completion_rate(t).unwrap();
        drop(held.pop_front());
        assert_eq!(gate.completion_rate(t), Some(before));
    }

    #[test]
    fn establishment_counts_created_sessions_and_calls() {
        let t0 = Instant::now();
        let gate = EstablishmentGate::new(3, 0, 5);
        let g1 = gate.try_enter(t0).unwrap();
        gate.session_created();
        drop(g1); // CreateSession done: the session holds the place
        let g2 = gate.try_enter(t0).unwrap();
        let g3 = gate.try_enter(t0).unwrap();
        assert_eq!(gate.occupancy(), 3);
        let r = gate.try_enter(t0).unwrap_err();
        assert_eq!(r.status, StatusCode::BadServerTooBusy);
        assert!(r.retry_after >= ms(100) && r.retry_after <= ms(1200));
        // Queue limit 0: enter refuses at once too.
        let (_, w) = waker();
        let mut f = gate.enter(t0);
        assert!(matches!(poll(&mut f, &w), Poll::Ready(Err(_))));
        // The session activates: its place frees and the rate starts.
        gate.session_settled(t0 + ms(100), true);
        let g4 = gate.try_enter(t0 + ms(100)).unwrap();
        drop((g2, g3, g4));
        assert_eq!(gate.occupancy(), 0);
        // A session timing out frees its place without a sample.
        gate.session_created();
        gate.session_settled(t0 + ms(200), false);
        assert_eq!(gate.occupancy(), 0);
        assert_eq!(gate.completion_rate(t0 + ms(200)), None);
        // Settling more than was created does not underflow.
        gate.session_settled(t0 + ms(300), false);
        assert_eq!(gate.occupancy(), 0);
    }

    #[test]
    fn the_waiting_room_serves_in_order_and_refuses_when_full() {
        let t0 = Instant::now();
        let gate = EstablishmentGate::new(1, 2, 5);
        let held = gate.try_enter(t0).unwrap();
        let (c1, w1) = waker();
        let (c2, w2) = waker();
        let (_, w3) = waker();
        let mut f1 = gate.enter(t0);
        let mut f2 = gate.enter(t0);
        let mut f3 = gate.enter(t0);
        assert!(poll(&mut f1, &w1).is_pending());
        assert!(poll(&mut f2, &w2).is_pending());
        assert_eq!(gate.waiting(), 2);
        // The room is full: the third is refused, with a hint.
        let Poll::Ready(Err(r)) = poll(&mut f3, &w3) else {
            panic!("a full room refuses")
        };
        assert_eq!(r.status, StatusCode::BadServerTooBusy);
        // A newcomer does not overtake the waiters.
        assert!(gate.try_enter(t0).is_err());
        // The place frees: the first waiter is woken and gets it.
        drop(held);
        assert_eq!(c1.0.load(Ordering::SeqCst), 1);
        assert_eq!(c2.0.load(Ordering::SeqCst), 0);
        assert!(poll(&mut f2, &w2).is_pending());
        let Poll::Ready(Ok(g1)) = poll(&mut f1, &w1) else {
            panic!("the first waiter has the place")
        };
        assert_eq!(gate.occupancy(), 1);
        // The second gives up after being handed the place: it goes on.
        let (c4, w4) = waker();
        let mut f4 = gate.enter(t0);
        assert!(poll(&mut f4, &w4).is_pending());
        drop(g1);
        assert_eq!(c2.0.load(Ordering::SeqCst), 1);
        drop(f2);
        assert_eq!(c4.0.load(Ordering::SeqCst), 1);
        let Poll::Ready(Ok(g4)) = poll(&mut f4, &w4) else {
            panic!("the place was passed on")
        };
        // A waiter that leaves before its turn just leaves.
        let (_, w5) = waker();
        let mut f5 = gate.enter(t0);
        assert!(poll(&mut f5, &w5).is_pending());
        drop(f5);
        assert_eq!(gate.waiting(), 0);
        drop(g4);
        assert_eq!(gate.occupancy(), 0);
        assert!(gate.try_enter(t0).is_ok());
    }

    #[test]
    fn the_establishment_hint_counts_the_waiters() {
        let t0 = Instant::now();
        let gate = EstablishmentGate::new(10, 10, 11);
        // Full for 10 s: 10 sessions created and not yet activated, one
        // activated every 100 ms and its place taken again at once (10 a
        // second, measured while saturated: the stage's capacity).
        let mut t = t0;
        let create = |t: Instant| {
            let g = gate.try_enter(t).unwrap();
            gate.session_created();
            drop(g);
        };
        for _ in 0..10 {
            create(t);
        }
        for _ in 0..100 {
            t += ms(100);
            gate.session_settled(t, true);
            create(t);
        }
        assert_eq!(gate.occupancy(), 10);
        let (_, w) = waker();
        let mut waiting: Vec<Enter> = (0..10).map(|_| gate.enter(t)).collect();
        for f in &mut waiting {
            assert!(poll(f, &w).is_pending());
        }
        // 10 places held and 10 waiting at 10 a second: a newcomer's
        // place is the 11th to free, 1.1 s away.
        let h = gate.hint(t);
        assert!(h >= ms(1050) && h <= ms(1150), "{h:?}");
    }

    /// The same stage measured while it had room (one session at a time,
    /// 10 a second: its demand): when it fills, that rate is not its
    /// capacity, and the hint does not come from it.
    #[test]
    fn a_rate_measured_with_room_is_not_the_capacity() {
        let t0 = Instant::now();
        let gate = EstablishmentGate::new(10, 10, 11);
        let mut t = t0;
        for _ in 0..100 {
            gate.session_created();
            t += ms(100);
            gate.session_settled(t, true);
        }
        let _held: Vec<_> = (0..10).map(|_| gate.try_enter(t).unwrap()).collect();
        let (_, w) = waker();
        let mut waiting: Vec<Enter> = (0..10).map(|_| gate.enter(t)).collect();
        for f in &mut waiting {
            assert!(poll(f, &w).is_pending());
        }
        // From the 10 a second it would be 1.1 s; from the assumed
        // service time (10 places of 10 ms) it is 11 ms.
        let h = gate.hint(t);
        assert!(h < ms(200), "{h:?}");
    }

    fn poll_wait(f: &mut HandshakeWait, w: &Waker) -> Poll<HandshakeGuard> {
        Pin::new(f).poll(&mut Context::from_waker(w))
    }

    #[test]
    fn a_short_wait_waits_and_a_long_one_is_refused_with_a_slot() {
        let t0 = Instant::now();
        // 2 places, a wait of at most 100 ms, 10 ms a handshake measured.
        let gate = HandshakeGate::with_wait(2, 64, ms(100), 1);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let mut t = t0;
        for _ in 0..50 {
            let g = match gate.decide(ip, false, t) {
                Verdict::Admit(g) => g,
                _ => panic!("room"),
            };
            t += ms(5);
            g.finish(t + ms(5));
        }
        let t = t + ms(5);
        let _a = gate.try_begin(ip, t).unwrap();
        let _b = gate.try_begin(ip, t).unwrap();
        // About 200 a second: up to ~20 may wait 100 ms.
        let mut waits = Vec::new();
        let slot = loop {
            match gate.decide(ip, false, t) {
                Verdict::Wait { waiting, until } => {
                    assert!(until > t);
                    waits.push(waiting);
                }
                Verdict::Refuse { slot } => break slot,
                Verdict::Admit(_) => panic!("full"),
            }
        };
        assert!((10..=30).contains(&waits.len()), "{}", waits.len());
        assert_eq!(gate.waiting(), waits.len());
        // Its slot is behind every waiter.
        assert!(slot - t >= ms(100), "{:?}", slot - t);
        // A ticket holder still gets in line, ahead of them.
        let Verdict::Wait {
            waiting: mut vip, ..
        } = gate.decide(ip, true, t)
        else {
            panic!("a ticket holder waits longer")
        };
        let (count, w) = waker();
        assert!(poll_wait(&mut vip, &w).is_pending());
        let (_, w0) = waker();
        assert!(poll_wait(&mut waits[0], &w0).is_pending());
        // A place frees: the ticket holder is woken and has it.
        drop(_a);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(poll_wait(&mut waits[0], &w0).is_pending());
        let Poll::Ready(g) = poll_wait(&mut vip, &w) else {
            panic!("the ticket holder has the place")
        };
        assert_eq!(gate.in_flight(), 2);
        // A waiter that leaves frees its address's count.
        let before = gate.in_flight_from(ip);
        drop(waits.pop());
        assert_eq!(gate.in_flight_from(ip), before - 1);
        drop(g);
        drop(waits);
        assert_eq!(gate.waiting(), 0);
        assert_eq!(gate.in_flight(), 1);
    }

    #[test]
    fn establishment_waits_within_its_limit() {
        let t0 = Instant::now();
        let gate = EstablishmentGate::with_wait(1, 8, ms(500));
        let _held = gate.try_enter(t0).unwrap();
        // Nothing measured: places of 10 ms, so up to 8 (the room) wait.
        let mut waiting = Vec::new();
        let refused = loop {
            match gate.decide(false, t0) {
                Verdict::Wait { waiting: w, .. } => waiting.push(w),
                Verdict::Refuse { slot } => break slot,
                Verdict::Admit(_) => panic!("full"),
            }
        };
        assert_eq!(waiting.len(), 8);
        assert!(refused > t0);
        // No wait limit at all: refused at once.
        let none = EstablishmentGate::with_wait(1, 8, Duration::ZERO);
        let _h = none.try_enter(t0).unwrap();
        assert!(matches!(none.decide(false, t0), Verdict::Refuse { .. }));
    }
}
