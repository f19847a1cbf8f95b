//! `uascale-server`: the OPC UA server - address space, services, sessions,
//! subscriptions, admission control and the request queue.
//!
//! Owns: server behaviour. Must not: use tokio outside its `net/` module; the
//! protocol state lives in `uascale-proto` and is only driven from here.
//!
//! Status (issue 3, in progress): the opc.tcp listener and connection driver
//! ([`net`]) run the sans-IO secure channel (None and the RSA policies, with
//! the [`pki`] as certificate validator) and answer the Discovery service
//! set ([`services::discovery`]) and the Session service set
//! ([`services::session`]; Anonymous, UserName and X509 identities,
//! [`identity`]); every other
//! service is answered with a ServiceFault - the session's own error, else
//! `BadServiceUnsupported` - until it lands. Subscriptions run in the
//! sans-IO engine of [`subscription`], driven by one timer task in `net/`.
#![forbid(unsafe_code)]

pub mod address_space;
pub mod admission;
pub mod audit;
pub mod cluster;
pub mod config;
pub mod context;
pub mod demo;
pub mod dispatch;
pub mod error;
pub mod fxhash;
pub mod identity;
pub mod metrics;
pub mod net;
pub mod node_manager;
pub mod nodeset;
pub mod numeric_range;
pub mod pki;
pub mod reply;
pub mod scheduler;
pub mod security;
pub mod server_object;
pub mod services;
pub mod session;
pub mod state;
pub mod subscription;

pub use config::ServerConfig;
pub use context::ServiceContext;
pub use error::ServiceError;
pub use net::Server;
pub use state::ServerState;
