//! The request workers on the tokio runtime: the scheduler decides which
//! request runs and when a worker is added; these tasks wait, take and
//! run, and spawn what a request hands back.

use std::sync::Arc;

use crate::endpoint::{Scheduler, Workers};
use crate::state::clock;

/// The scheduler's view of the runtime.
#[derive(Debug)]
struct Tokio {
    scheduler: std::sync::Weak<Scheduler>,
    /// Idle workers wait here (a wake-up given while none waits is kept
    /// for the next).
    work: Arc<tokio::sync::Notify>,
}

impl Workers for Tokio {
    fn wake_one(&self) {
        self.work.notify_one();
    }

    fn add(&self) {
        if let (Some(s), Ok(runtime)) = (
            self.scheduler.upgrade(),
            tokio::runtime::Handle::try_current(),
        ) {
            runtime.spawn(work_loop(s, Arc::clone(&self.work)));
        }
    }

    fn wake_all(&self) {
        self.work.notify_waiters();
    }
}

/// Starts the scheduler's first workers on the current runtime.
pub(super) fn start(scheduler: &Arc<Scheduler>) {
    let work = Arc::new(tokio::sync::Notify::new());
    let n = scheduler.start(Arc::new(Tokio {
        scheduler: Arc::downgrade(scheduler),
        work: Arc::clone(&work),
    }));
    for _ in 0..n {
        tokio::spawn(work_loop(Arc::clone(scheduler), Arc::clone(&work)));
    }
}

/// A worker: runs queued requests while there are any and a slot is free,
/// then waits to be woken. Ends once the scheduler stops.
async fn work_loop(scheduler: Arc<Scheduler>, notify: Arc<tokio::sync::Notify>) {
    let mut run = 0u32;
    loop {
        loop {
            let now = clock();
            let Some((slot, job)) = scheduler.take(now.instant) else {
                break;
            };
            if let Some(task) = job.run(slot, now) {
                tokio::spawn(task);
            }
            run = run.wrapping_add(1);
            if run % 32 == 0 {
                // Let the connections' tasks have the thread now and then.
                tokio::task::yield_now().await;
            }
        }
        if scheduler.stopping() {
            return;
        }
        notify.notified().await;
    }
}
