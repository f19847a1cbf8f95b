//! The server-wide security state the services need: the PKI, the server's
//! certificate and key, the published (policy, mode) pairs, the users and
//! the failed-authentication tracker. Built once at start from
//! [`SecurityConfig`](crate::config::SecurityConfig).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use uascale_crypto::policy::SecurityPolicy;
use uascale_proto::security::{Identity, PrivateKey};
use uascale_types::MessageSecurityMode;

use crate::config::ServerConfig;
use crate::identity::{AuthFailures, UserDatabase};
use crate::pki::{open_own_ecc, OwnIdentity, Pki, PkiError};

/// What the services know about security.
#[derive(Debug)]
pub struct SecurityState {
    /// The PKI (None when only SecurityPolicy None is published).
    pub pki: Option<Arc<Pki>>,
    /// The server's certificate and key (with the PKI): RSA.
    pub identity: Option<Arc<Identity>>,
    /// The ECC certificates and keys beside it, one per curve of the
    /// published ECC policies.
    pub ecc_identities: Vec<Arc<Identity>>,
    /// Published (policy, mode) pairs, in endpoint order.
    pub endpoints: Vec<(SecurityPolicy, MessageSecurityMode)>,
    /// Offer the Anonymous token.
    pub allow_anonymous: bool,
    /// Users for UserName tokens.
    pub users: UserDatabase,
    /// `max_failed_authentication_attempts`.
    pub failures: AuthFailures,
}

impl SecurityState {
    /// SecurityPolicy None only, anonymous only: no PKI.
    pub fn none_only() -> SecurityState {
        SecurityState {
            pki: None,
            identity: None,
            ecc_identities: Vec::new(),
            endpoints: vec![(SecurityPolicy::None, MessageSecurityMode::None)],
            allow_anonymous: true,
            users: UserDatabase::default(),
            failures: AuthFailures::new(5),
        }
    }

    /// From the configuration: opens (and on first start creates) the PKI
    /// when a secured endpoint is published.
    pub fn from_config(config: &ServerConfig, now: SystemTime) -> Result<SecurityState, PkiError> {
        let sec = &config.security;
        let (pki, identity) = if sec.needs_pki() {
            let (pki, key) = Pki::open(
                &sec.pki_dir,
                &OwnIdentity::for_config(config),
                sec.pki_options(),
                now,
            )?;
            let identity =
                Identity::new(pki.own_certificate().clone(), key).map_err(PkiError::Crypto)?;
            (Some(Arc::new(pki)), Some(Arc::new(identity)))
        } else {
            (None, None)
        };
        let mut curves: Vec<_> = sec.policies.iter().filter_map(|p| p.curve()).collect();
        curves.dedup();
        let mut ecc_identities: Vec<Arc<Identity>> = Vec::new();
        if pki.is_some() {
            for curve in curves {
                if ecc_identities
                    .iter()
                    .any(|i| i.ecc_key().map(|k| k.curve()) == Some(curve))
                {
                    continue;
                }
                let (cert, key) =
                    open_own_ecc(&sec.pki_dir, &OwnIdentity::for_config(config), curve, now)?;
                let identity =
                    Identity::with_key(cert, PrivateKey::Ecc(key)).map_err(PkiError::Crypto)?;
                ecc_identities.push(Arc::new(identity));
            }
        }
        Ok(SecurityState {
            pki,
            identity,
            ecc_identities,
            endpoints: sec.endpoints(),
            allow_anonymous: sec.allow_anonymous,
            // Checked by ServerConfig::validate; an entry that is not an
            // account cannot be logged in with.
            users: UserDatabase::new(
                config
                    .users
                    .iter()
                    .filter_map(|u| u.account().ok())
                    .collect(),
            ),
            failures: AuthFailures::new(sec.max_failed_authentication_attempts),
        })
    }

    /// The certificate and key serving `policy`: the RSA identity for RSA
    /// policies, the ECC identity of the policy's curve for ECC ones.
    pub fn identity_for(&self, policy: SecurityPolicy) -> Option<&Arc<Identity>> {
        self.identity
            .iter()
            .chain(&self.ecc_identities)
            .find(|i| i.suits(policy))
    }

    /// The policy UserName passwords and X509 token signatures use on a
    /// channel of `channel_policy`: the channel's own, and Basic256Sha256 on
    /// unsecured channels (the password is then encrypted for the server
    /// certificate). None when no certificate exists to encrypt for.
    pub fn token_policy(&self, channel_policy: SecurityPolicy) -> Option<SecurityPolicy> {
        if !channel_policy.is_none() {
            Some(channel_policy)
        } else if self.identity.is_some() {
            Some(SecurityPolicy::Basic256Sha256)
        } else {
            None
        }
    }
}

// Here rather than in pki.rs: the configuration builds the PKI's options,
// so the PKI does not name the configuration.
impl OwnIdentity {
    /// The identity for `config`: its host name, `localhost`, the machine's
    /// host name, and the addresses these resolve to locally.
    pub fn for_config(config: &ServerConfig) -> OwnIdentity {
        let mut hosts = vec![config.server.host_name.clone()];
        if let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            hosts.push(name.trim().to_owned());
        }
        hosts.push("localhost".to_owned());
        hosts.retain(|h| !h.is_empty());
        let mut seen = std::collections::HashSet::new();
        hosts.retain(|h| seen.insert(h.to_ascii_lowercase()));
        let mut ips: Vec<IpAddr> = Vec::new();
        if !config.server.bind.is_unspecified() {
            ips.push(config.server.bind);
        }
        ips.push(IpAddr::from([127, 0, 0, 1]));
        OwnIdentity {
            application_uri: config.server.application_uri.clone(),
            application_name: config.server.application_name.clone(),
            host_names: hosts,
            ip_addresses: ips,
        }
    }
}
