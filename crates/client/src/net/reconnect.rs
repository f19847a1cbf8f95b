//! Reconnect after a lost connection (docs/scalability.md §7 and §8):
//! wait per the backoff, open a new channel (through the connect gate),
//! activate the same session on it; if the server no longer has that
//! session (or will not move it), create a new one and take the
//! subscriptions over with TransferSubscriptions, re-creating those that
//! cannot be transferred.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::backoff::is_busy_signal;
use crate::error::ClientError;
use crate::subscription::Restore;

use super::{subscription, Link, Shared};

/// The longest wait before the first reconnect after a server closed the
/// channel with `BadShutdown`.
const PROMPT_RECONNECT: std::time::Duration = std::time::Duration::from_millis(200);

/// A jitter seed that differs between clients and between runs.
pub(crate) fn jitter_seed(shared: &Shared) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (shared as *const Shared as u64).rotate_left(32)
}

/// Tries until the channel is back or the client is closed.
pub(crate) async fn run(shared: Arc<Shared>, failure: ClientError) {
    let mut backoff = shared.options.backoff.reseeded(jitter_seed(&shared));
    let mut last = failure;
    loop {
        let wait = if backoff.attempts() == 0
            && last.status_code() == uascale_types::StatusCode::BadShutdown
        {
            // The server closed the channel because it shuts down: a
            // cluster node that drains has written the session for another
            // node to take at once - come back now, not after a second.
            backoff.prompt_delay(PROMPT_RECONNECT)
        } else {
            backoff.next_delay(last.status_code(), last.retry_after_ms())
        };
        tokio::time::sleep(wait).await;
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        match reestablish(&shared).await {
            Ok(()) => {
                tracing::debug!(attempts = backoff.attempts(), "reconnected");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "reconnect attempt failed");
                last = e;
            }
        }
    }
}

/// One attempt: a new channel, then the session and subscriptions on it.
async fn reestablish(shared: &Arc<Shared>) -> Result<(), ClientError> {
    let _turn = match &shared.options.connect_gate {
        Some(gate) => Some(gate.enter().await),
        None => None,
    };
    let (generation, link) = shared.open_link().await?;
    let has_session = shared
        .session
        .lock()
        .map(|s| !s.auth.is_null())
        .unwrap_or(false);
    let mut restore = None;
    if has_session {
        match shared.activate(Some(&link)).await {
            Ok(()) => restore = Some(Restore::Reactivated),
            Err(ClientError::Service { status, .. }) if !is_busy_signal(status) => {
                tracing::debug!(%status, "session not activated on the new channel; a new one");
                new_session(shared, &link).await?;
            }
            Err(e) => return Err(e),
        }
    }
    // Before the channel is installed: the first Publish on it carries
    // the acknowledgements `restored` queues.
    if let Some(how) = restore {
        subscription::restored(shared, how);
    }
    shared.install(generation, link);
    Ok(())
}

/// The server lost our session but the channel is up: a new session on
/// the current channel takes the subscriptions over.
pub(crate) async fn renew_session(shared: &Arc<Shared>) -> Result<(), ClientError> {
    if shared.closing.load(Ordering::SeqCst) {
        return Err(ClientError::Closed);
    }
    let link = shared
        .link
        .lock()
        .ok()
        .and_then(|l| l.as_ref().map(|(_, l)| l.clone()))
        .ok_or(ClientError::Closed)?;
    tracing::debug!("the server lost the session; a new one on the same channel");
    new_session(shared, &link).await
}

/// A new session under the old one's name, and the subscriptions moved to
/// it.
async fn new_session(shared: &Arc<Shared>, link: &Link) -> Result<(), ClientError> {
    let name = shared
        .session
        .lock()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    shared.create_session(Some(link), &name).await?;
    shared.activate(Some(link)).await?;
    subscription::take_over(shared, link).await
}
