//! Audit events of session establishment (Part 5 §6.4.3 - §6.4.7):
//! AuditCreateSessionEventType, AuditActivateSessionEventType and
//! AuditSessionEventType for CloseSession and for timeouts
//! ("Session/Timeout", ClientUserId empty), raised on the Server object when
//! `auditing` is configured. With auditing off, callers do not build them:
//! no allocation, no lock. Raising offers the event only to the event items
//! watching the Server object (the registry's watcher index), so it adds
//! no scan and no global lock to establishment.

use uascale_types::{NodeId, QualifiedName, RequestHeader, StatusCode, UaString, Variant};

use crate::subscription::event::Event;

/// What raising an audit event needs of the server and the request.
#[derive(Debug, Clone, Copy)]
pub struct AuditSite<'a> {
    /// Whether auditing is on (`auditing`).
    pub auditing: bool,
    /// The server's ApplicationUri (ServerId).
    pub server_uri: &'a str,
    /// When the server started (the event ids' prefix).
    pub start_time: uascale_types::DateTime,
    /// The nodes (event type hierarchy for the filters).
    pub address_space: &'a crate::address_space::AddressSpace,
    /// The event items the events are offered to.
    pub subscriptions: &'a crate::reply::SubscriptionRegistry,
    /// The time of the action.
    pub now: crate::subscription::Now,
    /// The secure channel of the request (0 for the server's own actions).
    pub channel_id: u32,
}

/// AuditSessionEventType (i=2069).
pub const AUDIT_SESSION_EVENT_TYPE: u32 = 2069;
/// AuditCreateSessionEventType (i=2071).
pub const AUDIT_CREATE_SESSION_EVENT_TYPE: u32 = 2071;
/// AuditActivateSessionEventType (i=2075).
pub const AUDIT_ACTIVATE_SESSION_EVENT_TYPE: u32 = 2075;
/// The Server object (i=2253), the audit events' source and notifier.
const SERVER_OBJECT: u32 = 2253;

/// The audited session service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAction {
    /// CreateSession.
    Create,
    /// ActivateSession.
    Activate,
    /// CloseSession.
    Close,
    /// The server closed a session that timed out (or was never activated).
    Timeout,
}

impl SessionAction {
    fn event_type(self) -> u32 {
        match self {
            SessionAction::Create => AUDIT_CREATE_SESSION_EVENT_TYPE,
            SessionAction::Activate => AUDIT_ACTIVATE_SESSION_EVENT_TYPE,
            SessionAction::Close | SessionAction::Timeout => AUDIT_SESSION_EVENT_TYPE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SessionAction::Create => "CreateSession",
            SessionAction::Activate => "ActivateSession",
            SessionAction::Close => "CloseSession",
            SessionAction::Timeout => "Timeout",
        }
    }
}

/// The audit event of `action`, as raised on the Server object.
/// `session_id` is null when the request failed before a session was
/// known; `revised_timeout_ms` is CreateSession's RevisedSessionTimeout.
pub fn session_event(
    ctx: &AuditSite<'_>,
    action: SessionAction,
    header: &RequestHeader,
    result: Result<(), StatusCode>,
    session_id: NodeId,
    user_id: &str,
    revised_timeout_ms: Option<f64>,
) -> Event {
    let id = crate::subscription::event::new_event_id();
    let (message, severity) = match result {
        Ok(()) => (format!("{} succeeded", action.name()), 100),
        Err(s) => (format!("{} failed: {s}", action.name()), 500),
    };
    let f = |n: &str| QualifiedName::new(0, n);
    let mut e = Event::new(
        id,
        NodeId::ns0(action.event_type()),
        NodeId::ns0(SERVER_OBJECT),
        &format!("Session/{}", action.name()),
        ctx.now.utc,
        &message,
        severity,
    )
    .with_field(f("ActionTimeStamp"), Variant::DateTime(ctx.now.utc))
    .with_field(f("Status"), Variant::Boolean(result.is_ok()))
    .with_field(
        f("ServerId"),
        Variant::String(UaString::from(ctx.server_uri)),
    )
    .with_field(
        f("ClientAuditEntryId"),
        Variant::String(header.audit_entry_id.clone()),
    )
    .with_field(f("ClientUserId"), Variant::String(UaString::from(user_id)))
    .with_field(f("SessionId"), Variant::from(session_id));
    if matches!(action, SessionAction::Create | SessionAction::Activate) {
        e = e.with_field(
            f("SecureChannelId"),
            Variant::String(UaString::from(ctx.channel_id.to_string().as_str())),
        );
    }
    if let Some(t) = revised_timeout_ms {
        e = e.with_field(f("RevisedSessionTimeout"), Variant::Double(t));
    }
    e
}

