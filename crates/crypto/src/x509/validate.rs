//! Certificate validation (Part 4 §6.1.3, Table 100 "Certificate validation
//! steps"): chain building through trusted and issuer certificates,
//! signature of each link, security policy checks, trust, validity, URI,
//! usage and revocation. Pure: the caller passes the trust list and time.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use uascale_types::StatusCode;

use super::crl::Crl;
use super::{Certificate, HashAlgorithm, KeyAlgorithm, KeyUsage, SignatureAlgorithm};
use crate::CryptoError;

/// Chains longer than this (leaf + CAs) are not followed.
pub const MAX_CHAIN_DEPTH: usize = 8;

fn fail(status: StatusCode, what: &'static str) -> CryptoError {
    CryptoError::Certificate { status, what }
}

/// What the certificate is presented for; decides the usage checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateUse {
    /// A client's application instance certificate (seen by a server).
    Client,
    /// A server's application instance certificate (seen by a client).
    Server,
    /// A user identity certificate (X509IdentityToken).
    User,
}

/// How strictly to validate.
#[derive(Debug, Clone)]
pub struct ValidationOptions<'a> {
    /// What the certificate is used for.
    pub usage: CertificateUse,
    /// The applicationUri the peer claims (ApplicationDescription); when
    /// given, it must equal the URI in the certificate's subjectAltName.
    pub application_uri: Option<&'a str>,
    /// Smallest RSA key the security policy accepts (2048 for the policies
    /// this stack implements, Part 7).
    pub min_key_bits: usize,
    /// Largest RSA key of the leaf the policy accepts (4096).
    pub max_key_bits: usize,
    /// The security policy the certificate is used with. An ECC policy
    /// requires a key on its curve (and no keyEncipherment usage); an RSA
    /// policy an RSA key; None accepts either kind (RSA within the bits).
    pub policy: Option<crate::policy::SecurityPolicy>,
    /// Accept SHA-1 signatures in the chain. Off by default: SHA-1 collisions
    /// are practical, and no policy this stack offers needs it.
    pub allow_sha1_signatures: bool,
    /// Reject a CA-issued certificate when no CRL of its issuer is known
    /// (BadCertificateRevocationUnknown). On by default: without a CRL a
    /// revoked certificate would pass.
    pub reject_unknown_revocation_status: bool,
    /// Skip chain building and the trust check (every other check still
    /// runs on the certificate itself). Unsafe; for tests and
    /// commissioning only.
    pub trust_all: bool,
}

impl Default for ValidationOptions<'_> {
    fn default() -> Self {
        ValidationOptions {
            usage: CertificateUse::Client,
            application_uri: None,
            min_key_bits: 2048,
            max_key_bits: 4096,
            policy: None,
            allow_sha1_signatures: false,
            reject_unknown_revocation_status: true,
            trust_all: false,
        }
    }
}

/// Why a CRL from the PKI was not taken into the trust list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredCrl {
    /// The CRL's issuer, as text.
    pub issuer: String,
    /// Why it was ignored.
    pub reason: &'static str,
}

/// The trusted certificates, issuer certificates (for chain building only)
/// and their CRLs, indexed for validation. Immutable once built: reloading
/// builds a new one.
#[derive(Debug, Default)]
pub struct TrustList {
    certs: Vec<Certificate>,
    trusted: HashSet<[u8; 20]>,
    by_subject: HashMap<Vec<u8>, Vec<usize>>,
    crls: HashMap<[u8; 20], Vec<Crl>>,
    ignored_crls: Vec<IgnoredCrl>,
}

