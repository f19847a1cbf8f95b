//! What a secure channel keeps of its peer's certificate once the
//! certificate is validated.
//!
//! A channel needs its peer's certificate long after the handshake: to
//! check that a renewal or a CreateSession names the same certificate, to
//! check a session's applicationUri, to verify ActivateSession signatures
//! with the peer's key, and (ECC policies only) to sign over the DER
//! itself. It needs none of the rest of a parsed [`Certificate`] (names,
//! extensions, validity), and with tens of thousands of channels that rest,
//! and under RSA the DER itself, is most of a channel's memory. A
//! [`PeerCertificate`] keeps the thumbprint, the SubjectPublicKeyInfo, the
//! applicationUri and the key's size and curve, and to recognise the
//! certificate again either its DER (ECC policies: their signatures cover
//! it) or, under RSA policies, only a SHA-256 digest of it.

use std::fmt;

use crate::ecc::EccCurve;
use crate::x509::{hex, Certificate};

/// The parts of a validated peer certificate a secure channel uses after
/// its handshake (see the module documentation).
pub struct PeerCertificate {
    thumbprint: [u8; 20],
    known: Known,
    /// The SubjectPublicKeyInfo, then the applicationUri's bytes: one
    /// allocation instead of two (this is kept per channel).
    parts: Box<[u8]>,
    spki_len: u32,
    has_uri: bool,
    key_bits: u32,
    curve: Option<EccCurve>,
}

/// How the certificate is recognised again.
enum Known {
    /// The DER itself (ECC keys).
    Der(Box<[u8]>),
    /// A SHA-256 digest of the DER (RSA keys).
    Sha256([u8; 32]),
}

impl fmt::Debug for PeerCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerCertificate")
            .field("thumbprint", &hex(&self.thumbprint))
            .field("application_uri", &self.application_uri())
            .field("der_kept", &self.der().is_some())
            .finish_non_exhaustive()
    }
}

impl PeerCertificate {
    /// Keeps what a channel needs of `certificate`. `ecc_curve` is the
    /// curve of its key as the channel parsed it under an ECC policy (the
    /// DER is then kept: ECC policies sign over it), None under an RSA
    /// policy (only a digest of the DER is kept).
    pub fn new(certificate: &Certificate, ecc_curve: Option<EccCurve>) -> Self {
        let der = certificate.der();
        let spki = certificate.subject_public_key_info_der();
        let uri = certificate.application_uri();
        let mut parts = Vec::with_capacity(spki.len() + uri.map_or(0, str::len));
        parts.extend_from_slice(spki);
        parts.extend_from_slice(uri.unwrap_or_default().as_bytes());
        PeerCertificate {
            thumbprint: certificate.thumbprint(),
            known: match ecc_curve {
                Some(_) => Known::Der(der.into()),
                None => Known::Sha256(sha256(der)),
            },
            parts: parts.into_boxed_slice(),
            // A certificate's DER, and so its SPKI, is far below 4 GB.
            spki_len: u32::try_from(spki.len()).unwrap_or(u32::MAX),
            has_uri: uri.is_some(),
            key_bits: u32::try_from(certificate.key_bits()).unwrap_or(u32::MAX),
            curve: ecc_curve,
        }
    }

    /// True when `der` is this certificate: compared byte for byte when
    /// the DER is kept, else by SHA-256.
    pub fn is(&self, der: &[u8]) -> bool {
        match &self.known {
            Known::Der(kept) => **kept == *der,
            Known::Sha256(digest) => sha256(der) == *digest,
        }
    }

    /// The DER, when it was kept (see [`PeerCertificate::new`]).
    pub fn der(&self) -> Option<&[u8]> {
        match &self.known {
            Known::Der(kept) => Some(kept),
            Known::Sha256(_) => None,
        }
    }

    /// The SHA-1 thumbprint of the DER (Part 6 §6.7.2.3).
    pub fn thumbprint(&self) -> [u8; 20] {
        self.thumbprint
    }

    /// The thumbprint in lowercase hex.
    pub fn thumbprint_hex(&self) -> String {
        hex(&self.thumbprint)
    }

    /// The SubjectPublicKeyInfo, DER encoded.
    pub fn subject_public_key_info_der(&self) -> &[u8] {
        self.parts
            .get(..self.spki_len as usize)
            .unwrap_or(&self.parts)
    }

    /// The applicationUri of the subjectAltName, if any.
    pub fn application_uri(&self) -> Option<&str> {
        if !self.has_uri {
            return None;
        }
        // Copied from a `str` in `new`: always UTF-8.
        std::str::from_utf8(self.parts.get(self.spki_len as usize..)?).ok()
    }

    /// The key size in bits.
    pub fn key_bits(&self) -> usize {
        self.key_bits as usize
    }

    /// The curve of an ECC key (see [`PeerCertificate::new`]); None for
    /// other keys.
    pub fn ecc_curve(&self) -> Option<EccCurve> {
        self.curve
    }
}

fn sha256(data: &[u8]) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x509::{create_self_signed, KeyType, SelfSignedParams};

    fn cert(key_type: KeyType, uri: &str) -> Certificate {
        let params = SelfSignedParams {
            key_type,
            ..SelfSignedParams::new(uri, "peer test", std::time::SystemTime::now())
        };
        create_self_signed(&params).unwrap().certificate
    }

    #[test]
    fn without_its_der_it_still_knows_its_certificate_and_no_other() {
        let mine = cert(KeyType::Rsa, "urn:test:one");
        let other = cert(KeyType::Rsa, "urn:test:one");
        let peer = PeerCertificate::new(&mine, None);
        assert_eq!(peer.der(), None);
        assert!(peer.is(mine.der()));
        assert!(!peer.is(other.der()));
        let mut flipped = mine.der().to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(!peer.is(&flipped));
        assert!(!peer.is(&mine.der()[..mine.der().len() - 1]));
        assert_eq!(peer.thumbprint(), mine.thumbprint());
        assert_eq!(peer.thumbprint_hex(), mine.thumbprint_hex());
        assert_eq!(
            peer.subject_public_key_info_der(),
            mine.subject_public_key_info_der()
        );
        assert_eq!(peer.application_uri(), Some("urn:test:one"));
        assert_eq!(peer.key_bits(), 2048);
        assert_eq!(peer.ecc_curve(), None);
    }

    #[test]
    fn with_its_der_it_compares_the_bytes_and_keeps_the_curve() {
        let mine = cert(KeyType::EcP256, "urn:test:ecc");
        let other = cert(KeyType::EcP256, "urn:test:ecc");
        let peer = PeerCertificate::new(&mine, mine.ecc_curve());
        assert_eq!(peer.der(), Some(mine.der()));
        assert!(peer.is(mine.der()));
        assert!(!peer.is(other.der()));
        assert_eq!(peer.ecc_curve(), Some(EccCurve::NistP256));
        assert_eq!(peer.ecc_curve(), mine.ecc_curve());
        assert_eq!(
            peer.subject_public_key_info_der(),
            mine.subject_public_key_info_der()
        );
        assert_eq!(peer.application_uri(), Some("urn:test:ecc"));
    }
}
