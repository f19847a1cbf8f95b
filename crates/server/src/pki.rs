//! The PKI directory (Part 12 §F.1 layout, as other OPC UA stacks use it):
//!
//! ```text
//! pki/own/certs/cert.der        this server's application instance certificate
//! pki/own/private/key.pem       its RSA private key (PKCS#8 PEM, mode 0600)
//! pki/trusted/certs/  *.der|*.pem   trusted certificates (applications or CAs)
//! pki/trusted/crl/    *.crl|*.der|*.pem   CRLs of trusted CAs
//! pki/issuers/certs/  CA certificates used to build chains, not trusted by themselves
//! pki/issuers/crl/    their CRLs
//! pki/rejected/certs/ certificates that failed validation, for the operator
//!                     to inspect and move to trusted/certs
//! ```
//!
//! [`Pki::open`] creates the layout and, on first start, a self-signed
//! certificate. The trust list is rebuilt when the directory changes: a
//! cheap listing at most every `reload_interval`, and at once (at most once
//! a second) when a certificate fails as untrusted, so an operator's move
//! to trusted/ takes effect without a restart. Validation runs on an
//! immutable snapshot (`Arc<TrustList>`), outside any lock.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use uascale_crypto::ecc::{EccCurve, EccPrivateKey};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPrivateKey;
use uascale_crypto::x509::{
    self, create_self_signed, Certificate, CertificateUse, Crl, KeyType, SelfSignedParams,
    TrustList, ValidationOptions,
};
use uascale_crypto::CryptoError;
use uascale_types::StatusCode;

/// Sub-directories of the PKI, relative to its root.
pub const LAYOUT: [&str; 7] = [
    "own/certs",
    "own/private",
    "trusted/certs",
    "trusted/crl",
    "issuers/certs",
    "issuers/crl",
    "rejected/certs",
];

/// The own certificate, relative to the PKI root.
pub const OWN_CERT: &str = "own/certs/cert.der";
/// The own private key, relative to the PKI root.
pub const OWN_KEY: &str = "own/private/key.pem";

/// Most files read from one trust-list directory; more are ignored with a
/// warning (a runaway directory must not stall the server).
const MAX_FILES_PER_DIR: usize = 10_000;

