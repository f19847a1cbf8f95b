//! Session service set (Part 4 §5.6): CreateSession, ActivateSession,
//! CloseSession. Cancel answers once the request queue exists.

use std::time::Duration;

use uascale_types::{
    ActivateSessionRequest, ActivateSessionResponse, AnonymousIdentityToken, ByteString,
    CloseSessionRequest, CloseSessionResponse, CreateSessionRequest, CreateSessionResponse,
    ExtensionObject, IssuedIdentityToken, NodeId, SignatureData, StatusCode, UserNameIdentityToken,
    X509IdentityToken,
};

use super::{discovery, ServiceContext};
use crate::session::Session;

/// Bounds for the revised session timeout: 10 s ..= 1 h; 0 asks for the
/// default of 60 s.
const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(3600);
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

fn random_bytes<const N: usize>() -> Result<[u8; N], StatusCode> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|_| StatusCode::BadInternalError)?;
    Ok(b)
}

/// CreateSession: a new, not yet activated session bound to this channel.
pub fn create_session(
    ctx: &ServiceContext<'_>,
    req: &CreateSessionRequest,
) -> Result<CreateSessionResponse, StatusCode> {
    let requested = req.requested_session_timeout;
    let timeout = if requested.is_finite() && requested > 0.0 {
        Duration::from_secs_f64((requested / 1000.0).min(MAX_SESSION_TIMEOUT.as_secs_f64()))
            .clamp(MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT)
    } else {
        DEFAULT_SESSION_TIMEOUT
    };
    let token = NodeId::opaque(0, random_bytes::<32>()?.to_vec());
    let session_id = NodeId::guid(1, uascale_types::Guid::from_bytes(random_bytes::<16>()?));
    let nonce = random_bytes::<32>()?;
    let session = Session {
        session_id: session_id.clone(),
        channel_id: ctx.channel_id,
        timeout,
        deadline: ctx.instant + ctx.config.activation_deadline,
        activated: false,
        name: req.session_name.clone(),
        locale_ids: Vec::new(),
        continuation_points: Vec::new(),
    };
    ctx.sessions
        .insert(token.clone(), session)
        .map_err(|e| e.status_code())?;
    Ok(CreateSessionResponse {
        response_header: ctx.response_header(&req.request_header),
        session_id,
        authentication_token: token,
        revised_session_timeout: timeout.as_secs_f64() * 1000.0,
        server_nonce: ByteString::new(nonce.to_vec()),
        server_certificate: ByteString::null(),
        server_endpoints: Some(discovery::endpoints(ctx)),
        server_software_certificates: Some(vec![]),
        server_signature: SignatureData::default(),
        max_request_message_size: ctx.config.channel.transport.max_message_size,
    })
}

/// Checks the identity token against the endpoint's policies: anonymous
/// only on SecurityPolicy None (no user store exists yet).
fn check_identity(token: &ExtensionObject) -> Result<(), StatusCode> {
    if token.is_null() {
        // Part 4 §5.6.3: a null token means anonymous.
        return Ok(());
    }
    if let Some(a) = token.downcast_ref::<AnonymousIdentityToken>() {
        return if a.policy_id == "anonymous" {
            Ok(())
        } else {
            Err(StatusCode::BadIdentityTokenInvalid)
        };
    }
    if token.downcast_ref::<UserNameIdentityToken>().is_some()
        || token.downcast_ref::<X509IdentityToken>().is_some()
        || token.downcast_ref::<IssuedIdentityToken>().is_some()
    {
        // The endpoint offers no policy for these tokens.
        return Err(StatusCode::BadIdentityTokenRejected);
    }
    Err(StatusCode::BadIdentityTokenInvalid)
}

