//! `uascale-client`: sessions, subscriptions, reconnect and backoff.
//!
//! Owns: client behaviour. Must not: use tokio outside its `net/` module.
//!
//! Status: arrives with issue 6; placeholder in the workspace layout.
