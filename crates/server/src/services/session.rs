//! Session service set (Part 4 §5.6): CreateSession, ActivateSession,
//! CloseSession, Cancel.
//!
//! On a secured channel CreateSession checks that the client certificate is
//! the channel's and its applicationUri the one the client claims, and
//! signs clientCertificate + clientNonce; ActivateSession verifies the
//! client's signature over serverCertificate + serverNonce, then the user
//! token: Anonymous, UserName (password decrypted with the server key and
//! checked against the argon2 hash) or X509 (certificate validated, token
//! signature verified). All RSA and argon2 work runs before or after the
//! session-table lock, never under it.
//!
//! ECC policies: the signatures are the policy's (ECDSA `r||s` or Ed25519,
//! algorithm left empty), channel-bound under SecureChannelEnhancements
//! ([`uascale_proto::security::create_session_signed_data`]); a client that
//! asks for it in the request's additionalHeader gets a session ephemeral
//! key (ECDHKey) in the response's, and a UserName password then comes as
//! an EccEncryptedSecret encrypted for that key; an X509 user token is
//! signed by a key on the policy's curve
//! ([`uascale_proto::security::user_token_signed_data`]).

use std::time::{Duration, SystemTime};

use std::sync::Arc;

use uascale_crypto::ecc::EphemeralKey;
use uascale_crypto::policy::SecurityPolicy;
use uascale_proto::ecc_secret;
use uascale_proto::security::{
    activate_session_signed_data, create_session_signed_data, user_token_signed_data, Identity,
    PublicKey,
};
use uascale_types::{
    ActivateSessionRequest, ActivateSessionResponse, AnonymousIdentityToken, ByteString,
    CloseSessionRequest, CloseSessionResponse, CreateSessionRequest, CreateSessionResponse,
    ExtensionObject, IssuedIdentityToken, NodeId, RequestHeader, SignatureData, StatusCode,
    UaString, UserNameIdentityToken, X509IdentityToken,
};

use super::discovery;
use crate::audit::{self, SessionAction};
use crate::cluster::node::{self as cluster_node, ClusterNode};
use crate::cluster::record;
use crate::cluster::takeover::ClaimError;
use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::identity::{self, UserIdentity};
use crate::metrics::is_security_rejection;
use crate::reply::Answer;
use crate::session::{Activation, EccSession, Session};

/// What a request's additionalHeader asked of the session's ECDHKey: None
/// when it asked nothing; else the response header to send and, when the
/// requested policy is the channel's ECC policy, the new ephemeral key
/// (another policy gets `BadSecurityPolicyRejected` in place of the key).
fn ecdh_key_for(
    policy: SecurityPolicy,
    identity: &Identity,
    header: &RequestHeader,
) -> Result<Option<(Option<EphemeralKey>, ExtensionObject)>, StatusCode> {
    let Some(requested) = ecc_secret::requested_ecdh_policy(&header.additional_header) else {
        return Ok(None);
    };
    match (requested, policy.curve(), identity.ecc_key()) {
        (Some(p), Some(curve), Some(key)) if p == policy => {
            let ephemeral =
                EphemeralKey::generate(curve).map_err(|_| StatusCode::BadInternalError)?;
            let header = ecc_secret::ecdh_response(policy, &ephemeral, key)
                .map_err(|_| StatusCode::BadInternalError)?;
            Ok(Some((Some(ephemeral), header)))
        }
        (p, _, _) => Ok(Some((
            None,
            ecc_secret::ecdh_refusal(p.map_or("", |p| p.uri())),
        ))),
    }
}

/// Bounds for the revised session timeout: 10 s ..= 1 h; 0 asks for the
/// default of 60 s.
const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(3600);
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::identity::{POLICY_ANONYMOUS, POLICY_USERNAME, POLICY_X509};

fn random_bytes<const N: usize>() -> Result<[u8; N], StatusCode> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|_| StatusCode::BadInternalError)?;
    Ok(b)
}

/// CreateSession's random values: the server nonce, the authentication
/// token and the session id.
type SessionRandoms = ([u8; 32], [u8; 32], [u8; 16]);

/// [`SessionRandoms`] in one draw (one system call, not three).
fn session_randoms() -> Result<SessionRandoms, StatusCode> {
    let b = random_bytes::<80>()?;
    let part = |r: std::ops::Range<usize>| b.get(r).unwrap_or_default();
    let bad = |_| StatusCode::BadInternalError;
    Ok((
        part(0..32).try_into().map_err(bad)?,
        part(32..64).try_into().map_err(bad)?,
        part(64..80).try_into().map_err(bad)?,
    ))
}

/// The leaf of a certificate chain sent as concatenated DER.
fn leaf_der(chain: &[u8]) -> Result<&[u8], StatusCode> {
    // SEQUENCE with a long-form length (every certificate is > 127 bytes).
    let bad = StatusCode::BadCertificateInvalid;
    let (&tag, rest) = chain.split_first().ok_or(bad)?;
    let (&first, rest) = rest.split_first().ok_or(bad)?;
    if tag != 0x30 {
        return Err(bad);
    }
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return Err(bad);
        }
        let bytes = rest.get(..n).ok_or(bad)?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    chain.get(..header.checked_add(len).ok_or(bad)?).ok_or(bad)
}

/// CreateSession: a new, not yet activated session bound to this channel.
pub fn create_session(
    ctx: &ServiceContext,
    req: &CreateSessionRequest,
) -> Result<CreateSessionResponse, ServiceError> {
    let r = create_session_inner(ctx, req);
    if let Err(e) = &r {
        ctx.state
            .sessions
            .note_rejected(is_security_rejection(e.status_code()));
    }
    if ctx.state.auditing() {
        let (result, id, timeout) = match &r {
            Ok(resp) => (
                Ok(()),
                resp.session_id.clone(),
                Some(resp.revised_session_timeout),
            ),
            Err(e) => (Err(e.status_code()), NodeId::NULL, None),
        };
        audit::audit_session(
            &ctx.audit_site(),
            SessionAction::Create,
            &req.request_header,
            result,
            id,
            "",
            timeout,
        );
    }
    r
}

/// The refusal of a session that found `max_session_count` sessions open:
/// `BadTooManySessions` with the hint (sessions end at no rate the server
/// can measure ahead, so the fallback second). Other errors of the session
/// table pass as they are.
fn session_limit(e: crate::session::SessionError) -> ServiceError {
    match e {
        crate::session::SessionError::TooMany => ServiceError::shed(crate::shed::Shed::new(
            crate::shed::Stage::Establishment,
            crate::shed::Reason::SessionLimit,
            crate::admission::SESSION_FULL_RETRY_AFTER,
        )),
        e => ServiceError::from(e.status_code()),
    }
}

