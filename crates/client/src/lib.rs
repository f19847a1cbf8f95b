//! `uascale-client`: an OPC UA client - connect, sessions, the services as
//! async methods, busy-aware backoff.
//!
//! Owns: client behaviour. Must not: use tokio outside its `net/` module;
//! the protocol state lives in `uascale-proto` ([`ClientConnection`](uascale_proto::ClientConnection))
//! and is only driven from here.
//!
//! ```no_run
//! # async fn demo() -> Result<(), uascale_client::ClientError> {
//! use uascale_client::Client;
//! let client = Client::connect("opc.tcp://localhost:4840", Default::default()).await?;
//! client.create_session("demo").await?;
//! let values = client.read_values(&["i=2258".parse().unwrap()]).await?;
//! println!("{:?}", values[0].value);
//! client.close().await;
//! # Ok(()) }
//! ```
//!
//! Subscriptions deliver a stream of [`SubscriptionEvent`]s; the client
//! keeps Publishes outstanding, acknowledges, Republishes gaps, and after a
//! lost connection restores them ([`Restore`]):
//!
//! ```no_run
//! # async fn demo() -> Result<(), uascale_client::ClientError> {
//! use std::time::Duration;
//! use uascale_client::*;
//! let client = Client::connect("opc.tcp://localhost:4840", Default::default()).await?;
//! client.create_session("demo").await?;
//! let mut sub = client
//!     .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(500)))
//!     .await?;
//! sub.monitor(vec![
//!     MonitorItem::value("ns=2;s=Demo.Dynamic.Counter".parse().unwrap()),
//!     MonitorItem::events(
//!         "i=2253".parse().unwrap(),
//!         event_filter(&["Severity", "Message"], Default::default()),
//!     ),
//! ])
//! .await?;
//! while let Some(event) = sub.recv().await {
//!     if let SubscriptionEvent::Notifications { notifications, .. } = event {
//!         for n in notifications {
//!             println!("{n:?}");
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Many requests can be in flight on one channel at once (pipelining): every
//! method takes `&self`, so a `Client` can be shared and called
//! concurrently. Status: every security policy and mode of the
//! server ([`SecurityOptions`]), the anonymous, user name and X.509
//! identities ([`UserIdentity`]), subscriptions with a stream of
//! notifications and events ([`Client::subscribe`], [`Subscription`]),
//! automatic reconnect ([`ClientOptions::reconnect`]) and a connect gate
//! shared by many clients ([`ConnectGate`]).
#![forbid(unsafe_code)]

pub mod backoff;
pub mod error;
pub mod net;
pub mod security;
pub mod subscription;

pub use backoff::Backoff;
pub use error::ClientError;
pub use net::{
    Client, ClientOptions, ConnectGate, ConnectReport, GateTurn, MonitoredItem, OpenAttempt,
    OpenObserver, OpenStage, SecurityOptions, Subscription,
};
pub use security::{ServerTrust, TrustListValidator, UserIdentity};
pub use subscription::{
    event_filter, MonitorItem, Notification, Restore, Revised, SubscriptionEvent,
    SubscriptionSettings,
};