impl TrustList {
    /// Builds a trust list. Each CRL is matched to the CA that issued it and
    /// its signature verified here, once; CRLs without a known issuer or
    /// with a bad signature are ignored (see [`TrustList::ignored_crls`]).
    pub fn new(trusted: Vec<Certificate>, issuers: Vec<Certificate>, crls: Vec<Crl>) -> TrustList {
        let mut list = TrustList::default();
        let mut seen = HashSet::new();
        for (cert, is_trusted) in trusted
            .into_iter()
            .map(|c| (c, true))
            .chain(issuers.into_iter().map(|c| (c, false)))
        {
            if is_trusted {
                list.trusted.insert(cert.thumbprint());
            }
            if seen.insert(cert.thumbprint()) {
                list.by_subject
                    .entry(cert.subject_der().to_vec())
                    .or_default()
                    .push(list.certs.len());
                list.certs.push(cert);
            }
        }
        for crl in crls {
            let issuers = list
                .by_subject
                .get(crl.issuer_der())
                .cloned()
                .unwrap_or_default();
            let signer = issuers
                .iter()
                .filter_map(|i| list.certs.get(*i))
                .find(|ca| {
                    verify_signed(
                        ca,
                        crl.signature_algorithm(),
                        crl.tbs_der(),
                        crl.signature(),
                        true,
                    )
                    .is_ok()
                });
            match signer {
                Some(ca) => {
                    let key = ca.thumbprint();
                    list.crls.entry(key).or_default().push(crl);
                }
                None => list.ignored_crls.push(IgnoredCrl {
                    issuer: crl.issuer_name().to_owned(),
                    reason: if issuers.is_empty() {
                        "no trusted or issuer certificate has the CRL's issuer name"
                    } else {
                        "the CRL's signature does not verify with its issuer's key"
                    },
                }),
            }
        }
        list
    }

    /// CRLs that were not taken in, and why (for the operator's log).
    pub fn ignored_crls(&self) -> &[IgnoredCrl] {
        &self.ignored_crls
    }

    /// Whether this exact certificate is in the trusted list.
    pub fn is_trusted(&self, cert: &Certificate) -> bool {
        self.trusted.contains(&cert.thumbprint())
    }

    /// Number of trusted certificates.
    pub fn trusted_count(&self) -> usize {
        self.trusted.len()
    }

    /// Number of certificates known (trusted and issuers).
    pub fn certificate_count(&self) -> usize {
        self.certs.len()
    }

    /// Validates `chain` (leaf first, then any CA certificates the peer sent
    /// along, which help build the chain but are never trusted by being
    /// sent) at time `now`. The checks run in the order of Part 4 Table 100;
    /// the first failure is returned with its StatusCode.
    pub fn validate(
        &self,
        chain: &[Certificate],
        options: &ValidationOptions<'_>,
        now: SystemTime,
    ) -> Result<(), CryptoError> {
        let leaf = chain
            .first()
            .ok_or(fail(StatusCode::BadCertificateInvalid, "no certificate"))?;
        check_structure(leaf)?;
        check_leaf_policy(leaf, options)?;

        let path = if options.trust_all {
            if leaf.is_self_issued() {
                check_link(leaf, leaf, options)?;
            }
            vec![leaf]
        } else {
            let path = self.build_path(leaf, chain.get(1..).unwrap_or(&[]), options)?;
            if !path.iter().any(|c| self.trusted.contains(&c.thumbprint())) {
                return Err(fail(
                    StatusCode::BadCertificateUntrusted,
                    "neither the certificate nor an issuer is trusted",
                ));
            }
            path
        };

        for (i, cert) in path.iter().enumerate() {
            if !cert.is_time_valid(now) {
                return Err(if i == 0 {
                    fail(
                        StatusCode::BadCertificateTimeInvalid,
                        "certificate outside its validity period",
                    )
                } else {
                    fail(
                        StatusCode::BadCertificateIssuerTimeInvalid,
                        "issuer certificate outside its validity period",
                    )
                });
            }
        }

        if let Some(claimed) = options.application_uri {
            if leaf.application_uri() != Some(claimed) {
                return Err(fail(
                    StatusCode::BadCertificateUriInvalid,
                    "applicationUri differs from the URI in the certificate",
                ));
            }
        }

        check_leaf_usage(leaf, options.usage)?;
        for (i, ca) in path.iter().enumerate().skip(1) {
            let usable = ca.is_ca()
                && ca
                    .key_usage()
                    .is_none_or(|ku| ku.contains(KeyUsage::KEY_CERT_SIGN))
                && ca
                    .path_len_constraint()
                    .is_none_or(|n| usize::try_from(n).map_or(true, |n| i - 1 <= n));
            if !usable {
                return Err(fail(
                    StatusCode::BadCertificateIssuerUseNotAllowed,
                    "issuer certificate is not a CA allowed to sign certificates",
                ));
            }
        }

        if !options.trust_all {
            self.check_revocation(&path, options)?;
        }
        Ok(())
    }

