//! Request workers, the request queue and isolation (SCALABILITY.md §3-4;
//! `[requests]`).
//!
//! A decoded request becomes a [`Job`]. Workers are async tasks; a worker
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
//! decoded, classified ([`Scheduler::classify`]: its owner and
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
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

use crate::admission::hint::{retry_after, CompletionRate, Jitter, RATE_TIME_CONSTANT};
use crate::config::{IsolationProfile, RequestsSection};
use crate::context::ServiceContext;
use crate::dispatch::{Dispatched, Request};
use crate::session::SessionKey;
use queue::{Kind, Limits, Queue, Reason, Rejection, Stage};

const SEQ: Ordering = Ordering::SeqCst;
const RELAXED: Ordering = Ordering::Relaxed;

/// Who a request waits as: the session it belongs to, or the channel it
/// came on before a session exists (or when its token names none of this
/// channel's sessions).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// An activated session bound to the request's channel.
    Session(SessionKey),
    /// The secure channel.
    Channel(u32),
}

/// One request, ready to run on any worker.
#[derive(Debug)]
pub struct Job {
    /// Its context (state, channel, request id, clock, answer sink).
    pub ctx: ServiceContext,
    /// What is left to do.
    pub work: Work,
}

/// What a queued [`Job`] still has to do.
pub enum Work {
    /// Run the request's handler (it waited before it was dispatched).
    /// Boxed: a queue entry stays small.
    Request(Box<Request>),
    /// Drive the answer of a request already dispatched: an asynchronous
    /// node manager's future that found every worker busy.
    Answer {
        /// The request's requestHandle (what Cancel names it by).
        request_handle: u32,
        /// Produces the response message.
        future: crate::reply::BoxFuture<Vec<u8>>,
    },
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Request(r) => write!(f, "Work::Request({})", r.service_name()),
            Work::Answer { request_handle, .. } => {
                write!(f, "Work::Answer(handle {request_handle})")
            }
        }
    }
}

impl Job {
    /// A job that runs `request` in `ctx`.
    pub fn request(ctx: ServiceContext, request: Request) -> Job {
        Job {
            ctx,
            work: Work::Request(Box::new(request)),
        }
    }

    /// The requestHandle of the job's request.
    pub fn request_handle(&self) -> u32 {
        match &self.work {
            Work::Request(r) => r.header().request_handle,
            Work::Answer { request_handle, .. } => *request_handle,
        }
    }

    /// Runs the job under `slot` and sends its answer through the
    /// context's sink: now, from a task that holds the slot until an
    /// asynchronous node manager answers, or - a held Publish - when the
    /// subscription engine answers (the slot is then released at once, or
    /// kept until that answer without `decouple_held_publish_requests`).
    /// A job whose connection is gone is dropped unrun.
    pub fn run(mut self, slot: Slot) {
        let Some(sink) = self.ctx.sink.clone() else {
            return;
        };
        if !sink.is_open() {
            return;
        }
        let request_id = self.ctx.request_id;
        let request = match self.work {
            Work::Request(r) => *r,
            Work::Answer {
                request_handle,
                future,
            } => {
                sink.spawn_answer(request_id, request_handle, future, Some(slot));
                return;
            }
        };
        // It runs now, not when it arrived.
        let now = crate::state::clock();
        self.ctx.now = now.utc;
        self.ctx.instant = now.instant;
        let decoupled = self.ctx.state.scheduler.decoupled();
        match crate::dispatch::execute(&mut self.ctx, request) {
            Dispatched::Now(message) => {
                drop(slot);
                sink.send(request_id, message);
            }
            Dispatched::Later {
                request_handle,
                future,
                holds_worker,
            } => {
                let slot = if holds_worker {
                    Some(slot)
                } else {
                    drop(slot);
                    None
                };
                sink.spawn_answer(request_id, request_handle, future, slot);
            }
            Dispatched::Parked if !decoupled => sink.hold_until_answered(request_id, slot),
            Dispatched::Parked => drop(slot),
        }
    }
}

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

/// A slot taken by [`Scheduler::try_inline`] for a request the
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

/// A request the queue refused: why, the hint, and the job handed back.
#[derive(Debug)]
pub struct Refused {
    /// The stage and reason.
    pub rejection: Rejection,
    /// When the client may try again.
    pub retry_after: Duration,
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
    /// Idle workers wait here.
    work: tokio::sync::Notify,
    stopping: AtomicBool,
    /// Rejections by [`Stage`] x [`Reason`].
    rejections: [[AtomicU64; 4]; 5],
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
            work: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            rejections: Default::default(),
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

