//! Scale-out (SCALABILITY.md §8): several nodes behind a TCP front end,
//! mirroring sessions, subscriptions and the address space through an
//! existing distributed engine.
//!
//! Nothing is mirrored yet. What the cluster issue builds here plugs into
//! seams that exist now:
//! - a server's whole state is one owned value built from its
//!   configuration ([`crate::state::ServerState`]), so a node restores a
//!   session into the same structures a CreateSession fills;
//! - every session transition is an event ([`crate::session::SessionEvent`])
//!   that a mirror hears through [`crate::session::SessionTable::listen`];
//! - subscription ids carry the node's index in their top byte
//!   ([`crate::subscription::registry::Registry::set_node_index`]), so
//!   ids made on different nodes never collide.
