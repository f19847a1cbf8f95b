//! From a request message to its answer: the request decoded into a
//! [`Request`], routed once to its handler in [`crate::services`], the
//! session resolved once for the services that need one, and a handler's
//! [`ServiceError`] turned into its ServiceFault in one place.
//!
//! This is the seam where a decoded request becomes work: the request
//! scheduler (isolation lanes, protected entries) sits between
//! [`Request::decode`] and [`execute`], and [`Request::class`] is what it
//! sorts by.

use uascale_types::{
    encode_message, BinaryDecode, DecodeLimits, DynStructure, NodeId, Reader, RequestHeader,
    StatusCode, Structure,
};

use crate::context::ServiceContext;
use crate::error::{service_fault, ServiceError};
use crate::metrics::Service;
use crate::reply::{Answer, BoxFuture};
use crate::services::{attribute, discovery, method, monitored_item, session, subscription, view};

macro_rules! requests {
    ($($variant:ident($ty:ident)),* $(,)?) => {
        /// A decoded service request this server implements (or the header
        /// of one it does not).
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum Request {
            $(
                #[doc = concat!("`", stringify!($ty), "`.")]
                $variant(uascale_types::$ty),
            )*
            /// A request of a service this server does not implement:
            /// only its header was decoded.
            Unsupported(RequestHeader),
        }

        impl Request {
            /// Decodes a request message (encoding id + body), bounded by
            /// `limits`. An unknown encoding id is `BadServiceUnsupported`.
            pub fn decode(message: &[u8], limits: &DecodeLimits) -> Result<Request, ServiceError> {
                let mut r = Reader::new(message, limits).map_err(|e| ServiceError::client(e.status_code()))?;
                let id = NodeId::decode(&mut r).map_err(|e| ServiceError::client(e.status_code()))?;
                let bad = |e: uascale_types::DecodeError| ServiceError::client(e.status_code());
                let request = match id.as_ns0() {
                    $(
                        Some(<uascale_types::$ty as Structure>::BINARY_ENCODING_ID) => {
                            Request::$variant(uascale_types::$ty::decode(&mut r).map_err(bad)?)
                        }
                    )*
                    _ => {
                        // Every request starts with a RequestHeader: enough
                        // for the session's own error and the handle.
                        let header = RequestHeader::decode(&mut r).map_err(|_| {
                            ServiceError::client(StatusCode::BadServiceUnsupported)
                        })?;
                        return Ok(Request::Unsupported(header));
                    }
                };
                r.finish().map_err(bad)?;
                Ok(request)
            }

            /// The request's header.
            pub fn header(&self) -> &RequestHeader {
                match self {
                    $(Request::$variant(r) => &r.request_header,)*
                    Request::Unsupported(h) => h,
                }
            }

            /// The service's name (`Read`, `CreateSession`, ...), for logs
            /// and metrics.
            pub fn service_name(&self) -> &'static str {
                match self {
                    $(Request::$variant(_) => stringify!($variant),)*
                    Request::Unsupported(_) => "Unsupported",
                }
            }

            /// The service, as the request counters know it.
            pub fn service(&self) -> Service {
                match self {
                    $(Request::$variant(_) => Service::$variant,)*
                    Request::Unsupported(_) => Service::Unsupported,
                }
            }
        }
    };
}

