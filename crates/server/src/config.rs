//! Server configuration: plain structs with documented defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use uascale_crypto::policy::SecurityPolicy;
use uascale_proto::ChannelConfig;
use uascale_types::MessageSecurityMode;

use crate::identity::UserAccount;
use crate::pki::PkiOptions;

/// What the server is and where it listens.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind. Default `0.0.0.0:4840`, the IANA port for opc.tcp.
    pub bind: SocketAddr,
    /// Host name published in endpoint URLs. Default `localhost`.
    pub host_name: String,
    /// The server's ApplicationUri. Default `urn:uascale:server`.
    pub application_uri: String,
    /// ProductUri. Default `urn:uascale`.
    pub product_uri: String,
    /// ApplicationName. Default `uascale`.
    pub application_name: String,
    /// Pending accepts the kernel keeps (SCALABILITY.md §2 `listen_backlog`).
    /// Default 512: tokio's 128 is too small for connect bursts; the kernel
    /// caps it at `somaxconn` (4096 here).
    pub listen_backlog: u32,
    /// Protocol limits and timers of every connection.
    pub channel: ChannelConfig,
    /// Bytes of incomplete chunked messages kept across all connections.
    /// Default 64 MiB.
    pub reassembly_budget: usize,
    /// Percent of that budget channels without an activated session may use.
    /// Default 50.
    pub reassembly_unactivated_percent: u8,
    /// Most open sessions (`max_session_count`); over it CreateSession
    /// answers `BadTooManySessions`. Default 20,000: about what one process
    /// can hold connections for here (20,000 open files).
    pub max_session_count: usize,
    /// A session not activated this long after CreateSession is closed
    /// (SCALABILITY.md "no orphans"). Default 10 s.
    pub activation_deadline: std::time::Duration,
    /// Changing demo nodes under `Demo.Load` (`uascale serve --nodes N`).
    /// Default 0.
    pub demo_nodes: usize,
    /// How often the demo's dynamic values change. Default 1 s.
    pub demo_rate: std::time::Duration,
    /// Subscription and monitored-item limits (SCALABILITY.md §4).
    pub subscriptions: crate::subscription::SubscriptionLimits,
    /// The diagnostics arrays of the Server object (`diagnostics_enabled`,
    /// SCALABILITY.md §5): rebuilt when read, at most once a second; with
    /// false they read `BadOutOfService` and cost nothing. Default true.
    pub diagnostics_enabled: bool,
    /// Raise the Part 5 audit events of session establishment
    /// (AuditCreateSession, AuditActivateSession, AuditSession for close)
    /// on the Server object; the Server's `Auditing` variable reads this.
    /// Default false (then nothing is built or raised).
    pub auditing: bool,
    /// Companion NodeSet2 XML files loaded at start, in order (`--nodeset`,
    /// [`crate::nodeset`]). Default none.
    pub nodesets: Vec<std::path::PathBuf>,
    /// Security policies, certificates and user identity.
    pub security: SecurityConfig,
}

/// Endpoint security, the PKI and user authentication.
#[derive(Debug, Clone)]
pub struct SecurityConfig {
    /// The PKI directory (own/, trusted/, issuers/, rejected/). Default
    /// `pki`, relative to the working directory.
    pub pki_dir: PathBuf,
    /// Security policies published, each with every mode of `modes`.
    /// Default: Basic256Sha256, Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss.
    pub policies: Vec<SecurityPolicy>,
    /// Message security modes published for each policy. Default Sign and
    /// SignAndEncrypt.
    pub modes: Vec<MessageSecurityMode>,
    /// Also publish the unsecured None/None endpoint. Unsafe: traffic and
    /// identity are unprotected. Default true while the secured endpoints
    /// are being brought up in the server, so existing deployments and
    /// tools keep working; set false in production.
    pub allow_security_none: bool,
    /// Validation and rejected-store options (including
    /// `trust_all_client_certificates`, default false).
    pub pki: PkiOptions,
    /// Offer the Anonymous user token. Default true.
    pub allow_anonymous: bool,
    /// Users for UserName tokens (argon2 hashes). Default none: UserName
    /// tokens are not offered.
    pub users: Vec<UserAccount>,
    /// Failed activations per client within a minute before a five-minute
    /// lockout (SCALABILITY.md §2). Default 5; 0 disables.
    pub max_failed_authentication_attempts: u32,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            pki_dir: PathBuf::from("pki"),
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
            pki: PkiOptions::default(),
            allow_anonymous: true,
            users: Vec::new(),
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: SocketAddr::from(([0, 0, 0, 0], 4840)),
            host_name: "localhost".into(),
            application_uri: "urn:uascale:server".into(),
            product_uri: "urn:uascale".into(),
            application_name: "uascale".into(),
            listen_backlog: 512,
            channel: ChannelConfig::default(),
            reassembly_budget: 64 << 20,
            reassembly_unactivated_percent: 50,
            max_session_count: 20_000,
            activation_deadline: std::time::Duration::from_secs(10),
            demo_nodes: 0,
            demo_rate: std::time::Duration::from_secs(1),
            subscriptions: crate::subscription::SubscriptionLimits::default(),
            diagnostics_enabled: true,
            auditing: false,
            nodesets: Vec::new(),
            security: SecurityConfig::default(),
        }
    }
}

impl ServerConfig {
    /// The endpoint URL clients connect to.
    pub fn endpoint_url(&self) -> String {
        format!("opc.tcp://{}:{}", self.host_name, self.bind.port())
    }
}
