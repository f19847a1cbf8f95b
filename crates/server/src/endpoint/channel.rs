//! What the server keeps per connection beside the protocol state: the
//! answers produced away from the connection's task, the one table of its
//! outstanding requests, and the counts admission reads (activated
//! sessions, an unfinished handshake). Shared (`Arc`) by the connection's
//! task, the workers and the responders of parked Publishes; no runtime:
//! the task waits on [`Channel::poll_ready`].

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use uascale_types::{DateTime, StatusCode};

use crate::reply::ResponseSink;
use crate::scheduler::{Scheduler, Slot};

/// Wakes the one task that waits on it; a wake-up given while the task is
/// not waiting is kept for its next wait (one permit), so none is lost.
/// What tokio's `Notify` does for one waiter, without a runtime, and with
/// 8 bytes of state in the waiting task instead of the 64 of a `Notified`
/// (that state is multiplied by the connection count).
#[derive(Default)]
pub struct Wakeup {
    permit: AtomicBool,
    waker: futures_util::task::AtomicWaker,
}

impl Wakeup {
    /// Wakes the waiting task, or leaves the permit for its next wait.
    pub fn notify_one(&self) {
        self.permit.store(true, Ordering::Release);
        // Takes the waker: a finished task's is not held on to.
        self.waker.wake();
    }

