//! Certificate revocation lists.

use std::collections::HashSet;
use std::ops::Range;
use std::time::SystemTime;

use uascale_types::StatusCode;

use super::{range_in, signature_algorithm_of, system_time, Certificate, SignatureAlgorithm};
use crate::CryptoError;

/// CRLs larger than this are refused (a CA revoking tens of thousands of
/// certificates still fits).
pub const MAX_CRL_SIZE: usize = 4 * 1024 * 1024;

/// A parsed CRL that owns its DER.
#[derive(Clone)]
pub struct Crl {
    der: Vec<u8>,
    tbs: Range<usize>,
    issuer: Range<usize>,
    signature: Vec<u8>,
    signature_algorithm: SignatureAlgorithm,
    this_update: i64,
    next_update: Option<i64>,
    issuer_name: String,
    revoked: HashSet<Vec<u8>>,
}

impl std::fmt::Debug for Crl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crl")
            .field("issuer", &self.issuer_name)
            .field("revoked", &self.revoked.len())
            .finish_non_exhaustive()
    }
}

/// Serial numbers compare as integers: drop the sign-padding zero bytes.
pub(crate) fn normalized_serial(serial: &[u8]) -> &[u8] {
    let zeros = serial.iter().take_while(|b| **b == 0).count();
    serial.get(zeros..).unwrap_or(&[])
}

impl Crl {
    /// Parses a DER CRL (`BadCertificateInvalid` if malformed).
    pub fn from_der(der: &[u8]) -> Result<Crl, CryptoError> {
        let bad = |what| CryptoError::Certificate {
            status: StatusCode::BadCertificateInvalid,
            what,
        };
        if der.len() > MAX_CRL_SIZE {
            return Err(bad("CRL larger than 4 MiB"));
        }
        let (rest, crl) =
            x509_parser::parse_x509_crl(der).map_err(|_| bad("CRL does not parse as DER"))?;
        if !rest.is_empty() {
            return Err(bad("trailing bytes after the CRL"));
        }
        let range = |part: &[u8]| range_in(der, part).ok_or(bad("CRL layout"));
        let tbs_list = &crl.tbs_cert_list;
        Ok(Crl {
            der: der.to_vec(),
            tbs: range(tbs_list.as_ref())?,
            issuer: range(tbs_list.issuer.as_raw())?,
            signature: crl.signature_value.data.to_vec(),
            signature_algorithm: signature_algorithm_of(&crl.signature_algorithm),
            this_update: tbs_list.this_update.timestamp(),
            next_update: tbs_list.next_update.map(|t| t.timestamp()),
            issuer_name: tbs_list.issuer.to_string(),
            revoked: crl
                .iter_revoked_certificates()
                .map(|r| normalized_serial(r.raw_serial()).to_vec())
                .collect(),
        })
    }

    /// The whole CRL, DER encoded.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The signed part.
    pub(crate) fn tbs_der(&self) -> &[u8] {
        &self.der[self.tbs.clone()]
    }

    /// The signature value.
    pub(crate) fn signature(&self) -> &[u8] {
        &self.signature
    }

    /// The signature algorithm.
    pub(crate) fn signature_algorithm(&self) -> SignatureAlgorithm {
        self.signature_algorithm
    }

    /// The issuer Name, DER encoded.
    pub fn issuer_der(&self) -> &[u8] {
        &self.der[self.issuer.clone()]
    }

    /// The issuer, as text.
    pub fn issuer_name(&self) -> &str {
        &self.issuer_name
    }

    /// thisUpdate.
    pub fn this_update(&self) -> SystemTime {
        system_time(self.this_update)
    }

    /// nextUpdate, if given.
    pub fn next_update(&self) -> Option<SystemTime> {
        self.next_update.map(system_time)
    }

    /// How many certificates the CRL revokes.
    pub fn revoked_count(&self) -> usize {
        self.revoked.len()
    }

    /// Whether `cert`'s serial is listed (the caller has checked that this
    /// CRL is from `cert`'s issuer).
    pub fn revokes(&self, cert: &Certificate) -> bool {
        self.revoked.contains(normalized_serial(cert.serial()))
    }
}