requests! {
    GetEndpoints(GetEndpointsRequest),
    FindServers(FindServersRequest),
    CreateSession(CreateSessionRequest),
    ActivateSession(ActivateSessionRequest),
    CloseSession(CloseSessionRequest),
    Cancel(CancelRequest),
    Read(ReadRequest),
    Write(WriteRequest),
    HistoryRead(HistoryReadRequest),
    Call(CallRequest),
    Browse(BrowseRequest),
    BrowseNext(BrowseNextRequest),
    TranslateBrowsePaths(TranslateBrowsePathsToNodeIdsRequest),
    RegisterNodes(RegisterNodesRequest),
    UnregisterNodes(UnregisterNodesRequest),
    CreateSubscription(CreateSubscriptionRequest),
    ModifySubscription(ModifySubscriptionRequest),
    SetPublishingMode(SetPublishingModeRequest),
    Publish(PublishRequest),
    Republish(RepublishRequest),
    DeleteSubscriptions(DeleteSubscriptionsRequest),
    TransferSubscriptions(TransferSubscriptionsRequest),
    CreateMonitoredItems(CreateMonitoredItemsRequest),
    ModifyMonitoredItems(ModifyMonitoredItemsRequest),
    SetMonitoringMode(SetMonitoringModeRequest),
    SetTriggering(SetTriggeringRequest),
    DeleteMonitoredItems(DeleteMonitoredItemsRequest),
}

/// How a request is treated when the server is busy (docs/scalability.md §3:
/// what a flood of ordinary requests must not crowd out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// GetEndpoints, FindServers: no session.
    Discovery,
    /// CreateSession, ActivateSession: a session being established (or,
    /// on another channel, reconnecting).
    Bootstrap,
    /// TransferSubscriptions, Republish: a client recovering after a
    /// reconnect.
    Reconnect,
    /// CloseSession, Cancel, DeleteSubscriptions, SetPublishingMode: what
    /// lets a client shed its own load.
    Control,
    /// Publish: held until there is something to send.
    Publish,
    /// Everything else.
    Normal,
}

impl Request {
    /// The class the request scheduler sorts the request by.
    pub fn class(&self) -> RequestClass {
        match self {
            Request::GetEndpoints(_) | Request::FindServers(_) => RequestClass::Discovery,
            Request::CreateSession(_) | Request::ActivateSession(_) => RequestClass::Bootstrap,
            Request::TransferSubscriptions(_) | Request::Republish(_) => RequestClass::Reconnect,
            Request::CloseSession(_)
            | Request::Cancel(_)
            | Request::DeleteSubscriptions(_)
            | Request::SetPublishingMode(_) => RequestClass::Control,
            Request::Publish(_) => RequestClass::Publish,
            _ => RequestClass::Normal,
        }
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
        /// True when the future does the request's work (an asynchronous
        /// node manager) and keeps its worker busy; false when it waits in
        /// another bounded stage (the session-establishment waiting room)
        /// and the worker is free at once.
        holds_worker: bool,
    },
    /// A handler took a [`Responder`](crate::reply::Responder) and answers
    /// by itself (a parked Publish); nothing to send now.
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
/// handler answers through a Responder).
enum Routed {
    Now(Box<dyn DynStructure>),
    /// The work continues in the future (it holds the worker).
    Later(BoxFuture<Result<Box<dyn DynStructure>, ServiceError>>),
    /// The future waits in another bounded stage (not a worker).
    Waiting(BoxFuture<Result<Box<dyn DynStructure>, ServiceError>>),
    Parked,
}

/// Reads the RequestHeader's handle of a request message that did not
/// decode as a whole (0 when even that fails).
pub fn peek_request_handle(message: &[u8], limits: &DecodeLimits) -> u32 {
    let Ok(mut r) = Reader::new(message, limits) else {
        return 0;
    };
    if NodeId::decode(&mut r).is_err() {
        return 0;
    }
    RequestHeader::decode(&mut r).map_or(0, |h| h.request_handle)
}

/// Handles one request message (encoding id + body) in `ctx` (whose
/// request id the caller set): the response message to send now, or how
/// it will be answered later.
pub fn dispatch(ctx: &mut ServiceContext, message: &[u8]) -> Dispatched {
    // The most frequent request, without its intermediate vectors (not on
    // a channel that may only discover).
    if discovery_only(ctx) {
        return dispatch_general(ctx, message);
    }
    if let Some(response) = attribute::read_fast(ctx, message) {
        ctx.state.metrics.requests.good(Service::Read);
        return Dispatched::Now(response);
    }
    dispatch_general(ctx, message)
}

/// Every request through its decoded [`Request`] (what [`dispatch`] does
/// when no fast path takes it).
pub fn dispatch_general(ctx: &mut ServiceContext, message: &[u8]) -> Dispatched {
    let limits = &ctx.state.channel_config.decode;
    let request = match Request::decode(message, limits) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "request did not decode");
            let handle = peek_request_handle(message, limits);
            count_failure(&ctx.state, Service::Invalid, &e);
            return Dispatched::Now(encode(&e.to_fault(ctx.now, handle)));
        }
    };
    execute(ctx, request)
}

