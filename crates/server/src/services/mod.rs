//! The services, one module per Part 4 service set, and the dispatcher that
//! turns a decoded request into a response message.

pub mod attribute;
pub mod discovery;
pub mod method;
pub mod monitored_item;
pub mod session;
pub mod subscription;
pub mod view;

use uascale_types::{
    decode_message, encode_message, BinaryDecode, DateTime, DecodeLimits, DynStructure, NodeId,
    Reader, RequestHeader, ResponseHeader, ServiceFault, StatusCode,
};

use std::sync::Arc;

use crate::config::ServerConfig;
use crate::reply::{BoxFuture, Responder, ResponseSink};
use crate::session::SessionTable;

/// What a service handler sees of the server.
pub struct ServiceContext<'a> {
    /// The configuration.
    pub config: &'a ServerConfig,
    /// The sessions.
    pub sessions: &'a SessionTable,
    /// The secure channel the request came on.
    pub channel_id: u32,
    /// The time the request is handled at (wall clock, for timestamps).
    pub now: DateTime,
    /// The same moment on the monotonic clock (for deadlines).
    pub instant: std::time::Instant,
    /// The nodes.
    pub address_space: &'a crate::address_space::AddressSpace,
    /// When the server started.
    pub start_time: DateTime,
    /// The node managers (values and methods by namespace).
    pub managers: &'a crate::node_manager::NodeManagers,
    /// The secure-channel request id of the request being handled.
    pub request_id: u32,
    /// Where this connection's responses go, for answers sent later; `None`
    /// where nothing can be answered later (then asynchronous paths answer
    /// `BadWouldBlock`).
    pub sink: Option<&'a Arc<dyn ResponseSink>>,
    /// Cancels this connection's outstanding requests with a requestHandle
    /// (answering them `BadRequestCancelledByClient`) and returns how many;
    /// `None` where nothing is outstanding outside the handler.
    pub canceller: Option<&'a dyn Fn(u32) -> u32>,
    /// Server-wide security: PKI, own certificate and key, users.
    pub security: &'a crate::security::SecurityState,
    /// What the request's secure channel was opened with.
    pub channel: &'a uascale_proto::security::ChannelSecurity,
    /// The subscriptions.
    pub subscriptions: &'a subscription::SubscriptionRegistry,
}

impl std::fmt::Debug for ServiceContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceContext")
            .field("channel_id", &self.channel_id)
            .field("request_id", &self.request_id)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// For tests: SecurityPolicy None, no PKI.
pub fn no_security() -> (
    &'static crate::security::SecurityState,
    &'static uascale_proto::security::ChannelSecurity,
) {
    static S: std::sync::OnceLock<crate::security::SecurityState> = std::sync::OnceLock::new();
    static C: std::sync::OnceLock<uascale_proto::security::ChannelSecurity> =
        std::sync::OnceLock::new();
    (
        S.get_or_init(crate::security::SecurityState::none_only),
        C.get_or_init(uascale_proto::security::ChannelSecurity::none),
    )
}

impl<'a> ServiceContext<'a> {
    /// A context for tests and benchmarks: channel 1, request 1, no
    /// response sink or canceller, SecurityPolicy None, the times at tick 1
    /// and `instant`. Fields are public: change what a test needs.
    pub fn for_tests(
        config: &'a ServerConfig,
        sessions: &'a SessionTable,
        address_space: &'a crate::address_space::AddressSpace,
        managers: &'a crate::node_manager::NodeManagers,
        subscriptions: &'a subscription::SubscriptionRegistry,
        instant: std::time::Instant,
    ) -> Self {
        let (security, channel) = no_security();
        ServiceContext {
            config,
            sessions,
            channel_id: 1,
            now: DateTime::from_ticks(1),
            instant,
            address_space,
            start_time: DateTime::from_ticks(1),
            managers,
            request_id: 1,
            sink: None,
            canceller: None,
            security,
            channel,
            subscriptions,
        }
    }
}

impl ServiceContext<'_> {
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
        self.sink.map(|s| {
            Responder::new(
                Arc::clone(s),
                self.channel_id,
                self.request_id,
                request_handle,
            )
        })
    }
}

/// A service's answer: now, or from a future that the network layer runs
/// without holding up the connection (asynchronous node managers).
pub enum Answer<T> {
    /// The response.
    Now(T),
    /// The response, once the future completes.
    Later(BoxFuture<Result<T, StatusCode>>),
}