fn create_session_inner(
    ctx: &ServiceContext,
    req: &CreateSessionRequest,
) -> Result<CreateSessionResponse, ServiceError> {
    // A cluster node shutting down takes no new session: busy, so the
    // client comes back through the front end to a node that serves on. A
    // single server refuses at the first activation instead, where the user
    // is known (an administrator may still cancel the shutdown).
    if ctx.state.shutdown.is_planned() && ctx.state.cluster().is_some_and(|c| c.peers_serving()) {
        return Err(ServiceError::shed(crate::shed::Shed::new(
            crate::shed::Stage::Establishment,
            crate::shed::Reason::ShuttingDown,
            crate::admission::SESSION_FULL_RETRY_AFTER,
        )));
    }
    // The place for the session is taken before any certificate or
    // signature work: a full server refuses at the cost of an atomic add
    // (docs/scalability.md §2).
    let slot = ctx.state.sessions.reserve().map_err(session_limit)?;
    check_client_nonce(ctx.channel.policy, req.client_nonce.as_bytes_or_empty())?;
    let requested = req.requested_session_timeout;
    let timeout = if requested.is_finite() && requested > 0.0 {
        Duration::from_secs_f64((requested / 1000.0).min(MAX_SESSION_TIMEOUT.as_secs_f64()))
            .clamp(MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT)
    } else {
        DEFAULT_SESSION_TIMEOUT
    };
    let policy = ctx.channel.policy;
    let mut client_thumbprint = None;
    let mut server_signature = SignatureData::default();
    let (nonce, token, session_id) = session_randoms()?;
    let mut ecc = None;
    let mut additional_header = ExtensionObject::default();
    if !policy.is_none() {
        // The certificate in the request must be the channel's, and its
        // applicationUri the one the client claims (Part 4 §5.6.2).
        let channel_cert = ctx
            .channel
            .remote_certificate
            .as_ref()
            .ok_or(StatusCode::BadSecurityChecksFailed)?;
        let sent = req.client_certificate.as_bytes_or_empty();
        if !channel_cert.is(leaf_der(sent)?) {
            return Err(StatusCode::BadSecurityChecksFailed.into());
        }
        let claimed = req.client_description.application_uri.as_str_or_empty();
        if channel_cert.application_uri() != Some(claimed) {
            return Err(StatusCode::BadCertificateUriInvalid.into());
        }
        let client_nonce = req.client_nonce.as_bytes_or_empty();
        if client_nonce.len() < policy.session_nonce_length() {
            return Err(StatusCode::BadNonceInvalid.into());
        }
        let identity = ctx
            .state
            .security
            .identity_for(policy)
            .ok_or(StatusCode::BadSecurityPolicyRejected)?;
        if policy.is_ecc() {
            let data = create_session_signed_data(
                policy,
                ctx.channel.thumbprint(),
                client_nonce,
                &nonce,
                identity.certificate().der(),
                sent,
            );
            let mut sig = Vec::new();
            identity
                .key()
                .sign(policy, &data, &mut sig)
                .map_err(|_| StatusCode::BadInternalError)?;
            server_signature = SignatureData {
                algorithm: UaString::null(),
                signature: ByteString::new(sig),
            };
            let ephemeral = match ecdh_key_for(policy, identity, &req.request_header)? {
                Some((key, header)) => {
                    additional_header = header;
                    key
                }
                None => None,
            };
            ecc = Some(Arc::new(EccSession {
                client_nonce: client_nonce.to_vec(),
                ephemeral,
            }));
        } else {
            let mut data = Vec::with_capacity(sent.len() + client_nonce.len());
            data.extend_from_slice(sent);
            data.extend_from_slice(client_nonce);
            let key = identity
                .rsa_key()
                .ok_or(StatusCode::BadSecurityPolicyRejected)?;
            if let Some((uri, sig)) = identity::sign(key, policy, &data)? {
                server_signature = SignatureData {
                    algorithm: UaString::from(uri),
                    signature: ByteString::new(sig),
                };
            }
        }
        client_thumbprint = Some(channel_cert.thumbprint());
    }
    let token = NodeId::opaque(0, token.to_vec());
    let session_id = NodeId::guid(1, uascale_types::Guid::from_bytes(session_id));
    let session = Session {
        session_id: session_id.clone(),
        channel_id: ctx.channel_id,
        timeout,
        deadline: ctx.instant + ctx.state.config.server.activation_deadline,
        activated: false,
        name: req.session_name.clone(),
        locale_ids: Box::default(),
        continuation_points: None,
        server_nonce: nonce,
        client_thumbprint,
        client_uri: req.client_description.application_uri.clone(),
        user: UserIdentity::Anonymous,
        created: ctx.now,
        endpoint_url: req.endpoint_url.clone(),
        security_policy: ctx.channel.policy,
        security_mode: ctx.channel.mode,
        ecc,
    };
    ctx.state.sessions.create(slot, token.clone(), session);
    let mut response_header = ctx.response_header(&req.request_header);
    response_header.additional_header = additional_header;
    Ok(CreateSessionResponse {
        response_header,
        session_id,
        authentication_token: token,
        revised_session_timeout: timeout.as_secs_f64() * 1000.0,
        server_nonce: ByteString::new(nonce.to_vec()),
        server_certificate: ctx
            .state
            .security
            .identity_for(policy)
            .or(ctx.state.security.identity.as_ref())
            .map_or_else(ByteString::null, |i| {
                ByteString::new(i.certificate().der().to_vec())
            }),
        server_endpoints: Some(discovery::session_endpoints(
            ctx,
            req.endpoint_url.as_str_or_empty(),
        )),
        server_software_certificates: Some(vec![]),
        server_signature,
        max_request_message_size: ctx.state.config.limits.max_message_size,
    })
}

/// The longest client nonce accepted: Part 4 asks for at least 32 bytes,
/// and nothing is gained by more than a few times that (a held session
/// must not keep a megabyte of it).
pub const MAX_CLIENT_NONCE: usize = 128;

/// CreateSession's clientNonce: 32 ..= [`MAX_CLIENT_NONCE`] bytes on every
/// policy (`BadNonceInvalid` otherwise). An empty nonce stays accepted on
/// SecurityPolicy None, where it protects nothing, for clients that send
/// none there.
fn check_client_nonce(policy: SecurityPolicy, nonce: &[u8]) -> Result<(), StatusCode> {
    if nonce.is_empty() && policy.is_none() {
        return Ok(());
    }
    if (32..=MAX_CLIENT_NONCE).contains(&nonce.len()) {
        Ok(())
    } else {
        Err(StatusCode::BadNonceInvalid)
    }
}

/// What ActivateSession needs from the session, read under its lock.
struct Snapshot {
    nonce: [u8; 32],
    channel_id: u32,
    thumbprint: Option<[u8; 20]>,
    client_uri: UaString,
    /// For the establishment time of a first activation.
    created: uascale_types::DateTime,
    activated: bool,
    /// ECC: the CreateSession ClientNonce and the session ephemeral key.
    ecc: Option<Arc<EccSession>>,
}

/// Counts a failed authentication of lockout key `key` (the lockout
/// tracker and the metrics).
fn auth_failed(ctx: &ServiceContext, key: &str) {
    let lockout = ctx.state.security.failures.failed(key, ctx.instant);
    ctx.state.metrics.auth_failure(lockout);
}

/// The lockout key (docs/scalability.md §2): client certificate thumbprint,
/// else application URI, else channel.
fn lockout_key(ctx: &ServiceContext, snap: &Snapshot) -> String {
    if let Some(cert) = &ctx.channel.remote_certificate {
        format!("cert:{}", cert.thumbprint_hex())
    } else if !snap.client_uri.is_null_or_empty() {
        format!("uri:{}", snap.client_uri.as_str_or_empty())
    } else {
        format!("channel:{}", ctx.channel_id)
    }
}