/// Runs the handler of a decoded request in `ctx`.
pub fn execute(ctx: &mut ServiceContext, request: Request) -> Dispatched {
    ctx.session = None;
    let handle = request.header().request_handle;
    let service = request.service();
    match route(ctx, request) {
        Ok(Routed::Now(response)) => {
            ctx.state.metrics.requests.good(service);
            Dispatched::Now(encode(response.as_ref()))
        }
        Ok(Routed::Later(future)) => later(ctx, handle, service, future, true),
        Ok(Routed::Waiting(future)) => later(ctx, handle, service, future, false),
        // Counted when the subscription engine answers it
        // (`ServerMetrics::publish_answered`).
        Ok(Routed::Parked) => Dispatched::Parked,
        Err(e) => {
            count_failure(&ctx.state, service, &e);
            Dispatched::Now(encode(&e.to_fault(ctx.now, handle)))
        }
    }
}

/// The answer of a request that completes in `future`, encoded and counted
/// when it does.
fn later(
    ctx: &ServiceContext,
    handle: u32,
    service: Service,
    future: BoxFuture<Result<Box<dyn DynStructure>, ServiceError>>,
    holds_worker: bool,
) -> Dispatched {
    let now = ctx.now;
    let state = std::sync::Arc::clone(&ctx.state);
    Dispatched::Later {
        request_handle: handle,
        holds_worker,
        future: Box::pin(async move {
            match future.await {
                Ok(response) => {
                    state.metrics.requests.good(service);
                    encode(response.as_ref())
                }
                Err(e) => {
                    count_failure(&state, service, &e);
                    encode(&e.to_fault(now, handle))
                }
            }
        }),
    }
}

/// Counts a request of `service` answered with the ServiceFault of `e`,
/// and the refusal when it is a busy answer.
fn count_failure(state: &crate::state::ServerState, service: Service, e: &ServiceError) {
    state.metrics.requests.record(service, e.status_code());
    if let Some(shed) = e.refusal() {
        state.metrics.shed(&shed);
    }
}

fn encode(response: &dyn DynStructure) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    encode_message(response, &mut out);
    out
}

fn now<T: DynStructure>(r: T) -> Result<Routed, ServiceError> {
    Ok(Routed::Now(Box::new(r)))
}

fn answer<T: DynStructure>(a: Answer<T>) -> Result<Routed, ServiceError> {
    Ok(match a {
        Answer::Now(v) => Routed::Now(Box::new(v)),
        Answer::Later(f) => Routed::Later(Box::pin(async move {
            f.await.map(|v| Box::new(v) as Box<dyn DynStructure>)
        })),
    })
}

/// Runs the handler of `request`. Requests other than discovery and
/// session establishment need an activated session of this channel,
/// resolved here once and kept in `ctx.session` for the handler.
/// True on a channel opened with SecurityPolicy None when the server
/// offers no None endpoint: the channel exists so that a client can
/// discover the secured endpoints (GetEndpoints, FindServers); any other
/// request on it is `BadSecurityPolicyRejected`.
fn discovery_only(ctx: &ServiceContext) -> bool {
    ctx.channel.policy.is_none()
        && !ctx
            .state
            .channel_config
            .security
            .offers_policy(uascale_crypto::policy::SecurityPolicy::None)
}