impl<T> std::fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Answer::Now(_) => "Answer::Now",
            Answer::Later(_) => "Answer::Later",
        })
    }
}

/// What [`dispatch`] made of a request.
pub enum Dispatched {
    /// The response message, to send now.
    Now(Vec<u8>),
    /// The response message once `future` completes; the network layer
    /// runs it (and aborts it on Cancel: answer `BadRequestCancelledByClient`).
    Later {
        /// The request's requestHandle (what Cancel names it by).
        request_handle: u32,
        /// Produces the response message.
        future: BoxFuture<Vec<u8>>,
    },
    /// A handler took a [`Responder`] and answers by itself (a parked
    /// Publish); nothing to send now.
    Parked,
}

impl std::fmt::Debug for Dispatched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dispatched::Now(m) => write!(f, "Dispatched::Now({} bytes)", m.len()),
            Dispatched::Later { request_handle, .. } => {
                write!(f, "Dispatched::Later(handle {request_handle})")
            }
            Dispatched::Parked => f.write_str("Dispatched::Parked"),
        }
    }
}

impl Dispatched {
    /// The response message when it was answered at once.
    pub fn now(self) -> Option<Vec<u8>> {
        match self {
            Dispatched::Now(m) => Some(m),
            _ => None,
        }
    }
}

/// What a route produced: a response, a future response, or nothing (the
/// handler answers through a [`Responder`]).
enum Routed {
    Now(Box<dyn DynStructure>),
    Later(u32, BoxFuture<Box<dyn DynStructure>>),
    /// A handler keeps the [`Responder`]; nothing to send now.
    Parked,
}

/// A ServiceFault answering `request_handle` with `status`.
pub fn service_fault(now: DateTime, request_handle: u32, status: StatusCode) -> ServiceFault {
    ServiceFault {
        response_header: ResponseHeader {
            timestamp: now,
            request_handle,
            service_result: status,
            ..Default::default()
        },
    }
}

/// Reads the RequestHeader that starts every request body, without decoding
/// the rest (for faults on requests we do not decode).
pub(crate) fn peek_request_handle(message: &[u8], limits: &DecodeLimits) -> u32 {
    let Ok(mut r) = Reader::new(message, limits) else {
        return 0;
    };
    if NodeId::decode(&mut r).is_err() {
        return 0;
    }
    RequestHeader::decode(&mut r).map_or(0, |h| h.request_handle)
}

/// Handles one request message (encoding id + body): the response message
/// to send now, or how it will be answered later.
pub fn dispatch(ctx: &ServiceContext<'_>, message: &[u8], limits: &DecodeLimits) -> Dispatched {
    // The most frequent request, without its intermediate vectors.
    if let Some(response) = attribute::read_fast(ctx, message, limits) {
        return Dispatched::Now(response);
    }
    dispatch_general(ctx, message, limits)
}

/// Every request through its decoded message (what [`dispatch`] does when
/// no fast path takes it).
fn dispatch_general(ctx: &ServiceContext<'_>, message: &[u8], limits: &DecodeLimits) -> Dispatched {
    let routed = match Reader::new(message, limits).and_then(|mut r| {
        let m = decode_message(&mut r)?;
        r.finish()?;
        Ok(m)
    }) {
        Err(e) => {
            tracing::debug!(error = %e, "request did not decode");
            let status = match e.kind() {
                uascale_types::DecodeErrorKind::UnknownEncodingId(_) => {
                    StatusCode::BadServiceUnsupported
                }
                _ => e.status_code(),
            };
            Routed::Now(Box::new(service_fault(
                ctx.now,
                peek_request_handle(message, limits),
                status,
            )))
        }
        Ok(req) => route(ctx, req.as_ref()).unwrap_or_else(|| {
            // Not implemented yet: a bad session still gets its own code.
            let status = check_session(ctx, message, limits)
                .err()
                .unwrap_or(StatusCode::BadServiceUnsupported);
            Routed::Now(Box::new(service_fault(
                ctx.now,
                peek_request_handle(message, limits),
                status,
            )))
        }),
    };
    match routed {
        Routed::Now(response) => Dispatched::Now(encode(response.as_ref())),
        Routed::Later(request_handle, future) => Dispatched::Later {
            request_handle,
            future: Box::pin(async move { encode(future.await.as_ref()) }),
        },
        Routed::Parked => Dispatched::Parked,
    }
}

