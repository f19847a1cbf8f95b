//! Attribute service set (Part 4 §5.10): Read.

use uascale_types::{
    AttributeId, DataValue, LocalizedText, NodeClass, NodeId, QualifiedName, ReadRequest,
    ReadResponse, ReadValueId, StatusCode, TimestampsToReturn, UaString, Variant,
};

use super::{Answer, ServiceContext};
use crate::address_space::Node;
use crate::numeric_range::NumericRange;

/// Most nodes in one Read (published as OperationLimits.MaxNodesPerRead).
pub const MAX_NODES_PER_READ: usize = 10_000;

/// Read: every requested attribute, with the timestamps asked for.
pub fn read(ctx: &ServiceContext<'_>, req: &ReadRequest) -> Result<ReadResponse, StatusCode> {
    if req.max_age < 0.0 || req.max_age.is_nan() {
        return Err(StatusCode::BadMaxAgeInvalid);
    }
    if !(0..=3).contains(&req.timestamps_to_return.0) {
        return Err(StatusCode::BadTimestampsToReturnInvalid);
    }
    let nodes = req.nodes_to_read.as_deref().unwrap_or(&[]);
    if nodes.is_empty() {
        return Err(StatusCode::BadNothingToDo);
    }
    if nodes.len() > MAX_NODES_PER_READ {
        return Err(StatusCode::BadTooManyOperations);
    }
    let results = nodes
        .iter()
        .map(|r| read_one(ctx, r, req.timestamps_to_return))
        .collect();
    Ok(ReadResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// One ReadValueId read, with the timestamps asked for (also what a
/// monitored item samples).
pub(crate) fn read_one(
    ctx: &ServiceContext<'_>,
    r: &ReadValueId,
    ts: TimestampsToReturn,
) -> DataValue {
    let mut dv = match read_attribute(ctx, r) {
        Ok(v) => DataValue {
            value: Some(v),
            ..Default::default()
        },
        Err(status) => return DataValue::status(status),
    };
    if r.attribute_id == AttributeId::Value as u32 {
        if matches!(ts, TimestampsToReturn::Source | TimestampsToReturn::Both) {
            dv.source_timestamp = Some(ctx.now);
        }
        if matches!(ts, TimestampsToReturn::Server | TimestampsToReturn::Both) {
            dv.server_timestamp = Some(ctx.now);
        }
    }
    dv
}

/// The DisplayName / Description in the session's locale when we have it;
/// namespace 0 carries one locale, so this returns it as is.
fn text(t: &LocalizedText) -> Variant {
    Variant::from(t.clone())
}

fn read_attribute(ctx: &ServiceContext<'_>, r: &ReadValueId) -> Result<Variant, StatusCode> {
    let node = ctx
        .address_space
        .get(&r.node_id)
        .ok_or(StatusCode::BadNodeIdUnknown)?;
    let attr = AttributeId::from_u32(r.attribute_id).ok_or(StatusCode::BadAttributeIdInvalid)?;
    if attr != AttributeId::Value {
        if !r.data_encoding.is_null() {
            return Err(StatusCode::BadDataEncodingInvalid);
        }
        if !r.index_range.is_null_or_empty() {
            return Err(StatusCode::BadIndexRangeNoData);
        }
    }
    let class = node.node_class;
    let is_type = matches!(
        class,
        NodeClass::ObjectType
            | NodeClass::VariableType
            | NodeClass::ReferenceType
            | NodeClass::DataType
    );
    let is_var = class == NodeClass::Variable;
    let has_value = is_var || class == NodeClass::VariableType;
    Ok(match attr {
        AttributeId::NodeId => Variant::from(node.node_id.clone()),
        AttributeId::NodeClass => Variant::Int32(class.0),
        AttributeId::BrowseName => Variant::from(node.browse_name.clone()),
        AttributeId::DisplayName => text(&node.display_name),
        AttributeId::Description => text(&node.description),
        AttributeId::WriteMask => Variant::UInt32(node.write_mask),
        // No user can write attributes other than those the node allows.
        AttributeId::UserWriteMask => Variant::UInt32(node.write_mask),
        AttributeId::IsAbstract if is_type => Variant::Boolean(node.is_abstract),
        AttributeId::Symmetric if class == NodeClass::ReferenceType => {
            Variant::Boolean(node.symmetric)
        }
        AttributeId::InverseName if class == NodeClass::ReferenceType => text(&node.inverse_name),
        AttributeId::ContainsNoLoops if class == NodeClass::View => {
            Variant::Boolean(node.contains_no_loops)
        }
        AttributeId::EventNotifier if matches!(class, NodeClass::Object | NodeClass::View) => {
            Variant::Byte(node.event_notifier)
        }
        AttributeId::Value if has_value => value(ctx, node, r)?,
        AttributeId::DataType if has_value => Variant::from(node.data_type.clone()),
        AttributeId::ValueRank if has_value => Variant::Int32(node.value_rank),
        AttributeId::ArrayDimensions if has_value => match &node.array_dimensions {
            Some(d) => Variant::from(d.clone()),
            None => Variant::Empty,
        },
        AttributeId::AccessLevel | AttributeId::UserAccessLevel if is_var => {
            Variant::Byte(node.access_level)
        }
        AttributeId::AccessLevelEx if is_var => Variant::UInt32(u32::from(node.access_level)),
        AttributeId::MinimumSamplingInterval if is_var => {
            Variant::Double(node.minimum_sampling_interval)
        }
        AttributeId::Historizing if is_var => Variant::Boolean(node.historizing),
        AttributeId::Executable | AttributeId::UserExecutable if class == NodeClass::Method => {
            Variant::Boolean(node.executable)
        }
        _ => return Err(StatusCode::BadAttributeIdInvalid),
    })
}

fn value(ctx: &ServiceContext<'_>, node: &Node, r: &ReadValueId) -> Result<Variant, StatusCode> {
    check_value_read(node, r)?;
    let v = match crate::server_object::live_value(ctx, &node.node_id) {
        Some(v) => v,
        None => match ctx.managers.read_value(&node.node_id) {
            Some(r) => r?,
            None => node.value.clone(),
        },
    };
    apply_index_range(v, &r.index_range)
}

/// The checks of a Value read that come before the value is fetched.
fn check_value_read(node: &Node, r: &ReadValueId) -> Result<(), StatusCode> {
    if node.node_class == NodeClass::Variable && node.access_level & 1 == 0 {
        return Err(StatusCode::BadNotReadable);
    }
    let enc = &r.data_encoding;
    if !enc.is_null() && *enc != QualifiedName::new(0, "Default Binary") {
        return Err(if enc.namespace_index == 0 && enc.name == "Default XML" {
            StatusCode::BadDataEncodingUnsupported
        } else {
            StatusCode::BadDataEncodingInvalid
        });
    }
    Ok(())
}

fn apply_index_range(v: Variant, index_range: &UaString) -> Result<Variant, StatusCode> {
    match index_range.as_str() {
        None | Some("") => Ok(v),
        Some(text) => {
            let range: NumericRange = text.parse().map_err(|_| StatusCode::BadIndexRangeInvalid)?;
            range.apply(&v)
        }
    }
}

/// A short helper for tests and other services: read one Value.
pub fn read_value(ctx: &ServiceContext<'_>, node: &NodeId) -> DataValue {
    read_one(
        ctx,
        &ReadValueId {
            node_id: node.clone(),
            attribute_id: AttributeId::Value as u32,
            index_range: UaString::null(),
            data_encoding: QualifiedName::default(),
        },
        TimestampsToReturn::Neither,
    )
}

/// Write: Values of variables that allow it, with type and index-range
/// checks; other attributes are not writable on any node of this server.
pub fn write(
    ctx: &ServiceContext<'_>,
    req: &uascale_types::WriteRequest,
) -> Result<uascale_types::WriteResponse, StatusCode> {
    let nodes = req.nodes_to_write.as_deref().unwrap_or(&[]);
    if nodes.is_empty() {
        return Err(StatusCode::BadNothingToDo);
    }
    if nodes.len() > MAX_NODES_PER_WRITE {
        return Err(StatusCode::BadTooManyOperations);
    }
    let results = nodes
        .iter()
        .map(|w| write_one(ctx, w).err().unwrap_or(StatusCode::Good))
        .collect();
    Ok(uascale_types::WriteResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// Most nodes in one Write (OperationLimits.MaxNodesPerWrite).
pub const MAX_NODES_PER_WRITE: usize = 10_000;

fn write_one(ctx: &ServiceContext<'_>, w: &uascale_types::WriteValue) -> Result<(), StatusCode> {
    let (node, value, range) = check_write(ctx, w)?;
    let new = match range {
        None => value,
        Some(range) => {
            let current = match ctx.managers.read_value(&node.node_id) {
                Some(r) => r?,
                None => node.value.clone(),
            };
            range.write(&current, &value)?
        }
    };
    ctx.managers.write_value(&node.node_id, new)
}

/// The checks of a Write before the value is stored: the node, the
/// attribute, the access level, the type; returns the node, the value and
/// the index range to write it at.
fn check_write<'a>(
    ctx: &ServiceContext<'a>,
    w: &uascale_types::WriteValue,
) -> Result<(&'a Node, Variant, Option<NumericRange>), StatusCode> {
    let node = ctx
        .address_space
        .get(&w.node_id)
        .ok_or(StatusCode::BadNodeIdUnknown)?;
    let attr = AttributeId::from_u32(w.attribute_id).ok_or(StatusCode::BadAttributeIdInvalid)?;
    if attr != AttributeId::Value {
        // WriteMask is 0 on every node this server holds.
        return Err(StatusCode::BadNotWritable);
    }
    if node.node_class != NodeClass::Variable {
        return Err(StatusCode::BadAttributeIdInvalid);
    }
    if node.access_level & 2 == 0 {
        return Err(StatusCode::BadNotWritable);
    }
    let dv = &w.value;
    // Writing a status or timestamps is not supported; an explicit Good
    // status (which several clients always send) is the same as none.
    if dv.status.is_some_and(|s| s != StatusCode::Good)
        || dv.source_timestamp.is_some()
        || dv.server_timestamp.is_some()
    {
        return Err(StatusCode::BadWriteNotSupported);
    }
    let value = dv.value.clone().unwrap_or_default();
    check_type(ctx, node, &value, w.index_range.is_null_or_empty())?;
    let range = match w.index_range.as_str() {
        None | Some("") => None,
        Some(text) => Some(
            text.parse::<NumericRange>()
                .map_err(|_| StatusCode::BadIndexRangeInvalid)?,
        ),
    };
    Ok((node, value, range))
}

/// The value must be of the variable's DataType (or a subtype's built-in
/// type) and match its ValueRank (scalar vs array).
fn check_type(
    ctx: &ServiceContext<'_>,
    node: &Node,
    v: &Variant,
    whole: bool,
) -> Result<(), StatusCode> {
    let Some(t) = v.type_id() else {
        return Err(StatusCode::BadTypeMismatch);
    };
    if let Some(base) = ctx.address_space.builtin_base(&node.data_type) {
        // BaseDataType (24) takes anything.
        if base != 24 && base != u32::from(t.id()) {
            return Err(StatusCode::BadTypeMismatch);
        }
    }
    // A partial write always carries an array (of the range's length).
    let scalar_rank = node.value_rank == -1;
    if whole && scalar_rank == v.is_array() {
        return Err(StatusCode::BadTypeMismatch);
    }
    Ok(())
}

/// HistoryRead: no node of this server keeps history yet, so every node
/// answers `BadHistoryOperationUnsupported` (unknown ones
/// `BadNodeIdUnknown`), after the request itself is checked.
pub fn history_read(
    ctx: &ServiceContext<'_>,
    req: &uascale_types::HistoryReadRequest,
) -> Result<uascale_types::HistoryReadResponse, StatusCode> {
    use uascale_types as t;
    let nodes = req.nodes_to_read.as_deref().unwrap_or(&[]);
    if nodes.is_empty() {
        return Err(StatusCode::BadNothingToDo);
    }
    if nodes.len() > MAX_NODES_PER_READ {
        return Err(StatusCode::BadTooManyOperations);
    }
    if !(0..=3).contains(&req.timestamps_to_return.0) {
        return Err(StatusCode::BadTimestampsToReturnInvalid);
    }
    let d = &req.history_read_details;
    let known = d.downcast_ref::<t::ReadRawModifiedDetails>().is_some()
        || d.downcast_ref::<t::ReadEventDetails>().is_some()
        || d.downcast_ref::<t::ReadProcessedDetails>().is_some()
        || d.downcast_ref::<t::ReadAtTimeDetails>().is_some()
        || d.downcast_ref::<t::ReadAnnotationDataDetails>().is_some();
    if !known {
        return Err(StatusCode::BadHistoryOperationInvalid);
    }
    let results = nodes
        .iter()
        .map(|n| t::HistoryReadResult {
            status_code: if ctx.address_space.get(&n.node_id).is_some() {
                StatusCode::BadHistoryOperationUnsupported
            } else {
                StatusCode::BadNodeIdUnknown
            },
            continuation_point: uascale_types::ByteString::null(),
            history_data: uascale_types::ExtensionObject::null(),
        })
        .collect();
    Ok(t::HistoryReadResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// Read, with the values of asynchronously served namespaces awaited: the
/// attributes held here are read at once, the asynchronous values
/// concurrently, and the response is sent when the last one arrives.
pub fn read_answer(
    ctx: &ServiceContext<'_>,
    req: &ReadRequest,
) -> Result<Answer<ReadResponse>, StatusCode> {
    let nodes = req.nodes_to_read.as_deref().unwrap_or(&[]);
    let is_async_value = |r: &ReadValueId| {
        r.attribute_id == AttributeId::Value as u32 && ctx.managers.is_async(r.node_id.namespace)
    };
    if !nodes.iter().any(is_async_value) {
        return read(ctx, req).map(Answer::Now);
    }
    // The request-level checks: `read` answers them the same way.
    let checked = read(
        ctx,
        &ReadRequest {
            nodes_to_read: Some(vec![]),
            ..req.clone()
        },
    );
    match checked {
        Err(StatusCode::BadNothingToDo) => {}
        Err(status) => return Err(status),
        Ok(_) => {}
    }
    if nodes.len() > MAX_NODES_PER_READ {
        return Err(StatusCode::BadTooManyOperations);
    }
    let ts = req.timestamps_to_return;
    let mut results = Vec::with_capacity(nodes.len());
    let mut pending = Vec::new();
    let mut futures = Vec::new();
    for (i, r) in nodes.iter().enumerate() {
        if !is_async_value(r) {
            results.push(read_one(ctx, r, ts));
            continue;
        }
        let started = ctx
            .address_space
            .get(&r.node_id)
            .ok_or(StatusCode::BadNodeIdUnknown)
            .and_then(|node| {
                if !matches!(
                    node.node_class,
                    NodeClass::Variable | NodeClass::VariableType
                ) {
                    return Err(StatusCode::BadAttributeIdInvalid);
                }
                check_value_read(node, r)?;
                ctx.managers
                    .read_value_async(&node.node_id)
                    .ok_or(StatusCode::BadWouldBlock)
            });
        match started {
            Ok(f) => {
                pending.push((i, r.index_range.clone()));
                futures.push(f);
                results.push(DataValue::default());
            }
            Err(status) => results.push(DataValue::status(status)),
        }
    }
    let header = ctx.response_header(&req.request_header);
    let now = ctx.now;
    Ok(Answer::Later(Box::pin(async move {
        let values = crate::reply::join_all(futures).await;
        for ((i, range), v) in pending.into_iter().zip(values) {
            let dv = match v.and_then(|v| apply_index_range(v, &range)) {
                Ok(v) => {
                    let mut dv = DataValue {
                        value: Some(v),
                        ..Default::default()
                    };
                    if matches!(ts, TimestampsToReturn::Source | TimestampsToReturn::Both) {
                        dv.source_timestamp = Some(now);
                    }
                    if matches!(ts, TimestampsToReturn::Server | TimestampsToReturn::Both) {
                        dv.server_timestamp = Some(now);
                    }
                    dv
                }
                Err(status) => DataValue::status(status),
            };
            if let Some(slot) = results.get_mut(i) {
                *slot = dv;
            }
        }
        Ok(ReadResponse {
            response_header: header,
            results: Some(results),
            diagnostic_infos: Some(vec![]),
        })
    })))
}

/// Write, with the values of asynchronously served namespaces stored by
/// their managers before the response is sent.
pub fn write_answer(
    ctx: &ServiceContext<'_>,
    req: &uascale_types::WriteRequest,
) -> Result<Answer<uascale_types::WriteResponse>, StatusCode> {
    let nodes = req.nodes_to_write.as_deref().unwrap_or(&[]);
    let is_async_value = |w: &uascale_types::WriteValue| {
        w.attribute_id == AttributeId::Value as u32 && ctx.managers.is_async(w.node_id.namespace)
    };
    if !nodes.iter().any(is_async_value) {
        return write(ctx, req).map(Answer::Now);
    }
    if nodes.len() > MAX_NODES_PER_WRITE {
        return Err(StatusCode::BadTooManyOperations);
    }
    let mut results = Vec::with_capacity(nodes.len());
    let mut pending = Vec::new();
    let mut futures: Vec<crate::reply::BoxFuture<Result<(), StatusCode>>> = Vec::new();
    for (i, w) in nodes.iter().enumerate() {
        if !is_async_value(w) {
            results.push(write_one(ctx, w).err().unwrap_or(StatusCode::Good));
            continue;
        }
        match check_write(ctx, w) {
            Err(status) => results.push(status),
            Ok((node, value, range)) => {
                let managers = ctx.managers;
                let id = node.node_id.clone();
                let f = match range {
                    None => managers.write_value_async(&id, value),
                    Some(range) => managers.async_manager(id.namespace).map(|mgr| {
                        // Read the current array, replace the range, store.
                        Box::pin(async move {
                            let current = mgr.read_value(&id).await?;
                            let new = range.write(&current, &value)?;
                            mgr.write_value(&id, new).await
                        })
                            as crate::reply::BoxFuture<Result<(), StatusCode>>
                    }),
                };
                match f {
                    Some(f) => {
                        pending.push(i);
                        futures.push(f);
                        results.push(StatusCode::Good);
                    }
                    None => results.push(StatusCode::BadWouldBlock),
                }
            }
        }
    }
    let header = ctx.response_header(&req.request_header);
    Ok(Answer::Later(Box::pin(async move {
        let done = crate::reply::join_all(futures).await;
        for (i, r) in pending.into_iter().zip(done) {
            if let Some(slot) = results.get_mut(i) {
                *slot = r.err().unwrap_or(StatusCode::Good);
            }
        }
        Ok(uascale_types::WriteResponse {
            response_header: header,
            results: Some(results),
            diagnostic_infos: Some(vec![]),
        })
    })))
}
