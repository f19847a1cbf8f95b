//! MonitoredItem service set (Part 4 §5.12): CreateMonitoredItems,
//! ModifyMonitoredItems, SetMonitoringMode, SetTriggering,
//! DeleteMonitoredItems.
//!
//! Values of nodes whose manager pushes changes (the in-memory manager:
//! writes and the demo's simulation) reach their items without any timer;
//! every other value is sampled on the item's timer at the revised
//! sampling interval.

use std::sync::Arc;
use std::time::Duration;

use uascale_types::{
    AggregateFilter, AttributeId, CreateMonitoredItemsRequest, CreateMonitoredItemsResponse,
    DataChangeFilter, DataChangeTrigger, DataValue, DeleteMonitoredItemsRequest,
    DeleteMonitoredItemsResponse, EventFilter, ExtensionObject, ModifyMonitoredItemsRequest,
    ModifyMonitoredItemsResponse, MonitoredItemCreateResult, MonitoredItemModifyResult,
    MonitoringMode, MonitoringParameters, NodeClass, NodeId, Range, ReadValueId,
    SetMonitoringModeRequest, SetMonitoringModeResponse, SetTriggeringRequest,
    SetTriggeringResponse, StatusCode, TimestampsToReturn, Variant,
};

use super::attribute::{read_one, Locales};
use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::subscription::event::{compile, BASE_EVENT_TYPE};
use crate::subscription::item::{Filter, ItemTarget, MonitoredItem};

const VALUE: u32 = AttributeId::Value as u32;
const EVENT_NOTIFIER: u32 = AttributeId::EventNotifier as u32;

/// Reads what an item watches, as a sample: both timestamps (the item keeps
/// the ones its client asked for). Texts come in the server's default
/// locale: the sampling timer runs outside any session.
pub fn sample(ctx: &ServiceContext, t: &ItemTarget) -> DataValue {
    let locales = Locales::new(ctx);
    let mut dv = read_one(
        ctx,
        &ReadValueId {
            node_id: t.node_id.clone(),
            attribute_id: t.attribute_id,
            index_range: t.index_range.clone(),
            ..Default::default()
        },
        TimestampsToReturn::Both,
        &locales,
    );
    if dv.server_timestamp.is_none() {
        dv.server_timestamp = Some(ctx.now);
    }
    dv
}

