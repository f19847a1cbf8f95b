//! The TOML configuration file of `uascale serve` (`--config FILE`) and
//! `--print-config`. Every key is optional; what is absent keeps the
//! default documented on `ServerConfig`. Unknown keys are errors that name
//! the key.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uascale_crypto::policy::SecurityPolicy;
use uascale_server::identity::UserAccount;
use uascale_server::ServerConfig;
use uascale_types::MessageSecurityMode;

/// `[server]`
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// IP address to bind.
    pub bind: Option<IpAddr>,
    /// TCP port.
    pub port: Option<u16>,
    /// Host name in endpoint URLs.
    pub host_name: Option<String>,
    /// ApplicationUri.
    pub application_uri: Option<String>,
    /// ProductUri.
    pub product_uri: Option<String>,
    /// ApplicationName.
    pub application_name: Option<String>,
    /// Most open sessions.
    pub max_session_count: Option<usize>,
    /// Time to activate a created session, ms.
    pub activation_deadline_ms: Option<u64>,
    /// Keep the Server object's diagnostics arrays.
    pub diagnostics_enabled: Option<bool>,
    /// Raise the audit events of session establishment.
    pub auditing: Option<bool>,
    /// Companion NodeSet2 XML files loaded at start, in order.
    pub nodesets: Option<Vec<std::path::PathBuf>>,
}

/// `[limits]`
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Kernel listen backlog.
    pub listen_backlog: Option<u32>,
    /// Largest chunk received, bytes (>= 8192).
    pub receive_buffer_size: Option<u32>,
    /// Largest chunk sent, bytes (>= 8192).
    pub send_buffer_size: Option<u32>,
    /// Largest request message, bytes; 0 = no limit.
    pub max_message_size: Option<u32>,
    /// Most chunks per request; 0 = no limit.
    pub max_chunk_count: Option<u32>,
    /// Time for HEL and OPN after accept, ms.
    pub handshake_timeout_ms: Option<u64>,
    /// Lower bound of the revised token lifetime, ms.
    pub min_token_lifetime_ms: Option<u64>,
    /// Upper bound of the revised token lifetime, ms.
    pub max_token_lifetime_ms: Option<u64>,
    /// Bytes of incomplete chunked messages kept across connections.
    pub reassembly_budget: Option<usize>,
    /// Percent of that budget channels without a session may use.
    pub reassembly_unactivated_percent: Option<u8>,
    /// Time from a message's first chunk to its last, ms.
    pub assembly_deadline_ms: Option<u64>,
    /// Largest String in a request, bytes.
    pub max_string_length: Option<usize>,
    /// Largest ByteString in a request, bytes.
    pub max_byte_string_length: Option<usize>,
    /// Most elements of an array in a request.
    pub max_array_length: Option<usize>,
}

/// `[demo]`
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSection {
    /// Changing load-test nodes.
    pub nodes: Option<usize>,
    /// Period of the demo's changing values, ms.
    pub rate_ms: Option<u64>,
}

/// `[security]`
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SecuritySection {
    /// The PKI directory.
    pub pki_dir: Option<String>,
    /// Security policies published (names as in the policy URIs, e.g.
    /// "Basic256Sha256", or the full URIs).
    pub policies: Option<Vec<String>>,
    /// Modes published for each policy: "Sign", "SignAndEncrypt".
    pub modes: Option<Vec<String>>,
    /// Also publish the unsecured None endpoint.
    pub allow_security_none: Option<bool>,
    /// Accept every client certificate (unsafe).
    pub trust_all_client_certificates: Option<bool>,
    /// Reject CA-issued certificates whose CA has no CRL.
    pub reject_unknown_revocation_status: Option<bool>,
    /// Most files kept in rejected/certs.
    pub max_rejected_certificates: Option<usize>,
    /// How often the PKI directory is checked for changes, ms.
    pub pki_reload_interval_ms: Option<u64>,
    /// Offer the Anonymous user token.
    pub allow_anonymous: Option<bool>,
    /// Failed activations per client within a minute before a lockout; 0 = off.
    pub max_failed_authentication_attempts: Option<u32>,
}