/// Checks the user token; `Ok(None)` is a failed authentication to count
/// (answered `BadUserAccessDenied`), `Err` a malformed or unacceptable
/// token.
fn check_identity(
    ctx: &ServiceContext,
    req: &ActivateSessionRequest,
    nonce: &[u8; 32],
    ecc: Option<&EccSession>,
) -> Result<Option<UserIdentity>, StatusCode> {
    let token = &req.user_identity_token;
    let sec = &ctx.state.security;
    if token.is_null() {
        // Part 4 §5.6.3: a null token means anonymous.
        return if sec.allow_anonymous {
            Ok(Some(UserIdentity::Anonymous))
        } else {
            Err(StatusCode::BadIdentityTokenRejected)
        };
    }
    if let Some(a) = token.downcast_ref::<AnonymousIdentityToken>() {
        return match (a.policy_id == POLICY_ANONYMOUS, sec.allow_anonymous) {
            (true, true) => Ok(Some(UserIdentity::Anonymous)),
            (true, false) => Err(StatusCode::BadIdentityTokenRejected),
            (false, _) => Err(StatusCode::BadIdentityTokenInvalid),
        };
    }
    let token_policy = sec.token_policy(ctx.channel.policy);
    if let Some(u) = token.downcast_ref::<UserNameIdentityToken>() {
        if u.policy_id != POLICY_USERNAME {
            return Err(StatusCode::BadIdentityTokenInvalid);
        }
        let Some(policy) = token_policy else {
            return Err(StatusCode::BadIdentityTokenRejected);
        };
        if sec.users.is_empty() {
            return Err(StatusCode::BadIdentityTokenRejected);
        }
        let password = if policy.is_ecc() {
            ecc_password(ctx, policy, u, nonce, ecc)?
        } else {
            let key = sec
                .identity
                .as_ref()
                .and_then(|i| i.rsa_key())
                .ok_or(StatusCode::BadIdentityTokenRejected)?;
            identity::decrypt_secret(
                key,
                policy,
                u.encryption_algorithm.as_str_or_empty(),
                u.password.as_bytes_or_empty(),
                nonce,
            )?
        };
        let name = u.user_name.as_str_or_empty();
        return Ok(sec
            .users
            .verify(name, &password)
            .then(|| UserIdentity::UserName(name.to_owned())));
    }
    if let Some(x) = token.downcast_ref::<X509IdentityToken>() {
        if x.policy_id != POLICY_X509 {
            return Err(StatusCode::BadIdentityTokenInvalid);
        }
        let (Some(policy), Some(pki)) = (token_policy, &sec.pki) else {
            return Err(StatusCode::BadIdentityTokenRejected);
        };
        let identity = sec
            .identity_for(policy)
            .ok_or(StatusCode::BadIdentityTokenRejected)?;
        let cert = match pki.validate_user(
            x.certificate_data.as_bytes_or_empty(),
            Some(policy),
            SystemTime::now(),
        ) {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(reason = %e, "X509 user certificate rejected");
                return Ok(None);
            }
        };
        let key = PublicKey::of_certificate(&cert, policy)
            .map_err(|_| StatusCode::BadIdentityTokenInvalid)?;
        let sig = &req.user_token_signature;
        match &key {
            PublicKey::Rsa(key) => {
                let mut data = identity.certificate().der().to_vec();
                data.extend_from_slice(nonce);
                identity::verify_signature(
                    key,
                    policy,
                    sig.algorithm.as_str_or_empty(),
                    &data,
                    sig.signature.as_bytes_or_empty(),
                    StatusCode::BadUserSignatureInvalid,
                )?;
            }
            PublicKey::Ecc(_) => {
                let client_cert = ctx
                    .channel
                    .remote_certificate
                    .as_ref()
                    .and_then(|c| c.der())
                    .unwrap_or_default();
                let data = user_token_signed_data(
                    policy,
                    ctx.channel.thumbprint(),
                    nonce,
                    ecc.map(|e| e.client_nonce.as_slice()).unwrap_or_default(),
                    identity.certificate().der(),
                    identity.certificate().der(),
                    client_cert,
                    client_cert,
                );
                key.verify(policy, &data, sig.signature.as_bytes_or_empty())
                    .map_err(|_| StatusCode::BadUserSignatureInvalid)?;
            }
        }
        return Ok(Some(UserIdentity::X509(Box::new(
            crate::identity::X509User {
                subject: cert.subject_name().to_owned(),
                thumbprint: cert.thumbprint(),
            },
        ))));
    }
    if token.downcast_ref::<IssuedIdentityToken>().is_some() {
        // No UserTokenPolicy of this server names issued tokens.
        return Err(StatusCode::BadIdentityTokenRejected);
    }
    Err(StatusCode::BadIdentityTokenInvalid)
}

/// The password of a UserName token under an ECC policy: an
/// EccEncryptedSecret for the session's ephemeral key, signed with the
/// channel's client certificate.
fn ecc_password(
    ctx: &ServiceContext,
    policy: SecurityPolicy,
    token: &UserNameIdentityToken,
    nonce: &[u8; 32],
    ecc: Option<&EccSession>,
) -> Result<Vec<u8>, StatusCode> {
    let rejected = StatusCode::BadIdentityTokenRejected;
    if !token.encryption_algorithm.is_null_or_empty() {
        return Err(StatusCode::BadIdentityTokenInvalid);
    }
    let ephemeral = ecc.and_then(|e| e.ephemeral.as_ref()).ok_or(rejected)?;
    let client_cert = ctx.channel.remote_certificate.as_ref().ok_or(rejected)?;
    let Ok(Some(PublicKey::Ecc(sender))) = ctx.channel.remote_public_key() else {
        return Err(rejected);
    };
    let opened = ecc_secret::decrypt(
        policy,
        &sender,
        ephemeral,
        nonce,
        token.password.as_bytes_or_empty(),
    )
    .map_err(|e| {
        tracing::debug!(reason = %e, "EccEncryptedSecret refused");
        StatusCode::BadIdentityTokenInvalid
    })?;
    if !leaf_der(&opened.signing_certificate).is_ok_and(|der| client_cert.is(der)) {
        return Err(StatusCode::BadIdentityTokenInvalid);
    }
    Ok(opened.secret)
}

/// ActivateSession: activates (or moves to this channel) the session.
pub fn activate_session(
    ctx: &ServiceContext,
    req: &ActivateSessionRequest,
) -> Result<ActivateSessionResponse, ServiceError> {
    let r = activate_session_inner(ctx, req).map_err(ServiceError::from);
    if let Err(e) = &r {
        ctx.state
            .sessions
            .note_rejected(is_security_rejection(e.status_code()));
    }
    if ctx.state.auditing() {
        // The session as it is now: its id, and (when activated by this
        // request) the user it was activated for.
        let (id, user) = ctx
            .state
            .sessions
            .with(
                &req.request_header.authentication_token,
                None,
                false,
                ctx.instant,
                |s| (s.session_id.clone(), s.user.client_user_id()),
            )
            .unwrap_or_default();
        let user = if r.is_ok() { user } else { String::new() };
        audit::audit_session(
            &ctx.audit_site(),
            SessionAction::Activate,
            &req.request_header,
            r.as_ref().map(|_| ()).map_err(|e| e.status_code()),
            id,
            &user,
            None,
        );
    }
    r
}

/// ActivateSession as the dispatcher calls it: on a cluster node, a
/// token this node does not know may be a session of another node whose
/// client came back through this one - then the answer comes later, after
/// the takeover (`take_over`); one it knows answers once its record is
/// written (`ClusterNode::flush`). Anything else answers at once, exactly
/// as [`activate_session`].
pub fn activate_session_answer(
    ctx: &ServiceContext,
    req: ActivateSessionRequest,
) -> Result<Answer<ActivateSessionResponse>, ServiceError> {
    if let Some(cluster) = ctx.state.cluster() {
        let auth = &req.request_header.authentication_token;
        let known = ctx
            .state
            .sessions
            .with(auth, None, false, ctx.instant, |_| ())
            .is_ok();
        if let Some(key) = record::session_key(auth) {
            let ctx = ctx.clone();
            let cluster = std::sync::Arc::clone(cluster);
            return Ok(Answer::Later(Box::pin(async move {
                if known {
                    // The answer waits for the record with the new nonce,
                    // so that another node can take the session over with
                    // the nonce the client signs next.
                    let response = activate_session(&ctx, &req)?;
                    if !cluster.flush(&key, FLUSH_LIMIT).await {
                        tracing::debug!("session record not written before the answer");
                    }
                    Ok(response)
                } else {
                    take_over(&ctx, &cluster, &key, &req).await
                }
            })));
        }
    }
    Ok(Answer::Now(activate_session(ctx, &req)?))
}

