//! Request workers, the request queue and isolation (docs/scalability.md §3-4;
//! `[requests]`).
//!
//! A decoded request becomes a job ([`crate::job::Job`], queued as a
//! [`Runnable`]; this module does not know the layers above it). Workers are async tasks; a worker
//! is a *slot* of execution, busy while it runs a request from the queue
//! or waits for a request's answer - an asynchronous node manager's, and,
//! with `decouple_held_publish_requests = false`, a held Publish's. There
//! are `min_request_thread_count` at the start and at most
//! `max_request_thread_count`; one is added only when a request is queued
//! and every worker is busy.
//!
//! What is fast stays fast: while nothing waits ([`Scheduler::has_waiting`],
//! one atomic load), the connection's task runs the request at once. What
//! completes there takes no worker (the runtime's threads bound it); an
//! answer that has to wait takes a worker's slot ([`Scheduler::try_slot`])
//! or, when every worker is busy, queues for one
//! ([`Scheduler::offer_started`]). Once anything waits, a new request is
//! decoded, classified ([`crate::job::classify`]: its owner and
//! [`queue::Kind`]) and offered to the [`queue::Queue`]
//! ([`Scheduler::offer`]), where workers take it in the profile's order. A
//! refused request is answered `BadServerTooBusy` with a RetryAfterMs
//! hint: the queue's backlog over the rate at which workers take from it.
//! In the legacy mode every request takes a slot before it runs (a held
//! Publish keeps it).
//!
//! A held Publish is counted in the parked stage ([`Scheduler::park`]) until
//! it is answered.

pub mod queue;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::admission::hint::{retry_after, CompletionRate, Jitter, RATE_TIME_CONSTANT};
use crate::config::{IsolationProfile, RequestsSection};
use crate::session::SessionKey;
use crate::shed::{Reason, Shed, Stage};
use queue::{Kind, Limits, Queue};

const SEQ: Ordering = Ordering::SeqCst;
const RELAXED: Ordering = Ordering::Relaxed;

/// Who a request waits as: the session it belongs to, or before a session
/// exists (or when its token names none of this channel's sessions) the
/// channel it came on - or, over a transport without a connection-long
/// channel (opc.https, where each such request gets a logical channel of
/// its own), its source address.
///
/// The queue keeps a lane only while its owner has requests waiting, so
/// however many addresses or channels there are, the lanes are at most the
/// queue's places.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The session the request's token names, bound to its channel.
    Session(SessionKey),
    /// The secure channel.
    Channel(u32),
    /// The source address (an IPv4 address or an IPv6 /64, as admission
    /// counts them) of a session-less opc.https request.
    Address(crate::admission::address::AddressKey),
}

/// Work a worker hands to the runtime: the rest of a request whose answer
/// has to wait (an asynchronous node manager's), run as a task of its own.
pub type Spawn = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// A request waiting for a worker, whatever it is (the server's is
/// [`crate::endpoint::Job`]): the queue keeps it without knowing the
/// layers above.
pub trait Runnable: Send + std::fmt::Debug {
    /// The secure channel it came on.
    fn channel_id(&self) -> u32;
    /// Its secure-channel request id.
    fn request_id(&self) -> u32;
    /// Runs it under `slot` (a worker's), which it releases when done, at
    /// `now`; what is left to run on the runtime, if anything.
    fn run(self: Box<Self>, slot: Slot, now: uascale_proto::Now) -> Option<Spawn>;
}

/// What the scheduler asks of the runtime its workers run on (the shell
/// implements it; the scheduler itself starts no task and waits on
/// nothing).
pub trait Workers: Send + Sync + std::fmt::Debug {
    /// Wakes one idle worker (or leaves a wake-up for the next to wait).
    fn wake_one(&self);
    /// Starts one more worker (every one is busy and the limit allows).
    fn add(&self);
    /// Wakes every worker (at shutdown).
    fn wake_all(&self);
}

/// A queued request.
pub type Job = Box<dyn Runnable>;

/// A busy worker slot; released when dropped.
#[derive(Debug)]
pub struct Slot {
    scheduler: Arc<Scheduler>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.scheduler.release();
    }
}

