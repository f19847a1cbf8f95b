//! Server configuration: one struct per section of the TOML file that
//! `uascale serve --config` reads and `--print-config` prints, with
//! documented defaults. Every key is defined once, here (serde derives
//! name it); a key missing from a file keeps its default, an unknown key
//! is an error. [`ServerConfig::validate`] checks the ranges, naming the
//! key. Durations are `Duration`s here and whole milliseconds in the file,
//! under keys ending in `_ms`. `docs/configuration.md` lists every key
//! (checked against `--print-config` by a test of the `uascale` crate).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uascale_crypto::policy::SecurityPolicy;
use uascale_proto::ChannelConfig;
use uascale_types::MessageSecurityMode;

use crate::identity::UserAccount;
use crate::pki::PkiOptions;
use crate::subscription::SubscriptionLimits;

/// The whole configuration: the sections of the file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// `[server]`: what the server is and where it listens.
    pub server: ServerSection,
    /// `[limits]`: protocol limits and timers of every connection.
    pub limits: LimitsSection,
    /// `[operation_limits]`: items per service call (published as the
    /// Server object's ServerCapabilities/OperationLimits).
    pub operation_limits: OperationLimits,
    /// `[demo]`: the demo namespace's changing nodes.
    pub demo: DemoSection,
    /// `[security]`: endpoint security, the PKI and user authentication.
    pub security: SecurityConfig,
    /// `[[users]]`: accounts for UserName tokens. Default none: UserName
    /// tokens are not offered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserConfig>,
    /// `[subscriptions]`: subscription and monitored-item limits
    /// (docs/scalability.md §4).
    pub subscriptions: SubscriptionLimits,
    /// `[quotas]`: what one session or client may make the server keep,
    /// and the memory budget of all of it (docs/scalability.md).
    pub quotas: crate::quota::Quotas,
    /// `[admission]`: admission control (docs/scalability.md §2).
    pub admission: AdmissionSection,
    /// `[requests]`: request workers, the request queue and isolation
    /// (docs/scalability.md §3-4).
    pub requests: RequestsSection,
    /// `[runtime]`: the runtime's threads (docs/scalability.md §6).
    pub runtime: RuntimeSection,
    /// `[metrics]`: the Prometheus endpoint and health probes
    /// (docs/scalability.md §9).
    pub metrics: MetricsSection,
    /// `[cluster]`: scale-out through NATS JetStream (docs/scalability.md §8,
    /// docs/cluster.md). Off unless `url` is set.
    pub cluster: ClusterSection,
    /// `[https]`: the opc.https (https-uabinary) listener and its
    /// per-client rate limits (docs/scalability.md, "HTTPS"). Off unless
    /// `listen` is set.
    pub https: HttpsSection,
}

/// `[https]`: the opc.https listener - OPC UA binary messages POSTed over
/// HTTP/1.1 in TLS - and the limits that keep one client from starving
/// the others (docs/scalability.md, "HTTPS").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpsSection {
    /// Address and port of the listener (`listen`, e.g. `"0.0.0.0:4843"`;
    /// `uascale serve --https ADDR`). Default unset: no HTTPS. Port 0 lets
    /// the kernel choose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The TLS certificate, DER or PEM (`certificate`). Default unset: the
    /// application instance certificate of the PKI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<std::path::PathBuf>,
    /// The TLS certificate's private key, PKCS#8 or PKCS#1, DER or PEM
    /// (`private_key`); required with `certificate`. Default unset: the
    /// application instance key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<std::path::PathBuf>,
    /// Most HTTPS connections open at once (`max_connections`); a newer
    /// one is closed at accept. Each held Publish pins a connection over
    /// HTTP/1.1. Default 20,000.
    pub max_connections: usize,
    /// Largest request body, bytes (`max_body_size`); over it the answer
    /// is 413. Default 4 MiB.
    pub max_body_size: usize,
    /// A connection idle this long between requests is closed
    /// (`idle_timeout_ms`). Default 120 s: longer than a held Publish
    /// waits at the usual keep-alive settings.
    #[serde(rename = "idle_timeout_ms", with = "millis")]
    pub idle_timeout: Duration,
    /// Requests a second each session may send (`session_rate`), Publish
    /// and CloseSession not counted. Over it: 429. Default 200.
    pub session_rate: u32,
    /// The session bucket's size (`session_burst`). Default 400.
    pub session_burst: u32,
    /// Requests a second each source address may send without a session
    /// (`address_rate`: GetEndpoints, FindServers, CreateSession, a token
    /// the server does not know), charged only while session
    /// establishment is contended. Over it: 429. Default 50.
    pub address_rate: u32,
    /// The address bucket's size (`address_burst`). Default 100.
    pub address_burst: u32,
    /// Offer HTTP/2 in the TLS handshake (`http2`, ALPN `h2` before
    /// `http/1.1`): a client's requests, held Publishes among them, then
    /// share one connection. Default true; false serves HTTP/1.1 only.
    pub http2: bool,
    /// Most requests in flight at once on one HTTP/2 connection
    /// (`max_streams`, the SETTINGS_MAX_CONCURRENT_STREAMS it announces);
    /// each held Publish is one. Default 256.
    pub max_streams: u32,
}

impl Default for HttpsSection {
    fn default() -> Self {
        HttpsSection {
            listen: None,
            certificate: None,
            private_key: None,
            max_connections: 20_000,
            max_body_size: 4 << 20,
            idle_timeout: Duration::from_secs(120),
            session_rate: 200,
            session_burst: 400,
            address_rate: 50,
            address_burst: 100,
            http2: true,
            max_streams: 256,
        }
    }
}

/// `[cluster]`: this server as one node of a cluster behind a TCP front
/// end, mirroring its sessions through NATS JetStream (docs/cluster.md).
/// Without `url` nothing here is used and nothing is contacted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// The NATS server (`url`, `nats://HOST:PORT`; `uascale serve
    /// --cluster URL`). Default unset: not a cluster node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// This node's id in the cluster (`node_id`, 1-64 of `A-Z a-z 0-9 _
    /// -`; `--node-id`). Default derived: `node-` and the port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The top byte of the subscription ids this node makes
    /// (`node_index`, 1..=255; `--node-index`), so that a subscription
    /// moved here from another node keeps its id. Must differ between the
    /// nodes. Default derived: from a hash of the node id (set it to be
    /// sure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_index: Option<u8>,
    /// The URL the node advertises in its endpoints (`endpoint_url`,
    /// `opc.tcp://HOST:PORT`; `--advertise URL`): the front end's, which
    /// clients use to reach any node. Default unset: the node's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// How often the node beats its heartbeat record (`heartbeat_ms`).
    /// Default 1 s.
    #[serde(rename = "heartbeat_ms", with = "millis")]
    pub heartbeat: Duration,
    /// A node whose heartbeat did not change for this long is dead and its
    /// sessions are adopted by a survivor (`lease_ms`; at least twice
    /// `heartbeat_ms`). Default 5 s: a few missed beats, not one slow one.
    #[serde(rename = "lease_ms", with = "millis")]
    pub lease: Duration,
    /// Copies JetStream keeps of each bucket (`replicas`, 1..=5; 3 on a
    /// three-server NATS cluster). Default 1: a single nats-server.
    pub replicas: usize,
    /// Read a PROXY protocol v2 header before the Hello on every
    /// connection, so admission sees the client's address behind the
    /// front end (`proxy_protocol`). Default false: only enable it behind
    /// a balancer that sends the header (anyone could claim any address).
    pub proxy_protocol: bool,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            url: None,
            node_id: None,
            node_index: None,
            endpoint_url: None,
            heartbeat: Duration::from_secs(1),
            lease: Duration::from_secs(5),
            replicas: 1,
            proxy_protocol: false,
        }
    }
}

impl ClusterSection {
    /// The node index: the configured one, or 1..=255 from a hash of
    /// `node_id` (FNV-1a: the same on every build).
    pub fn node_index_or(&self, node_id: &str) -> u8 {
        self.node_index.unwrap_or_else(|| {
            let h = node_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            (h % 255) as u8 + 1
        })
    }

    /// The node id: the configured one, or `node-PORT`.
    pub fn node_id_or(&self, port: u16) -> String {
        self.node_id
            .clone()
            .unwrap_or_else(|| format!("node-{port}"))
    }
}

