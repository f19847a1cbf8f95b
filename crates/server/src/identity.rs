//! User identity (Part 4 §5.6.3, §7.41): the user database with argon2
//! password hashes, the encrypted-secret format of UserName tokens, the
//! signatures of ActivateSession and X509 tokens, and the lockout after
//! failed authentications (docs/scalability.md §2).
//!
//! Everything here is synchronous and lock-free except the lockout table,
//! whose lock is held for a hash-map update only; password hashing and RSA
//! run in the caller, outside any lock.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::{EncryptionPadding, RsaPrivateKey, RsaPublicKey, SignatureScheme};
use uascale_types::StatusCode;

/// `http://www.w3.org/2001/04/xmldsig-more#rsa-sha256` (RSA PKCS#1 v1.5 SHA-256).
pub const RSA_SHA256_URI: &str = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256";
/// RSA-PSS with SHA-256 (Aes256_Sha256_RsaPss).
pub const RSA_PSS_SHA256_URI: &str = "http://opcfoundation.org/UA/security/rsa-pss-sha2-256";
/// RSA-OAEP with SHA-1 (Basic256Sha256, Aes128_Sha256_RsaOaep).
pub const RSA_OAEP_URI: &str = "http://www.w3.org/2001/04/xmlenc#rsa-oaep";
/// RSA-OAEP with SHA-256 (Aes256_Sha256_RsaPss).
pub const RSA_OAEP_SHA256_URI: &str = "http://opcfoundation.org/UA/security/rsa-oaep-sha2-256";

/// The AsymmetricSignatureAlgorithm URI of `policy` (None for None).
pub fn signature_algorithm_uri(policy: SecurityPolicy) -> Option<&'static str> {
    policy.asymmetric_signature().map(|s| match s {
        SignatureScheme::Pkcs1Sha256 => RSA_SHA256_URI,
        SignatureScheme::PssSha256 => RSA_PSS_SHA256_URI,
    })
}

/// The AsymmetricEncryptionAlgorithm URI of `policy` (None for None).
pub fn encryption_algorithm_uri(policy: SecurityPolicy) -> Option<&'static str> {
    policy.asymmetric_encryption().map(|p| match p {
        EncryptionPadding::OaepSha1 => RSA_OAEP_URI,
        EncryptionPadding::OaepSha256 => RSA_OAEP_SHA256_URI,
    })
}

/// PolicyIds of the UserTokenPolicies this server publishes.
pub const POLICY_ANONYMOUS: &str = "anonymous";
/// See [`POLICY_ANONYMOUS`].
pub const POLICY_USERNAME: &str = "username";
/// See [`POLICY_ANONYMOUS`].
pub const POLICY_X509: &str = "x509";

/// Who activated a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserIdentity {
    /// The Anonymous token (or none).
    Anonymous,
    /// A configured user, by name.
    UserName(String),
    /// An X509 user certificate (boxed: rare, and every session holds a
    /// `UserIdentity`).
    X509(Box<X509User>),
}

/// The user of a session activated with an X509 user certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct X509User {
    /// The certificate's subject.
    pub subject: String,
    /// Its thumbprint.
    pub thumbprint: [u8; 20],
}

impl UserIdentity {
    /// The ClientUserId of the identity (Part 5): the user name, the
    /// certificate subject, or "Anonymous".
    pub fn client_user_id(&self) -> String {
        match self {
            UserIdentity::Anonymous => "Anonymous".to_owned(),
            UserIdentity::UserName(n) => n.clone(),
            UserIdentity::X509(x) => x.subject.clone(),
        }
    }
}

/// A configured user: a name and an argon2 hash in PHC string format
/// (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`). Plain-text passwords are
/// never accepted.
#[derive(Clone)]
pub struct UserAccount {
    name: String,
    password_hash: String,
}

impl std::fmt::Debug for UserAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserAccount")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl UserAccount {
    /// A user; `password_hash` must be an argon2 PHC string.
    pub fn new(name: &str, password_hash: &str) -> Result<UserAccount, &'static str> {
        if name.is_empty() {
            return Err("user name is empty");
        }
        let parsed = PasswordHash::new(password_hash)
            .map_err(|_| "not a PHC password hash string (use `uascale user hash`)")?;
        if !parsed.algorithm.as_str().starts_with("argon2") {
            return Err("password hash is not argon2 (argon2id, argon2i or argon2d)");
        }
        if parsed.hash.is_none() || parsed.salt.is_none() {
            return Err("password hash lacks its salt or hash part");
        }
        Ok(UserAccount {
            name: name.to_owned(),
            password_hash: password_hash.to_owned(),
        })
    }

    /// The user name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PHC hash string.
    pub fn password_hash(&self) -> &str {
        &self.password_hash
    }
}

