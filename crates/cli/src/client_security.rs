//! The client commands' security options: `--security POLICY[:MODE]`,
//! `--user`/`--password`, `--cert`/`--key`, `--pki DIR`, `--trust-server`;
//! the client's application instance certificate in its PKI directory
//! (created on first use) and the trust list the server certificate is
//! judged by (untrusted ones are kept in `DIR/rejected/certs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use uascale_client::{ServerTrust, TrustListValidator, UserIdentity};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::x509::KeyType;
use uascale_crypto::x509::{self, Certificate};
use uascale_crypto::CryptoError;
use uascale_proto::security::PrivateKey;
use uascale_proto::security::{CertificateValidator, Identity};
use uascale_server::pki::{self, OwnIdentity};
use uascale_types::MessageSecurityMode;

/// The ApplicationUri of the command-line client's certificate.
pub const CLIENT_URI: &str = "urn:uascale:client";
/// The environment variable the password is read from.
pub const PASSWORD_ENV: &str = "UASCALE_PASSWORD";

/// Every policy name `--security` takes, in the order `--help` lists them,
/// with its short alias where it has one. `basic256` is deliberately not an
/// alias: Basic256 is a different (deprecated) policy this stack does not
/// implement, and quietly taking it for Basic256Sha256 would mislead.
pub const POLICY_NAMES: &[(&str, Option<&str>)] = &[
    ("None", None),
    ("Basic256Sha256", Some("b256")),
    ("Aes128_Sha256_RsaOaep", Some("aes128")),
    ("Aes256_Sha256_RsaPss", Some("aes256")),
    ("ECC_nistP256", None),
    ("ECC_nistP384", None),
    ("ECC_curve25519", None),
    ("ECC_nistP256_AesGcm", None),
    ("ECC_nistP256_ChaChaPoly", None),
];

/// Parses `POLICY[:MODE]`: the policy by its name (the URI fragment, as in
/// [`POLICY_NAMES`]) or its short alias, the mode `Sign` or
/// `SignAndEncrypt` (default) - case-insensitive, `_` and `-` ignored.
pub fn parse_security(text: &str) -> Result<(SecurityPolicy, MessageSecurityMode), String> {
    let (p, m) = text.split_once(':').unwrap_or((text, ""));
    let key = p.to_ascii_lowercase().replace(['_', '-'], "");
    let policy = match key.as_str() {
        "none" => SecurityPolicy::None,
        "basic256sha256" | "b256" => SecurityPolicy::Basic256Sha256,
        "aes128sha256rsaoaep" | "aes128" => SecurityPolicy::Aes128Sha256RsaOaep,
        "aes256sha256rsapss" | "aes256" => SecurityPolicy::Aes256Sha256RsaPss,
        _ => match SecurityPolicy::ECC.into_iter().find(|e| {
            let name = e.uri().rsplit('#').next().unwrap_or_default();
            name.to_ascii_lowercase().replace(['_', '-'], "") == key
        }) {
            Some(ecc) => ecc,
            None => {
                let names: Vec<&str> = POLICY_NAMES.iter().map(|(n, _)| *n).collect();
                let deprecated = if matches!(key.as_str(), "basic256" | "basic128rsa15") {
                    " (a deprecated policy this client does not implement)"
                } else {
                    ""
                };
                return Err(format!(
                    "--security {text:?}: unknown policy {p:?}{deprecated}; use one of {} \
                     (`uascale endpoints URL` lists what the server offers)",
                    names.join(", ")
                ));
            }
        },
    };
    let mode = match (policy, m.to_ascii_lowercase().as_str()) {
        (SecurityPolicy::None, "" | "none") => MessageSecurityMode::None,
        (SecurityPolicy::None, _) => {
            return Err(format!(
                "--security {text:?}: policy None has mode None only"
            ))
        }
        (_, "sign") => MessageSecurityMode::Sign,
        (_, "" | "signandencrypt" | "sign&encrypt" | "encrypt") => {
            MessageSecurityMode::SignAndEncrypt
        }
        _ => {
            return Err(format!(
                "--security {text:?}: unknown mode {m:?}; use Sign or SignAndEncrypt"
            ))
        }
    };
    Ok((policy, mode))
}

fn read_key(path: &Path) -> Result<PrivateKey, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read the key {}: {e}", path.display()))?;
    let der = x509::from_pem("PRIVATE KEY", &bytes)
        .or_else(|| x509::from_pem("RSA PRIVATE KEY", &bytes))
        .unwrap_or(bytes);
    PrivateKey::from_der(&der).map_err(|e| {
        format!(
            "{} is not an RSA, P-256, P-384 or Ed25519 private key: {e}",
            path.display()
        )
    })
}

