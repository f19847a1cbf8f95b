//! The end of [`super::Server::run`]: the caller's stop future, or the
//! server's planned shutdown ([`PlannedShutdown`]) coming due - planned by
//! a signal or by `RequestServerStateChange`, and possibly moved or
//! cancelled while it counts down - and the drain of a cluster node
//! ([`drain`]).

use std::future::Future;
use std::sync::Arc;

use crate::endpoint::drain::{FLUSH_LIMIT, PACE};
use crate::endpoint::timers::PlannedShutdown;
use crate::state::ServerState;

/// Completes when `stop` does, or when the planned shutdown is due
/// ([`PlannedShutdown`]).
pub(super) async fn stop_or_due(state: Arc<ServerState>, stop: impl Future<Output = ()>) {
    tokio::select! {
        // Told to stop now (a second signal, or the embedder): no drain,
        // whatever was planned.
        () = stop => state.shutdown.stop_at_once(),
        () = super::timers::drive(PlannedShutdown::new(Arc::clone(&state))) => {}
    }
}

/// Drains a cluster node whose planned shutdown came due while other
/// nodes serve on ([`crate::endpoint::drain`] decides whether and how):
/// between batches of closes, the final records reach the store (every
/// subscription the first time, then what changed), [`PACE`] apart.
pub(super) async fn drain(endpoint: &crate::endpoint::Endpoint) {
    let Some(mut drain) = endpoint.drain() else {
        return;
    };
    let state = endpoint.state();
    let Some(node) = state.cluster().map(Arc::clone) else {
        return;
    };
    tracing::info!(
        connections = endpoint.connection_count(),
        batch = drain.batch,
        serving_nodes = drain.serving_nodes,
        "draining: final records to the store, then the channels close in batches"
    );
    let mut all_subscriptions = Some(state.subscriptions.subscription_ids());
    loop {
        let ids = all_subscriptions.take().unwrap_or_default();
        match tokio::time::timeout(FLUSH_LIMIT, node.write_all_now(ids)).await {
            Ok(true) => {}
            _ => tracing::warn!(
                "draining: the store did not take every final record; \
                 their sessions resume from the last ones written"
            ),
        }
        if !drain.close_next(endpoint) {
            break;
        }
        tokio::time::sleep(PACE).await;
    }
    tracing::info!(connections = drain.closed(), "drained");
}
