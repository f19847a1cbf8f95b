//! Subscription service set (Part 4 §5.13): CreateSubscription,
//! ModifySubscription, SetPublishingMode, Publish, Republish,
//! DeleteSubscriptions, TransferSubscriptions. The state lives in the
//! sans-IO engine ([`crate::subscription`]); these handlers check the
//! request, call it, and build the response.

use std::time::Duration;

use uascale_types::{
    CreateSubscriptionRequest, CreateSubscriptionResponse, DeleteSubscriptionsRequest,
    DeleteSubscriptionsResponse, ModifySubscriptionRequest, ModifySubscriptionResponse,
    PublishRequest, RepublishRequest, RepublishResponse, SetPublishingModeRequest,
    SetPublishingModeResponse, StatusCode, TransferResult, TransferSubscriptionsRequest,
    TransferSubscriptionsResponse,
};

use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::reply::Responder;
use crate::subscription::registry::PublishSink;
use crate::subscription::{Answer, Requested};

/// The size checks of a call over many subscriptions or items: none is
/// `BadNothingToDo`, more than `max_monitored_items_per_call`
/// `BadTooManyOperations`.
pub(crate) fn check_count(ctx: &ServiceContext, n: usize) -> Result<(), StatusCode> {
    if n == 0 {
        return Err(StatusCode::BadNothingToDo);
    }
    if n > ctx.state.subscriptions.limits.max_monitored_items_per_call {
        return Err(StatusCode::BadTooManyOperations);
    }
    Ok(())
}
pub use crate::reply::SubscriptionRegistry;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Ties the session to its client for `quotas.max_monitored_items_per_client`:
/// the client certificate's thumbprint, else the ApplicationUri it gave in
/// CreateSession; a session with neither is a client of its own (the
/// source address is not known to the services).
pub(crate) fn identify_client(ctx: &ServiceContext, session: &uascale_types::NodeId) {
    let key = ctx
        .with_session(|s| match (&s.client_thumbprint, &s.client_uri) {
            (Some(t), _) => Some(format!(
                "cert:{}",
                t.iter().map(|b| format!("{b:02x}")).collect::<String>()
            )),
            (None, uri) if !uri.is_null_or_empty() => {
                Some(format!("uri:{}", uri.as_str_or_empty()))
            }
            _ => None,
        })
        .ok()
        .flatten();
    if let Some(key) = key {
        ctx.state.subscriptions.identify(session, &key);
    }
}

/// CreateSubscription: revised interval, lifetime and keep-alive counts.
pub fn create_subscription(
    ctx: &ServiceContext,
    req: &CreateSubscriptionRequest,
) -> Result<CreateSubscriptionResponse, ServiceError> {
    let session = ctx.session_id()?;
    let requested = Requested {
        publishing_interval: req.requested_publishing_interval,
        lifetime_count: req.requested_lifetime_count,
        max_keep_alive_count: req.requested_max_keep_alive_count,
        max_notifications_per_publish: req.max_notifications_per_publish,
        priority: req.priority,
    };
    identify_client(ctx, &session);
    let (id, revised) = ctx.state.subscriptions.create(
        ctx.instant,
        &session,
        &requested,
        req.publishing_enabled,
    )?;
    let user = ctx.with_session(|s| s.user.clone())?;
    ctx.state
        .subscriptions
        .with_set(&session, |set, _| set.set_user(user));

    Ok(CreateSubscriptionResponse {
        response_header: ctx.response_header(&req.request_header),
        subscription_id: id,
        revised_publishing_interval: ms(revised.publishing_interval),
        revised_lifetime_count: revised.lifetime_count,
        revised_max_keep_alive_count: revised.max_keep_alive_count,
    })
}

/// ModifySubscription.
pub fn modify_subscription(
    ctx: &ServiceContext,
    req: &ModifySubscriptionRequest,
) -> Result<ModifySubscriptionResponse, ServiceError> {
    let session = ctx.session_id()?;
    let requested = Requested {
        publishing_interval: req.requested_publishing_interval,
        lifetime_count: req.requested_lifetime_count,
        max_keep_alive_count: req.requested_max_keep_alive_count,
        max_notifications_per_publish: req.max_notifications_per_publish,
        priority: req.priority,
    };
    let revised = ctx.state.subscriptions.limits.revise(&requested);
    let now = ctx.instant;
    ctx.state
        .subscriptions
        .with_subscription(&session, req.subscription_id, |s| {
            s.modify(now, revised, &requested)
        })?;
    Ok(ModifySubscriptionResponse {
        response_header: ctx.response_header(&req.request_header),
        revised_publishing_interval: ms(revised.publishing_interval),
        revised_lifetime_count: revised.lifetime_count,
        revised_max_keep_alive_count: revised.max_keep_alive_count,
    })
}

