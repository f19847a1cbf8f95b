//! Concurrency gates: OpenSecureChannel handshakes in flight
//! ([`HandshakeGate`]) and session establishment ([`EstablishmentGate`]),
//! each refusing with a [`Refusal`] when full. Plain data behind a mutex
//! (std, no runtime); the places are RAII guards, `Send + 'static`, so they
//! can travel with the work to another thread.

use std::collections::VecDeque;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

use super::address::{AddressKey, PerAddressCount};
use super::hint::{retry_after, CompletionRate, Jitter, Refusal};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent between statements; a panic elsewhere
    // while it was held leaves nothing half-done.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The concurrent OpenSecureChannel handshakes (`max_concurrent_handshakes`)
/// and the share one source address may hold
/// (`max_unfinished_handshakes_per_address`).
///
/// The network layer calls [`HandshakeGate::try_begin`] when a secured
/// OpenSecureChannel request (Issue or Renew) arrives, before anything is
/// decrypted, and moves the asymmetric work to the crypto workers with the
/// guard; "in flight" is waiting for a worker plus running. The guard is
/// finished ([`HandshakeGuard::finish`]) when the work completes, which
/// feeds the stage's completion rate (the hint); dropped without that, it
/// frees its place without a rate sample (the connection went away, the
/// work failed). Cloning gives another handle on the same gate.
#[derive(Debug, Clone)]
pub struct HandshakeGate {
    inner: Arc<HandshakeInner>,
}

#[derive(Debug)]
struct HandshakeInner {
    capacity: usize,
    per_address: u32,
    state: Mutex<HandshakeState>,
}

#[derive(Debug)]
struct HandshakeState {
    in_flight: usize,
    by_address: PerAddressCount,
    rate: CompletionRate,
    jitter: Jitter,
}

