//! One task per timer of the endpoint ([`crate::endpoint::timers`]): it
//! sleeps until the time the timer asks for, or until the timer's waker
//! moves it earlier, and fires it; the timer decides what is due.

use std::sync::Arc;

use crate::endpoint::timers::{Fired, Timer};
use crate::state::clock;

/// Drives `timer` until it is done (most never are: their task is
/// aborted with the server).
pub(super) async fn drive(mut timer: impl Timer) {
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = Arc::clone(&wake);
    timer.set_waker(Box::new(move || w.notify_one()));
    loop {
        match timer.next_wake(clock().instant) {
            Some(t) => tokio::select! {
                () = tokio::time::sleep_until(t.into()) => {}
                // A new, earlier deadline: ask again.
                () = wake.notified() => continue,
            },
            None => {
                wake.notified().await;
                continue;
            }
        }
        loop {
            match timer.fire(clock()) {
                Fired::Sleep => break,
                Fired::Done => return,
                // Work left over: what waits for the runtime (connections,
                // Publishes) goes first, then the rest.
                Fired::Again => tokio::task::yield_now().await,
            }
        }
    }
}