    /// Walks from `leaf` to a self-signed root, each link's signature
    /// verified. Candidates come from the trust list and `extra`.
    fn build_path<'a>(
        &'a self,
        leaf: &'a Certificate,
        extra: &'a [Certificate],
        options: &ValidationOptions<'_>,
    ) -> Result<Vec<&'a Certificate>, CryptoError> {
        let mut path = vec![leaf];
        loop {
            let Some(&current) = path.last() else {
                return Err(fail(StatusCode::BadCertificateInvalid, "empty path"));
            };
            if current.is_self_issued() {
                check_link(current, current, options)?;
                return Ok(path);
            }
            if path.len() >= MAX_CHAIN_DEPTH {
                return Err(fail(
                    StatusCode::BadCertificateChainIncomplete,
                    "certificate chain longer than 8",
                ));
            }
            let known = self
                .by_subject
                .get(current.issuer_der())
                .into_iter()
                .flatten()
                .filter_map(|i| self.certs.get(*i));
            let sent = extra
                .iter()
                .filter(|c| c.subject_der() == current.issuer_der());
            let mut candidates = known
                .chain(sent)
                .filter(|c| !path.iter().any(|p| p.thumbprint() == c.thumbprint()))
                .filter(|c| match (current.authority_key_id(), c.subject_key_id()) {
                    (Some(aki), Some(ski)) => aki == ski,
                    _ => true,
                })
                .peekable();
            if candidates.peek().is_none() {
                return Err(fail(
                    StatusCode::BadCertificateChainIncomplete,
                    "issuer certificate not found in trusted or issuer lists",
                ));
            }
            let mut first_error = None;
            let mut next = None;
            for candidate in candidates {
                match check_link(current, candidate, options) {
                    Ok(()) => {
                        next = Some(candidate);
                        break;
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            match (next, first_error) {
                (Some(issuer), _) => path.push(issuer),
                (None, Some(e)) => return Err(e),
                (None, None) => {
                    return Err(fail(
                        StatusCode::BadCertificateChainIncomplete,
                        "issuer certificate not found",
                    ))
                }
            }
        }
    }

    fn check_revocation(
        &self,
        path: &[&Certificate],
        options: &ValidationOptions<'_>,
    ) -> Result<(), CryptoError> {
        for (i, pair) in path.windows(2).enumerate() {
            let [cert, issuer] = pair else { continue };
            let crls = self.crls.get(&issuer.thumbprint());
            let (revoked, unknown) = if i == 0 {
                (
                    StatusCode::BadCertificateRevoked,
                    StatusCode::BadCertificateRevocationUnknown,
                )
            } else {
                (
                    StatusCode::BadCertificateIssuerRevoked,
                    StatusCode::BadCertificateIssuerRevocationUnknown,
                )
            };
            match crls {
                Some(crls) if crls.iter().any(|crl| crl.revokes(cert)) => {
                    return Err(fail(revoked, "certificate is revoked by its issuer's CRL"))
                }
                Some(_) => {}
                None if options.reject_unknown_revocation_status => {
                    return Err(fail(unknown, "no CRL of the issuing CA is known"))
                }
                None => {}
            }
        }
        Ok(())
    }
}

fn check_structure(cert: &Certificate) -> Result<(), CryptoError> {
    if cert.has_unknown_critical_extension() {
        return Err(fail(
            StatusCode::BadCertificateInvalid,
            "certificate has a critical extension this stack does not know",
        ));
    }
    Ok(())
}

fn check_leaf_policy(
    leaf: &Certificate,
    options: &ValidationOptions<'_>,
) -> Result<(), CryptoError> {
    let ecc = options.policy.filter(|p| p.is_ecc());
    match (leaf.ecc_curve(), ecc) {
        (Some(curve), Some(policy)) => return policy.check_key_curve(curve),
        (Some(_), None) if options.policy.is_none() => return Ok(()),
        (None, None) if leaf.key_algorithm() == KeyAlgorithm::Rsa => {}
        (_, Some(_)) => {
            return Err(fail(
                StatusCode::BadCertificatePolicyCheckFailed,
                "certificate key is not on the security policy's curve",
            ))
        }
        _ => {
            return Err(fail(
                StatusCode::BadCertificatePolicyCheckFailed,
                "certificate key is not RSA",
            ))
        }
    }
    if leaf.key_bits() < options.min_key_bits || leaf.key_bits() > options.max_key_bits {
        return Err(fail(
            StatusCode::BadCertificatePolicyCheckFailed,
            "certificate key length not allowed by the security policy",
        ));
    }
    Ok(())
}

/// Checks that `issuer` signed `cert` with an acceptable algorithm and key.
fn check_link(
    cert: &Certificate,
    issuer: &Certificate,
    options: &ValidationOptions<'_>,
) -> Result<(), CryptoError> {
    check_structure(issuer)?;
    if issuer.key_algorithm() == KeyAlgorithm::Rsa && issuer.key_bits() < options.min_key_bits {
        return Err(fail(
            StatusCode::BadCertificatePolicyCheckFailed,
            "issuer key shorter than the security policy allows",
        ));
    }
    verify_signed(
        issuer,
        cert.signature_algorithm(),
        cert.tbs_der(),
        cert.signature(),
        options.allow_sha1_signatures,
    )
}

fn check_leaf_usage(leaf: &Certificate, usage: CertificateUse) -> Result<(), CryptoError> {
    let not_allowed = |what| fail(StatusCode::BadCertificateUseNotAllowed, what);
    if let Some(ku) = leaf.key_usage() {
        if !ku.contains(KeyUsage::DIGITAL_SIGNATURE) {
            return Err(not_allowed("key usage lacks digitalSignature"));
        }
        // EC keys sign and agree keys; they never encipher.
        if usage != CertificateUse::User
            && leaf.key_algorithm() == KeyAlgorithm::Rsa
            && !ku.contains(KeyUsage::KEY_ENCIPHERMENT)
        {
            return Err(not_allowed("key usage lacks keyEncipherment"));
        }
    }
    if let Some(eku) = leaf.extended_key_usage() {
        let ok = match usage {
            CertificateUse::Client => eku.client_auth || eku.any,
            CertificateUse::Server => eku.server_auth || eku.any,
            CertificateUse::User => true,
        };
        if !ok {
            return Err(not_allowed(
                "extended key usage lacks clientAuth/serverAuth for this use",
            ));
        }
    }
    Ok(())
}

/// Verifies `signature` over `message` with `signer`'s public key.
/// SHA-1 is refused (BadCertificatePolicyCheckFailed) unless `allow_sha1`;
/// a wrong signature is BadCertificateInvalid.
pub(crate) fn verify_signed(
    signer: &Certificate,
    algorithm: SignatureAlgorithm,
    message: &[u8],
    signature: &[u8],
    allow_sha1: bool,
) -> Result<(), CryptoError> {
    let policy = |what| fail(StatusCode::BadCertificatePolicyCheckFailed, what);
    let alg: &'static dyn VerificationAlgorithm = match (algorithm, signer.key_algorithm()) {
        (SignatureAlgorithm::RsaPkcs1(HashAlgorithm::Sha1), _)
        | (SignatureAlgorithm::RsaPss(HashAlgorithm::Sha1), _)
        | (SignatureAlgorithm::Ecdsa(HashAlgorithm::Sha1), _)
            if !allow_sha1 =>
        {
            return Err(policy("SHA-1 signature"))
        }
        (SignatureAlgorithm::RsaPkcs1(h), KeyAlgorithm::Rsa) => match h {
            HashAlgorithm::Sha1 => &signature::RSA_PKCS1_1024_8192_SHA1_FOR_LEGACY_USE_ONLY,
            HashAlgorithm::Sha256 => &signature::RSA_PKCS1_1024_8192_SHA256_FOR_LEGACY_USE_ONLY,
            HashAlgorithm::Sha384 => &signature::RSA_PKCS1_2048_8192_SHA384,
            HashAlgorithm::Sha512 => &signature::RSA_PKCS1_1024_8192_SHA512_FOR_LEGACY_USE_ONLY,
        },
        (SignatureAlgorithm::RsaPss(h), KeyAlgorithm::Rsa) => match h {
            HashAlgorithm::Sha256 => &signature::RSA_PSS_2048_8192_SHA256,
            HashAlgorithm::Sha384 => &signature::RSA_PSS_2048_8192_SHA384,
            HashAlgorithm::Sha512 => &signature::RSA_PSS_2048_8192_SHA512,
            HashAlgorithm::Sha1 => return Err(policy("RSA-PSS with SHA-1 is not supported")),
        },
        (SignatureAlgorithm::Ecdsa(h), KeyAlgorithm::Ec) => match (h, signer.key_bits()) {
            (HashAlgorithm::Sha256, 256) => &signature::ECDSA_P256_SHA256_ASN1,
            (HashAlgorithm::Sha384, 256) => &signature::ECDSA_P256_SHA384_ASN1,
            (HashAlgorithm::Sha256, 384) => &signature::ECDSA_P384_SHA256_ASN1,
            (HashAlgorithm::Sha384, 384) => &signature::ECDSA_P384_SHA384_ASN1,
            _ => return Err(policy("unsupported ECDSA curve or hash")),
        },
        (SignatureAlgorithm::Ed25519, KeyAlgorithm::Ed25519) => &signature::ED25519,
        (SignatureAlgorithm::Unsupported, _) => {
            return Err(policy("unsupported signature algorithm"))
        }
        _ => {
            return Err(fail(
                StatusCode::BadCertificateInvalid,
                "signature algorithm does not match the issuer's key",
            ))
        }
    };
    let key = verified_key(signer.public_key_der(), algorithm, message, signature);
    if VERIFIED.knows(&key) {
        return Ok(());
    }
    UnparsedPublicKey::new(alg, signer.public_key_der())
        .verify(message, signature)
        .map_err(|_| {
            fail(
                StatusCode::BadCertificateInvalid,
                "certificate signature does not verify",
            )
        })?;
    VERIFIED.remember(key);
    Ok(())
}

