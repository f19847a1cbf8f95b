//! `ServerState`: everything a server is, built once from its
//! configuration and owned - no socket, no runtime. The binary, the tests,
//! the benchmarks and (later) a cluster mirror build it the same way; the
//! network layer ([`crate::net`]) only moves bytes and requests to it.
//!
//! It holds the address space and its node managers (namespace 0, the demo
//! namespace, companion NodeSets and whatever the embedder adds), the
//! session table, the subscription engine, the PKI and the server's own
//! identity, and the limits every connection shares. The session table's
//! transitions reach their listeners from here: the subscription engine
//! (a closed or timed-out session's subscriptions), audit and the counters
//! of [`crate::metrics`].

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::ChannelConfig;
use uascale_types::{DateTime, StatusCode};

use crate::address_space::AddressSpace;
use crate::config::ServerConfig;
use crate::demo::Demo;
use crate::node_manager::NodeManagers;
use crate::reply::SubscriptionRegistry;
use crate::security::SecurityState;
use crate::session::{SessionEvent, SessionTable};
use crate::subscription::Now;

/// Why a server state could not be built (a configuration or file
/// problem; nothing from the network).
#[derive(Debug)]
#[non_exhaustive]
pub enum StateError {
    /// The embedded namespace-0 table did not decode.
    Namespace0(String),
    /// A companion NodeSet file did not load.
    NodeSet(String),
    /// The PKI could not be opened or created.
    Pki(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Namespace0(e) => write!(f, "namespace-0 table: {e}"),
            StateError::NodeSet(e) => write!(f, "NodeSet: {e}"),
            StateError::Pki(e) => write!(f, "PKI: {e}"),
        }
    }
}

impl std::error::Error for StateError {}

impl From<StateError> for std::io::Error {
    fn from(e: StateError) -> Self {
        let kind = match e {
            StateError::Pki(_) => std::io::ErrorKind::Other,
            _ => std::io::ErrorKind::InvalidData,
        };
        std::io::Error::new(kind, e.to_string())
    }
}

pub use crate::admission::service_level::DEGRADED_SERVICE_LEVEL;

/// The server: its configuration and all its state.
#[derive(Debug)]
pub struct ServerState {
    /// The configuration it was built from (with the port actually bound
    /// when the listener chose one).
    pub config: ServerConfig,
    /// The sessions.
    pub sessions: SessionTable,
    /// The subscriptions.
    pub subscriptions: Arc<SubscriptionRegistry>,
    /// The nodes.
    pub address_space: AddressSpace,
    /// The node managers (values and methods by namespace).
    pub managers: NodeManagers,
    /// When the server started.
    pub start_time: DateTime,
    /// PKI, own certificate and key, users, the lockout tracker.
    pub security: SecurityState,
    /// Protocol limits and timers of every connection (with the server's
    /// identity and certificate validator).
    pub channel_config: Arc<ChannelConfig>,
    /// Bytes of incomplete chunked messages, shared by all connections.
    pub budget: Arc<ReassemblyBudget>,
    /// The demo namespace (`None` in states built from parts).
    pub demo: Option<Demo>,
    /// Counters of what the server did (requests, session transitions,
    /// connections, ...; shared with the subscription engine's answer
    /// observer).
    pub metrics: Arc<crate::metrics::ServerMetrics>,
    /// The admission stages new connections pass.
    pub admission: crate::admission::Admission,
    /// Request workers, the request queue and isolation (`[requests]`).
    pub scheduler: Arc<crate::scheduler::Scheduler>,
    /// The load-based ServiceLevel (docs/scalability.md §2), updated as
    /// sessions come and go.
    service_level: std::sync::Mutex<crate::admission::service_level::ServiceLevel>,
    /// Its published value (what `Server.ServiceLevel` reads).
    service_level_now: std::sync::atomic::AtomicU8,
    /// `auditing`, switchable while the server runs.
    auditing: std::sync::atomic::AtomicBool,
    /// `diagnostics_enabled`, switchable while the server runs (the
    /// ServerDiagnostics EnabledFlag).
    diagnostics_enabled: std::sync::atomic::AtomicBool,
    /// Readiness: set while the listener serves ([`ServerState::readiness`]).
    listening: std::sync::atomic::AtomicBool,
    /// Readiness: set by admission while it sheds every new connection.
    shedding_all: std::sync::atomic::AtomicBool,
    /// The cluster node, once this server joined a cluster
    /// ([`ServerState::join_cluster`]); unset without `[cluster]`.
    cluster: Arc<std::sync::OnceLock<Arc<crate::cluster::node::ClusterNode>>>,
    /// The planned shutdown, if any ([`crate::shutdown`]).
    pub shutdown: crate::shutdown::Shutdown,
}