/// `[metrics]`: the HTTP endpoint with `/metrics` (Prometheus), `/healthz`
/// and `/readyz` (docs/metrics.md).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Address and port the endpoint listens on (`listen`, e.g.
    /// `"127.0.0.1:9464"`; `uascale serve --metrics ADDR`). Default unset:
    /// no endpoint. Port 0 lets the kernel choose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

/// `[server]`: what the server is and where it listens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// IP address to bind (`bind`). Default `0.0.0.0`: every interface.
    pub bind: IpAddr,
    /// TCP port (`port`); 0 lets the kernel choose. Default 4840, the IANA
    /// port for opc.tcp.
    pub port: u16,
    /// Host name published in endpoint URLs (`host_name`). Default
    /// `localhost`.
    pub host_name: String,
    /// The server's ApplicationUri (`application_uri`). Default
    /// `urn:uascale:server`.
    pub application_uri: String,
    /// ProductUri (`product_uri`). Default `urn:uascale`.
    pub product_uri: String,
    /// ApplicationName (`application_name`). Default `uascale`.
    pub application_name: String,
    /// Most open sessions (`max_session_count`); over it CreateSession
    /// answers `BadTooManySessions`. Default 20,000: about what one process
    /// can hold connections for here (20,000 open files).
    pub max_session_count: usize,
    /// A session not activated this long after CreateSession is closed
    /// (`activation_deadline_ms`; docs/scalability.md "no orphans"). Default
    /// 10 s.
    #[serde(rename = "activation_deadline_ms", with = "millis")]
    pub activation_deadline: Duration,
    /// The diagnostics arrays of the Server object (`diagnostics_enabled`,
    /// docs/scalability.md §5): rebuilt when read, at most once a second; with
    /// false they read `BadOutOfService` and cost nothing. Default true.
    pub diagnostics_enabled: bool,
    /// Raise the Part 5 audit events of session establishment
    /// (`auditing`: AuditCreateSession, AuditActivateSession, AuditSession
    /// for close) on the Server object; the Server's `Auditing` variable
    /// reads this. Default false (then nothing is built or raised).
    pub auditing: bool,
    /// Companion NodeSet2 XML files loaded at start, in order (`nodesets`,
    /// `--nodeset`, [`crate::nodeset`]). Default none.
    pub nodesets: Vec<PathBuf>,
    /// Seconds from a shutdown signal (SIGTERM, Ctrl-C) to the channels
    /// closing (`shutdown_delay_s`, [`crate::shutdown`]): meanwhile
    /// `ServerStatus` counts `SecondsTillShutdown` down, ServiceLevel is 0,
    /// `/readyz` answers 503 and new sessions are refused. Default 5: one
    /// readiness check of a balancer, and a client sees the countdown. A
    /// second signal closes at once.
    pub shutdown_delay_s: u32,
    /// Who may call `Server.RequestServerStateChange` (`admin_users`): the
    /// names of `[[users]]` accounts, and X509 user certificates as
    /// `x509:` and the certificate's SHA-1 thumbprint in hex. Default none:
    /// only the signal shuts the server down.
    pub admin_users: Vec<String>,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            // Every interface: a server is there to be reached.
            bind: IpAddr::from([0, 0, 0, 0]),
            // The IANA-registered opc.tcp port.
            port: 4840,
            host_name: "localhost".into(),
            application_uri: "urn:uascale:server".into(),
            product_uri: "urn:uascale".into(),
            application_name: "uascale".into(),
            // About the connections one process can hold here (20,000 open
            // files).
            max_session_count: 20_000,
            // Long enough for a slow client's ActivateSession, short enough
            // that orphaned sessions of a connect storm go soon.
            activation_deadline: Duration::from_secs(10),
            // Cheap: rebuilt at most once a second, only when read.
            diagnostics_enabled: true,
            // Off: the events cost work per session for no reader.
            auditing: false,
            nodesets: Vec::new(),
            // One balancer readiness check, and a countdown a client sees.
            shutdown_delay_s: 5,
            admin_users: Vec::new(),
        }
    }
}

impl ServerSection {
    /// The socket address to bind: `bind` and `port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }
}

/// `[limits]`: protocol limits and timers of every connection (the
/// secure channel's [`ChannelConfig`], [`LimitsSection::channel_config`]),
/// and the server-wide reassembly budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    /// Pending accepts the kernel keeps (`listen_backlog`, docs/scalability.md
    /// §2). Default 512: tokio's 128 is too small for connect bursts; the
    /// kernel caps it at `somaxconn` (4096 here).
    pub listen_backlog: u32,
    /// Largest chunk received, bytes (`receive_buffer_size`, at least
    /// 8192, the Part 6 minimum). Default 65,535: the common choice of the
    /// .NET and open62541 stacks; one read syscall holds a chunk.
    pub receive_buffer_size: u32,
    /// Largest chunk sent, bytes (`send_buffer_size`, at least 8192).
    /// Default 65,535.
    pub send_buffer_size: u32,
    /// Largest request message, bytes (`max_message_size`); 0 = no limit
    /// but the reassembly budget. Default 16 MiB.
    pub max_message_size: u32,
    /// Most chunks per request (`max_chunk_count`); 0 = no limit. Default
    /// 4096 (16 MiB in 4 KiB chunks).
    pub max_chunk_count: u32,
    /// Time from accept to Hello, and from Acknowledge to
    /// OpenSecureChannel (`handshake_timeout_ms`). Default 10 s: long
    /// enough for a slow client, short enough that idle sockets do not pile
    /// up during a storm.
    #[serde(rename = "handshake_timeout_ms", with = "millis")]
    pub handshake_timeout: Duration,
    /// Lower bound of the revised security token lifetime
    /// (`min_token_lifetime_ms`). Default 10 s: renewals more often than
    /// that are asymmetric-crypto load for nothing.
    #[serde(rename = "min_token_lifetime_ms", with = "millis")]
    pub min_token_lifetime: Duration,
    /// Upper bound of the revised token lifetime (`max_token_lifetime_ms`).
    /// Default 1 h: keys are renewed at least hourly.
    #[serde(rename = "max_token_lifetime_ms", with = "millis")]
    pub max_token_lifetime: Duration,
    /// Bytes of incomplete chunked messages kept across all connections
    /// (`reassembly_budget`). Default 64 MiB: four largest messages at
    /// once.
    pub reassembly_budget: usize,
    /// Percent of that budget that channels without an activated session
    /// may use (`reassembly_unactivated_percent`, 0..=100). Default 50:
    /// strangers cannot starve the sessions.
    pub reassembly_unactivated_percent: u8,
    /// Time allowed between two chunks of one message
    /// (`assembly_deadline_ms`); past it the channel closes with ERR
    /// `BadTimeout` and the message's later chunks are never read as a
    /// request. Default 10 s: a stalled sender does not hold budget for
    /// long, and a slow one that keeps sending still gets through.
    #[serde(rename = "assembly_deadline_ms", with = "millis")]
    pub assembly_deadline: Duration,
    /// Largest String in a request, bytes (`max_string_length`). Default
    /// 1 MiB, as the OPC Foundation .NET stack's `MaxStringLength`.
    pub max_string_length: usize,
    /// Largest ByteString in a request, bytes (`max_byte_string_length`).
    /// Default 16 MiB: certificate chains and file-transfer chunks stay
    /// well below it.
    pub max_byte_string_length: usize,
    /// Most elements of one array in a request (`max_array_length`).
    /// Default 1,000,000; a call with that many operations is stopped
    /// earlier by `[operation_limits]`.
    pub max_array_length: usize,
}

impl Default for LimitsSection {
    /// The reasons are on each field.
    fn default() -> Self {
        // The protocol defaults are uascale-proto's and uascale-types', so
        // that a connection built without a configuration behaves the same.
        let channel = ChannelConfig::default();
        LimitsSection {
            listen_backlog: 512,
            receive_buffer_size: channel.transport.receive_buffer_size,
            send_buffer_size: channel.transport.send_buffer_size,
            max_message_size: channel.transport.max_message_size,
            max_chunk_count: channel.transport.max_chunk_count,
            handshake_timeout: channel.handshake_timeout,
            min_token_lifetime: channel.min_token_lifetime,
            max_token_lifetime: channel.max_token_lifetime,
            reassembly_budget: 64 << 20,
            reassembly_unactivated_percent: 50,
            assembly_deadline: channel.assembly.deadline,
            max_string_length: channel.decode.max_string_length,
            max_byte_string_length: channel.decode.max_byte_string_length,
            max_array_length: channel.decode.max_array_length,
        }
    }
}

