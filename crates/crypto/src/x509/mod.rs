//! X.509 certificates: parse, create, validate against trust lists.
//!
//! A [`Certificate`] is parsed once ([`Certificate::from_der`]) and keeps its
//! DER plus the fields OPC UA needs (Part 6 §6.2): subject and issuer, validity,
//! the public key, the applicationUri in the subjectAltName, key usages. It
//! owns its bytes, so it can be stored in trust lists and sessions.
//!
//! [`create_self_signed`] makes an application instance certificate. Nothing
//! here reads files or clocks: callers pass bytes and time in.

mod create;
mod crl;
mod peer;
mod validate;

use std::net::IpAddr;
use std::ops::Range;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uascale_types::StatusCode;
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{
    Oid, OID_HASH_SHA1, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_HASH_SHA256, OID_NIST_HASH_SHA384,
    OID_NIST_HASH_SHA512, OID_PKCS1_RSAENCRYPTION, OID_PKCS1_RSASSAPSS, OID_PKCS1_SHA1WITHRSA,
    OID_PKCS1_SHA256WITHRSA, OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA,
    OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384,
};
use x509_parser::signature_algorithm::RsaSsaPssParams;

use crate::CryptoError;

pub use create::{create_self_signed, KeyType, SelfSigned, SelfSignedParams};
pub use crl::{Crl, MAX_CRL_SIZE};
pub use peer::PeerCertificate;
pub use validate::{CertificateUse, IgnoredCrl, TrustList, ValidationOptions, MAX_CHAIN_DEPTH};

/// id-Ed25519 (1.3.101.112), DER contents.
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// Certificates larger than this are refused before parsing (a certificate
/// from the network is bounded by the message size anyway; this keeps a
/// single parse cheap).
pub const MAX_CERTIFICATE_SIZE: usize = 32 * 1024;

/// The hash used by a certificate signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlgorithm {
    /// SHA-1: broken for signatures; rejected unless explicitly allowed.
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

/// How a certificate (or CRL) is signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignatureAlgorithm {
    /// RSASSA-PKCS1-v1_5 with the given hash.
    RsaPkcs1(HashAlgorithm),
    /// RSASSA-PSS with MGF1 of the same hash and a salt as long as the hash.
    RsaPss(HashAlgorithm),
    /// ECDSA with the given hash.
    Ecdsa(HashAlgorithm),
    /// Pure Ed25519.
    Ed25519,
    /// Anything else (or PSS with parameters this stack cannot verify).
    Unsupported,
}

/// The KeyUsage bits (RFC 5280 §4.2.1.3), as named flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyUsage(u16);

impl KeyUsage {
    /// digitalSignature.
    pub const DIGITAL_SIGNATURE: KeyUsage = KeyUsage(1);
    /// nonRepudiation (contentCommitment).
    pub const NON_REPUDIATION: KeyUsage = KeyUsage(1 << 1);
    /// keyEncipherment.
    pub const KEY_ENCIPHERMENT: KeyUsage = KeyUsage(1 << 2);
    /// dataEncipherment.
    pub const DATA_ENCIPHERMENT: KeyUsage = KeyUsage(1 << 3);
    /// keyAgreement.
    pub const KEY_AGREEMENT: KeyUsage = KeyUsage(1 << 4);
    /// keyCertSign.
    pub const KEY_CERT_SIGN: KeyUsage = KeyUsage(1 << 5);
    /// cRLSign.
    pub const CRL_SIGN: KeyUsage = KeyUsage(1 << 6);

    /// Whether every bit of `other` is set in `self`.
    pub fn contains(self, other: KeyUsage) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of two sets of bits.
    pub const fn union(self, other: KeyUsage) -> KeyUsage {
        KeyUsage(self.0 | other.0)
    }