/// What an embedder adds to a new server's address space before the
/// NodeSets load ([`ServerState::with_setup`]): nodes, and node managers
/// for namespaces 3 and up (2 is the demo's).
pub trait Setup: FnOnce(&mut AddressSpace, &mut NodeManagers) {}

impl<F: FnOnce(&mut AddressSpace, &mut NodeManagers)> Setup for F {}

impl ServerState {
    /// Builds the state `config` describes: namespace 0, the demo
    /// namespace, the configured NodeSets, and the PKI (opened, or created
    /// on first start, when a secured endpoint is published).
    pub fn new(config: ServerConfig) -> Result<Arc<ServerState>, StateError> {
        Self::with_setup(config, |_, _| {})
    }

    /// Like [`ServerState::new`], and lets `setup` add nodes and register
    /// node managers for further namespaces (index 3 and up; 2 is the
    /// demo's) before the NodeSets load.
    pub fn with_setup(
        config: ServerConfig,
        setup: impl Setup,
    ) -> Result<Arc<ServerState>, StateError> {
        let mut address_space =
            AddressSpace::ns0().map_err(|e| StateError::Namespace0(e.to_string()))?;
        let mut managers = NodeManagers::default();
        let demo = Demo::install(&mut address_space, &mut managers, &config.demo);
        setup(&mut address_space, &mut managers);
        crate::nodeset::load_files(
            &config.server.nodesets,
            &mut address_space,
            &mut managers,
            &config.server.application_uri,
        )
        .map_err(|e| StateError::NodeSet(e.to_string()))?;
        let security = SecurityState::from_config(&config, SystemTime::now())
            .map_err(|e| StateError::Pki(e.to_string()))?;
        Ok(Self::assemble(
            config,
            address_space,
            managers,
            security,
            Some(demo),
        ))
    }

    /// A state from an address space, node managers and security state the
    /// caller built - no demo, nothing read from files (tests, benchmarks,
    /// and embedders that bring their own nodes;
    /// [`SecurityState::none_only`] for SecurityPolicy None without a PKI).
    pub fn from_parts(
        config: ServerConfig,
        address_space: AddressSpace,
        managers: NodeManagers,
        security: SecurityState,
    ) -> Arc<ServerState> {
        Self::assemble(config, address_space, managers, security, None)
    }

    /// A state with no nodes, no node managers and SecurityPolicy None only
    /// ([`ServerState::from_parts`] with empty parts): for tests of what
    /// does not need an address space.
    pub fn empty(config: ServerConfig) -> Arc<ServerState> {
        Self::from_parts(
            config,
            AddressSpace::default(),
            NodeManagers::default(),
            SecurityState::none_only(),
        )
    }

