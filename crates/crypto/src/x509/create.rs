//! Creating application instance certificates (Part 6 §6.2.2).

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, RsaKeySize, SanType, SerialNumber,
};

use super::Certificate;
use crate::CryptoError;

/// What goes into a self-signed application instance certificate.
#[derive(Debug, Clone)]
pub struct SelfSignedParams {
    /// The application's ApplicationUri; written as the URI in the
    /// subjectAltName, where peers compare it with ApplicationDescription.
    pub application_uri: String,
    /// The subject commonName (usually the application name).
    pub common_name: String,
    /// The subject organization, if any.
    pub organization: Option<String>,
    /// Host names for the subjectAltName; the first one also becomes the
    /// subject's domainComponent, as Part 6 recommends.
    pub dns_names: Vec<String>,
    /// IP addresses for the subjectAltName.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity (callers pass their clock; usually now minus a
    /// little slack for peers whose clock runs behind).
    pub not_before: SystemTime,
    /// Length of the validity period.
    pub validity: Duration,
    /// RSA modulus size: 2048, 3072 or 4096 (used when `key_type` is RSA).
    pub key_bits: u32,
    /// The kind of key: RSA (default) or an ECC curve.
    pub key_type: KeyType,
}

/// The key of a created certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyType {
    /// RSA with `key_bits`, signed with SHA-256 (the RSA policies).
    #[default]
    Rsa,
    /// NIST P-256, ecdsa-with-SHA256 (ECC_nistP256 and its AEAD variants).
    EcP256,
    /// NIST P-384, ecdsa-with-SHA384 (ECC_nistP384).
    EcP384,
    /// Ed25519 (ECC_curve25519).
    Ed25519,
}

impl KeyType {
    /// The name used on the command line: `rsa`, `ec-p256`, `ec-p384`,
    /// `ed25519`.
    pub const fn name(self) -> &'static str {
        match self {
            KeyType::Rsa => "rsa",
            KeyType::EcP256 => "ec-p256",
            KeyType::EcP384 => "ec-p384",
            KeyType::Ed25519 => "ed25519",
        }
    }

    /// From [`KeyType::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [
            KeyType::Rsa,
            KeyType::EcP256,
            KeyType::EcP384,
            KeyType::Ed25519,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }
}

impl SelfSignedParams {
    /// Parameters with the defaults this stack uses: RSA 2048 (what
    /// Basic256Sha256 and Aes128_Sha256_RsaOaep require at minimum and all
    /// RSA policies accept) and a validity of 5 years (a common choice of
    /// OPC UA stacks; long enough that operators rarely renew, short enough
    /// that a stolen key expires).
    pub fn new(application_uri: &str, common_name: &str, not_before: SystemTime) -> Self {
        SelfSignedParams {
            application_uri: application_uri.to_owned(),
            common_name: common_name.to_owned(),
            organization: None,
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            not_before,
            validity: Duration::from_secs(5 * 365 * 24 * 3600),
            key_bits: 2048,
            key_type: KeyType::Rsa,
        }
    }
}

/// A created certificate with its private key.
pub struct SelfSigned {
    /// The certificate.
    pub certificate: Certificate,
    /// The private key (RSA or ECC), PKCS#8 DER.
    pub private_key_pkcs8_der: Vec<u8>,
}

impl std::fmt::Debug for SelfSigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfSigned")
            .field("certificate", &self.certificate)
            .finish_non_exhaustive()
    }
}

fn config(what: &'static str) -> CryptoError {
    CryptoError::Config { what }
}

/// The key usages Part 6 (Table 23/§6.2.2) requires of an application
/// instance certificate; keyCertSign because it is self-signed. EC keys
/// get keyAgreement instead of the encipherment usages (Part 6 §6.2.2 for
/// ECC certificates).
fn application_key_usages(key_type: KeyType) -> Vec<KeyUsagePurpose> {
    let mut usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::ContentCommitment,
    ];
    match key_type {
        KeyType::Rsa => {
            usages.push(KeyUsagePurpose::KeyEncipherment);
            usages.push(KeyUsagePurpose::DataEncipherment);
        }
        KeyType::EcP256 | KeyType::EcP384 => usages.push(KeyUsagePurpose::KeyAgreement),
        KeyType::Ed25519 => {}
    }
    usages.push(KeyUsagePurpose::KeyCertSign);
    usages
}