/// A slot taken by [`Scheduler::try_slot`] for a request the
/// connection's task runs itself: released when dropped, or turned into an
/// owned [`Slot`] when the request's answer outlives the call.
#[derive(Debug)]
pub struct InlineSlot<'a> {
    scheduler: &'a Arc<Scheduler>,
}

impl InlineSlot<'_> {
    /// The slot, owned (to move into the task that finishes the request).
    pub fn into_owned(self) -> Slot {
        let slot = Slot {
            scheduler: Arc::clone(self.scheduler),
        };
        std::mem::forget(self);
        slot
    }
}

impl Drop for InlineSlot<'_> {
    fn drop(&mut self) {
        self.scheduler.release();
    }
}

/// A place in the parked stage, given back when dropped (with the held
/// Publish's answer).
#[derive(Debug)]
pub struct ParkedPlace {
    scheduler: Arc<Scheduler>,
}

impl Drop for ParkedPlace {
    fn drop(&mut self) {
        self.scheduler.parked.fetch_sub(1, RELAXED);
    }
}

/// A request the queue refused: the refusal, and the job handed back.
#[derive(Debug)]
pub struct Refused {
    /// The stage, the reason and the hint.
    pub shed: Shed,
    /// The request.
    pub job: Job,
}

/// What the queue keeps under its lock.
#[derive(Debug)]
struct Inner {
    queue: Queue<Owner, Job>,
    /// The rate at which workers take requests from the queue.
    taken: CompletionRate,
    jitter: Jitter,
}

/// The request scheduler of one server (see the module documentation).
#[derive(Debug)]
pub struct Scheduler {
    config: RequestsSection,
    inner: Mutex<Inner>,
    /// Requests in the queue (all stages but parked): read without the lock
    /// by the inline path.
    waiting: AtomicUsize,
    /// Slots in use.
    busy: AtomicUsize,
    /// Workers started (slots).
    workers: AtomicUsize,
    /// Held Publishes now.
    parked: AtomicUsize,
    parked_limit: usize,
    /// The runtime's workers (set when the server starts; until then,
    /// as in a unit test, nothing is woken or started).
    runtime: std::sync::OnceLock<Arc<dyn Workers>>,
    stopping: AtomicBool,
    /// Requests that waited in the queue (were taken by a worker).
    queued_total: AtomicU64,
    /// Trusted owners, as configured (thumbprints lower-case).
    trusted: Vec<String>,
}