    fn assemble(
        config: ServerConfig,
        mut address_space: AddressSpace,
        managers: NodeManagers,
        security: SecurityState,
        demo: Option<Demo>,
    ) -> Arc<ServerState> {
        // Every derived default decided once, here: what the rest of the
        // server reads from `state.config` is what it runs with.
        let cpus = crate::admission::host::usable_cpus();
        let config = config.resolved(cpus);
        if config.cluster.url.is_some() {
            crate::address_space::make_transparent(&mut address_space);
        }
        let quotas = config.quotas.clone();
        let subscriptions = Arc::new(SubscriptionRegistry::with_quotas(
            config.subscriptions.clone(),
            quotas.clone(),
            quotas.memory_budget_bytes.unwrap_or(0),
        ));
        // Value changes reach monitored items as they happen (no sampling).
        let registry = Arc::clone(&subscriptions);
        let cluster: Arc<std::sync::OnceLock<Arc<crate::cluster::node::ClusterNode>>> =
            Arc::default();
        let mirror = Arc::clone(&cluster);
        let observer: crate::node_manager::ValueObserver = Arc::new(move |node, value| {
            registry.value_changed(clock(), node, value);
            // A cluster node mirrors the change (one atomic load without).
            if let Some(c) = mirror.get() {
                c.value_changed(node, value);
            }
        });
        managers.set_observer(&observer);
        let mut channel_config = config.limits.channel_config();
        // Admission may refuse a Hello (`[admission] refuse_at_hello`):
        // the endpoint acknowledges it or closes.
        channel_config.hold_acknowledge =
            config.admission.enabled && config.admission.refuse_at_hello;
        channel_config.security = uascale_proto::security::ServerSecurity {
            identity: security.identity.clone(),
            ecc_identities: security.ecc_identities.clone(),
            endpoints: security.endpoints.clone(),
            validator: security
                .pki
                .clone()
                .map(|p| p as Arc<dyn uascale_proto::security::CertificateValidator>),
        };
        let state = Arc::new(ServerState {
            channel_config: Arc::new(channel_config),
            budget: ReassemblyBudget::new(
                config.limits.reassembly_budget,
                config.limits.reassembly_unactivated_percent,
            ),
            sessions: SessionTable::new(config.server.max_session_count),
            subscriptions,
            address_space,
            managers,
            security,
            demo,
            start_time: DateTime::from_system_time(SystemTime::now()),
            metrics: Arc::default(),
            admission: crate::admission::Admission::new(&config, cpus),
            scheduler: Arc::new(crate::scheduler::Scheduler::new(&config)),
            service_level: std::sync::Mutex::new(
                crate::admission::service_level::ServiceLevel::new(),
            ),
            service_level_now: std::sync::atomic::AtomicU8::new(255),
            auditing: config.server.auditing.into(),
            diagnostics_enabled: config.server.diagnostics_enabled.into(),
            listening: false.into(),
            shedding_all: false.into(),
            cluster,
            shutdown: crate::shutdown::Shutdown::default(),
            config,
        });
        Self::listen_to_sessions(&state);
        // Parked Publishes are counted when the engine answers them.
        let metrics = Arc::clone(&state.metrics);
        let cluster = Arc::clone(&state.cluster);
        state.subscriptions.observe_answers(Box::new(move |answer| {
            metrics.publish_answered(answer);
            // A cluster node rewrites the subscription's record behind
            // this answer; without a cluster this is one atomic load.
            if let (Some(c), crate::subscription::Answer::Publish(r)) = (cluster.get(), answer) {
                c.subscription_answered(r.subscription_id);
            }
        }));
        state
    }

    /// The listeners of the session transitions that the state itself
    /// has: the subscription engine, the counters, and audit.
    fn listen_to_sessions(state: &Arc<ServerState>) {
        let weak = Arc::downgrade(state);
        state.sessions.listen(Arc::new(move |event: &SessionEvent| {
            let Some(state) = weak.upgrade() else {
                return;
            };
            state.metrics.sessions.record(event);
            state.establishment_heard(event);
            if matches!(
                event,
                SessionEvent::Created { .. }
                    | SessionEvent::Restored { .. }
                    | SessionEvent::Closed { .. }
                    | SessionEvent::TimedOut { .. }
            ) {
                state.update_service_level();
            }
            match event {
                SessionEvent::Closed {
                    session_id,
                    delete_subscriptions,
                    ..
                } => state.subscriptions.close_session(
                    session_id,
                    *delete_subscriptions,
                    StatusCode::BadSessionClosed,
                ),
                SessionEvent::TimedOut { session_id, .. } => {
                    // Its subscriptions live on for a transfer until their
                    // lifetime runs out (Part 4 §5.13.7).
                    state.subscriptions.close_session(
                        session_id,
                        false,
                        StatusCode::BadSessionClosed,
                    );
                    if state.auditing() {
                        crate::audit::audit_session(
                            &state.audit_site(0, clock()),
                            crate::audit::SessionAction::Timeout,
                            &uascale_types::RequestHeader::default(),
                            Ok(()),
                            session_id.clone(),
                            "",
                            None,
                        );
                    }
                }
                _ => {}
            }
        }));
    }

