//! Scale-out (docs/scalability.md §8, docs/cluster.md): several nodes behind a
//! TCP front end, mirroring sessions, subscriptions, variable values and
//! trusted certificates through an existing distributed engine (NATS
//! JetStream), so that a client whose node dies carries on through
//! another node with the same session. Without `[cluster] url` nothing
//! here runs.
//!
//! - [`store`]: the store trait - buckets of records with revisions,
//!   compare-and-set writes, a watch; [`memory`] keeps it in memory,
//!   [`nats`] in NATS JetStream key-value buckets.
//! - [`record`]: the records (session, subscriptions, value, trusted
//!   certificate, node heartbeat), with their owner, in the OPC UA binary
//!   encoding, decoded with bounds.
//! - [`takeover`]: who owns a session and how that moves (claim by
//!   compare-and-set with the nonce consumed once, leases on heartbeats,
//!   adoption of a dead node's sessions), as functions over the trait.
//! - [`node`]: a server as a cluster node - the writer behind the request
//!   and publish paths, the heartbeat, the watches, the takeover steps the
//!   ActivateSession handler calls.
//!
//! The seams into the rest of the server:
//! - a server's whole state is one owned value built from its
//!   configuration ([`crate::state::ServerState`]), so a node restores a
//!   session into the same structures a CreateSession fills;
//! - every session transition is an event ([`crate::session::SessionEvent`])
//!   that a mirror hears through [`crate::session::SessionTable::listen`];
//! - subscription ids carry the node's index in their top byte
//!   ([`crate::subscription::registry::Registry::set_node_index`]), so
//!   ids made on different nodes never collide.

pub mod memory;
#[cfg(feature = "nats")]
pub mod nats;
pub mod node;
pub mod record;
pub mod store;
pub mod takeover;

#[cfg(test)]
pub(crate) mod testing {
    //! Runs a store future that is ready at once (the in-memory store's),
    //! without a runtime.

    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    /// The output of `f`, which must be ready on its first poll.
    pub(crate) fn now<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("an in-memory store future was not ready"),
        }
    }
}
