//! `uascale-proto`: the sans-IO protocol core - UA-TCP messages
//! (HEL/ACK/ERR/RHE, [`tcp`]), secure-conversation chunks and sequence
//! numbers ([`chunk`]), reassembly under the shared incomplete-message
//! budget ([`reassembly`]), message security (signing, padding, encryption)
//! for every policy of `uascale-crypto` ([`security`]; the ECC user
//! secret format in [`ecc_secret`]), the server
//! connection state machine with token issue and renewal ([`channel`]:
//! [`PendingConnection`] is where admission accepts or refuses before any
//! work), and the client connection ([`client`]).
//!
//! Owns: protocol state fed with bytes and time. Must not: open sockets, read
//! the clock or spawn tasks; callers pass [`Now`] in (`clippy.toml` bans the
//! clock reads here).
#![forbid(unsafe_code)]

pub mod channel;
pub mod chunk;
pub mod client;
pub mod ecc_secret;
pub mod error;
pub mod reassembly;
pub mod security;
pub mod tcp;

pub use channel::{ChannelConfig, Event, Now, PendingConnection, ReceivedOpen, ServerConnection};
pub use client::{ClientConfig, ClientConnection, ClientEvent, ClientSecurity};
pub use error::ChannelError;
pub use security::{
    CertificateValidator, ChannelSecurity, Identity, ServerSecurity, TrustAllCertificates,
};