impl Scheduler {
    /// The scheduler of `config` (its `[requests]` section resolved).
    pub fn new(config: &crate::ServerConfig) -> Scheduler {
        let r = config.requests.resolved(
            config.server.max_session_count,
            config.subscriptions.max_publish_request_count,
        );
        let parked_limit = r.max_parked_request_count.unwrap_or(usize::MAX).max(1);
        let min = r.min_request_thread_count.max(1);
        Scheduler {
            inner: Mutex::new(Inner {
                queue: Queue::new(Limits::of(&r)),
                taken: CompletionRate::new(RATE_TIME_CONSTANT),
                jitter: Jitter::new(0x5eed_1234_abcd_0001),
            }),
            waiting: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            workers: AtomicUsize::new(min),
            parked: AtomicUsize::new(0),
            parked_limit,
            runtime: std::sync::OnceLock::new(),
            stopping: AtomicBool::new(false),
            queued_total: AtomicU64::new(0),
            trusted: r
                .trusted_owners
                .iter()
                .map(|t| t.trim().to_owned())
                .collect(),
            config: r,
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every change under this lock is completed before it is released.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The resolved `[requests]` section.
    pub fn config(&self) -> &RequestsSection {
        &self.config
    }

    /// True when held Publishes release their worker
    /// (`decouple_held_publish_requests`).
    pub fn decoupled(&self) -> bool {
        self.config.decouple_held_publish_requests
    }

    /// True while requests wait in the queue: a new request must then
    /// queue too (it would overtake them), whoever it belongs to. One
    /// atomic load: what the connection's task asks before it runs a
    /// request at once.
    pub fn has_waiting(&self) -> bool {
        self.waiting.load(SEQ) != 0
    }

    /// A free worker's slot, for a request the caller runs itself (or an
    /// answer it drives); `None` when every worker is busy.
    pub fn try_slot(self: &Arc<Self>) -> Option<InlineSlot<'_>> {
        // Built only when a slot was taken: its drop gives one back.
        self.acquire().then(|| InlineSlot { scheduler: self })
    }

    /// Queues the answer of a request already dispatched that found every
    /// worker busy (an asynchronous node manager's future), in its owner's
    /// lane. Never refused: its work has started, so refusing it could
    /// lose a Write a device already took. Few ever come here - once one
    /// waits, later requests queue before they are dispatched - so this
    /// can pass the queue's limit by at most the runtime's threads.
    pub fn offer_started(self: &Arc<Self>, owner: Owner, bytes: usize, job: Job) {
        {
            let mut inner = self.inner();
            inner.queue.push(owner, bytes, job);
            self.waiting.fetch_add(1, SEQ);
        }
        self.wake_or_grow();
    }

    /// Takes a free slot.
    fn acquire(&self) -> bool {
        let workers = self.workers.load(SEQ);
        self.busy
            .fetch_update(SEQ, SEQ, |b| (b < workers).then_some(b + 1))
            .is_ok()
    }

    /// Gives a slot back; a worker wakes if requests wait.
    fn release(&self) {
        self.busy.fetch_sub(1, SEQ);
        if self.waiting.load(SEQ) > 0 {
            self.wake_one();
        }
    }

    fn wake_one(&self) {
        if let Some(w) = self.runtime.get() {
            w.wake_one();
        }
    }

    /// True when the profile is `trusted_reservations` (only then is an
    /// owner's trust worth looking up).
    pub fn trusts_anyone(&self) -> bool {
        self.config.isolation_profile == IsolationProfile::TrustedReservations
            && !self.trusted.is_empty()
    }

    /// True when `thumbprint` (SHA-1) is among `trusted_owners`.
    pub fn trusts_thumbprint(&self, thumbprint: &[u8]) -> bool {
        let hex: String = thumbprint.iter().map(|b| format!("{b:02x}")).collect();
        self.trusted.iter().any(|t| t.eq_ignore_ascii_case(&hex))
    }

    /// True when `session`'s application URI, client certificate or user
    /// is among `trusted_owners`.
    pub fn trusts(&self, s: &crate::session::Session) -> bool {
        if self.trusted.is_empty() {
            return false;
        }
        let uri = s.client_uri.as_str().unwrap_or("");
        if !uri.is_empty() && self.trusted.iter().any(|t| t == uri) {
            return true;
        }
        if s.client_thumbprint
            .is_some_and(|t| self.trusts_thumbprint(&t))
        {
            return true;
        }
        match &s.user {
            crate::identity::UserIdentity::UserName(name) => self.trusted.iter().any(|t| t == name),
            crate::identity::UserIdentity::X509(x) => self.trusts_thumbprint(&x.thumbprint),
            crate::identity::UserIdentity::Anonymous => false,
        }
    }

    /// Offers a request that could not run at once (`bytes`: its encoded
    /// size). It waits - a worker is woken, or added when every one is busy
    /// and there are fewer than `max_request_thread_count` - or it is
    /// refused with the stage, the reason and a hint.
    pub fn offer(
        self: &Arc<Self>,
        owner: Owner,
        kind: Kind,
        trusted: bool,
        bytes: usize,
        job: Job,
        now: Instant,
    ) -> Result<Stage, Box<Refused>> {
        let offered = {
            let mut inner = self.inner();
            match inner.queue.offer(owner, kind, trusted, bytes, job) {
                Ok(stage) => {
                    self.waiting.fetch_add(1, SEQ);
                    Ok(stage)
                }
                Err(((stage, reason), job)) => {
                    let backlog = inner.queue.len() as f64;
                    let rate = inner.taken.per_second(now);
                    let hint = retry_after(backlog, rate, &mut inner.jitter);
                    Err(Box::new(Refused {
                        shed: Shed::new(stage, reason, hint),
                        job,
                    }))
                }
            }
        };
        if offered.is_ok() {
            self.wake_or_grow();
        }
        offered
    }

    /// After a request was queued: a free worker is woken, or one more is
    /// started when every one is busy and the limit allows.
    fn wake_or_grow(self: &Arc<Self>) {
        if self.busy.load(SEQ) < self.workers.load(SEQ) {
            self.wake_one();
        } else if self.grow() {
            match self.runtime.get() {
                Some(w) => w.add(),
                // No runtime to start it on: not counted.
                None => {
                    self.workers.fetch_sub(1, SEQ);
                }
            }
        }
    }

    /// Adds a worker if every one is busy and the limit allows.
    fn grow(&self) -> bool {
        let max = self.config.max_request_thread_count.max(1);
        let busy = self.busy.load(SEQ);
        self.workers
            .fetch_update(SEQ, SEQ, |w| (busy >= w && w < max).then_some(w + 1))
            .is_ok()
    }

    /// The next request for a free worker, with the slot it runs under.
    pub fn take(self: &Arc<Self>, now: Instant) -> Option<(Slot, Job)> {
        if self.waiting.load(SEQ) == 0 || !self.acquire() {
            return None;
        }
        let slot = Slot {
            scheduler: Arc::clone(self),
        };
        let next = {
            let mut inner = self.inner();
            let next = inner.queue.pop();
            if next.is_some() {
                self.waiting.fetch_sub(1, SEQ);
                inner.taken.record(now);
            }
            next
        };
        let (_, job) = next?;
        self.queued_total.fetch_add(1, RELAXED);
        // More waiting and more free slots: another worker joins.
        if self.waiting.load(SEQ) > 0 && self.busy.load(SEQ) < self.workers.load(SEQ) {
            self.wake_one();
        }
        Some((slot, job))
    }

    /// Connects the scheduler to the runtime that runs its workers (once;
    /// a second call is ignored) and returns how many to start:
    /// `min_request_thread_count`.
    pub fn start(&self, runtime: Arc<dyn Workers>) -> usize {
        let _ = self.runtime.set(runtime);
        self.workers.load(SEQ)
    }

    /// True once [`Scheduler::stop`] was called: a worker that finds
    /// nothing to take ends.
    pub fn stopping(&self) -> bool {
        self.stopping.load(SEQ)
    }

    /// Stops the workers (at shutdown) once their current request is done.
    pub fn stop(&self) {
        self.stopping.store(true, SEQ);
        if let Some(w) = self.runtime.get() {
            w.wake_all();
        }
    }

    /// A place in the parked stage for a held Publish, or the refusal
    /// (with the fallback hint: held Publishes are answered at no rate the
    /// server can measure ahead).
    pub fn park(self: &Arc<Self>) -> Result<ParkedPlace, Shed> {
        let limit = self.parked_limit;
        match self
            .parked
            .fetch_update(RELAXED, RELAXED, |n| (n < limit).then_some(n + 1))
        {
            Ok(_) => Ok(ParkedPlace {
                scheduler: Arc::clone(self),
            }),
            Err(_) => {
                let mut inner = self.inner();
                let hint = crate::admission::hint::jittered(
                    crate::admission::hint::HINT_FALLBACK,
                    &mut inner.jitter,
                );
                Err(Shed::new(Stage::Parked, Reason::Full, hint))
            }
        }
    }

    /// Removes the waiting requests of channel `channel_id` (its
    /// connection closed).
    pub fn forget_channel(&self, channel_id: u32) {
        if self.waiting.load(SEQ) == 0 {
            return;
        }
        let gone = {
            let mut inner = self.inner();
            let gone = inner
                .queue
                .remove_where(|_, job| job.channel_id() == channel_id);
            self.waiting.fetch_sub(gone.len(), SEQ);
            gone
        };
        drop(gone);
    }

    /// Removes the waiting requests of channel `channel_id` whose request
    /// ids are in `request_ids` (sorted), and hands them back.
    pub fn remove_queued(&self, channel_id: u32, request_ids: &[u32]) -> Vec<Job> {
        if self.waiting.load(SEQ) == 0 || request_ids.is_empty() {
            return Vec::new();
        }
        let mut inner = self.inner();
        let gone = inner.queue.remove_where(|_, job| {
            job.channel_id() == channel_id && request_ids.binary_search(&job.request_id()).is_ok()
        });
        self.waiting.fetch_sub(gone.len(), SEQ);
        gone
    }

    /// Places taken in `stage` now (0 for the admission stages).
    pub fn usage(&self, stage: Stage) -> usize {
        match stage {
            Stage::Parked => self.parked.load(RELAXED),
            s => self.inner().queue.usage(s),
        }
    }

    /// The size of `stage`.
    pub fn capacity(&self, stage: Stage) -> usize {
        let l = &self.config;
        match stage {
            Stage::Queue => l.max_queued_request_count,
            Stage::Parked => self.parked_limit,
            Stage::Bootstrap | Stage::Reconnect | Stage::Control
                if l.isolation_profile.protects() =>
            {
                l.protected_entry_count
            }
            _ => 0,
        }
    }

    /// Workers busy now.
    pub fn busy(&self) -> usize {
        self.busy.load(RELAXED)
    }

    /// Workers started.
    pub fn workers(&self) -> usize {
        self.workers.load(RELAXED)
    }

    /// Requests waiting now (all stages but parked).
    pub fn waiting(&self) -> usize {
        self.waiting.load(RELAXED)
    }

    /// Bytes of the requests waiting now.
    pub fn retained_bytes(&self) -> usize {
        self.inner().queue.bytes()
    }

    /// Requests that waited in the queue before a worker took them, so far.
    pub fn queued_total(&self) -> u64 {
        self.queued_total.load(RELAXED)
    }
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn assert_send<T: Send + 'static>() {}

    /// A job can be queued and run on another task or thread.
    #[test]
    fn a_job_is_send() {
        assert_send::<Job>();
    }

    /// What the dummy jobs did: (channel, "ran" or "cancelled").
    type Log = Arc<Mutex<Vec<(u32, &'static str)>>>;

    /// A job that logs what happened to it.
    #[derive(Debug)]
    struct Dummy {
        channel: u32,
        log: Log,
    }

    impl Runnable for Dummy {
        fn channel_id(&self) -> u32 {
            self.channel
        }
        fn request_id(&self) -> u32 {
            self.channel
        }
        fn run(self: Box<Self>, slot: Slot, _now: uascale_proto::Now) -> Option<Spawn> {
            drop(slot);
            self.log.lock().unwrap().push((self.channel, "ran"));
            None
        }
    }

    fn scheduler(requests: RequestsSection) -> Arc<Scheduler> {
        Arc::new(Scheduler::new(&crate::ServerConfig {
            requests,
            ..Default::default()
        }))
    }

    fn job(channel: u32, log: &Log) -> Job {
        Box::new(Dummy {
            channel,
            log: Arc::clone(log),
        })
    }

    /// Workers: min at the start; a slot per worker; one more only when a
    /// request waits and all are busy, up to the maximum.
    #[test]
    fn workers_grow_only_under_contention_up_to_the_maximum() {
        let s = scheduler(RequestsSection {
            min_request_thread_count: 2,
            max_request_thread_count: 3,
            ..Default::default()
        });
        let runtime = Arc::new(Runtime::default());
        assert_eq!(s.start(Arc::clone(&runtime) as Arc<dyn Workers>), 2);
        let log = Log::default();
        let now = Instant::now();
        assert_eq!(s.workers(), 2);
        let a = s.try_slot().expect("a free worker").into_owned();
        // Nothing waits and a worker is free: no growth.
        let b = s.try_slot().expect("the second").into_owned();
        assert!(s.try_slot().is_none(), "both busy");
        assert_eq!(s.busy(), 2, "a refused try takes nothing");
        assert_eq!(s.workers(), 2);
        // A request waits and every worker is busy: one more.
        s.offer(
            Owner::Channel(1),
            Kind::Normal,
            false,
            10,
            job(1, &log),
            now,
        )
        .unwrap();
        assert_eq!(s.workers(), 3);
        assert_eq!(runtime.added.load(SEQ), 1, "the runtime was asked for one");
        assert!(s.has_waiting());
        let (c, job1) = s.take(now).expect("the new worker's slot");
        assert_eq!(s.waiting(), 0);
        s.offer(
            Owner::Channel(2),
            Kind::Normal,
            false,
            10,
            job(2, &log),
            now,
        )
        .unwrap();
        assert_eq!(s.workers(), 3, "the maximum");
        assert!(s.take(now).is_none(), "no free slot");
        drop(a);
        let (d, job2) = s.take(now).expect("a slot freed");
        let at = uascale_proto::Now {
            instant: now,
            utc: uascale_types::DateTime::from_ticks(1),
        };
        job1.run(c, at);
        job2.run(d, at);
        assert_eq!(*log.lock().unwrap(), vec![(1, "ran"), (2, "ran")]);
        drop(b);
        assert_eq!(s.busy(), 0);
        assert_eq!(s.queued_total(), 2);
    }

    /// An answer whose work started is queued whatever the limits, and
    /// blocks later requests from running at once.
    #[test]
    fn a_started_answer_is_queued_past_the_limits() {
        let s = scheduler(RequestsSection {
            min_request_thread_count: 1,
            max_request_thread_count: 1,
            max_queued_request_count: 100,
            max_queued_requests_per_owner: 1,
            ..Default::default()
        });
        let log = Log::default();
        let _busy = s.try_slot().unwrap();
        s.offer(
            Owner::Channel(1),
            Kind::Normal,
            false,
            1,
            job(1, &log),
            Instant::now(),
        )
        .unwrap();
        s.offer_started(Owner::Channel(1), 1, job(1, &log));
        assert_eq!(s.waiting(), 2, "past the owner's limit of 1");
        assert!(s.has_waiting());
    }

    /// A refused request is handed back with its stage, reason and hint,
    /// and counted; a closed connection's requests leave the queue.
    #[test]
    fn refusals_carry_a_hint_and_are_counted() {
        let s = scheduler(RequestsSection {
            min_request_thread_count: 1,
            max_request_thread_count: 1,
            max_queued_request_count: 1,
            max_queued_requests_per_owner: 1000,
            isolation_profile: IsolationProfile::FairShare,
            ..Default::default()
        });
        let log = Log::default();
        let now = Instant::now();
        let _busy = s.try_slot().unwrap();
        for _ in 0..100 {
            s.offer(Owner::Channel(1), Kind::Normal, false, 1, job(1, &log), now)
                .expect("raised to 100 places");
        }
        let refused = s
            .offer(
                Owner::Channel(2),
                Kind::Control,
                false,
                1,
                job(2, &log),
                now,
            )
            .unwrap_err();
        assert_eq!(refused.shed.stage, Stage::Queue);
        assert_eq!(refused.shed.reason, Reason::Full);
        assert!(refused.shed.retry_after >= Duration::from_millis(80));
        assert_eq!(s.usage(Stage::Queue), 100);
        // Dummy jobs have request id = channel.
        drop(s.remove_queued(1, &[1]));
        assert_eq!(s.waiting(), 0);
        assert_eq!(s.usage(Stage::Queue), 0);
        assert!(log.lock().unwrap().is_empty(), "dropped, not run");
    }

    /// The parked stage: places up to its size, given back with the
    /// answer.
    #[test]
    fn the_parked_stage_is_bounded() {
        let s = scheduler(RequestsSection {
            max_parked_request_count: Some(2),
            ..Default::default()
        });
        let a = s.park().unwrap();
        let _b = s.park().unwrap();
        let shed = s.park().unwrap_err();
        assert_eq!((shed.stage, shed.reason), (Stage::Parked, Reason::Full));
        assert!(shed.retry_after > Duration::ZERO);
        assert_eq!(s.usage(Stage::Parked), 2);
        drop(a);
        assert!(s.park().is_ok());
    }

    /// Requests still waiting can be taken out by channel and request id
    /// (what Cancel and a channel's teardown do through the endpoint).
    #[test]
    fn queued_requests_are_removed_by_channel_and_id() {
        let s = scheduler(RequestsSection {
            min_request_thread_count: 1,
            max_request_thread_count: 1,
            ..Default::default()
        });
        let log = Log::default();
        let now = Instant::now();
        let _busy = s.try_slot().unwrap();
        for channel in [5, 5, 6] {
            s.offer(
                Owner::Channel(channel),
                Kind::Normal,
                false,
                1,
                job(channel, &log),
                now,
            )
            .unwrap();
        }
        assert_eq!(s.remove_queued(5, &[5]).len(), 2);
        assert_eq!(s.remove_queued(6, &[7]).len(), 0);
        assert_eq!(s.waiting(), 1);
        assert!(log.lock().unwrap().is_empty(), "handed back, not run");
    }

    /// A runtime that counts what it was asked.
    #[derive(Debug, Default)]
    struct Runtime {
        added: AtomicUsize,
    }

    impl Workers for Runtime {
        fn wake_one(&self) {}
        fn add(&self) {
            self.added.fetch_add(1, SEQ);
        }
        fn wake_all(&self) {}
    }
}