impl LimitsSection {
    /// The secure channel's configuration from these limits (its
    /// `security` is filled in when the server binds).
    pub fn channel_config(&self) -> ChannelConfig {
        let mut c = ChannelConfig::default();
        c.transport.receive_buffer_size = self.receive_buffer_size;
        c.transport.send_buffer_size = self.send_buffer_size;
        c.transport.max_message_size = self.max_message_size;
        c.transport.max_chunk_count = self.max_chunk_count;
        c.handshake_timeout = self.handshake_timeout;
        c.min_token_lifetime = self.min_token_lifetime;
        c.max_token_lifetime = self.max_token_lifetime;
        c.assembly.max_message_size =
            (self.max_message_size != 0).then_some(self.max_message_size as usize);
        c.assembly.max_chunk_count = (self.max_chunk_count != 0).then_some(self.max_chunk_count);
        c.assembly.deadline = self.assembly_deadline;
        // With no message limit the decoder keeps its own default.
        if self.max_message_size != 0 {
            c.decode.max_message_size = self.max_message_size as usize;
        }
        c.decode.max_string_length = self.max_string_length;
        c.decode.max_byte_string_length = self.max_byte_string_length;
        c.decode.max_array_length = self.max_array_length;
        c
    }
}

/// `[operation_limits]`: the most operations one service call may carry;
/// over a limit the call is answered `BadTooManyOperations`. Published in
/// the Server object's ServerCapabilities (OperationLimits and
/// MaxBrowseContinuationPoints); Part 5 requires published limits to be
/// non-zero, so every value must be at least 1. MonitoredItem calls are
/// limited by `[subscriptions] max_monitored_items_per_call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OperationLimits {
    /// Nodes per Read, and per HistoryRead (`max_nodes_per_read`).
    /// Default 10,000: a Read of that many values is a few MB of response.
    pub max_nodes_per_read: usize,
    /// Nodes per Write (`max_nodes_per_write`). Default 10,000, as Read.
    pub max_nodes_per_write: usize,
    /// Methods per Call (`max_nodes_per_method_call`). Default 1,000:
    /// methods run application code, each may be slow.
    pub max_nodes_per_method_call: usize,
    /// Nodes per Browse, continuation points per BrowseNext
    /// (`max_nodes_per_browse`). Default 1,000: each node may answer up to
    /// `max_references_per_node` references.
    pub max_nodes_per_browse: usize,
    /// Nodes per RegisterNodes and UnregisterNodes
    /// (`max_nodes_per_register_nodes`). Default 10,000: registering costs
    /// nothing here (the NodeIds come back as they are), and clients
    /// register the nodes they then Read, so the same as
    /// `max_nodes_per_read`.
    pub max_nodes_per_register_nodes: usize,
    /// Browse paths per TranslateBrowsePathsToNodeIds
    /// (`max_nodes_per_translate_browse_paths_to_node_ids`). Default 1,000:
    /// each path walks references as a Browse does, so the same as
    /// `max_nodes_per_browse`.
    pub max_nodes_per_translate_browse_paths_to_node_ids: usize,
    /// References returned per node in one Browse page
    /// (`max_references_per_node`), when the client asks for more or sets
    /// no limit; the rest follow with BrowseNext. Default 1,000.
    pub max_references_per_node: usize,
    /// Continuation points one session may hold
    /// (`max_browse_continuation_points`, ServerCapabilities
    /// MaxBrowseContinuationPoints, UInt16). Default 10: each holds the
    /// rest of a Browse result in memory.
    pub max_browse_continuation_points: u16,
}

impl Default for OperationLimits {
    /// The reasons are on each field.
    fn default() -> Self {
        OperationLimits {
            // A response of a few MB at most.
            max_nodes_per_read: 10_000,
            max_nodes_per_write: 10_000,
            // Methods run application code; each may be slow.
            max_nodes_per_method_call: 1_000,
            // Each node may answer max_references_per_node references.
            max_nodes_per_browse: 1_000,
            // Free here; clients register what they then Read.
            max_nodes_per_register_nodes: 10_000,
            // Each path walks references as a Browse does.
            max_nodes_per_translate_browse_paths_to_node_ids: 1_000,
            max_references_per_node: 1_000,
            // Each holds the rest of a Browse result in memory.
            max_browse_continuation_points: 10,
        }
    }
}

/// `[demo]`: the demo namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoSection {
    /// Changing load-test nodes under `Demo.Load` (`nodes`, `uascale serve
    /// --nodes N`). Default 0: none unless asked for.
    pub nodes: usize,
    /// How often the demo's dynamic values change (`rate_ms`). Default
    /// 1 s: visible change without load.
    #[serde(rename = "rate_ms", with = "millis")]
    pub rate: Duration,
    /// How long the asynchronous node manager behind `Demo.Slow.0` ..
    /// `Demo.Slow.9` takes to answer each Read and Write (`slow_ms`,
    /// `uascale serve --slow-ms`), standing in for device I/O. Default
    /// 2 ms; 0 answers at the next turn of the runtime.
    #[serde(rename = "slow_ms", with = "millis")]
    pub slow: Duration,
}

impl Default for DemoSection {
    fn default() -> Self {
        DemoSection {
            nodes: 0,
            rate: Duration::from_secs(1),
            slow: Duration::from_millis(2),
        }
    }
}

/// `[security]`: endpoint security, the PKI and user authentication.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// The PKI directory (own/, trusted/, issuers/, rejected/) (`pki_dir`).
    /// Default `pki`, relative to the working directory.
    pub pki_dir: PathBuf,
    /// Security policies published, each with every mode of `modes`
    /// (`policies`; in the file by the name their URI ends with, e.g.
    /// `"Basic256Sha256"`, or the full URI). Default: Basic256Sha256,
    /// Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss.
    #[serde(with = "policy_names")]
    pub policies: Vec<SecurityPolicy>,
    /// Message security modes published for each policy (`modes`: `"Sign"`,
    /// `"SignAndEncrypt"`). Default both.
    #[serde(with = "mode_names")]
    pub modes: Vec<MessageSecurityMode>,
    /// Also publish the unsecured None/None endpoint
    /// (`allow_security_none`). Unsafe: traffic and identity are
    /// unprotected. Default true while the secured endpoints are being
    /// brought up in the server, so existing deployments and tools keep
    /// working; set false in production.
    pub allow_security_none: bool,
    /// Accept client certificates that no trust list vouches for
    /// (`trust_all_client_certificates`). Unsafe: any client with any
    /// certificate gets in. Default false.
    pub trust_all_client_certificates: bool,
    /// Reject CA-issued certificates whose CA has no CRL in the PKI
    /// (`reject_unknown_revocation_status`,
    /// BadCertificateRevocationUnknown). Default true.
    pub reject_unknown_revocation_status: bool,
    /// Most files kept in rejected/certs; the oldest go first
    /// (`max_rejected_certificates`). Default 100: enough for an operator
    /// to find a new client, bounded so a storm of distinct certificates
    /// cannot fill the disk (100 x 32 KiB at most).
    pub max_rejected_certificates: usize,
    /// How often the PKI directory is checked for changes
    /// (`pki_reload_interval_ms`). Default 5 s.
    #[serde(rename = "pki_reload_interval_ms", with = "millis")]
    pub pki_reload_interval: Duration,
    /// Offer the Anonymous user token (`allow_anonymous`). Default true.
    pub allow_anonymous: bool,
    /// Failed activations per client within a minute before a five-minute
    /// lockout (`max_failed_authentication_attempts`, docs/scalability.md §2).
    /// Default 5; 0 disables.
    pub max_failed_authentication_attempts: u32,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        let pki = PkiOptions::default();
        SecurityConfig {
            pki_dir: PathBuf::from("pki"),
            // The RSA policies Part 7 does not deprecate.
            policies: vec![
                SecurityPolicy::Basic256Sha256,
                SecurityPolicy::Aes128Sha256RsaOaep,
                SecurityPolicy::Aes256Sha256RsaPss,
            ],
            modes: vec![
                MessageSecurityMode::Sign,
                MessageSecurityMode::SignAndEncrypt,
            ],
            allow_security_none: true,
            // The PKI's own defaults (documented on PkiOptions).
            trust_all_client_certificates: pki.trust_all_client_certificates,
            reject_unknown_revocation_status: pki.reject_unknown_revocation_status,
            max_rejected_certificates: pki.max_rejected_certificates,
            pki_reload_interval: pki.reload_interval,
            allow_anonymous: true,
            // A guessing client is stopped quickly; a typo is forgiven.
            max_failed_authentication_attempts: 5,
        }
    }
}