    /// The establishment stage counts sessions created and not yet
    /// activated: a first activation, a close or an expiry settles one.
    fn establishment_heard(&self, event: &SessionEvent) {
        let gate = self.admission.establishment();
        let now = Instant::now();
        match event {
            SessionEvent::Created { .. } => gate.session_created(),
            SessionEvent::Activated { .. } => gate.session_settled(now, true),
            SessionEvent::Closed {
                activated: false, ..
            }
            | SessionEvent::TimedOut {
                activated: false, ..
            } => gate.session_settled(now, false),
            _ => {}
        }
    }

    /// The cluster node, when this server is one.
    pub fn cluster(&self) -> Option<&Arc<crate::cluster::node::ClusterNode>> {
        self.cluster.get()
    }

    /// The cluster node this server runs as: the one joined already
    /// ([`ServerState::join_cluster`]), else with `[cluster] url` a node
    /// of the NATS store there - tried for up to `limit` before the start
    /// fails - else none. A build without the `nats` feature refuses a
    /// `[cluster] url`, naming the key, rather than run alone.
    pub async fn join_configured_cluster(
        self: &Arc<Self>,
        limit: std::time::Duration,
    ) -> std::io::Result<Option<Arc<crate::cluster::node::ClusterNode>>> {
        if let Some(node) = self.cluster() {
            return Ok(Some(Arc::clone(node)));
        }
        let Some(url) = &self.config.cluster.url else {
            return Ok(None);
        };
        #[cfg(feature = "nats")]
        {
            let store = crate::cluster::nats::NatsStore::connect_patiently(
                url,
                self.config.cluster.replicas,
                limit,
            )
            .await
            .map_err(std::io::Error::other)?;
            let node = self.join_cluster(Arc::new(store));
            // Before any subscription is made here: this process's ids
            // start past every earlier process's of its node index.
            // As patient as the connect: a bucket just created on a NATS
            // cluster answers once its replicas have a leader.
            node.reserve_ids_patiently(limit).await.map_err(|e| {
                std::io::Error::other(format!(
                    "cluster.url = {url}: reserving subscription ids: {e}"
                ))
            })?;
            Ok(Some(node))
        }
        #[cfg(not(feature = "nats"))]
        {
            let _ = limit;
            Err(std::io::Error::other(format!(
                "cluster.url = {url}: this build has no NATS client \
                 (uascale-server's `nats` feature is off)"
            )))
        }
    }

