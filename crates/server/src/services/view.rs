//! View service set (Part 4 §5.9): Browse, BrowseNext,
//! TranslateBrowsePathsToNodeIds, RegisterNodes, UnregisterNodes.

use uascale_types::{
    BrowseDescription, BrowseDirection, BrowseNextRequest, BrowseNextResponse, BrowsePathResult,
    BrowsePathTarget, BrowseRequest, BrowseResponse, BrowseResult, ByteString, ExpandedNodeId,
    NodeClass, NodeId, ReferenceDescription, RegisterNodesRequest, RegisterNodesResponse,
    StatusCode, TranslateBrowsePathsToNodeIdsRequest, TranslateBrowsePathsToNodeIdsResponse,
    UnregisterNodesRequest, UnregisterNodesResponse,
};

use crate::address_space::AddressSpace;
use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::session::ContinuationPoint;

const HAS_TYPE_DEFINITION: u32 = 40;

/// `BadNothingToDo` for no operation, `BadTooManyOperations` for more than
/// `max` (the call's `[operation_limits]` key).
fn check_count(n: usize, max: usize) -> Result<(), StatusCode> {
    if n == 0 {
        Err(StatusCode::BadNothingToDo)
    } else if n > max {
        Err(StatusCode::BadTooManyOperations)
    } else {
        Ok(())
    }
}

fn references(
    space: &AddressSpace,
    d: &BrowseDescription,
    locales: &super::attribute::Locales<'_>,
) -> Result<Vec<ReferenceDescription>, StatusCode> {
    let node = space.get(&d.node_id).ok_or(StatusCode::BadNodeIdUnknown)?;
    if !(0..=2).contains(&d.browse_direction.0) {
        return Err(StatusCode::BadBrowseDirectionInvalid);
    }
    if !d.reference_type_id.is_null()
        && space.get(&d.reference_type_id).map(|n| n.node_class) != Some(NodeClass::ReferenceType)
    {
        return Err(StatusCode::BadReferenceTypeIdInvalid);
    }
    let mask = d.result_mask;
    let mut out = Vec::new();
    for r in &node.references {
        let dir_ok = match d.browse_direction {
            BrowseDirection::Forward => r.is_forward,
            BrowseDirection::Inverse => !r.is_forward,
            _ => true,
        };
        let type_ok = d.reference_type_id.is_null()
            || r.reference_type == d.reference_type_id
            || (d.include_subtypes && space.is_subtype_of(&r.reference_type, &d.reference_type_id));
        if !dir_ok || !type_ok {
            continue;
        }
        let target = space.get(&r.target);
        let class = target.map_or(NodeClass::Unspecified, |t| t.node_class);
        if d.node_class_mask != 0 && (d.node_class_mask & class.0 as u32) == 0 {
            continue;
        }
        let type_definition = target
            .filter(|t| matches!(t.node_class, NodeClass::Object | NodeClass::Variable))
            .and_then(|t| {
                t.references
                    .iter()
                    .find(|x| x.is_forward && x.reference_type == NodeId::ns0(HAS_TYPE_DEFINITION))
            })
            .map(|x| ExpandedNodeId::local(x.target.clone()))
            .unwrap_or_default();
        out.push(ReferenceDescription {
            reference_type_id: if mask & 1 != 0 {
                r.reference_type.clone()
            } else {
                NodeId::NULL
            },
            is_forward: mask & 2 != 0 && r.is_forward,
            node_id: ExpandedNodeId::local(r.target.clone()),
            browse_name: if mask & 8 != 0 {
                target.map(|t| t.browse_name.clone()).unwrap_or_default()
            } else {
                Default::default()
            },
            display_name: if mask & 16 != 0 {
                // As Read gives it: written, else in the session's locale.
                target
                    .map(|t| {
                        let ls = if t.translations.is_some() {
                            locales.get()
                        } else {
                            &[]
                        };
                        space.localized(t, uascale_types::AttributeId::DisplayName, ls)
                    })
                    .unwrap_or_default()
            } else {
                Default::default()
            },
            node_class: if mask & 4 != 0 {
                class
            } else {
                NodeClass::Unspecified
            },
            type_definition: if mask & 32 != 0 {
                type_definition
            } else {
                Default::default()
            },
        });
    }
    Ok(out)
}