/// Hashes `password` with argon2id, the default parameters of the argon2
/// crate (m = 19 MiB, t = 2, p = 1, the OWASP minimum) and a random salt.
pub fn hash_password(password: &[u8]) -> Result<String, &'static str> {
    let mut salt = [0u8; 16];
    getrandom::getrandom(&mut salt).map_err(|_| "no randomness for the salt")?;
    let salt = SaltString::encode_b64(&salt).map_err(|_| "salt encoding")?;
    Argon2::default()
        .hash_password(password, &salt)
        .map(|h| h.to_string())
        .map_err(|_| "argon2 hashing failed")
}

fn verify_phc(phc: &str, password: &[u8]) -> bool {
    PasswordHash::new(phc)
        .is_ok_and(|parsed| Argon2::default().verify_password(password, &parsed).is_ok())
}

/// The configured users.
#[derive(Debug, Default)]
pub struct UserDatabase {
    accounts: HashMap<String, UserAccount>,
    /// A hash with the first account's parameters, verified for unknown
    /// names so that timing does not tell which names exist.
    decoy: OnceLock<String>,
}

impl UserDatabase {
    /// The database of `accounts` (a later duplicate name replaces an
    /// earlier one; the configuration layer reports duplicates).
    pub fn new(accounts: Vec<UserAccount>) -> UserDatabase {
        UserDatabase {
            accounts: accounts.into_iter().map(|a| (a.name.clone(), a)).collect(),
            decoy: OnceLock::new(),
        }
    }

    /// Whether any user is configured (else UserName tokens are not offered).
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// Whether `password` is `name`'s. Takes an argon2 verification either
    /// way (tens of milliseconds with default parameters): call it outside
    /// any lock.
    pub fn verify(&self, name: &str, password: &[u8]) -> bool {
        match self.accounts.get(name) {
            Some(account) => verify_phc(&account.password_hash, password),
            None => {
                if let Some(decoy) = self.decoy_hash() {
                    let _ = verify_phc(decoy, password);
                }
                false
            }
        }
    }

    fn decoy_hash(&self) -> Option<&str> {
        if let Some(d) = self.decoy.get() {
            return Some(d);
        }
        let template = self.accounts.values().next()?;
        let parsed = PasswordHash::new(&template.password_hash).ok()?;
        let params = argon2::Params::try_from(&parsed).ok()?;
        let algorithm = argon2::Algorithm::try_from(parsed.algorithm).ok()?;
        let mut salt = [0u8; 16];
        getrandom::getrandom(&mut salt).ok()?;
        let salt = SaltString::encode_b64(&salt).ok()?;
        let hasher = Argon2::new(algorithm, argon2::Version::V0x13, params);
        let hash = hasher.hash_password(b"decoy", &salt).ok()?.to_string();
        Some(self.decoy.get_or_init(|| hash))
    }
}