    /// A slot for a request the caller runs at once: only while nothing
    /// waits in the queue (so it overtakes no one) and a worker is free.
    pub fn try_inline(self: &Arc<Self>) -> Option<InlineSlot<'_>> {
        if self.has_waiting() {
            return None;
        }
        self.try_slot()
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
            self.work.notify_one();
        }
    }

    /// The owner of a request whose session the dispatcher resolved (an
    /// answer queued after dispatch), and its trust.
    pub fn owner_of(&self, ctx: &ServiceContext) -> (Owner, bool) {
        match &ctx.session {
            Some(s) => {
                let trusted = self.config.isolation_profile
                    == IsolationProfile::TrustedReservations
                    && ctx
                        .state
                        .sessions
                        .with_key(&s.key, |s| self.trusts(s))
                        .unwrap_or(false);
                (Owner::Session(s.key.clone()), trusted)
            }
            None => (Owner::Channel(ctx.channel_id), false),
        }
    }

    /// The owner, kind and trust of a request that is to wait (the session
    /// is looked up; only done under contention).
    pub fn classify(&self, ctx: &ServiceContext, request: &Request) -> (Owner, Kind, bool) {
        let token = &request.header().authentication_token;
        let key = SessionKey::of(token);
        let trusted_profile =
            self.config.isolation_profile == IsolationProfile::TrustedReservations;
        let found = if token.is_null() {
            None
        } else {
            ctx.state
                .sessions
                .with_key(&key, |s| {
                    let trusted = trusted_profile && self.trusts(s);
                    (s.channel_id, s.activated, trusted)
                })
                .ok()
        };
        let channel = ctx.channel_id;
        let on_this_channel = matches!(found, Some((c, _, _)) if c == channel);
        let kind = match request {
            Request::CreateSession(_) => Kind::Bootstrap,
            Request::ActivateSession(_) => match found {
                Some((c, true, _)) if c != channel => Kind::Reconnect,
                _ => Kind::Bootstrap,
            },
            Request::TransferSubscriptions(_) | Request::Republish(_) => Kind::Reconnect,
            Request::CloseSession(_)
            | Request::Cancel(_)
            | Request::DeleteSubscriptions(_)
            | Request::SetPublishingMode(_) => Kind::Control,
            _ => Kind::Normal,
        };
        match found {
            Some((_, _, trusted)) if on_this_channel => (Owner::Session(key), kind, trusted),
            _ => {
                let trusted = trusted_profile
                    && ctx
                        .channel
                        .remote_certificate
                        .as_ref()
                        .is_some_and(|c| self.trusts_thumbprint(&c.thumbprint()));
                (Owner::Channel(channel), kind, trusted)
            }
        }
    }

    fn trusts_thumbprint(&self, thumbprint: &[u8]) -> bool {
        let hex: String = thumbprint.iter().map(|b| format!("{b:02x}")).collect();
        self.trusted.iter().any(|t| t.eq_ignore_ascii_case(&hex))
    }

    /// True when `session`'s application URI, client certificate or user
    /// is among `trusted_owners`.
    fn trusts(&self, s: &crate::session::Session) -> bool {
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
            crate::identity::UserIdentity::X509 { thumbprint, .. } => {
                self.trusts_thumbprint(thumbprint)
            }
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
                Err((rejection, job)) => {
                    let backlog = inner.queue.len() as f64;
                    let rate = inner.taken.per_second(now);
                    let hint = retry_after(backlog, rate, &mut inner.jitter);
                    Err(Box::new(Refused {
                        rejection,
                        retry_after: hint,
                        job,
                    }))
                }
            }
        };
        match offered {
            Ok(stage) => {
                self.wake_or_grow();
                Ok(stage)
            }
            Err(refused) => {
                self.count_rejection(refused.rejection);
                Err(refused)
            }
        }
    }

    /// After a request was queued: a free worker is woken, or one more is
    /// started when every one is busy and the limit allows.
    fn wake_or_grow(self: &Arc<Self>) {
        if self.busy.load(SEQ) < self.workers.load(SEQ) {
            self.work.notify_one();
        } else if self.grow() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(Arc::clone(self).work());
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

    fn count_rejection(&self, r: Rejection) {
        self.rejections[r.stage as usize][r.reason as usize].fetch_add(1, RELAXED);
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
            self.work.notify_one();
        }
        Some((slot, job))
    }

    /// A worker: runs queued requests while there are any and a slot is
    /// free, then waits to be woken. Ends at [`Scheduler::stop`].
    pub async fn work(self: Arc<Self>) {
        let mut run = 0u32;
        loop {
            while let Some((slot, job)) = self.take(Instant::now()) {
                job.run(slot);
                run = run.wrapping_add(1);
                if run % 32 == 0 {
                    // Let the connections' tasks have the thread now and then.
                    tokio::task::yield_now().await;
                }
            }
            if self.stopping.load(SEQ) {
                return;
            }
            self.work.notified().await;
        }
    }

    /// Starts the `min_request_thread_count` workers on the current
    /// runtime.
    pub fn start(self: &Arc<Self>) {
        for _ in 0..self.workers.load(SEQ) {
            tokio::spawn(Arc::clone(self).work());
        }
    }

    /// Stops the workers (at shutdown) once their current request is done.
    pub fn stop(&self) {
        self.stopping.store(true, SEQ);
        self.work.notify_waiters();
    }

    /// A place in the parked stage for a held Publish, or the rejection.
    pub fn park(self: &Arc<Self>) -> Result<ParkedPlace, Rejection> {
        let limit = self.parked_limit;
        match self
            .parked
            .fetch_update(RELAXED, RELAXED, |n| (n < limit).then_some(n + 1))
        {
            Ok(_) => Ok(ParkedPlace {
                scheduler: Arc::clone(self),
            }),
            Err(_) => {
                let r = Rejection {
                    stage: Stage::Parked,
                    reason: Reason::Full,
                };
                self.count_rejection(r);
                Err(r)
            }
        }
    }

    /// The hint for a request refused by the parked stage: the held
    /// Publishes over the rate at which they were answered is unknown, so
    /// the fallback, jittered.
    pub fn parked_hint(&self) -> Duration {
        let mut inner = self.inner();
        crate::admission::hint::jittered(crate::admission::hint::HINT_FALLBACK, &mut inner.jitter)
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
                .remove_where(|_, job| job.ctx.channel_id == channel_id);
            self.waiting.fetch_sub(gone.len(), SEQ);
            gone
        };
        drop(gone);
    }

    /// Removes the waiting requests of channel `channel_id` with
    /// `request_handle` (a Cancel) and answers each
    /// `BadRequestCancelledByClient`; how many there were.
    pub fn cancel_queued(&self, channel_id: u32, request_handle: u32) -> u32 {
        if self.waiting.load(SEQ) == 0 {
            return 0;
        }
        let gone = {
            let mut inner = self.inner();
            let gone = inner.queue.remove_where(|_, job| {
                job.ctx.channel_id == channel_id && job.request_handle() == request_handle
            });
            self.waiting.fetch_sub(gone.len(), SEQ);
            gone
        };
        for job in &gone {
            if let Some(sink) = &job.ctx.sink {
                let fault = crate::dispatch::encoded_fault(
                    job.ctx.now,
                    request_handle,
                    StatusCode::BadRequestCancelledByClient,
                );
                sink.send(job.ctx.request_id, fault);
            }
        }
        u32::try_from(gone.len()).unwrap_or(u32::MAX)
    }

    /// Places taken in `stage` now.
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
            _ if l.isolation_profile.protects() => l.protected_entry_count,
            _ => 0,
        }
    }

    /// Requests refused by `stage` for `reason` so far.
    pub fn rejections(&self, stage: Stage, reason: Reason) -> u64 {
        self.rejections[stage as usize][reason as usize].load(RELAXED)
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
    use crate::reply::ResponseSink;
    use uascale_types::{encode_message, ReadRequest, RequestHeader};

    fn assert_send<T: Send + 'static>() {}

    /// A job can be queued and run on another task or thread.
    #[test]
    fn a_job_is_send() {
        assert_send::<Job>();
    }

    /// Answers collected in a vector.
    #[derive(Debug, Default)]
    struct Collect(Mutex<Vec<(u32, Vec<u8>)>>);

    impl ResponseSink for Collect {
        fn send(&self, request_id: u32, message: Vec<u8>) -> bool {
            self.0.lock().unwrap().push((request_id, message));
            true
        }
    }

    fn state(requests: RequestsSection) -> Arc<crate::state::ServerState> {
        crate::state::ServerState::empty(crate::ServerConfig {
            requests,
            ..Default::default()
        })
    }

    fn job(state: &Arc<crate::state::ServerState>, channel: u32, sink: &Arc<Collect>) -> Job {
        let mut ctx = ServiceContext::for_tests(Arc::clone(state), Instant::now());
        ctx.channel_id = channel;
        ctx.sink = Some(Arc::clone(sink) as Arc<dyn ResponseSink>);
        let mut msg = Vec::new();
        encode_message(
            &ReadRequest {
                request_header: RequestHeader {
                    request_handle: channel,
                    ..Default::default()
                },
                ..Default::default()
            },
            &mut msg,
        );
        let request = Request::decode(&msg, &Default::default()).unwrap();
        Job::request(ctx, request)
    }

    /// Workers: min at the start; a slot per worker; one more only when a
    /// request waits and all are busy, up to the maximum.
    #[test]
    fn workers_grow_only_under_contention_up_to_the_maximum() {
        let state = state(RequestsSection {
            min_request_thread_count: 2,
            max_request_thread_count: 3,
            ..Default::default()
        });
        let s = &state.scheduler;
        let sink = Arc::new(Collect::default());
        let now = Instant::now();
        assert_eq!(s.workers(), 2);
        let a = s.try_inline().expect("a free worker").into_owned();
        // Nothing waits and a worker is free: no growth.
        let b = s.try_inline().expect("the second").into_owned();
        assert!(s.try_inline().is_none(), "both busy");
        assert_eq!(s.workers(), 2);
        // A request waits and every worker is busy: one more.
        s.offer(
            Owner::Channel(1),
            Kind::Normal,
            false,
            10,
            job(&state, 1, &sink),
            now,
        )
        .unwrap();
        assert_eq!(s.workers(), 3);
        assert!(s.try_inline().is_none(), "something waits: no overtaking");
        let (c, job1) = s.take(now).expect("the new worker's slot");
        assert_eq!(s.waiting(), 0);
        s.offer(
            Owner::Channel(2),
            Kind::Normal,
            false,
            10,
            job(&state, 2, &sink),
            now,
        )
        .unwrap();
        assert_eq!(s.workers(), 3, "the maximum");
        assert!(s.take(now).is_none(), "no free slot");
        drop(a);
        let (d, job2) = s.take(now).expect("a slot freed");
        job1.run(c);
        job2.run(d);
        assert_eq!(sink.0.lock().unwrap().len(), 2, "both answered");
        drop(b);
        assert_eq!(s.busy(), 0);
        assert_eq!(s.queued_total(), 2);
    }

    /// A refused request is handed back with its stage, reason and hint,
    /// and counted.
    #[test]
    fn refusals_carry_a_hint_and_are_counted() {
        let state = state(RequestsSection {
            min_request_thread_count: 1,
            max_request_thread_count: 1,
            max_queued_request_count: 1,
            max_queued_requests_per_owner: 1000,
            isolation_profile: IsolationProfile::FairShare,
            ..Default::default()
        });
        let s = &state.scheduler;
        let sink = Arc::new(Collect::default());
        let now = Instant::now();
        let _busy = s.try_inline().unwrap();
        for _ in 0..100 {
            s.offer(
                Owner::Channel(1),
                Kind::Normal,
                false,
                1,
                job(&state, 1, &sink),
                now,
            )
            .expect("raised to 100 places");
        }
        let refused = s
            .offer(
                Owner::Channel(2),
                Kind::Control,
                false,
                1,
                job(&state, 2, &sink),
                now,
            )
            .unwrap_err();
        assert_eq!(refused.rejection.stage, Stage::Queue);
        assert_eq!(refused.rejection.reason, Reason::Full);
        assert!(refused.retry_after >= Duration::from_millis(80));
        assert_eq!(s.rejections(Stage::Queue, Reason::Full), 1);
        assert_eq!(s.usage(Stage::Queue), 100);
        // The connection closes: its requests go, and their places.
        s.forget_channel(1);
        assert_eq!(s.waiting(), 0);
        assert_eq!(s.usage(Stage::Queue), 0);
    }

    /// The parked stage: places up to its size, given back with the
    /// answer.
    #[test]
    fn the_parked_stage_is_bounded() {
        let state = state(RequestsSection {
            max_parked_request_count: Some(2),
            ..Default::default()
        });
        let s = &state.scheduler;
        let a = s.park().unwrap();
        let _b = s.park().unwrap();
        assert_eq!(
            s.park().unwrap_err(),
            Rejection {
                stage: Stage::Parked,
                reason: Reason::Full
            }
        );
        assert_eq!(s.usage(Stage::Parked), 2);
        drop(a);
        assert!(s.park().is_ok());
        assert_eq!(s.rejections(Stage::Parked, Reason::Full), 1);
    }

    /// Cancel reaches requests still waiting: each is answered
    /// BadRequestCancelledByClient and leaves the queue.
    #[test]
    fn cancel_removes_waiting_requests() {
        let state = state(RequestsSection {
            min_request_thread_count: 1,
            max_request_thread_count: 1,
            ..Default::default()
        });
        let s = &state.scheduler;
        let sink = Arc::new(Collect::default());
        let now = Instant::now();
        let _busy = s.try_inline().unwrap();
        for channel in [5, 5, 6] {
            s.offer(
                Owner::Channel(channel),
                Kind::Normal,
                false,
                1,
                job(&state, channel, &sink),
                now,
            )
            .unwrap();
        }
        assert_eq!(s.cancel_queued(5, 5), 2);
        assert_eq!(s.waiting(), 1);
        let answers = sink.0.lock().unwrap();
        assert_eq!(answers.len(), 2);
        let limits = Default::default();
        let m = uascale_types::decode_message(
            &mut uascale_types::Reader::new(&answers[0].1, &limits).unwrap(),
        )
        .unwrap();
        let f = m
            .as_any()
            .downcast_ref::<uascale_types::ServiceFault>()
            .expect("a fault");
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadRequestCancelledByClient
        );
    }
}