fn route(ctx: &mut ServiceContext, request: Request) -> Result<Routed, ServiceError> {
    use Request as R;
    if discovery_only(ctx) && request.class() != RequestClass::Discovery {
        return Err(ServiceError::from(StatusCode::BadSecurityPolicyRejected));
    }
    match request {
        R::GetEndpoints(r) => return now(discovery::get_endpoints(ctx, &r)),
        R::FindServers(r) => return now(discovery::find_servers(ctx, &r)),
        R::CreateSession(r) => return create_session(ctx, r),
        R::ActivateSession(r) => return answer(session::activate_session_answer(ctx, r)?),
        R::CloseSession(r) => return now(session::close_session(ctx, &r)?),
        _ => {}
    }
    ctx.resolve(&request.header().authentication_token)?;
    let ctx = &*ctx;
    match request {
        R::Cancel(r) => now(session::cancel(ctx, &r)?),
        R::Read(r) => answer(attribute::read_answer(ctx, &r)?),
        R::Write(r) => answer(attribute::write_answer(ctx, &r)?),
        R::Call(r) => answer(method::call_answer(ctx, &r)?),
        R::HistoryRead(r) => now(attribute::history_read(ctx, &r)?),
        R::Browse(r) => now(view::browse(ctx, &r)?),
        R::BrowseNext(r) => now(view::browse_next(ctx, &r)?),
        R::TranslateBrowsePaths(r) => now(view::translate(ctx, &r)?),
        R::RegisterNodes(r) => now(view::register_nodes(ctx, &r)?),
        R::UnregisterNodes(r) => now(view::unregister_nodes(ctx, &r)?),
        R::CreateSubscription(r) => now(subscription::create_subscription(ctx, &r)?),
        R::ModifySubscription(r) => now(subscription::modify_subscription(ctx, &r)?),
        R::SetPublishingMode(r) => now(subscription::set_publishing_mode(ctx, &r)?),
        R::Republish(r) => now(subscription::republish(ctx, &r)?),
        R::DeleteSubscriptions(r) => now(subscription::delete_subscriptions(ctx, &r)?),
        R::TransferSubscriptions(r) => now(subscription::transfer_subscriptions(ctx, &r)?),
        R::CreateMonitoredItems(r) => now(monitored_item::create_monitored_items(ctx, &r)?),
        R::ModifyMonitoredItems(r) => now(monitored_item::modify_monitored_items(ctx, &r)?),
        R::SetMonitoringMode(r) => now(monitored_item::set_monitoring_mode(ctx, &r)?),
        R::SetTriggering(r) => now(monitored_item::set_triggering(ctx, &r)?),
        R::DeleteMonitoredItems(r) => now(monitored_item::delete_monitored_items(ctx, &r)?),
        R::Publish(r) => {
            // Parked without a response: the subscription engine answers
            // through the Responder (docs/scalability.md §4), which holds a place
            // of the parked stage until then.
            let Some(to) = ctx.responder(r.request_header.request_handle) else {
                return Err(ServiceError::server(StatusCode::BadWouldBlock));
            };
            let place = ctx.state.scheduler.park().map_err(ServiceError::shed)?;
            subscription::publish(ctx, &r, to.holding(place));
            Ok(Routed::Parked)
        }
        R::Unsupported(_) => Err(ServiceError::client(StatusCode::BadServiceUnsupported)),
        R::GetEndpoints(_)
        | R::FindServers(_)
        | R::CreateSession(_)
        | R::ActivateSession(_)
        | R::CloseSession(_) => Err(ServiceError::server(StatusCode::BadInternalError)),
    }
}