/// How long an ActivateSession on a cluster node waits for its session
/// record to be written (longer only when the store is away: then the node
/// is degraded and answers anyway).
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// How long a client whose takeover met an unreachable store is asked to
/// wait before it tries again.
const TAKEOVER_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Takes over the session under `key` from the cluster store: restores it
/// into this node's table (same session id and token), runs the ordinary
/// ActivateSession on it - which verifies the client's signature over the
/// nonce in the record - and claims it by compare-and-set, consuming that
/// nonce cluster-wide. A failed claim removes it again.
async fn take_over(
    ctx: &ServiceContext,
    cluster: &ClusterNode,
    key: &str,
    req: &ActivateSessionRequest,
) -> Result<ActivateSessionResponse, ServiceError> {
    let auth = &req.request_header.authentication_token;
    let busy = || {
        ServiceError::shed(crate::shed::Shed::new(
            crate::shed::Stage::Establishment,
            crate::shed::Reason::StoreUnavailable,
            TAKEOVER_RETRY_AFTER,
        ))
    };
    let record = match cluster.read_session(key).await {
        Ok(Some(r)) if r.token == *auth && r.activated => r,
        Ok(_) => return activate_session(ctx, req),
        Err(ClaimError::Store(e)) => {
            tracing::warn!(error = %e, "session takeover: store unreachable");
            return Err(busy());
        }
        Err(e) => {
            tracing::warn!(error = %e, "session takeover: bad record");
            return Err(StatusCode::BadSessionIdInvalid.into());
        }
    };
    let restored = ctx
        .state
        .sessions
        .restore(
            auth,
            cluster_node::session_of(
                &record,
                ctx.instant,
                usize::from(
                    ctx.state
                        .config
                        .operation_limits
                        .max_browse_continuation_points,
                ),
            ),
        )
        .map_err(session_limit)?;
    if !restored {
        // A concurrent ActivateSession on this node restored it first (and
        // claims it); this one is an ordinary activation.
        return activate_session(ctx, req);
    }
    // Its transitions are the claim's to write from here on.
    cluster.begin_claim(key);
    let fail = |e: ServiceError| {
        ctx.state.sessions.evict(auth);
        cluster.end_claim(key, None, &record.session_id);
        e
    };
    let response = activate_session(ctx, req).map_err(fail)?;
    let Ok(session) = ctx
        .state
        .sessions
        .with(auth, None, false, ctx.instant, |s| s.clone())
    else {
        cluster.end_claim(key, None, &record.session_id);
        return Err(StatusCode::BadSessionIdInvalid.into());
    };
    match cluster
        .claim(key, &record.server_nonce, auth, &session)
        .await
    {
        Ok(claimed) => {
            cluster.end_claim(key, Some(&claimed), &record.session_id);
            restore_subscriptions(ctx, cluster, key, &record.session_id).await;
            Ok(response)
        }
        Err(ClaimError::Store(_)) => Err(fail(busy())),
        Err(ClaimError::NonceConsumed) | Err(ClaimError::Lost) => {
            Err(fail(StatusCode::BadNonceInvalid.into()))
        }
        Err(_) => Err(fail(StatusCode::BadSessionIdInvalid.into())),
    }
}

/// Restores the subscriptions of a session just taken over, from its
/// subscriptions record: same ids, next sequence numbers and
/// retransmission queues (Republish answers from them); each item is
/// offered its current value. A missing or bad record leaves the session
/// without subscriptions (the client's Publish then says so).
async fn restore_subscriptions(
    ctx: &ServiceContext,
    cluster: &ClusterNode,
    key: &str,
    session_id: &NodeId,
) {
    let record = match cluster.read_subscriptions(key).await {
        Ok(Some(r)) if r.session_id == *session_id => r,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(session = %session_id, error = %e, "subscriptions not restored");
            return;
        }
    };
    let ids = ctx
        .state
        .subscriptions
        .restore(ctx.instant, session_id, &record.subscriptions);
    for id in &ids {
        let _ = ctx
            .state
            .subscriptions
            .with_subscription(session_id, *id, |s| {
                let next_publish = s.next_publish;
                for item in s.items_mut() {
                    if item.mode != uascale_types::MonitoringMode::Disabled {
                        item.offer(super::monitored_item::sample(ctx, &item.target));
                        item.schedule_sampling(ctx.instant, next_publish);
                    }
                }
                s.items_changed();
            });
        cluster.subscription_answered(*id);
    }
    tracing::info!(session = %session_id, subscriptions = ids.len(), "subscriptions restored");
}

fn activate_session_inner(
    ctx: &ServiceContext,
    req: &ActivateSessionRequest,
) -> Result<ActivateSessionResponse, StatusCode> {
    let auth = &req.request_header.authentication_token;
    let snap = ctx
        .state
        .sessions
        .with(auth, None, false, ctx.instant, |s| Snapshot {
            nonce: s.server_nonce,
            channel_id: s.channel_id,
            thumbprint: s.client_thumbprint,
            client_uri: s.client_uri.clone(),
            created: s.created,
            activated: s.activated,
            ecc: s.ecc.clone(),
        })
        .map_err(|e| e.status_code())?;
    let channel_thumbprint = ctx
        .channel
        .remote_certificate
        .as_ref()
        .map(|c| c.thumbprint());
    // Only a channel with the creating client's certificate may use (or
    // take over) the session.
    if snap.thumbprint != channel_thumbprint {
        return Err(StatusCode::BadSecureChannelIdInvalid);
    }
    let key = lockout_key(ctx, &snap);
    ctx.state
        .security
        .failures
        .check(&key, ctx.instant)
        .inspect_err(|_| ctx.state.metrics.auth_refused_locked_out())?;

    // The client proves it holds its certificate's key.
    let policy = ctx.channel.policy;
    let remote_key = ctx
        .channel
        .remote_public_key()
        .map_err(|_| StatusCode::BadCertificateInvalid)?;
    if let Some(remote) = &remote_key {
        let identity = ctx
            .state
            .security
            .identity_for(policy)
            .ok_or(StatusCode::BadSecurityChecksFailed)?;
        let sig = &req.client_signature;
        let checked = match remote {
            PublicKey::Rsa(remote) => {
                let mut data = identity.certificate().der().to_vec();
                data.extend_from_slice(&snap.nonce);
                identity::verify_signature(
                    remote,
                    policy,
                    sig.algorithm.as_str_or_empty(),
                    &data,
                    sig.signature.as_bytes_or_empty(),
                    StatusCode::BadApplicationSignatureInvalid,
                )
            }
            PublicKey::Ecc(_) => {
                let client_nonce = snap
                    .ecc
                    .as_ref()
                    .map(|e| e.client_nonce.as_slice())
                    .unwrap_or_default();
                let client_cert = ctx
                    .channel
                    .remote_certificate
                    .as_ref()
                    .and_then(|c| c.der())
                    .unwrap_or_default();
                let data = activate_session_signed_data(
                    policy,
                    ctx.channel.thumbprint(),
                    &snap.nonce,
                    client_nonce,
                    identity.certificate().der(),
                    identity.certificate().der(),
                    client_cert,
                );
                // The algorithm field is empty under ECC and ignored.
                remote
                    .verify(policy, &data, sig.signature.as_bytes_or_empty())
                    .map_err(|_| StatusCode::BadApplicationSignatureInvalid)
            }
        };
        if let Err(status) = checked {
            auth_failed(ctx, &key);
            return Err(status);
        }
    }

    let user = match check_identity(ctx, req, &snap.nonce, snap.ecc.as_deref()) {
        Ok(Some(user)) => user,
        Ok(None) => {
            auth_failed(ctx, &key);
            return Err(StatusCode::BadUserAccessDenied);
        }
        Err(status) => {
            if status == StatusCode::BadUserSignatureInvalid
                || status == StatusCode::BadIdentityTokenInvalid
            {
                auth_failed(ctx, &key);
            }
            return Err(status);
        }
    };
    // A server shutting down serves the sessions it has and lets no new one
    // start, but an administrator's (who may move or cancel the shutdown).
    if !snap.activated
        && ctx.state.shutdown.is_planned()
        && !crate::shutdown::is_admin(&ctx.state.config.server.admin_users, &user)
    {
        return Err(StatusCode::BadServerHalted);
    }
    // On SecurityPolicy None nothing proves who sends the request: a session
    // changes channel only for the anonymous identity.
    if snap.channel_id != ctx.channel_id
        && ctx.channel.policy == SecurityPolicy::None
        && user != UserIdentity::Anonymous
    {
        return Err(StatusCode::BadSecureChannelIdInvalid);
    }
    let anonymous = user == UserIdentity::Anonymous;
    let nonce = random_bytes::<32>()?;
    let locales = req.locale_ids.clone().unwrap_or_default();
    let mut additional_header = ExtensionObject::default();
    let mut next_ecc = None;
    if let Some(identity) = ctx.state.security.identity_for(policy) {
        if let Some((key, header)) = ecdh_key_for(policy, identity, &req.request_header)? {
            additional_header = header;
            if let Some(key) = key {
                next_ecc = Some(Arc::new(EccSession {
                    client_nonce: snap
                        .ecc
                        .as_ref()
                        .map(|e| e.client_nonce.clone())
                        .unwrap_or_default(),
                    ephemeral: Some(key),
                }));
            }
        }
    }
    // Fails when a concurrent ActivateSession consumed the nonce first.
    ctx.state
        .sessions
        .activate(
            auth,
            Activation {
                expected_nonce: snap.nonce,
                next_nonce: nonce,
                channel_id: ctx.channel_id,
                security_policy: ctx.channel.policy,
                security_mode: ctx.channel.mode,
                locale_ids: locales,
                user,
                ecc: next_ecc,
            },
            ctx.instant,
        )
        .map_err(|e| e.status_code())?;
    if !snap.activated {
        let ticks = ctx.now.ticks().saturating_sub(snap.created.ticks()).max(0);
        let took = Duration::from_nanos(u64::try_from(ticks).unwrap_or(0).saturating_mul(100));
        ctx.state.metrics.session_established(took);
    }
    if !anonymous {
        ctx.state.security.failures.succeeded(&key);
    }
    let mut response_header = ctx.response_header(&req.request_header);
    response_header.additional_header = additional_header;
    Ok(ActivateSessionResponse {
        response_header,
        server_nonce: ByteString::new(nonce.to_vec()),
        results: Some(vec![]),
        diagnostic_infos: Some(vec![]),
    })
}

