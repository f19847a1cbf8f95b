//! The live values of the Server object (Part 5 §6.3.1): NamespaceArray,
//! ServerArray, ServerStatus and its children, ServiceLevel, Auditing, and
//! the operation limits this server enforces.

use uascale_types::{
    ids::variable as v, BuildInfo, ExtensionObject, NodeId, ServerState, ServerStatusDataType,
    UaString, Variant,
};

use crate::context::ServiceContext;

/// The product's build information (ProductUri from the configuration).
pub fn build_info(ctx: &ServiceContext) -> BuildInfo {
    BuildInfo {
        product_uri: UaString::from(ctx.state.config.server.product_uri.as_str()),
        manufacturer_name: UaString::from("uascale developers"),
        product_name: UaString::from("uascale"),
        software_version: UaString::from(env!("CARGO_PKG_VERSION")),
        build_number: UaString::from(env!("CARGO_PKG_VERSION")),
        build_date: ctx.state.start_time,
    }
}

/// The value of a Server-object variable that the server computes, or
/// `None` for nodes whose value is the address space's.
pub fn live_value(ctx: &ServiceContext, id: &NodeId) -> Option<Variant> {
    let n = id.as_ns0()?;
    // A planned shutdown (crate::shutdown) as the client should see it.
    let planned = || ctx.state.presented_shutdown();
    let state = |p: Option<&crate::shutdown::Planned>| match p {
        Some(_) => ServerState::Shutdown,
        None => ServerState::Running,
    };
    let seconds_till =
        |p: Option<&crate::shutdown::Planned>| p.map_or(0, |p| p.seconds_till(ctx.instant));
    let status = || {
        let p = planned();
        ServerStatusDataType {
            start_time: ctx.state.start_time,
            current_time: ctx.now,
            state: state(p.as_ref()),
            build_info: build_info(ctx),
            seconds_till_shutdown: seconds_till(p.as_ref()),
            shutdown_reason: crate::shutdown::reason_text(p.as_ref()),
        }
    };
    Some(match n {
        v::Server_NamespaceArray => Variant::from(
            ctx.state
                .managers
                .namespace_array(&ctx.state.config.server.application_uri),
        ),
        v::Server_ServerArray => Variant::from(vec![UaString::from(
            ctx.state.config.server.application_uri.as_str(),
        )]),
        v::Server_ServerStatus => Variant::from(ExtensionObject::new(status())),
        v::Server_ServerStatus_StartTime => Variant::DateTime(ctx.state.start_time),
        v::Server_ServerStatus_CurrentTime => Variant::DateTime(ctx.now),
        v::Server_ServerStatus_State => Variant::Int32(state(planned().as_ref()).0),
        v::Server_ServerStatus_BuildInfo => Variant::from(ExtensionObject::new(build_info(ctx))),
        v::Server_ServerStatus_BuildInfo_ProductUri => Variant::String(build_info(ctx).product_uri),
        v::Server_ServerStatus_BuildInfo_ManufacturerName => {
            Variant::String(build_info(ctx).manufacturer_name)
        }
        v::Server_ServerStatus_BuildInfo_ProductName => {
            Variant::String(build_info(ctx).product_name)
        }
        v::Server_ServerStatus_BuildInfo_SoftwareVersion => {
            Variant::String(build_info(ctx).software_version)
        }
        v::Server_ServerStatus_BuildInfo_BuildNumber => {
            Variant::String(build_info(ctx).build_number)
        }
        v::Server_ServerStatus_BuildInfo_BuildDate => Variant::DateTime(build_info(ctx).build_date),
        v::Server_ServerStatus_SecondsTillShutdown => {
            Variant::UInt32(seconds_till(planned().as_ref()))
        }
        v::Server_ServerStatus_ShutdownReason => {
            Variant::from(crate::shutdown::reason_text(planned().as_ref()))
        }
        // Part 5: when the server expects to serve again (null unknown).
        v::Server_EstimatedReturnTime => Variant::DateTime(
            planned()
                .and_then(|p| p.estimated_return)
                .unwrap_or(uascale_types::DateTime::MIN),
        ),
        // Part 4 Table 103: load inside 200-255, 2-199 degraded, 0 while
        // shutting down (docs/scalability.md §2).
        v::Server_ServiceLevel => Variant::Byte(ctx.state.service_level()),
        v::Server_Auditing => Variant::Boolean(ctx.state.auditing()),
        // A cluster node behind a front end: the client sees one server and
        // the nodes move its session (docs/cluster.md): Transparent, on a
        // TransparentRedundancyType ([`crate::address_space::make_transparent`]). A single
        // server: None, as Part 5 requires of a plain ServerRedundancyType.
        v::Server_ServerRedundancy_RedundancySupport => {
            Variant::Int32(if ctx.state.transparent_redundancy() {
                uascale_types::RedundancySupport::Transparent.0
            } else {
                uascale_types::RedundancySupport::None.0
            })
        }
        // The node serving this session (Part 5 §6.3.9: per session; it
        // changes when the session moves).
        v::Server_ServerRedundancy_CurrentServerId if ctx.state.transparent_redundancy() => {
            Variant::String(UaString::from(own_node_id(ctx).as_str()))
        }
        v::Server_ServerRedundancy_RedundantServerArray if ctx.state.transparent_redundancy() => {
            redundant_server_array(ctx)
        }
        // The configured `[operation_limits]`.
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerRead => {
            Variant::UInt32(u32_of(ctx.state.config.operation_limits.max_nodes_per_read))
        }
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerWrite => Variant::UInt32(u32_of(
            ctx.state.config.operation_limits.max_nodes_per_write,
        )),
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerMethodCall => Variant::UInt32(
            u32_of(ctx.state.config.operation_limits.max_nodes_per_method_call),
        ),
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerBrowse => Variant::UInt32(u32_of(
            ctx.state.config.operation_limits.max_nodes_per_browse,
        )),
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerRegisterNodes => {
            Variant::UInt32(u32_of(
                ctx.state
                    .config
                    .operation_limits
                    .max_nodes_per_register_nodes,
            ))
        }
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerTranslateBrowsePathsToNodeIds => {
            Variant::UInt32(u32_of(
                ctx.state
                    .config
                    .operation_limits
                    .max_nodes_per_translate_browse_paths_to_node_ids,
            ))
        }
        v::Server_ServerCapabilities_MaxBrowseContinuationPoints => Variant::UInt16(
            ctx.state
                .config
                .operation_limits
                .max_browse_continuation_points,
        ),
        // Subscription limits (docs/scalability.md §4); 0 = no limit.
        v::Server_ServerCapabilities_MaxSubscriptions => Variant::UInt32(u32_of(
            ctx.state.subscriptions.limits.max_subscription_count,
        )),
        // `[quotas]`: per session, the one Part 5 has a node for.
        v::Server_ServerCapabilities_MaxSubscriptionsPerSession => Variant::UInt32(u32_of(
            ctx.state.config.quotas.max_subscriptions_per_session,
        )),
        v::Server_ServerCapabilities_MaxMonitoredItems => Variant::UInt32(u32_of(
            ctx.state.subscriptions.limits.max_monitored_item_count,
        )),
        v::Server_ServerCapabilities_MaxMonitoredItemsPerSubscription => Variant::UInt32(u32_of(
            ctx.state
                .subscriptions
                .limits
                .max_monitored_items_per_subscription,
        )),
        v::Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall => Variant::UInt32(
            u32_of(ctx.state.subscriptions.limits.max_monitored_items_per_call),
        ),
        v::Server_ServerCapabilities_MaxMonitoredItemsQueueSize => {
            Variant::UInt32(ctx.state.subscriptions.limits.max_queue_size)
        }
        v::Server_ServerCapabilities_MaxSelectClauseParameters => {
            Variant::UInt32(crate::subscription::event::MAX_SELECT_CLAUSES as u32)
        }
        v::Server_ServerCapabilities_MaxWhereClauseParameters => {
            Variant::UInt32(crate::subscription::event::MAX_FILTER_ELEMENTS as u32)
        }
        v::Server_ServerDiagnostics_EnabledFlag => {
            Variant::Boolean(ctx.state.diagnostics_enabled())
        }
        v::Server_ServerDiagnostics_SubscriptionDiagnosticsArray => ctx
            .state
            .subscriptions
            .subscription_diagnostics(ctx.instant),
        v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionDiagnosticsArray => {
            ctx.state.sessions.diagnostics(
                ctx.now,
                ctx.instant,
                &ctx.state.config.server.application_uri,
                ctx.state.config.limits.max_message_size,
                |id| ctx.state.subscriptions.session_counts(id),
            )
        }
        v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionSecurityDiagnosticsArray => {
            ctx.state.sessions.security_diagnostics(ctx.instant)
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary => {
            Variant::from(ExtensionObject::new(diagnostics_summary(ctx)))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount => {
            Variant::UInt32(u32_of(ctx.state.sessions.len()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSessionCount => {
            Variant::UInt32(u32_of(ctx.state.sessions.cumulated_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionTimeoutCount => {
            Variant::UInt32(u32_of(ctx.state.sessions.expired_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedSessionCount => {
            Variant::UInt32(u32_of(ctx.state.sessions.rejected_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedSessionCount => {
            Variant::UInt32(u32_of(ctx.state.sessions.security_rejected_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSubscriptionCount => {
            Variant::UInt32(u32_of(ctx.state.subscriptions.subscription_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSubscriptionCount => {
            Variant::UInt32(u32_of(
                ctx.state.subscriptions.cumulated_subscription_count(),
            ))
        }
        // No views (Part 5: server-created views).
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_ServerViewCount => Variant::UInt32(0),
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionAbortCount => {
            Variant::UInt32(u32_of64(ctx.state.metrics.sessions.snapshot().aborted))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_PublishingIntervalCount => {
            Variant::UInt32(u32_of(
                ctx.state
                    .subscriptions
                    .publishing_interval_count(ctx.instant),
            ))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedRequestsCount => {
            Variant::UInt32(u32_of64(ctx.state.metrics.requests.security_rejected()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedRequestsCount => {
            Variant::UInt32(u32_of64(ctx.state.metrics.requests.rejected()))
        }
        v::Server_ServerCapabilities_MinSupportedSampleRate => Variant::Double(
            ctx.state
                .subscriptions
                .limits
                .min_sampling_interval
                .as_secs_f64()
                * 1000.0,
        ),
        _ => return None,
    })
}

/// This node's id in the cluster (the configured or derived `node_id`).
fn own_node_id(ctx: &ServiceContext) -> String {
    match ctx.state.cluster() {
        Some(c) => c.node_id().to_owned(),
        None => ctx
            .state
            .config
            .cluster
            .node_id_or(ctx.state.config.server.port),
    }
}

/// `RedundantServerArray`: every live node of the cluster with its
/// ServiceLevel and ServerState as its heartbeat tells them (this node's
/// own as it is now), sorted by id.
fn redundant_server_array(ctx: &ServiceContext) -> Variant {
    let members = match ctx.state.cluster() {
        Some(c) => c.members(),
        None => vec![crate::cluster::node::Member {
            id: own_node_id(ctx),
            service_level: ctx.state.own_service_level(),
            state: ctx.state.own_server_state(),
        }],
    };
    let rows = members
        .into_iter()
        .map(|m| {
            ExtensionObject::new(uascale_types::RedundantServerDataType {
                server_id: UaString::from(m.id.as_str()),
                service_level: m.service_level,
                server_state: m.state,
            })
        })
        .collect();
    Variant::from(uascale_types::Array::new(
        uascale_types::ArrayValues::ExtensionObject(rows),
    ))
}

/// The ServerDiagnosticsSummary structure, every field live (each the
/// value its own variable reads):
/// - sessions: current, cumulated, rejected and security-rejected
///   (CreateSession and ActivateSession), timed out (with the orphans
///   closed at the activation deadline);
/// - aborts: sessions the server closed for an error - none today (a
///   session whose channel is gone waits for a reconnect and times out);
/// - subscriptions: current, cumulated, and the distinct publishing
///   intervals in use;
/// - requests answered with a Bad service result (any service, including
///   session establishment and Publish), and the part of them rejected for
///   a security reason ([`crate::metrics::is_security_rejection`]);
/// - views: 0, there are none.
fn diagnostics_summary(ctx: &ServiceContext) -> uascale_types::ServerDiagnosticsSummaryDataType {
    uascale_types::ServerDiagnosticsSummaryDataType {
        server_view_count: 0,
        current_session_count: u32_of(ctx.state.sessions.len()),
        cumulated_session_count: u32_of(ctx.state.sessions.cumulated_count()),
        security_rejected_session_count: u32_of(ctx.state.sessions.security_rejected_count()),
        rejected_session_count: u32_of(ctx.state.sessions.rejected_count()),
        session_timeout_count: u32_of(ctx.state.sessions.expired_count()),
        session_abort_count: u32_of64(ctx.state.metrics.sessions.snapshot().aborted),
        current_subscription_count: u32_of(ctx.state.subscriptions.subscription_count()),
        cumulated_subscription_count: u32_of(
            ctx.state.subscriptions.cumulated_subscription_count(),
        ),
        publishing_interval_count: u32_of(
            ctx.state
                .subscriptions
                .publishing_interval_count(ctx.instant),
        ),
        security_rejected_requests_count: u32_of64(ctx.state.metrics.requests.security_rejected()),
        rejected_requests_count: u32_of64(ctx.state.metrics.requests.rejected()),
    }
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A counter as UInt32, held at `u32::MAX` once it passes it.
fn u32_of64(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// With `diagnostics_enabled = false` the diagnostics arrays are not kept:
/// reading them is `BadOutOfService` (docs/scalability.md §5).
pub fn check_diagnostics(
    ctx: &ServiceContext,
    id: &NodeId,
) -> Result<(), uascale_types::StatusCode> {
    let array = matches!(
        id.as_ns0(),
        Some(
            v::Server_ServerDiagnostics_SubscriptionDiagnosticsArray
                | v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionDiagnosticsArray
                | v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionSecurityDiagnosticsArray
        )
    );
    if array && !ctx.state.diagnostics_enabled() {
        return Err(uascale_types::StatusCode::BadOutOfService);
    }
    Ok(())
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use uascale_types as t;
    use uascale_types::{ids::variable as v, NodeId, StatusCode, Variant};

    use crate::address_space::AddressSpace;
    use crate::config::OperationLimits;
    use crate::context::ServiceContext;
    use crate::error::ServiceError;
    use crate::node_manager::NodeManagers;
    use crate::services::{attribute, method, view};
    use crate::session::Session;
    use crate::state::ServerState;
    use crate::ServerConfig;

    struct World {
        state: Arc<ServerState>,
        t0: Instant,
    }

    const TOKEN: [u8; 32] = [7; 32];

    /// The demo server with small, distinct operation limits and one
    /// activated session (token [`TOKEN`], channel 1).
    fn world() -> World {
        world_with_admins(vec![])
    }

    /// [`world`] with `[server] admin_users` = `admins`.
    fn world_with_admins(admins: Vec<String>) -> World {
        world_with(|c| c.server.admin_users = admins)
    }

    /// [`world`] with `change` made to its configuration (after it was
    /// validated).
    fn world_with(change: impl FnOnce(&mut ServerConfig)) -> World {
        let mut space = AddressSpace::ns0().unwrap();
        let (demo, _) = crate::demo::build(&mut space, 0);
        let mut managers = NodeManagers::default();
        managers.register(crate::demo::NS, Arc::clone(&demo) as _);
        let config = ServerConfig {
            operation_limits: OperationLimits {
                max_nodes_per_read: 8,
                max_nodes_per_write: 2,
                max_nodes_per_method_call: 3,
                max_nodes_per_browse: 4,
                max_nodes_per_register_nodes: 5,
                max_nodes_per_translate_browse_paths_to_node_ids: 6,
                max_references_per_node: 2,
                max_browse_continuation_points: 1,
            },
            ..Default::default()
        };
        config.validate().unwrap();
        let mut config = config;
        change(&mut config);
        let state = ServerState::from_parts(
            config,
            space,
            managers,
            crate::security::SecurityState::none_only(),
        );
        let t0 = Instant::now();
        state
            .sessions
            .insert(
                NodeId::opaque(0, TOKEN.to_vec()),
                Session {
                    session_id: NodeId::numeric(1, 1),
                    channel_id: 1,
                    timeout: Duration::from_secs(3600),
                    deadline: t0 + Duration::from_secs(3600),
                    activated: true,
                    name: t::UaString::from("t"),
                    locale_ids: Box::default(),
                    continuation_points: None,
                    server_nonce: [0; 32],
                    client_thumbprint: None,
                    client_uri: t::UaString::null(),
                    user: crate::identity::UserIdentity::Anonymous,
                    created: t::DateTime::MIN,
                    endpoint_url: t::UaString::null(),
                    security_policy: uascale_crypto::policy::SecurityPolicy::None,
                    security_mode: t::MessageSecurityMode::None,
                    ecc: None,
                },
            )
            .unwrap();
        World { state, t0 }
    }

    impl World {
        fn ctx(&self) -> ServiceContext {
            let mut ctx = ServiceContext::for_tests(Arc::clone(&self.state), self.t0);
            ctx.resolve(&NodeId::opaque(0, TOKEN.to_vec()))
                .expect("the world's session");
            ctx
        }
    }

    fn header() -> t::RequestHeader {
        t::RequestHeader {
            authentication_token: NodeId::opaque(0, TOKEN.to_vec()),
            ..Default::default()
        }
    }

    fn read_request(ids: &[u32]) -> t::ReadRequest {
        t::ReadRequest {
            request_header: header(),
            nodes_to_read: Some(
                ids.iter()
                    .map(|id| t::ReadValueId {
                        node_id: NodeId::ns0(*id),
                        attribute_id: t::AttributeId::Value as u32,
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// `n` operations, and `n + 1`: the limit is reached, then exceeded.
    fn at_and_over<T>(limit: usize, call: impl Fn(usize) -> Result<T, ServiceError>) {
        if let Err(e) = call(limit) {
            panic!("{limit} operations are allowed, not {e}");
        }
        assert_eq!(
            call(limit + 1).err().map(|e| e.status_code()),
            Some(StatusCode::BadTooManyOperations),
            "{} operations are too many",
            limit + 1
        );
    }

    #[test]
    fn server_capabilities_read_the_configured_limits() {
        let w = world();
        let ids = [
            v::Server_ServerCapabilities_OperationLimits_MaxNodesPerRead,
            v::Server_ServerCapabilities_OperationLimits_MaxNodesPerWrite,
            v::Server_ServerCapabilities_OperationLimits_MaxNodesPerMethodCall,
            v::Server_ServerCapabilities_OperationLimits_MaxNodesPerBrowse,
            v::Server_ServerCapabilities_OperationLimits_MaxNodesPerRegisterNodes,
            v::Server_ServerCapabilities_OperationLimits_MaxNodesPerTranslateBrowsePathsToNodeIds,
            v::Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall,
            v::Server_ServerCapabilities_MaxBrowseContinuationPoints,
        ];
        assert_eq!(
            ids,
            [11705, 11707, 11709, 11710, 11711, 11712, 11714, 2735],
            "the namespace-0 ids"
        );
        let r = attribute::read(&w.ctx(), &read_request(&ids)).unwrap();
        let values: Vec<_> = r
            .results
            .unwrap()
            .into_iter()
            .map(|dv| dv.value.unwrap())
            .collect();
        let per_call = w.state.subscriptions.limits.max_monitored_items_per_call;
        assert_eq!(
            values,
            [
                Variant::UInt32(8),
                Variant::UInt32(2),
                Variant::UInt32(3),
                Variant::UInt32(4),
                Variant::UInt32(5),
                Variant::UInt32(6),
                Variant::UInt32(per_call as u32),
                Variant::UInt16(1),
            ]
        );
    }

    #[test]
    fn calls_over_a_configured_limit_are_too_many_operations() {
        let w = world();
        let ctx = w.ctx();
        let many = |n: usize| vec![v::Server_ServerStatus_State; n];
        at_and_over(8, |n| attribute::read(&ctx, &read_request(&many(n))));
        // The fast path leaves a Read over the limit to the general one.
        let fast = |n: usize| {
            let mut msg = Vec::new();
            t::encode_message(&read_request(&many(n)), &mut msg);
            attribute::read_fast(&mut ctx.clone(), &msg).ok_or(
                attribute::read(&ctx, &read_request(&many(n)))
                    .err()
                    .unwrap_or(ServiceError::from(StatusCode::Good)),
            )
        };
        at_and_over(8, fast);
        at_and_over(8, |n| {
            attribute::history_read(
                &ctx,
                &t::HistoryReadRequest {
                    request_header: header(),
                    history_read_details: t::ExtensionObject::new(
                        t::ReadRawModifiedDetails::default(),
                    ),
                    nodes_to_read: Some(vec![Default::default(); n]),
                    ..Default::default()
                },
            )
        });
        at_and_over(2, |n| {
            attribute::write(
                &ctx,
                &t::WriteRequest {
                    request_header: header(),
                    nodes_to_write: Some(vec![Default::default(); n]),
                },
            )
        });
        at_and_over(3, |n| {
            method::call(
                &ctx,
                &t::CallRequest {
                    request_header: header(),
                    methods_to_call: Some(vec![Default::default(); n]),
                },
            )
        });
        at_and_over(4, |n| {
            view::browse(
                &ctx,
                &t::BrowseRequest {
                    request_header: header(),
                    nodes_to_browse: Some(vec![Default::default(); n]),
                    ..Default::default()
                },
            )
        });
        at_and_over(4, |n| {
            view::browse_next(
                &ctx,
                &t::BrowseNextRequest {
                    request_header: header(),
                    continuation_points: Some(vec![t::ByteString::new(vec![1]); n]),
                    ..Default::default()
                },
            )
        });
        at_and_over(5, |n| {
            view::register_nodes(
                &ctx,
                &t::RegisterNodesRequest {
                    request_header: header(),
                    nodes_to_register: Some(vec![NodeId::ns0(85); n]),
                },
            )
        });
        at_and_over(5, |n| {
            view::unregister_nodes(
                &ctx,
                &t::UnregisterNodesRequest {
                    request_header: header(),
                    nodes_to_unregister: Some(vec![NodeId::ns0(85); n]),
                },
            )
        });
        at_and_over(6, |n| {
            view::translate(
                &ctx,
                &t::TranslateBrowsePathsToNodeIdsRequest {
                    request_header: header(),
                    browse_paths: Some(vec![Default::default(); n]),
                },
            )
        });
    }

    /// ServerViewCount, SessionAbortCount, PublishingIntervalCount,
    /// SecurityRejectedRequestsCount and RejectedRequestsCount read as
    /// UInt32s that follow what they count, and so does the structure.
    #[test]
    fn diagnostics_summary_counters_are_live() {
        use v::{
            Server_ServerDiagnostics_ServerDiagnosticsSummary_PublishingIntervalCount as INTERVALS,
            Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedRequestsCount as REJECTED,
            Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedRequestsCount as SECURITY,
            Server_ServerDiagnostics_ServerDiagnosticsSummary_ServerViewCount as VIEWS,
            Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionAbortCount as ABORTS,
        };
        let w = world();
        let ids = [VIEWS, ABORTS, INTERVALS, SECURITY, REJECTED];
        assert_eq!(ids, [2276, 2282, 2284, 2287, 2288], "the namespace-0 ids");
        // Read at `secs` after the start (the interval count is cached for
        // a second).
        let read = |secs: u64| -> Vec<Variant> {
            let mut ctx = w.ctx();
            ctx.instant = w.t0 + Duration::from_secs(secs);
            attribute::read(&ctx, &read_request(&ids))
                .unwrap()
                .results
                .unwrap()
                .into_iter()
                .map(|dv| dv.value.unwrap())
                .collect()
        };
        let u = |n: [u32; 5]| n.map(Variant::UInt32).to_vec();
        assert_eq!(read(0), u([0, 0, 0, 0, 0]));

        // Requests answered Bad, through the dispatcher: a Read without a
        // session, and an ActivateSession with an invalid identity token (a
        // security rejection).
        let mut ctx = w.ctx();
        let mut call = |req: &dyn t::DynStructure| {
            let mut msg = Vec::new();
            t::encode_message(req, &mut msg);
            crate::dispatch::dispatch(&mut ctx, &msg);
        };
        call(&t::ReadRequest {
            nodes_to_read: Some(vec![t::ReadValueId {
                node_id: NodeId::ns0(VIEWS),
                attribute_id: t::AttributeId::Value as u32,
                ..Default::default()
            }]),
            ..Default::default()
        });
        call(&t::ActivateSessionRequest {
            request_header: header(),
            user_identity_token: t::ExtensionObject::new(t::AnonymousIdentityToken {
                policy_id: "not a policy".into(),
            }),
            ..Default::default()
        });
        // A Read that succeeds is not counted.
        call(&read_request(&[VIEWS]));
        // Subscriptions at two distinct intervals.
        let session = NodeId::numeric(1, 1);
        for ms in [100.0, 500.0, 100.0] {
            w.state
                .subscriptions
                .create(
                    w.t0,
                    &session,
                    &crate::subscription::Requested {
                        publishing_interval: ms,
                        lifetime_count: 300,
                        max_keep_alive_count: 10,
                        max_notifications_per_publish: 0,
                        priority: 0,
                    },
                    true,
                )
                .unwrap();
        }
        w.state.metrics.session_aborted();
        assert_eq!(read(0), u([0, 1, 0, 1, 2]), "intervals still cached");
        assert_eq!(read(2), u([0, 1, 2, 1, 2]));

        let mut ctx = w.ctx();
        ctx.instant = w.t0 + Duration::from_secs(2);
        let Some(Variant::ExtensionObject(summary)) = super::live_value(
            &ctx,
            &NodeId::ns0(v::Server_ServerDiagnostics_ServerDiagnosticsSummary),
        ) else {
            panic!("the summary is a structure");
        };
        let summary = summary
            .downcast_ref::<t::ServerDiagnosticsSummaryDataType>()
            .expect("ServerDiagnosticsSummaryDataType")
            .clone();
        assert_eq!(
            (
                summary.server_view_count,
                summary.session_abort_count,
                summary.publishing_interval_count,
                summary.security_rejected_requests_count,
                summary.rejected_requests_count,
                summary.current_subscription_count,
                summary.current_session_count,
            ),
            (0, 1, 2, 1, 2, 3, 1)
        );
    }

    #[test]
    fn browse_pages_and_continuation_points_follow_the_configuration() {
        let w = world();
        let ctx = w.ctx();
        let browse = || {
            view::browse(
                &ctx,
                &t::BrowseRequest {
                    request_header: header(),
                    nodes_to_browse: Some(vec![t::BrowseDescription {
                        node_id: NodeId::ns0(85),
                        browse_direction: t::BrowseDirection::Both,
                        result_mask: 0x3f,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            )
            .unwrap()
            .results
            .unwrap()
            .remove(0)
        };
        // Objects has more references than max_references_per_node (2).
        let first = browse();
        assert_eq!(first.status_code, StatusCode::Good);
        assert_eq!(first.references.unwrap().len(), 2);
        assert!(!first.continuation_point.is_null());
        // max_browse_continuation_points (1) is held.
        assert_eq!(browse().status_code, StatusCode::BadNoContinuationPoints);
        let held = |ctx: &ServiceContext| {
            ctx.with_session(|s| s.continuation_points.as_ref().map_or(0, |c| c.len()))
                .unwrap()
        };
        assert_eq!(held(&ctx), 1);
        // Released: the session holds no continuation points, and no box.
        let next = view::browse_next(
            &ctx,
            &t::BrowseNextRequest {
                request_header: header(),
                release_continuation_points: true,
                continuation_points: Some(vec![first.continuation_point.clone()]),
            },
        )
        .unwrap();
        assert_eq!(next.results.unwrap()[0].status_code, StatusCode::Good);
        assert!(ctx
            .with_session(|s| s.continuation_points.is_none())
            .unwrap());
        assert_eq!(browse().status_code, StatusCode::Good);
    }

    fn read_values(ctx: &ServiceContext, ids: &[u32]) -> Vec<Variant> {
        attribute::read(ctx, &read_request(ids))
            .unwrap()
            .results
            .unwrap()
            .into_iter()
            .map(|dv| dv.value.unwrap_or(Variant::Empty))
            .collect()
    }

    fn state_change(ctx: &ServiceContext, state: t::ServerState, secs: u32) -> StatusCode {
        let r = method::call(
            ctx,
            &t::CallRequest {
                request_header: header(),
                methods_to_call: Some(vec![t::CallMethodRequest {
                    object_id: NodeId::ns0(t::ids::object::Server),
                    method_id: NodeId::ns0(t::ids::method::Server_RequestServerStateChange),
                    input_arguments: Some(vec![
                        Variant::Int32(state.0),
                        Variant::DateTime(t::DateTime::from_ticks(1_000_000_000)),
                        Variant::UInt32(secs),
                        Variant::from(t::LocalizedText::new("en", "upgrade to 2.0")),
                        Variant::Boolean(false),
                    ]),
                }]),
            },
        )
        .unwrap();
        r.results.unwrap()[0].status_code
    }

    /// RequestServerStateChange by an administrator plans the shutdown:
    /// ServerStatus reads Shutdown, SecondsTillShutdown counts down,
    /// ShutdownReason and EstimatedReturnTime say why and until when,
    /// ServiceLevel is 0 and the server is not ready; Running cancels it.
    /// Anyone else is denied.
    #[test]
    fn request_server_state_change_shows_the_shutdown_in_server_status() {
        use v::{
            Server_EstimatedReturnTime as RETURN, Server_ServerStatus_SecondsTillShutdown as SECS,
            Server_ServerStatus_ShutdownReason as REASON, Server_ServerStatus_State as STATE,
            Server_ServiceLevel as LEVEL,
        };
        let ids = [STATE, SECS, REASON, LEVEL, RETURN];
        let w = world_with_admins(vec!["ops".into()]);
        w.state.set_listening(true);
        let ctx = w.ctx();
        let running = vec![
            Variant::Int32(0),
            Variant::UInt32(0),
            Variant::from(t::LocalizedText::default()),
            Variant::Byte(255),
            Variant::DateTime(t::DateTime::MIN),
        ];
        assert_eq!(read_values(&ctx, &ids), running);
        // Anonymous is no administrator.
        assert_eq!(
            state_change(&ctx, t::ServerState::Shutdown, 10),
            StatusCode::BadUserAccessDenied
        );
        assert!(!w.state.shutdown.is_planned());
        ctx.with_session(|s| s.user = crate::identity::UserIdentity::UserName("guest".into()))
            .unwrap();
        assert_eq!(
            state_change(&ctx, t::ServerState::Shutdown, 10),
            StatusCode::BadUserAccessDenied
        );
        ctx.with_session(|s| s.user = crate::identity::UserIdentity::UserName("ops".into()))
            .unwrap();
        assert!(w.state.readiness().is_ok());
        assert_eq!(
            state_change(&ctx, t::ServerState::Shutdown, 10),
            StatusCode::Good
        );
        let at = |ms: u64| {
            let mut c = w.ctx();
            c.instant = ctx.instant + Duration::from_millis(ms);
            read_values(&c, &ids)
        };
        let shutting = |secs: u32| {
            vec![
                Variant::Int32(t::ServerState::Shutdown.0),
                Variant::UInt32(secs),
                Variant::from(t::LocalizedText::new("en", "upgrade to 2.0")),
                Variant::Byte(0),
                Variant::DateTime(t::DateTime::from_ticks(1_000_000_000)),
            ]
        };
        assert_eq!(at(0), shutting(10));
        assert_eq!(at(1_500), shutting(9));
        assert_eq!(at(9_999), shutting(1));
        assert_eq!(at(10_000), shutting(0));
        assert_eq!(w.state.readiness(), Err("shutting down"));
        // The ServerStatus structure says the same.
        let Some(Variant::ExtensionObject(status)) =
            super::live_value(&ctx, &NodeId::ns0(v::Server_ServerStatus))
        else {
            panic!("ServerStatus is a structure");
        };
        let status = status
            .downcast_ref::<t::ServerStatusDataType>()
            .expect("ServerStatusDataType")
            .clone();
        assert_eq!(status.state, t::ServerState::Shutdown);
        assert_eq!(status.seconds_till_shutdown, 10);
        assert_eq!(status.shutdown_reason.text.as_str(), Some("upgrade to 2.0"));
        // Not supported: a restart, or another state.
        assert_eq!(
            state_change(&ctx, t::ServerState::Suspended, 1),
            StatusCode::BadNotSupported
        );
        // Running cancels.
        assert_eq!(
            state_change(&ctx, t::ServerState::Running, 0),
            StatusCode::Good
        );
        assert_eq!(read_values(&ctx, &ids), running);
        assert!(w.state.readiness().is_ok());
    }

    /// While a shutdown is planned a new session is refused at its first
    /// activation (where its user is known).
    #[test]
    fn no_new_session_while_shutting_down() {
        let w = world();
        let ctx = w.ctx();
        let created = crate::services::session::create_session(
            &ctx,
            &t::CreateSessionRequest {
                requested_session_timeout: 60_000.0,
                ..Default::default()
            },
        )
        .unwrap();
        w.state
            .shutdown
            .plan(ctx.instant, Duration::from_secs(5), "test", None);
        let r = crate::services::session::activate_session(
            &ctx,
            &t::ActivateSessionRequest {
                request_header: t::RequestHeader {
                    authentication_token: created.authentication_token,
                    ..Default::default()
                },
                user_identity_token: t::ExtensionObject::new(t::AnonymousIdentityToken {
                    policy_id: "anonymous".into(),
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            r.err().map(|e| e.status_code()),
            Some(StatusCode::BadServerHalted)
        );
        // The session already open goes on.
        assert!(attribute::read(&ctx, &read_request(&[v::Server_ServerStatus_State])).is_ok());
    }

    /// The Server object's HasTypeDefinition target of ServerRedundancy.
    fn redundancy_type(w: &World) -> Option<NodeId> {
        w.state
            .address_space
            .get(&NodeId::ns0(t::ids::object::Server_ServerRedundancy))?
            .references
            .iter()
            .find(|r| r.is_forward && r.reference_type == NodeId::ns0(40))
            .map(|r| r.target.clone())
    }

    /// The browse names of the properties of Server.ServerRedundancy.
    fn redundancy_properties(w: &World) -> Vec<String> {
        let space = &w.state.address_space;
        space
            .get(&NodeId::ns0(t::ids::object::Server_ServerRedundancy))
            .unwrap()
            .references
            .iter()
            .filter(|r| r.is_forward && r.reference_type == NodeId::ns0(46))
            .filter_map(|r| space.get(&r.target))
            .map(|n| n.browse_name.name.as_str_or_empty().to_owned())
            .collect()
    }

    /// A single server: a plain ServerRedundancyType reading None, without
    /// the transparent properties.
    #[test]
    fn a_single_server_has_plain_redundancy_none() {
        let w = world();
        assert_eq!(redundancy_type(&w), Some(NodeId::ns0(2034)));
        assert_eq!(redundancy_properties(&w), ["RedundancySupport"]);
        let ctx = w.ctx();
        assert_eq!(
            read_values(&ctx, &[v::Server_ServerRedundancy_RedundancySupport]),
            [Variant::Int32(0)],
            "None"
        );
    }

    /// A cluster node: TransparentRedundancyType (i=2036) reading
    /// Transparent, CurrentServerId this node, RedundantServerArray its
    /// members (here, before it joined its store, itself alone). Shutting
    /// down with no other node serving, the whole set goes: State Shutdown
    /// and ServiceLevel 0, in the array as in ServerStatus.
    #[test]
    fn a_cluster_node_has_transparent_redundancy() {
        let w = world_with(|c| {
            c.cluster.url = Some("nats://127.0.0.1:4222".into());
            c.cluster.node_id = Some("n7".into());
        });
        assert_eq!(redundancy_type(&w), Some(NodeId::ns0(2036)));
        let ctx = w.ctx();
        let ids = [
            v::Server_ServerRedundancy_RedundancySupport,
            v::Server_ServerRedundancy_CurrentServerId,
            v::Server_ServerRedundancy_RedundantServerArray,
            v::Server_ServerStatus_State,
        ];
        let array = |level: u8, state: t::ServerState| {
            Variant::from(t::Array::new(t::ArrayValues::ExtensionObject(vec![
                t::ExtensionObject::new(t::RedundantServerDataType {
                    server_id: "n7".into(),
                    service_level: level,
                    server_state: state,
                }),
            ])))
        };
        assert_eq!(
            read_values(&ctx, &ids),
            [
                Variant::Int32(4),
                Variant::String("n7".into()),
                array(255, t::ServerState::Running),
                Variant::Int32(0),
            ]
        );
        w.state
            .shutdown
            .plan(ctx.instant, Duration::from_secs(5), "test", None);
        assert_eq!(
            read_values(&ctx, &ids)[2..],
            [array(0, t::ServerState::Shutdown), Variant::Int32(4)]
        );
        // ServerRedundancy has both properties.
        let mut names = redundancy_properties(&w);
        names.sort();
        assert_eq!(
            names,
            [
                "CurrentServerId",
                "RedundancySupport",
                "RedundantServerArray"
            ]
        );
    }
}