/// `[[users]]`
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// User name.
    pub name: String,
    /// argon2 PHC hash (`uascale user hash`).
    pub password_hash: String,
}

/// A policy by its short name or URI.
fn policy_named(name: &str) -> Option<SecurityPolicy> {
    SecurityPolicy::from_uri(name).or_else(|| {
        SecurityPolicy::from_uri(&format!(
            "http://opcfoundation.org/UA/SecurityPolicy#{name}"
        ))
    })
}

fn policy_name(p: SecurityPolicy) -> String {
    p.uri().rsplit('#').next().unwrap_or(p.uri()).to_owned()
}

fn mode_named(name: &str) -> Option<MessageSecurityMode> {
    match name {
        "Sign" => Some(MessageSecurityMode::Sign),
        "SignAndEncrypt" => Some(MessageSecurityMode::SignAndEncrypt),
        _ => None,
    }
}

/// `[subscriptions]` (SCALABILITY.md §4).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionsSection {
    /// Fastest publishing interval, ms.
    pub min_publishing_interval_ms: Option<u64>,
    /// Slowest publishing interval, ms.
    pub max_publishing_interval_ms: Option<u64>,
    /// Largest keep-alive count.
    pub max_keep_alive_count: Option<u32>,
    /// Largest lifetime count.
    pub max_lifetime_count: Option<u32>,
    /// Notifications per Publish response; 0 = no limit.
    pub max_notifications_per_publish: Option<u32>,
    /// Publish requests a session may have parked.
    pub max_publish_request_count: Option<usize>,
    /// Messages kept per subscription for Republish.
    pub max_retransmission_queue: Option<usize>,
    /// Fastest sampling interval of sampled items, ms.
    pub min_sampling_interval_ms: Option<u64>,
    /// Largest monitored-item queue.
    pub max_queue_size: Option<u32>,
    /// Subscriptions in the server; 0 = no limit.
    pub max_subscription_count: Option<usize>,
    /// Monitored items in the server; 0 = no limit.
    pub max_monitored_item_count: Option<usize>,
    /// Monitored items per subscription; 0 = no limit.
    pub max_monitored_items_per_subscription: Option<usize>,
    /// Monitored items per Create/Modify/Delete/SetMonitoringMode call.
    pub max_monitored_items_per_call: Option<usize>,
}