    /// Makes this server a node of the cluster that mirrors through
    /// `store` (`[cluster]`; once - a second call returns the first
    /// node): every session transition is queued for the store from now
    /// on, and a session another node takes is removed from this table.
    /// The node's tasks run in [`crate::Server::run`].
    pub fn join_cluster(
        self: &Arc<Self>,
        store: Arc<dyn crate::cluster::store::Store>,
    ) -> Arc<crate::cluster::node::ClusterNode> {
        if let Some(node) = self.cluster.get() {
            return Arc::clone(node);
        }
        let weak = Arc::downgrade(self);
        let node_id = self.config.cluster.node_id_or(self.config.server.port);
        // Subscription ids made here carry this node's index, so that one
        // moved here from another node keeps its id.
        self.subscriptions
            .set_node_index(self.config.cluster.node_index_or(&node_id));
        let node = crate::cluster::node::ClusterNode::new(
            store,
            node_id,
            self.config.cluster.clone(),
            Box::new(move |token| {
                if let Some(state) = weak.upgrade() {
                    state.sessions.evict(token);
                }
            }),
        );
        if self.cluster.set(Arc::clone(&node)).is_err() {
            return self.cluster.get().map_or(node, Arc::clone);
        }
        let (now, seed) = (Arc::downgrade(self), Arc::downgrade(self));
        node.set_id_counter(crate::cluster::node::IdCounter {
            index: self.config.cluster.node_index_or(node.node_id()),
            now: Box::new(move || now.upgrade().map_or(0, |s| s.subscriptions.id_counter())),
            seed: Box::new(move |start| {
                if let Some(s) = seed.upgrade() {
                    s.subscriptions.seed_ids(start);
                }
            }),
        });
        let weak = Arc::downgrade(self);
        node.set_images(Box::new(move |id, unsent| {
            let state = weak.upgrade()?;
            let session = state.subscriptions.session_of(id)?;
            let images = state.subscriptions.images_of(&session, unsent);
            Some((session, images))
        }));
        let weak = Arc::downgrade(self);
        node.set_on_drain(Box::new(move || {
            if let Some(state) = weak.upgrade() {
                state.subscriptions.hold();
            }
        }));
        if let Some(pki) = &self.security.pki {
            node.set_trust_dir(pki.root());
        }
        let weak = Arc::downgrade(self);
        node.set_apply(Box::new(move |id, value| {
            if let Some(state) = weak.upgrade() {
                if let Err(status) = state.managers.write_value(id, value) {
                    tracing::debug!(node = %id, %status, "a mirrored value was not applied");
                }
            }
        }));
        let weak = Arc::downgrade(self);
        node.set_own_status(Box::new(move || match weak.upgrade() {
            Some(state) => (state.own_service_level(), state.own_server_state()),
            None => (
                crate::admission::ServiceLevel::MAINTENANCE,
                uascale_types::ServerState::Shutdown,
            ),
        }));
        let mirror = Arc::clone(&node);
        self.sessions
            .set_mirror(Arc::new(move |event, token, session| {
                mirror.heard(event, token, session)
            }));
        node
    }

