//! `uascale-proto`: the sans-IO protocol core - UA-TCP messages (HEL/ACK/ERR/RHE),
//! chunking and reassembly, and (to come) the secure channel state machine,
//! sequence numbers and token renewal.
//!
//! Owns: protocol state fed with bytes and time. Must not: open sockets, read
//! the clock or spawn tasks; callers pass `Instant`s in.
//!
//! Status (issue 3, in progress): the connection protocol ([`tcp`]), secure
//! conversation chunking ([`chunk`]), reassembly under the shared
//! incomplete-message budget ([`reassembly`]) and the server connection state
//! machine ([`channel`]), and message security - signing, padding,
//! encryption - for every policy of `uascale-crypto` ([`security`], usable by
//! a client too), and the client connection ([`client`]), secured with the
//! same primitives.
#![forbid(unsafe_code)]

pub mod channel;
pub mod chunk;
pub mod client;
pub mod error;
pub mod reassembly;
pub mod security;
pub mod tcp;

pub use channel::{ChannelConfig, Event, Now, PendingConnection, ServerConnection};
pub use client::{ClientConfig, ClientConnection, ClientEvent, ClientSecurity};
pub use error::ChannelError;
pub use security::{
    CertificateValidator, ChannelSecurity, Identity, ServerSecurity, TrustAllCertificates,
};