/// Why the PKI could not be opened or changed.
#[derive(Debug)]
#[non_exhaustive]
pub enum PkiError {
    /// A file or directory could not be read or written.
    Io {
        /// Which path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file holds something unusable.
    Invalid {
        /// Which path.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A cryptographic operation on local material failed.
    Crypto(CryptoError),
}

impl PkiError {
    /// The StatusCode this maps to (all are local configuration problems).
    pub fn status_code(&self) -> StatusCode {
        match self {
            PkiError::Crypto(e) => e.status_code(),
            _ => StatusCode::BadConfigurationError,
        }
    }
}

impl std::fmt::Display for PkiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PkiError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            PkiError::Invalid { path, what } => write!(f, "{}: {what}", path.display()),
            PkiError::Crypto(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PkiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PkiError::Io { source, .. } => Some(source),
            PkiError::Crypto(e) => Some(e),
            PkiError::Invalid { .. } => None,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.to_owned(),
        source,
    }
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> PkiError {
    PkiError::Invalid {
        path: path.to_owned(),
        what: what.to_string(),
    }
}

/// How the PKI validates and keeps certificates.
#[derive(Debug, Clone)]
pub struct PkiOptions {
    /// Accept client certificates that no trust list vouches for. Unsafe:
    /// any client with any certificate gets in. Default false.
    pub trust_all_client_certificates: bool,
    /// Reject CA-issued certificates whose CA has no CRL in the PKI
    /// (BadCertificateRevocationUnknown). Default true.
    pub reject_unknown_revocation_status: bool,
    /// Most files kept in rejected/certs; the oldest go first. Default 100:
    /// enough for an operator to find a new client, bounded so a storm of
    /// distinct certificates cannot fill the disk (100 x 32 KiB at most).
    pub max_rejected_certificates: usize,
    /// How often the directory is checked for changes. Default 5 s.
    pub reload_interval: Duration,
}

impl Default for PkiOptions {
    fn default() -> Self {
        PkiOptions {
            trust_all_client_certificates: false,
            reject_unknown_revocation_status: true,
            max_rejected_certificates: 100,
            reload_interval: Duration::from_secs(5),
        }
    }
}

/// What the own certificate is made of when it has to be created.
#[derive(Debug, Clone)]
pub struct OwnIdentity {
    /// ApplicationUri (goes into the subjectAltName).
    pub application_uri: String,
    /// ApplicationName (the subject's commonName).
    pub application_name: String,
    /// Host names (the first also becomes the subject's DC).
    pub host_names: Vec<String>,
    /// IP addresses.
    pub ip_addresses: Vec<IpAddr>,
}

impl OwnIdentity {
    /// Adds the addresses the host names resolve to. Name resolution may
    /// block, so it runs only when a certificate is created.
    fn with_resolved_addresses(&self) -> OwnIdentity {
        let mut out = self.clone();
        for host in &self.host_names {
            if let Ok(addrs) = (host.as_str(), 0).to_socket_addrs() {
                out.ip_addresses.extend(addrs.map(|a| a.ip()));
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.ip_addresses.retain(|ip| seen.insert(*ip));
        out
    }
}

struct ReloadState {
    last_check: Option<SystemTime>,
    stamp: u64,
}

/// The PKI of a running server: own certificate and key, trust list
/// snapshots, rejected-certificate store.
pub struct Pki {
    root: PathBuf,
    options: PkiOptions,
    own_certificate: Certificate,
    trust: RwLock<Arc<TrustList>>,
    reload: Mutex<ReloadState>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("root", &self.root)
            .field("own_certificate", &self.own_certificate)
            .finish_non_exhaustive()
    }
}

/// Creates the directory layout under `root` (idempotent).
pub fn create_layout(root: &Path) -> Result<(), PkiError> {
    for dir in LAYOUT {
        let path = root.join(dir);
        std::fs::create_dir_all(&path).map_err(io(&path))?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let private = root.join("own/private");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&private))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file and a rename, so
/// readers never see half a file; `private` makes it mode 0600.
pub fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> Result<(), PkiError> {
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Reads a certificate file: DER, or the first CERTIFICATE block of a PEM.
pub fn read_certificate(path: &Path) -> Result<Certificate, PkiError> {
    let bytes = read_bounded(path, x509::MAX_CERTIFICATE_SIZE * 2)?;
    let der = if bytes.starts_with(b"-----") {
        x509::from_pem("CERTIFICATE", &bytes)
            .ok_or_else(|| invalid(path, "PEM file without a CERTIFICATE block"))?
    } else {
        bytes
    };
    Certificate::from_der(&der).map_err(|e| invalid(path, e))
}

/// Reads a CRL file: DER, or the first X509 CRL block of a PEM.
pub fn read_crl(path: &Path) -> Result<Crl, PkiError> {
    let bytes = read_bounded(path, x509::MAX_CRL_SIZE * 2)?;
    let der = if bytes.starts_with(b"-----") {
        x509::from_pem("X509 CRL", &bytes)
            .ok_or_else(|| invalid(path, "PEM file without an X509 CRL block"))?
    } else {
        bytes
    };
    Crl::from_der(&der).map_err(|e| invalid(path, e))
}

fn read_bounded(path: &Path, max: usize) -> Result<Vec<u8>, PkiError> {
    let len = std::fs::metadata(path).map_err(io(path))?.len();
    if len > max as u64 {
        return Err(invalid(path, format!("larger than {max} bytes")));
    }
    std::fs::read(path).map_err(io(path))
}

/// The regular files of `dir`, sorted, at most [`MAX_FILES_PER_DIR`].
fn files_in(dir: &Path) -> Result<Vec<PathBuf>, PkiError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && path.extension().is_none_or(|e| e != "tmp") && path.is_file() {
            files.push(path);
        }
        if files.len() >= MAX_FILES_PER_DIR {
            tracing::warn!(dir = %dir.display(), "more than {MAX_FILES_PER_DIR} files; the rest are ignored");
            break;
        }
    }
    files.sort();
    Ok(files)
}

/// A file name for `cert`: its commonName made safe, then its thumbprint.
pub fn file_name_for(cert: &Certificate) -> String {
    let name: String = cert
        .common_name()
        .unwrap_or("certificate")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    format!("{name}_{}.der", cert.thumbprint_hex())
}

/// Loads the trust list from `root` (trusted/, issuers/ and their CRLs).
/// Unreadable files are skipped with a warning naming them.
pub fn load_trust_list(root: &Path) -> Result<TrustList, PkiError> {
    let certs = |dir: &str| -> Result<Vec<Certificate>, PkiError> {
        let mut out = Vec::new();
        for path in files_in(&root.join(dir))? {
            match read_certificate(&path) {
                Ok(c) => out.push(c),
                Err(e) => tracing::warn!(error = %e, "certificate skipped"),
            }
        }
        Ok(out)
    };
    let trusted = certs("trusted/certs")?;
    let issuers = certs("issuers/certs")?;
    let mut crls = Vec::new();
    for dir in ["trusted/crl", "issuers/crl"] {
        for path in files_in(&root.join(dir))? {
            match read_crl(&path) {
                Ok(c) => crls.push(c),
                Err(e) => tracing::warn!(error = %e, "CRL skipped"),
            }
        }
    }
    let list = TrustList::new(trusted, issuers, crls);
    for ignored in list.ignored_crls() {
        tracing::warn!(issuer = %ignored.issuer, reason = ignored.reason, "CRL ignored");
    }
    Ok(list)
}

/// A fingerprint of the trust directories: names, sizes and mtimes.
fn directory_stamp(root: &Path) -> u64 {
    let mut h = DefaultHasher::new();
    for dir in [
        "trusted/certs",
        "trusted/crl",
        "issuers/certs",
        "issuers/crl",
    ] {
        let path = root.join(dir);
        dir.hash(&mut h);
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        let mut items: Vec<(std::ffi::OsString, u64, Option<SystemTime>)> = entries
            .filter_map(Result::ok)
            .take(MAX_FILES_PER_DIR)
            .map(|e| {
                let meta = e.metadata().ok();
                (
                    e.file_name(),
                    meta.as_ref().map_or(0, |m| m.len()),
                    meta.and_then(|m| m.modified().ok()),
                )
            })
            .collect();
        items.sort();
        items.hash(&mut h);
    }
    h.finish()
}

impl Pki {
    /// Opens the PKI at `root`: creates the layout, and the own certificate
    /// and key if neither exists; returns the PKI and the own private key. A certificate without its key (or the
    /// reverse), or a certificate for another applicationUri, is an error
    /// naming the file: the operator decides, nothing is overwritten.
    pub fn open(
        root: &Path,
        identity: &OwnIdentity,
        options: PkiOptions,
        now: SystemTime,
    ) -> Result<(Pki, RsaPrivateKey), PkiError> {
        create_layout(root)?;
        let cert_path = root.join(OWN_CERT);
        let key_path = root.join(OWN_KEY);
        let (own_certificate, own_key) = match (cert_path.exists(), key_path.exists()) {
            (false, false) => {
                let created = create_own(identity, now)?;
                write_atomically(&key_path, created.1.as_bytes(), true)?;
                write_atomically(&cert_path, created.0.der(), false)?;
                tracing::info!(
                    path = %cert_path.display(),
                    thumbprint = %created.0.thumbprint_hex(),
                    "created a self-signed application instance certificate"
                );
                (created.0, created.1)
            }
            (true, true) => {
                let cert = read_certificate(&cert_path)?;
                let key = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
                (cert, key)
            }
            (true, false) => return Err(invalid(&key_path, "missing (the certificate exists)")),
            (false, true) => return Err(invalid(&cert_path, "missing (the key exists)")),
        };
        let key_der = x509::from_pem("PRIVATE KEY", own_key.as_bytes())
            .or_else(|| x509::from_pem("RSA PRIVATE KEY", own_key.as_bytes()))
            .ok_or_else(|| invalid(&key_path, "no PRIVATE KEY PEM block"))?;
        let key = RsaPrivateKey::from_der(&key_der).map_err(|e| invalid(&key_path, e))?;
        if key.public_key().spki_der() != own_certificate.subject_public_key_info_der() {
            return Err(invalid(
                &key_path,
                "does not belong to the certificate in own/certs",
            ));
        }
        // Also seeds aws-lc's random generator now instead of in the first
        // client's handshake.
        key.check_pair().map_err(|e| invalid(&key_path, e))?;
        if own_certificate.application_uri() != Some(identity.application_uri.as_str()) {
            return Err(invalid(
                &cert_path,
                format!(
                    "its applicationUri {:?} differs from the configured {:?}; clients \
                     would reject it (move own/ away to create a new certificate)",
                    own_certificate.application_uri().unwrap_or(""),
                    identity.application_uri
                ),
            ));
        }
        if !own_certificate.is_time_valid(now) {
            tracing::warn!(path = %cert_path.display(), "own certificate is outside its validity period");
        }
        let trust = load_trust_list(root)?;
        tracing::info!(
            trusted = trust.trusted_count(),
            known = trust.certificate_count(),
            pki = %root.display(),
            "trust list loaded"
        );
        let pki = Pki {
            root: root.to_owned(),
            options,
            own_certificate,
            trust: RwLock::new(Arc::new(trust)),
            reload: Mutex::new(ReloadState {
                last_check: Some(now),
                stamp: directory_stamp(root),
            }),
        };
        Ok((pki, key))
    }

    /// The PKI root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The server's application instance certificate.
    pub fn own_certificate(&self) -> &Certificate {
        &self.own_certificate
    }

    /// The options.
    pub fn options(&self) -> &PkiOptions {
        &self.options
    }

    /// The current trust list, reloaded first if the directory changed and
    /// the last check is older than the reload interval.
    pub fn trust_list(&self, now: SystemTime) -> Arc<TrustList> {
        self.maybe_reload(now, self.options.reload_interval);
        self.snapshot()
    }

    fn snapshot(&self) -> Arc<TrustList> {
        match self.trust.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Reloads if the last check is older than `interval` and the
    /// directory's stamp changed. One caller checks; others go on with the
    /// current list. Returns whether a new list was loaded.
    fn maybe_reload(&self, now: SystemTime, interval: Duration) -> bool {
        let Ok(mut state) = self.reload.try_lock() else {
            return false;
        };
        let due = state
            .last_check
            .and_then(|t| now.duration_since(t).ok())
            .is_none_or(|age| age >= interval);
        if !due {
            return false;
        }
        state.last_check = Some(now);
        let stamp = directory_stamp(&self.root);
        if stamp == state.stamp {
            return false;
        }
        match load_trust_list(&self.root) {
            Ok(list) => {
                tracing::info!(
                    trusted = list.trusted_count(),
                    known = list.certificate_count(),
                    "PKI changed; trust list reloaded"
                );
                state.stamp = stamp;
                let list = Arc::new(list);
                match self.trust.write() {
                    Ok(mut g) => *g = list,
                    Err(poisoned) => *poisoned.into_inner() = list,
                }
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "PKI changed but could not be read; keeping the old trust list");
                false
            }
        }
    }

    /// Forces a check of the directory now (e.g. after `uascale cert trust`).
    pub fn reload_now(&self, now: SystemTime) -> bool {
        self.maybe_reload(now, Duration::ZERO)
    }

    /// Validates a client's application instance certificate (chain as
    /// sent: DER certificates concatenated, leaf first) for `policy`, and,
    /// when given, against the applicationUri the client claims. On failure
    /// the leaf is copied to rejected/certs.
    pub fn validate_client(
        &self,
        chain_der: &[u8],
        policy: Option<SecurityPolicy>,
        application_uri: Option<&str>,
        now: SystemTime,
    ) -> Result<Certificate, CryptoError> {
        let chain = Certificate::parse_chain(chain_der)?;
        self.validate_as(CertificateUse::Client, &chain, policy, application_uri, now)?;
        leaf_of(chain)
    }

    /// Validates a user's X509 identity certificate against the same trust
    /// list (usage: digitalSignature; no applicationUri).
    pub fn validate_user(
        &self,
        chain_der: &[u8],
        policy: Option<SecurityPolicy>,
        now: SystemTime,
    ) -> Result<Certificate, CryptoError> {
        let chain = Certificate::parse_chain(chain_der)?;
        self.validate_as(CertificateUse::User, &chain, policy, None, now)?;
        leaf_of(chain)
    }

    /// The hook for the secure channel: validates a client certificate
    /// with the key lengths all RSA policies accept.
    pub fn validate(&self, der: &[u8], now: SystemTime) -> Result<(), CryptoError> {
        self.validate_client(der, None, None, now).map(|_| ())
    }

    /// Validates `chain` (leaf first) for `usage`; a rejected leaf is
    /// copied to rejected/certs.
    fn validate_as(
        &self,
        usage: CertificateUse,
        chain: &[Certificate],
        policy: Option<SecurityPolicy>,
        application_uri: Option<&str>,
        now: SystemTime,
    ) -> Result<(), CryptoError> {
        let (min_key_bits, max_key_bits) = match policy {
            Some(p) if !p.is_none() => (p.min_asymmetric_key_bits(), p.max_asymmetric_key_bits()),
            _ => (2048, 4096),
        };
        let options = ValidationOptions {
            usage,
            application_uri,
            min_key_bits,
            max_key_bits,
            policy: policy.filter(|p| !p.is_none()),
            allow_sha1_signatures: false,
            reject_unknown_revocation_status: self.options.reject_unknown_revocation_status,
            trust_all: usage == CertificateUse::Client
                && self.options.trust_all_client_certificates,
        };
        let mut result = self.trust_list(now).validate(chain, &options, now);
        if let Err(e) = &result {
            let status = e.status_code();
            let miss = status == StatusCode::BadCertificateUntrusted
                || status == StatusCode::BadCertificateChainIncomplete
                || status == StatusCode::BadCertificateRevocationUnknown
                || status == StatusCode::BadCertificateIssuerRevocationUnknown;
            // The operator may just have trusted it: look again (at most
            // once a second, so a storm of strangers costs no disk scans).
            if miss && self.maybe_reload(now, Duration::from_secs(1)) {
                result = self.snapshot().validate(chain, &options, now);
            }
        }
        if let (Err(e), Some(leaf)) = (&result, chain.first()) {
            tracing::info!(
                subject = leaf.subject_name(),
                thumbprint = %leaf.thumbprint_hex(),
                reason = %e,
                "certificate rejected"
            );
            self.store_rejected(leaf);
        }
        result
    }

    /// Copies `cert` to rejected/certs (if not there yet), removing the
    /// oldest files beyond `max_rejected_certificates`. Failures are logged:
    /// the rejection itself stands either way.
    pub fn store_rejected(&self, cert: &Certificate) {
        if self.options.max_rejected_certificates == 0 {
            return;
        }
        let dir = self.root.join("rejected/certs");
        let path = dir.join(file_name_for(cert));
        if path.exists() {
            return;
        }
        if let Err(e) = prune_oldest(&dir, self.options.max_rejected_certificates - 1) {
            tracing::warn!(error = %e, "cannot prune rejected/certs");
        }
        if let Err(e) = write_atomically(&path, cert.der(), false) {
            tracing::warn!(error = %e, "cannot store the rejected certificate");
        }
    }
}

impl uascale_proto::security::CertificateValidator for Pki {
    /// The channel's hook at OpenSecureChannel: the chain as sent, for the
    /// channel's policy, at the current time.
    fn validate(
        &self,
        certificate: &Certificate,
        chain: &[u8],
        policy: SecurityPolicy,
    ) -> Result<(), CryptoError> {
        // The channel parsed the leaf already: a chain of just the leaf
        // (the common case) is neither parsed again nor copied.
        let parsed;
        let chain = if chain == certificate.der() {
            std::slice::from_ref(certificate)
        } else {
            parsed = Certificate::parse_chain(chain)?;
            &parsed
        };
        let now = SystemTime::now();
        self.validate_as(CertificateUse::Client, chain, Some(policy), None, now)
    }
}

/// The leaf of a validated chain.
fn leaf_of(chain: Vec<Certificate>) -> Result<Certificate, CryptoError> {
    chain.into_iter().next().ok_or(CryptoError::Certificate {
        status: StatusCode::BadCertificateInvalid,
        what: "no certificate",
    })
}

/// Deletes the oldest files of `dir` until at most `keep` remain.
fn prune_oldest(dir: &Path, keep: usize) -> Result<(), PkiError> {
    let mut files: Vec<(SystemTime, PathBuf)> = files_in(dir)?
        .into_iter()
        .map(|p| {
            let t = std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (t, p)
        })
        .collect();
    if files.len() <= keep {
        return Ok(());
    }
    files.sort();
    let excess = files.len() - keep;
    for (_, path) in files.into_iter().take(excess) {
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    Ok(())
}

/// Creates a self-signed certificate and its PEM key for `identity`; valid
/// from an hour before `now` (peers whose clocks lag still accept it).
pub fn create_own(
    identity: &OwnIdentity,
    now: SystemTime,
) -> Result<(Certificate, String), PkiError> {
    create_own_of(identity, KeyType::Rsa, now)
}

/// The own certificate and key files of an ECC curve, beside the RSA ones:
/// `own/certs/cert_<key>.der` and `own/private/key_<key>.pem` with `<key>`
/// `ec-p256`, `ec-p384` or `ed25519`.
pub fn own_ecc_paths(root: &Path, curve: EccCurve) -> (PathBuf, PathBuf) {
    let name = ecc_key_type(curve).name();
    (
        root.join(format!("own/certs/cert_{name}.der")),
        root.join(format!("own/private/key_{name}.pem")),
    )
}

/// The certificate key type of a curve.
pub fn ecc_key_type(curve: EccCurve) -> KeyType {
    match curve {
        EccCurve::NistP256 => KeyType::EcP256,
        EccCurve::NistP384 => KeyType::EcP384,
        EccCurve::Curve25519 => KeyType::Ed25519,
    }
}

/// Opens (and on first use creates) the own ECC certificate and key of
/// `curve` in the PKI at `root` (see [`own_ecc_paths`]); they must belong
/// together and carry the configured applicationUri.
pub fn open_own_ecc(
    root: &Path,
    identity: &OwnIdentity,
    curve: EccCurve,
    now: SystemTime,
) -> Result<(Certificate, EccPrivateKey), PkiError> {
    create_layout(root)?;
    let (cert_path, key_path) = own_ecc_paths(root, curve);
    let (cert, key) = match (cert_path.exists(), key_path.exists()) {
        (false, false) => {
            let (cert, pem) = create_own_of(identity, ecc_key_type(curve), now)?;
            write_atomically(&key_path, pem.as_bytes(), true)?;
            write_atomically(&cert_path, cert.der(), false)?;
            tracing::info!(
                path = %cert_path.display(),
                thumbprint = %cert.thumbprint_hex(),
                "created a self-signed ECC application instance certificate"
            );
            (cert, pem)
        }
        (true, true) => {
            let cert = read_certificate(&cert_path)?;
            let key = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
            (cert, key)
        }
        (true, false) => return Err(invalid(&key_path, "missing (the certificate exists)")),
        (false, true) => return Err(invalid(&cert_path, "missing (the key exists)")),
    };
    let der = x509::from_pem("PRIVATE KEY", key.as_bytes())
        .ok_or_else(|| invalid(&key_path, "no PRIVATE KEY PEM block"))?;
    let key = EccPrivateKey::from_pkcs8_der(&der).map_err(|e| invalid(&key_path, e))?;
    if key.curve() != curve || key.public_key().spki_der() != cert.subject_public_key_info_der() {
        return Err(invalid(&key_path, "does not belong to the certificate"));
    }
    key.check_pair().map_err(|e| invalid(&key_path, e))?;
    if cert.application_uri() != Some(identity.application_uri.as_str()) {
        return Err(invalid(
            &cert_path,
            "its applicationUri differs from the configured one",
        ));
    }
    Ok((cert, key))
}

/// Creates a self-signed application instance certificate of `key_type`
/// (RSA 2048, P-256, P-384 or Ed25519) and its PKCS#8 PEM key.
pub fn create_own_of(
    identity: &OwnIdentity,
    key_type: KeyType,
    now: SystemTime,
) -> Result<(Certificate, String), PkiError> {
    let identity = identity.with_resolved_addresses();
    let mut params = SelfSignedParams::new(
        &identity.application_uri,
        &identity.application_name,
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now),
    );
    params.dns_names = identity.host_names.clone();
    params.ip_addresses = identity.ip_addresses.clone();
    params.key_type = key_type;
    let created = create_self_signed(&params).map_err(PkiError::Crypto)?;
    let pem = x509::to_pem("PRIVATE KEY", &created.private_key_pkcs8_der);
    Ok((created.certificate, pem))
}

#[cfg(test)]
mod tests;
