//! The one task that runs every subscription's timers: it sleeps until the
//! earliest deadline in the registry's heap, rounded up to the timer grid
//! (`[subscriptions] timer_resolution_ms`), or until a new, earlier one is
//! scheduled, and runs what is due - publishing cycles, samples, Publish
//! timeouts. Its cost follows what is due, not the number of sessions, and
//! one wake-up serves every deadline of a grid step.

use std::sync::Arc;

use crate::endpoint::timers::run_due_subscriptions;
use crate::state::{clock, ServerState};

pub(super) async fn run_subscriptions(state: Arc<ServerState>) {
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = Arc::clone(&wake);
    state
        .subscriptions
        .set_waker(Box::new(move || w.notify_one()));
    // The timer grid runs through the task's start.
    let origin = clock().instant;
    let mut more = false;
    loop {
        if more {
            // A long sampling pass was cut short: what waits for the
            // runtime (connections, Publishes) goes first, then the rest.
            tokio::task::yield_now().await;
            more = run_due_subscriptions(&state, clock());
            continue;
        }
        match state.subscriptions.next_wake(origin) {
            Some(t) => {
                tokio::select! {
                    () = tokio::time::sleep_until(t.into()) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
        more = run_due_subscriptions(&state, clock());
    }
}
