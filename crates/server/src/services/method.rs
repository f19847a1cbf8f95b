//! Method service set (Part 4 §5.11): Call, with input-argument count and
//! type checks against the method's InputArguments property.

use uascale_types::{
    Argument, ArrayValues, CallMethodRequest, CallMethodResult, CallRequest, CallResponse,
    NodeClass, NodeId, StatusCode, Variant,
};

use super::ServiceContext;

/// Most methods per Call (OperationLimits.MaxNodesPerMethodCall).
pub const MAX_METHODS_PER_CALL: usize = 1_000;

const HAS_COMPONENT: u32 = 47;
const HAS_PROPERTY: u32 = 46;

/// Call.
pub fn call(ctx: &ServiceContext<'_>, req: &CallRequest) -> Result<CallResponse, StatusCode> {
    let methods = req.methods_to_call.as_deref().unwrap_or(&[]);
    if methods.is_empty() {
        return Err(StatusCode::BadNothingToDo);
    }
    if methods.len() > MAX_METHODS_PER_CALL {
        return Err(StatusCode::BadTooManyOperations);
    }
    Ok(CallResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(methods.iter().map(|m| call_one(ctx, m)).collect()),
        diagnostic_infos: Some(vec![]),
    })
}

fn fail(status: StatusCode) -> CallMethodResult {
    CallMethodResult {
        status_code: status,
        input_argument_results: Some(vec![]),
        input_argument_diagnostic_infos: Some(vec![]),
        output_arguments: Some(vec![]),
    }
}

fn input_arguments(ctx: &ServiceContext<'_>, method: &NodeId) -> Vec<Argument> {
    let Some(m) = ctx.address_space.get(method) else {
        return vec![];
    };
    m.references
        .iter()
        .filter(|r| r.is_forward && r.reference_type == NodeId::ns0(HAS_PROPERTY))
        .filter_map(|r| ctx.address_space.get(&r.target))
        .find(|p| p.browse_name.namespace_index == 0 && p.browse_name.name == "InputArguments")
        .and_then(|p| match &p.value {
            Variant::Array(a) => match a.values() {
                ArrayValues::ExtensionObject(items) => Some(
                    items
                        .iter()
                        .filter_map(|e| e.downcast_ref::<Argument>().cloned())
                        .collect(),
                ),
                _ => None,
            },
            _ => None,
        })
        .unwrap_or_default()
}

fn call_one(ctx: &ServiceContext<'_>, m: &CallMethodRequest) -> CallMethodResult {
    let space = ctx.address_space;
    let Some(object) = space.get(&m.object_id) else {
        return fail(StatusCode::BadNodeIdUnknown);
    };
    if !matches!(object.node_class, NodeClass::Object | NodeClass::ObjectType) {
        return fail(StatusCode::BadNodeIdInvalid);
    }
    let Some(method) = space.get(&m.method_id) else {
        return fail(StatusCode::BadMethodInvalid);
    };
    let is_component = object.references.iter().any(|r| {
        r.is_forward && r.reference_type == NodeId::ns0(HAS_COMPONENT) && r.target == m.method_id
    });
    if method.node_class != NodeClass::Method || !is_component {
        return fail(StatusCode::BadMethodInvalid);
    }
    if !method.executable {
        return fail(StatusCode::BadNotExecutable);
    }
    let expected = input_arguments(ctx, &m.method_id);
    let given = m.input_arguments.as_deref().unwrap_or(&[]);
    if given.len() < expected.len() {
        return fail(StatusCode::BadArgumentsMissing);
    }
    if given.len() > expected.len() {
        return fail(StatusCode::BadTooManyArguments);
    }
    let checks: Vec<StatusCode> = expected
        .iter()
        .zip(given)
        .map(|(a, v)| {
            let base = space.builtin_base(&a.data_type);
            let type_ok = match (base, v.type_id()) {
                (Some(24), Some(_)) => true,
                (Some(b), Some(t)) => b == u32::from(t.id()),
                (None, Some(_)) => true,
                (_, None) => false,
            };
            let rank_ok = a.value_rank != -1 || !v.is_array();
            if type_ok && rank_ok {
                StatusCode::Good
            } else {
                StatusCode::BadTypeMismatch
            }
        })
        .collect();
    if checks.iter().any(|s| s.is_bad()) {
        return CallMethodResult {
            status_code: StatusCode::BadInvalidArgument,
            input_argument_results: Some(checks),
            input_argument_diagnostic_infos: Some(vec![]),
            output_arguments: Some(vec![]),
        };
    }
    // Methods without a handler (the namespace-0 ones such as
    // GetMonitoredItems arrive with the services they belong to).
    let result = ctx
        .managers
        .call(&m.object_id, &m.method_id, given)
        .unwrap_or(Err(StatusCode::BadNotImplemented));
    match result {
        Ok(out) => CallMethodResult {
            status_code: StatusCode::Good,
            input_argument_results: Some(checks),
            input_argument_diagnostic_infos: Some(vec![]),
            output_arguments: Some(out),
        },
        Err(status) => fail(status),
    }
}
