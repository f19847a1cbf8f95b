//! The live values of the Server object (Part 5 §6.3.1): NamespaceArray,
//! ServerArray, ServerStatus and its children, ServiceLevel, Auditing, and
//! the operation limits this server enforces.

use uascale_types::{
    ids::variable as v, BuildInfo, ExtensionObject, LocalizedText, NodeId, ServerState,
    ServerStatusDataType, UaString, Variant,
};

use crate::context::ServiceContext;

/// The product's build information (ProductUri from the configuration).
pub fn build_info(ctx: &ServiceContext) -> BuildInfo {
    BuildInfo {
        product_uri: UaString::from(ctx.config.product_uri.as_str()),
        manufacturer_name: UaString::from("uascale developers"),
        product_name: UaString::from("uascale"),
        software_version: UaString::from(env!("CARGO_PKG_VERSION")),
        build_number: UaString::from(env!("CARGO_PKG_VERSION")),
        build_date: ctx.start_time,
    }
}

/// The value of a Server-object variable that the server computes, or
/// `None` for nodes whose value is the address space's.
pub fn live_value(ctx: &ServiceContext, id: &NodeId) -> Option<Variant> {
    let n = id.as_ns0()?;
    let status = || ServerStatusDataType {
        start_time: ctx.start_time,
        current_time: ctx.now,
        state: ServerState::Running,
        build_info: build_info(ctx),
        seconds_till_shutdown: 0,
        shutdown_reason: LocalizedText::default(),
    };
    Some(match n {
        v::Server_NamespaceArray => {
            Variant::from(ctx.managers.namespace_array(&ctx.config.application_uri))
        }
        v::Server_ServerArray => {
            Variant::from(vec![UaString::from(ctx.config.application_uri.as_str())])
        }
        v::Server_ServerStatus => Variant::from(ExtensionObject::new(status())),
        v::Server_ServerStatus_StartTime => Variant::DateTime(ctx.start_time),
        v::Server_ServerStatus_CurrentTime => Variant::DateTime(ctx.now),
        v::Server_ServerStatus_State => Variant::Int32(ServerState::Running.0),
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
        v::Server_ServerStatus_SecondsTillShutdown => Variant::UInt32(0),
        v::Server_ServerStatus_ShutdownReason => Variant::from(LocalizedText::default()),
        // Full service until load-based ServiceLevel lands (SCALABILITY.md §2).
        v::Server_ServiceLevel => Variant::Byte(255),
        v::Server_Auditing => Variant::Boolean(ctx.auditing()),
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerRead => {
            Variant::UInt32(crate::services::attribute::MAX_NODES_PER_READ as u32)
        }
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerWrite => {
            Variant::UInt32(crate::services::attribute::MAX_NODES_PER_WRITE as u32)
        }
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerMethodCall => {
            Variant::UInt32(crate::services::method::MAX_METHODS_PER_CALL as u32)
        }
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerTranslateBrowsePathsToNodeIds
        | v::Server_ServerCapabilities_OperationLimits_MaxNodesPerRegisterNodes => {
            Variant::UInt32(crate::services::view::MAX_NODES_PER_BROWSE as u32)
        }
        v::Server_ServerCapabilities_MaxBrowseContinuationPoints => {
            Variant::UInt16(crate::services::view::MAX_CONTINUATION_POINTS as u16)
        }
        v::Server_ServerCapabilities_OperationLimits_MaxNodesPerBrowse => {
            Variant::UInt32(crate::services::view::MAX_NODES_PER_BROWSE as u32)
        }
        // Subscription limits (SCALABILITY.md §4); 0 = no limit.
        v::Server_ServerCapabilities_MaxSubscriptions => {
            Variant::UInt32(u32_of(ctx.subscriptions.limits.max_subscription_count))
        }
        v::Server_ServerCapabilities_MaxMonitoredItems => {
            Variant::UInt32(u32_of(ctx.subscriptions.limits.max_monitored_item_count))
        }
        v::Server_ServerCapabilities_MaxMonitoredItemsPerSubscription => Variant::UInt32(u32_of(
            ctx.subscriptions
                .limits
                .max_monitored_items_per_subscription,
        )),
        v::Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall => Variant::UInt32(
            u32_of(ctx.subscriptions.limits.max_monitored_items_per_call),
        ),
        v::Server_ServerCapabilities_MaxMonitoredItemsQueueSize => {
            Variant::UInt32(ctx.subscriptions.limits.max_queue_size)
        }
        v::Server_ServerCapabilities_MaxSelectClauseParameters => {
            Variant::UInt32(crate::subscription::event::MAX_SELECT_CLAUSES as u32)
        }
        v::Server_ServerCapabilities_MaxWhereClauseParameters => {
            Variant::UInt32(crate::subscription::event::MAX_FILTER_ELEMENTS as u32)
        }
        v::Server_ServerDiagnostics_EnabledFlag => Variant::Boolean(ctx.diagnostics_enabled()),
        v::Server_ServerDiagnostics_SubscriptionDiagnosticsArray => {
            ctx.subscriptions.subscription_diagnostics(ctx.instant)
        }
        v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionDiagnosticsArray => {
            ctx.sessions.diagnostics(
                ctx.now,
                ctx.instant,
                &ctx.config.application_uri,
                ctx.config.channel.transport.max_message_size,
                |id| ctx.subscriptions.session_counts(id),
            )
        }
        v::Server_ServerDiagnostics_SessionsDiagnosticsSummary_SessionSecurityDiagnosticsArray => {
            ctx.sessions.security_diagnostics(ctx.instant)
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary => {
            Variant::from(ExtensionObject::new(diagnostics_summary(ctx)))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount => {
            Variant::UInt32(u32_of(ctx.sessions.len()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSessionCount => {
            Variant::UInt32(u32_of(ctx.sessions.cumulated_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionTimeoutCount => {
            Variant::UInt32(u32_of(ctx.sessions.expired_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedSessionCount => {
            Variant::UInt32(u32_of(ctx.sessions.rejected_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedSessionCount => {
            Variant::UInt32(u32_of(ctx.sessions.security_rejected_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSubscriptionCount => {
            Variant::UInt32(u32_of(ctx.subscriptions.subscription_count()))
        }
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSubscriptionCount => {
            Variant::UInt32(u32_of(ctx.subscriptions.cumulated_subscription_count()))
        }
        v::Server_ServerCapabilities_MinSupportedSampleRate => {
            Variant::Double(ctx.subscriptions.limits.min_sampling_interval.as_secs_f64() * 1000.0)
        }
        _ => return None,
    })
}

/// The ServerDiagnosticsSummary structure: the counters the server keeps
/// (sessions, rejections, timeouts, subscriptions); the request and abort
/// counters it does not keep read 0.
fn diagnostics_summary(ctx: &ServiceContext) -> uascale_types::ServerDiagnosticsSummaryDataType {
    uascale_types::ServerDiagnosticsSummaryDataType {
        current_session_count: u32_of(ctx.sessions.len()),
        cumulated_session_count: u32_of(ctx.sessions.cumulated_count()),
        security_rejected_session_count: u32_of(ctx.sessions.security_rejected_count()),
        rejected_session_count: u32_of(ctx.sessions.rejected_count()),
        session_timeout_count: u32_of(ctx.sessions.expired_count()),
        current_subscription_count: u32_of(ctx.subscriptions.subscription_count()),
        cumulated_subscription_count: u32_of(ctx.subscriptions.cumulated_subscription_count()),
        ..Default::default()
    }
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// With `diagnostics_enabled = false` the diagnostics arrays are not kept:
/// reading them is `BadOutOfService` (SCALABILITY.md §5).
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
    if array && !ctx.diagnostics_enabled() {
        return Err(uascale_types::StatusCode::BadOutOfService);
    }
    Ok(())
}