fn encode(response: &dyn DynStructure) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    encode_message(response, &mut out);
    out
}

fn boxed<T: DynStructure>(
    ctx: &ServiceContext<'_>,
    handle: u32,
    r: Result<T, StatusCode>,
) -> Routed {
    match r {
        Ok(v) => Routed::Now(Box::new(v)),
        Err(status) => Routed::Now(Box::new(service_fault(ctx.now, handle, status))),
    }
}

fn boxed_answer<T: DynStructure>(
    ctx: &ServiceContext<'_>,
    handle: u32,
    r: Result<Answer<T>, StatusCode>,
) -> Routed {
    match r {
        Ok(Answer::Now(v)) => Routed::Now(Box::new(v)),
        Ok(Answer::Later(f)) => {
            let now = ctx.now;
            Routed::Later(
                handle,
                Box::pin(async move {
                    match f.await {
                        Ok(v) => Box::new(v) as Box<dyn DynStructure>,
                        Err(status) => Box::new(service_fault(now, handle, status)),
                    }
                }),
            )
        }
        Err(status) => Routed::Now(Box::new(service_fault(ctx.now, handle, status))),
    }
}

/// The handler for a request type; `None` for services this server does
/// not implement (yet). Requests other than discovery and session
/// establishment need an activated session of this channel.
fn route(ctx: &ServiceContext<'_>, req: &dyn DynStructure) -> Option<Routed> {
    use uascale_types as t;
    let any = req.as_any();
    if let Some(r) = any.downcast_ref::<t::GetEndpointsRequest>() {
        return Some(Routed::Now(Box::new(discovery::get_endpoints(ctx, r))));
    }
    if let Some(r) = any.downcast_ref::<t::FindServersRequest>() {
        return Some(Routed::Now(Box::new(discovery::find_servers(ctx, r))));
    }
    if let Some(r) = any.downcast_ref::<t::CreateSessionRequest>() {
        return Some(boxed(
            ctx,
            r.request_header.request_handle,
            session::create_session(ctx, r),
        ));
    }
    if let Some(r) = any.downcast_ref::<t::ActivateSessionRequest>() {
        return Some(boxed(
            ctx,
            r.request_header.request_handle,
            session::activate_session(ctx, r),
        ));
    }
    if let Some(r) = any.downcast_ref::<t::CancelRequest>() {
        return Some(boxed(
            ctx,
            r.request_header.request_handle,
            session::cancel(ctx, r),
        ));
    }
    if let Some(r) = any.downcast_ref::<t::CloseSessionRequest>() {
        return Some(boxed(
            ctx,
            r.request_header.request_handle,
            session::close_session(ctx, r),
        ));
    }
    macro_rules! with_session {
        ($wrap:ident: $($req:ty => $handler:path),* $(,)?) => {$(
            if let Some(r) = any.downcast_ref::<$req>() {
                let h = &r.request_header;
                let result = ctx
                    .sessions
                    .with(&h.authentication_token, Some(ctx.channel_id), true, ctx.instant, |_| ())
                    .map_err(|e| e.status_code())
                    .and_then(|()| $handler(ctx, r));
                return Some($wrap(ctx, h.request_handle, result));
            }
        )*};
    }
    // Services that may touch asynchronous node managers.
    with_session!(boxed_answer:
        t::ReadRequest => attribute::read_answer,
        t::WriteRequest => attribute::write_answer,
        t::CallRequest => method::call_answer,
    );
    with_session!(boxed:
        t::HistoryReadRequest => attribute::history_read,
        t::BrowseRequest => view::browse,
        t::BrowseNextRequest => view::browse_next,
        t::TranslateBrowsePathsToNodeIdsRequest => view::translate,
        t::RegisterNodesRequest => view::register_nodes,
        t::UnregisterNodesRequest => view::unregister_nodes,
        t::CreateSubscriptionRequest => subscription::create_subscription,
        t::ModifySubscriptionRequest => subscription::modify_subscription,
        t::SetPublishingModeRequest => subscription::set_publishing_mode,
        t::RepublishRequest => subscription::republish,
        t::DeleteSubscriptionsRequest => subscription::delete_subscriptions,
        t::TransferSubscriptionsRequest => subscription::transfer_subscriptions,
        t::CreateMonitoredItemsRequest => monitored_item::create_monitored_items,
        t::ModifyMonitoredItemsRequest => monitored_item::modify_monitored_items,
        t::SetMonitoringModeRequest => monitored_item::set_monitoring_mode,
        t::SetTriggeringRequest => monitored_item::set_triggering,
        t::DeleteMonitoredItemsRequest => monitored_item::delete_monitored_items,
    );
    if let Some(r) = any.downcast_ref::<t::PublishRequest>() {
        // Parked without a response: the subscription engine answers
        // through the Responder (SCALABILITY.md §4).
        let h = r.request_header.request_handle;
        return Some(match ctx.responder(h) {
            Some(to) => {
                subscription::publish(ctx, r, to);
                Routed::Parked
            }
            None => Routed::Now(Box::new(service_fault(
                ctx.now,
                h,
                StatusCode::BadWouldBlock,
            ))),
        });
    }
    None
}