/// CreateSession behind the session-establishment stage (docs/scalability.md
/// §2): a place is taken before any certificate or signature work; none
/// free - a wait in the waiting room when it would be short
/// (`establishment_wait_ms`, `session_establishment_queue_limit`), else
/// `BadServerTooBusy` with the hint and a retry ticket. A ticket the
/// client echoed (`RetryTicket` in the additionalHeader) puts it ahead of
/// clients without one.
fn create_session(
    ctx: &ServiceContext,
    r: uascale_types::CreateSessionRequest,
) -> Result<Routed, ServiceError> {
    use crate::admission::StageDecision;
    let state = std::sync::Arc::clone(&ctx.state);
    // A refusal is a rejected session (RejectedSessionCount).
    let busy = move |refusal: crate::admission::Refusal| {
        state.sessions.note_rejected(false);
        ServiceError::shed(crate::shed::Shed::refused(
            crate::shed::Stage::Establishment,
            crate::shed::Reason::EstablishmentLimit,
            &refusal,
        ))
    };
    let ticket = crate::error::retry_ticket_of(&r.request_header);
    match ctx
        .state
        .admission
        .establish(ctx.peer_ip, ticket.as_deref(), ctx.instant)
    {
        StageDecision::Admit(place) => {
            let response = session::create_session(ctx, &r);
            drop(place);
            now(response?)
        }
        StageDecision::Refuse(refusal) => Err(busy(refusal)),
        // Admitted to the room for a wait predicted within
        // `establishment_wait_ms`, and given up at `until` (then refused
        // with a slot and a ticket, as if it had not waited).
        StageDecision::Wait { waiting, until } => {
            let mut ctx = ctx.clone();
            Ok(Routed::Waiting(Box::pin(async move {
                use futures_util::future::{select, Either};
                let timer = crate::delay::Delay::until(until);
                let place = match select(waiting, timer).await {
                    Either::Left((place, _)) => place.map_err(&busy)?,
                    Either::Right(((), _)) => {
                        let now = crate::state::clock().instant;
                        let refusal = ctx
                            .state
                            .admission
                            .establishment_timed_out(ctx.peer_ip, now);
                        return Err(busy(refusal));
                    }
                };
                // The request runs now, not when it arrived.
                let now = crate::state::clock();
                ctx.now = now.utc;
                ctx.instant = now.instant;
                let response = session::create_session(&ctx, &r);
                drop(place);
                response.map(|v| Box::new(v) as Box<dyn DynStructure>)
            })))
        }
    }
}