/// Splits `refs` (what is left of `browse` after its `returned` first
/// references) at `max`, parking the rest under a new continuation point
/// of the session. The second value is true when a point was parked.
fn page(
    ctx: &ServiceContext,
    mut refs: Vec<ReferenceDescription>,
    max: usize,
    browse: &BrowseDescription,
    returned: usize,
) -> Result<(BrowseResult, bool), StatusCode> {
    if refs.len() <= max {
        let done = BrowseResult {
            status_code: StatusCode::Good,
            continuation_point: ByteString::null(),
            references: Some(refs),
        };
        return Ok((done, false));
    }
    let rest = refs.split_off(max);
    // Random ids: a client cannot guess another request's continuation point.
    let mut id = [0u8; 16];
    getrandom::getrandom(&mut id).map_err(|_| StatusCode::BadInternalError)?;
    let cp = ByteString::new(id.to_vec());
    ctx.with_session(|s| {
        let most = ctx
            .state
            .config
            .operation_limits
            .max_browse_continuation_points;
        let held = s.continuation_points.as_ref().map_or(0, |c| c.len());
        if held >= usize::from(most) {
            ctx.state
                .subscriptions
                .budget()
                .count(crate::quota::Quota::ContinuationPoints);
            let refused = BrowseResult {
                status_code: StatusCode::BadNoContinuationPoints,
                continuation_point: ByteString::null(),
                references: None,
            };
            return (refused, false);
        }
        s.continuation_points
            .get_or_insert_with(Box::default)
            .push(ContinuationPoint {
                id: cp.clone(),
                browse: browse.clone(),
                max,
                returned: returned.saturating_add(refs.len()),
                rest: Some(rest),
            });
        let first = BrowseResult {
            status_code: StatusCode::Good,
            continuation_point: cp,
            references: Some(refs),
        };
        (first, true)
    })
    .map_err(|e| e.status_code())
}

/// Tells the session table that the request's session changed its
/// continuation points (a cluster mirror copies them).
fn changed(ctx: &ServiceContext) {
    if let Ok(s) = ctx.session() {
        ctx.state.sessions.continuation_points_changed(&s.key);
    }
}