/// SetPublishingMode.
pub fn set_publishing_mode(
    ctx: &ServiceContext,
    req: &SetPublishingModeRequest,
) -> Result<SetPublishingModeResponse, ServiceError> {
    let session = ctx.session_id()?;
    let ids = req.subscription_ids.as_deref().unwrap_or(&[]);
    check_count(ctx, ids.len())?;
    let results = ids
        .iter()
        .map(|&id| {
            ctx.state
                .subscriptions
                .with_subscription(&session, id, |s| {
                    s.set_publishing_enabled(req.publishing_enabled)
                })
                .err()
                .unwrap_or(StatusCode::Good)
        })
        .collect();
    Ok(SetPublishingModeResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// Publish: acknowledgements are applied and the request is answered now
/// (a late subscription, an owed StatusChange, BadNoSubscription) or
/// parked in the engine until a subscription needs it or its timeoutHint
/// passes. Either way the answer goes through `to`.
pub fn publish(ctx: &ServiceContext, req: &PublishRequest, to: Responder) {
    let h = &req.request_header;
    let session = match ctx.session_id() {
        Ok(s) => s,
        Err(e) => {
            let answer = Answer::Fault {
                request_handle: h.request_handle,
                status: e.status_code(),
            };
            // Past the engine, so counted here (the engine counts its own).
            ctx.state.metrics.publish_answered(&answer);
            let _ = to.deliver(answer);
            return;
        }
    };
    let deadline = (h.timeout_hint > 0)
        .then(|| ctx.instant + Duration::from_millis(u64::from(h.timeout_hint)));
    let acks = req.subscription_acknowledgements.as_deref().unwrap_or(&[]);
    ctx.state.subscriptions.publish(
        ctx.clock(),
        ctx.channel_id,
        &session,
        h.request_handle,
        acks,
        deadline,
        to,
    );
}

/// Republish: a message still in the retransmission queue.
pub fn republish(
    ctx: &ServiceContext,
    req: &RepublishRequest,
) -> Result<RepublishResponse, ServiceError> {
    let session = ctx.session_id()?;
    let set = ctx
        .state
        .subscriptions
        .set_of(&session)
        .ok_or(StatusCode::BadSubscriptionIdInvalid)?;
    let msg = {
        let g = match set.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.republish(req.subscription_id, req.retransmit_sequence_number)?
    };
    Ok(RepublishResponse {
        response_header: ctx.response_header(&req.request_header),
        notification_message: msg,
    })
}

/// DeleteSubscriptions.
pub fn delete_subscriptions(
    ctx: &ServiceContext,
    req: &DeleteSubscriptionsRequest,
) -> Result<DeleteSubscriptionsResponse, ServiceError> {
    let session = ctx.session_id()?;
    let ids = req.subscription_ids.as_deref().unwrap_or(&[]);
    check_count(ctx, ids.len())?;
    let now = ctx.clock();
    let results = ids
        .iter()
        .map(|&id| ctx.state.subscriptions.delete(now, &session, id))
        .collect();
    Ok(DeleteSubscriptionsResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// TransferSubscriptions: moves subscriptions of another session of the
/// same user (the same user name, X509 subject, or both anonymous) to this
/// one; others get `BadUserAccessDenied`.
pub fn transfer_subscriptions(
    ctx: &ServiceContext,
    req: &TransferSubscriptionsRequest,
) -> Result<TransferSubscriptionsResponse, ServiceError> {
    let session = ctx.session_id()?;
    let user = ctx.with_session(|s| s.user.clone())?;
    let ids = req.subscription_ids.as_deref().unwrap_or(&[]);
    check_count(ctx, ids.len())?;
    let now = ctx.clock();
    let results = ids
        .iter()
        .map(|&id| {
            match ctx.state.subscriptions.transfer(
                now,
                &session,
                id,
                req.send_initial_values,
                |owner| owner == Some(&user),
            ) {
                Ok(available) => TransferResult {
                    status_code: StatusCode::Good,
                    available_sequence_numbers: Some(available),
                },
                Err(status) => TransferResult {
                    status_code: status,
                    available_sequence_numbers: None,
                },
            }
        })
        .collect();
    Ok(TransferSubscriptionsResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}
