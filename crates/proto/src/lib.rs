//! `uascale-proto`: the sans-IO protocol core - UA-TCP messages (HEL/ACK/ERR/RHE),
//! chunking and reassembly, the secure channel state machine, sequence numbers
//! and token renewal.
//!
//! Owns: protocol state machines fed with bytes and time. Must not: open
//! sockets, read the clock or spawn tasks.
//!
//! Status: arrives with issue 3; placeholder in the workspace layout.