impl SecurityConfig {
    /// Only the unsecured None/None endpoint: no PKI, no certificate (tests,
    /// and `uascale serve --security none`).
    pub fn none_only() -> Self {
        SecurityConfig {
            policies: Vec::new(),
            allow_security_none: true,
            ..Default::default()
        }
    }

    /// The (policy, mode) pairs to publish: None/None first when allowed,
    /// then every policy with every mode.
    pub fn endpoints(&self) -> Vec<(SecurityPolicy, MessageSecurityMode)> {
        let mut out = Vec::new();
        if self.allow_security_none {
            out.push((SecurityPolicy::None, MessageSecurityMode::None));
        }
        for policy in self.policies.iter().filter(|p| !p.is_none()) {
            for mode in &self.modes {
                if *mode == MessageSecurityMode::Sign
                    || *mode == MessageSecurityMode::SignAndEncrypt
                {
                    out.push((*policy, *mode));
                }
            }
        }
        out
    }

    /// Whether any endpoint needs the PKI (a certificate and key).
    pub fn needs_pki(&self) -> bool {
        self.endpoints().iter().any(|(p, _)| !p.is_none())
    }

    /// The PKI's validation and rejected-store options.
    pub fn pki_options(&self) -> PkiOptions {
        PkiOptions {
            trust_all_client_certificates: self.trust_all_client_certificates,
            reject_unknown_revocation_status: self.reject_unknown_revocation_status,
            max_rejected_certificates: self.max_rejected_certificates,
            reload_interval: self.pki_reload_interval,
        }
    }
}

/// `[admission]`: admission control (docs/scalability.md §2; the stages are
/// [`crate::admission`]). On by default with conservative limits: orderly
/// load, bulk connects included, must not notice it; storms are turned
/// away early with a busy answer and a retry-after hint.
///
/// Keys whose default is derived (from the CPUs the process may use, from
/// `server.max_session_count` or from another key of this section) are
/// `None` until [`ServerConfig::resolved`] fills them in; a `None` is not
/// printed, so a file that leaves them out keeps deriving them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionSection {
    /// The master switch (`enabled`): false admits everything (the
    /// listen backlog, `max_session_count` and the reassembly budget still
    /// bound). Default true.
    pub enabled: bool,
    /// New TCP connections per second at the listener, all addresses
    /// together (`connections_per_second`, a token bucket's refill rate).
    /// Default 5000: a TCP accept and a Hello cost microseconds, and the
    /// CPU a storm's handshakes take is bounded by
    /// `max_concurrent_handshakes` and its waiting room; this bucket only
    /// sheds connection floods beyond what the cores could ever handshake
    /// (an RSA-2048 handshake takes about 1.2 ms of a core), so that it
    /// never becomes a storm's bottleneck ahead of the cores.
    pub connections_per_second: u32,
    /// Connections the global bucket lets through at once
    /// (`connection_burst`, the bucket's size). Default 5000: a bulk
    /// connect of thousands of clients passes this stage without a
    /// refusal.
    pub connection_burst: u32,
    /// New connections per second from one source address (an IPv4
    /// address, an IPv6 /64) (`connections_per_second_per_address`), at
    /// most `connections_per_second`. Default derived:
    /// max(1, `connections_per_second` / 8), so one host cannot take the
    /// whole budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections_per_second_per_address: Option<u32>,
    /// The per-address bucket's size (`connection_burst_per_address`), at
    /// most `connection_burst`. Default derived: max(1, `connection_burst`
    /// / 8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_burst_per_address: Option<u32>,
    /// OpenSecureChannel requests (Issue and Renew) whose asymmetric work
    /// is in flight - waiting for a crypto worker or running - at once
    /// (`max_concurrent_handshakes`); over it the request gets
    /// `BadTcpServerTooBusy`. Default derived: 2 x the CPUs the process may
    /// use (enough to keep every core busy while the next request waits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_handshakes: Option<usize>,
    /// Unfinished handshakes one source address may have
    /// (`max_unfinished_handshakes_per_address`): its connections that
    /// have not yet had an activated session (a new one over it is refused
    /// at accept with ERR `BadTcpServerTooBusy` and a hint), and of the
    /// OpenSecureChannel requests in flight. Default 64: idle connections
    /// from one host cannot hold every place, while a client that connects
    /// 50 at a time from one address is not limited.
    pub max_unfinished_handshakes_per_address: u32,
    /// Open secure channels (`max_channel_count`); at the limit a new
    /// channel evicts the oldest channel without a session, else it is
    /// refused. Default derived: `server.max_session_count` + 10 %,
    /// rounded up (room for reconnects and discovery).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_channel_count: Option<usize>,
    /// Sessions created and not yet activated, plus CreateSession and
    /// ActivateSession calls in progress
    /// (`max_concurrent_session_establishment`); over it CreateSession is
    /// answered `BadServerTooBusy` before any certificate or signature
    /// work. Default derived: max(8 x the CPUs the process may use, 128).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_session_establishment: Option<usize>,
    /// Establishment requests that may wait for a place when all are taken
    /// (`session_establishment_queue_limit`, the waiting room's size; 0:
    /// no waiting room, refuse at once). Default 1024: bounds what a storm
    /// parks in the room (a request each, about 1 KB) whatever
    /// `establishment_wait_ms` says.
    pub session_establishment_queue_limit: usize,
    /// How long an establishment request may wait for a place, in
    /// milliseconds (`establishment_wait_ms`): one that would wait longer
    /// (from the stage's measured rate and the requests ahead of it) is
    /// refused at once with its slot as the hint. Default 500: a refusal
    /// costs the client at least the shortest hint (100 ms) plus a new
    /// connection and handshake, so a wait of a few times that is cheaper
    /// for both sides; longer waits would only hold requests the client
    /// may time out. 0: never wait.
    pub establishment_wait_ms: u32,
    /// How long a secured OpenSecureChannel may wait for a handshake place,
    /// in milliseconds (`handshake_wait_ms`): one that would wait longer
    /// is refused at once (ERR `BadTcpServerTooBusy`) with its slot as the
    /// hint and a retry ticket. Default 200: twice the shortest hint, about
    /// a hundred handshakes of a core's work - a bulk connect of 50 at a
    /// time waits a few milliseconds instead of being sent away. 0: never
    /// wait.
    pub handshake_wait_ms: u32,
    /// Whether a Hello is refused when a secured OpenSecureChannel coming
    /// now would be (`refuse_at_hello`): the handshake stage full and its
    /// waiting room too long. The ERR (`BadTcpServerTooBusy`, the slot as
    /// the hint, a retry ticket) then comes before the client spends any
    /// work on an OpenSecureChannel that would be refused - a private-key
    /// signature for RSA - and before a discovery connection. A ticket
    /// holder back at its slot is acknowledged. Default true; false
    /// acknowledges every Hello, so that None-policy connections, which
    /// need no handshake place, are never refused for the secured ones'
    /// storm.
    pub refuse_at_hello: bool,
    /// File descriptors kept free (`open_files_headroom`): a new
    /// connection is refused busy when fewer than this many would remain
    /// below the soft open-files limit (which the server raises to the
    /// hard limit at start). Default 64: room for the listener, the PKI
    /// files, logs and the connections being closed. 0 turns it off.
    pub open_files_headroom: u32,
}

impl Default for AdmissionSection {
    /// The reasons are on each field.
    fn default() -> Self {
        AdmissionSection {
            enabled: true,
            connections_per_second: 5000,
            connection_burst: 5000,
            connections_per_second_per_address: None,
            connection_burst_per_address: None,
            max_concurrent_handshakes: None,
            max_unfinished_handshakes_per_address: 64,
            max_channel_count: None,
            max_concurrent_session_establishment: None,
            session_establishment_queue_limit: 1024,
            establishment_wait_ms: 500,
            handshake_wait_ms: 200,
            refuse_at_hello: true,
            open_files_headroom: 64,
        }
    }
}

impl AdmissionSection {
    /// A per-address value derived from its global one: max(1, global / 8).
    pub fn per_address_default(global: u32) -> u32 {
        (global / 8).max(1)
    }

    /// The default `max_channel_count`: `max_session_count` + 10 %,
    /// rounded up.
    pub fn channel_count_default(max_session_count: usize) -> usize {
        max_session_count.saturating_mul(11).div_ceil(10)
    }

