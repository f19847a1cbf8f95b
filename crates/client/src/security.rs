//! Client-side security helpers without IO: what a client sends and checks
//! in CreateSession/ActivateSession (signatures over certificate + nonce),
//! the identity tokens (the legacy encrypted-secret format for passwords),
//! and judging the server certificate.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::{EncryptionPadding, RsaPrivateKey, RsaPublicKey, SignatureScheme};
use uascale_crypto::x509::Certificate;
use uascale_crypto::x509::{CertificateUse, TrustList, ValidationOptions};
use uascale_crypto::CryptoError;
use uascale_proto::security::{CertificateValidator, Identity};
use uascale_types::{ByteString, SignatureData, StatusCode, UaString};

use crate::error::ClientError;

/// RSA PKCS#1 v1.5 with SHA-256 (Basic256Sha256, Aes128_Sha256_RsaOaep).
pub const RSA_SHA256_URI: &str = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256";
/// RSA-PSS with SHA-256 (Aes256_Sha256_RsaPss).
pub const RSA_PSS_SHA256_URI: &str = "http://opcfoundation.org/UA/security/rsa-pss-sha2-256";
/// RSA-OAEP with SHA-1.
pub const RSA_OAEP_URI: &str = "http://www.w3.org/2001/04/xmlenc#rsa-oaep";
/// RSA-OAEP with SHA-256.
pub const RSA_OAEP_SHA256_URI: &str = "http://opcfoundation.org/UA/security/rsa-oaep-sha2-256";

fn signature_uri(scheme: SignatureScheme) -> &'static str {
    match scheme {
        SignatureScheme::Pkcs1Sha256 => RSA_SHA256_URI,
        SignatureScheme::PssSha256 => RSA_PSS_SHA256_URI,
    }
}

fn encryption_uri(padding: EncryptionPadding) -> &'static str {
    match padding {
        EncryptionPadding::OaepSha1 => RSA_OAEP_URI,
        EncryptionPadding::OaepSha256 => RSA_OAEP_SHA256_URI,
    }
}

fn security(status: StatusCode, what: &str) -> ClientError {
    ClientError::Security {
        status,
        reason: what.to_owned(),
    }
}

/// Who the session is activated as.
#[derive(Clone, Default)]
pub enum UserIdentity {
    /// The anonymous identity.
    #[default]
    Anonymous,
    /// A user name and password (the password is encrypted for the server
    /// under the token policy's security policy).
    UserName {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// An X.509 user certificate with its private key (signs the server
    /// certificate and nonce).
    X509(Arc<Identity>),
}

impl fmt::Debug for UserIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserIdentity::Anonymous => f.write_str("Anonymous"),
            UserIdentity::UserName { user, .. } => {
                write!(f, "UserName {{ user: {user:?}, password: <hidden> }}")
            }
            UserIdentity::X509(id) => write!(f, "X509({})", id.certificate().subject_name()),
        }
    }
}

/// How the client judges the server's certificate.
#[derive(Clone, Debug, Default)]
pub enum ServerTrust {
    /// Not configured: a secured connect fails with
    /// `BadCertificateUntrusted` until one of the others is chosen.
    #[default]
    NotConfigured,
    /// Only certificates `validator` accepts (e.g. [`TrustListValidator`]).
    Validator(Arc<dyn CertificateValidator>),
    /// Accepts any certificate the server names in its endpoint. UNSAFE:
    /// anyone between client and server can pose as the server. For tests
    /// and first contact only; the certificate of the endpoint is still the
    /// only one the channel accepts.
    UnsafeAcceptAny,
}

impl ServerTrust {
    /// Judges the server certificate chain `der` (leaf first).
    pub fn check(&self, der: &[u8], policy: SecurityPolicy) -> Result<Certificate, ClientError> {
        let leaf = uascale_proto::security::leaf_certificate(der)
            .map_err(|e| security(e.status_code(), "server certificate is not DER"))?;
        let cert = Certificate::from_der(leaf)
            .map_err(|e| security(e.status_code(), "server certificate does not parse"))?;
        match self {
            ServerTrust::NotConfigured => {
                return Err(security(
                    StatusCode::BadCertificateUntrusted,
                    "no server trust configured (a trust list validator, or the unsafe \
                     UnsafeAcceptAny)",
                ))
            }
            ServerTrust::Validator(v) => v.validate(&cert, der, policy).map_err(|e| {
                security(
                    e.status_code(),
                    &format!("server certificate {} refused: {e}", cert.subject_name()),
                )
            })?,
            ServerTrust::UnsafeAcceptAny => {}
        }
        Ok(cert)
    }
}

/// Validates server certificates against a trust list (trusted
/// certificates, issuers and CRLs, as loaded from a client PKI directory).
#[derive(Debug)]
pub struct TrustListValidator {
    list: TrustList,
}

impl TrustListValidator {
    /// A validator over `list`.
    pub fn new(list: TrustList) -> Self {
        TrustListValidator { list }
    }
}

