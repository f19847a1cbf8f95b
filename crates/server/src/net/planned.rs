//! The end of [`super::Server::run`]: the caller's stop future, or the
//! server's planned shutdown ([`crate::shutdown`]) coming due - planned by
//! a signal or by `RequestServerStateChange`, and possibly moved or
//! cancelled while it counts down - and the drain of a cluster node
//! ([`drain`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            () = &mut stop => {
                // Told to stop now (a second signal, or the embedder): no
                // drain, whatever was planned.
                state.shutdown.stop_at_once();
                return;
            }
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

/// How long a drain waits for the store to take the final records.
const FLUSH_LIMIT: Duration = Duration::from_secs(5);
/// The time between two batches of closes in a drain.
const PACE: Duration = Duration::from_millis(200);

/// The drain of a cluster node whose planned shutdown came due while other
/// nodes serve on: publishing has stopped (the caller stopped the
/// subscription timers), so what each session was last sent is final. In
/// batches, it writes to the store whatever changed since the last write -
/// every subscription of the server the first time: sequence numbers,
/// retransmission queues, items - and then closes the batch's channels with
/// `BadShutdown`. Their clients come back through the front end to a node
/// that serves on and activate their sessions there.
///
/// A batch is half the handshakes the serving nodes take at once
/// (`[admission] max_concurrent_handshakes`, taken as theirs as well as
/// this node's), every [`PACE`]: their own clients keep the other half.
/// Anything else - a single server, a node stopped at once, a cluster with
/// no other node serving - returns at once, and the caller closes every
/// channel together.
pub(super) async fn drain(endpoint: &crate::endpoint::Endpoint) {
    let state = endpoint.state();
    let Some(node) = state.cluster().map(Arc::clone) else {
        return;
    };
    let peers = node.serving_peer_count();
    if !state.shutdown.stops_as_planned() || peers == 0 {
        return;
    }
    let batch = state
        .admission
        .handshakes()
        .capacity()
        .saturating_mul(peers)
        .div_ceil(2)
        .max(1);
    let total = endpoint.connection_count();
    tracing::info!(
        connections = total,
        batch,
        serving_nodes = peers,
        "draining: final records to the store, then the channels close in batches"
    );
    let mut all_subscriptions = Some(state.subscriptions.subscription_ids());
    let mut closed = std::collections::HashSet::new();
    loop {
        let ids = all_subscriptions.take().unwrap_or_default();
        match tokio::time::timeout(FLUSH_LIMIT, node.write_all_now(ids)).await {
            Ok(true) => {}
            _ => tracing::warn!(
                "draining: the store did not take every final record; \
                 their sessions resume from the last ones written"
            ),
        }
        let ids: Vec<u32> = endpoint
            .channel_ids()
            .into_iter()
            .filter(|id| !closed.contains(id))
            .take(batch)
            .collect();
        if ids.is_empty() {
            break;
        }
        for id in ids {
            closed.insert(id);
            endpoint.stop_channel(id);
        }
        tokio::time::sleep(PACE).await;
    }
    tracing::info!(connections = closed.len(), "drained");
}
