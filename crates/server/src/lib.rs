//! `uascale-server`: the OPC UA server - address space and node managers,
//! the services, sessions, subscriptions, PKI and user identity.
//!
//! Owns: server behaviour. Must not: use tokio outside its [`net`] module;
//! the protocol state lives in `uascale-proto` and is only driven from here.
//!
//! The shape (docs/architecture.md has the diagram):
//! - [`ServerState`] ([`state`]) is the whole server, built once from a
//!   [`ServerConfig`] with no socket;
//! - [`net`] is the tokio shell: a listener and one task per connection,
//!   feeding the sans-IO connection and handing each request to
//!   [`dispatch`] with an owned [`ServiceContext`] ([`context`]);
//! - [`dispatch`] decodes a [`dispatch::Request`], resolves its session once
//!   and routes it to its handler in [`services`] (one module per Part 4
//!   service set); a handler returns `Result<Response, ServiceError>`
//!   ([`error`]);
//! - the session table's transitions ([`session::SessionEvent`]) reach the
//!   connection, the subscription engine ([`subscription`]), audit
//!   ([`audit`]) and the counters ([`metrics`]), which [`scrape`] encodes
//!   for the Prometheus endpoint `net` serves (`[metrics] listen`);
//! - [`admission`], [`scheduler`] and [`cluster`] are where admission
//!   control, the request queue and scale-out land.
//!
//! Served: Discovery (GetEndpoints, FindServers), Session (with Cancel),
//! View, Attribute (Read, Write, HistoryRead), Method, Subscription and
//! MonitoredItem; not served (`BadServiceUnsupported`): NodeManagement,
//! Query, HistoryUpdate, RegisterServer. Anonymous, UserName and X509
//! identities; SecurityPolicy None and the RSA policies.
#![forbid(unsafe_code)]

pub mod address_space;
pub mod admission;
pub mod audit;
pub mod cluster;
pub mod config;
pub mod context;
pub mod delay;
pub mod demo;
pub mod dispatch;
pub mod endpoint;
pub mod error;
pub mod fxhash;
pub mod identity;
pub mod metrics;
pub mod net;
pub mod node_manager;
pub mod nodeset;
pub mod numeric_range;
pub mod pki;
pub mod quota;
pub mod reply;
pub mod scheduler;
pub mod scrape;
pub mod security;
pub mod server_object;
pub mod services;
pub mod session;
pub mod shed;
pub mod shutdown;
pub mod state;
pub mod subscription;

pub use config::ServerConfig;
pub use context::ServiceContext;
pub use endpoint::probes;
pub use error::ServiceError;
pub use net::Server;
pub use state::ServerState;
