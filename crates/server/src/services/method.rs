//! Method service set (Part 4 §5.11): Call, with input-argument count and
//! type checks against the method's InputArguments property.

use uascale_types::{
    Argument, ArrayValues, CallMethodRequest, CallMethodResult, CallRequest, CallResponse,
    NodeClass, NodeId, StatusCode, Variant,
};

use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::reply::Answer;

const HAS_COMPONENT: u32 = 47;
const HAS_PROPERTY: u32 = 46;

/// Call.
pub fn call(ctx: &ServiceContext, req: &CallRequest) -> Result<CallResponse, ServiceError> {
    let methods = req.methods_to_call.as_deref().unwrap_or(&[]);
    if methods.is_empty() {
        return Err(StatusCode::BadNothingToDo.into());
    }
    if methods.len() > ctx.state.config.operation_limits.max_nodes_per_method_call {
        return Err(StatusCode::BadTooManyOperations.into());
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

fn input_arguments(ctx: &ServiceContext, method: &NodeId) -> Vec<Argument> {
    let Some(m) = ctx.state.address_space.get(method) else {
        return vec![];
    };
    m.references
        .iter()
        .filter(|r| r.is_forward && r.reference_type == NodeId::ns0(HAS_PROPERTY))
        .filter_map(|r| ctx.state.address_space.get(&r.target))
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

fn call_one(ctx: &ServiceContext, m: &CallMethodRequest) -> CallMethodResult {
    let checks = match check_call(ctx, m) {
        Ok(c) => c,
        Err(failed) => return failed,
    };
    let given = m.input_arguments.as_deref().unwrap_or(&[]);
    if m.method_id == NodeId::ns0(uascale_types::ids::method::Server_RequestServerStateChange) {
        return finish(checks, request_server_state_change(ctx, given));
    }
    // Methods without a handler (the namespace-0 ones such as
    // GetMonitoredItems arrive with the services they belong to).
    let result = ctx
        .state
        .managers
        .call(&m.object_id, &m.method_id, given)
        .unwrap_or(Err(StatusCode::BadNotImplemented));
    finish(checks, result)
}

/// The checks before a method runs: the object, the method, its
/// arguments. The per-argument results, or the failed method's result.
fn check_call(
    ctx: &ServiceContext,
    m: &CallMethodRequest,
) -> Result<Vec<StatusCode>, CallMethodResult> {
    let reject = |s| Err(fail(s));
    let space = &ctx.state.address_space;
    let Some(object) = space.get(&m.object_id) else {
        return reject(StatusCode::BadNodeIdUnknown);
    };
    if !matches!(object.node_class, NodeClass::Object | NodeClass::ObjectType) {
        return reject(StatusCode::BadNodeIdInvalid);
    }
    let Some(method) = space.get(&m.method_id) else {
        return reject(StatusCode::BadMethodInvalid);
    };
    let is_component = object.references.iter().any(|r| {
        r.is_forward && r.reference_type == NodeId::ns0(HAS_COMPONENT) && r.target == m.method_id
    });
    if method.node_class != NodeClass::Method || !is_component {
        return reject(StatusCode::BadMethodInvalid);
    }
    if !method.executable {
        return reject(StatusCode::BadNotExecutable);
    }
    let expected = input_arguments(ctx, &m.method_id);
    let given = m.input_arguments.as_deref().unwrap_or(&[]);
    if given.len() < expected.len() {
        return reject(StatusCode::BadArgumentsMissing);
    }
    if given.len() > expected.len() {
        return reject(StatusCode::BadTooManyArguments);
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
        return Err(CallMethodResult {
            status_code: StatusCode::BadInvalidArgument,
            input_argument_results: Some(checks),
            input_argument_diagnostic_infos: Some(vec![]),
            output_arguments: Some(vec![]),
        });
    }
    Ok(checks)
}

/// `Server.RequestServerStateChange`: for the users of `[server]
/// admin_users` only ([`crate::shutdown::is_admin`]).
fn request_server_state_change(
    ctx: &ServiceContext,
    given: &[Variant],
) -> Result<Vec<Variant>, StatusCode> {
    let admins = &ctx.state.config.server.admin_users;
    let admin = ctx
        .with_session(|s| crate::shutdown::is_admin(admins, &s.user))
        .unwrap_or(false);
    if !admin {
        return Err(StatusCode::BadUserAccessDenied);
    }
    crate::shutdown::request_state_change(&ctx.state.shutdown, ctx.instant, given)
}

fn finish(checks: Vec<StatusCode>, result: Result<Vec<Variant>, StatusCode>) -> CallMethodResult {
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

/// Call, with the methods of asynchronously served namespaces awaited.
pub fn call_answer(
    ctx: &ServiceContext,
    req: &CallRequest,
) -> Result<Answer<CallResponse>, ServiceError> {
    let methods = req.methods_to_call.as_deref().unwrap_or(&[]);
    let is_async = |m: &CallMethodRequest| ctx.state.managers.is_async(&m.method_id);
    if !methods.iter().any(is_async) {
        return call(ctx, req).map(Answer::Now);
    }
    if methods.len() > ctx.state.config.operation_limits.max_nodes_per_method_call {
        return Err(StatusCode::BadTooManyOperations.into());
    }
    let mut results = Vec::with_capacity(methods.len());
    let mut pending = Vec::new();
    let mut futures = Vec::new();
    for (i, m) in methods.iter().enumerate() {
        if !is_async(m) {
            results.push(call_one(ctx, m));
            continue;
        }
        match check_call(ctx, m) {
            Err(failed) => results.push(failed),
            Ok(checks) => {
                let inputs = m.input_arguments.clone().unwrap_or_default();
                match ctx
                    .state
                    .managers
                    .call_async(&m.object_id, &m.method_id, inputs)
                {
                    Some(f) => {
                        pending.push((i, checks));
                        futures.push(f);
                        results.push(fail(StatusCode::BadWouldBlock));
                    }
                    None => results.push(fail(StatusCode::BadWouldBlock)),
                }
            }
        }
    }
    let header = ctx.response_header(&req.request_header);
    Ok(Answer::Later(Box::pin(async move {
        let outs = crate::reply::join_all(futures).await;
        for ((i, checks), out) in pending.into_iter().zip(outs) {
            if let Some(slot) = results.get_mut(i) {
                *slot = finish(checks, out);
            }
        }
        Ok(CallResponse {
            response_header: header,
            results: Some(results),
            diagnostic_infos: Some(vec![]),
        })
    })))
}
