//! MonitoredItem service set (Part 4 §5.12): CreateMonitoredItems,
//! ModifyMonitoredItems, SetMonitoringMode, SetTriggering,
//! DeleteMonitoredItems.
//!
//! Values of nodes whose manager pushes changes (the in-memory manager:
//! writes and the demo's simulation) reach their items without any timer;
//! every other value is sampled on the item's timer at the revised
//! sampling interval.

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
use super::subscription::session_of;
use super::ServiceContext;
use crate::subscription::event::{compile, BASE_EVENT_TYPE};
use crate::subscription::item::{Filter, ItemTarget, MonitoredItem};

const VALUE: u32 = AttributeId::Value as u32;
const EVENT_NOTIFIER: u32 = AttributeId::EventNotifier as u32;

/// Reads what an item watches, as a sample: both timestamps (the item keeps
/// the ones its client asked for). Texts come in the server's default
/// locale: the sampling timer runs outside any session.
pub fn sample(ctx: &ServiceContext<'_>, t: &ItemTarget) -> DataValue {
    let no_session = NodeId::NULL;
    let locales = Locales::new(ctx, &no_session);
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

fn is_numeric(ctx: &ServiceContext<'_>, data_type: &NodeId) -> bool {
    // Number (i=26) and everything under it.
    ctx.address_space.is_subtype_of(data_type, &NodeId::ns0(26))
        || matches!(ctx.address_space.builtin_base(data_type), Some(2..=11))
}

/// The EURange property of a variable (for percent deadbands).
fn eu_range(ctx: &ServiceContext<'_>, node: &NodeId) -> Option<(f64, f64)> {
    let n = ctx.address_space.get(node)?;
    n.references
        .iter()
        .filter(|r| r.is_forward && r.reference_type == NodeId::ns0(46))
        .filter_map(|r| ctx.address_space.get(&r.target))
        .find(|p| p.browse_name.name == "EURange")
        .and_then(|p| {
            let v = match ctx.managers.read_value(&p.node_id) {
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
    ctx: &ServiceContext<'_>,
    target: &ItemTarget,
    p: &MonitoringParameters,
    publishing_interval: Duration,
) -> Result<Params, (StatusCode, ExtensionObject)> {
    let plain = |s: StatusCode| (s, ExtensionObject::null());
    let node = ctx
        .address_space
        .get(&target.node_id)
        .ok_or(plain(StatusCode::BadNodeIdUnknown))?;
    let limits = &ctx.subscriptions.limits;
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
            ctx.address_space
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
    let pushed = target.attribute_id == VALUE && ctx.managers.pushes_changes(&target.node_id);
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

fn check_call(
    n: usize,
    ts: TimestampsToReturn,
    ctx: &ServiceContext<'_>,
) -> Result<(), StatusCode> {
    if n == 0 {
        return Err(StatusCode::BadNothingToDo);
    }
    if n > ctx.subscriptions.limits.max_monitored_items_per_call {
        return Err(StatusCode::BadTooManyOperations);
    }
    if !(0..=3).contains(&ts.0) {
        return Err(StatusCode::BadTimestampsToReturnInvalid);
    }
    Ok(())
}

/// CreateMonitoredItems.
pub fn create_monitored_items(
    ctx: &ServiceContext<'_>,
    req: &CreateMonitoredItemsRequest,
) -> Result<CreateMonitoredItemsResponse, StatusCode> {
    let session = session_of(ctx, &req.request_header)?;
    let items = req.items_to_create.as_deref().unwrap_or(&[]);
    check_call(items.len(), req.timestamps_to_return, ctx)?;
    let registry = ctx.subscriptions;
    let interval = registry.with_subscription(&session, req.subscription_id, |s| s.interval)?;
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
                let locales = Locales::new(ctx, &req.request_header.authentication_token);
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
                if (max_per_sub != 0 && s.items().len() >= max_per_sub)
                    || !registry.reserve_items(1)
                {
                    return MonitoredItemCreateResult {
                        status_code: StatusCode::BadTooManyMonitoredItems,
                        ..Default::default()
                    };
                }
                let id = s.next_item_id();
                let mut item = MonitoredItem::new(
                    id,
                    r.requested_parameters.client_handle,
                    target,
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
                    if item.sampled {
                        item.next_sample = Some(ctx.instant + item.sampling_interval);
                    }
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
    ctx: &ServiceContext<'_>,
    req: &ModifyMonitoredItemsRequest,
) -> Result<ModifyMonitoredItemsResponse, StatusCode> {
    let session = session_of(ctx, &req.request_header)?;
    let items = req.items_to_modify.as_deref().unwrap_or(&[]);
    check_call(items.len(), req.timestamps_to_return, ctx)?;
    let registry = ctx.subscriptions;
    let (interval, targets) = registry.with_subscription(&session, req.subscription_id, |s| {
        let targets: Vec<Option<ItemTarget>> = items
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
                if item.sampled && item.next_sample.is_some() {
                    item.next_sample = Some(ctx.instant + p.sampling);
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
    ctx: &ServiceContext<'_>,
    req: &SetMonitoringModeRequest,
) -> Result<SetMonitoringModeResponse, StatusCode> {
    let session = session_of(ctx, &req.request_header)?;
    let ids = req.monitored_item_ids.as_deref().unwrap_or(&[]);
    check_call(ids.len(), TimestampsToReturn::Both, ctx)?;
    if !(0..=2).contains(&req.monitoring_mode.0) {
        return Err(StatusCode::BadMonitoringModeInvalid);
    }
    let mode = req.monitoring_mode;
    let results = ctx
        .subscriptions
        .with_subscription(&session, req.subscription_id, |s| {
            let r = ids
                .iter()
                .map(|&id| {
                    let Some(item) = s.item_mut(id) else {
                        return StatusCode::BadMonitoredItemIdInvalid;
                    };
                    let was_disabled = item.mode == MonitoringMode::Disabled;
                    item.set_mode(mode, ctx.instant);
                    if was_disabled && mode != MonitoringMode::Disabled && !item.is_event() {
                        item.offer(sample(ctx, &item.target));
                        if item.sampled {
                            item.next_sample = Some(ctx.instant + item.sampling_interval);
                        }
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
    ctx: &ServiceContext<'_>,
    req: &SetTriggeringRequest,
) -> Result<SetTriggeringResponse, StatusCode> {
    let session = session_of(ctx, &req.request_header)?;
    let add = req.links_to_add.as_deref().unwrap_or(&[]);
    let remove = req.links_to_remove.as_deref().unwrap_or(&[]);
    if add.is_empty() && remove.is_empty() {
        return Err(StatusCode::BadNothingToDo);
    }
    if add.len() + remove.len() > ctx.subscriptions.limits.max_monitored_items_per_call {
        return Err(StatusCode::BadTooManyOperations);
    }
    let trig = req.triggering_item_id;
    let (add_results, remove_results) =
        ctx.subscriptions
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
    ctx: &ServiceContext<'_>,
    req: &DeleteMonitoredItemsRequest,
) -> Result<DeleteMonitoredItemsResponse, StatusCode> {
    let session = session_of(ctx, &req.request_header)?;
    let ids = req.monitored_item_ids.as_deref().unwrap_or(&[]);
    check_call(ids.len(), TimestampsToReturn::Both, ctx)?;
    let registry = ctx.subscriptions;
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
