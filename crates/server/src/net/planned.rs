//! The end of [`super::Server::run`]: the caller's stop future, or the
//! server's planned shutdown ([`crate::shutdown`]) coming due - planned by
//! a signal or by `RequestServerStateChange`, and possibly moved or
//! cancelled while it counts down.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::state::ServerState;

/// Completes when `stop` does, or when the planned shutdown is due.
pub(super) async fn stop_or_due(state: Arc<ServerState>, stop: impl Future<Output = ()>) {
    let changed = Arc::new(tokio::sync::Notify::new());
    let wake = Arc::clone(&changed);
    state
        .shutdown
        .set_waker(Box::new(move || wake.notify_one()));
    tokio::pin!(stop);
    loop {
        let due = state.shutdown.due();
        let sleep = async move {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut stop => return,
            // A new plan, or a cancelled one: wait for that instead.
            () = changed.notified() => {}
            () = sleep => {
                if state.shutdown.due().is_some_and(|at| at <= Instant::now()) {
                    tracing::info!("planned shutdown due: closing the channels");
                    return;
                }
            }
        }
    }
}