impl HandshakeGate {
    /// At most `capacity` handshakes in flight, `per_address` of them from
    /// one source address; `seed` seeds the hint's jitter.
    pub fn new(capacity: usize, per_address: u32, seed: u64) -> Self {
        HandshakeGate {
            inner: Arc::new(HandshakeInner {
                capacity,
                per_address,
                state: Mutex::new(HandshakeState {
                    in_flight: 0,
                    by_address: PerAddressCount::new(),
                    rate: CompletionRate::default(),
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

    /// Handshakes in flight now.
    pub fn in_flight(&self) -> usize {
        lock(&self.inner.state).in_flight
    }

    /// Handshakes in flight from `peer`'s address.
    pub fn in_flight_from(&self, peer: IpAddr) -> u32 {
        lock(&self.inner.state).by_address.get(AddressKey::of(peer))
    }

    /// A place for a handshake from `peer` at `now`, or a refusal
    /// (`BadTcpServerTooBusy` and the hint) when the gate or the address's
    /// share is full.
    pub fn try_begin(&self, peer: IpAddr, now: Instant) -> Result<HandshakeGuard, Refusal> {
        let key = AddressKey::of(peer);
        let mut s = lock(&self.inner.state);
        if s.in_flight >= self.inner.capacity || !s.by_address.try_add(key, self.inner.per_address)
        {
            return Err(Refusal {
                status: StatusCode::BadTcpServerTooBusy,
                retry_after: Self::hint_locked(&mut s, now),
            });
        }
        s.in_flight += 1;
        Ok(HandshakeGuard {
            inner: Some(Arc::clone(&self.inner)),
            key,
        })
    }

    /// The stage's hint at `now`: the handshakes in flight over their
    /// completion rate (docs/scalability.md).
    pub fn hint(&self, now: Instant) -> Duration {
        Self::hint_locked(&mut lock(&self.inner.state), now)
    }

    fn hint_locked(s: &mut HandshakeState, now: Instant) -> Duration {
        let rate = s.rate.per_second(now);
        retry_after(s.in_flight as f64, rate, &mut s.jitter)
    }

    /// Handshakes completed per second at `now`, when measured.
    pub fn completion_rate(&self, now: Instant) -> Option<f64> {
        lock(&self.inner.state).rate.per_second(now)
    }
}

/// A handshake's place in the [`HandshakeGate`]; `Send + 'static`.
#[derive(Debug)]
#[must_use = "dropping the guard frees the place at once"]
pub struct HandshakeGuard {
    inner: Option<Arc<HandshakeInner>>,
    key: AddressKey,
}

impl HandshakeGuard {
    /// The handshake's work completed at `now`: frees the place and feeds
    /// the completion rate.
    pub fn finish(mut self, now: Instant) {
        if let Some(inner) = self.inner.take() {
            let mut s = lock(&inner.state);
            s.rate.record(now);
            s.in_flight -= 1;
            s.by_address.remove(self.key);
        }
    }
}

impl Drop for HandshakeGuard {
    /// Frees the place without a rate sample.
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let mut s = lock(&inner.state);
            s.in_flight -= 1;
            s.by_address.remove(self.key);
        }
    }
}

/// Session establishment (`max_concurrent_session_establishment`, with a
/// waiting room of `session_establishment_queue_limit`).
///
/// Occupancy counts sessions created and not yet settled
/// ([`session_created`](Self::session_created) /
/// [`session_settled`](Self::session_settled)) plus establishment calls in
/// progress (an [`EstablishmentGuard`] each). The services take a guard
/// with [`try_enter`](Self::try_enter) (refuse at once) or
/// [`enter`](Self::enter) (wait in the room when it has space) before any
/// certificate check or signature of CreateSession - and of an
/// ActivateSession that moves a session to a new channel. The first
/// ActivateSession of a session counted by `session_created` is already
/// counted and must not be gated: refusing it would hold its place until
/// the activation deadline. A session settles when it is activated (a rate
/// sample: the stage's completions are activations) or closed or timed
/// out before that (no sample).
///
/// Places go to waiters first come, first served; a newcomer never
/// overtakes a waiter. Cloning gives another handle on the same gate.
#[derive(Debug, Clone)]
pub struct EstablishmentGate {
    inner: Arc<EstablishmentInner>,
}

#[derive(Debug)]
struct EstablishmentInner {
    capacity: usize,
    queue_limit: usize,
    state: Mutex<EstablishmentState>,
}

#[derive(Debug)]
struct EstablishmentState {
    /// Sessions created and not yet settled.
    created: usize,
    /// Guards out, including places handed to waiters not yet polled.
    in_progress: usize,
    /// Waiters without a place, first come first.
    waiting: VecDeque<(u64, Waker)>,
    /// Waiters given a place they have not collected yet.
    granted: Vec<u64>,
    next_id: u64,
    rate: CompletionRate,
    jitter: Jitter,
}

impl EstablishmentState {
    fn occupancy(&self) -> usize {
        self.created.saturating_add(self.in_progress)
    }

    /// Hands free places to waiters; the wakers to wake once unlocked.
    fn hand_over(&mut self, capacity: usize) -> Vec<Waker> {
        let mut wake = Vec::new();
        while self.occupancy() < capacity {
            let Some((id, waker)) = self.waiting.pop_front() else {
                break;
            };
            self.in_progress += 1;
            self.granted.push(id);
            wake.push(waker);
        }
        wake
    }

    fn hint(&mut self, now: Instant) -> Duration {
        let backlog = self.occupancy().saturating_add(self.waiting.len());
        let rate = self.rate.per_second(now);
        retry_after(backlog as f64, rate, &mut self.jitter)
    }

    fn refusal(&mut self, now: Instant) -> Refusal {
        Refusal {
            status: StatusCode::BadServerTooBusy,
            retry_after: self.hint(now),
        }
    }
}

fn wake_all(wakers: Vec<Waker>) {
    for w in wakers {
        w.wake();
    }
}

impl EstablishmentGate {
    /// At most `capacity` establishments at once, `queue_limit` waiting
    /// (0: refuse at once); `seed` seeds the hint's jitter.
    pub fn new(capacity: usize, queue_limit: usize, seed: u64) -> Self {
        EstablishmentGate {
            inner: Arc::new(EstablishmentInner {
                capacity,
                queue_limit,
                state: Mutex::new(EstablishmentState {
                    created: 0,
                    in_progress: 0,
                    waiting: VecDeque::new(),
                    granted: Vec::new(),
                    next_id: 0,
                    rate: CompletionRate::default(),
                    jitter: Jitter::new(seed),
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

    /// Establishments now: sessions created and not settled plus calls in
    /// progress.
    pub fn occupancy(&self) -> usize {
        lock(&self.inner.state).occupancy()
    }

    /// Calls waiting for a place.
    pub fn waiting(&self) -> usize {
        lock(&self.inner.state).waiting.len()
    }

    fn enter_now(&self, s: &mut EstablishmentState) -> Option<EstablishmentGuard> {
        if s.occupancy() < self.inner.capacity && s.waiting.is_empty() {
            s.in_progress += 1;
            return Some(EstablishmentGuard {
                inner: Arc::clone(&self.inner),
            });
        }
        None
    }

    /// A place at `now`, or at once a refusal (`BadServerTooBusy` and the
    /// hint) when none is free; never waits.
    pub fn try_enter(&self, now: Instant) -> Result<EstablishmentGuard, Refusal> {
        let mut s = lock(&self.inner.state);
        self.enter_now(&mut s).ok_or_else(|| s.refusal(now))
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
                s.rate.record(now);
            }
            s.hand_over(self.inner.capacity)
        };
        wake_all(wake);
    }

    /// The stage's hint at `now`: occupancy plus waiters over the
    /// activation rate (docs/scalability.md).
    pub fn hint(&self, now: Instant) -> Duration {
        lock(&self.inner.state).hint(now)
    }

    /// Sessions activated per second at `now`, when measured.
    pub fn completion_rate(&self, now: Instant) -> Option<f64> {
        lock(&self.inner.state).rate.per_second(now)
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

/// The future of [`EstablishmentGate::enter`].
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
                if let Some(guard) = this.gate.enter_now(&mut s) {
                    return Poll::Ready(Ok(guard));
                }
                if s.waiting.len() >= inner.queue_limit {
                    return Poll::Ready(Err(s.refusal(this.now)));
                }
                let id = s.next_id;
                s.next_id += 1;
                s.waiting.push_back((id, cx.waker().clone()));
                this.queued = Some(id);
                Poll::Pending
            }
            Some(id) => {
                if let Some(i) = s.granted.iter().position(|g| *g == id) {
                    s.granted.swap_remove(i);
                    this.queued = None;
                    // The place was counted when it was handed over.
                    return Poll::Ready(Ok(EstablishmentGuard {
                        inner: Arc::clone(inner),
                    }));
                }
                if let Some((_, w)) = s.waiting.iter_mut().find(|(w_id, _)| *w_id == id) {
                    if !w.will_wake(cx.waker()) {
                        *w = cx.waker().clone();
                    }
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
            if let Some(i) = s.granted.iter().position(|g| *g == id) {
                // Handed a place it will not use: pass it on.
                s.granted.swap_remove(i);
                s.in_progress -= 1;
                s.hand_over(inner.capacity)
            } else {
                s.waiting.retain(|(w_id, _)| *w_id != id);
                Vec::new()
            }
        };
        wake_all(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

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
        // No rate measured yet: the fallback, jittered.
        assert!(
            r.retry_after >= ms(800) && r.retry_after <= ms(1200),
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
        // 8 ahead at 20 a second: 400 ms, +-20 % jitter.
        for _ in 0..100 {
            let r = gate.try_begin(ip, t).unwrap_err();
            assert!(
                r.retry_after >= ms(300) && r.retry_after <= ms(500),
                "{r:?}"
            );
        }
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
        assert!(r.retry_after >= ms(800) && r.retry_after <= ms(1200));
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
        // 10 activations a second for 10 s.
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
        // 10 in progress and 10 waiting at 10 a second: 2 s.
        let h = gate.hint(t);
        assert!(h >= ms(1600) && h <= ms(2400), "{h:?}");
    }
}