/// A certificate (DER or PEM) with its key (PEM or DER; RSA or ECC).
pub fn load_identity(cert: &Path, key_path: &Path) -> Result<Arc<Identity>, String> {
    let certificate = pki::read_certificate(cert).map_err(|e| e.to_string())?;
    let key = read_key(key_path)?;
    Identity::with_key(certificate, key)
        .map(Arc::new)
        .map_err(|e| format!("{} and {}: {e}", cert.display(), key_path.display()))
}

/// The client's own certificate for `policy`: RSA from
/// `DIR/own/certs/cert.der` and `DIR/own/private/key.pem`, ECC from
/// `cert_KEY.der` / `key_KEY.pem` beside them (KEY `ec-p256`, `ec-p384`,
/// `ed25519` after the policy's curve); created (self-signed, for `uri`)
/// when absent.
pub fn own_identity(
    dir: &Path,
    uri: &str,
    policy: SecurityPolicy,
) -> Result<Arc<Identity>, String> {
    let (cert, key) = match policy.curve() {
        Some(curve) => pki::own_ecc_paths(dir, curve),
        None => (
            dir.join("own/certs/cert.der"),
            dir.join("own/private/key.pem"),
        ),
    };
    let key_type = policy.curve().map_or(KeyType::Rsa, pki::ecc_key_type);
    if !cert.exists() {
        pki::create_layout(dir).map_err(|e| e.to_string())?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let own = OwnIdentity {
            application_uri: uri.to_owned(),
            application_name: "uascale client".into(),
            host_names: [host]
                .into_iter()
                .filter(|h| !h.is_empty())
                .chain(["localhost".to_owned()])
                .collect(),
            ip_addresses: Vec::new(),
        };
        let (certificate, pem) =
            pki::create_own_of(&own, key_type, SystemTime::now()).map_err(|e| e.to_string())?;
        pki::write_atomically(&key, pem.as_bytes(), true).map_err(|e| e.to_string())?;
        pki::write_atomically(&cert, certificate.der(), false).map_err(|e| e.to_string())?;
        eprintln!(
            "uascale: created the client certificate {} ({}, thumbprint {})",
            cert.display(),
            uri,
            certificate.thumbprint_hex()
        );
    }
    load_identity(&cert, &key)
}

/// Judges server certificates by the trust list of a client PKI directory
/// (trusted/, issuers/); a refused certificate is written to
/// `rejected/certs` for the operator to inspect and trust.
#[derive(Debug)]
pub struct PkiTrust {
    dir: PathBuf,
    inner: TrustListValidator,
}

impl PkiTrust {
    /// Loads the trust list of `dir`.
    pub fn open(dir: &Path) -> Result<PkiTrust, String> {
        pki::create_layout(dir).map_err(|e| e.to_string())?;
        let list = pki::load_trust_list(dir).map_err(|e| e.to_string())?;
        Ok(PkiTrust {
            dir: dir.to_owned(),
            inner: TrustListValidator::new(list),
        })
    }
}

impl CertificateValidator for PkiTrust {
    fn validate(
        &self,
        certificate: &Certificate,
        chain: &[u8],
        policy: SecurityPolicy,
    ) -> Result<(), CryptoError> {
        let result = self.inner.validate(certificate, chain, policy);
        if result.is_err() {
            let path = self
                .dir
                .join("rejected/certs")
                .join(pki::file_name_for(certificate));
            if pki::write_atomically(&path, certificate.der(), false).is_ok() {
                eprintln!(
                    "uascale: the server certificate {} (thumbprint {}) is not trusted; it \
                     was saved as {} - check it, then `uascale cert trust {} --pki {}` (or \
                     pass --trust-server to accept any server certificate, unsafe)",
                    certificate.subject_name(),
                    certificate.thumbprint_hex(),
                    path.display(),
                    certificate.thumbprint_hex(),
                    self.dir.display()
                );
            }
        }
        result
    }
}

/// What the security flags ask for.
pub struct SecurityArgs {
    /// Policy and mode.
    pub policy: SecurityPolicy,
    /// The mode.
    pub mode: MessageSecurityMode,
    /// The client PKI directory.
    pub pki: PathBuf,
    /// `--trust-server`.
    pub trust_any: bool,
}