    /// The default `max_concurrent_handshakes`: 2 x `cpus`.
    pub fn handshakes_default(cpus: usize) -> usize {
        cpus.max(1).saturating_mul(2)
    }

    /// The default `max_concurrent_handshakes` of a cluster node: 8 x
    /// `cpus`. When a node dies its clients reconnect to the survivors at
    /// once, on top of their own; with 2 x CPUs a fifth of them were
    /// refused busy and backed off past 5 s (docs/cluster.md, "Measuring
    /// failover"), with 8 x none.
    pub fn cluster_handshakes_default(cpus: usize) -> usize {
        cpus.max(1).saturating_mul(8)
    }

    /// The default `max_concurrent_session_establishment`:
    /// max(8 x `cpus`, 128).
    pub fn session_establishment_default(cpus: usize) -> usize {
        cpus.max(1).saturating_mul(8).max(128)
    }

    /// The derived values of this section, from `max_session_count`
    /// (`[server]`) and the CPUs the process may use: a value set is kept,
    /// a value left out gets its documented default. The one place those
    /// defaults are applied.
    pub fn effective(&self, max_session_count: usize, cpus: usize) -> EffectiveAdmission {
        EffectiveAdmission {
            connections_per_second_per_address: self
                .connections_per_second_per_address
                .unwrap_or_else(|| Self::per_address_default(self.connections_per_second)),
            connection_burst_per_address: self
                .connection_burst_per_address
                .unwrap_or_else(|| Self::per_address_default(self.connection_burst)),
            max_concurrent_handshakes: self
                .max_concurrent_handshakes
                .unwrap_or_else(|| Self::handshakes_default(cpus)),
            max_channel_count: self
                .max_channel_count
                .unwrap_or_else(|| Self::channel_count_default(max_session_count)),
            max_concurrent_session_establishment: self
                .max_concurrent_session_establishment
                .unwrap_or_else(|| Self::session_establishment_default(cpus)),
        }
    }

    /// This section with every derived value filled in
    /// ([`AdmissionSection::effective`]). Values already set are kept.
    pub fn resolved(&self, max_session_count: usize, cpus: usize) -> AdmissionSection {
        let e = self.effective(max_session_count, cpus);
        AdmissionSection {
            connections_per_second_per_address: Some(e.connections_per_second_per_address),
            connection_burst_per_address: Some(e.connection_burst_per_address),
            max_concurrent_handshakes: Some(e.max_concurrent_handshakes),
            max_channel_count: Some(e.max_channel_count),
            max_concurrent_session_establishment: Some(e.max_concurrent_session_establishment),
            ..self.clone()
        }
    }
}

/// The derived values of `[admission]`, every one decided
/// ([`AdmissionSection::effective`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveAdmission {
    /// `connections_per_second_per_address`.
    pub connections_per_second_per_address: u32,
    /// `connection_burst_per_address`.
    pub connection_burst_per_address: u32,
    /// `max_concurrent_handshakes`.
    pub max_concurrent_handshakes: usize,
    /// `max_channel_count`.
    pub max_channel_count: usize,
    /// `max_concurrent_session_establishment`.
    pub max_concurrent_session_establishment: usize,
}

/// How the request queue is shared among its owners (docs/scalability.md §3;
/// `requests.isolation_profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationProfile {
    /// One FIFO for everyone (no per-owner limit: the legacy behaviour).
    SharedOnly,
    /// A lane per owner, served in weighted turns.
    FairShare,
    /// `fair_share` plus protected entries for bootstrap, reconnect and
    /// control requests (the default).
    #[default]
    Balanced,
    /// `balanced` plus a reserved floor of the queue, and a larger turn,
    /// for trusted owners (`requests.trusted_owners`).
    TrustedReservations,
}

impl IsolationProfile {
    /// The name in the configuration file.
    pub fn name(self) -> &'static str {
        match self {
            IsolationProfile::SharedOnly => "shared_only",
            IsolationProfile::FairShare => "fair_share",
            IsolationProfile::Balanced => "balanced",
            IsolationProfile::TrustedReservations => "trusted_reservations",
        }
    }

    /// True for the profiles with protected entries (`balanced`,
    /// `trusted_reservations`).
    pub fn protects(self) -> bool {
        matches!(
            self,
            IsolationProfile::Balanced | IsolationProfile::TrustedReservations
        )
    }
}

impl std::str::FromStr for IsolationProfile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            IsolationProfile::SharedOnly,
            IsolationProfile::FairShare,
            IsolationProfile::Balanced,
            IsolationProfile::TrustedReservations,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown isolation profile {s:?} (shared_only, fair_share, balanced, trusted_reservations)"
            )
        })
    }
}

/// `[requests]`: request workers, the request queue and isolation
/// profiles (docs/scalability.md §3-4; [`crate::scheduler`]). A request runs at
/// once, on its connection's task, while nothing waits and a worker is
/// free; only under contention does it wait in the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestsSection {
    /// Request workers started with the server (`min_request_thread_count`,
    /// at least 1). Workers are async tasks, not threads; a worker is busy
    /// while it executes a request, including the wait of an asynchronous
    /// node manager. Default 10.
    pub min_request_thread_count: usize,
    /// The most workers (`max_request_thread_count`): one is added only
    /// when a request waits and every worker is busy. Taken as given (1 is
    /// allowed: small devices, tests). Default 100.
    pub max_request_thread_count: usize,
    /// Requests that may wait for a worker (`max_queued_request_count`);
    /// over it `BadServerTooBusy` with a RetryAfterMs hint. Values below
    /// 100 are raised to 100. Default 200.
    pub max_queued_request_count: usize,
    /// How the queue is shared (`isolation_profile`): `shared_only`,
    /// `fair_share`, `balanced` or `trusted_reservations`. Default
    /// `balanced`.
    pub isolation_profile: IsolationProfile,
    /// Requests one owner (its session; the channel before a session
    /// exists, over opc.https the source address) may have waiting
    /// (`max_queued_requests_per_owner`; not
    /// applied under `shared_only`). Default 64: a third of the default
    /// queue, so two flooding clients cannot fill it.
    pub max_queued_requests_per_owner: usize,
    /// Bytes of the requests waiting, all owners together
    /// (`max_retained_request_bytes`; a request alone is always let in).
    /// Default 64 MiB.
    pub max_retained_request_bytes: usize,
    /// Protected entries per protected stage - bootstrap, reconnect,
    /// control - on top of `max_queued_request_count`, under `balanced`
    /// and `trusted_reservations` (`protected_entry_count`). Default 1.
    pub protected_entry_count: usize,
    /// Held Publishes that may be parked at once (`max_parked_request_count`,
    /// the parked stage); over it a Publish gets `BadServerTooBusy`.
    /// Default derived: `server.max_session_count` x
    /// `subscriptions.max_publish_request_count`, so the session limits
    /// bind first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parked_request_count: Option<usize>,
    /// Owners given a reserved floor and a larger turn under
    /// `trusted_reservations` (`trusted_owners`): application URIs,
    /// certificate thumbprints (40 hex digits, SHA-1) or user names.
    /// Default none.
    pub trusted_owners: Vec<String>,
    /// Queue places only trusted owners may take under
    /// `trusted_reservations` (`trusted_reserved_request_count`), less than
    /// `max_queued_request_count`. Default 40.
    pub trusted_reserved_request_count: usize,
    /// Requests a trusted owner's lane is served per turn where others get
    /// one (`trusted_weight`, at least 1). Default 4.
    pub trusted_weight: u32,
    /// A held Publish is parked and releases its worker
    /// (`decouple_held_publish_requests`). False is the legacy behaviour: a
    /// held Publish occupies a worker for its whole wait, so
    /// `max_request_thread_count` must exceed the sessions' held Publishes.
    /// Default true.
    pub decouple_held_publish_requests: bool,
}

impl Default for RequestsSection {
    /// The reasons are on each field.
    fn default() -> Self {
        RequestsSection {
            min_request_thread_count: 10,
            max_request_thread_count: 100,
            max_queued_request_count: 200,
            isolation_profile: IsolationProfile::Balanced,
            max_queued_requests_per_owner: 64,
            max_retained_request_bytes: 64 * 1024 * 1024,
            protected_entry_count: 1,
            max_parked_request_count: None,
            trusted_owners: Vec::new(),
            trusted_reserved_request_count: 40,
            trusted_weight: 4,
            decouple_held_publish_requests: true,
        }
    }
}