/// Browse.
pub fn browse(ctx: &ServiceContext, req: &BrowseRequest) -> Result<BrowseResponse, ServiceError> {
    let nodes = req.nodes_to_browse.as_deref().unwrap_or(&[]);
    check_count(
        nodes.len(),
        ctx.state.config.operation_limits.max_nodes_per_browse,
    )?;
    if !req.view.view_id.is_null() {
        return Err(StatusCode::BadViewIdUnknown.into());
    }
    let most = ctx.state.config.operation_limits.max_references_per_node;
    let max = match req.requested_max_references_per_node {
        0 => most,
        n => (n as usize).min(most),
    };
    let locales = super::attribute::Locales::new(ctx);
    let mut results = Vec::with_capacity(nodes.len());
    let mut parked = false;
    for d in nodes {
        results.push(match references(&ctx.state.address_space, d, &locales) {
            Ok(refs) => {
                let (result, p) = page(ctx, refs, max, d, 0)?;
                parked |= p;
                result
            }
            Err(status) => BrowseResult {
                status_code: status,
                continuation_point: ByteString::null(),
                references: None,
            },
        });
    }
    if parked {
        changed(ctx);
    }
    Ok(BrowseResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// BrowseNext: the next page of each continuation point, or their release.
/// A point restored from a cluster mirror holds no references: its node is
/// browsed again and the references it had returned are skipped.
pub fn browse_next(
    ctx: &ServiceContext,
    req: &BrowseNextRequest,
) -> Result<BrowseNextResponse, ServiceError> {
    let cps = req.continuation_points.as_deref().unwrap_or(&[]);
    check_count(
        cps.len(),
        ctx.state.config.operation_limits.max_nodes_per_browse,
    )?;
    let mut results = Vec::with_capacity(cps.len());
    let mut touched = false;
    let mut locales = None;
    for cp in cps {
        let taken = ctx
            .with_session(|s| {
                let cps = s.continuation_points.as_mut()?;
                let i = cps.iter().position(|c| c.id == *cp)?;
                let taken = cps.swap_remove(i);
                if cps.is_empty() {
                    // The last one: the session holds no box again.
                    s.continuation_points = None;
                }
                Some(taken)
            })
            .map_err(|e| e.status_code())?;
        touched |= taken.is_some();
        results.push(match taken {
            None => BrowseResult {
                status_code: StatusCode::BadContinuationPointInvalid,
                continuation_point: ByteString::null(),
                references: None,
            },
            Some(_) if req.release_continuation_points => BrowseResult {
                status_code: StatusCode::Good,
                continuation_point: ByteString::null(),
                references: None,
            },
            Some(c) => {
                let rest = match c.rest {
                    Some(rest) => Ok(rest),
                    None => {
                        let locales =
                            locales.get_or_insert_with(|| super::attribute::Locales::new(ctx));
                        references(&ctx.state.address_space, &c.browse, locales)
                            .map(|mut all| all.split_off(c.returned.min(all.len())))
                    }
                };
                match rest {
                    Ok(rest) => page(ctx, rest, c.max, &c.browse, c.returned)?.0,
                    Err(status) => BrowseResult {
                        status_code: status,
                        continuation_point: ByteString::null(),
                        references: None,
                    },
                }
            }
        });
    }
    if touched {
        changed(ctx);
    }
    Ok(BrowseNextResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// TranslateBrowsePathsToNodeIds.
pub fn translate(
    ctx: &ServiceContext,
    req: &TranslateBrowsePathsToNodeIdsRequest,
) -> Result<TranslateBrowsePathsToNodeIdsResponse, ServiceError> {
    let paths = req.browse_paths.as_deref().unwrap_or(&[]);
    check_count(
        paths.len(),
        ctx.state
            .config
            .operation_limits
            .max_nodes_per_translate_browse_paths_to_node_ids,
    )?;
    let space = &ctx.state.address_space;
    let results = paths
        .iter()
        .map(|p| {
            let fail = |status| BrowsePathResult {
                status_code: status,
                targets: Some(vec![]),
            };
            let elements = p.relative_path.elements.as_deref().unwrap_or(&[]);
            if elements.is_empty() {
                return fail(StatusCode::BadNothingToDo);
            }
            if space.get(&p.starting_node).is_none() {
                return fail(StatusCode::BadNodeIdUnknown);
            }
            let mut current = vec![p.starting_node.clone()];
            for e in elements {
                if e.target_name.name.is_null_or_empty() {
                    return fail(StatusCode::BadBrowseNameInvalid);
                }
                let mut next = Vec::new();
                for id in &current {
                    let Some(node) = space.get(id) else { continue };
                    for r in &node.references {
                        let type_ok = e.reference_type_id.is_null()
                            || r.reference_type == e.reference_type_id
                            || (e.include_subtypes
                                && space.is_subtype_of(&r.reference_type, &e.reference_type_id));
                        let name_ok = space
                            .get(&r.target)
                            .is_some_and(|t| t.browse_name == e.target_name);
                        if r.is_forward != e.is_inverse
                            && type_ok
                            && name_ok
                            && !next.contains(&r.target)
                        {
                            next.push(r.target.clone());
                        }
                    }
                }
                if next.is_empty() {
                    return fail(StatusCode::BadNoMatch);
                }
                current = next;
            }
            BrowsePathResult {
                status_code: StatusCode::Good,
                targets: Some(
                    current
                        .into_iter()
                        .map(|id| BrowsePathTarget {
                            target_id: ExpandedNodeId::local(id),
                            remaining_path_index: u32::MAX,
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    Ok(TranslateBrowsePathsToNodeIdsResponse {
        response_header: ctx.response_header(&req.request_header),
        results: Some(results),
        diagnostic_infos: Some(vec![]),
    })
}

/// RegisterNodes: the NodeIds are already the fastest handle this server
/// has, so they are returned as they are (Part 4 allows that).
pub fn register_nodes(
    ctx: &ServiceContext,
    req: &RegisterNodesRequest,
) -> Result<RegisterNodesResponse, ServiceError> {
    let nodes = req.nodes_to_register.as_deref().unwrap_or(&[]);
    check_count(
        nodes.len(),
        ctx.state
            .config
            .operation_limits
            .max_nodes_per_register_nodes,
    )?;
    Ok(RegisterNodesResponse {
        response_header: ctx.response_header(&req.request_header),
        registered_node_ids: Some(nodes.to_vec()),
    })
}

/// UnregisterNodes: nothing is held per registration.
pub fn unregister_nodes(
    ctx: &ServiceContext,
    req: &UnregisterNodesRequest,
) -> Result<UnregisterNodesResponse, ServiceError> {
    check_count(
        req.nodes_to_unregister.as_deref().unwrap_or(&[]).len(),
        ctx.state
            .config
            .operation_limits
            .max_nodes_per_register_nodes,
    )?;
    Ok(UnregisterNodesResponse {
        response_header: ctx.response_header(&req.request_header),
    })
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use uascale_types::{BrowseDirection, RequestHeader};

    use super::*;
    use crate::cluster::node::{record_of, session_of};
    use crate::cluster::record::{SessionRecord, FORMAT_CONTINUATION};
    use crate::session::Session;
    use crate::state::ServerState;

    const TOKEN: [u8; 32] = [5; 32];

    fn token() -> NodeId {
        NodeId::opaque(0, TOKEN.to_vec())
    }

    /// A server of the demo address space whose session mirror keeps the
    /// last record it was given (what a cluster node would write).
    fn node(name: &'static str) -> (Arc<ServerState>, Arc<Mutex<Option<SessionRecord>>>) {
        let mut space = AddressSpace::ns0().unwrap();
        let (demo, _) = crate::demo::build(&mut space, 0);
        let mut managers = crate::node_manager::NodeManagers::default();
        managers.register(crate::demo::NS, Arc::clone(&demo) as _);
        let mut config = crate::ServerConfig::default();
        config.operation_limits.max_browse_continuation_points = 4;
        let state = ServerState::from_parts(
            config,
            space,
            managers,
            crate::security::SecurityState::none_only(),
        );
        let last = Arc::new(Mutex::new(None));
        let l = Arc::clone(&last);
        state.sessions.set_mirror(Arc::new(move |_, token, s| {
            // The mirror's copy holds no references.
            let s = s.expect("no session closes here");
            assert!(s
                .continuation_points
                .iter()
                .flat_map(|c| c.iter())
                .all(|c| c.rest.is_none()));
            *l.lock().unwrap() = Some(record_of(name, token, s));
        }));
        (state, last)
    }

    /// An activated session of token [`TOKEN`] on channel 1, from
    /// `record` (or a sample).
    fn session(record: Option<SessionRecord>, t0: Instant) -> Session {
        let mut r = record.unwrap_or_else(|| crate::cluster::record::tests::sample("a", 5));
        r.security_policy = uascale_crypto::policy::SecurityPolicy::None;
        r.client_thumbprint = None;
        r.token = token();
        let mut s = session_of(&r, t0, 4);
        s.channel_id = 1;
        s
    }

    fn ctx(state: &Arc<ServerState>, t0: Instant) -> ServiceContext {
        let mut ctx = ServiceContext::for_tests(Arc::clone(state), t0);
        ctx.resolve(&token()).expect("the session");
        ctx
    }

    fn header() -> RequestHeader {
        RequestHeader {
            authentication_token: token(),
            ..Default::default()
        }
    }

    fn description(node: u32) -> BrowseDescription {
        BrowseDescription {
            node_id: NodeId::ns0(node),
            browse_direction: BrowseDirection::Both,
            include_subtypes: true,
            result_mask: 0x3f,
            ..Default::default()
        }
    }

    fn browse_all(ctx: &ServiceContext, nodes: &[u32], max: u32) -> Vec<BrowseResult> {
        browse(
            ctx,
            &BrowseRequest {
                request_header: header(),
                requested_max_references_per_node: max,
                nodes_to_browse: Some(nodes.iter().map(|n| description(*n)).collect()),
                ..Default::default()
            },
        )
        .unwrap()
        .results
        .unwrap()
    }

    fn next(ctx: &ServiceContext, cp: &ByteString, release: bool) -> BrowseResult {
        browse_next(
            ctx,
            &BrowseNextRequest {
                request_header: header(),
                release_continuation_points: release,
                continuation_points: Some(vec![cp.clone()]),
            },
        )
        .unwrap()
        .results
        .unwrap()
        .remove(0)
    }

    /// The continuation points of a session reach its record, and on the
    /// node that restores the session from that record BrowseNext answers
    /// exactly the references not yet returned - none twice, none left
    /// out - and release works; a point used up or released leaves the
    /// record.
    #[test]
    fn a_restored_continuation_point_goes_on_where_it_stopped() {
        let t0 = Instant::now();
        let (a, a_last) = node("a");
        a.sessions.insert(token(), session(None, t0)).unwrap();
        let first = browse_all(&ctx(&a, t0), &[2253, 85], 3);
        assert!(first.iter().all(|r| !r.continuation_point.is_null()));
        let seen = first[0].references.clone().unwrap();
        assert_eq!(seen.len(), 3);
        let record = a_last.lock().unwrap().clone().expect("mirrored");
        assert_eq!(record.continuation_points.len(), 2);
        let cp = &record.continuation_points[0];
        assert_eq!(
            (cp.id.as_slice(), cp.max, cp.returned),
            (first[0].continuation_point.as_bytes().unwrap(), 3, 3)
        );
        assert_eq!(cp.browse, description(2253));
        let bytes = record.encode();
        assert_eq!(bytes[4], FORMAT_CONTINUATION);

        // The survivor restores the session from the record's bytes.
        let (b, b_last) = node("b");
        let restored = session(Some(SessionRecord::decode(&bytes).unwrap()), t0);
        assert!(b.sessions.restore(&token(), restored).unwrap());
        let on_b = ctx(&b, t0 + Duration::from_secs(1));
        let mut rest = Vec::new();
        let mut cp = first[0].continuation_point.clone();
        let mut pages = 0;
        while !cp.is_null() {
            let r = next(&on_b, &cp, false);
            assert_eq!(r.status_code, StatusCode::Good);
            let page = r.references.unwrap();
            assert!(page.len() <= 3);
            rest.extend(page);
            cp = r.continuation_point;
            pages += 1;
            assert!(pages < 100, "the browse never ended");
        }
        assert!(pages >= 2, "the Server object has more than two pages");
        let all = browse_all(&on_b, &[2253], 0).remove(0).references.unwrap();
        let mut together = seen.clone();
        together.extend(rest);
        assert_eq!(together, all, "the remaining references, each once");
        // The used-up point left the session and its record; the other is
        // there until released.
        let record = b_last.lock().unwrap().clone().expect("mirrored on b");
        assert_eq!(record.continuation_points.len(), 1);
        let other = &first[1].continuation_point;
        let released = next(&on_b, other, true);
        assert_eq!(
            (released.status_code, released.references),
            (StatusCode::Good, None)
        );
        assert_eq!(
            next(&on_b, other, false).status_code,
            StatusCode::BadContinuationPointInvalid
        );
        let record = b_last.lock().unwrap().clone().unwrap();
        assert!(record.continuation_points.is_empty());
        assert_ne!(record.encode()[4], FORMAT_CONTINUATION);
        assert!(on_b
            .with_session(|s| s.continuation_points.is_none())
            .unwrap());
    }

    /// A restored point whose node this server does not have answers the
    /// Browse's status and is used up; one whose browse had returned more
    /// than the node has now answers the empty rest.
    #[test]
    fn a_restored_point_of_a_changed_address_space_fails_cleanly() {
        use crate::cluster::record::tests::point;
        let t0 = Instant::now();
        let (b, _) = node("b");
        let mut r = crate::cluster::record::tests::sample("a", 5);
        let mut gone = point(1, 85, 3);
        gone.browse.node_id = NodeId::string(2, "not here");
        r.continuation_points = vec![gone, point(2, 85, 10_000)];
        b.sessions.restore(&token(), session(Some(r), t0)).unwrap();
        let on_b = ctx(&b, t0);
        let unknown = next(&on_b, &ByteString::new(vec![1; 16]), false);
        assert_eq!(unknown.status_code, StatusCode::BadNodeIdUnknown);
        let past = next(&on_b, &ByteString::new(vec![2; 16]), false);
        assert_eq!(
            (past.status_code, past.references, past.continuation_point),
            (StatusCode::Good, Some(vec![]), ByteString::null())
        );
        assert!(on_b
            .with_session(|s| s.continuation_points.is_none())
            .unwrap());
    }
}
