//! The drain of a cluster node whose planned shutdown came due while other
//! nodes serve on, as decisions: whether to drain at all, how many
//! channels close together, which ones next. The shell
//! (`net/planned.rs`) writes the final records to the store between
//! batches and waits [`PACE`] between them.
//!
//! Publishing has stopped by then (the shell stopped the subscription
//! timers), so what each session was last sent is final. Each batch's
//! channels close with `BadShutdown`; their clients come back through the
//! front end to a node that serves on and activate their sessions there.
//!
//! A batch is half the handshakes the serving nodes take at once
//! (`[admission] max_concurrent_handshakes`, taken as theirs as well as
//! this node's): their own clients keep the other half. Anything else - a
//! single server, a node stopped at once, a cluster with no other node
//! serving - is no drain, and every channel closes together.

use std::collections::HashSet;
use std::time::Duration;

use super::Endpoint;

/// How long a drain waits for the store to take the final records.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(5);
/// The time between two batches of closes in a drain.
pub const PACE: Duration = Duration::from_millis(200);

/// A drain under way.
#[derive(Debug)]
pub struct Drain {
    /// Channels closed per batch.
    pub batch: usize,
    /// The other nodes serving on.
    pub serving_nodes: usize,
    closed: HashSet<u32>,
}

impl Drain {
    /// The channels closed so far.
    pub fn closed(&self) -> usize {
        self.closed.len()
    }

    /// Tells the next batch of open channels to close with `BadShutdown`;
    /// `false` once none is left.
    pub fn close_next(&mut self, endpoint: &Endpoint) -> bool {
        let ids: Vec<u32> = endpoint
            .channel_ids()
            .into_iter()
            .filter(|id| !self.closed.contains(id))
            .take(self.batch)
            .collect();
        if ids.is_empty() {
            return false;
        }
        for id in ids {
            self.closed.insert(id);
            endpoint.stop_channel(id);
        }
        true
    }
}

impl Endpoint {
    /// The drain to run now that the server stops, or `None` when its
    /// channels close all together (see the module).
    pub fn drain(&self) -> Option<Drain> {
        let state = self.state();
        let node = state.cluster()?;
        let peers = node.serving_peer_count();
        if !state.shutdown.stops_as_planned() || peers == 0 {
            return None;
        }
        let batch = state
            .admission
            .handshakes()
            .capacity()
            .saturating_mul(peers)
            .div_ceil(2)
            .max(1);
        Some(Drain {
            batch,
            serving_nodes: peers,
            closed: HashSet::new(),
        })
    }
}