    /// The names of the set bits, for display.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: [&str; 9] = [
            "digitalSignature",
            "nonRepudiation",
            "keyEncipherment",
            "dataEncipherment",
            "keyAgreement",
            "keyCertSign",
            "cRLSign",
            "encipherOnly",
            "decipherOnly",
        ];
        NAMES
            .iter()
            .enumerate()
            .filter(|(bit, _)| self.0 & (1 << bit) != 0)
            .map(|(_, name)| *name)
            .collect()
    }
}

/// The ExtendedKeyUsage purposes OPC UA cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtendedKeyUsage {
    /// id-kp-serverAuth.
    pub server_auth: bool,
    /// id-kp-clientAuth.
    pub client_auth: bool,
    /// anyExtendedKeyUsage.
    pub any: bool,
}

/// The public key algorithm of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// rsaEncryption.
    Rsa,
    /// id-ecPublicKey.
    Ec,
    /// id-Ed25519.
    Ed25519,
    /// Anything else.
    Other,
}

/// A parsed X.509 certificate that owns its DER.
#[derive(Clone)]
pub struct Certificate {
    der: Vec<u8>,
    thumbprint: [u8; 20],
    tbs: Range<usize>,
    spki: Range<usize>,
    public_key: Range<usize>,
    subject: Range<usize>,
    issuer: Range<usize>,
    serial: Range<usize>,
    signature: Range<usize>,
    signature_algorithm: SignatureAlgorithm,
    key_algorithm: KeyAlgorithm,
    key_bits: usize,
    not_before: i64,
    not_after: i64,
    subject_name: String,
    issuer_name: String,
    common_name: Option<String>,
    application_uri: Option<String>,
    dns_names: Vec<String>,
    ip_addresses: Vec<IpAddr>,
    key_usage: Option<KeyUsage>,
    extended_key_usage: Option<ExtendedKeyUsage>,
    ca: bool,
    path_len: Option<u32>,
    subject_key_id: Option<Range<usize>>,
    authority_key_id: Option<Range<usize>>,
    unknown_critical_extension: bool,
}

impl std::fmt::Debug for Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("subject", &self.subject_name)
            .field("issuer", &self.issuer_name)
            .field("thumbprint", &hex(&self.thumbprint))
            .finish_non_exhaustive()
    }
}

impl PartialEq for Certificate {
    fn eq(&self, other: &Self) -> bool {
        self.der == other.der
    }
}

impl Eq for Certificate {}

fn bad_cert(what: &'static str) -> CryptoError {
    CryptoError::Certificate {
        status: StatusCode::BadCertificateInvalid,
        what,
    }
}

/// Where `part` (a sub-slice of `whole`) lies in `whole`.
fn range_in(whole: &[u8], part: &[u8]) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

fn hash_of(oid: &Oid<'_>) -> Option<HashAlgorithm> {
    if *oid == OID_HASH_SHA1 {
        Some(HashAlgorithm::Sha1)
    } else if *oid == OID_NIST_HASH_SHA256 {
        Some(HashAlgorithm::Sha256)
    } else if *oid == OID_NIST_HASH_SHA384 {
        Some(HashAlgorithm::Sha384)
    } else if *oid == OID_NIST_HASH_SHA512 {
        Some(HashAlgorithm::Sha512)
    } else {
        None
    }
}

impl HashAlgorithm {
    fn output_len(self) -> u32 {
        match self {
            HashAlgorithm::Sha1 => 20,
            HashAlgorithm::Sha256 => 32,
            HashAlgorithm::Sha384 => 48,
            HashAlgorithm::Sha512 => 64,
        }
    }
}