/// A positive random serial number of 16 bytes (RFC 5280 allows up to 20).
pub(crate) fn random_serial() -> Result<SerialNumber, CryptoError> {
    let mut serial = [0u8; 16];
    aws_lc_rs::rand::fill(&mut serial).map_err(|_| config("no randomness for the serial"))?;
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    Ok(SerialNumber::from_slice(&serial))
}

pub(crate) fn offset_date_time(t: SystemTime) -> Result<time::OffsetDateTime, CryptoError> {
    time::OffsetDateTime::from_unix_timestamp(super::unix_seconds(t))
        .map_err(|_| config("certificate date out of range"))
}

/// Creates a self-signed application instance certificate (RSA with
/// SHA-256, ECDSA P-256 with SHA-256, P-384 with SHA-384, or Ed25519) with
/// the applicationUri, DNS names and IPs in the subjectAltName, KeyUsage
/// digitalSignature, nonRepudiation, keyEncipherment and dataEncipherment
/// (RSA) or keyAgreement (ECDSA keys), keyCertSign, ExtendedKeyUsage
/// serverAuth + clientAuth, BasicConstraints cA=FALSE, and subject/authority
/// key identifiers.
pub fn create_self_signed(params: &SelfSignedParams) -> Result<SelfSigned, CryptoError> {
    let key = match params.key_type {
        KeyType::Rsa => {
            let size = match params.key_bits {
                2048 => RsaKeySize::_2048,
                3072 => RsaKeySize::_3072,
                4096 => RsaKeySize::_4096,
                _ => return Err(config("key_bits must be 2048, 3072 or 4096")),
            };
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size)
        }
        KeyType::EcP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        KeyType::EcP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        KeyType::Ed25519 => KeyPair::generate_for(&rcgen::PKCS_ED25519),
    }
    .map_err(|_| config("key generation failed"))?;

    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, params.common_name.as_str());
    if let Some(org) = &params.organization {
        dn.push(DnType::OrganizationName, org.as_str());
    }
    if let Some(host) = params.dns_names.first() {
        // domainComponent, 0.9.2342.19200300.100.1.25
        dn.push(
            DnType::CustomDnType(vec![0, 9, 2342, 19_200_300, 100, 1, 25]),
            rcgen::DnValue::Ia5String(
                host.as_str()
                    .try_into()
                    .map_err(|_| config("host name is not ASCII"))?,
            ),
        );
    }
    p.distinguished_name = dn;
    let uri = params
        .application_uri
        .as_str()
        .try_into()
        .map_err(|_| config("applicationUri is not ASCII"))?;
    p.subject_alt_names.push(SanType::URI(uri));
    for dns in &params.dns_names {
        let name = dns
            .as_str()
            .try_into()
            .map_err(|_| config("DNS name is not ASCII"))?;
        p.subject_alt_names.push(SanType::DnsName(name));
    }
    for ip in &params.ip_addresses {
        p.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    p.not_before = offset_date_time(params.not_before)?;
    p.not_after = offset_date_time(
        params
            .not_before
            .checked_add(params.validity)
            .ok_or(config("validity out of range"))?,
    )?;
    p.serial_number = Some(random_serial()?);
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = application_key_usages(params.key_type);
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    let cert = p
        .self_signed(&key)
        .map_err(|_| config("certificate could not be signed"))?;
    let private_key_pkcs8_der = match params.key_type {
        KeyType::Rsa => key.serialize_der(),
        // PKCS#8 v1 (RFC 5208): the v2 form with the public key that aws-lc
        // writes for Ed25519 is refused by OpenSSL (and so by open62541).
        _ => crate::ecc::EccPrivateKey::from_pkcs8_der(&key.serialize_der())?.to_pkcs8_der()?,
    };
    Ok(SelfSigned {
        certificate: Certificate::from_der(cert.der())?,
        private_key_pkcs8_der,
    })
}