/// Certificate signatures that verified, by a SHA-256 over the signer's
/// key, the algorithm, the signed bytes and the signature: a pure function
/// of its inputs, so a client that reconnects (every session of a storm
/// presents the same certificate again) costs its certificate's signature
/// check once, not once per channel. Failures are not remembered. Bounded:
/// when full it starts over.
struct Verified(std::sync::Mutex<HashSet<[u8; 32], FixedState>>);

/// A fixed hasher is enough: the keys are SHA-256 outputs, and only
/// signatures that verified get in.
type FixedState = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// How many verified signatures are remembered (32 bytes each).
const VERIFIED_CAPACITY: usize = 4096;

static VERIFIED: Verified = Verified(std::sync::Mutex::new(HashSet::with_hasher(
    std::hash::BuildHasherDefault::new(),
)));

impl Verified {
    fn knows(&self, key: &[u8; 32]) -> bool {
        self.0.lock().is_ok_and(|set| set.contains(key))
    }

    fn remember(&self, key: [u8; 32]) {
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= VERIFIED_CAPACITY {
                set.clear();
            }
            set.insert(key);
        }
    }
}

fn verified_key(
    public_key: &[u8],
    algorithm: SignatureAlgorithm,
    message: &[u8],
    signature: &[u8],
) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    // Each part length-prefixed, so no two inputs share a byte string.
    let tag = format!("{algorithm:?}");
    for part in [public_key, tag.as_bytes(), message, signature] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}