/// Checked monitoring parameters for an item.
struct Params {
    sampling: Duration,
    sampled: bool,
    queue_size: u32,
    filter: Filter,
    filter_result: ExtensionObject,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The status a failed first read gives the whole item.
fn fatal_read_status(s: StatusCode) -> bool {
    [
        StatusCode::BadNodeIdUnknown,
        StatusCode::BadAttributeIdInvalid,
        StatusCode::BadIndexRangeInvalid,
        StatusCode::BadDataEncodingInvalid,
        StatusCode::BadDataEncodingUnsupported,
        StatusCode::BadNotReadable,
    ]
    .contains(&s)
}

fn is_numeric(ctx: &ServiceContext, data_type: &NodeId) -> bool {
    // Number (i=26) and everything under it.
    ctx.state
        .address_space
        .is_subtype_of(data_type, &NodeId::ns0(26))
        || matches!(
            ctx.state.address_space.builtin_base(data_type),
            Some(2..=11)
        )
}

/// The EURange property of a variable (for percent deadbands).
fn eu_range(ctx: &ServiceContext, node: &NodeId) -> Option<(f64, f64)> {
    let n = ctx.state.address_space.get(node)?;
    n.references
        .iter()
        .filter(|r| r.is_forward && r.reference_type == NodeId::ns0(46))
        .filter_map(|r| ctx.state.address_space.get(&r.target))
        .find(|p| p.browse_name.name == "EURange")
        .and_then(|p| {
            let v = match ctx.state.managers.read_value(&p.node_id) {
                Some(Ok(v)) => v,
                _ => p.value.clone(),
            };
            match v {
                Variant::ExtensionObject(eo) => eo.downcast_ref::<Range>().map(|r| (r.low, r.high)),
                _ => None,
            }
        })
}

/// Checks parameters for an item watching `target`; `Err` is the item's
/// status (and a filter result, for event filters).
fn params(
    ctx: &ServiceContext,
    target: &ItemTarget,
    p: &MonitoringParameters,
    publishing_interval: Duration,
) -> Result<Params, (StatusCode, ExtensionObject)> {
    let plain = |s: StatusCode| (s, ExtensionObject::null());
    let node = ctx
        .state
        .address_space
        .get(&target.node_id)
        .ok_or(plain(StatusCode::BadNodeIdUnknown))?;
    let limits = &ctx.state.subscriptions.limits;
    let is_event = target.attribute_id == EVENT_NOTIFIER;
    let f = &p.filter;
    let mut filter_result = ExtensionObject::null();
    let filter = if is_event {
        if !matches!(node.node_class, NodeClass::Object | NodeClass::View) {
            return Err(plain(StatusCode::BadAttributeIdInvalid));
        }
        if node.event_notifier & 1 == 0 {
            return Err(plain(StatusCode::BadNotSupported));
        }
        let Some(ef) = f.downcast_ref::<EventFilter>() else {
            return Err(plain(StatusCode::BadFilterNotAllowed));
        };
        let is_event_type = |t: &NodeId| {
            ctx.state
                .address_space
                .is_subtype_of(t, &NodeId::ns0(BASE_EVENT_TYPE))
        };
        match compile(ef, &is_event_type) {
            Ok((c, r)) => {
                filter_result = ExtensionObject::new(r);
                Filter::Event(Box::new(c))
            }
            Err((s, r)) => return Err((s, ExtensionObject::new(r))),
        }
    } else if f.is_null() {
        Filter::default()
    } else if let Some(dc) = f.downcast_ref::<DataChangeFilter>() {
        if target.attribute_id != VALUE {
            return Err(plain(StatusCode::BadFilterNotAllowed));
        }
        if !(0..=2).contains(&dc.trigger.0) {
            return Err(plain(StatusCode::BadMonitoredItemFilterInvalid));
        }
        let v = dc.deadband_value;
        let deadband = match dc.deadband_type {
            0 => 0.0,
            1 | 2 if v.is_nan() || v < 0.0 => {
                return Err(plain(StatusCode::BadDeadbandFilterInvalid))
            }
            1 | 2 if !is_numeric(ctx, &node.data_type) => {
                return Err(plain(StatusCode::BadFilterNotAllowed))
            }
            1 => v,
            2 if v > 100.0 => return Err(plain(StatusCode::BadDeadbandFilterInvalid)),
            2 => match eu_range(ctx, &target.node_id) {
                Some((lo, hi)) => v / 100.0 * (hi - lo).abs(),
                None => return Err(plain(StatusCode::BadMonitoredItemFilterUnsupported)),
            },
            _ => return Err(plain(StatusCode::BadDeadbandFilterInvalid)),
        };
        Filter::DataChange {
            trigger: DataChangeTrigger(dc.trigger.0),
            deadband,
        }
    } else if f.downcast_ref::<EventFilter>().is_some() {
        return Err(plain(StatusCode::BadFilterNotAllowed));
    } else if f.downcast_ref::<AggregateFilter>().is_some() {
        return Err(plain(StatusCode::BadMonitoredItemFilterUnsupported));
    } else {
        return Err(plain(StatusCode::BadMonitoredItemFilterInvalid));
    };
    let pushed = target.attribute_id == VALUE && ctx.state.managers.pushes_changes(&target.node_id);
    let sampled = !is_event && !pushed;
    let requested = if p.sampling_interval.is_nan() || p.sampling_interval < 0.0 {
        ms(publishing_interval)
    } else {
        p.sampling_interval
    };
    let sampling = if is_event {
        Duration::ZERO
    } else if sampled {
        let min = ms(limits.min_sampling_interval).max(node.minimum_sampling_interval.max(0.0));
        Duration::from_secs_f64(requested.clamp(min, 3_600_000.0) / 1000.0)
    } else {
        // Pushed: every change is seen; the interval is the client's.
        Duration::from_secs_f64(requested.min(3_600_000.0) / 1000.0)
    };
    let queue_size = if is_event {
        let q = if p.queue_size == 0 {
            limits.default_event_queue_size
        } else {
            p.queue_size
        };
        q.clamp(
            1,
            limits.max_queue_size.max(limits.default_event_queue_size),
        )
    } else {
        p.queue_size.clamp(1, limits.max_queue_size.max(1))
    };
    Ok(Params {
        sampling,
        sampled,
        queue_size,
        filter,
        filter_result,
    })
}

fn check_call(n: usize, ts: TimestampsToReturn, ctx: &ServiceContext) -> Result<(), StatusCode> {
    super::subscription::check_count(ctx, n)?;
    if !(0..=3).contains(&ts.0) {
        return Err(StatusCode::BadTimestampsToReturnInvalid);
    }
    Ok(())
}

/// CreateMonitoredItems.
pub fn create_monitored_items(
    ctx: &ServiceContext,
    req: &CreateMonitoredItemsRequest,
) -> Result<CreateMonitoredItemsResponse, ServiceError> {
    let session = ctx.session_id()?;
    let items = req.items_to_create.as_deref().unwrap_or(&[]);
    check_call(items.len(), req.timestamps_to_return, ctx)?;
    let registry = &ctx.state.subscriptions;
    let interval = registry.with_subscription(&session, req.subscription_id, |s| s.interval)?;
    super::subscription::identify_client(ctx, &session);
    let prepared: Vec<_> = items
        .iter()
        .map(|r| {
            let target = ItemTarget {
                node_id: r.item_to_monitor.node_id.clone(),
                attribute_id: r.item_to_monitor.attribute_id,
                index_range: r.item_to_monitor.index_range.clone(),
            };
            if !(0..=2).contains(&r.monitoring_mode.0) {
                return Err((
                    StatusCode::BadMonitoringModeInvalid,
                    ExtensionObject::null(),
                ));
            }
            if target.attribute_id != EVENT_NOTIFIER {
                // The first read checks attribute, range and encoding.
                let locales = Locales::new(ctx);
                let first = read_one(
                    ctx,
                    &r.item_to_monitor,
                    TimestampsToReturn::Neither,
                    &locales,
                );
                if fatal_read_status(first.status_or_good()) {
                    return Err((first.status_or_good(), ExtensionObject::null()));
                }
            }
            let p = params(ctx, &target, &r.requested_parameters, interval)?;
            Ok((target, p))
        })
        .collect();
    let max_per_sub = registry.limits.max_monitored_items_per_subscription;
    let results = registry.with_subscription(&session, req.subscription_id, |s| {
        s.reserve_items(prepared.iter().filter(|p| p.is_ok()).count());
        prepared
            .into_iter()
            .zip(items)
            .map(|(prep, r)| {
                let (target, p) = match prep {
                    Ok(x) => x,
                    Err((status, filter_result)) => {
                        return MonitoredItemCreateResult {
                            status_code: status,
                            filter_result,
                            ..Default::default()
                        }
                    }
                };
                // The subscription's, then the session's and the client's
                // (`[quotas]`), then the server's limit.
                let refused = || MonitoredItemCreateResult {
                    status_code: StatusCode::BadTooManyMonitoredItems,
                    ..Default::default()
                };
                if max_per_sub != 0 && s.items().len() >= max_per_sub {
                    return refused();
                }
                if s.account().reserve_item().is_err() {
                    return refused();
                }
                if !registry.reserve_items(1) {
                    s.account().release_items(1);
                    return refused();
                }
                let id = s.next_item_id();
                let mut item = MonitoredItem::new(
                    id,
                    r.requested_parameters.client_handle,
                    registry.intern_target(target),
                    r.monitoring_mode,
                    p.sampling,
                    p.sampled,
                    p.queue_size,
                    r.requested_parameters.discard_oldest,
                    req.timestamps_to_return,
                    p.filter,
                );
                if !item.sampled {
                    registry.watch(&item.target.node_id, item.target.attribute_id, s.id, id);
                }
                if !item.is_event() && item.mode != MonitoringMode::Disabled {
                    // The first value, read while the set is locked so a
                    // push cannot overtake it.
                    item.offer(sample(ctx, &item.target));
                    item.schedule_sampling(ctx.instant, s.next_publish);
                }
                let queue_size = item.queue_size;
                s.add_item(item);
                MonitoredItemCreateResult {
                    status_code: StatusCode::Good,
                    monitored_item_id: id,
                    revised_sampling_interval: ms(p.sampling),
                    revised_queue_size: queue_size,
                    filter_result: p.filter_result,
                }
            })
            .collect::<Vec<_>>()
    })?;
    Ok(CreateMonitoredItemsResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// ModifyMonitoredItems.
pub fn modify_monitored_items(
    ctx: &ServiceContext,
    req: &ModifyMonitoredItemsRequest,
) -> Result<ModifyMonitoredItemsResponse, ServiceError> {
    let session = ctx.session_id()?;
    let items = req.items_to_modify.as_deref().unwrap_or(&[]);
    check_call(items.len(), req.timestamps_to_return, ctx)?;
    let registry = &ctx.state.subscriptions;
    let (interval, targets) = registry.with_subscription(&session, req.subscription_id, |s| {
        let targets: Vec<Option<Arc<ItemTarget>>> = items
            .iter()
            .map(|m| s.item(m.monitored_item_id).map(|i| i.target.clone()))
            .collect();
        (s.interval, targets)
    })?;
    let prepared: Vec<_> = items
        .iter()
        .zip(targets)
        .map(|(m, t)| match t {
            None => Err((
                StatusCode::BadMonitoredItemIdInvalid,
                ExtensionObject::null(),
            )),
            Some(t) => params(ctx, &t, &m.requested_parameters, interval),
        })
        .collect();
    let results = registry.with_subscription(&session, req.subscription_id, |s| {
        let r = prepared
            .into_iter()
            .zip(items)
            .map(|(prep, m)| {
                let p = match prep {
                    Ok(p) => p,
                    Err((status, filter_result)) => {
                        return MonitoredItemModifyResult {
                            status_code: status,
                            filter_result,
                            ..Default::default()
                        }
                    }
                };
                let next_publish = s.next_publish;
                let Some(item) = s.item_mut(m.monitored_item_id) else {
                    return MonitoredItemModifyResult {
                        status_code: StatusCode::BadMonitoredItemIdInvalid,
                        ..Default::default()
                    };
                };
                let rp = &m.requested_parameters;
                item.client_handle = rp.client_handle;
                item.timestamps = req.timestamps_to_return;
                item.filter = p.filter;
                item.sampling_interval = p.sampling;
                if item.next_sample.is_some() {
                    item.schedule_sampling(ctx.instant, next_publish);
                }
                item.resize_queue(p.queue_size, rp.discard_oldest);
                MonitoredItemModifyResult {
                    status_code: StatusCode::Good,
                    revised_sampling_interval: ms(p.sampling),
                    revised_queue_size: item.queue_size,
                    filter_result: p.filter_result,
                }
            })
            .collect::<Vec<_>>();
        s.items_changed();
        r
    })?;
    Ok(ModifyMonitoredItemsResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// SetMonitoringMode. An item leaving Disabled takes a new first value.
pub fn set_monitoring_mode(
    ctx: &ServiceContext,
    req: &SetMonitoringModeRequest,
) -> Result<SetMonitoringModeResponse, ServiceError> {
    let session = ctx.session_id()?;
    let ids = req.monitored_item_ids.as_deref().unwrap_or(&[]);
    check_call(ids.len(), TimestampsToReturn::Both, ctx)?;
    if !(0..=2).contains(&req.monitoring_mode.0) {
        return Err(StatusCode::BadMonitoringModeInvalid.into());
    }
    let mode = req.monitoring_mode;
    let results =
        ctx.state
            .subscriptions
            .with_subscription(&session, req.subscription_id, |s| {
                let r = ids
                    .iter()
                    .map(|&id| {
                        let next_publish = s.next_publish;
                        let Some(item) = s.item_mut(id) else {
                            return StatusCode::BadMonitoredItemIdInvalid;
                        };
                        let was_disabled = item.mode == MonitoringMode::Disabled;
                        item.set_mode(mode, ctx.instant);
                        if was_disabled && mode != MonitoringMode::Disabled && !item.is_event() {
                            item.offer(sample(ctx, &item.target));
                            item.schedule_sampling(ctx.instant, next_publish);
                        }
                        StatusCode::Good
                    })
                    .collect::<Vec<_>>();
                s.items_changed();
                r
            })?;
    Ok(SetMonitoringModeResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// SetTriggering: links from a triggering item to items it reports.
pub fn set_triggering(
    ctx: &ServiceContext,
    req: &SetTriggeringRequest,
) -> Result<SetTriggeringResponse, ServiceError> {
    let session = ctx.session_id()?;
    let add = req.links_to_add.as_deref().unwrap_or(&[]);
    let remove = req.links_to_remove.as_deref().unwrap_or(&[]);
    if add.is_empty() && remove.is_empty() {
        return Err(StatusCode::BadNothingToDo.into());
    }
    if add.len() + remove.len() > ctx.state.subscriptions.limits.max_monitored_items_per_call {
        return Err(StatusCode::BadTooManyOperations.into());
    }
    let trig = req.triggering_item_id;
    let (add_results, remove_results) =
        ctx.state
            .subscriptions
            .with_subscription(&session, req.subscription_id, |s| {
                if s.item(trig).is_none() {
                    return Err(StatusCode::BadMonitoredItemIdInvalid);
                }
                let mut links = s.item(trig).map(|i| i.links.clone()).unwrap_or_default();
                let removed = remove
                    .iter()
                    .map(|l| match links.iter().position(|x| x == l) {
                        Some(i) => {
                            links.remove(i);
                            StatusCode::Good
                        }
                        None => StatusCode::BadMonitoredItemIdInvalid,
                    })
                    .collect::<Vec<_>>();
                let added = add
                    .iter()
                    .map(|&l| {
                        if s.item(l).is_none() {
                            StatusCode::BadMonitoredItemIdInvalid
                        } else {
                            if !links.contains(&l) {
                                links.push(l);
                            }
                            StatusCode::Good
                        }
                    })
                    .collect::<Vec<_>>();
                if let Some(i) = s.item_mut(trig) {
                    i.links = links;
                }
                Ok((added, removed))
            })??;
    Ok(SetTriggeringResponse {
        response_header: ctx.response_header(&req.request_header),
        add_results: Some(add_results),
        add_diagnostic_infos: Some(vec![]),
        remove_results: Some(remove_results),
        remove_diagnostic_infos: Some(vec![]),
    })
}

/// DeleteMonitoredItems.
pub fn delete_monitored_items(
    ctx: &ServiceContext,
    req: &DeleteMonitoredItemsRequest,
) -> Result<DeleteMonitoredItemsResponse, ServiceError> {
    let session = ctx.session_id()?;
    let ids = req.monitored_item_ids.as_deref().unwrap_or(&[]);
    check_call(ids.len(), TimestampsToReturn::Both, ctx)?;
    let registry = &ctx.state.subscriptions;
    let (sub, removed) = registry.with_subscription(&session, req.subscription_id, |s| {
        let removed: Vec<Option<MonitoredItem>> = ids.iter().map(|&id| s.remove_item(id)).collect();
        (s.id, removed)
    })?;
    let results = removed
        .iter()
        .map(|r| match r {
            Some(item) => {
                if !item.sampled {
                    registry.unwatch(&item.target.node_id, item.target.attribute_id, sub, item.id);
                }
                registry.release_items(1);
                StatusCode::Good
            }
            None => StatusCode::BadMonitoredItemIdInvalid,
        })
        .collect();
    Ok(DeleteMonitoredItemsResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

#[cfg(test)]
// One real instant is the origin of the test's time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::address_space::{AddressSpace, Node};
    use crate::node_manager::{InMemoryNodeManager, NodeManagers};
    use crate::services::subscription::create_subscription;
    use crate::session::Session;
    use crate::subscription::SubscriptionLimits;
    use crate::ServerConfig;
    use std::sync::Arc;
    use std::time::Instant;
    use uascale_types::{
        CreateSubscriptionRequest, DeadbandType, MonitoredItemCreateRequest, QualifiedName,
        RequestHeader, UaString,
    };

    struct Fixture {
        state: Arc<crate::state::ServerState>,
        demo: Arc<InMemoryNodeManager>,
        t0: Instant,
    }

    fn token() -> NodeId {
        NodeId::opaque(0, vec![7; 32])
    }

    impl Fixture {
        fn new() -> Self {
            let mut space = AddressSpace::ns0().unwrap();
            let mut temp = Node::new(
                NodeClass::Variable,
                NodeId::string(3, "Temp"),
                QualifiedName::new(3, "Temp"),
            );
            temp.data_type = NodeId::ns0(11);
            temp.access_level = 3;
            space.insert(temp);
            let mut range = Node::new(
                NodeClass::Variable,
                NodeId::string(3, "Temp.EURange"),
                QualifiedName::new(0, "EURange"),
            )
            .with_reference(46, false, NodeId::string(3, "Temp"));
            range.data_type = NodeId::ns0(884);
            range.access_level = 1;
            range.value = Variant::from(ExtensionObject::new(Range {
                low: 0.0,
                high: 200.0,
            }));
            space.insert(range);
            let mut name = Node::new(
                NodeClass::Variable,
                NodeId::string(3, "Name"),
                QualifiedName::new(3, "Name"),
            );
            name.data_type = NodeId::ns0(12);
            name.access_level = 3;
            space.insert(name);
            let mut m = InMemoryNodeManager::new("urn:t");
            m.hold(NodeId::string(3, "Temp"), Variant::Double(20.0));
            m.hold(NodeId::string(3, "Name"), Variant::from("a"));
            let demo = Arc::new(m);
            let mut managers = NodeManagers::default();
            managers.register(
                3,
                Arc::clone(&demo) as Arc<dyn crate::node_manager::NodeManager>,
            );
            let t0 = Instant::now();
            let config = ServerConfig {
                subscriptions: SubscriptionLimits {
                    max_monitored_items_per_subscription: 6,
                    ..Default::default()
                },
                ..Default::default()
            };
            let state = crate::state::ServerState::from_parts(
                config,
                space,
                managers,
                crate::security::SecurityState::none_only(),
            );
            let sessions = &state.sessions;

            sessions
                .insert(
                    token(),
                    Session {
                        session_id: NodeId::numeric(1, 1),
                        channel_id: 1,
                        timeout: std::time::Duration::from_secs(60),
                        deadline: t0 + std::time::Duration::from_secs(60),
                        activated: true,
                        name: UaString::from("t"),
                        locale_ids: Box::default(),
                        continuation_points: None,
                        server_nonce: [0; 32],
                        client_thumbprint: None,
                        client_uri: UaString::null(),
                        user: crate::identity::UserIdentity::Anonymous,
                        created: uascale_types::DateTime::MIN,
                        endpoint_url: UaString::null(),
                        security_policy: uascale_crypto::policy::SecurityPolicy::None,
                        security_mode: uascale_types::MessageSecurityMode::None,
                        ecc: None,
                    },
                )
                .unwrap();
            Fixture { state, demo, t0 }
        }

        fn ctx(&self) -> ServiceContext {
            let mut ctx = ServiceContext::for_tests(Arc::clone(&self.state), self.t0);
            // The fixture's session, when it is still open.
            let _ = ctx.resolve(&token());
            ctx
        }
    }

    fn header() -> RequestHeader {
        RequestHeader {
            authentication_token: token(),
            request_handle: 1,
            ..Default::default()
        }
    }

    fn item(node: NodeId, attribute: u32, filter: ExtensionObject) -> MonitoredItemCreateRequest {
        MonitoredItemCreateRequest {
            item_to_monitor: ReadValueId {
                node_id: node,
                attribute_id: attribute,
                ..Default::default()
            },
            monitoring_mode: MonitoringMode::Reporting,
            requested_parameters: MonitoringParameters {
                client_handle: 1,
                sampling_interval: -1.0,
                filter,
                queue_size: 10,
                discard_oldest: true,
            },
        }
    }

    fn deadband(kind: DeadbandType, value: f64) -> ExtensionObject {
        ExtensionObject::new(DataChangeFilter {
            trigger: uascale_types::DataChangeTrigger::StatusValue,
            deadband_type: kind.0 as u32,
            deadband_value: value,
        })
    }

    #[test]
    fn create_checks_filters_and_limits_and_pushes_values() {
        let f = Fixture::new();
        let ctx = f.ctx();
        let sub = create_subscription(
            &ctx,
            &CreateSubscriptionRequest {
                request_header: header(),
                requested_publishing_interval: 100.0,
                requested_lifetime_count: 30,
                requested_max_keep_alive_count: 10,
                publishing_enabled: true,
                ..Default::default()
            },
        )
        .unwrap()
        .subscription_id;
        let temp = NodeId::string(3, "Temp");
        let name = NodeId::string(3, "Name");
        let ef = ExtensionObject::new(EventFilter {
            select_clauses: Some(vec![uascale_types::SimpleAttributeOperand {
                type_definition_id: NodeId::ns0(BASE_EVENT_TYPE),
                browse_path: Some(vec![QualifiedName::new(0, "Message")]),
                attribute_id: VALUE,
                index_range: UaString::null(),
            }]),
            where_clause: Default::default(),
        });
        let requests = vec![
            // 10 % of the EURange 0..200: an absolute deadband of 20.
            item(temp.clone(), VALUE, deadband(DeadbandType::Percent, 10.0)),
            item(name.clone(), VALUE, deadband(DeadbandType::Absolute, 1.0)),
            item(name.clone(), VALUE, deadband(DeadbandType::Percent, 1.0)),
            item(temp.clone(), 4, deadband(DeadbandType::Absolute, 1.0)),
            item(temp.clone(), VALUE, deadband(DeadbandType(7), 1.0)),
            item(NodeId::string(3, "Nope"), VALUE, ExtensionObject::null()),
            item(temp.clone(), 99, ExtensionObject::null()),
            item(NodeId::ns0(2253), EVENT_NOTIFIER, ef),
            item(NodeId::ns0(2253), EVENT_NOTIFIER, ExtensionObject::null()),
            item(name.clone(), VALUE, ExtensionObject::null()),
            item(temp.clone(), VALUE, ExtensionObject::null()),
            item(temp.clone(), VALUE, ExtensionObject::null()),
            item(temp.clone(), VALUE, ExtensionObject::null()),
            item(temp.clone(), VALUE, ExtensionObject::null()),
        ];
        let r = create_monitored_items(
            &ctx,
            &CreateMonitoredItemsRequest {
                request_header: header(),
                subscription_id: sub,
                timestamps_to_return: TimestampsToReturn::Both,
                items_to_create: Some(requests),
            },
        )
        .unwrap();
        let codes: Vec<StatusCode> = r
            .results
            .as_ref()
            .unwrap()
            .iter()
            .map(|r| r.status_code)
            .collect();
        assert_eq!(
            codes,
            vec![
                StatusCode::Good,
                StatusCode::BadFilterNotAllowed,
                StatusCode::BadFilterNotAllowed,
                StatusCode::BadFilterNotAllowed,
                StatusCode::BadDeadbandFilterInvalid,
                StatusCode::BadNodeIdUnknown,
                StatusCode::BadAttributeIdInvalid,
                StatusCode::Good,
                StatusCode::BadFilterNotAllowed,
                StatusCode::Good,
                StatusCode::Good,
                StatusCode::Good,
                StatusCode::Good,
                StatusCode::BadTooManyMonitoredItems,
            ]
        );
        let results = r.results.unwrap();
        assert!(
            results[7]
                .filter_result
                .downcast_ref::<uascale_types::EventFilterResult>()
                .is_some(),
            "an event item gets an EventFilterResult"
        );
        assert_eq!(
            results[0].revised_sampling_interval, 100.0,
            "-1: the publishing interval"
        );
        assert_eq!(f.state.subscriptions.monitored_item_count(), 6);
        // Pushed writes: the 10 % deadband passes 20 -> 45 but not 45 -> 60.
        let deadband_item = results[0].monitored_item_id;
        for v in [45.0, 60.0, 66.0] {
            assert!(f.demo.set(&temp, Variant::Double(v)));
        }
        let queued = f
            .state
            .subscriptions
            .with_subscription(&NodeId::numeric(1, 1), sub, |s| {
                (
                    s.item(deadband_item).map(|i| i.queued()),
                    s.item(results[10].monitored_item_id).map(|i| i.queued()),
                )
            })
            .unwrap();
        assert_eq!(queued, (Some(3), Some(4)), "20, 45, 66 / 20, 45, 60, 66");
        // Too many at once.
        let many = create_monitored_items(
            &ctx,
            &CreateMonitoredItemsRequest {
                request_header: header(),
                subscription_id: sub,
                timestamps_to_return: TimestampsToReturn::Both,
                items_to_create: Some(vec![
                    item(temp.clone(), VALUE, ExtensionObject::null());
                    10_001
                ]),
            },
        );
        assert_eq!(many.unwrap_err(), StatusCode::BadTooManyOperations);
        let bad_sub = create_monitored_items(
            &ctx,
            &CreateMonitoredItemsRequest {
                request_header: header(),
                subscription_id: sub + 100,
                timestamps_to_return: TimestampsToReturn::Both,
                items_to_create: Some(vec![item(temp, VALUE, ExtensionObject::null())]),
            },
        );
        assert_eq!(bad_sub.unwrap_err(), StatusCode::BadSubscriptionIdInvalid);
        // Deleting gives the items back.
        let ids: Vec<u32> = results
            .iter()
            .map(|r| r.monitored_item_id)
            .filter(|&i| i != 0)
            .collect();
        let d = delete_monitored_items(
            &ctx,
            &DeleteMonitoredItemsRequest {
                request_header: header(),
                subscription_id: sub,
                monitored_item_ids: Some([ids.clone(), vec![999]].concat()),
            },
        )
        .unwrap();
        assert_eq!(
            d.results.unwrap().last(),
            Some(&StatusCode::BadMonitoredItemIdInvalid)
        );
        assert_eq!(f.state.subscriptions.monitored_item_count(), 0);
    }

    #[test]
    fn diagnostics_arrays_are_throttled_and_can_be_switched_off() {
        let f = Fixture::new();
        let read = |f: &Fixture, at: std::time::Duration| {
            let mut ctx = f.ctx();
            ctx.instant = f.t0 + at;
            let r = crate::services::attribute::read(
                &ctx,
                &uascale_types::ReadRequest {
                    nodes_to_read: Some(vec![ReadValueId {
                        node_id: NodeId::ns0(2290),
                        attribute_id: VALUE,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            )
            .unwrap();
            r.results.unwrap()[0].clone()
        };
        let rows = |dv: &DataValue| match &dv.value {
            Some(Variant::Array(a)) => a.values().len(),
            other => panic!("{other:?}"),
        };
        assert_eq!(rows(&read(&f, std::time::Duration::ZERO)), 0);
        let ctx = f.ctx();
        create_subscription(
            &ctx,
            &CreateSubscriptionRequest {
                request_header: header(),
                requested_publishing_interval: 100.0,
                publishing_enabled: true,
                ..Default::default()
            },
        )
        .unwrap();
        // Within the second: the cached array; after it: rebuilt.
        assert_eq!(rows(&read(&f, std::time::Duration::from_millis(500))), 0);
        let dv = read(&f, std::time::Duration::from_millis(1000));
        assert_eq!(rows(&dv), 1);
        let Some(Variant::Array(a)) = &dv.value else {
            panic!()
        };
        let uascale_types::ArrayValues::ExtensionObject(eos) = a.values() else {
            panic!("{a:?}")
        };
        let d = eos[0]
            .downcast_ref::<uascale_types::SubscriptionDiagnosticsDataType>()
            .unwrap();
        assert_eq!(d.session_id, NodeId::numeric(1, 1));
        assert_eq!(d.publishing_interval, 100.0);
        // The limits are published in ServerCapabilities.
        let ctx = f.ctx();
        let caps = crate::services::attribute::read(
            &ctx,
            &uascale_types::ReadRequest {
                nodes_to_read: Some(
                    [24104u32, 11714, 24096]
                        .iter()
                        .map(|&n| ReadValueId {
                            node_id: NodeId::ns0(n),
                            attribute_id: VALUE,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        )
        .unwrap();
        let caps: Vec<Option<Variant>> =
            caps.results.unwrap().into_iter().map(|d| d.value).collect();
        assert_eq!(
            caps,
            vec![
                Some(Variant::UInt32(6)),
                Some(Variant::UInt32(10_000)),
                Some(Variant::UInt32(50_000))
            ]
        );
        f.state.set_diagnostics_enabled(false);
        assert_eq!(
            read(&f, std::time::Duration::from_secs(5)).status,
            Some(StatusCode::BadOutOfService)
        );
    }

    #[test]
    fn session_diagnostics_are_throttled_and_can_be_switched_off() {
        use uascale_types::ids::variable as v;
        let f = Fixture::new();
        let read = |f: &Fixture, id: u32, at: std::time::Duration| {
            let mut ctx = f.ctx();
            ctx.instant = f.t0 + at;
            let r = crate::services::attribute::read(
                &ctx,
                &uascale_types::ReadRequest {
                    nodes_to_read: Some(vec![ReadValueId {
                        node_id: NodeId::ns0(id),
                        attribute_id: VALUE,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            )
            .unwrap();
            r.results.unwrap()[0].clone()
        };
        let array = v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionDiagnosticsArray;
        let rows = |dv: &DataValue| -> Vec<uascale_types::SessionDiagnosticsDataType> {
            let Some(Variant::Array(a)) = &dv.value else {
                panic!("{dv:?}")
            };
            let uascale_types::ArrayValues::ExtensionObject(eos) = a.values() else {
                panic!("{a:?}")
            };
            eos.iter()
                .map(|e| {
                    e.downcast_ref::<uascale_types::SessionDiagnosticsDataType>()
                        .unwrap()
                        .clone()
                })
                .collect()
        };
        let first = rows(&read(&f, array, std::time::Duration::ZERO));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].session_id, NodeId::numeric(1, 1));
        assert_eq!(first[0].session_name, UaString::from("t"));
        assert_eq!(first[0].actual_session_timeout, 60_000.0);
        assert_eq!(first[0].current_subscriptions_count, 0);
        let ctx = f.ctx();
        create_subscription(
            &ctx,
            &CreateSubscriptionRequest {
                request_header: header(),
                requested_publishing_interval: 100.0,
                publishing_enabled: true,
                ..Default::default()
            },
        )
        .unwrap();
        let mut second = Session {
            session_id: NodeId::numeric(1, 2),
            ..f.state
                .sessions
                .with(&token(), None, false, f.t0, |s| s.clone())
                .unwrap()
        };
        second.continuation_points = None;
        f.state
            .sessions
            .insert(NodeId::opaque(0, vec![8; 32]), second)
            .unwrap();
        // Within the second: the cached array; after it: rebuilt.
        let cached = rows(&read(&f, array, std::time::Duration::from_millis(500)));
        assert_eq!(cached, first);
        let mut fresh = rows(&read(&f, array, std::time::Duration::from_millis(1000)));
        fresh.sort_by_key(|r| r.session_id.clone());
        assert_eq!(fresh.len(), 2);
        assert_eq!(fresh[0].current_subscriptions_count, 1);
        assert_eq!(fresh[1].current_subscriptions_count, 0);
        let security =
            v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionSecurityDiagnosticsArray;
        let dv = read(&f, security, std::time::Duration::from_millis(1000));
        let Some(Variant::Array(a)) = &dv.value else {
            panic!("{dv:?}")
        };
        let uascale_types::ArrayValues::ExtensionObject(eos) = a.values() else {
            panic!("{a:?}")
        };
        assert_eq!(eos.len(), 2);
        let d = eos[0]
            .downcast_ref::<uascale_types::SessionSecurityDiagnosticsDataType>()
            .unwrap();
        assert_eq!(d.authentication_mechanism, UaString::from("Anonymous"));
        assert_eq!(
            d.security_policy_uri,
            UaString::from("http://opcfoundation.org/UA/SecurityPolicy#None")
        );
        assert_eq!(d.security_mode, uascale_types::MessageSecurityMode::None);
        // The summary counters are live (no throttle).
        let summary = [
            (
                v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount,
                2,
            ),
            (
                v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSessionCount,
                3,
            ),
            (
                v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionTimeoutCount,
                0,
            ),
            (
                v::Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedSessionCount,
                0,
            ),
        ];
        f.state
            .sessions
            .close(&NodeId::opaque(0, vec![8; 32]), true);
        f.state
            .sessions
            .insert(
                NodeId::opaque(0, vec![9; 32]),
                Session {
                    session_id: NodeId::numeric(1, 3),
                    ..f.state
                        .sessions
                        .with(&token(), None, false, f.t0, |s| s.clone())
                        .unwrap()
                },
            )
            .unwrap();
        for (id, want) in summary {
            assert_eq!(
                read(&f, id, std::time::Duration::ZERO).value,
                Some(Variant::UInt32(want)),
                "{id}"
            );
        }
        f.state.set_diagnostics_enabled(false);
        for id in [array, security] {
            assert_eq!(
                read(&f, id, std::time::Duration::from_secs(5)).status,
                Some(StatusCode::BadOutOfService)
            );
        }
    }

    #[test]
    fn session_audit_events_reach_server_event_items_only_with_auditing() {
        use crate::services::session::{activate_session, close_session, create_session};
        let f = Fixture::new();
        f.state.set_auditing(true);
        let ctx = f.ctx();
        let sub = create_subscription(
            &ctx,
            &CreateSubscriptionRequest {
                request_header: header(),
                requested_publishing_interval: 100.0,
                publishing_enabled: true,
                ..Default::default()
            },
        )
        .unwrap()
        .subscription_id;
        let select = |name: &str| uascale_types::SimpleAttributeOperand {
            type_definition_id: NodeId::ns0(BASE_EVENT_TYPE),
            browse_path: Some(vec![QualifiedName::new(0, name)]),
            attribute_id: VALUE,
            index_range: UaString::null(),
        };
        let ef = ExtensionObject::new(EventFilter {
            select_clauses: Some(
                [
                    "EventType",
                    "SourceName",
                    "Status",
                    "ClientUserId",
                    "SessionId",
                ]
                .iter()
                .map(|n| select(n))
                .collect(),
            ),
            where_clause: Default::default(),
        });
        let item_id = create_monitored_items(
            &ctx,
            &CreateMonitoredItemsRequest {
                request_header: header(),
                subscription_id: sub,
                timestamps_to_return: TimestampsToReturn::Both,
                items_to_create: Some(vec![item(NodeId::ns0(2253), EVENT_NOTIFIER, ef)]),
            },
        )
        .unwrap()
        .results
        .unwrap()[0]
            .monitored_item_id;
        let created = create_session(
            &ctx,
            &uascale_types::CreateSessionRequest {
                session_name: UaString::from("audited"),
                requested_session_timeout: 60_000.0,
                ..Default::default()
            },
        )
        .unwrap();
        let other = RequestHeader {
            authentication_token: created.authentication_token.clone(),
            audit_entry_id: UaString::from("entry-7"),
            ..Default::default()
        };
        activate_session(
            &ctx,
            &uascale_types::ActivateSessionRequest {
                request_header: other.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        // A close with an unknown token fails: audited with Status false.
        let bogus = RequestHeader {
            authentication_token: NodeId::opaque(0, vec![1; 32]),
            ..Default::default()
        };
        let closed = |h: &RequestHeader| {
            close_session(
                &ctx,
                &uascale_types::CloseSessionRequest {
                    request_header: h.clone(),
                    delete_subscriptions: true,
                },
            )
        };
        assert_eq!(closed(&bogus).unwrap_err(), StatusCode::BadSessionIdInvalid);
        closed(&other).unwrap();
        let drain = || {
            f.state
                .subscriptions
                .with_subscription(&NodeId::numeric(1, 1), sub, |s| {
                    let item = s.item_mut(item_id).unwrap();
                    item.drain(100).collect::<Vec<_>>()
                })
                .unwrap()
        };
        let events: Vec<Vec<Variant>> = drain()
            .into_iter()
            .map(|q| match q {
                crate::subscription::item::Queued::Event(fields) => fields,
                other => panic!("{other:?}"),
            })
            .collect();
        let s = |x: &str| Variant::String(UaString::from(x));
        let sid = Variant::from(created.session_id.clone());
        assert_eq!(
            events,
            vec![
                vec![
                    Variant::from(NodeId::ns0(crate::audit::AUDIT_CREATE_SESSION_EVENT_TYPE)),
                    s("Session/CreateSession"),
                    Variant::Boolean(true),
                    s(""),
                    sid.clone(),
                ],
                vec![
                    Variant::from(NodeId::ns0(crate::audit::AUDIT_ACTIVATE_SESSION_EVENT_TYPE)),
                    s("Session/ActivateSession"),
                    Variant::Boolean(true),
                    s("Anonymous"),
                    sid.clone(),
                ],
                vec![
                    Variant::from(NodeId::ns0(crate::audit::AUDIT_SESSION_EVENT_TYPE)),
                    s("Session/CloseSession"),
                    Variant::Boolean(false),
                    s(""),
                    Variant::from(NodeId::NULL),
                ],
                vec![
                    Variant::from(NodeId::ns0(crate::audit::AUDIT_SESSION_EVENT_TYPE)),
                    s("Session/CloseSession"),
                    Variant::Boolean(true),
                    s("Anonymous"),
                    sid,
                ],
            ]
        );
        // The Auditing variable reads the configuration.
        let auditing = crate::services::attribute::read(
            &ctx,
            &uascale_types::ReadRequest {
                nodes_to_read: Some(vec![ReadValueId {
                    node_id: NodeId::ns0(uascale_types::ids::variable::Server_Auditing),
                    attribute_id: VALUE,
                    ..Default::default()
                }]),
                ..Default::default()
            },
        )
        .unwrap()
        .results
        .unwrap()[0]
            .clone();
        assert_eq!(auditing.value, Some(Variant::Boolean(true)));
        // Off: nothing is raised.
        f.state.set_auditing(false);
        let ctx = f.ctx();
        let again = create_session(&ctx, &Default::default()).unwrap();
        let _ = close_session(
            &ctx,
            &uascale_types::CloseSessionRequest {
                request_header: RequestHeader {
                    authentication_token: again.authentication_token,
                    ..Default::default()
                },
                delete_subscriptions: true,
            },
        );
        assert!(drain().is_empty());
    }
}