/// ActivateSession: activates (or moves to this channel) the session.
pub fn activate_session(
    ctx: &ServiceContext<'_>,
    req: &ActivateSessionRequest,
) -> Result<ActivateSessionResponse, StatusCode> {
    check_identity(&req.user_identity_token)?;
    let nonce = random_bytes::<32>()?;
    let locales = req.locale_ids.clone().unwrap_or_default();
    ctx.sessions
        .with(
            &req.request_header.authentication_token,
            None,
            false,
            ctx.instant,
            |s| {
                // SecurityPolicy None: no client signature can prove ownership,
                // so moving to a new channel is allowed only for the anonymous
                // identity checked above.
                s.channel_id = ctx.channel_id;
                s.activated = true;
                s.deadline = ctx.instant + s.timeout;
                s.locale_ids = locales;
            },
        )
        .map_err(|e| e.status_code())?;
    Ok(ActivateSessionResponse {
        response_header: ctx.response_header(&req.request_header),
        server_nonce: ByteString::new(nonce.to_vec()),
        results: Some(vec![]),
        diagnostic_infos: Some(vec![]),
    })
}

/// CloseSession: removes the session (it has no subscriptions to delete yet).
pub fn close_session(
    ctx: &ServiceContext<'_>,
    req: &CloseSessionRequest,
) -> Result<CloseSessionResponse, StatusCode> {
    let token = &req.request_header.authentication_token;
    let id = ctx
        .sessions
        .with(token, Some(ctx.channel_id), false, ctx.instant, |s| {
            s.session_id.clone()
        })
        .map_err(|e| e.status_code())?;
    ctx.sessions.remove(token);
    ctx.subscriptions
        .close_session(&id, req.delete_subscriptions, StatusCode::BadSessionClosed);
    Ok(CloseSessionResponse {
        response_header: ctx.response_header(&req.request_header),
    })
}

