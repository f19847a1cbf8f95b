//! `uascale-server`: address space, services, sessions, subscriptions,
//! admission control and the request queue.
//!
//! Owns: server behaviour. Must not: use tokio outside its `net/` module.
//!
//! Status: arrives with issue 3; placeholder in the workspace layout.