    /// Ready once a wake-up was given since the last ready (taking it).
    pub fn poll_wait(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.permit.swap(false, Ordering::AcqRel) {
            return std::task::Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // A wake-up given before the waker was registered found none; its
        // permit is seen here.
        if self.permit.swap(false, Ordering::AcqRel) {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    }
}

/// An outstanding request of a channel: one that was neither answered at
/// once nor parked with the subscription engine.
#[derive(Debug)]
struct Outstanding {
    request_id: u32,
    request_handle: u32,
    pending: Pending,
}

/// Where an outstanding request is.
#[derive(Debug)]
enum Pending {
    /// Waiting in the request queue for a worker.
    Queued,
    /// Answered by a running task (an asynchronous node manager); aborted
    /// by Cancel or the channel's teardown.
    Running(futures_util::future::AbortHandle),
    /// Answered later by the subscription engine, keeping a worker's slot
    /// until then (a held Publish without
    /// `decouple_held_publish_requests`).
    Held(Slot),
}

/// The status and reason of the ERR a connection is to close with.
pub type CloseWith = (StatusCode, String);

#[derive(Debug, Default)]
struct Answers {
    queue: Vec<(u32, Vec<u8>)>,
    /// Set at teardown: later answers are refused.
    closed: bool,
    /// Set when the connection is to close (the server shuts down, or
    /// admission evicts it). Boxed: set once at most, and inline it took
    /// 24 bytes more in every connection's record.
    close: Option<Box<CloseWith>>,
}

/// One connection's record (see the module documentation). Its size is
/// multiplied by the connection count: a test keeps it small.
#[derive(Default)]
pub struct Channel {
    /// The secure channel id (queued requests are found by it).
    id: u32,
    answers: Mutex<Answers>,
    ready: Wakeup,
    outstanding: Mutex<Vec<Outstanding>>,
    /// Entries of `outstanding`: read without the lock on the paths that
    /// usually find none.
    outstanding_count: AtomicU32,
    /// Activated sessions bound to this channel (kept from the session
    /// events); while there is one, the connection may use the whole
    /// reassembly budget.
    pub(crate) activated_sessions: AtomicU32,
    /// Set when the secure channel opened (the `channels_open` gauge).
    pub(crate) channel_open: AtomicBool,
    /// Set while the connection counts as an unfinished handshake of its
    /// source address (no activated session yet).
    pub(crate) unfinished: AtomicBool,
    /// The local address the connection arrived on (endpoint URLs name it
    /// to a client that connected with it).
    pub(crate) local: Option<std::net::IpAddr>,
    /// The peer's address (the per-address stages of admission).
    pub(crate) peer: Option<std::net::IpAddr>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field(
                "activated_sessions",
                &self.activated_sessions.load(Ordering::Relaxed),
            )
            .field(
                "outstanding",
                &self.outstanding_count.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing is left half-done under these locks (a push, a removal, a
    // take): a poisoned one is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channel {
    /// The record of channel `id`, a connection from `peer` on the local
    /// address `local`.
    pub fn new(id: u32, peer: Option<std::net::IpAddr>, local: Option<std::net::IpAddr>) -> Self {
        Channel {
            id,
            peer,
            local,
            ..Default::default()
        }
    }

    /// Ready when answers or a close are waiting for the connection's task
    /// (or the activated-session count moved).
    pub fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.ready.poll_wait(cx)
    }

    /// Everything answered so far, in order, and the ERR to close with, if
    /// the connection is to close.
    pub fn take(&self) -> (Vec<(u32, Vec<u8>)>, Option<CloseWith>) {
        let mut a = lock(&self.answers);
        (std::mem::take(&mut a.queue), a.close.take().map(|c| *c))
    }

    /// Tells the connection's task to close with an ERR of `status`.
    pub fn close_with(&self, status: StatusCode, reason: String) {
        lock(&self.answers)
            .close
            .get_or_insert_with(|| Box::new((status, reason)));
        self.ready.notify_one();
    }

    /// True while the channel carries an activated session.
    pub fn has_activated_session(&self) -> bool {
        self.activated_sessions.load(Ordering::Relaxed) > 0
    }

    /// Counts a session transition that concerns this channel (the task
    /// applies the count when it wakes).
    pub(crate) fn session_moved(&self, up: bool) {
        if up {
            self.activated_sessions.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ =
                self.activated_sessions
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        self.ready.notify_one();
    }

    fn outstanding(&self) -> MutexGuard<'_, Vec<Outstanding>> {
        lock(&self.outstanding)
    }

    fn add(&self, request_id: u32, request_handle: u32, pending: Pending) {
        if lock(&self.answers).closed {
            return;
        }
        self.outstanding().push(Outstanding {
            request_id,
            request_handle,
            pending,
        });
        self.outstanding_count.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes `request_id` out of the table; true when it was there (then
    /// whoever took it answers it).
    fn remove(&self, request_id: u32) -> bool {
        if self.outstanding_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let gone = {
            let mut all = self.outstanding();
            let at = all.iter().position(|o| o.request_id == request_id);
            at.map(|i| all.swap_remove(i))
        };
        if gone.is_some() {
            self.outstanding_count.fetch_sub(1, Ordering::AcqRel);
        }
        gone.is_some()
    }

    /// `request_id` waits in the request queue.
    pub(crate) fn queued(&self, request_id: u32, request_handle: u32) {
        self.add(request_id, request_handle, Pending::Queued);
    }

    /// A worker took `request_id` from the queue: false when it is no
    /// longer outstanding (cancelled, or the channel is gone) and must not
    /// run.
    pub(crate) fn started(&self, request_id: u32) -> bool {
        self.remove(request_id)
    }

    /// `request_id` is answered by a running task, abortable with `abort`.
    pub(crate) fn running(
        &self,
        request_id: u32,
        request_handle: u32,
        abort: futures_util::future::AbortHandle,
    ) {
        self.add(request_id, request_handle, Pending::Running(abort));
    }

    /// The task answering `request_id` is done: true when its answer is to
    /// be sent (no Cancel came first).
    pub(crate) fn finished(&self, request_id: u32) -> bool {
        self.remove(request_id)
    }

    /// Keeps `slot` busy until `request_id` is answered.
    pub(crate) fn hold(&self, request_id: u32, request_handle: u32, slot: Slot) {
        self.add(request_id, request_handle, Pending::Held(slot));
    }

    /// Cancels the outstanding requests named `request_handle`: those
    /// waiting in `scheduler`'s queue leave it, running ones are aborted;
    /// each is answered `BadRequestCancelledByClient` at `now`. A held
    /// Publish is the subscription engine's to answer and stays. How many
    /// were cancelled.
    pub(crate) fn cancel(&self, scheduler: &Scheduler, request_handle: u32, now: DateTime) -> u32 {
        if self.outstanding_count.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let (queued, running) = {
            let mut all = self.outstanding();
            let mut queued = Vec::new();
            let mut running = Vec::new();
            all.retain_mut(|o| {
                if o.request_handle != request_handle {
                    return true;
                }
                match &o.pending {
                    Pending::Queued => queued.push(o.request_id),
                    Pending::Running(abort) => {
                        abort.abort();
                        running.push(o.request_id);
                    }
                    Pending::Held(_) => return true,
                }
                false
            });
            let n = queued.len() + running.len();
            self.outstanding_count
                .fetch_sub(u32::try_from(n).unwrap_or(u32::MAX), Ordering::AcqRel);
            (queued, running)
        };
        let mut ids = queued;
        ids.sort_unstable();
        // The jobs are dropped unrun.
        drop(scheduler.remove_queued(self.id, &ids));
        ids.extend(running);
        for &request_id in &ids {
            let fault = crate::dispatch::encoded_fault(
                now,
                request_handle,
                StatusCode::BadRequestCancelledByClient,
            );
            self.push_answer(request_id, fault);
        }
        u32::try_from(ids.len()).unwrap_or(u32::MAX)
    }

    /// Refuses further answers and drops every outstanding request: queued
    /// ones leave `scheduler`'s queue, running ones are aborted, held slots
    /// are given back.
    pub(crate) fn close(&self, scheduler: &Scheduler) {
        {
            let mut a = lock(&self.answers);
            a.closed = true;
            a.queue = Vec::new();
        }
        if self.outstanding_count.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        let all = std::mem::take(&mut *self.outstanding());
        let mut queued: Vec<u32> = Vec::new();
        for o in all {
            match o.pending {
                Pending::Queued => queued.push(o.request_id),
                Pending::Running(abort) => abort.abort(),
                Pending::Held(slot) => drop(slot),
            }
        }
        queued.sort_unstable();
        drop(scheduler.remove_queued(self.id, &queued));
    }

    fn push_answer(&self, request_id: u32, message: Vec<u8>) -> bool {
        {
            let mut a = lock(&self.answers);
            if a.closed {
                return false;
            }
            a.queue.push((request_id, message));
        }
        // Stores a permit when the task is not waiting: no wake-up is lost.
        self.ready.notify_one();
        true
    }

    /// The secure channel id.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl ResponseSink for Channel {
    fn send(&self, request_id: u32, message: Vec<u8>) -> bool {
        // A held slot is given back with the answer.
        if self.outstanding_count.load(Ordering::Acquire) > 0 {
            let held = {
                let mut all = self.outstanding();
                let at = all.iter().position(|o| {
                    o.request_id == request_id && matches!(o.pending, Pending::Held(_))
                });
                at.map(|i| all.swap_remove(i))
            };
            if held.is_some() {
                self.outstanding_count.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.push_answer(request_id, message)
    }

    fn is_open(&self) -> bool {
        !lock(&self.answers).closed
    }

    fn cancel(&self, scheduler: &Scheduler, request_handle: u32, now: DateTime) -> u32 {
        Channel::cancel(self, scheduler, request_handle, now)
    }
}

/// Shared by the connection's task and everyone who answers on it.
pub type ChannelRef = Arc<Channel>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection's wake-up keeps a wake given while nobody waits (one
    /// permit, not a count), wakes a registered waiter, and holds no waker
    /// after waking it.
    #[test]
    fn a_wakeup_is_never_lost() {
        use std::sync::atomic::AtomicUsize;
        use std::task::{Context, Poll, Wake, Waker};
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let w = Wakeup::default();
        assert_eq!(w.poll_wait(&mut cx), Poll::Pending);
        w.notify_one();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(w.waker.take().is_none(), "the waker is held after waking");
        assert_eq!(w.poll_wait(&mut cx), Poll::Ready(()));
        assert_eq!(w.poll_wait(&mut cx), Poll::Pending);
        // Given twice while nobody waits: one permit.
        w.notify_one();
        w.notify_one();
        assert_eq!(w.poll_wait(&mut cx), Poll::Ready(()));
        assert_eq!(w.poll_wait(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }
}