/// A ServiceFault for `status`, encoded (for the shell's own faults, e.g.
/// a response too large for the client).
pub fn encoded_fault(
    now: uascale_types::DateTime,
    request_handle: u32,
    status: StatusCode,
) -> Vec<u8> {
    encode(&service_fault(now, request_handle, status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::{decode_message, ReadRequest, ServiceFault};

    fn ctx() -> ServiceContext {
        // The origin of the test's time.
        #[allow(clippy::disallowed_methods)]
        let t0 = std::time::Instant::now();
        ServiceContext::for_tests(
            crate::state::ServerState::empty(crate::ServerConfig::default()),
            t0,
        )
    }

    fn ctx_with(config: crate::ServerConfig) -> ServiceContext {
        // The origin of the test's time.
        #[allow(clippy::disallowed_methods)]
        let t0 = std::time::Instant::now();
        ServiceContext::for_tests(crate::state::ServerState::empty(config), t0)
    }

    fn create_session_message() -> Vec<u8> {
        let mut msg = Vec::new();
        encode_message(
            &uascale_types::CreateSessionRequest {
                request_header: RequestHeader {
                    request_handle: 5,
                    ..Default::default()
                },
                requested_session_timeout: 60_000.0,
                ..Default::default()
            },
            &mut msg,
        );
        msg
    }

    /// docs/scalability.md §2: sessions created and not activated count against
    /// `max_concurrent_session_establishment`; over it CreateSession is
    /// refused BadServerTooBusy with the RetryAfterMs additionalHeader
    /// (and counted as a rejected session), until one settles.
    #[test]
    fn establishment_over_the_limit_is_busy_with_a_hint() {
        let mut config = crate::ServerConfig::default();
        config.admission.max_concurrent_session_establishment = Some(2);
        // No waiting room: refused at once.
        config.admission.establishment_wait_ms = 0;
        let mut c = ctx_with(config);
        let msg = create_session_message();
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let out = dispatch(&mut c, &msg).now().unwrap();
            let limits = DecodeLimits::default();
            let m = decode_message(&mut Reader::new(&out, &limits).unwrap()).unwrap();
            let created = m
                .as_any()
                .downcast_ref::<uascale_types::CreateSessionResponse>()
                .expect("created");
            tokens.push(created.authentication_token.clone());
        }
        let f = fault_of(&dispatch(&mut c, &msg).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadServerTooBusy
        );
        assert_eq!(f.response_header.request_handle, 5);
        let hint = crate::error::retry_after_of(&f.response_header).expect("a hint");
        assert!(hint > std::time::Duration::ZERO);
        // And a retry ticket beside it.
        let params = f
            .response_header
            .additional_header
            .downcast_ref::<uascale_types::AdditionalParametersType>()
            .expect("parameters");
        assert!(params.parameters.iter().flatten().any(|p| {
            p.key.name.as_str_or_empty() == crate::error::RETRY_TICKET_KEY
                && matches!(&p.value, uascale_types::Variant::String(t) if t.as_str_or_empty().len() == 34)
        }));
        assert_eq!(c.state.sessions.rejected_count(), 1);
        // One closes without activation: a place frees.
        c.state.sessions.close(&tokens[0], true);
        assert!(dispatch(&mut c, &msg)
            .now()
            .map(|out| {
                let limits = DecodeLimits::default();
                decode_message(&mut Reader::new(&out, &limits).unwrap())
                    .unwrap()
                    .as_any()
                    .downcast_ref::<uascale_types::CreateSessionResponse>()
                    .is_some()
            })
            .unwrap_or(false));
    }

    /// The load-based ServiceLevel follows the session count (docs/scalability.md
    /// §2) inside Part 4's Healthy range: 255 idle, 200 at
    /// max_session_count.
    #[test]
    fn service_level_follows_the_session_count() {
        let mut config = crate::ServerConfig::default();
        config.server.max_session_count = 10;
        let mut c = ctx_with(config);
        let msg = create_session_message();
        assert_eq!(c.state.service_level(), 255);
        for _ in 0..2 {
            dispatch(&mut c, &msg).now().unwrap();
        }
        assert_eq!(
            c.state.service_level(),
            244,
            "20 %: a fifth of the way down"
        );
        for _ in 0..8 {
            dispatch(&mut c, &msg).now().unwrap();
        }
        assert_eq!(c.state.service_level(), 200, "full: still healthy");
    }

    /// A CreateSession admitted to the establishment stage's waiting room
    /// is given up at its deadline when no place frees: refused busy with
    /// a slot and a retry ticket, counted as a timed-out wait.
    #[test]
    fn an_establishment_wait_ends_at_its_deadline() {
        let mut config = crate::ServerConfig::default();
        config.admission.max_concurrent_session_establishment = Some(1);
        config.admission.establishment_wait_ms = 20;
        let mut c = ctx_with(config);
        let msg = create_session_message();
        // The first session holds the only place until it is activated.
        assert!(dispatch(&mut c, &msg).now().is_some());
        let Dispatched::Later { future, .. } = dispatch(&mut c, &msg) else {
            panic!("the second CreateSession did not wait");
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt.block_on(future);
        let f = fault_of(&out);
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadServerTooBusy
        );
        assert!(crate::error::retry_after_of(&f.response_header).is_some());
        let counts = c
            .state
            .admission
            .stage_counts(crate::admission::Stage::Establishment);
        assert_eq!(counts.wait_timeouts, 1);
    }

    /// A server without a None endpoint still opens None channels, for
    /// discovery only: GetEndpoints answers, CreateSession and a Read are
    /// `BadSecurityPolicyRejected`.
    #[test]
    fn a_none_channel_without_a_none_endpoint_only_discovers() {
        use uascale_crypto::policy::SecurityPolicy;
        use uascale_types::MessageSecurityMode;
        let mut security = crate::security::SecurityState::none_only();
        security.endpoints = vec![(
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::SignAndEncrypt,
        )];
        let state = crate::state::ServerState::from_parts(
            crate::ServerConfig::default(),
            crate::address_space::AddressSpace::default(),
            crate::node_manager::NodeManagers::default(),
            security,
        );
        #[allow(clippy::disallowed_methods)]
        let mut c = ServiceContext::for_tests(state, std::time::Instant::now());
        assert!(c.channel.policy.is_none());
        let mut get = Vec::new();
        encode_message(
            &uascale_types::GetEndpointsRequest {
                request_header: RequestHeader {
                    request_handle: 7,
                    ..Default::default()
                },
                ..Default::default()
            },
            &mut get,
        );
        let out = dispatch(&mut c, &get).now().unwrap();
        let limits = DecodeLimits::default();
        let m = decode_message(&mut Reader::new(&out, &limits).unwrap()).unwrap();
        assert!(m
            .as_any()
            .downcast_ref::<uascale_types::GetEndpointsResponse>()
            .is_some());
        let f = fault_of(&dispatch(&mut c, &create_session_message()).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSecurityPolicyRejected
        );
        let mut read = Vec::new();
        encode_message(
            &uascale_types::ReadRequest {
                request_header: RequestHeader {
                    request_handle: 8,
                    ..Default::default()
                },
                nodes_to_read: Some(vec![uascale_types::ReadValueId {
                    node_id: NodeId::ns0(2258),
                    attribute_id: 13,
                    ..Default::default()
                }]),
                ..Default::default()
            },
            &mut read,
        );
        let f = fault_of(&dispatch(&mut c, &read).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSecurityPolicyRejected
        );
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
        let mut msg = Vec::new();
        let req = ReadRequest {
            request_header: RequestHeader {
                request_handle: 77,
                ..Default::default()
            },
            ..Default::default()
        };
        encode_message(&req, &mut msg);
        let f = fault_of(&dispatch(&mut ctx(), &msg).now().unwrap());
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
        let mut c = ctx();
        let limits = DecodeLimits::default();
        let mut call = |req: &dyn DynStructure| {
            let mut msg = Vec::new();
            encode_message(req, &mut msg);
            let out = dispatch_general(&mut c, &msg).now().unwrap();
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
            let fast = attribute::read_fast(&mut c, &msg).expect("the fast path");
            let general = dispatch_general(&mut c, &msg).now().unwrap();
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
            assert!(attribute::read_fast(&mut c, &msg).is_none());
            assert!(dispatch(&mut c, &msg).now().is_some());
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
        assert!(attribute::read_fast(&mut c, &other).is_none());
        let f = fault_of(&dispatch(&mut c, &other).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSessionIdInvalid
        );
    }

    #[test]
    fn undecodable_and_unknown_requests_get_faults() {
        let mut msg = Vec::new();
        uascale_types::BinaryEncode::encode(
            &NodeId::ns0(ReadRequest::BINARY_ENCODING_ID),
            &mut msg,
        );
        msg.push(1);
        let f = fault_of(&dispatch(&mut ctx(), &msg).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadDecodingError
        );
        let unknown = uascale_types::BinaryEncode::to_bytes(&NodeId::numeric(3, 9));
        let f = fault_of(&dispatch(&mut ctx(), &unknown).now().unwrap());
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadServiceUnsupported
        );
    }
}