/// Maps a signature AlgorithmIdentifier to what this stack can verify.
pub(crate) fn signature_algorithm_of(
    alg: &x509_parser::x509::AlgorithmIdentifier<'_>,
) -> SignatureAlgorithm {
    let oid = &alg.algorithm;
    if *oid == OID_PKCS1_SHA256WITHRSA {
        SignatureAlgorithm::RsaPkcs1(HashAlgorithm::Sha256)
    } else if *oid == OID_PKCS1_SHA384WITHRSA {
        SignatureAlgorithm::RsaPkcs1(HashAlgorithm::Sha384)
    } else if *oid == OID_PKCS1_SHA512WITHRSA {
        SignatureAlgorithm::RsaPkcs1(HashAlgorithm::Sha512)
    } else if *oid == OID_PKCS1_SHA1WITHRSA {
        SignatureAlgorithm::RsaPkcs1(HashAlgorithm::Sha1)
    } else if *oid == OID_SIG_ECDSA_WITH_SHA256 {
        SignatureAlgorithm::Ecdsa(HashAlgorithm::Sha256)
    } else if *oid == OID_SIG_ECDSA_WITH_SHA384 {
        SignatureAlgorithm::Ecdsa(HashAlgorithm::Sha384)
    } else if oid.as_bytes() == OID_ED25519 {
        SignatureAlgorithm::Ed25519
    } else if *oid == OID_PKCS1_RSASSAPSS {
        pss_algorithm(alg).unwrap_or(SignatureAlgorithm::Unsupported)
    } else {
        SignatureAlgorithm::Unsupported
    }
}

/// RSASSA-PSS is verifiable here when MGF1 uses the same hash as the message
/// and the salt is as long as the hash (what aws-lc-rs implements, and what
/// every OPC UA stack produces).
fn pss_algorithm(alg: &x509_parser::x509::AlgorithmIdentifier<'_>) -> Option<SignatureAlgorithm> {
    let params = RsaSsaPssParams::try_from(alg.parameters.as_ref()?).ok()?;
    let hash = hash_of(params.hash_algorithm_oid())?;
    let mgf = params.mask_gen_algorithm().ok()?;
    if hash_of(&mgf.hash)? != hash
        || params.salt_length() != hash.output_len()
        || params.trailer_field() != 1
    {
        return None;
    }
    Some(SignatureAlgorithm::RsaPss(hash))
}