/// CloseSession: removes the session (it has no subscriptions to delete yet).
pub fn close_session(
    ctx: &ServiceContext,
    req: &CloseSessionRequest,
) -> Result<CloseSessionResponse, ServiceError> {
    let token = &req.request_header.authentication_token;
    let auditing = ctx.state.auditing();
    let found = ctx
        .state
        .sessions
        .with(token, Some(ctx.channel_id), false, ctx.instant, |s| {
            (
                s.session_id.clone(),
                auditing.then(|| s.user.client_user_id()),
            )
        })
        .map_err(|e| e.status_code());
    let (id, user) = match found {
        Ok(f) => f,
        Err(status) => {
            if auditing {
                audit::audit_session(
                    &ctx.audit_site(),
                    SessionAction::Close,
                    &req.request_header,
                    Err(status),
                    NodeId::NULL,
                    "",
                    None,
                );
            }
            return Err(status.into());
        }
    };
    // Its subscriptions go (or wait for a transfer) through the session
    // table's listeners.
    ctx.state.sessions.close(token, req.delete_subscriptions);
    if let Some(user) = user {
        audit::audit_session(
            &ctx.audit_site(),
            SessionAction::Close,
            &req.request_header,
            Ok(()),
            id,
            &user,
            None,
        );
    }
    Ok(CloseSessionResponse {
        response_header: ctx.response_header(&req.request_header),
    })
}