/// The whole file.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[server]`
    #[serde(default)]
    pub server: ServerSection,
    /// `[limits]`
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[demo]`
    #[serde(default)]
    pub demo: DemoSection,
    /// `[security]`
    #[serde(default)]
    pub security: SecuritySection,
    /// `[[users]]`
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserEntry>,
    /// `[subscriptions]`
    #[serde(default)]
    pub subscriptions: SubscriptionsSection,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn positive(name: &str, v: u64) -> Result<u64, String> {
    if v == 0 {
        Err(format!("{name} must be greater than 0"))
    } else {
        Ok(v)
    }
}

impl FileConfig {
    /// Parses a file's text; errors name the key and line.
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Applies what the file sets onto `c`, checking ranges.
    pub fn apply(&self, c: &mut ServerConfig) -> Result<(), String> {
        let s = &self.server;
        if let Some(v) = s.bind {
            c.bind = SocketAddr::new(v, c.bind.port());
        }
        if let Some(v) = s.port {
            c.bind.set_port(v);
        }
        if let Some(v) = &s.host_name {
            c.host_name = v.clone();
        }
        if let Some(v) = &s.application_uri {
            c.application_uri = v.clone();
        }
        if let Some(v) = &s.product_uri {
            c.product_uri = v.clone();
        }
        if let Some(v) = &s.application_name {
            c.application_name = v.clone();
        }
        if let Some(v) = s.max_session_count {
            c.max_session_count = v;
        }
        if let Some(v) = &s.nodesets {
            c.nodesets = v.clone();
        }
        if let Some(v) = s.activation_deadline_ms {
            c.activation_deadline = ms(positive("server.activation_deadline_ms", v)?);
        }
        if let Some(v) = s.diagnostics_enabled {
            c.diagnostics_enabled = v;
        }
        if let Some(v) = s.auditing {
            c.auditing = v;
        }
        let l = &self.limits;
        if let Some(v) = l.listen_backlog {
            c.listen_backlog = v;
        }
        for (name, v, field) in [
            (
                "limits.receive_buffer_size",
                l.receive_buffer_size,
                &mut c.channel.transport.receive_buffer_size,
            ),
            (
                "limits.send_buffer_size",
                l.send_buffer_size,
                &mut c.channel.transport.send_buffer_size,
            ),
        ] {
            if let Some(v) = v {
                if v < 8192 {
                    return Err(format!("{name} = {v}: must be at least 8192"));
                }
                *field = v;
            }
        }
        if let Some(v) = l.max_message_size {
            c.channel.transport.max_message_size = v;
            c.channel.assembly.max_message_size = (v != 0).then_some(v as usize);
            if v != 0 {
                c.channel.decode.max_message_size = v as usize;
            }
        }
        if let Some(v) = l.max_chunk_count {
            c.channel.transport.max_chunk_count = v;
            c.channel.assembly.max_chunk_count = (v != 0).then_some(v);
        }
        if let Some(v) = l.handshake_timeout_ms {
            c.channel.handshake_timeout = ms(positive("limits.handshake_timeout_ms", v)?);
        }
        if let Some(v) = l.min_token_lifetime_ms {
            c.channel.min_token_lifetime = ms(positive("limits.min_token_lifetime_ms", v)?);
        }
        if let Some(v) = l.max_token_lifetime_ms {
            c.channel.max_token_lifetime = ms(positive("limits.max_token_lifetime_ms", v)?);
        }
        if c.channel.min_token_lifetime > c.channel.max_token_lifetime {
            return Err(
                "limits.min_token_lifetime_ms must not exceed limits.max_token_lifetime_ms".into(),
            );
        }
        if let Some(v) = l.reassembly_budget {
            c.reassembly_budget = v;
        }
        if let Some(v) = l.reassembly_unactivated_percent {
            if v > 100 {
                return Err(format!(
                    "limits.reassembly_unactivated_percent = {v}: must be 0..=100"
                ));
            }
            c.reassembly_unactivated_percent = v;
        }
        if let Some(v) = l.assembly_deadline_ms {
            c.channel.assembly.deadline = ms(positive("limits.assembly_deadline_ms", v)?);
        }
        if let Some(v) = l.max_string_length {
            c.channel.decode.max_string_length = v;
        }
        if let Some(v) = l.max_byte_string_length {
            c.channel.decode.max_byte_string_length = v;
        }
        if let Some(v) = l.max_array_length {
            c.channel.decode.max_array_length = v;
        }
        if let Some(v) = self.demo.nodes {
            c.demo_nodes = v;
        }
        if let Some(v) = self.demo.rate_ms {
            c.demo_rate = ms(positive("demo.rate_ms", v)?);
        }
        self.apply_security(c)?;
        self.apply_subscriptions(&mut c.subscriptions)
    }

    fn apply_security(&self, c: &mut ServerConfig) -> Result<(), String> {
        let s = &self.security;
        let sec = &mut c.security;
        if let Some(v) = &s.pki_dir {
            if v.is_empty() {
                return Err("security.pki_dir must not be empty".into());
            }
            sec.pki_dir = v.into();
        }
        if let Some(names) = &s.policies {
            sec.policies = names
                .iter()
                .map(|n| {
                    policy_named(n).filter(|p| !p.is_none()).ok_or_else(|| {
                        format!(
                            "security.policies: {n:?} is not one of Basic256Sha256, \
                             Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss (None is \
                             allow_security_none)"
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(names) = &s.modes {
            sec.modes = names
                .iter()
                .map(|n| {
                    mode_named(n).ok_or_else(|| {
                        format!("security.modes: {n:?} is not Sign or SignAndEncrypt")
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = s.allow_security_none {
            sec.allow_security_none = v;
        }
        if let Some(v) = s.trust_all_client_certificates {
            sec.pki.trust_all_client_certificates = v;
        }
        if let Some(v) = s.reject_unknown_revocation_status {
            sec.pki.reject_unknown_revocation_status = v;
        }
        if let Some(v) = s.max_rejected_certificates {
            sec.pki.max_rejected_certificates = v;
        }
        if let Some(v) = s.pki_reload_interval_ms {
            sec.pki.reload_interval = ms(positive("security.pki_reload_interval_ms", v)?);
        }
        if let Some(v) = s.allow_anonymous {
            sec.allow_anonymous = v;
        }
        if let Some(v) = s.max_failed_authentication_attempts {
            sec.max_failed_authentication_attempts = v;
        }
        if sec.endpoints().is_empty() {
            return Err(
                "security: no endpoint left (policies or modes empty and allow_security_none = false)"
                    .into(),
            );
        }
        if !self.users.is_empty() {
            let mut names = std::collections::HashSet::new();
            sec.users = self
                .users
                .iter()
                .enumerate()
                .map(|(i, u)| {
                    if !names.insert(u.name.as_str()) {
                        return Err(format!("users[{i}].name: {:?} appears twice", u.name));
                    }
                    UserAccount::new(&u.name, &u.password_hash)
                        .map_err(|e| format!("users[{i}].password_hash: {e}"))
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(())
    }

    fn apply_subscriptions(
        &self,
        l: &mut uascale_server::subscription::SubscriptionLimits,
    ) -> Result<(), String> {
        let s = &self.subscriptions;
        if let Some(v) = s.min_publishing_interval_ms {
            l.min_publishing_interval =
                ms(positive("subscriptions.min_publishing_interval_ms", v)?);
        }
        if let Some(v) = s.max_publishing_interval_ms {
            l.max_publishing_interval =
                ms(positive("subscriptions.max_publishing_interval_ms", v)?);
        }
        if l.min_publishing_interval > l.max_publishing_interval {
            return Err("subscriptions.min_publishing_interval_ms must not exceed \
                        subscriptions.max_publishing_interval_ms"
                .into());
        }
        if let Some(v) = s.max_keep_alive_count {
            l.max_keep_alive_count =
                positive("subscriptions.max_keep_alive_count", v.into())? as u32;
        }
        if let Some(v) = s.max_lifetime_count {
            if v < 3 {
                return Err(format!(
                    "subscriptions.max_lifetime_count = {v}: must be at least 3"
                ));
            }
            l.max_lifetime_count = v;
        }
        if let Some(v) = s.max_notifications_per_publish {
            l.max_notifications_per_publish = v;
        }
        if let Some(v) = s.max_publish_request_count {
            l.max_publish_request_count =
                positive("subscriptions.max_publish_request_count", v as u64)? as usize;
        }
        if let Some(v) = s.max_retransmission_queue {
            l.max_retransmission_queue = v;
        }
        if let Some(v) = s.min_sampling_interval_ms {
            l.min_sampling_interval = ms(positive("subscriptions.min_sampling_interval_ms", v)?);
        }
        if let Some(v) = s.max_queue_size {
            l.max_queue_size = positive("subscriptions.max_queue_size", v.into())? as u32;
        }
        let unlimited = |v: usize| if v == 0 { usize::MAX } else { v };
        if let Some(v) = s.max_subscription_count {
            l.max_subscription_count = unlimited(v);
        }
        if let Some(v) = s.max_monitored_item_count {
            l.max_monitored_item_count = v;
        }
        if let Some(v) = s.max_monitored_items_per_subscription {
            l.max_monitored_items_per_subscription = v;
        }
        if let Some(v) = s.max_monitored_items_per_call {
            l.max_monitored_items_per_call =
                positive("subscriptions.max_monitored_items_per_call", v as u64)? as usize;
        }
        Ok(())
    }

    /// Every key with its effective value.
    pub fn effective(c: &ServerConfig) -> Self {
        let millis = |d: Duration| Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        FileConfig {
            server: ServerSection {
                bind: Some(c.bind.ip()),
                port: Some(c.bind.port()),
                host_name: Some(c.host_name.clone()),
                application_uri: Some(c.application_uri.clone()),
                product_uri: Some(c.product_uri.clone()),
                application_name: Some(c.application_name.clone()),
                max_session_count: Some(c.max_session_count),
                activation_deadline_ms: millis(c.activation_deadline),
                diagnostics_enabled: Some(c.diagnostics_enabled),
                auditing: Some(c.auditing),
                nodesets: Some(c.nodesets.clone()),
            },
            limits: LimitsSection {
                listen_backlog: Some(c.listen_backlog),
                receive_buffer_size: Some(c.channel.transport.receive_buffer_size),
                send_buffer_size: Some(c.channel.transport.send_buffer_size),
                max_message_size: Some(c.channel.transport.max_message_size),
                max_chunk_count: Some(c.channel.transport.max_chunk_count),
                handshake_timeout_ms: millis(c.channel.handshake_timeout),
                min_token_lifetime_ms: millis(c.channel.min_token_lifetime),
                max_token_lifetime_ms: millis(c.channel.max_token_lifetime),
                reassembly_budget: Some(c.reassembly_budget),
                reassembly_unactivated_percent: Some(c.reassembly_unactivated_percent),
                assembly_deadline_ms: millis(c.channel.assembly.deadline),
                max_string_length: Some(c.channel.decode.max_string_length),
                max_byte_string_length: Some(c.channel.decode.max_byte_string_length),
                max_array_length: Some(c.channel.decode.max_array_length),
            },
            demo: DemoSection {
                nodes: Some(c.demo_nodes),
                rate_ms: millis(c.demo_rate),
            },
            security: SecuritySection {
                pki_dir: Some(c.security.pki_dir.display().to_string()),
                policies: Some(
                    c.security
                        .policies
                        .iter()
                        .map(|p| policy_name(*p))
                        .collect(),
                ),
                modes: Some(
                    c.security
                        .modes
                        .iter()
                        .filter_map(|m| m.name().map(str::to_owned))
                        .collect(),
                ),
                allow_security_none: Some(c.security.allow_security_none),
                trust_all_client_certificates: Some(c.security.pki.trust_all_client_certificates),
                reject_unknown_revocation_status: Some(
                    c.security.pki.reject_unknown_revocation_status,
                ),
                max_rejected_certificates: Some(c.security.pki.max_rejected_certificates),
                pki_reload_interval_ms: millis(c.security.pki.reload_interval),
                allow_anonymous: Some(c.security.allow_anonymous),
                max_failed_authentication_attempts: Some(
                    c.security.max_failed_authentication_attempts,
                ),
            },
            users: c
                .security
                .users
                .iter()
                .map(|u| UserEntry {
                    name: u.name().to_owned(),
                    password_hash: u.password_hash().to_owned(),
                })
                .collect(),
            subscriptions: {
                let l = &c.subscriptions;
                SubscriptionsSection {
                    min_publishing_interval_ms: millis(l.min_publishing_interval),
                    max_publishing_interval_ms: millis(l.max_publishing_interval),
                    max_keep_alive_count: Some(l.max_keep_alive_count),
                    max_lifetime_count: Some(l.max_lifetime_count),
                    max_notifications_per_publish: Some(l.max_notifications_per_publish),
                    max_publish_request_count: Some(l.max_publish_request_count),
                    max_retransmission_queue: Some(l.max_retransmission_queue),
                    min_sampling_interval_ms: millis(l.min_sampling_interval),
                    max_queue_size: Some(l.max_queue_size),
                    max_subscription_count: Some(if l.max_subscription_count == usize::MAX {
                        0
                    } else {
                        l.max_subscription_count
                    }),
                    max_monitored_item_count: Some(l.max_monitored_item_count),
                    max_monitored_items_per_subscription: Some(
                        l.max_monitored_items_per_subscription,
                    ),
                    max_monitored_items_per_call: Some(l.max_monitored_items_per_call),
                }
            },
        }
    }

    /// As TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_mistyped_keys_are_named() {
        let e = FileConfig::parse("[server]\nprot = 1\n").unwrap_err();
        assert!(e.contains("prot"), "{e}");
        let e = FileConfig::parse("[limits]\nmax_message_size = \"big\"\n").unwrap_err();
        assert!(e.contains("max_message_size"), "{e}");
        let e = FileConfig::parse("[nope]\n").unwrap_err();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn ranges_are_checked_with_the_key() {
        let mut c = ServerConfig::default();
        let f = FileConfig::parse("[limits]\nreceive_buffer_size = 100\n").unwrap();
        assert!(f
            .apply(&mut c)
            .unwrap_err()
            .contains("limits.receive_buffer_size"));
        let f = FileConfig::parse("[demo]\nrate_ms = 0\n").unwrap();
        assert!(f.apply(&mut c).unwrap_err().contains("demo.rate_ms"));
        let f = FileConfig::parse("[subscriptions]\nmax_publish_request_count = 0\n").unwrap();
        assert!(f
            .apply(&mut c)
            .unwrap_err()
            .contains("subscriptions.max_publish_request_count"));
    }

    #[test]
    fn security_keys() {
        let mut c = ServerConfig::default();
        let f = FileConfig::parse(
            "[security]\npolicies = [\"Basic256Sha256\"]\nmodes = [\"SignAndEncrypt\"]\n\
             allow_security_none = false\ntrust_all_client_certificates = true\n\
             pki_dir = \"/tmp/x\"\nmax_failed_authentication_attempts = 0\n\
             [[users]]\nname = \"alice\"\n\
             password_hash = \"$argon2id$v=19$m=64,t=1,p=1$MDEyMzQ1Njc4OWFiY2RlZg$VqTeVXbWRg6XKh3mS9Zb5B5y4gFHmT1nbC3WlbnJEhc\"\n",
        )
        .unwrap();
        f.apply(&mut c).unwrap();
        assert_eq!(
            c.security.endpoints(),
            [(
                SecurityPolicy::Basic256Sha256,
                MessageSecurityMode::SignAndEncrypt
            )]
        );
        assert!(c.security.pki.trust_all_client_certificates);
        assert_eq!(c.security.users.len(), 1);
        assert_eq!(c.security.max_failed_authentication_attempts, 0);
        let text = FileConfig::effective(&c).to_toml();
        assert!(text.contains("[[users]]"), "{text}");
        let mut again = ServerConfig::default();
        FileConfig::parse(&text).unwrap().apply(&mut again).unwrap();
        assert_eq!(FileConfig::effective(&again).to_toml(), text);

        for (bad, key) in [
            (
                "[security]\npolicies = [\"Basic128Rsa15\"]\n",
                "security.policies",
            ),
            ("[security]\nmodes = [\"None\"]\n", "security.modes"),
            (
                "[security]\npolicies = []\nallow_security_none = false\n",
                "no endpoint",
            ),
            (
                "[[users]]\nname = \"bob\"\npassword_hash = \"hunter2\"\n",
                "users[0].password_hash",
            ),
        ] {
            let e = FileConfig::parse(bad)
                .and_then(|f| f.apply(&mut ServerConfig::default()))
                .unwrap_err();
            assert!(e.contains(key), "{bad}: {e}");
        }
        let e = FileConfig::parse("[[users]]\nname = \"bob\"\npasword = \"x\"\n").unwrap_err();
        assert!(e.contains("pasword"), "{e}");
    }

    #[test]
    fn printed_config_round_trips() {
        let mut c = ServerConfig::default();
        FileConfig::parse(
            "[server]\nport = 4999\nnodesets = [\"a.xml\", \"b.xml\"]\n[demo]\nnodes = 7\n\
             [subscriptions]\nmax_subscription_count = 0\nmax_queue_size = 64\n",
        )
        .unwrap()
        .apply(&mut c)
        .unwrap();
        let text = FileConfig::effective(&c).to_toml();
        let mut again = ServerConfig::default();
        FileConfig::parse(&text).unwrap().apply(&mut again).unwrap();
        assert_eq!(again.bind.port(), 4999);
        assert_eq!(again.demo_nodes, 7);
        assert_eq!(again.subscriptions.max_subscription_count, usize::MAX);
        assert_eq!(again.subscriptions.max_queue_size, 64);
        assert_eq!(
            again.nodesets,
            vec![std::path::PathBuf::from("a.xml"), "b.xml".into()]
        );
        assert_eq!(FileConfig::effective(&again).to_toml(), text);
    }
}