impl SecurityArgs {
    /// The options for `url`: [`options`](Self::options), and for an
    /// opc.https URL the trust its TLS certificate is judged by (the PKI's
    /// trust list, or `--trust-server`) whatever the policy.
    pub fn options_for(&self, url: &str) -> Result<uascale_client::SecurityOptions, String> {
        let mut options = self.options()?;
        if url.starts_with("opc.https://") {
            options.trust = if self.trust_any {
                ServerTrust::UnsafeAcceptAny
            } else {
                ServerTrust::Validator(Arc::new(PkiTrust::open(&self.pki)?))
            };
        }
        Ok(options)
    }

    /// The channel's options: our certificate and the server trust.
    pub fn options(&self) -> Result<uascale_client::SecurityOptions, String> {
        if self.policy.is_none() {
            return Ok(uascale_client::SecurityOptions::default());
        }
        let certificate = Some(own_identity(&self.pki, CLIENT_URI, self.policy)?);
        let trust = if self.trust_any {
            ServerTrust::UnsafeAcceptAny
        } else {
            ServerTrust::Validator(Arc::new(PkiTrust::open(&self.pki)?))
        };
        Ok(uascale_client::SecurityOptions {
            policy: self.policy,
            mode: self.mode,
            certificate,
            server_certificate: None,
            trust,
        })
    }
}

/// The identity of `--user` (password from `--password` or
/// `UASCALE_PASSWORD`) or `--cert`/`--key`; anonymous otherwise.
pub fn user_identity(
    user: Option<&str>,
    password: Option<&str>,
    cert: Option<&str>,
    key: Option<&str>,
) -> Result<UserIdentity, String> {
    match (user, cert, key) {
        (Some(_), Some(_), _) => Err("--user and --cert exclude each other".into()),
        (Some(user), None, _) => {
            let password = match password {
                Some(p) => p.to_owned(),
                None => std::env::var(PASSWORD_ENV).map_err(|_| {
                    format!("--user {user:?} needs a password: set {PASSWORD_ENV} (or --password)")
                })?,
            };
            Ok(UserIdentity::UserName {
                user: user.to_owned(),
                password,
            })
        }
        (None, Some(cert), Some(key)) => Ok(UserIdentity::X509(load_identity(
            Path::new(cert),
            Path::new(key),
        )?)),
        (None, Some(_), None) => Err("--cert needs --key (the user certificate's key)".into()),
        (None, None, Some(_)) => Err("--key needs --cert".into()),
        (None, None, None) => Ok(UserIdentity::Anonymous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_names() {
        assert_eq!(
            parse_security("ECC_nistP256_AesGcm").unwrap(),
            (
                SecurityPolicy::EccNistP256AesGcm,
                MessageSecurityMode::SignAndEncrypt
            )
        );
        assert_eq!(
            parse_security("ecc_curve25519:sign").unwrap(),
            (SecurityPolicy::EccCurve25519, MessageSecurityMode::Sign)
        );
        assert_eq!(
            parse_security("ECC_nistP256").unwrap().0,
            SecurityPolicy::EccNistP256
        );
        assert!(parse_security("ECC_curve448").is_err());
        assert_eq!(
            parse_security("Basic256Sha256:SignAndEncrypt").unwrap(),
            (
                SecurityPolicy::Basic256Sha256,
                MessageSecurityMode::SignAndEncrypt
            )
        );
        assert_eq!(
            parse_security("aes256:sign").unwrap(),
            (
                SecurityPolicy::Aes256Sha256RsaPss,
                MessageSecurityMode::Sign
            )
        );
        assert_eq!(
            parse_security("Aes128_Sha256_RsaOaep").unwrap(),
            (
                SecurityPolicy::Aes128Sha256RsaOaep,
                MessageSecurityMode::SignAndEncrypt
            )
        );
        assert_eq!(
            parse_security("None").unwrap(),
            (SecurityPolicy::None, MessageSecurityMode::None)
        );
        assert!(parse_security("Basic128Rsa15")
            .unwrap_err()
            .contains("unknown policy"));
        assert!(parse_security("None:Sign").is_err());
        // Basic256 is another policy, not a spelling of Basic256Sha256.
        let e = parse_security("basic256").unwrap_err();
        assert!(e.contains("deprecated"), "{e}");
        // Every policy the crypto crate offers is listed, and every listed
        // name and alias parses to the policy of that name.
        assert_eq!(POLICY_NAMES.len(), SecurityPolicy::ALL.len());
        for (name, alias) in POLICY_NAMES {
            let (policy, _) = parse_security(name).unwrap();
            assert!(policy.uri().ends_with(&format!("#{name}")), "{name}");
            if let Some(alias) = alias {
                assert_eq!(parse_security(alias).unwrap().0, policy, "{alias}");
            }
        }
        assert!(parse_security("b256:Encrypt2").is_err());
    }
}