impl Certificate {
    /// Parses a DER certificate. Anything malformed (trailing bytes, bad
    /// encoding, unparsable extensions) is `BadCertificateInvalid`.
    pub fn from_der(der: &[u8]) -> Result<Certificate, CryptoError> {
        if der.len() > MAX_CERTIFICATE_SIZE {
            return Err(bad_cert("certificate larger than 32 KiB"));
        }
        let (rest, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|_| bad_cert("certificate does not parse as DER X.509"))?;
        if !rest.is_empty() {
            return Err(bad_cert("trailing bytes after the certificate"));
        }
        let tbs_cert = &cert.tbs_certificate;
        let range = |part: &[u8]| range_in(der, part).ok_or(bad_cert("certificate layout"));
        let tbs = range(tbs_cert.as_ref())?;
        let spki = range(tbs_cert.subject_pki.raw)?;
        let public_key = range(&tbs_cert.subject_pki.subject_public_key.data)?;
        let subject = range(tbs_cert.subject.as_raw())?;
        let issuer = range(tbs_cert.issuer.as_raw())?;

        let key_oid = &tbs_cert.subject_pki.algorithm.algorithm;
        let (key_algorithm, key_bits) = if *key_oid == OID_PKCS1_RSAENCRYPTION {
            let parsed = tbs_cert
                .subject_pki
                .parsed()
                .map_err(|_| bad_cert("RSA public key does not parse"))?;
            (KeyAlgorithm::Rsa, parsed.key_size())
        } else if *key_oid == OID_KEY_TYPE_EC_PUBLIC_KEY {
            let bits = tbs_cert
                .subject_pki
                .parsed()
                .map(|k| k.key_size())
                .unwrap_or(0);
            (KeyAlgorithm::Ec, bits)
        } else if key_oid.as_bytes() == OID_ED25519 {
            (KeyAlgorithm::Ed25519, 256)
        } else {
            (KeyAlgorithm::Other, 0)
        };

        let mut out = Certificate {
            der: der.to_vec(),
            thumbprint: sha1(der),
            tbs,
            spki,
            public_key,
            subject,
            issuer,
            serial: range(tbs_cert.raw_serial())?,
            signature: range(&cert.signature_value.data)?,
            signature_algorithm: signature_algorithm_of(&cert.signature_algorithm),
            key_algorithm,
            key_bits,
            not_before: tbs_cert.validity.not_before.timestamp(),
            not_after: tbs_cert.validity.not_after.timestamp(),
            subject_name: tbs_cert.subject.to_string(),
            issuer_name: tbs_cert.issuer.to_string(),
            common_name: tbs_cert
                .subject
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_owned),
            application_uri: None,
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            key_usage: None,
            extended_key_usage: None,
            ca: false,
            path_len: None,
            subject_key_id: None,
            authority_key_id: None,
            unknown_critical_extension: false,
        };
        // The signature algorithm inside the TBS must match the outer one
        // (RFC 5280 §4.1.1.2), or the signature covers another algorithm.
        if tbs_cert.signature != cert.signature_algorithm {
            return Err(bad_cert(
                "signature algorithm differs inside and outside TBS",
            ));
        }
        out.read_extensions(der, &cert)?;
        Ok(out)
    }

    /// Reads the extensions of `cert`, parsed from `der` (whose ranges the
    /// key identifiers are kept as).
    fn read_extensions(
        &mut self,
        der: &[u8],
        cert: &x509_parser::certificate::X509Certificate<'_>,
    ) -> Result<(), CryptoError> {
        use x509_parser::extensions::ParsedExtension;
        // By the OIDs' DER contents: no string per extension.
        let mut seen: Vec<&[u8]> = Vec::new();
        for ext in cert.tbs_certificate.extensions() {
            let oid = ext.oid.as_bytes();
            if seen.contains(&oid) {
                return Err(bad_cert("duplicate certificate extension"));
            }
            seen.push(oid);
            match ext.parsed_extension() {
                ParsedExtension::SubjectAlternativeName(san) => {
                    for name in &san.general_names {
                        match name {
                            GeneralName::URI(uri) if self.application_uri.is_none() => {
                                self.application_uri = Some((*uri).to_owned());
                            }
                            GeneralName::DNSName(dns) => self.dns_names.push((*dns).to_owned()),
                            GeneralName::IPAddress(ip) => {
                                if let Some(ip) = ip_from_bytes(ip) {
                                    self.ip_addresses.push(ip);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                ParsedExtension::KeyUsage(ku) => self.key_usage = Some(KeyUsage(ku.flags)),
                ParsedExtension::ExtendedKeyUsage(eku) => {
                    self.extended_key_usage = Some(ExtendedKeyUsage {
                        server_auth: eku.server_auth,
                        client_auth: eku.client_auth,
                        any: eku.any,
                    })
                }
                ParsedExtension::BasicConstraints(bc) => {
                    self.ca = bc.ca;
                    self.path_len = bc.path_len_constraint;
                }
                ParsedExtension::SubjectKeyIdentifier(id) => {
                    self.subject_key_id =
                        Some(range_in(der, id.0).ok_or(bad_cert("certificate layout"))?)
                }
                ParsedExtension::AuthorityKeyIdentifier(aki) => {
                    self.authority_key_id = match aki.key_identifier.as_ref() {
                        Some(id) => {
                            Some(range_in(der, id.0).ok_or(bad_cert("certificate layout"))?)
                        }
                        None => None,
                    }
                }
                ParsedExtension::ParseError { .. } => {
                    return Err(bad_cert("a certificate extension does not parse"))
                }
                ParsedExtension::UnsupportedExtension { .. } if ext.critical => {
                    // Checked at validation time: a critical extension this
                    // stack does not understand makes the certificate unusable.
                    self.unknown_critical_extension = true;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The whole certificate, DER encoded.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The SHA-1 of the DER: the thumbprint OPC UA uses to name certificates
    /// (e.g. ReceiverCertificateThumbprint).
    pub fn thumbprint(&self) -> [u8; 20] {
        self.thumbprint
    }

    /// The thumbprint as upper-case hex, as used in PKI file names.
    pub fn thumbprint_hex(&self) -> String {
        hex(&self.thumbprint)
    }

    /// The SubjectPublicKeyInfo, DER encoded (algorithm + key).
    pub fn subject_public_key_info_der(&self) -> &[u8] {
        &self.der[self.spki.clone()]
    }

    /// The key itself (contents of the SPKI BIT STRING): for RSA the PKCS#1
    /// RSAPublicKey DER.
    pub fn public_key_der(&self) -> &[u8] {
        &self.der[self.public_key.clone()]
    }

    /// The public key algorithm.
    pub fn key_algorithm(&self) -> KeyAlgorithm {
        self.key_algorithm
    }

    /// Length of the public key in bits (RSA modulus size; 0 if unknown).
    pub fn key_bits(&self) -> usize {
        self.key_bits
    }

    /// The curve of an ECC key (P-256, P-384 or Ed25519); None for RSA and
    /// other curves.
    pub fn ecc_curve(&self) -> Option<crate::ecc::EccCurve> {
        match self.key_algorithm {
            KeyAlgorithm::Ec | KeyAlgorithm::Ed25519 => {
                crate::ecc::EccPublicKey::from_spki_der(self.subject_public_key_info_der())
                    .ok()
                    .map(|k| k.curve())
            }
            _ => None,
        }
    }

    /// The TBSCertificate (the signed part), DER encoded.
    pub fn tbs_der(&self) -> &[u8] {
        &self.der[self.tbs.clone()]
    }

    /// The signature value over [`Certificate::tbs_der`].
    pub fn signature(&self) -> &[u8] {
        self.der.get(self.signature.clone()).unwrap_or_default()
    }

    /// The algorithm of the certificate's signature.
    pub fn signature_algorithm(&self) -> SignatureAlgorithm {
        self.signature_algorithm
    }

    /// The subject Name, DER encoded (compared byte-wise when building chains).
    pub fn subject_der(&self) -> &[u8] {
        &self.der[self.subject.clone()]
    }

    /// The issuer Name, DER encoded.
    pub fn issuer_der(&self) -> &[u8] {
        &self.der[self.issuer.clone()]
    }

    /// The subject, as text (RFC 4514 style).
    pub fn subject_name(&self) -> &str {
        &self.subject_name
    }

    /// The issuer, as text.
    pub fn issuer_name(&self) -> &str {
        &self.issuer_name
    }

    /// The subject's commonName, if any.
    pub fn common_name(&self) -> Option<&str> {
        self.common_name.as_deref()
    }

    /// The serial number as encoded (big-endian, possibly with a leading 0).
    pub fn serial(&self) -> &[u8] {
        self.der.get(self.serial.clone()).unwrap_or_default()
    }

    /// Start of the validity period.
    pub fn not_before(&self) -> SystemTime {
        system_time(self.not_before)
    }

    /// End of the validity period.
    pub fn not_after(&self) -> SystemTime {
        system_time(self.not_after)
    }

    /// Whether `now` lies in the validity period (both ends inclusive).
    pub fn is_time_valid(&self, now: SystemTime) -> bool {
        let now = unix_seconds(now);
        self.not_before <= now && now <= self.not_after
    }

    /// The first URI in the subjectAltName: the applicationUri (Part 6 §6.2.2).
    pub fn application_uri(&self) -> Option<&str> {
        self.application_uri.as_deref()
    }

    /// The DNS names in the subjectAltName.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// The IP addresses in the subjectAltName.
    pub fn ip_addresses(&self) -> &[IpAddr] {
        &self.ip_addresses
    }

    /// The KeyUsage extension, if present.
    pub fn key_usage(&self) -> Option<KeyUsage> {
        self.key_usage
    }

    /// The ExtendedKeyUsage extension, if present.
    pub fn extended_key_usage(&self) -> Option<ExtendedKeyUsage> {
        self.extended_key_usage
    }

    /// Whether BasicConstraints says cA=TRUE.
    pub fn is_ca(&self) -> bool {
        self.ca
    }

    /// BasicConstraints' pathLenConstraint.
    pub fn path_len_constraint(&self) -> Option<u32> {
        self.path_len
    }

    /// Whether subject and issuer are the same name (a self-issued certificate).
    pub fn is_self_issued(&self) -> bool {
        self.subject_der() == self.issuer_der()
    }

    /// The SubjectKeyIdentifier, if present.
    pub fn subject_key_id(&self) -> Option<&[u8]> {
        self.subject_key_id.clone().and_then(|r| self.der.get(r))
    }

    /// The key identifier of the AuthorityKeyIdentifier, if present.
    pub fn authority_key_id(&self) -> Option<&[u8]> {
        self.authority_key_id.clone().and_then(|r| self.der.get(r))
    }

    /// Whether the certificate carries a critical extension this stack does
    /// not understand (such a certificate must not be used).
    pub fn has_unknown_critical_extension(&self) -> bool {
        self.unknown_critical_extension
    }

    /// Parses a certificate chain as OPC UA sends it: DER certificates
    /// concatenated, leaf first (Part 6 §6.2.3).
    pub fn parse_chain(mut der: &[u8]) -> Result<Vec<Certificate>, CryptoError> {
        let mut chain = Vec::new();
        while !der.is_empty() {
            if chain.len() >= validate::MAX_CHAIN_DEPTH {
                return Err(bad_cert("certificate chain longer than 8"));
            }
            // The outer SEQUENCE's length splits the chain; each
            // certificate is then parsed once, by `from_der`.
            let len =
                der_sequence_len(der).ok_or(bad_cert("certificate does not parse as DER X.509"))?;
            let (one, rest) = der.split_at(len);
            chain.push(Certificate::from_der(one)?);
            der = rest;
        }
        if chain.is_empty() {
            return Err(bad_cert("no certificate"));
        }
        Ok(chain)
    }
}

/// The length of the DER SEQUENCE (tag, length and contents) at the start
/// of `der`, if its header is well formed and it fits in `der`.
fn der_sequence_len(der: &[u8]) -> Option<usize> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if tag != 0x30 {
        return None;
    }
    let (header, contents) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let n = usize::from(first & 0x7f);
        // Definite lengths of 1..=4 bytes; DER forbids 0x80 (indefinite).
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        (2 + n, len)
    };
    let total = header.checked_add(contents)?;
    (total <= der.len()).then_some(total)
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        Some(IpAddr::from(v4))
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        Some(IpAddr::from(v6))
    } else {
        None
    }
}

/// SHA-1 of `data` (for thumbprints only, never for signatures).
fn sha1(data: &[u8]) -> [u8; 20] {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, data);
    let mut out = [0u8; 20];
    out.copy_from_slice(digest.as_ref());
    out
}

/// Upper-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02X}");
        s
    })
}

/// Seconds since the Unix epoch (negative before it).
pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

fn system_time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// PEM encoding of a DER blob with the given label ("CERTIFICATE",
/// "PRIVATE KEY", "X509 CRL").
pub fn to_pem(label: &str, der: &[u8]) -> String {
    pem::encode(&pem::Pem::new(label, der.to_vec()))
}

/// The DER inside the first PEM block with `label`; `None` if `text` holds
/// no such block.
pub fn from_pem(label: &str, text: &[u8]) -> Option<Vec<u8>> {
    pem::parse_many(text)
        .ok()?
        .into_iter()
        .find(|p| p.tag() == label)
        .map(pem::Pem::into_contents)
}

#[cfg(test)]
mod tests;
