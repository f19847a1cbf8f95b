//! The context a request is served in: the server state, the secure
//! channel it came on, its id, one clock reading, where a later answer
//! goes, and - once the dispatcher resolved it - its session.
//!
//! It is owned and `Send`: a request can wait in a queue and run on any
//! worker, and an asynchronous answer can take it along. It dereferences
//! to [`ServerState`], so a handler reads `ctx.state.sessions`, `ctx.state.config`,
//! `ctx.state.address_space` directly. The connection builds one per batch of
//! requests that arrived together and sets the request id of each.

use std::sync::Arc;
use std::time::Instant;

use uascale_proto::security::ChannelSecurity;
use uascale_types::{DateTime, RequestHeader, ResponseHeader, StatusCode};

use crate::error::ServiceError;
use crate::reply::{Responder, ResponseSink};
use crate::session::{Session, SessionRef};
use crate::state::ServerState;

/// What a service handler sees of the server and the request.
#[derive(Clone)]
pub struct ServiceContext {
    /// The server.
    pub state: Arc<ServerState>,
    /// The secure channel the request came on (0: the server itself, e.g.
    /// sampling).
    pub channel_id: u32,
    /// What that channel was opened with (cheap to clone: Arcs inside).
    pub channel: ChannelSecurity,
    /// The secure-channel request id of the request being handled.
    pub request_id: u32,
    /// The time the request is handled at (wall clock, for timestamps).
    pub now: DateTime,
    /// The same moment on the monotonic clock (for deadlines).
    pub instant: Instant,
    /// Where this connection's answers go, for answers sent later (parked
    /// Publishes, asynchronous node managers) and for Cancel; `None` where
    /// nothing can be answered later (then asynchronous paths answer
    /// `BadWouldBlock`).
    pub sink: Option<Arc<dyn ResponseSink>>,
    /// The request's session, once resolved.
    pub session: Option<SessionRef>,
    /// The local address the request's connection arrived on (`None` for
    /// the server's own work): endpoint URLs name it to a client that used
    /// it.
    pub local_ip: Option<std::net::IpAddr>,
    /// The client's address (`None` for the server's own work): retry
    /// tickets are bound to it.
    pub peer_ip: Option<std::net::IpAddr>,
    /// Set when the request's channel is a logical one made for it alone
    /// (opc.https without a session): then it waits in the request queue
    /// as its source address (`peer_ip`) rather than as that channel, so
    /// one client's session-less requests share one lane and one
    /// per-owner limit.
    pub owned_by_address: bool,
}

impl std::fmt::Debug for ServiceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceContext")
            .field("channel_id", &self.channel_id)
            .field("request_id", &self.request_id)
            .field("now", &self.now)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl ServiceContext {
    /// The context of requests arriving on channel `channel_id` (opened
    /// with `channel`) at `now`, answered later through `sink`.
    pub fn new(
        state: Arc<ServerState>,
        channel_id: u32,
        channel: ChannelSecurity,
        now: crate::subscription::Now,
        sink: Option<Arc<dyn ResponseSink>>,
    ) -> Self {
        ServiceContext {
            state,
            channel_id,
            channel,
            request_id: 0,
            now: now.utc,
            instant: now.instant,
            sink,
            session: None,
            local_ip: None,
            peer_ip: None,
            owned_by_address: false,
        }
    }

    /// The context of the server's own work (sampling, audit of
    /// timeouts): no channel, nothing answered later.
    pub fn internal(state: Arc<ServerState>, now: crate::subscription::Now) -> Self {
        Self::new(state, 0, ChannelSecurity::none(), now, None)
    }

    /// A context for tests and benchmarks: channel 1, request 1,
    /// SecurityPolicy None, the wall clock at tick 1 and `instant`. Fields
    /// are public: change what a test needs.
    pub fn for_tests(state: Arc<ServerState>, instant: Instant) -> Self {
        let mut ctx = Self::new(
            state,
            1,
            ChannelSecurity::none(),
            crate::subscription::Now {
                instant,
                utc: DateTime::from_ticks(1),
            },
            None,
        );
        ctx.request_id = 1;
        ctx
    }

    /// This request's clock reading, as the sans-IO engines take it.
    pub fn clock(&self) -> uascale_proto::Now {
        uascale_proto::Now {
            instant: self.instant,
            utc: self.now,
        }
    }

    /// A Good response header for a request.
    pub fn response_header(&self, req: &RequestHeader) -> ResponseHeader {
        ResponseHeader {
            timestamp: self.now,
            request_handle: req.request_handle,
            service_result: StatusCode::Good,
            ..Default::default()
        }
    }

    /// The right to answer the current request later (a parked Publish):
    /// `None` when this context cannot answer later.
    pub fn responder(&self, request_handle: u32) -> Option<Responder> {
        self.sink.as_ref().map(|s| {
            Responder::new(
                Arc::clone(s),
                self.channel_id,
                self.request_id,
                request_handle,
            )
        })
    }

    /// Resolves the request's session from its authentication token: the
    /// activated session bound to this channel (the dispatcher does this
    /// once per request; the session's deadline moves).
    pub fn resolve(&mut self, token: &uascale_types::NodeId) -> Result<(), ServiceError> {
        let resolved = self
            .state
            .sessions
            .resolve(token, self.channel_id, self.instant)
            .map_err(|e| ServiceError::client(e.status_code()))?;
        self.session = Some(resolved);
        Ok(())
    }

    /// The request's session (`BadSessionIdInvalid` when the dispatcher
    /// resolved none: a handler that needs one was called without).
    pub fn session(&self) -> Result<&SessionRef, ServiceError> {
        self.session
            .as_ref()
            .ok_or(ServiceError::client(StatusCode::BadSessionIdInvalid))
    }

    /// The request's SessionId.
    pub fn session_id(&self) -> Result<uascale_types::NodeId, ServiceError> {
        self.session().map(|s| s.session_id.clone())
    }

    /// Runs `f` on the request's session (it may have closed meanwhile:
    /// `BadSessionIdInvalid`).
    pub fn with_session<R>(&self, f: impl FnOnce(&mut Session) -> R) -> Result<R, ServiceError> {
        let s = self.session()?;
        self.state
            .sessions
            .with_key(&s.key, f)
            .map_err(|e| ServiceError::from(e.status_code()))
    }

    /// Where this request's audit events go.
    pub fn audit_site(&self) -> crate::audit::AuditSite<'_> {
        self.state.audit_site(self.channel_id, self.clock())
    }
}