/// Offers `event` to the event items watching the Server object; returns
/// how many queued it.
pub fn raise(ctx: &AuditSite<'_>, event: &Event) -> usize {
    let space = &ctx.address_space;
    let is_subtype = |a: &NodeId, b: &NodeId| space.is_subtype_of(a, b);
    ctx.subscriptions
        .raise_event(
            ctx.now.instant,
            &[NodeId::ns0(SERVER_OBJECT)],
            &|item| match &item.filter {
                crate::subscription::item::Filter::Event(f) => f.apply(event, &is_subtype),
                crate::subscription::item::Filter::DataChange { .. } => None,
            },
        )
}

/// Builds and raises the audit event of `action` when auditing is on; does
/// nothing when it is off (callers also skip building the arguments).
pub fn audit_session(
    ctx: &AuditSite<'_>,
    action: SessionAction,
    header: &RequestHeader,
    result: Result<(), StatusCode>,
    session_id: NodeId,
    user_id: &str,
    revised_timeout_ms: Option<f64>,
) {
    if !ctx.auditing {
        return;
    }
    let e = session_event(
        ctx,
        action,
        header,
        result,
        session_id,
        user_id,
        revised_timeout_ms,
    );
    raise(ctx, &e);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_and_failure_events_carry_their_fields() {
        let config = crate::config::ServerConfig::default();
        let space = crate::address_space::AddressSpace::default();
        let registry = crate::reply::SubscriptionRegistry::new(Default::default());
        let ctx = AuditSite {
            auditing: true,
            server_uri: &config.server.application_uri,
            start_time: uascale_types::DateTime::from_ticks(3),
            address_space: &space,
            subscriptions: &registry,
            now: crate::subscription::Now {
                instant: std::time::Instant::now(),
                utc: uascale_types::DateTime::from_ticks(5),
            },
            channel_id: 9,
        };
        let field = |e: &Event, n: &str| {
            e.fields
                .iter()
                .find(|(k, _)| k.name.as_str_or_empty() == n)
                .map(|(_, v)| v.clone())
        };
        let s = |x: &str| Some(Variant::String(UaString::from(x)));
        let header = RequestHeader::default();
        let t = session_event(
            &ctx,
            SessionAction::Timeout,
            &header,
            Ok(()),
            NodeId::numeric(1, 4),
            "",
            None,
        );
        assert_eq!(t.event_type, NodeId::ns0(AUDIT_SESSION_EVENT_TYPE));
        assert_eq!(field(&t, "SourceName"), s("Session/Timeout"));
        assert_eq!(
            field(&t, "SourceNode"),
            Some(Variant::from(NodeId::ns0(2253)))
        );
        assert_eq!(
            field(&t, "SessionId"),
            Some(Variant::from(NodeId::numeric(1, 4)))
        );
        assert_eq!(field(&t, "SecureChannelId"), None);
        let c = session_event(
            &ctx,
            SessionAction::Create,
            &header,
            Err(StatusCode::BadTooManySessions),
            NodeId::NULL,
            "",
            Some(30_000.0),
        );
        assert_eq!(field(&c, "Status"), Some(Variant::Boolean(false)));
        assert_eq!(field(&c, "Severity"), Some(Variant::UInt16(500)));
        assert_eq!(field(&c, "SecureChannelId"), s("9"));
        assert_eq!(
            field(&c, "RevisedSessionTimeout"),
            Some(Variant::Double(30_000.0))
        );
        assert_eq!(field(&c, "ServerId"), s(&config.server.application_uri));
        // Unique event ids.
        assert_ne!(field(&t, "EventId"), field(&c, "EventId"));
    }
}