impl RequestsSection {
    /// The smallest queue: smaller values of `max_queued_request_count` are
    /// raised to it.
    pub const MIN_QUEUED: usize = 100;

    /// This section with derived values filled in and the queue raised to
    /// [`RequestsSection::MIN_QUEUED`]; `max_session_count` and
    /// `max_publish_request_count` size the parked stage.
    pub fn resolved(
        &self,
        max_session_count: usize,
        max_publish_request_count: usize,
    ) -> RequestsSection {
        let mut r = self.clone();
        r.max_queued_request_count = r.max_queued_request_count.max(Self::MIN_QUEUED);
        r.max_parked_request_count =
            Some(r.max_parked_request_count.unwrap_or_else(|| {
                max_session_count.saturating_mul(max_publish_request_count.max(1))
            }));
        r
    }
}

/// `[runtime]`: the async runtime that runs the connections (docs/scalability.md
/// §6).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeSection {
    /// Worker threads of the runtime (`worker_threads`). Default derived:
    /// the CPUs the process may use (its affinity mask, and the cgroup
    /// quota as the standard library reads it), so `taskset -c 0-7
    /// uascale serve` uses eight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<usize>,
    /// Threads for the asymmetric work of secured OpenSecureChannel
    /// requests (`crypto_threads`, at most [`MAX_CRYPTO_THREADS`]), started
    /// with the server. Default 0: the work runs in place, on the worker
    /// that read the request, one job per worker at a time and what
    /// became ready meanwhile before the next; a handshake is two jobs
    /// (receiving the request, answering it), so a publish arriving
    /// during one waits for at most that. On threads (1 or more) the
    /// kernel lets a worker with input preempt them, for a handoff and
    /// those preemptions: several context switches per handshake more
    /// (docs/notebook/benchmarks.md, "RSA in place or on crypto threads" and what
    /// follows it).
    pub crypto_threads: usize,
}

/// The most `runtime.crypto_threads` accepted.
pub const MAX_CRYPTO_THREADS: usize = 1024;

/// `[[users]]`: one account for UserName tokens. Both keys are required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The user name (`name`), unique.
    pub name: String,
    /// The password's argon2 PHC hash (`password_hash`, from `uascale user
    /// hash`); plain-text passwords are never accepted.
    pub password_hash: String,
}

impl UserConfig {
    /// A user entry (checked by [`ServerConfig::validate`]).
    pub fn new(name: &str, password_hash: &str) -> Self {
        UserConfig {
            name: name.to_owned(),
            password_hash: password_hash.to_owned(),
        }
    }

    /// The account, with its hash checked.
    pub fn account(&self) -> Result<UserAccount, &'static str> {
        UserAccount::new(&self.name, &self.password_hash)
    }
}

/// A configuration value out of range, named by its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// `section.key` as in the file (`limits.receive_buffer_size`,
    /// `users[0].name`), or the section when no one key is at fault.
    pub key: String,
    /// The value, as the file writes it, when one value is at fault.
    pub value: Option<String>,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{} = {v}: {}", self.key, self.problem),
            None => write!(f, "{}: {}", self.key, self.problem),
        }
    }
}

impl std::error::Error for ConfigError {}

fn fail<T>(key: &str, value: impl std::fmt::Display, problem: &str) -> Result<T, ConfigError> {
    Err(ConfigError {
        key: key.to_owned(),
        value: Some(value.to_string()),
        problem: problem.to_owned(),
    })
}

fn at_least(key: &str, value: u64, min: u64) -> Result<(), ConfigError> {
    if value < min {
        let problem = if min == 1 {
            "must be greater than 0".to_owned()
        } else {
            format!("must be at least {min}")
        };
        return fail(key, value, &problem);
    }
    Ok(())
}