/// Cancel: the outstanding requests of this session's channel with the
/// given requestHandle are answered `BadRequestCancelledByClient` - those
/// waiting in the request queue and those whose (asynchronous) handlers are
/// still running. A request already answered is not counted.
pub fn cancel(
    ctx: &ServiceContext<'_>,
    req: &uascale_types::CancelRequest,
) -> Result<uascale_types::CancelResponse, StatusCode> {
    ctx.sessions
        .with(
            &req.request_header.authentication_token,
            Some(ctx.channel_id),
            true,
            ctx.instant,
            |_| (),
        )
        .map_err(|e| e.status_code())?;
    let cancel_count = ctx.canceller.map_or(0, |c| c(req.request_handle));
    Ok(uascale_types::CancelResponse {
        response_header: ctx.response_header(&req.request_header),
        cancel_count,
    })
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::session::SessionTable;
    use crate::ServerConfig;
    use std::time::Instant;
    use uascale_types::{DateTime, RequestHeader, UaString};

    struct Fixture {
        config: ServerConfig,
        sessions: SessionTable,
        t0: Instant,
        space: crate::address_space::AddressSpace,
        managers: crate::node_manager::NodeManagers,
    }

    impl Fixture {
        fn new(max: usize) -> Self {
            Fixture {
                config: ServerConfig::default(),
                sessions: SessionTable::new(max),
                t0: Instant::now(),
                space: crate::address_space::AddressSpace::default(),
                managers: crate::node_manager::NodeManagers::default(),
            }
        }
        fn ctx(&self, channel_id: u32) -> ServiceContext<'_> {
            ServiceContext {
                config: &self.config,
                sessions: &self.sessions,
                channel_id,
                now: DateTime::from_ticks(1),
                instant: self.t0,
                address_space: &self.space,
                start_time: DateTime::from_ticks(1),
                managers: &self.managers,
                request_id: 1,
                sink: None,
                canceller: None,
                subscriptions: crate::services::subscription::tests_registry(),
            }
        }
    }

    fn create(f: &Fixture, timeout_ms: f64) -> Result<CreateSessionResponse, StatusCode> {
        create_session(
            &f.ctx(1),
            &CreateSessionRequest {
                requested_session_timeout: timeout_ms,
                session_name: UaString::from("t"),
                ..Default::default()
            },
        )
    }

    fn activate(
        f: &Fixture,
        channel: u32,
        token: &NodeId,
        identity: ExtensionObject,
    ) -> Result<ActivateSessionResponse, StatusCode> {
        activate_session(
            &f.ctx(channel),
            &ActivateSessionRequest {
                request_header: RequestHeader {
                    authentication_token: token.clone(),
                    ..Default::default()
                },
                user_identity_token: identity,
                ..Default::default()
            },
        )
    }

    #[test]
    fn create_revises_the_timeout_and_returns_fresh_secrets() {
        let f = Fixture::new(10);
        let a = create(&f, 0.0).unwrap();
        assert_eq!(a.revised_session_timeout, 60_000.0);
        assert_eq!(create(&f, 1.0).unwrap().revised_session_timeout, 10_000.0);
        assert_eq!(
            create(&f, 1e12).unwrap().revised_session_timeout,
            3_600_000.0
        );
        assert_eq!(
            create(&f, f64::NAN).unwrap().revised_session_timeout,
            60_000.0
        );
        let b = create(&f, 0.0).unwrap();
        assert_ne!(a.authentication_token, b.authentication_token);
        assert_ne!(a.server_nonce, b.server_nonce);
        assert_eq!(a.server_nonce.as_bytes().map(<[u8]>::len), Some(32));
        assert_eq!(a.server_endpoints.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn too_many_sessions() {
        let f = Fixture::new(1);
        create(&f, 0.0).unwrap();
        assert_eq!(create(&f, 0.0).unwrap_err(), StatusCode::BadTooManySessions);
    }

    #[test]
    fn activation_identities() {
        let f = Fixture::new(10);
        let token = create(&f, 0.0).unwrap().authentication_token;
        let anon = |policy: &str| {
            ExtensionObject::new(AnonymousIdentityToken {
                policy_id: UaString::from(policy),
            })
        };
        assert_eq!(
            activate(&f, 1, &token, anon("other")).unwrap_err(),
            StatusCode::BadIdentityTokenInvalid
        );
        let user = ExtensionObject::new(UserNameIdentityToken {
            policy_id: UaString::from("anonymous"),
            user_name: UaString::from("u"),
            ..Default::default()
        });
        assert_eq!(
            activate(&f, 1, &token, user).unwrap_err(),
            StatusCode::BadIdentityTokenRejected
        );
        let unknown = ExtensionObject::Opaque {
            type_id: NodeId::numeric(2, 1),
            body: ByteString::new(vec![]),
        };
        assert_eq!(
            activate(&f, 1, &token, unknown).unwrap_err(),
            StatusCode::BadIdentityTokenInvalid
        );
        activate(&f, 1, &token, anon("anonymous")).unwrap();
        // A null token is anonymous too; activation may move the session to a new channel.
        activate(&f, 2, &token, ExtensionObject::null()).unwrap();
        assert!(f.sessions.with(&token, Some(2), true, f.t0, |_| ()).is_ok());
        assert_eq!(
            activate(
                &f,
                1,
                &NodeId::opaque(0, vec![0; 32]),
                ExtensionObject::null()
            )
            .unwrap_err(),
            StatusCode::BadSessionIdInvalid
        );
    }

    #[test]
    fn close_requires_the_owning_channel() {
        let f = Fixture::new(10);
        let token = create(&f, 0.0).unwrap().authentication_token;
        let req = CloseSessionRequest {
            request_header: RequestHeader {
                authentication_token: token.clone(),
                ..Default::default()
            },
            delete_subscriptions: true,
        };
        assert_eq!(
            close_session(&f.ctx(9), &req).unwrap_err(),
            StatusCode::BadSecureChannelIdInvalid
        );
        close_session(&f.ctx(1), &req).unwrap();
        assert!(f.sessions.is_empty());
        assert_eq!(
            close_session(&f.ctx(1), &req).unwrap_err(),
            StatusCode::BadSessionIdInvalid
        );
    }

    #[test]
    fn unactivated_session_is_closed_at_the_activation_deadline() {
        let f = Fixture::new(10);
        create(&f, 0.0).unwrap();
        assert!(f.sessions.expire(f.t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(f.sessions.expire(f.t0 + Duration::from_secs(10)).len(), 1);
    }
}