impl CertificateValidator for TrustListValidator {
    fn validate(
        &self,
        _certificate: &Certificate,
        chain: &[u8],
        policy: SecurityPolicy,
    ) -> Result<(), CryptoError> {
        let chain = Certificate::parse_chain(chain)?;
        let options = ValidationOptions {
            usage: CertificateUse::Server,
            min_key_bits: policy.min_asymmetric_key_bits(),
            max_key_bits: policy.max_asymmetric_key_bits(),
            policy: Some(policy).filter(|p| !p.is_none()),
            ..ValidationOptions::default()
        };
        self.list.validate(&chain, &options, SystemTime::now())
    }
}

/// Signs `a + b` with `key` under `policy`: the ClientSignature (server
/// certificate + server nonce) and the UserTokenSignature.
pub fn sign(
    key: &RsaPrivateKey,
    policy: SecurityPolicy,
    a: &[u8],
    b: &[u8],
) -> Result<SignatureData, ClientError> {
    let Some(scheme) = policy.asymmetric_signature() else {
        return Ok(SignatureData::default());
    };
    let mut data = Vec::with_capacity(a.len() + b.len());
    data.extend_from_slice(a);
    data.extend_from_slice(b);
    let mut sig = Vec::new();
    key.sign(scheme, &data, &mut sig)
        .map_err(|e| security(e.status_code(), "signing failed"))?;
    Ok(SignatureData {
        algorithm: UaString::from(signature_uri(scheme)),
        signature: ByteString::new(sig),
    })
}

/// Verifies the ServerSignature over `a + b` (our certificate + our nonce).
pub fn verify(
    key: &RsaPublicKey,
    policy: SecurityPolicy,
    a: &[u8],
    b: &[u8],
    signature: &SignatureData,
) -> Result<(), ClientError> {
    let Some(scheme) = policy.asymmetric_signature() else {
        return Ok(());
    };
    let bad = || {
        security(
            StatusCode::BadApplicationSignatureInvalid,
            "the server's signature in CreateSession is invalid",
        )
    };
    if signature.algorithm.as_str() != Some(signature_uri(scheme)) {
        return Err(bad());
    }
    let mut data = Vec::with_capacity(a.len() + b.len());
    data.extend_from_slice(a);
    data.extend_from_slice(b);
    key.verify(
        scheme,
        &data,
        signature.signature.as_bytes().unwrap_or_default(),
    )
    .map_err(|_| bad())
}

/// Encrypts a password for the server (Part 4 §7.41.2.2, the legacy
/// format): `length (UInt32) | password | server nonce`, RSA-encrypted with
/// the server certificate's key under `policy`. Returns the data and the
/// encryption algorithm URI; for SecurityPolicy None the password goes in
/// plain text (only over an encrypted channel should a server offer that).
pub fn encrypt_secret(
    server_key: &RsaPublicKey,
    policy: SecurityPolicy,
    secret: &[u8],
    server_nonce: &[u8],
) -> Result<(Vec<u8>, Option<&'static str>), ClientError> {
    let Some(padding) = policy.asymmetric_encryption() else {
        return Ok((secret.to_vec(), None));
    };
    let len = u32::try_from(secret.len() + server_nonce.len())
        .map_err(|_| security(StatusCode::BadIdentityTokenInvalid, "password too long"))?;
    let mut plain = len.to_le_bytes().to_vec();
    plain.extend_from_slice(secret);
    plain.extend_from_slice(server_nonce);
    let mut out = Vec::new();
    server_key
        .encrypt(padding, &plain, &mut out)
        .map_err(|e| security(e.status_code(), "password encryption failed"))?;
    Ok((out, Some(encryption_uri(padding))))
}

/// The password of a token whose policy is None: sent as it is.
pub fn encrypt_secret_plain(secret: &[u8]) -> (Vec<u8>, Option<&'static str>) {
    (secret.to_vec(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_round_trip_and_fail_when_changed() {
        let key = RsaPrivateKey::generate(2048).unwrap();
        for policy in [
            SecurityPolicy::Basic256Sha256,
            SecurityPolicy::Aes256Sha256RsaPss,
        ] {
            let sig = sign(&key, policy, b"cert", b"nonce").unwrap();
            verify(key.public_key(), policy, b"cert", b"nonce", &sig).unwrap();
            assert!(verify(key.public_key(), policy, b"cert", b"nonc3", &sig).is_err());
            let other = if policy == SecurityPolicy::Basic256Sha256 {
                SecurityPolicy::Aes256Sha256RsaPss
            } else {
                SecurityPolicy::Basic256Sha256
            };
            assert!(verify(key.public_key(), other, b"cert", b"nonce", &sig).is_err());
        }
        let (data, alg) = encrypt_secret(
            key.public_key(),
            SecurityPolicy::Aes256Sha256RsaPss,
            b"pw",
            &[1; 32],
        )
        .unwrap();
        assert_eq!(alg, Some(RSA_OAEP_SHA256_URI));
        let mut plain = Vec::new();
        key.decrypt(EncryptionPadding::OaepSha256, &data, &mut plain)
            .unwrap();
        assert_eq!(&plain[..4], &34u32.to_le_bytes());
        assert_eq!(&plain[4..6], b"pw");
    }
}