fn positive_ms(key: &str, d: Duration) -> Result<(), ConfigError> {
    at_least(key, millis::of(d), 1)
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl ServerConfig {
    /// The endpoint URL clients connect to.
    pub fn endpoint_url(&self) -> String {
        format!("opc.tcp://{}:{}", self.server.host_name, self.server.port)
    }

    /// The configuration with every derived default filled in (the
    /// `Option`s of `[admission]` and `[runtime]` that are `None`), with
    /// `cpus` the CPUs the process may use
    /// ([`crate::admission::host::usable_cpus`]). What is printed and
    /// logged; resolving twice changes nothing.
    pub fn resolved(&self, cpus: usize) -> ServerConfig {
        let mut c = self.clone();
        c.admission = self.admission.resolved(self.server.max_session_count, cpus);
        if self.cluster.url.is_some() && self.admission.max_concurrent_handshakes.is_none() {
            c.admission.max_concurrent_handshakes =
                Some(AdmissionSection::cluster_handshakes_default(cpus));
        }
        c.requests = self.requests.resolved(
            self.server.max_session_count,
            self.subscriptions.max_publish_request_count,
        );
        c.runtime.worker_threads = Some(self.runtime.worker_threads.unwrap_or(cpus.max(1)));
        c.quotas = self.quotas.resolved(std::path::Path::new("/"));
        c
    }

    /// Checks every range the types do not: the first value out of range,
    /// named by its key (`limits.receive_buffer_size = 100: must be at
    /// least 8192`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive_ms(
            "server.activation_deadline_ms",
            self.server.activation_deadline,
        )?;

        let l = &self.limits;
        at_least(
            "limits.receive_buffer_size",
            l.receive_buffer_size.into(),
            8192,
        )?;
        at_least("limits.send_buffer_size", l.send_buffer_size.into(), 8192)?;
        positive_ms("limits.handshake_timeout_ms", l.handshake_timeout)?;
        positive_ms("limits.min_token_lifetime_ms", l.min_token_lifetime)?;
        positive_ms("limits.max_token_lifetime_ms", l.max_token_lifetime)?;
        if l.min_token_lifetime > l.max_token_lifetime {
            return fail(
                "limits.min_token_lifetime_ms",
                millis::of(l.min_token_lifetime),
                "must not exceed limits.max_token_lifetime_ms",
            );
        }
        if l.reassembly_unactivated_percent > 100 {
            return fail(
                "limits.reassembly_unactivated_percent",
                l.reassembly_unactivated_percent,
                "must be 0..=100",
            );
        }
        positive_ms("limits.assembly_deadline_ms", l.assembly_deadline)?;

        let o = &self.operation_limits;
        for (key, v) in [
            ("max_nodes_per_read", o.max_nodes_per_read),
            ("max_nodes_per_write", o.max_nodes_per_write),
            ("max_nodes_per_method_call", o.max_nodes_per_method_call),
            ("max_nodes_per_browse", o.max_nodes_per_browse),
            (
                "max_nodes_per_register_nodes",
                o.max_nodes_per_register_nodes,
            ),
            (
                "max_nodes_per_translate_browse_paths_to_node_ids",
                o.max_nodes_per_translate_browse_paths_to_node_ids,
            ),
            ("max_references_per_node", o.max_references_per_node),
            (
                "max_browse_continuation_points",
                o.max_browse_continuation_points.into(),
            ),
        ] {
            at_least(&format!("operation_limits.{key}"), count(v), 1)?;
        }

        positive_ms("demo.rate_ms", self.demo.rate)?;

        self.validate_security()?;
        self.validate_subscriptions()?;
        let p = self.quotas.memory_budget_percent;
        if !(1..=100).contains(&p) {
            return fail("quotas.memory_budget_percent", p, "must be 1..=100");
        }
        self.validate_admission()?;
        self.validate_requests()?;
        self.validate_https()?;
        self.validate_cluster()
    }

    fn validate_https(&self) -> Result<(), ConfigError> {
        let h = &self.https;
        if h.certificate.is_some() != h.private_key.is_some() {
            return fail(
                if h.certificate.is_some() {
                    "https.private_key"
                } else {
                    "https.certificate"
                },
                "unset",
                "https.certificate and https.private_key go together",
            );
        }
        at_least("https.max_connections", count(h.max_connections), 1)?;
        at_least("https.max_body_size", count(h.max_body_size), 1024)?;
        positive_ms("https.idle_timeout_ms", h.idle_timeout)?;
        at_least("https.max_streams", u64::from(h.max_streams), 1)?;
        for (key, v) in [
            ("https.session_rate", h.session_rate),
            ("https.session_burst", h.session_burst),
            ("https.address_rate", h.address_rate),
            ("https.address_burst", h.address_burst),
        ] {
            at_least(key, u64::from(v), 1)?;
        }
        Ok(())
    }

    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if let Some(url) = &c.url {
            let rest = url.strip_prefix("nats://").unwrap_or("");
            let (host, port) = rest.rsplit_once(':').unwrap_or(("", ""));
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return fail(
                    "cluster.url",
                    format!("{url:?}"),
                    "must be nats://HOST:PORT",
                );
            }
        }
        if let Some(id) = &c.node_id {
            let ok = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-';
            if id.is_empty() || id.len() > 64 || !id.chars().all(ok) {
                return fail(
                    "cluster.node_id",
                    format!("{id:?}"),
                    "must be 1-64 characters of A-Z a-z 0-9 _ -",
                );
            }
        }
        if let Some(u) = &c.endpoint_url {
            let rest = u.strip_prefix("opc.tcp://").unwrap_or("");
            if rest.is_empty() || !rest.contains(':') {
                return fail(
                    "cluster.endpoint_url",
                    format!("{u:?}"),
                    "must be opc.tcp://HOST:PORT",
                );
            }
        }
        if c.node_index == Some(0) {
            return fail("cluster.node_index", 0, "must be 1..=255");
        }
        positive_ms("cluster.heartbeat_ms", c.heartbeat)?;
        if c.lease < c.heartbeat * 2 {
            return fail(
                "cluster.lease_ms",
                millis::of(c.lease),
                "must be at least twice cluster.heartbeat_ms",
            );
        }
        if !(1..=5).contains(&c.replicas) {
            return fail("cluster.replicas", c.replicas, "must be 1..=5");
        }
        Ok(())
    }

    fn validate_requests(&self) -> Result<(), ConfigError> {
        let r = &self.requests;
        at_least(
            "requests.min_request_thread_count",
            count(r.min_request_thread_count),
            1,
        )?;
        if r.max_request_thread_count < r.min_request_thread_count {
            return fail(
                "requests.max_request_thread_count",
                r.max_request_thread_count,
                "must be at least requests.min_request_thread_count",
            );
        }
        at_least(
            "requests.max_queued_requests_per_owner",
            count(r.max_queued_requests_per_owner),
            1,
        )?;
        at_least(
            "requests.max_retained_request_bytes",
            count(r.max_retained_request_bytes),
            1,
        )?;
        at_least("requests.trusted_weight", r.trusted_weight.into(), 1)?;
        if let Some(n) = r.max_parked_request_count {
            at_least("requests.max_parked_request_count", count(n), 1)?;
        }
        let queued = r.max_queued_request_count.max(RequestsSection::MIN_QUEUED);
        if r.trusted_reserved_request_count >= queued {
            return fail(
                "requests.trusted_reserved_request_count",
                r.trusted_reserved_request_count,
                "must be less than requests.max_queued_request_count",
            );
        }
        for (i, owner) in r.trusted_owners.iter().enumerate() {
            if owner.trim().is_empty() {
                return fail(
                    &format!("requests.trusted_owners[{i}]"),
                    format!("{owner:?}"),
                    "must not be empty",
                );
            }
        }
        Ok(())
    }

    fn validate_admission(&self) -> Result<(), ConfigError> {
        let a = &self.admission;
        at_least(
            "admission.connections_per_second",
            a.connections_per_second.into(),
            1,
        )?;
        at_least("admission.connection_burst", a.connection_burst.into(), 1)?;
        for (key, value, global, global_key) in [
            (
                "connections_per_second_per_address",
                a.connections_per_second_per_address,
                a.connections_per_second,
                "connections_per_second",
            ),
            (
                "connection_burst_per_address",
                a.connection_burst_per_address,
                a.connection_burst,
                "connection_burst",
            ),
        ] {
            // None is derived, and a derived value is within range.
            let Some(v) = value else { continue };
            let key = format!("admission.{key}");
            at_least(&key, v.into(), 1)?;
            if v > global {
                return fail(
                    &key,
                    v,
                    &format!("must not exceed admission.{global_key} ({global})"),
                );
            }
        }
        for (key, value) in [
            ("max_concurrent_handshakes", a.max_concurrent_handshakes),
            ("max_channel_count", a.max_channel_count),
            (
                "max_concurrent_session_establishment",
                a.max_concurrent_session_establishment,
            ),
        ] {
            if let Some(v) = value {
                at_least(&format!("admission.{key}"), count(v), 1)?;
            }
        }
        at_least(
            "admission.max_unfinished_handshakes_per_address",
            a.max_unfinished_handshakes_per_address.into(),
            1,
        )?;
        if let Some(n) = self.runtime.worker_threads {
            at_least("runtime.worker_threads", count(n), 1)?;
        }
        let n = self.runtime.crypto_threads;
        if n > MAX_CRYPTO_THREADS {
            return fail(
                "runtime.crypto_threads",
                n,
                &format!("must be at most {MAX_CRYPTO_THREADS}"),
            );
        }
        Ok(())
    }

    fn validate_security(&self) -> Result<(), ConfigError> {
        let s = &self.security;
        if s.pki_dir.as_os_str().is_empty() {
            return fail("security.pki_dir", "\"\"", "must not be empty");
        }
        if let Some(p) = s.policies.iter().find(|p| p.is_none()) {
            return fail(
                "security.policies",
                format!("[{:?}]", policy_names::name(*p)),
                "None is not a policy here (it is allow_security_none)",
            );
        }
        if let Some(m) = s.modes.iter().find(|m| {
            **m != MessageSecurityMode::Sign && **m != MessageSecurityMode::SignAndEncrypt
        }) {
            return fail(
                "security.modes",
                format!("[{:?}]", mode_names::name(*m)),
                "is not Sign or SignAndEncrypt",
            );
        }
        positive_ms("security.pki_reload_interval_ms", s.pki_reload_interval)?;
        if s.endpoints().is_empty() {
            return Err(ConfigError {
                key: "security".into(),
                value: None,
                problem: "no endpoint left (policies or modes empty and \
                          allow_security_none = false)"
                    .into(),
            });
        }
        for (i, a) in self.server.admin_users.iter().enumerate() {
            let key = format!("server.admin_users[{i}]");
            match a.strip_prefix("x509:") {
                Some(t) if t.len() != 40 || !t.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    return fail(
                        &key,
                        format!("{a:?}"),
                        "an X509 user is x509: and 40 hex digits (its SHA-1 thumbprint)",
                    );
                }
                Some(_) => {}
                None if !self.users.iter().any(|u| &u.name == a) => {
                    return fail(&key, format!("{a:?}"), "names no [[users]] account");
                }
                None => {}
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, u) in self.users.iter().enumerate() {
            if !names.insert(u.name.as_str()) {
                return fail(
                    &format!("users[{i}].name"),
                    format!("{:?}", u.name),
                    "appears twice",
                );
            }
            if let Err(e) = u.account() {
                let key = if u.name.is_empty() {
                    "name"
                } else {
                    "password_hash"
                };
                return Err(ConfigError {
                    key: format!("users[{i}].{key}"),
                    value: None,
                    problem: e.into(),
                });
            }
        }
        Ok(())
    }

    fn validate_subscriptions(&self) -> Result<(), ConfigError> {
        let s = &self.subscriptions;
        positive_ms(
            "subscriptions.min_publishing_interval_ms",
            s.min_publishing_interval,
        )?;
        positive_ms(
            "subscriptions.max_publishing_interval_ms",
            s.max_publishing_interval,
        )?;
        if s.min_publishing_interval > s.max_publishing_interval {
            return fail(
                "subscriptions.min_publishing_interval_ms",
                millis::of(s.min_publishing_interval),
                "must not exceed subscriptions.max_publishing_interval_ms",
            );
        }
        at_least(
            "subscriptions.max_keep_alive_count",
            s.max_keep_alive_count.into(),
            1,
        )?;
        at_least(
            "subscriptions.max_lifetime_count",
            s.max_lifetime_count.into(),
            3,
        )?;
        at_least(
            "subscriptions.max_publish_request_count",
            count(s.max_publish_request_count),
            1,
        )?;
        positive_ms(
            "subscriptions.min_sampling_interval_ms",
            s.min_sampling_interval,
        )?;
        if s.timer_resolution > Duration::from_secs(1) {
            return fail(
                "subscriptions.timer_resolution_ms",
                millis::of(s.timer_resolution),
                "must be at most 1000",
            );
        }
        at_least("subscriptions.max_queue_size", s.max_queue_size.into(), 1)?;
        at_least(
            "subscriptions.default_event_queue_size",
            s.default_event_queue_size.into(),
            1,
        )?;
        at_least(
            "subscriptions.max_monitored_items_per_call",
            count(s.max_monitored_items_per_call),
            1,
        )
    }
}