/// Cancel: the outstanding requests of this session's channel with the
/// given requestHandle are answered `BadRequestCancelledByClient` - those
/// waiting in the request queue and those whose (asynchronous) handlers are
/// still running. A request already answered is not counted.
pub fn cancel(
    ctx: &ServiceContext,
    req: &uascale_types::CancelRequest,
) -> Result<uascale_types::CancelResponse, ServiceError> {
    ctx.session()?;
    // The channel's one table of outstanding requests: those still waiting
    // for a worker and those running.
    let cancel_count = ctx.sink.as_ref().map_or(0, |s| {
        s.cancel(&ctx.state.scheduler, req.request_handle, ctx.now)
    });
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
    use crate::state::ServerState;
    use crate::ServerConfig;
    use std::sync::Arc;
    use std::time::Instant;
    use uascale_crypto::x509::PeerCertificate;
    use uascale_types::{ExtensionObject, RequestHeader, UaString};

    struct Fixture {
        state: Arc<ServerState>,
        t0: Instant,
    }

    impl Fixture {
        fn new(max: usize) -> Self {
            Self::with_security(max, crate::security::SecurityState::none_only())
        }
        fn with_security(max: usize, security: crate::security::SecurityState) -> Self {
            let config = ServerConfig {
                server: crate::config::ServerSection {
                    max_session_count: max,
                    ..Default::default()
                },
                ..Default::default()
            };
            Fixture {
                state: ServerState::from_parts(
                    config,
                    crate::address_space::AddressSpace::default(),
                    crate::node_manager::NodeManagers::default(),
                    security,
                ),
                t0: Instant::now(),
            }
        }
        fn sessions(&self) -> &SessionTable {
            &self.state.sessions
        }
        fn ctx(&self, channel_id: u32) -> ServiceContext {
            let mut ctx = ServiceContext::for_tests(Arc::clone(&self.state), self.t0);
            ctx.channel_id = channel_id;
            ctx
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
        .map_err(|e| e.status_code())
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
        .map_err(|e| e.status_code())
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

    /// A hostile-input finding: CreateSession refuses a client nonce shorter
    /// than 32 bytes or longer than the maximum on SecurityPolicy None too;
    /// an empty one stays accepted there.
    #[test]
    fn client_nonces_are_validated_on_every_policy() {
        let f = Fixture::new(10);
        let create_with = |nonce: Vec<u8>| {
            create_session(
                &f.ctx(1),
                &CreateSessionRequest {
                    requested_session_timeout: 60_000.0,
                    client_nonce: ByteString::new(nonce),
                    ..Default::default()
                },
            )
            .map(|_| ())
            .map_err(|e| e.status_code())
        };
        assert_eq!(create_with(vec![]), Ok(()));
        assert_eq!(create_with(vec![1; 32]), Ok(()));
        assert_eq!(create_with(vec![1; MAX_CLIENT_NONCE]), Ok(()));
        for len in [1, 31, MAX_CLIENT_NONCE + 1, 1 << 20] {
            assert_eq!(
                create_with(vec![1; len]),
                Err(StatusCode::BadNonceInvalid),
                "{len} bytes"
            );
        }
        assert_eq!(f.sessions().len(), 3, "the refused ones hold nothing");
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
        let user = |policy: &str| {
            ExtensionObject::new(UserNameIdentityToken {
                policy_id: UaString::from(policy),
                user_name: UaString::from("u"),
                ..Default::default()
            })
        };
        assert_eq!(
            activate(&f, 1, &token, user("anonymous")).unwrap_err(),
            StatusCode::BadIdentityTokenInvalid
        );
        // No certificate to encrypt the password for: not offered.
        assert_eq!(
            activate(&f, 1, &token, user("username")).unwrap_err(),
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
        assert!(f
            .sessions()
            .with(&token, Some(2), true, f.t0, |_| ())
            .is_ok());
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
        assert!(f.sessions().is_empty());
        assert_eq!(
            close_session(&f.ctx(1), &req).unwrap_err(),
            StatusCode::BadSessionIdInvalid
        );
    }

    #[test]
    fn unactivated_session_is_closed_at_the_activation_deadline() {
        let f = Fixture::new(10);
        create(&f, 0.0).unwrap();
        assert!(f
            .sessions()
            .expire(f.t0 + Duration::from_secs(9))
            .is_empty());
        assert_eq!(f.sessions().expire(f.t0 + Duration::from_secs(10)).len(), 1);
    }

    /// Sessions on a Basic256Sha256 SignAndEncrypt channel.
    mod secured {
        use std::sync::Arc;

        use uascale_crypto::rsa::{EncryptionPadding, RsaPrivateKey};
        use uascale_crypto::x509::{create_self_signed, Certificate, SelfSignedParams};
        use uascale_proto::security::{ChannelSecurity, Identity};
        use uascale_types::MessageSecurityMode;

        use super::*;
        use crate::identity::{AuthFailures, UserAccount, UserDatabase};
        use crate::security::SecurityState;

        const POLICY: SecurityPolicy = SecurityPolicy::Basic256Sha256;

        fn keyed(uri: &str) -> (Certificate, RsaPrivateKey) {
            let made = create_self_signed(&SelfSignedParams::new(
                uri,
                "t",
                std::time::SystemTime::now(),
            ))
            .unwrap();
            let key = RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap();
            (made.certificate, key)
        }

        struct Secure {
            f: Fixture,
            server_cert: Certificate,
            client_cert: Certificate,
            client_key: RsaPrivateKey,
            channel: ChannelSecurity,
        }

        fn cheap_hash(password: &[u8]) -> String {
            use argon2::password_hash::{PasswordHasher, SaltString};
            let params = argon2::Params::new(64, 1, 1, None).unwrap();
            let a =
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
            let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
            a.hash_password(password, &salt).unwrap().to_string()
        }

        fn secure(max_failures: u32) -> Secure {
            let (server_cert, server_key) = keyed("urn:test:server");
            let (client_cert, client_key) = keyed("urn:test:client");
            let identity = Arc::new(Identity::new(server_cert.clone(), server_key).unwrap());
            let security = SecurityState {
                pki: None,
                identity: Some(identity),
                ecc_identities: Vec::new(),
                endpoints: vec![(POLICY, MessageSecurityMode::SignAndEncrypt)],
                allow_anonymous: true,
                users: UserDatabase::new(vec![
                    UserAccount::new("op", &cheap_hash(b"right")).unwrap()
                ]),
                failures: AuthFailures::new(max_failures),
            };
            let channel = ChannelSecurity {
                policy: POLICY,
                mode: MessageSecurityMode::SignAndEncrypt,
                remote_certificate: Some(Arc::new(PeerCertificate::new(&client_cert, None))),
                channel_thumbprint: None,
            };
            Secure {
                f: Fixture::with_security(10, security),
                server_cert,
                client_cert,
                client_key,
                channel,
            }
        }

        impl Secure {
            fn ctx(&self, channel_id: u32) -> ServiceContext {
                let mut ctx = self.f.ctx(channel_id);
                ctx.channel = self.channel.clone();
                ctx
            }

            fn create_req(&self, cert: &[u8], uri: &str, nonce: &[u8]) -> CreateSessionRequest {
                let mut req = CreateSessionRequest {
                    client_nonce: ByteString::new(nonce.to_vec()),
                    client_certificate: ByteString::new(cert.to_vec()),
                    ..Default::default()
                };
                req.client_description.application_uri = UaString::from(uri);
                req
            }

            fn create(&self) -> CreateSessionResponse {
                let req = self.create_req(self.client_cert.der(), "urn:test:client", &[9; 32]);
                create_session(&self.ctx(1), &req).unwrap()
            }

            /// A correctly signed ActivateSession for `nonce`.
            fn activate_req(
                &self,
                token: &NodeId,
                nonce: &[u8],
                identity: ExtensionObject,
            ) -> ActivateSessionRequest {
                let mut data = self.server_cert.der().to_vec();
                data.extend_from_slice(nonce);
                let (alg, sig) = identity::sign(&self.client_key, POLICY, &data)
                    .unwrap()
                    .unwrap();
                ActivateSessionRequest {
                    request_header: uascale_types::RequestHeader {
                        authentication_token: token.clone(),
                        ..Default::default()
                    },
                    client_signature: SignatureData {
                        algorithm: UaString::from(alg),
                        signature: ByteString::new(sig),
                    },
                    user_identity_token: identity,
                    ..Default::default()
                }
            }

            fn password_token(&self, password: &[u8], nonce: &[u8]) -> ExtensionObject {
                let key = uascale_crypto::rsa::RsaPublicKey::from_spki_der(
                    self.server_cert.subject_public_key_info_der(),
                )
                .unwrap();
                let mut plain = ((password.len() + nonce.len()) as u32)
                    .to_le_bytes()
                    .to_vec();
                plain.extend_from_slice(password);
                plain.extend_from_slice(nonce);
                let mut data = Vec::new();
                key.encrypt(EncryptionPadding::OaepSha1, &plain, &mut data)
                    .unwrap();
                ExtensionObject::new(UserNameIdentityToken {
                    policy_id: UaString::from(POLICY_USERNAME),
                    user_name: UaString::from("op"),
                    password: ByteString::new(data),
                    encryption_algorithm: UaString::from(identity::RSA_OAEP_URI),
                })
            }
        }

        /// CreateSession's serverEndpoints carry only what Part 4 recommends
        /// a server include and a client verify (server.applicationUri,
        /// endpointUrl, securityMode, securityPolicyUri, userIdentityTokens,
        /// transportProfileUri, securityLevel), the same as GetEndpoints
        /// gives; no certificate per endpoint. The response still names the
        /// server certificate once, in serverCertificate.
        #[test]
        fn create_session_endpoints_carry_what_a_client_verifies() {
            let s = secure(3);
            let ctx = s.ctx(1);
            let created = s.create();
            assert_eq!(
                created.server_certificate.as_bytes(),
                Some(s.server_cert.der())
            );
            let full = crate::services::discovery::get_endpoints(
                &ctx,
                &uascale_types::GetEndpointsRequest::default(),
            )
            .endpoints
            .unwrap();
            let given = created.server_endpoints.unwrap();
            assert_eq!(given.len(), full.len());
            for (g, f) in given.iter().zip(&full) {
                assert_eq!(f.server_certificate.as_bytes(), Some(s.server_cert.der()));
                assert!(g.server_certificate.is_null(), "{g:?}");
                assert_eq!(g.server.application_uri, f.server.application_uri);
                assert!(!g.server.application_uri.is_null());
                assert!(g.server.application_name.text.is_null());
                assert!(g.server.product_uri.is_null());
                assert_eq!(g.server.discovery_urls, None);
                assert_eq!(g.endpoint_url, f.endpoint_url);
                assert_eq!(g.security_mode, f.security_mode);
                assert_eq!(g.security_policy_uri, f.security_policy_uri);
                assert_eq!(g.user_identity_tokens, f.user_identity_tokens);
                assert_eq!(g.transport_profile_uri, f.transport_profile_uri);
                assert_eq!(g.security_level, f.security_level);
            }
        }

        #[test]
        fn create_checks_the_client_and_signs() {
            let s = secure(3);
            let r = s.create();
            assert_eq!(r.server_certificate.as_bytes(), Some(s.server_cert.der()));
            // serverSignature over clientCertificate + clientNonce.
            let mut data = s.client_cert.der().to_vec();
            data.extend_from_slice(&[9; 32]);
            let server_key = uascale_crypto::rsa::RsaPublicKey::from_spki_der(
                s.server_cert.subject_public_key_info_der(),
            )
            .unwrap();
            identity::verify_signature(
                &server_key,
                POLICY,
                r.server_signature.algorithm.as_str_or_empty(),
                &data,
                r.server_signature.signature.as_bytes_or_empty(),
                StatusCode::BadApplicationSignatureInvalid,
            )
            .unwrap();
            let ctx = s.ctx(1);
            let (other, _) = keyed("urn:test:client");
            let cases = [
                (
                    other.der(),
                    "urn:test:client",
                    &[9u8; 32][..],
                    StatusCode::BadSecurityChecksFailed,
                ),
                (
                    s.client_cert.der(),
                    "urn:test:liar",
                    &[9; 32],
                    StatusCode::BadCertificateUriInvalid,
                ),
                (
                    s.client_cert.der(),
                    "urn:test:client",
                    &[9; 16],
                    StatusCode::BadNonceInvalid,
                ),
                (
                    &[0x30, 0x82][..],
                    "urn:test:client",
                    &[9; 32],
                    StatusCode::BadCertificateInvalid,
                ),
            ];
            for (cert, uri, nonce, status) in cases {
                let req = s.create_req(cert, uri, nonce);
                assert_eq!(create_session(&ctx, &req).unwrap_err(), status, "{uri}");
            }
        }

        #[test]
        fn activate_verifies_the_client_signature() {
            // (Failed signatures count toward the lockout; allow plenty.)
            let s = secure(10);
            let r = s.create();
            let token = r.authentication_token;
            let nonce = r.server_nonce.as_bytes_or_empty().to_vec();
            let mut bad = s.activate_req(&token, &nonce, ExtensionObject::null());
            let mut sig = bad.client_signature.signature.as_bytes_or_empty().to_vec();
            sig[5] ^= 1;
            bad.client_signature.signature = ByteString::new(sig);
            assert_eq!(
                activate_session(&s.ctx(1), &bad).unwrap_err(),
                StatusCode::BadApplicationSignatureInvalid
            );
            // Signed over a stale nonce.
            let stale = s.activate_req(&token, &[0; 32], ExtensionObject::null());
            assert_eq!(
                activate_session(&s.ctx(1), &stale).unwrap_err(),
                StatusCode::BadApplicationSignatureInvalid
            );
            let good = s.activate_req(&token, &nonce, ExtensionObject::null());
            let next = activate_session(&s.ctx(1), &good).unwrap().server_nonce;
            // The same request again: the nonce has moved on.
            assert_eq!(
                activate_session(&s.ctx(1), &good).unwrap_err(),
                StatusCode::BadApplicationSignatureInvalid
            );
            let again = s.activate_req(&token, next.as_bytes_or_empty(), ExtensionObject::null());
            activate_session(&s.ctx(1), &again).unwrap();
            // A channel with another client certificate cannot take the session.
            let mut stranger = s.channel.clone();
            stranger.remote_certificate = Some(Arc::new(PeerCertificate::new(
                &keyed("urn:test:client").0,
                None,
            )));
            let mut ctx = s.ctx(2);
            ctx.channel = stranger.clone();
            assert_eq!(
                activate_session(&ctx, &again).unwrap_err(),
                StatusCode::BadSecureChannelIdInvalid
            );
        }

        #[test]
        fn username_tokens_and_lockout() {
            let s = secure(3);
            let r = s.create();
            let token = r.authentication_token;
            let nonce = r.server_nonce.as_bytes_or_empty().to_vec();
            // Right password, but encrypted with another nonce (a replay).
            let req = s.activate_req(&token, &nonce, s.password_token(b"right", &[1; 32]));
            assert_eq!(
                activate_session(&s.ctx(1), &req).unwrap_err(),
                StatusCode::BadIdentityTokenInvalid
            );
            let req = s.activate_req(&token, &nonce, s.password_token(b"right", &nonce));
            let next = activate_session(&s.ctx(1), &req).unwrap().server_nonce;
            let user =
                s.f.sessions()
                    .with(&token, None, false, s.f.t0, |x| x.user.clone());
            assert_eq!(user, Ok(UserIdentity::UserName("op".into())));

            // Wrong passwords: BadUserAccessDenied; the third locks the
            // client (its certificate) out, so the right one fails too.
            let mut nonce = next.as_bytes_or_empty().to_vec();
            let r2 = s.create();
            let token2 = r2.authentication_token;
            nonce.clear();
            nonce.extend_from_slice(r2.server_nonce.as_bytes_or_empty());
            for _ in 0..3 {
                let req = s.activate_req(&token2, &nonce, s.password_token(b"wrong", &nonce));
                assert_eq!(
                    activate_session(&s.ctx(1), &req).unwrap_err(),
                    StatusCode::BadUserAccessDenied
                );
            }
            let req = s.activate_req(&token2, &nonce, s.password_token(b"right", &nonce));
            assert_eq!(
                activate_session(&s.ctx(1), &req).unwrap_err(),
                StatusCode::BadUserAccessDenied
            );
        }
    }

    /// Sessions on ECC channels: ECDSA server and client signatures
    /// (channel-bound with a ChannelThumbprint), the ECDHKey in the
    /// additional headers and UserName passwords as EccEncryptedSecret.
    mod ecc {
        use std::sync::Arc;

        use uascale_crypto::ecc::{EccPrivateKey, EccPublicKey};
        use uascale_crypto::x509::{create_self_signed, Certificate, KeyType, SelfSignedParams};
        use uascale_proto::ecc_secret;
        use uascale_proto::security::{ChannelSecurity, Identity, PrivateKey};
        use uascale_types::{DateTime, MessageSecurityMode, RequestHeader, ResponseHeader};

        use super::*;
        use crate::identity::{AuthFailures, UserAccount, UserDatabase};
        use crate::security::SecurityState;

        fn keyed(uri: &str) -> (Certificate, EccPrivateKey) {
            let mut p = SelfSignedParams::new(uri, "t", std::time::SystemTime::now());
            p.key_type = KeyType::EcP256;
            let made = create_self_signed(&p).unwrap();
            let key = EccPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap();
            (made.certificate, key)
        }

        fn cheap_hash(password: &[u8]) -> String {
            use argon2::password_hash::{PasswordHasher, SaltString};
            let params = argon2::Params::new(64, 1, 1, None).unwrap();
            let a =
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
            let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
            a.hash_password(password, &salt).unwrap().to_string()
        }

        struct Ecc {
            f: Fixture,
            policy: SecurityPolicy,
            server_cert: Certificate,
            server_public: EccPublicKey,
            client_cert: Certificate,
            client_key: EccPrivateKey,
            channel: ChannelSecurity,
        }

        fn ecc(policy: SecurityPolicy) -> Ecc {
            let (server_cert, server_key) = keyed("urn:test:server");
            let (client_cert, client_key) = keyed("urn:test:client");
            let server_public = server_key.public_key().clone();
            let identity = Arc::new(
                Identity::with_key(server_cert.clone(), PrivateKey::Ecc(server_key)).unwrap(),
            );
            let security = SecurityState {
                pki: None,
                identity: None,
                ecc_identities: vec![identity],
                endpoints: vec![(policy, MessageSecurityMode::SignAndEncrypt)],
                allow_anonymous: true,
                users: UserDatabase::new(vec![
                    UserAccount::new("op", &cheap_hash(b"right")).unwrap()
                ]),
                failures: AuthFailures::new(10),
            };
            let thumbprint = policy
                .secure_channel_enhancements()
                .then(|| Arc::new(vec![0x5a; 64]));
            let channel = ChannelSecurity {
                policy,
                mode: MessageSecurityMode::SignAndEncrypt,
                remote_certificate: Some(Arc::new(PeerCertificate::new(
                    &client_cert,
                    client_cert.ecc_curve(),
                ))),
                channel_thumbprint: thumbprint,
            };
            Ecc {
                f: Fixture::with_security(10, security),
                policy,
                server_cert,
                server_public,
                client_cert,
                client_key,
                channel,
            }
        }

        impl Ecc {
            fn ctx(&self) -> ServiceContext {
                let mut ctx = self.f.ctx(1);
                ctx.channel = self.channel.clone();
                ctx
            }

            fn header(&self, token: &NodeId, ecdh: bool) -> RequestHeader {
                RequestHeader {
                    authentication_token: token.clone(),
                    additional_header: if ecdh {
                        ecc_secret::ecdh_request(self.policy)
                    } else {
                        ExtensionObject::default()
                    },
                    ..Default::default()
                }
            }

            fn create(&self, ecdh: bool) -> CreateSessionResponse {
                let mut req = CreateSessionRequest {
                    request_header: self.header(&NodeId::NULL, ecdh),
                    client_nonce: ByteString::new(vec![9; 32]),
                    client_certificate: ByteString::new(self.client_cert.der().to_vec()),
                    ..Default::default()
                };
                req.client_description.application_uri = UaString::from("urn:test:client");
                create_session(&self.ctx(), &req).unwrap()
            }

            fn ecdh_key(&self, header: &ResponseHeader) -> Option<Vec<u8>> {
                ecc_secret::ecdh_key_of_response(
                    self.policy,
                    &header.additional_header,
                    &self.server_public,
                )
                .unwrap()
            }

            fn activate(
                &self,
                token: &NodeId,
                nonce: &[u8],
                user: ExtensionObject,
            ) -> Result<ActivateSessionResponse, ServiceError> {
                let data = activate_session_signed_data(
                    self.policy,
                    self.channel.thumbprint(),
                    nonce,
                    &[9; 32],
                    self.server_cert.der(),
                    self.server_cert.der(),
                    self.client_cert.der(),
                );
                let mut sig = Vec::new();
                self.client_key.sign(&data, &mut sig).unwrap();
                activate_session(
                    &self.ctx(),
                    &ActivateSessionRequest {
                        request_header: self.header(token, true),
                        client_signature: SignatureData {
                            algorithm: UaString::null(),
                            signature: ByteString::new(sig),
                        },
                        user_identity_token: user,
                        ..Default::default()
                    },
                )
            }

            fn password(&self, key: &[u8], nonce: &[u8], password: &[u8]) -> ExtensionObject {
                let data = ecc_secret::encrypt(
                    self.policy,
                    &self.client_key,
                    self.client_cert.der(),
                    key,
                    nonce,
                    password,
                    DateTime::from_ticks(1),
                )
                .unwrap();
                ExtensionObject::new(UserNameIdentityToken {
                    policy_id: UaString::from(POLICY_USERNAME),
                    user_name: UaString::from("op"),
                    password: ByteString::new(data),
                    encryption_algorithm: UaString::null(),
                })
            }
        }

        #[test]
        fn signatures_ecdh_keys_and_encrypted_passwords() {
            for policy in [
                SecurityPolicy::EccNistP256,
                SecurityPolicy::EccNistP256AesGcm,
                SecurityPolicy::EccNistP256ChaChaPoly,
            ] {
                let s = ecc(policy);
                let r = s.create(true);
                assert_eq!(r.server_certificate.as_bytes(), Some(s.server_cert.der()));
                // The ServerSignature (channel-bound when enhanced) verifies.
                let data = create_session_signed_data(
                    policy,
                    s.channel.thumbprint(),
                    &[9; 32],
                    r.server_nonce.as_bytes_or_empty(),
                    s.server_cert.der(),
                    s.client_cert.der(),
                );
                assert!(r.server_signature.algorithm.is_null_or_empty());
                s.server_public
                    .verify(
                        policy.curve().unwrap(),
                        &data,
                        r.server_signature.signature.as_bytes_or_empty(),
                    )
                    .unwrap();
                let key = s.ecdh_key(&r.response_header).expect("an ECDHKey");
                let token = r.authentication_token;
                let nonce = r.server_nonce.as_bytes_or_empty().to_vec();
                // Encrypted for another key: refused before any password check.
                let other = uascale_crypto::ecc::EphemeralKey::generate(
                    uascale_crypto::ecc::EccCurve::NistP256,
                )
                .unwrap();
                let e = s
                    .activate(
                        &token,
                        &nonce,
                        s.password(other.public_nonce(), &nonce, b"right"),
                    )
                    .unwrap_err();
                assert_eq!(e.status_code(), StatusCode::BadIdentityTokenInvalid);
                // The wrong password: denied.
                let e = s
                    .activate(&token, &nonce, s.password(&key, &nonce, b"wrong"))
                    .unwrap_err();
                assert_eq!(e.status_code(), StatusCode::BadUserAccessDenied);
                // The right one: activated, and a fresh ECDHKey comes back.
                let ok = s
                    .activate(&token, &nonce, s.password(&key, &nonce, b"right"))
                    .unwrap();
                let user =
                    s.f.sessions()
                        .with(&token, None, false, s.f.t0, |x| x.user.clone());
                assert_eq!(user, Ok(UserIdentity::UserName("op".into())), "{policy:?}");
                let next = s.ecdh_key(&ok.response_header).expect("a new ECDHKey");
                assert_ne!(next, key);
                // The old key is no longer the session's.
                let nonce = ok.server_nonce.as_bytes_or_empty().to_vec();
                let e = s
                    .activate(&token, &nonce, s.password(&key, &nonce, b"right"))
                    .unwrap_err();
                assert_eq!(e.status_code(), StatusCode::BadIdentityTokenInvalid);
                s.activate(&token, &nonce, s.password(&next, &nonce, b"right"))
                    .unwrap();
            }
        }

        #[test]
        fn a_bad_client_signature_and_no_ecdh_key_are_refused() {
            let s = ecc(SecurityPolicy::EccNistP256AesGcm);
            let r = s.create(false);
            assert_eq!(s.ecdh_key(&r.response_header), None);
            let token = r.authentication_token;
            let nonce = r.server_nonce.as_bytes_or_empty().to_vec();
            // Without an ECDHKey no password can be encrypted for the session.
            let some_key = uascale_crypto::ecc::EphemeralKey::generate(
                uascale_crypto::ecc::EccCurve::NistP256,
            )
            .unwrap();
            let e = s
                .activate(
                    &token,
                    &nonce,
                    s.password(some_key.public_nonce(), &nonce, b"right"),
                )
                .unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadIdentityTokenRejected);
            // A client signature over another nonce.
            let e = s
                .activate(&token, &[1; 32], ExtensionObject::default())
                .unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadApplicationSignatureInvalid);
            // Asking for an ECDHKey of another policy: no key, the
            // StatusCode in its place.
            let mut req = CreateSessionRequest {
                request_header: RequestHeader {
                    additional_header: ecc_secret::ecdh_request(SecurityPolicy::EccNistP384),
                    ..Default::default()
                },
                client_nonce: ByteString::new(vec![9; 32]),
                client_certificate: ByteString::new(s.client_cert.der().to_vec()),
                ..Default::default()
            };
            req.client_description.application_uri = UaString::from("urn:test:client");
            let r = create_session(&s.ctx(), &req).unwrap();
            assert_eq!(s.ecdh_key(&r.response_header), None);
            let ap = r
                .response_header
                .additional_header
                .downcast_ref::<uascale_types::AdditionalParametersType>()
                .unwrap();
            assert!(ap.parameters.iter().flatten().any(|p| p.value
                == uascale_types::Variant::StatusCode(StatusCode::BadSecurityPolicyRejected)));
        }
    }
}
