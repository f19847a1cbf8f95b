//! `uascale-proto`: the sans-IO protocol core - UA-TCP messages (HEL/ACK/ERR/RHE),
//! chunking and reassembly, and (to come) the secure channel state machine,
//! sequence numbers and token renewal.
//!
//! Owns: protocol state fed with bytes and time. Must not: open sockets, read
//! the clock or spawn tasks; callers pass `Instant`s in.
//!
//! Status (issue 3, in progress): the connection protocol ([`tcp`]) and
//! message reassembly with the shared incomplete-message budget
//! ([`reassembly`]) are here; the secure channel state machine is next.
#![forbid(unsafe_code)]

pub mod error;
pub mod reassembly;
pub mod tcp;

pub use error::ChannelError;