/// The session check every other service starts with.
fn check_session(
    ctx: &ServiceContext<'_>,
    message: &[u8],
    limits: &DecodeLimits,
) -> Result<(), StatusCode> {
    let Ok(mut r) = Reader::new(message, limits) else {
        return Err(StatusCode::BadDecodingError);
    };
    NodeId::decode(&mut r).map_err(|_| StatusCode::BadDecodingError)?;
    let header = RequestHeader::decode(&mut r).map_err(|e| e.status_code())?;
    ctx.sessions
        .with(
            &header.authentication_token,
            Some(ctx.channel_id),
            true,
            ctx.instant,
            |_| (),
        )
        .map_err(|e| e.status_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::{ReadRequest, Structure};

    fn ctx<'a>(config: &'a ServerConfig, sessions: &'a SessionTable) -> ServiceContext<'a> {
        // The origin of the test's time.
        #[allow(clippy::disallowed_methods)]
        let t0 = std::time::Instant::now();
        ServiceContext::for_tests(
            config,
            sessions,
            space(),
            managers(),
            crate::services::subscription::tests_registry(),
            t0,
        )
    }

    fn managers() -> &'static crate::node_manager::NodeManagers {
        static V: std::sync::OnceLock<crate::node_manager::NodeManagers> =
            std::sync::OnceLock::new();
        V.get_or_init(crate::node_manager::NodeManagers::default)
    }

    fn space() -> &'static crate::address_space::AddressSpace {
        static S: std::sync::OnceLock<crate::address_space::AddressSpace> =
            std::sync::OnceLock::new();
        S.get_or_init(crate::address_space::AddressSpace::default)
    }

    fn fault_of(bytes: &[u8]) -> ServiceFault {
        let limits = DecodeLimits::default();
        let m = decode_message(&mut Reader::new(bytes, &limits).unwrap()).unwrap();
        m.as_any()
            .downcast_ref::<ServiceFault>()
            .cloned()
            .expect("a ServiceFault")
    }

    #[test]
    fn unimplemented_service_gets_a_fault_with_the_handle() {
        let config = ServerConfig::default();
        let mut msg = Vec::new();
        let req = ReadRequest {
            request_header: RequestHeader {
                request_handle: 77,
                ..Default::default()
            },
            ..Default::default()
        };
        encode_message(&req, &mut msg);
        let sessions = SessionTable::new(10);
        let f = fault_of(
            &dispatch(&ctx(&config, &sessions), &msg, &DecodeLimits::default())
                .now()
                .unwrap(),
        );
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSessionIdInvalid,
            "no session"
        );
        assert_eq!(f.response_header.request_handle, 77);
    }

    #[test]
    fn the_fast_read_answers_byte_for_byte_as_the_general_path() {
        use uascale_types as t;
        let config = ServerConfig::default();
        let sessions = SessionTable::new(10);
        let c = ctx(&config, &sessions);
        let limits = DecodeLimits::default();
        let call = |req: &dyn DynStructure| {
            let mut msg = Vec::new();
            encode_message(req, &mut msg);
            let out = dispatch_general(&c, &msg, &limits).now().unwrap();
            decode_message(&mut Reader::new(&out, &limits).unwrap()).unwrap()
        };
        let created = call(&t::CreateSessionRequest {
            requested_session_timeout: 60_000.0,
            ..Default::default()
        });
        let created = created
            .as_any()
            .downcast_ref::<t::CreateSessionResponse>()
            .expect("a session");
        let token = created.authentication_token.clone();
        let activated = call(&t::ActivateSessionRequest {
            request_header: RequestHeader {
                authentication_token: token.clone(),
                ..Default::default()
            },
            user_identity_token: t::ExtensionObject::new(t::AnonymousIdentityToken {
                policy_id: "anonymous".into(),
            }),
            ..Default::default()
        });
        assert!(activated
            .as_any()
            .downcast_ref::<t::ActivateSessionResponse>()
            .is_some());
        let rv = |node: NodeId, attr: u32, range: &str, encoding: Option<&str>| t::ReadValueId {
            node_id: node,
            attribute_id: attr,
            index_range: if range.is_empty() {
                t::UaString::null()
            } else {
                range.into()
            },
            data_encoding: encoding
                .map(|e| t::QualifiedName::new(0, e))
                .unwrap_or_default(),
        };
        let nodes = vec![
            rv(NodeId::ns0(2258), 13, "", None),
            rv(NodeId::ns0(2256), 13, "", None),
            rv(NodeId::ns0(85), 3, "", None),
            rv(NodeId::ns0(85), 13, "", None),
            rv(NodeId::ns0(999_999), 13, "", None),
            rv(NodeId::ns0(2255), 13, "0:0", None),
            rv(NodeId::ns0(2255), 13, "x", None),
            rv(NodeId::ns0(2255), 99, "", None),
            rv(NodeId::ns0(2258), 13, "", Some("Default XML")),
            rv(NodeId::ns0(2258), 13, "", Some("Default Binary")),
        ];
        let message =
            |ts: t::TimestampsToReturn, max_age: f64, nodes: Option<Vec<t::ReadValueId>>| {
                let mut msg = Vec::new();
                encode_message(
                    &ReadRequest {
                        request_header: RequestHeader {
                            authentication_token: token.clone(),
                            request_handle: 42,
                            ..Default::default()
                        },
                        max_age,
                        timestamps_to_return: ts,
                        nodes_to_read: nodes,
                    },
                    &mut msg,
                );
                msg
            };
        for ts in [
            t::TimestampsToReturn::Both,
            t::TimestampsToReturn::Neither,
            t::TimestampsToReturn::Source,
            t::TimestampsToReturn::Server,
        ] {
            let msg = message(ts, 0.0, Some(nodes.clone()));
            let fast = attribute::read_fast(&c, &msg, &limits).expect("the fast path");
            let general = dispatch_general(&c, &msg, &limits).now().unwrap();
            assert_eq!(fast, general, "{ts:?}");
        }
        // What the fast path leaves to the general one.
        let both = t::TimestampsToReturn::Both;
        for msg in [
            message(both, -1.0, Some(nodes.clone())),
            message(t::TimestampsToReturn(7), 0.0, Some(nodes.clone())),
            message(both, 0.0, Some(vec![])),
            message(both, 0.0, None),
            {
                let mut m = message(both, 0.0, Some(nodes.clone()));
                m.push(0);
                m
            },
        ] {
            assert!(attribute::read_fast(&c, &msg, &limits).is_none());
            assert!(dispatch(&c, &msg, &limits).now().is_some());
        }
        // Without the session's token: refused by the general path.
        let mut other = Vec::new();
        encode_message(
            &ReadRequest {
                request_header: RequestHeader::default(),
                nodes_to_read: Some(nodes),
                ..Default::default()
            },
            &mut other,
        );
        assert!(attribute::read_fast(&c, &other, &limits).is_none());
        let f = fault_of(&dispatch(&c, &other, &limits).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSessionIdInvalid
        );
    }

    #[test]
    fn undecodable_and_unknown_requests_get_faults() {
        let config = ServerConfig::default();
        let sessions = SessionTable::new(10);
        let limits = DecodeLimits::default();
        let mut msg = Vec::new();
        uascale_types::BinaryEncode::encode(
            &NodeId::ns0(ReadRequest::BINARY_ENCODING_ID),
            &mut msg,
        );
        msg.push(1);
        let f = fault_of(
            &dispatch(&ctx(&config, &sessions), &msg, &limits)
                .now()
                .unwrap(),
        );
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadDecodingError
        );
        let unknown = uascale_types::BinaryEncode::to_bytes(&NodeId::numeric(3, 9));
        let f = fault_of(
            &dispatch(&ctx(&config, &sessions), &unknown, &limits)
                .now()
                .unwrap(),
        );
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadServiceUnsupported
        );
    }
}