    /// Recomputes the load-based ServiceLevel from the session count.
    fn update_service_level(&self) {
        let mut level = self.service_level.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = level.update(self.sessions.len(), self.config.server.max_session_count) {
            self.service_level_now
                .store(v, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// `Server.ServiceLevel` now, in Part 4's sub-ranges (Table 103): 0
    /// (Maintenance) while the server a client sees is shutting down
    /// ([`ServerState::presented_shutdown`]; a cluster node shutting down
    /// while others serve on reads the best of theirs); at most
    /// [`DEGRADED_SERVICE_LEVEL`] while a cluster node cannot reach its
    /// store; else the load level, 255 idle down to 200 at
    /// `max_session_count`, moving in steps of 5 or more (docs/scalability.md
    /// §2).
    pub fn service_level(&self) -> u8 {
        if self.shutdown.is_planned() {
            // A cluster node shutting down while others serve on shows
            // theirs: its clients are about to move there.
            return match self.cluster.get().and_then(|c| c.serving_peers_level()) {
                Some(level) => level,
                None => crate::admission::ServiceLevel::MAINTENANCE,
            };
        }
        self.own_service_level()
    }

    /// This server's own ServiceLevel: like [`ServerState::service_level`],
    /// but 0 whenever this process is shutting down, also in a cluster
    /// whose other nodes serve on (its entry in `RedundantServerArray`).
    pub fn own_service_level(&self) -> u8 {
        if self.shutdown.is_planned() {
            return crate::admission::ServiceLevel::MAINTENANCE;
        }
        let level = self
            .service_level_now
            .load(std::sync::atomic::Ordering::Relaxed);
        // A cluster node whose store is away serves, but degraded (Part 4
        // §6.6.2.4.2: 2..=199).
        match self.cluster.get() {
            Some(c) if c.degraded() => level.min(DEGRADED_SERVICE_LEVEL),
            _ => level,
        }
    }

    /// This process's own ServerState: Shutdown while a shutdown is
    /// planned, else Running (its entry in the cluster's
    /// `RedundantServerArray`).
    pub fn own_server_state(&self) -> uascale_types::ServerState {
        if self.shutdown.is_planned() {
            uascale_types::ServerState::Shutdown
        } else {
            uascale_types::ServerState::Running
        }
    }

    /// Whether `Server.ServerRedundancy` is a TransparentRedundancyType
    /// (a cluster node, `[cluster] url` set) rather than a plain
    /// ServerRedundancyType reading RedundancySupport None.
    pub fn transparent_redundancy(&self) -> bool {
        self.config.cluster.url.is_some()
    }

    /// The planned shutdown that clients of this server see in
    /// `ServerStatus`: this process's own, unless it is a node of a
    /// cluster whose other nodes serve on - their sessions move there
    /// (docs/cluster.md), and a client told the server goes away would wait
    /// for it instead of reconnecting. Then only this node's `/readyz` and
    /// its own entry in the redundancy array say it.
    pub fn presented_shutdown(&self) -> Option<crate::shutdown::Planned> {
        let planned = self.shutdown.planned()?;
        match self.cluster.get() {
            Some(c) if c.peers_serving() => None,
            _ => Some(planned),
        }
    }

    /// Whether audit events are raised now (initially `auditing`).
    pub fn auditing(&self) -> bool {
        self.auditing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the audit events on or off.
    pub fn set_auditing(&self, on: bool) {
        self.auditing
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the diagnostics arrays are kept now (initially
    /// `diagnostics_enabled`).
    pub fn diagnostics_enabled(&self) -> bool {
        self.diagnostics_enabled
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the diagnostics arrays on or off.
    pub fn set_diagnostics_enabled(&self, on: bool) {
        self.diagnostics_enabled
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the server is ready for new clients (`/readyz`): it is
    /// listening, its PKI is loaded (when a secured endpoint needs one), and
    /// admission is not shedding every new connection; else why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.listening.load(Relaxed) {
            return Err("not listening");
        }
        let secured = self.security.endpoints.iter().any(|(p, _)| !p.is_none());
        if secured && (self.security.pki.is_none() || self.security.identity.is_none()) {
            return Err("PKI not loaded");
        }
        if self.shedding_all.load(Relaxed) {
            return Err("shedding every new connection");
        }
        if self.shutdown.is_planned() {
            return Err("shutting down");
        }
        Ok(())
    }

    /// Marks the listener as serving or not (the network layer's run).
    pub fn set_listening(&self, on: bool) {
        self.listening
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Tells readiness that admission refuses every new connection now
    /// (true) or admits again (false): a load balancer then sends new
    /// clients elsewhere while the sessions already here go on.
    pub fn set_shedding_all(&self, on: bool) {
        self.shedding_all
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The endpoint URL clients connect to.
    pub fn endpoint_url(&self) -> String {
        self.config.endpoint_url()
    }

    /// Closes the sessions past their timeout or activation deadline at
    /// `now` (their listeners hear `TimedOut`); returns how many were
    /// orphans (never activated) and how many timed out after activation.
    pub fn expire_sessions(&self, now: Instant) -> (usize, usize) {
        let before = self.sessions.orphaned_count();
        let expired = self.sessions.expire(now);
        let orphans = self.sessions.orphaned_count() - before;
        (orphans, expired.len().saturating_sub(orphans))
    }

    /// Where audit events of a request on `channel_id` at `now` go.
    pub fn audit_site(&self, channel_id: u32, now: Now) -> crate::audit::AuditSite<'_> {
        crate::audit::AuditSite {
            auditing: self.auditing(),
            server_uri: &self.config.server.application_uri,
            start_time: self.start_time,
            address_space: &self.address_space,
            subscriptions: &self.subscriptions,
            now,
            channel_id,
        }
    }

    /// Demo tick `n` (nothing without the demo namespace).
    pub fn tick_demo(&self, n: u64, seed: &mut u64) {
        if let Some(demo) = &self.demo {
            demo.tick(n, seed, &self.address_space, &self.subscriptions, clock());
        }
    }
}

/// The current time on both clocks (the shell's reading; the engines take
/// it as an argument).
pub fn clock() -> Now {
    Now {
        instant: Instant::now(),
        utc: DateTime::from_system_time(SystemTime::now()),
    }
}