/// Decrypts a UserName token's password or an IssuedToken's data (Part 4
/// §7.41.2.2, the legacy encrypted-secret format): RSA with `policy`'s
/// padding, giving `length (UInt32) | secret | server nonce`, where `length`
/// counts secret and nonce (bytes after them are ignored). The nonce must
/// be the one the server last sent; `BadIdentityTokenInvalid` otherwise.
pub fn decrypt_secret(
    key: &RsaPrivateKey,
    policy: SecurityPolicy,
    encryption_algorithm: &str,
    data: &[u8],
    server_nonce: &[u8],
) -> Result<Vec<u8>, StatusCode> {
    let invalid = |why: &str| {
        tracing::debug!(why, "encrypted user secret refused");
        StatusCode::BadIdentityTokenInvalid
    };
    let padding = policy
        .asymmetric_encryption()
        .ok_or_else(|| invalid("no asymmetric encryption in the policy"))?;
    if encryption_algorithm_uri(policy) != Some(encryption_algorithm) {
        return Err(invalid("encryption algorithm is not the policy's"));
    }
    let mut plain = Vec::new();
    key.decrypt(padding, data, &mut plain)
        .map_err(|_| invalid("RSA decryption failed"))?;
    let (len, rest) = plain
        .split_first_chunk::<4>()
        .ok_or_else(|| invalid("shorter than its length field"))?;
    let len = usize::try_from(u32::from_le_bytes(*len)).map_err(|_| invalid("length"))?;
    // Bytes after `length` are ignored (open62541 encrypts whole blocks).
    let rest = rest
        .get(..len)
        .ok_or_else(|| invalid("length field longer than the data"))?;
    if rest.len() < server_nonce.len() || server_nonce.is_empty() {
        return Err(invalid("shorter than the server nonce"));
    }
    let (secret, nonce) = rest.split_at(rest.len() - server_nonce.len());
    if !constant_time_eq(nonce, server_nonce) {
        return Err(invalid("not the last server nonce"));
    }
    Ok(secret.to_vec())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Verifies a SignatureData (ClientSignature, UserTokenSignature): the
/// algorithm URI must be `policy`'s and the signature over `data` valid
/// for `key`. Fails with `status`.
pub fn verify_signature(
    key: &RsaPublicKey,
    policy: SecurityPolicy,
    algorithm: &str,
    data: &[u8],
    signature: &[u8],
    status: StatusCode,
) -> Result<(), StatusCode> {
    let scheme = policy.asymmetric_signature().ok_or(status)?;
    if signature_algorithm_uri(policy) != Some(algorithm) {
        return Err(status);
    }
    key.verify(scheme, data, signature).map_err(|_| status)
}

/// Signs `data` with the server key under `policy` (ServerSignature);
/// returns the algorithm URI and the signature. None for SecurityPolicy None.
pub fn sign(
    key: &RsaPrivateKey,
    policy: SecurityPolicy,
    data: &[u8],
) -> Result<Option<(&'static str, Vec<u8>)>, StatusCode> {
    let (Some(scheme), Some(uri)) = (
        policy.asymmetric_signature(),
        signature_algorithm_uri(policy),
    ) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    key.sign(scheme, data, &mut out)
        .map_err(|_| StatusCode::BadInternalError)?;
    Ok(Some((uri, out)))
}

/// Failures within this window count toward the lockout.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// How long a key stays locked out.
pub const LOCKOUT: Duration = Duration::from_secs(300);
/// Most keys tracked; beyond it, entries that neither lock nor count are
/// dropped first, and new keys are not tracked while the table is full of
/// live ones (memory stays bounded under a flood of distinct clients).
pub const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct FailureEntry {
    first: Instant,
    count: u32,
    locked_until: Option<Instant>,
}

/// `max_failed_authentication_attempts`: per key (client certificate
/// thumbprint, else application URI, else channel) failures within a minute
/// are counted; at the limit the key is locked out for five minutes, during
/// which ActivateSession answers `BadUserAccessDenied` without checking the
/// credentials. A successful non-anonymous activation clears the count.
#[derive(Debug)]
pub struct AuthFailures {
    max: u32,
    entries: Mutex<HashMap<String, FailureEntry>>,
}

impl AuthFailures {
    /// A tracker allowing `max` failures (0 disables the lockout).
    pub fn new(max: u32) -> AuthFailures {
        AuthFailures {
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, FailureEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `BadUserAccessDenied` while `key` is locked out.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), StatusCode> {
        if self.max == 0 {
            return Ok(());
        }
        match self.lock().get(key).and_then(|e| e.locked_until) {
            Some(until) if now < until => Err(StatusCode::BadUserAccessDenied),
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication of `key`; true when this failure
    /// locked it out.
    pub fn failed(&self, key: &str, now: Instant) -> bool {
        if self.max == 0 {
            return false;
        }
        let mut entries = self.lock();
        if !entries.contains_key(key) && entries.len() >= MAX_TRACKED {
            entries.retain(|_, e| is_live(e, now));
            if entries.len() >= MAX_TRACKED {
                return false;
            }
        }
        let entry = entries.entry(key.to_owned()).or_insert(FailureEntry {
            first: now,
            count: 0,
            locked_until: None,
        });
        if entry.locked_until.is_some_and(|u| now < u) {
            return false;
        }
        if now.saturating_duration_since(entry.first) >= FAILURE_WINDOW
            || entry.locked_until.is_some()
        {
            *entry = FailureEntry {
                first: now,
                count: 0,
                locked_until: None,
            };
        }
        entry.count = entry.count.saturating_add(1);
        if entry.count >= self.max {
            entry.locked_until = Some(now + LOCKOUT);
            tracing::warn!(
                key,
                "too many failed authentications; locked out for 5 minutes"
            );
            return true;
        }
        false
    }

    /// Clears `key`'s count after a successful non-anonymous activation.
    pub fn succeeded(&self, key: &str) {
        if self.max != 0 {
            self.lock().remove(key);
        }
    }

    /// Keys currently tracked.
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }
}

fn is_live(e: &FailureEntry, now: Instant) -> bool {
    e.locked_until.is_some_and(|u| now < u)
        || now.saturating_duration_since(e.first) < FAILURE_WINDOW
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    /// Cheap parameters so debug-build tests stay fast; the format is the
    /// same as `hash_password`'s.
    fn cheap_hash(password: &[u8]) -> String {
        let params = argon2::Params::new(64, 1, 1, None).unwrap();
        let a = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        a.hash_password(password, &salt).unwrap().to_string()
    }

    #[test]
    fn accounts_take_only_argon2_hashes() {
        let hash = cheap_hash(b"secret");
        assert!(hash.starts_with("$argon2id$"));
        UserAccount::new("alice", &hash).unwrap();
        assert!(UserAccount::new("alice", "secret").is_err());
        assert!(UserAccount::new("", &hash).is_err());
        // A PHC string of another algorithm.
        assert!(UserAccount::new("alice", "$pbkdf2-sha256$i=1000$c2FsdA$aGFzaA").is_err());
        assert!(UserAccount::new("alice", "$argon2id$v=19$m=64,t=1,p=1").is_err());
    }

    #[test]
    fn verify_passwords() {
        let db = UserDatabase::new(vec![
            UserAccount::new("alice", &cheap_hash(b"wonderland")).unwrap(),
            UserAccount::new("bob", &cheap_hash(b"builder")).unwrap(),
        ]);
        assert!(db.verify("alice", b"wonderland"));
        assert!(!db.verify("alice", b"builder"));
        assert!(!db.verify("bob", b""));
        assert!(db.verify("bob", b"builder"));
        assert!(!db.verify("carol", b"wonderland"));
        assert!(
            db.decoy.get().is_some(),
            "unknown names cost a verification"
        );
        assert!(!UserDatabase::new(vec![]).verify("alice", b"x"));
    }

    #[test]
    fn default_hash_verifies() {
        // The real parameters once (slow in debug builds, but it is the
        // format operators put in the configuration).
        let hash = hash_password(b"pw").unwrap();
        assert!(
            hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{hash}"
        );
        let db = UserDatabase::new(vec![UserAccount::new("u", &hash).unwrap()]);
        assert!(db.verify("u", b"pw"));
        assert_ne!(hash_password(b"pw").unwrap(), hash, "salted");
    }

    fn keys() -> (RsaPrivateKey, RsaPublicKey) {
        let key = RsaPrivateKey::generate(2048).unwrap();
        let public = RsaPublicKey::from_spki_der(key.public_key().spki_der()).unwrap();
        (key, public)
    }

    fn encrypt_secret(
        key: &RsaPublicKey,
        policy: SecurityPolicy,
        secret: &[u8],
        nonce: &[u8],
    ) -> Vec<u8> {
        let mut plain = ((secret.len() + nonce.len()) as u32).to_le_bytes().to_vec();
        plain.extend_from_slice(secret);
        plain.extend_from_slice(nonce);
        let mut out = Vec::new();
        key.encrypt(policy.asymmetric_encryption().unwrap(), &plain, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn encrypted_secret_round_trip_and_failures() {
        let (key, public) = keys();
        let nonce = [7u8; 32];
        for policy in [
            SecurityPolicy::Basic256Sha256,
            SecurityPolicy::Aes128Sha256RsaOaep,
            SecurityPolicy::Aes256Sha256RsaPss,
        ] {
            let uri = encryption_algorithm_uri(policy).unwrap();
            let data = encrypt_secret(&public, policy, b"p4ss", &nonce);
            assert_eq!(
                decrypt_secret(&key, policy, uri, &data, &nonce).unwrap(),
                b"p4ss"
            );
            // Another nonce (a replay from an earlier activation).
            assert_eq!(
                decrypt_secret(&key, policy, uri, &data, &[8u8; 32]),
                Err(StatusCode::BadIdentityTokenInvalid)
            );
            // The wrong algorithm name.
            assert!(decrypt_secret(&key, policy, "urn:other", &data, &nonce).is_err());
            // Tampered ciphertext.
            let mut bad = data.clone();
            bad[10] ^= 1;
            assert!(decrypt_secret(&key, policy, uri, &bad, &nonce).is_err());
            assert!(decrypt_secret(&key, policy, uri, &[], &nonce).is_err());
        }
        // A length field that lies.
        let mut plain = 1000u32.to_le_bytes().to_vec();
        plain.extend_from_slice(&nonce);
        let mut data = Vec::new();
        public
            .encrypt(EncryptionPadding::OaepSha1, &plain, &mut data)
            .unwrap();
        assert!(decrypt_secret(
            &key,
            SecurityPolicy::Basic256Sha256,
            RSA_OAEP_URI,
            &data,
            &nonce
        )
        .is_err());
        // No asymmetric encryption under None.
        assert!(decrypt_secret(&key, SecurityPolicy::None, "", &data, &nonce).is_err());
    }

    #[test]
    fn signatures() {
        let (key, public) = keys();
        for policy in [
            SecurityPolicy::Basic256Sha256,
            SecurityPolicy::Aes256Sha256RsaPss,
        ] {
            let (uri, sig) = sign(&key, policy, b"cert+nonce").unwrap().unwrap();
            let bad = StatusCode::BadApplicationSignatureInvalid;
            verify_signature(&public, policy, uri, b"cert+nonce", &sig, bad).unwrap();
            assert_eq!(
                verify_signature(&public, policy, uri, b"cert+nonce!", &sig, bad),
                Err(bad)
            );
            assert_eq!(
                verify_signature(&public, policy, "urn:x", b"cert+nonce", &sig, bad),
                Err(bad)
            );
        }
        assert_eq!(sign(&key, SecurityPolicy::None, b"x").unwrap(), None);
        assert_eq!(
            signature_algorithm_uri(SecurityPolicy::Aes128Sha256RsaOaep),
            Some(RSA_SHA256_URI)
        );
    }

    #[test]
    fn lockout_after_max_failures_within_a_minute() {
        let t0 = Instant::now();
        let f = AuthFailures::new(3);
        assert!(!f.failed("k", t0));
        assert!(!f.failed("k", t0 + Duration::from_secs(10)));
        assert_eq!(f.check("k", t0 + Duration::from_secs(11)), Ok(()));
        assert!(f.failed("k", t0 + Duration::from_secs(20)), "the lockout");
        assert!(
            !f.failed("k", t0 + Duration::from_secs(21)),
            "already locked"
        );
        assert_eq!(
            f.check("k", t0 + Duration::from_secs(21)),
            Err(StatusCode::BadUserAccessDenied)
        );
        assert_eq!(f.check("other", t0 + Duration::from_secs(21)), Ok(()));
        // Still locked just before five minutes, free after.
        assert!(f.check("k", t0 + Duration::from_secs(20 + 299)).is_err());
        assert_eq!(f.check("k", t0 + Duration::from_secs(20 + 300)), Ok(()));
        // After the lockout, counting starts over.
        f.failed("k", t0 + Duration::from_secs(400));
        assert_eq!(f.check("k", t0 + Duration::from_secs(401)), Ok(()));

        // Failures spread over more than a minute do not lock.
        let g = AuthFailures::new(2);
        g.failed("k", t0);
        g.failed("k", t0 + Duration::from_secs(61));
        assert_eq!(g.check("k", t0 + Duration::from_secs(62)), Ok(()));
        // Success clears.
        g.succeeded("k");
        g.failed("k", t0 + Duration::from_secs(63));
        assert_eq!(g.check("k", t0 + Duration::from_secs(64)), Ok(()));
        assert_eq!(g.tracked(), 1);

        // 0 disables.
        let off = AuthFailures::new(0);
        for i in 0..10 {
            off.failed("k", t0 + Duration::from_secs(i));
        }
        assert_eq!(off.check("k", t0 + Duration::from_secs(11)), Ok(()));
        assert_eq!(off.tracked(), 0);
    }
}
