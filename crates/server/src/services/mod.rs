//! The services, one module per Part 4 service set, and the dispatcher that
//! turns a decoded request into a response message.

pub mod attribute;
pub mod discovery;
pub mod method;
pub mod session;
pub mod view;

use uascale_types::{
    decode_message, encode_message, BinaryDecode, DateTime, DecodeLimits, DynStructure, NodeId,
    Reader, RequestHeader, ResponseHeader, ServiceFault, StatusCode,
};

use crate::config::ServerConfig;
use crate::session::SessionTable;

/// What a service handler sees of the server.
#[derive(Debug)]
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
    /// Server-wide security: PKI, own certificate and key, users.
    pub security: &'a crate::security::SecurityState,
    /// What the request's secure channel was opened with.
    pub channel: &'a uascale_proto::security::ChannelSecurity,
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

impl ServiceContext<'_> {
    /// A Good response header for a request.
    pub fn response_header(&self, req: &RequestHeader) -> ResponseHeader {
        ResponseHeader {
            timestamp: self.now,
            request_handle: req.request_handle,
            service_result: StatusCode::Good,
            ..Default::default()
        }
    }
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

/// Handles one request message (encoding id + body) and returns the
/// response message to send.
pub fn dispatch(ctx: &ServiceContext<'_>, message: &[u8], limits: &DecodeLimits) -> Vec<u8> {
    let response: Box<dyn DynStructure> = match Reader::new(message, limits).and_then(|mut r| {
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
            Box::new(service_fault(
                ctx.now,
                peek_request_handle(message, limits),
                status,
            ))
        }
        Ok(req) => route(ctx, req.as_ref()).unwrap_or_else(|| {
            // Not implemented yet: a bad session still gets its own code.
            let status = check_session(ctx, message, limits)
                .err()
                .unwrap_or(StatusCode::BadServiceUnsupported);
            Box::new(service_fault(
                ctx.now,
                peek_request_handle(message, limits),
                status,
            ))
        }),
    };
    let mut out = Vec::with_capacity(256);
    encode_message(response.as_ref(), &mut out);
    out
}

fn boxed<T: DynStructure>(
    ctx: &ServiceContext<'_>,
    handle: u32,
    r: Result<T, StatusCode>,
) -> Box<dyn DynStructure> {
    match r {
        Ok(v) => Box::new(v),
        Err(status) => Box::new(service_fault(ctx.now, handle, status)),
    }
}

/// The handler for a request type; `None` for services this server does
/// not implement (yet). Requests other than discovery and session
/// establishment need an activated session of this channel.
fn route(ctx: &ServiceContext<'_>, req: &dyn DynStructure) -> Option<Box<dyn DynStructure>> {
    use uascale_types as t;
    let any = req.as_any();
    if let Some(r) = any.downcast_ref::<t::GetEndpointsRequest>() {
        return Some(Box::new(discovery::get_endpoints(ctx, r)));
    }
    if let Some(r) = any.downcast_ref::<t::FindServersRequest>() {
        return Some(Box::new(discovery::find_servers(ctx, r)));
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
    if let Some(r) = any.downcast_ref::<t::CloseSessionRequest>() {
        return Some(boxed(
            ctx,
            r.request_header.request_handle,
            session::close_session(ctx, r),
        ));
    }
    macro_rules! with_session {
        ($($req:ty => $handler:path),* $(,)?) => {$(
            if let Some(r) = any.downcast_ref::<$req>() {
                let h = &r.request_header;
                let result = ctx
                    .sessions
                    .with(&h.authentication_token, Some(ctx.channel_id), true, ctx.instant, |_| ())
                    .map_err(|e| e.status_code())
                    .and_then(|()| $handler(ctx, r));
                return Some(boxed(ctx, h.request_handle, result));
            }
        )*};
    }
    with_session!(
        t::ReadRequest => attribute::read,
        t::WriteRequest => attribute::write,
        t::HistoryReadRequest => attribute::history_read,
        t::CallRequest => method::call,
        t::BrowseRequest => view::browse,
        t::BrowseNextRequest => view::browse_next,
        t::TranslateBrowsePathsToNodeIdsRequest => view::translate,
        t::RegisterNodesRequest => view::register_nodes,
        t::UnregisterNodesRequest => view::unregister_nodes,
    );
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
        ServiceContext {
            config,
            sessions,
            channel_id: 1,
            now: DateTime::from_ticks(1),
            // The origin of the test's time.
            #[allow(clippy::disallowed_methods)]
            instant: std::time::Instant::now(),
            address_space: space(),
            start_time: DateTime::from_ticks(1),
            managers: managers(),
            security: no_security().0,
            channel: no_security().1,
        }
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
        let f = fault_of(&dispatch(
            &ctx(&config, &sessions),
            &msg,
            &DecodeLimits::default(),
        ));
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSessionIdInvalid,
            "no session"
        );
        assert_eq!(f.response_header.request_handle, 77);
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
        let f = fault_of(&dispatch(&ctx(&config, &sessions), &msg, &limits));
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadDecodingError
        );
        let unknown = uascale_types::BinaryEncode::to_bytes(&NodeId::numeric(3, 9));
        let f = fault_of(&dispatch(&ctx(&config, &sessions), &unknown, &limits));
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadServiceUnsupported
        );
    }
}
