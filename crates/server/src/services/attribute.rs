//! Attribute service set (Part 4 §5.10): Read.

use uascale_types::{
    AttributeId, DataValue, LocalizedText, NodeClass, NodeId, QualifiedName, ReadRequest,
    ReadResponse, ReadValueId, StatusCode, TimestampsToReturn, UaString, Variant,
};

use crate::address_space::{write_mask_bit, Node, SUPPORTED_WRITE_MASK};
use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::numeric_range::NumericRange;
use crate::reply::Answer;

/// Read: every requested attribute, with the timestamps asked for.
pub fn read(ctx: &ServiceContext, req: &ReadRequest) -> Result<ReadResponse, ServiceError> {
    if req.max_age < 0.0 || req.max_age.is_nan() {
        return Err(StatusCode::BadMaxAgeInvalid.into());
    }
    if !(0..=3).contains(&req.timestamps_to_return.0) {
        return Err(StatusCode::BadTimestampsToReturnInvalid.into());
    }
    let nodes = req.nodes_to_read.as_deref().unwrap_or(&[]);
    if nodes.is_empty() {
        return Err(StatusCode::BadNothingToDo.into());
    }
    if nodes.len() > ctx.state.config.operation_limits.max_nodes_per_read {
        return Err(StatusCode::BadTooManyOperations.into());
    }
    let locales = Locales::new(ctx);
    let results = nodes
        .iter()
        .map(|r| read_one(ctx, r, req.timestamps_to_return, &locales))
        .collect();
    Ok(ReadResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// Read without intermediate vectors: each ReadValueId is decoded and its
/// DataValue encoded straight into the response message, which comes out
/// byte for byte as [`read`]'s would. `None` hands the request to the
/// general path, which then answers it (the same way, or with the fault):
/// a message that is not a ReadRequest of the plain shape, a failing
/// request-level or session check, a value of an asynchronous node
/// manager, trailing bytes.
pub fn read_fast(ctx: &mut ServiceContext, message: &[u8]) -> Option<Vec<u8>> {
    use uascale_types::encoding::write_length;
    use uascale_types::{
        BinaryDecode, BinaryEncode, Limit, Reader, RequestHeader, ResponseHeader, Structure,
    };
    // A borrow of the state field alone: the session field is set below.
    let state: &crate::state::ServerState = &ctx.state;
    let mut r = Reader::new(message, &state.channel_config.decode).ok()?;
    if NodeId::decode(&mut r).ok()? != NodeId::ns0(ReadRequest::BINARY_ENCODING_ID) {
        return None;
    }
    let header = RequestHeader::decode(&mut r).ok()?;
    let max_age = f64::decode(&mut r).ok()?;
    let ts = TimestampsToReturn::decode(&mut r).ok()?;
    if max_age < 0.0 || max_age.is_nan() || !(0..=3).contains(&ts.0) {
        return None;
    }
    let n = r.read_length(Limit::ArrayLength).ok()??;
    if n == 0 || n > state.config.operation_limits.max_nodes_per_read {
        return None;
    }
    // The session, resolved as the dispatcher would (the general path
    // answers the error when there is none).
    let session = state
        .sessions
        .resolve(&header.authentication_token, ctx.channel_id, ctx.instant)
        .ok()?;
    ctx.session = Some(session);
    let ctx = &*ctx;
    let mut out = Vec::with_capacity(64 + n * 24);
    NodeId::ns0(ReadResponse::BINARY_ENCODING_ID).encode(&mut out);
    let response_header: ResponseHeader = ctx.response_header(&header);
    response_header.encode(&mut out);
    write_length(&mut out, Some(n));
    let locales = Locales::new(ctx);
    for _ in 0..n {
        let rv = ReadValueId::decode(&mut r).ok()?;
        if rv.attribute_id == AttributeId::Value as u32 && ctx.state.managers.is_async(&rv.node_id)
        {
            return None;
        }
        read_one(ctx, &rv, ts, &locales).encode(&mut out);
    }
    // Empty diagnosticInfos, as `read` answers.
    write_length(&mut out, Some(0));
    r.finish().ok()?;
    Some(out)
}

/// The session's localeIds (from ActivateSession), fetched the first time
/// a node with translations is read - most Reads never need them.
pub struct Locales<'c> {
    ctx: &'c ServiceContext,
    ids: std::cell::OnceCell<Box<[UaString]>>,
}

impl<'c> Locales<'c> {
    /// The locales of the request's session (none without one, e.g. for
    /// sampling).
    pub fn new(ctx: &'c ServiceContext) -> Self {
        Locales {
            ctx,
            ids: std::cell::OnceCell::new(),
        }
    }

    /// The session's locales, most preferred first (none without a session).
    pub fn get(&self) -> &[UaString] {
        self.ids.get_or_init(|| {
            self.ctx
                .with_session(|s| s.locale_ids.clone())
                .unwrap_or_default()
        })
    }
}

/// One ReadValueId read, with the timestamps asked for (also what a
/// monitored item samples).
pub(crate) fn read_one(
    ctx: &ServiceContext,
    r: &ReadValueId,
    ts: TimestampsToReturn,
    locales: &Locales<'_>,
) -> DataValue {
    let mut dv = match read_attribute(ctx, r, locales) {
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

fn text(t: &LocalizedText) -> Variant {
    Variant::from(t.clone())
}

fn read_attribute(
    ctx: &ServiceContext,
    r: &ReadValueId,
    locales: &Locales<'_>,
) -> Result<Variant, StatusCode> {
    let node = ctx
        .state
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
    if let Some(bit) = write_mask_bit(attr) {
        if node.write_mask & bit != 0 {
            if let Some(v) = ctx.state.address_space.written(&node.node_id, attr) {
                return Ok(v);
            }
        }
    }
    let localized = |attr| {
        let locales = if node.translations.is_some() {
            locales.get()
        } else {
            &[]
        };
        Variant::from(ctx.state.address_space.localized(node, attr, locales))
    };
    Ok(match attr {
        AttributeId::NodeId => Variant::from(node.node_id.clone()),
        AttributeId::NodeClass => Variant::Int32(class.0),
        AttributeId::BrowseName => Variant::from(node.browse_name.clone()),
        AttributeId::DisplayName => localized(AttributeId::DisplayName),
        AttributeId::Description => localized(AttributeId::Description),
        // What this server lets a client write of what the node allows;
        // without roles, every user may write the same.
        AttributeId::WriteMask | AttributeId::UserWriteMask => {
            Variant::UInt32(node.write_mask & SUPPORTED_WRITE_MASK)
        }
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
        AttributeId::DataTypeDefinition
            if class == NodeClass::DataType && !node.data_type_definition.is_empty() =>
        {
            node.data_type_definition.clone()
        }
        // This server has no role configuration: no RoleSet, identities are
        // not mapped to Roles, and access is governed by AccessLevel,
        // WriteMask and Executable alone. RolePermissions,
        // UserRolePermissions and AccessRestrictions are optional
        // attributes (Part 3 §5.2.9-5.2.11) a server without role support
        // does not provide, so they answer BadAttributeIdInvalid on every
        // node (as does DataTypeDefinition on a DataType without one, such
        // as the built-in and abstract types).
        _ => return Err(StatusCode::BadAttributeIdInvalid),
    })
}

fn value(ctx: &ServiceContext, node: &Node, r: &ReadValueId) -> Result<Variant, StatusCode> {
    check_value_read(node, r)?;
    crate::server_object::check_diagnostics(ctx, &node.node_id)?;
    let v = match crate::server_object::live_value(ctx, &node.node_id) {
        Some(v) => v,
        None => match ctx.state.managers.read_value(&node.node_id) {
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
pub fn read_value(ctx: &ServiceContext, node: &NodeId) -> DataValue {
    read_one(
        ctx,
        &ReadValueId {
            node_id: node.clone(),
            attribute_id: AttributeId::Value as u32,
            index_range: UaString::null(),
            data_encoding: QualifiedName::default(),
        },
        TimestampsToReturn::Neither,
        &Locales::new(ctx),
    )
}

/// Write: Values of variables that allow it, with type and index-range
/// checks; other attributes are not writable on any node of this server.
pub fn write(
    ctx: &ServiceContext,
    req: &uascale_types::WriteRequest,
) -> Result<uascale_types::WriteResponse, ServiceError> {
    let nodes = req.nodes_to_write.as_deref().unwrap_or(&[]);
    if nodes.is_empty() {
        return Err(StatusCode::BadNothingToDo.into());
    }
    if nodes.len() > ctx.state.config.operation_limits.max_nodes_per_write {
        return Err(StatusCode::BadTooManyOperations.into());
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

fn write_one(ctx: &ServiceContext, w: &uascale_types::WriteValue) -> Result<(), StatusCode> {
    let Some((node, value, range)) = check_write(ctx, w)? else {
        return Ok(());
    };
    let new = match range {
        None => value,
        Some(range) => {
            let current = match ctx.state.managers.read_value(&node.node_id) {
                Some(r) => r?,
                None => node.value.clone(),
            };
            range.write(&current, &value)?
        }
    };
    ctx.state.managers.write_value(&node.node_id, new)
}

/// A Value write that passed its checks: the node, the value and the index
/// range to write it at.
type CheckedWrite<'a> = (&'a Node, Variant, Option<NumericRange>);

/// The checks of a Write before the value is stored: the node, the
/// attribute, the access level, the type. An attribute other than Value is
/// written here (`None`); a Value is returned to be stored.
fn check_write<'a>(
    ctx: &'a ServiceContext,
    w: &uascale_types::WriteValue,
) -> Result<Option<CheckedWrite<'a>>, StatusCode> {
    let node = ctx
        .state
        .address_space
        .get(&w.node_id)
        .ok_or(StatusCode::BadNodeIdUnknown)?;
    let attr = AttributeId::from_u32(w.attribute_id).ok_or(StatusCode::BadAttributeIdInvalid)?;
    let dv = &w.value;
    // Writing a status or timestamps is not supported; an explicit Good
    // status (which several clients always send) is the same as none.
    if dv.status.is_some_and(|s| s != StatusCode::Good)
        || dv.source_timestamp.is_some()
        || dv.server_timestamp.is_some()
    {
        return Err(StatusCode::BadWriteNotSupported);
    }
    if attr != AttributeId::Value {
        write_attribute(ctx, node, attr, w)?;
        return Ok(None);
    }
    if node.node_class != NodeClass::Variable {
        return Err(StatusCode::BadAttributeIdInvalid);
    }
    if node.access_level & 2 == 0 {
        return Err(StatusCode::BadNotWritable);
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
    Ok(Some((node, value, range)))
}

/// Writes an attribute other than Value: allowed when the node's WriteMask
/// has its bit (and the server supports writing it, see
/// [`SUPPORTED_WRITE_MASK`]); the value must be of the attribute's type.
fn write_attribute(
    ctx: &ServiceContext,
    node: &Node,
    attr: AttributeId,
    w: &uascale_types::WriteValue,
) -> Result<(), StatusCode> {
    let applies = match attr {
        AttributeId::InverseName => node.node_class == NodeClass::ReferenceType,
        AttributeId::MinimumSamplingInterval => node.node_class == NodeClass::Variable,
        _ => true,
    };
    if !applies {
        return Err(StatusCode::BadAttributeIdInvalid);
    }
    match write_mask_bit(attr) {
        Some(bit) if node.write_mask & bit != 0 => {}
        _ => return Err(StatusCode::BadNotWritable),
    }
    if !w.index_range.is_null_or_empty() {
        return Err(StatusCode::BadIndexRangeNoData);
    }
    let v = w.value.value.clone().unwrap_or_default();
    match (attr, &v) {
        (AttributeId::MinimumSamplingInterval, Variant::Double(ms)) => {
            // -1 is "indeterminate", 0 "as fast as possible".
            if !(ms.is_finite() && *ms >= -1.0) {
                return Err(StatusCode::BadOutOfRange);
            }
        }
        (AttributeId::MinimumSamplingInterval, _) => return Err(StatusCode::BadTypeMismatch),
        (_, Variant::LocalizedText(_)) => {}
        _ => return Err(StatusCode::BadTypeMismatch),
    }
    ctx.state.address_space.set_written(&node.node_id, attr, v);
    Ok(())
}

/// True when `eo`'s encoding belongs to DataType `dt` or one of its
/// subtypes (the encoding node's inverse HasEncoding names its type) and
/// its body is a valid encoding of that type; a null ExtensionObject fits
/// any. (XML bodies are refused: this server speaks binary.)
fn structure_fits(
    space: &crate::address_space::AddressSpace,
    eo: &uascale_types::ExtensionObject,
    dt: &NodeId,
) -> bool {
    if eo.is_null() {
        return true;
    }
    let encoding = eo.type_id();
    let Some(ty) = space.get(&encoding).and_then(|e| {
        e.references
            .iter()
            .find(|r| !r.is_forward && r.reference_type == NodeId::ns0(38))
    }) else {
        return false;
    };
    if !space.is_subtype_of(&ty.target, dt) {
        return false;
    }
    match eo {
        // A body of a type the codec does not know (a companion structure)
        // is checked against the type's definition.
        uascale_types::ExtensionObject::Opaque { body, .. } => {
            crate::nodeset::structure_body_is_valid(
                space,
                &ty.target,
                body.as_bytes().unwrap_or(&[]),
                &uascale_types::DecodeLimits::default(),
            )
        }
        uascale_types::ExtensionObject::Xml { .. } => false,
        _ => true,
    }
}

/// The value must be of the variable's DataType (or a subtype's built-in
/// type) and match its ValueRank (scalar vs array).
fn check_type(
    ctx: &ServiceContext,
    node: &Node,
    v: &Variant,
    whole: bool,
) -> Result<(), StatusCode> {
    let Some(t) = v.type_id() else {
        return Err(StatusCode::BadTypeMismatch);
    };
    if let Some(base) = ctx.state.address_space.builtin_base(&node.data_type) {
        // BaseDataType (24) takes anything.
        if base != 24 && base != u32::from(t.id()) {
            return Err(StatusCode::BadTypeMismatch);
        }
        // A structure must be of the variable's DataType or a subtype.
        if base == 22 && node.data_type != NodeId::ns0(22) {
            let fits = |eo: &uascale_types::ExtensionObject| {
                structure_fits(&ctx.state.address_space, eo, &node.data_type)
            };
            let ok = match v {
                Variant::ExtensionObject(eo) => fits(eo),
                Variant::Array(a) => match a.values() {
                    uascale_types::ArrayValues::ExtensionObject(all) => all.iter().all(fits),
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                return Err(StatusCode::BadTypeMismatch);
            }
        }
    }
    // A partial write carries the selected part; its shape is checked
    // against the range.
    if !whole {
        return Ok(());
    }
    let dims = match v {
        Variant::Array(a) => a.dimensions().map_or(1, |d| d.len().max(1)),
        _ => 0,
    };
    let fits = match node.value_rank {
        -3 => dims <= 1, // ScalarOrOneDimension
        -2 => true,      // Any
        -1 => dims == 0, // Scalar
        0 => dims >= 1,  // OneOrMoreDimensions
        n => usize::try_from(n).is_ok_and(|n| n == dims),
    };
    if !fits {
        return Err(StatusCode::BadTypeMismatch);
    }
    Ok(())
}

/// HistoryRead: no node of this server keeps history yet, so every node
/// answers `BadHistoryOperationUnsupported` (unknown ones
/// `BadNodeIdUnknown`), after the request itself is checked.
pub fn history_read(
    ctx: &ServiceContext,
    req: &uascale_types::HistoryReadRequest,
) -> Result<uascale_types::HistoryReadResponse, ServiceError> {
    use uascale_types as t;
    let nodes = req.nodes_to_read.as_deref().unwrap_or(&[]);
    if nodes.is_empty() {
        return Err(StatusCode::BadNothingToDo.into());
    }
    if nodes.len() > ctx.state.config.operation_limits.max_nodes_per_read {
        return Err(StatusCode::BadTooManyOperations.into());
    }
    if !(0..=3).contains(&req.timestamps_to_return.0) {
        return Err(StatusCode::BadTimestampsToReturnInvalid.into());
    }
    let d = &req.history_read_details;
    let known = d.downcast_ref::<t::ReadRawModifiedDetails>().is_some()
        || d.downcast_ref::<t::ReadEventDetails>().is_some()
        || d.downcast_ref::<t::ReadProcessedDetails>().is_some()
        || d.downcast_ref::<t::ReadAtTimeDetails>().is_some()
        || d.downcast_ref::<t::ReadAnnotationDataDetails>().is_some();
    if !known {
        return Err(StatusCode::BadHistoryOperationInvalid.into());
    }
    let results = nodes
        .iter()
        .map(|n| t::HistoryReadResult {
            status_code: if ctx.state.address_space.get(&n.node_id).is_some() {
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
    ctx: &ServiceContext,
    req: &ReadRequest,
) -> Result<Answer<ReadResponse>, ServiceError> {
    let nodes = req.nodes_to_read.as_deref().unwrap_or(&[]);
    let is_async_value = |r: &ReadValueId| {
        r.attribute_id == AttributeId::Value as u32 && ctx.state.managers.is_async(&r.node_id)
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
        Err(e) if e.status_code() == StatusCode::BadNothingToDo => {}
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    if nodes.len() > ctx.state.config.operation_limits.max_nodes_per_read {
        return Err(StatusCode::BadTooManyOperations.into());
    }
    let ts = req.timestamps_to_return;
    let locales = Locales::new(ctx);
    let mut results = Vec::with_capacity(nodes.len());
    let mut pending = Vec::new();
    let mut futures = Vec::new();
    for (i, r) in nodes.iter().enumerate() {
        if !is_async_value(r) {
            results.push(read_one(ctx, r, ts, &locales));
            continue;
        }
        let started = ctx
            .state
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
                ctx.state
                    .managers
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
    ctx: &ServiceContext,
    req: &uascale_types::WriteRequest,
) -> Result<Answer<uascale_types::WriteResponse>, ServiceError> {
    let nodes = req.nodes_to_write.as_deref().unwrap_or(&[]);
    let is_async_value = |w: &uascale_types::WriteValue| {
        w.attribute_id == AttributeId::Value as u32 && ctx.state.managers.is_async(&w.node_id)
    };
    if !nodes.iter().any(is_async_value) {
        return write(ctx, req).map(Answer::Now);
    }
    if nodes.len() > ctx.state.config.operation_limits.max_nodes_per_write {
        return Err(StatusCode::BadTooManyOperations.into());
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
            Ok(None) => results.push(StatusCode::Good),
            Ok(Some((node, value, range))) => {
                let managers = &ctx.state.managers;
                let id = node.node_id.clone();
                let f = match range {
                    None => managers.write_value_async(&id, value),
                    Some(range) => managers.async_manager(&id).map(|mgr| {
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

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::address_space::AddressSpace;
    use crate::node_manager::NodeManagers;
    use crate::ServerConfig;
    use std::sync::Arc;
    use uascale_types::{WriteRequest, WriteValue};

    struct World {
        state: Arc<crate::state::ServerState>,
    }

    /// Namespace 0 and the demo namespace, as `uascale serve` has them.
    fn world() -> World {
        let mut space = AddressSpace::ns0().unwrap();
        let (demo, _) = crate::demo::build(&mut space, 0);
        let mut managers = NodeManagers::default();
        managers.register(crate::demo::NS, Arc::clone(&demo) as _);
        World {
            state: crate::state::ServerState::from_parts(
                ServerConfig::default(),
                space,
                managers,
                crate::security::SecurityState::none_only(),
            ),
        }
    }

    impl World {
        fn ctx(&self) -> ServiceContext {
            ServiceContext::for_tests(Arc::clone(&self.state), std::time::Instant::now())
        }

        fn read(&self, node: &NodeId, attr: AttributeId, range: &str) -> DataValue {
            let r = read(
                &self.ctx(),
                &ReadRequest {
                    nodes_to_read: Some(vec![ReadValueId {
                        node_id: node.clone(),
                        attribute_id: attr as u32,
                        index_range: if range.is_empty() {
                            UaString::null()
                        } else {
                            UaString::from(range)
                        },
                        data_encoding: QualifiedName::default(),
                    }]),
                    ..Default::default()
                },
            )
            .unwrap();
            r.results.unwrap().remove(0)
        }

        fn write(&self, node: &NodeId, attr: AttributeId, range: &str, v: Variant) -> StatusCode {
            let r = write(
                &self.ctx(),
                &WriteRequest {
                    nodes_to_write: Some(vec![WriteValue {
                        node_id: node.clone(),
                        attribute_id: attr as u32,
                        index_range: if range.is_empty() {
                            UaString::null()
                        } else {
                            UaString::from(range)
                        },
                        value: DataValue {
                            value: Some(v),
                            ..Default::default()
                        },
                    }]),
                    ..Default::default()
                },
            )
            .unwrap();
            r.results.unwrap()[0]
        }
    }

    fn matrix(v: Vec<i32>, d: Vec<u32>) -> Variant {
        Variant::from(
            uascale_types::Array::with_dimensions(uascale_types::ArrayValues::Int32(v), d).unwrap(),
        )
    }

    #[test]
    fn matrix_index_ranges_through_read_and_write() {
        let w = world();
        let m = NodeId::string(crate::demo::NS, "Demo.Static.Matrix");
        let dv = w.read(&m, AttributeId::Value, "1:2,0:1");
        assert_eq!(dv.value, Some(matrix(vec![4, 5, 8, 9], vec![2, 2])));
        assert_eq!(
            w.read(&m, AttributeId::Value, "3,0").status,
            Some(StatusCode::BadIndexRangeNoData)
        );
        assert_eq!(
            w.read(&m, AttributeId::Value, "1").status,
            Some(StatusCode::BadIndexRangeInvalid)
        );
        assert_eq!(
            w.read(&m, AttributeId::Value, "1:x").status,
            Some(StatusCode::BadIndexRangeInvalid)
        );
        assert_eq!(
            w.write(
                &m,
                AttributeId::Value,
                "0:1,2:3",
                matrix(vec![-1, -2, -3, -4], vec![2, 2])
            ),
            StatusCode::Good
        );
        assert_eq!(
            w.read(&m, AttributeId::Value, "0:1,2:3").value,
            Some(matrix(vec![-1, -2, -3, -4], vec![2, 2]))
        );
        assert_eq!(
            w.write(
                &m,
                AttributeId::Value,
                "0:1,2:3",
                Variant::from(vec![1i32, 2])
            ),
            StatusCode::BadIndexRangeDataMismatch
        );
        // A whole write must keep two dimensions.
        assert_eq!(
            w.write(&m, AttributeId::Value, "", Variant::from(vec![1i32, 2])),
            StatusCode::BadTypeMismatch
        );
        assert_eq!(
            w.write(&m, AttributeId::Value, "", matrix(vec![1, 2], vec![1, 2])),
            StatusCode::Good
        );
    }

    #[test]
    fn data_type_definitions_of_namespace_zero() {
        use uascale_types::{EnumDefinition, StructureDefinition, StructureType};
        let w = world();
        // Argument (i=296): five fields, Default Binary i=298, base Structure.
        let dv = w.read(&NodeId::ns0(296), AttributeId::DataTypeDefinition, "");
        let Some(Variant::ExtensionObject(eo)) = dv.value else {
            panic!("{dv:?}")
        };
        let d = eo.downcast_ref::<StructureDefinition>().unwrap();
        assert_eq!(d.default_encoding_id, NodeId::ns0(298));
        assert_eq!(d.base_data_type, NodeId::ns0(22));
        assert_eq!(d.structure_type, StructureType::Structure);
        let f = d.fields.as_deref().unwrap();
        assert_eq!(f.len(), 5);
        assert_eq!(f[3].name, "ArrayDimensions");
        assert_eq!(
            (f[3].data_type.clone(), f[3].value_rank),
            (NodeId::ns0(7), 1)
        );
        // NodeClass (i=257) is an enumeration: Object = 1 ... View = 128.
        let dv = w.read(&NodeId::ns0(257), AttributeId::DataTypeDefinition, "");
        let Some(Variant::ExtensionObject(eo)) = dv.value else {
            panic!("{dv:?}")
        };
        let e = eo.downcast_ref::<EnumDefinition>().unwrap();
        let f = e.fields.as_deref().unwrap();
        assert!(f.iter().any(|f| f.name == "View" && f.value == 128));
        // Built-in types have none; neither does a non-DataType node.
        for (id, attr) in [
            (NodeId::ns0(6), AttributeId::DataTypeDefinition),
            (NodeId::ns0(85), AttributeId::DataTypeDefinition),
            (NodeId::ns0(85), AttributeId::RolePermissions),
            (NodeId::ns0(85), AttributeId::UserRolePermissions),
            (NodeId::ns0(85), AttributeId::AccessRestrictions),
        ] {
            assert_eq!(
                w.read(&id, attr, "").status,
                Some(StatusCode::BadAttributeIdInvalid),
                "{id} {attr:?}"
            );
        }
    }

    #[test]
    fn locale_selection_by_session() {
        use crate::session::Session;
        let w = world();
        let t = NodeId::string(crate::demo::NS, "Demo.Static.Temperature");
        let token = NodeId::opaque(0, vec![9; 32]);
        let now = std::time::Instant::now();
        let session = |locales: &[&str]| Session {
            session_id: NodeId::ns0(1),
            channel_id: 1,
            timeout: std::time::Duration::from_secs(30),
            deadline: now + std::time::Duration::from_secs(30),
            activated: true,
            name: UaString::null(),
            locale_ids: locales.iter().map(|l| UaString::from(*l)).collect(),
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
        };
        let read_as = |locales: &[&str], attr: AttributeId| {
            w.state.sessions.close(&token, true);
            w.state
                .sessions
                .insert(token.clone(), session(locales))
                .unwrap();
            // Through the dispatcher (the fast Read path), which resolves
            // the session from the token itself.
            let mut msg = Vec::new();
            uascale_types::encode_message(
                &ReadRequest {
                    request_header: uascale_types::RequestHeader {
                        authentication_token: token.clone(),
                        ..Default::default()
                    },
                    nodes_to_read: Some(vec![ReadValueId {
                        node_id: t.clone(),
                        attribute_id: attr as u32,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                &mut msg,
            );
            let out = crate::dispatch::dispatch(&mut w.ctx(), &msg)
                .now()
                .expect("answered at once");
            let limits = uascale_types::DecodeLimits::default();
            let m = uascale_types::decode_message(
                &mut uascale_types::Reader::new(&out, &limits).unwrap(),
            )
            .unwrap();
            let r = m.as_any().downcast_ref::<ReadResponse>().unwrap().clone();
            r.results.unwrap().remove(0).value
        };
        let lt = |l: &str, s: &str| Some(Variant::from(LocalizedText::new(l, s)));
        assert_eq!(
            read_as(&["de-DE"], AttributeId::DisplayName),
            lt("de", "Temperatur")
        );
        assert_eq!(
            read_as(&["ja", "fr"], AttributeId::DisplayName),
            lt("fr", "Température")
        );
        assert_eq!(
            read_as(&["de"], AttributeId::Description),
            lt("de", "Temperatur des Demo-Tanks")
        );
        // No match, or no locales: the default.
        assert_eq!(
            read_as(&["ja"], AttributeId::DisplayName),
            lt("en", "Temperature")
        );
        assert_eq!(
            read_as(&[], AttributeId::DisplayName),
            lt("en", "Temperature")
        );
    }

    #[test]
    fn write_display_name_and_description_per_write_mask() {
        let w = world();
        let t = NodeId::string(crate::demo::NS, "Demo.Static.Temperature");
        let lt = |l: &str, s: &str| Variant::from(LocalizedText::new(l, s));
        assert_eq!(
            w.read(&t, AttributeId::WriteMask, "").value,
            Some(Variant::UInt32(0x60))
        );
        assert_eq!(
            w.write(
                &t,
                AttributeId::DisplayName,
                "",
                lt("en", "Tank temperature")
            ),
            StatusCode::Good
        );
        assert_eq!(
            w.read(&t, AttributeId::DisplayName, "").value,
            Some(lt("en", "Tank temperature"))
        );
        assert_eq!(
            w.write(&t, AttributeId::Description, "", lt("en", "d")),
            StatusCode::Good
        );
        assert_eq!(
            w.write(&t, AttributeId::DisplayName, "", Variant::from("plain")),
            StatusCode::BadTypeMismatch
        );
        // Not in the WriteMask, or not writable at all.
        assert_eq!(
            w.write(
                &t,
                AttributeId::MinimumSamplingInterval,
                "",
                Variant::Double(5.0)
            ),
            StatusCode::BadNotWritable
        );
        assert_eq!(
            w.write(
                &t,
                AttributeId::BrowseName,
                "",
                Variant::from(QualifiedName::new(2, "x"))
            ),
            StatusCode::BadNotWritable
        );
        let server = NodeId::ns0(2253);
        assert_eq!(
            w.write(&server, AttributeId::DisplayName, "", lt("en", "x")),
            StatusCode::BadNotWritable
        );
        assert_eq!(
            w.read(&server, AttributeId::DisplayName, "").value,
            Some(Variant::from(LocalizedText::text("Server")))
        );
        // Browse shows the new name.
        let b = crate::services::view::browse(
            &w.ctx(),
            &uascale_types::BrowseRequest {
                nodes_to_browse: Some(vec![uascale_types::BrowseDescription {
                    node_id: NodeId::string(crate::demo::NS, "Demo.Static"),
                    browse_direction: uascale_types::BrowseDirection::Forward,
                    result_mask: 63,
                    ..Default::default()
                }]),
                ..Default::default()
            },
        );
        let refs = b.unwrap().results.unwrap().remove(0).references.unwrap();
        assert!(refs
            .iter()
            .any(|r| r.display_name == LocalizedText::new("en", "Tank temperature")));
    }

    #[test]
    fn string_scalar_index_ranges() {
        let w = world();
        let s = NodeId::string(crate::demo::NS, "Demo.Static.Scalar.String");
        assert_eq!(
            w.read(&s, AttributeId::Value, "2:4").value,
            Some(Variant::from("sca"))
        );
        assert_eq!(
            w.write(&s, AttributeId::Value, "0:1", Variant::from("UA")),
            StatusCode::Good
        );
        assert_eq!(
            w.read(&s, AttributeId::Value, "").value,
            Some(Variant::from("UAscale"))
        );
        let b = NodeId::string(crate::demo::NS, "Demo.Static.Scalar.ByteString");
        assert_eq!(
            w.read(&b, AttributeId::Value, "1").value,
            Some(Variant::ByteString(uascale_types::ByteString::new(vec![2])))
        );
    }
}