/// A `Duration` as whole milliseconds (`#[serde(with = "millis")]`), for
/// the keys ending in `_ms`.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// `d` in whole milliseconds, at most what a TOML integer holds.
    pub fn of(d: Duration) -> u64 {
        u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX)
            .min(i64::MAX as u64)
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(of(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Security policies by the name their URI ends with (`"Basic256Sha256"`);
/// the full URI is read too.
mod policy_names {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use uascale_crypto::policy::SecurityPolicy;

    pub fn name(p: SecurityPolicy) -> &'static str {
        p.uri().rsplit('#').next().unwrap_or(p.uri())
    }

    pub fn serialize<S: Serializer>(v: &[SecurityPolicy], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|p| name(*p)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SecurityPolicy>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|n| {
                SecurityPolicy::from_uri(n)
                    .or_else(|| {
                        SecurityPolicy::from_uri(&format!(
                            "http://opcfoundation.org/UA/SecurityPolicy#{n}"
                        ))
                    })
                    .filter(|p| !p.is_none())
                    .ok_or_else(|| {
                        D::Error::custom(format!(
                            "security.policies: {n:?} is not one of Basic256Sha256, \
                             Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss, ECC_nistP256, \
                             ECC_nistP384, ECC_curve25519, ECC_nistP256_AesGcm, \
                             ECC_nistP256_ChaChaPoly (None is allow_security_none)"
                        ))
                    })
            })
            .collect()
    }
}

/// Message security modes by name (`"Sign"`, `"SignAndEncrypt"`).
mod mode_names {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use uascale_types::MessageSecurityMode;

    pub fn name(m: MessageSecurityMode) -> String {
        m.name().map_or_else(|| m.0.to_string(), str::to_owned)
    }

    pub fn serialize<S: Serializer>(v: &[MessageSecurityMode], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|m| name(*m)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<MessageSecurityMode>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|n| match n.as_str() {
                "Sign" => Ok(MessageSecurityMode::Sign),
                "SignAndEncrypt" => Ok(MessageSecurityMode::SignAndEncrypt),
                _ => Err(D::Error::custom(format!(
                    "security.modes: {n:?} is not Sign or SignAndEncrypt"
                ))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_admission_defaults_resolve() {
        let c = ServerConfig::default();
        assert_eq!(c.admission.max_channel_count, None);
        let r = c.resolved(4);
        let a = &r.admission;
        assert_eq!(a.connections_per_second_per_address, Some(625));
        assert_eq!(a.connection_burst_per_address, Some(625));
        assert_eq!(a.max_concurrent_handshakes, Some(8));
        assert_eq!(a.max_channel_count, Some(22_000));
        assert_eq!(a.max_concurrent_session_establishment, Some(128));
        assert_eq!(r.runtime.worker_threads, Some(4));
        assert_eq!(r.runtime.crypto_threads, 0, "in place");
        // 8 x CPUs wins over 128 on larger machines.
        let big = c.resolved(32);
        assert_eq!(
            big.admission.max_concurrent_session_establishment,
            Some(256)
        );
        assert_eq!(big.admission.max_concurrent_handshakes, Some(64));
        // A cluster node expects its peers' clients in a failover: 8 x
        // CPUs, unless set.
        let mut node = ServerConfig::default();
        node.cluster.url = Some("nats://127.0.0.1:4222".into());
        assert_eq!(
            node.resolved(2).admission.max_concurrent_handshakes,
            Some(16)
        );
        node.admission.max_concurrent_handshakes = Some(5);
        assert_eq!(
            node.resolved(2).admission.max_concurrent_handshakes,
            Some(5)
        );
        // Rounded up, and at least 1 per address.
        let mut small = ServerConfig::default();
        small.server.max_session_count = 7;
        small.admission.connections_per_second = 3;
        let s = small.resolved(1);
        assert_eq!(s.admission.max_channel_count, Some(8));
        assert_eq!(s.admission.connections_per_second_per_address, Some(1));
        // Set values are kept; resolving twice changes nothing.
        let mut set = ServerConfig::default();
        set.admission.max_channel_count = Some(5);
        set.runtime.worker_threads = Some(3);
        set.runtime.crypto_threads = 2;
        let once = set.resolved(16);
        assert_eq!(once.admission.max_channel_count, Some(5));
        assert_eq!(once.runtime.worker_threads, Some(3));
        assert_eq!(once.runtime.crypto_threads, 2);
        assert_eq!(once.resolved(2), once);
        once.validate().unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn cluster_keys_are_checked_with_their_names() {
        let check = |f: &dyn Fn(&mut ClusterSection)| {
            let mut c = ServerConfig::default();
            f(&mut c.cluster);
            c.validate().err().map(|e| e.key)
        };
        assert_eq!(check(&|_| {}), None, "off by default");
        assert_eq!(
            check(&|c| c.url = Some("nats://127.0.0.1:4222".into())),
            None
        );
        for bad in [
            "127.0.0.1:4222",
            "nats://host",
            "nats://:4222",
            "nats://h:0",
            "nats://h:x",
        ] {
            assert_eq!(
                check(&|c| c.url = Some(bad.into())).as_deref(),
                Some("cluster.url"),
                "{bad}"
            );
        }
        for bad in ["", "a b", "n.1", &"x".repeat(65)] {
            assert_eq!(
                check(&|c| c.node_id = Some(bad.into())).as_deref(),
                Some("cluster.node_id"),
                "{bad:?}"
            );
        }
        assert_eq!(
            check(&|c| c.node_index = Some(0)).as_deref(),
            Some("cluster.node_index")
        );
        assert_eq!(
            check(&|c| c.endpoint_url = Some("front:4840".into())).as_deref(),
            Some("cluster.endpoint_url")
        );
        assert_eq!(
            check(&|c| c.lease = c.heartbeat).as_deref(),
            Some("cluster.lease_ms")
        );
        assert_eq!(
            check(&|c| c.heartbeat = Duration::ZERO).as_deref(),
            Some("cluster.heartbeat_ms")
        );
        assert_eq!(
            check(&|c| c.replicas = 0).as_deref(),
            Some("cluster.replicas")
        );
        // The derived node index is 1..=255 and stable.
        let c = ClusterSection::default();
        let i = c.node_index_or("n1");
        assert!(i >= 1);
        assert_eq!(i, c.node_index_or("n1"));
        assert_eq!(c.node_id_or(4841), "node-4841");
    }

    #[test]
    fn admission_ranges_name_the_key() {
        let check = |f: &dyn Fn(&mut ServerConfig)| {
            let mut c = ServerConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert_eq!(
            check(&|c| c.admission.connections_per_second = 0),
            "admission.connections_per_second = 0: must be greater than 0"
        );
        assert!(check(&|c| c.admission.connection_burst = 0).contains("admission.connection_burst"));
        assert_eq!(
            check(&|c| c.admission.connections_per_second_per_address = Some(5001)),
            "admission.connections_per_second_per_address = 5001: must not exceed \
             admission.connections_per_second (5000)"
        );
        assert!(
            check(&|c| c.admission.connection_burst_per_address = Some(0))
                .contains("admission.connection_burst_per_address = 0")
        );
        assert!(check(&|c| c.admission.max_concurrent_handshakes = Some(0))
            .contains("admission.max_concurrent_handshakes"));
        assert!(check(&|c| c.admission.max_channel_count = Some(0))
            .contains("admission.max_channel_count"));
        assert!(
            check(&|c| c.admission.max_concurrent_session_establishment = Some(0))
                .contains("admission.max_concurrent_session_establishment")
        );
        assert!(
            check(&|c| c.admission.max_unfinished_handshakes_per_address = 0)
                .contains("admission.max_unfinished_handshakes_per_address")
        );
        assert!(check(&|c| c.runtime.worker_threads = Some(0)).contains("runtime.worker_threads"));
        assert!(
            check(&|c| c.runtime.crypto_threads = MAX_CRYPTO_THREADS + 1)
                .contains("runtime.crypto_threads")
        );
        // Zero is meaningful for these three.
        let mut c = ServerConfig::default();
        c.admission.session_establishment_queue_limit = 0;
        c.admission.open_files_headroom = 0;
        c.runtime.crypto_threads = 0;
        c.validate().unwrap();
        c.runtime.crypto_threads = MAX_CRYPTO_THREADS;
        c.validate().unwrap();
    }
}
