use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn self_signed_has_what_part6_requires() {
    let mut params = SelfSignedParams::new("urn:test:app", "Test App", at(1_700_000_000));
    params.organization = Some("uascale".into());
    params.dns_names = vec!["host.example".into(), "localhost".into()];
    params.ip_addresses = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    let created = create_self_signed(&params).unwrap();
    let cert = &created.certificate;
    assert_eq!(cert.application_uri(), Some("urn:test:app"));
    assert_eq!(cert.common_name(), Some("Test App"));
    assert_eq!(cert.dns_names(), ["host.example", "localhost"]);
    assert_eq!(cert.ip_addresses().len(), 2);
    assert_eq!(cert.key_algorithm(), KeyAlgorithm::Rsa);
    assert_eq!(cert.key_bits(), 2048);
    assert_eq!(
        cert.signature_algorithm(),
        SignatureAlgorithm::RsaPkcs1(HashAlgorithm::Sha256)
    );
    let ku = cert.key_usage().unwrap();
    for bit in [
        KeyUsage::DIGITAL_SIGNATURE,
        KeyUsage::NON_REPUDIATION,
        KeyUsage::KEY_ENCIPHERMENT,
        KeyUsage::DATA_ENCIPHERMENT,
        KeyUsage::KEY_CERT_SIGN,
    ] {
        assert!(ku.contains(bit), "{:?}", ku.names());
    }
    let eku = cert.extended_key_usage().unwrap();
    assert!(eku.server_auth && eku.client_auth);
    assert!(!cert.is_ca());
    assert!(cert.is_self_issued());
    assert!(cert.subject_key_id().is_some());
    assert!(cert.subject_name().contains("CN=Test App"));
    assert!(cert.subject_name().contains("host.example"));
    assert!(cert.is_time_valid(at(1_700_000_000)));
    assert!(cert.is_time_valid(at(1_700_000_000 + 4 * 365 * 24 * 3600)));
    assert!(!cert.is_time_valid(at(1_699_999_999)));
    assert!(!cert.has_unknown_critical_extension());
    // Thumbprint is SHA-1 of the DER, and parsing the DER again is identical.
    let again = Certificate::from_der(cert.der()).unwrap();
    assert_eq!(again.thumbprint(), cert.thumbprint());
    assert_eq!(
        again.subject_public_key_info_der(),
        cert.subject_public_key_info_der()
    );
    assert_eq!(cert.thumbprint_hex().len(), 40);
    assert!(!created.private_key_pkcs8_der.is_empty());
    // The key in the certificate is the key returned.
    let key = aws_lc_rs::rsa::KeyPair::from_pkcs8(&created.private_key_pkcs8_der).unwrap();
    use aws_lc_rs::signature::KeyPair as _;
    assert_eq!(key.public_key().as_ref(), cert.public_key_der());
}

#[test]
fn serials_differ_and_are_positive() {
    let params = SelfSignedParams::new("urn:a", "a", at(1_700_000_000));
    let a = create_self_signed(&params).unwrap().certificate;
    let b = create_self_signed(&params).unwrap().certificate;
    assert_ne!(a.serial(), b.serial());
    assert!(a.serial()[0] < 0x80);
    assert_ne!(a.thumbprint(), b.thumbprint());
}

#[test]
fn bad_key_size_is_a_config_error() {
    let mut params = SelfSignedParams::new("urn:a", "a", at(1_700_000_000));
    params.key_bits = 1024;
    assert!(matches!(
        create_self_signed(&params),
        Err(CryptoError::Config { .. })
    ));
}

#[test]
fn garbage_is_bad_certificate_invalid() {
    for input in [&b""[..], b"\x30\x03\x02\x01\x01", &[0x30; 64]] {
        let err = Certificate::from_der(input).unwrap_err();
        assert_eq!(err.status_code(), StatusCode::BadCertificateInvalid);
    }
    let good = create_self_signed(&SelfSignedParams::new("urn:a", "a", at(1_700_000_000)))
        .unwrap()
        .certificate;
    let mut trailing = good.der().to_vec();
    trailing.push(0);
    assert!(Certificate::from_der(&trailing).is_err());
    // Every truncation fails cleanly (no panic).
    for len in 0..good.der().len() {
        assert!(Certificate::from_der(&good.der()[..len]).is_err());
    }
}

#[test]
fn pem_round_trip() {
    let text = to_pem("CERTIFICATE", b"\x01\x02\x03");
    assert!(text.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(
        from_pem("CERTIFICATE", text.as_bytes()).unwrap(),
        b"\x01\x02\x03"
    );
    assert_eq!(from_pem("PRIVATE KEY", text.as_bytes()), None);
}

/// Little PKIs built with rcgen for the validation tests.
mod pki {
    use std::sync::OnceLock;
    use std::time::{Duration, SystemTime};

    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
        ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
        RevokedCertParams, SanType, SerialNumber,
    };

    use super::super::create::{offset_date_time, random_serial};
    use super::super::{Certificate, Crl};

    /// RSA key generation is slow in debug builds: a few keys, reused.
    fn key(i: usize) -> KeyPair {
        static KEYS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        let keys = KEYS.get_or_init(|| {
            (0..4)
                .map(|_| {
                    KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                        .unwrap()
                        .serialize_der()
                })
                .collect()
        });
        KeyPair::try_from(keys[i].as_slice()).unwrap()
    }

    pub const T0: u64 = 1_700_000_000;
    pub const YEAR: u64 = 365 * 24 * 3600;

    pub fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    pub struct Ca {
        pub params: CertificateParams,
        pub key: KeyPair,
        pub cert: Certificate,
    }

    fn base(cn: &str, from: u64, to: u64) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.not_before = offset_date_time(at(from)).unwrap();
        p.not_after = offset_date_time(at(to)).unwrap();
        p.serial_number = Some(random_serial().unwrap());
        p.use_authority_key_identifier_extension = true;
        p
    }

    /// A CA (root if `parent` is None) valid from `from` to `to`.
    pub fn ca(cn: &str, key_index: usize, from: u64, to: u64, parent: Option<&Ca>) -> Ca {
        let mut params = base(cn, from, to);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = key(key_index);
        let der = match parent {
            None => params.self_signed(&key).unwrap().der().to_vec(),
            Some(parent) => {
                let issuer = Issuer::from_params(&parent.params, &parent.key);
                params.signed_by(&key, &issuer).unwrap().der().to_vec()
            }
        };
        Ca {
            params,
            key,
            cert: Certificate::from_der(&der).unwrap(),
        }
    }

    /// An application instance certificate issued by `issuer`, adjusted by
    /// `edit`.
    pub fn leaf(issuer: &Ca, edit: impl FnOnce(&mut CertificateParams)) -> Certificate {
        let mut p = base("leaf", T0, T0 + YEAR);
        p.subject_alt_names = vec![SanType::URI("urn:test:leaf".try_into().unwrap())];
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::ContentCommitment,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::DataEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        edit(&mut p);
        let issuer = Issuer::from_params(&issuer.params, &issuer.key);
        let der = p.signed_by(&key(3), &issuer).unwrap().der().to_vec();
        Certificate::from_der(&der).unwrap()
    }

    /// An extension that appears twice makes the certificate invalid
    /// (RFC 5280 §4.2); once is fine.
    #[test]
    fn a_repeated_extension_is_refused() {
        let root = ca("root", 0, T0, T0 + 10 * YEAR, None);
        let issuer = Issuer::from_params(&root.params, &root.key);
        let ext =
            || rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 55555, 1], vec![5, 0]);
        let mut p = base("leaf", T0, T0 + YEAR);
        p.custom_extensions = vec![ext(), ext()];
        let der = p.signed_by(&key(3), &issuer).unwrap().der().to_vec();
        let e = Certificate::from_der(&der).unwrap_err();
        assert_eq!(
            e.status_code(),
            uascale_types::StatusCode::BadCertificateInvalid
        );
        assert!(e.to_string().contains("duplicate"), "{e}");
        p.custom_extensions = vec![ext()];
        let der = p.signed_by(&key(3), &issuer).unwrap().der().to_vec();
        Certificate::from_der(&der).unwrap();
    }

    /// A CRL of `ca` revoking `revoked`.
    pub fn crl(ca: &Ca, revoked: &[&Certificate]) -> Crl {
        let params = CertificateRevocationListParams {
            this_update: offset_date_time(at(T0)).unwrap(),
            next_update: offset_date_time(at(T0 + YEAR)).unwrap(),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|c| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(c.serial()),
                    revocation_time: offset_date_time(at(T0)).unwrap(),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let issuer = Issuer::from_params(&ca.params, &ca.key);
        Crl::from_der(params.signed_by(&issuer).unwrap().der()).unwrap()
    }
}

#[allow(clippy::cloned_ref_to_slice_refs)] // tests read better with one-element arrays
mod validation {
    use uascale_types::StatusCode;

    use super::pki::*;
    use crate::x509::{
        create_self_signed, Certificate, CertificateUse, SelfSignedParams, TrustList,
        ValidationOptions,
    };

    fn status(
        list: &TrustList,
        chain: &[Certificate],
        options: &ValidationOptions<'_>,
        now: u64,
    ) -> StatusCode {
        match list.validate(chain, options, at(now)) {
            Ok(()) => StatusCode::Good,
            Err(e) => e.status_code(),
        }
    }

    fn default() -> ValidationOptions<'static> {
        ValidationOptions::default()
    }

    const NOW: u64 = T0 + 1000;

    fn self_signed() -> Certificate {
        create_self_signed(&SelfSignedParams::new("urn:test:self", "self", at(T0)))
            .unwrap()
            .certificate
    }

    #[test]
    fn a_remembered_signature_never_vouches_for_another() {
        let cert = self_signed();
        let trusted = TrustList::new(vec![cert.clone()], vec![], vec![]);
        // Twice: the second answer comes from the memo of verified
        // signatures, and is the same.
        for _ in 0..2 {
            assert_eq!(
                status(&trusted, &[cert.clone()], &default(), NOW),
                StatusCode::Good
            );
        }
        // The same certificate with its signature's last byte flipped: it
        // still parses, and fails, memo or not, on every try.
        let mut der = cert.der().to_vec();
        if let Some(b) = der.last_mut() {
            *b ^= 0x01;
        }
        let forged = Certificate::from_der(&der).unwrap();
        let all = ValidationOptions {
            trust_all: true,
            ..default()
        };
        let empty = TrustList::new(vec![], vec![], vec![]);
        for _ in 0..2 {
            assert_eq!(
                status(&empty, &[forged.clone()], &all, NOW),
                StatusCode::BadCertificateInvalid
            );
        }
    }

    #[test]
    fn self_signed_trusted_or_not() {
        let cert = self_signed();
        let trusted = TrustList::new(vec![cert.clone()], vec![], vec![]);
        let empty = TrustList::new(vec![], vec![], vec![]);
        assert_eq!(
            status(&trusted, &[cert.clone()], &default(), NOW),
            StatusCode::Good
        );
        assert_eq!(
            status(&empty, &[cert.clone()], &default(), NOW),
            StatusCode::BadCertificateUntrusted
        );
        // In issuers/ only: known for chains, but not trusted.
        let issuer_only = TrustList::new(vec![], vec![cert.clone()], vec![]);
        assert_eq!(
            status(&issuer_only, &[cert.clone()], &default(), NOW),
            StatusCode::BadCertificateUntrusted
        );
        // trust_all skips the trust check, not the others.
        let all = ValidationOptions {
            trust_all: true,
            ..default()
        };
        assert_eq!(status(&empty, &[cert.clone()], &all, NOW), StatusCode::Good);
        assert_eq!(
            status(&empty, &[cert], &all, T0 - 10),
            StatusCode::BadCertificateTimeInvalid
        );
        assert_eq!(
            status(&empty, &[], &default(), NOW),
            StatusCode::BadCertificateInvalid
        );
    }

    #[test]
    fn ca_issued_chain() {
        let root = ca("root", 0, T0, T0 + 10 * YEAR, None);
        let leaf = leaf(&root, |_| {});
        let root_crl = crl(&root, &[]);
        let trusted_ca = TrustList::new(vec![root.cert.clone()], vec![], vec![root_crl.clone()]);
        assert_eq!(
            status(&trusted_ca, &[leaf.clone()], &default(), NOW),
            StatusCode::Good
        );
        assert!(trusted_ca.ignored_crls().is_empty());

        // CA only in issuers/: the leaf itself must be trusted.
        let issuers = TrustList::new(vec![], vec![root.cert.clone()], vec![root_crl.clone()]);
        assert_eq!(
            status(&issuers, &[leaf.clone()], &default(), NOW),
            StatusCode::BadCertificateUntrusted
        );
        let leaf_trusted = TrustList::new(
            vec![leaf.clone()],
            vec![root.cert.clone()],
            vec![root_crl.clone()],
        );
        assert_eq!(
            status(&leaf_trusted, &[leaf.clone()], &default(), NOW),
            StatusCode::Good
        );

        // Issuer unknown.
        let leaf_only = TrustList::new(vec![leaf.clone()], vec![], vec![]);
        assert_eq!(
            status(&leaf_only, &[leaf.clone()], &default(), NOW),
            StatusCode::BadCertificateChainIncomplete
        );
        // ... unless the peer sends it along; sending it does not trust it.
        let with_crl = TrustList::new(vec![leaf.clone()], vec![], vec![root_crl]);
        assert_eq!(
            status(
                &with_crl,
                &[leaf.clone(), root.cert.clone()],
                &default(),
                NOW
            ),
            StatusCode::BadCertificateRevocationUnknown,
            "the CRL is ignored without its issuer in the PKI"
        );
        assert_eq!(with_crl.ignored_crls().len(), 1);
        let relaxed = ValidationOptions {
            reject_unknown_revocation_status: false,
            ..default()
        };
        assert_eq!(
            status(
                &leaf_only,
                &[leaf.clone(), root.cert.clone()],
                &relaxed,
                NOW
            ),
            StatusCode::Good
        );
        let empty = TrustList::new(vec![], vec![], vec![]);
        assert_eq!(
            status(&empty, &[leaf.clone(), root.cert.clone()], &relaxed, NOW),
            StatusCode::BadCertificateUntrusted
        );
        // The chain as sent on the wire (concatenated DER).
        let mut wire = leaf.der().to_vec();
        wire.extend_from_slice(root.cert.der());
        let parsed = Certificate::parse_chain(&wire).unwrap();
        assert_eq!(parsed, [leaf.clone(), root.cert.clone()]);
        assert!(Certificate::parse_chain(&[]).is_err());
        assert!(Certificate::parse_chain(&wire[..wire.len() - 1]).is_err());
    }

    #[test]
    fn intermediate_ca_and_revocation() {
        let root = ca("root", 0, T0, T0 + 10 * YEAR, None);
        let sub = ca("sub", 1, T0, T0 + 10 * YEAR, Some(&root));
        let good = leaf(&sub, |_| {});
        let bad = leaf(&sub, |_| {});
        let crls = vec![crl(&root, &[]), crl(&sub, &[&bad])];
        let list = TrustList::new(vec![root.cert.clone()], vec![sub.cert.clone()], crls);
        assert_eq!(
            status(&list, &[good.clone()], &default(), NOW),
            StatusCode::Good
        );
        assert_eq!(
            status(&list, &[bad.clone()], &default(), NOW),
            StatusCode::BadCertificateRevoked
        );
        // The root revokes the intermediate.
        let crls = vec![crl(&root, &[&sub.cert]), crl(&sub, &[])];
        let list = TrustList::new(vec![root.cert.clone()], vec![sub.cert.clone()], crls);
        assert_eq!(
            status(&list, &[good.clone()], &default(), NOW),
            StatusCode::BadCertificateIssuerRevoked
        );
        // No CRL of the intermediate.
        let list = TrustList::new(
            vec![root.cert.clone()],
            vec![sub.cert.clone()],
            vec![crl(&root, &[])],
        );
        assert_eq!(
            status(&list, &[good.clone()], &default(), NOW),
            StatusCode::BadCertificateRevocationUnknown
        );
        let list = TrustList::new(
            vec![root.cert.clone()],
            vec![sub.cert.clone()],
            vec![crl(&sub, &[])],
        );
        assert_eq!(
            status(&list, &[good.clone()], &default(), NOW),
            StatusCode::BadCertificateIssuerRevocationUnknown
        );
        // A CRL under the intermediate's name but signed by another key is
        // not taken.
        let impostor = ca("sub", 2, T0, T0 + 10 * YEAR, None);
        let list = TrustList::new(
            vec![root.cert.clone()],
            vec![sub.cert.clone()],
            vec![crl(&root, &[]), crl(&impostor, &[])],
        );
        assert_eq!(list.ignored_crls().len(), 1);
        assert_eq!(
            status(&list, &[good], &default(), NOW),
            StatusCode::BadCertificateRevocationUnknown
        );
    }

    #[test]
    fn validity_periods() {
        let root = ca("root", 0, T0, T0 + 2 * YEAR, None);
        let leaf = leaf(&root, |p| {
            p.not_after = crate::x509::create::offset_date_time(at(T0 + 100)).unwrap()
        });
        let list = TrustList::new(vec![root.cert.clone()], vec![], vec![crl(&root, &[])]);
        assert_eq!(
            status(&list, &[leaf.clone()], &default(), T0 + 50),
            StatusCode::Good
        );
        assert_eq!(
            status(&list, &[leaf.clone()], &default(), T0 + 101),
            StatusCode::BadCertificateTimeInvalid
        );
        assert_eq!(
            status(&list, &[leaf.clone()], &default(), T0 - 1),
            StatusCode::BadCertificateTimeInvalid
        );
        let expired_root = ca("old root", 0, T0 - 2 * YEAR, T0 - 1, None);
        let leaf = super::pki::leaf(&expired_root, |_| {});
        let list = TrustList::new(
            vec![expired_root.cert.clone()],
            vec![],
            vec![crl(&expired_root, &[])],
        );
        assert_eq!(
            status(&list, &[leaf], &default(), NOW),
            StatusCode::BadCertificateIssuerTimeInvalid
        );
    }

    #[test]
    fn usage_uri_and_key_length() {
        let root = ca("root", 0, T0, T0 + 10 * YEAR, None);
        let crls = vec![crl(&root, &[])];
        let list = TrustList::new(vec![root.cert.clone()], vec![], crls);
        let no_signature = leaf(&root, |p| {
            p.key_usages = vec![rcgen::KeyUsagePurpose::KeyEncipherment]
        });
        assert_eq!(
            status(&list, &[no_signature], &default(), NOW),
            StatusCode::BadCertificateUseNotAllowed
        );
        let server_only = leaf(&root, |p| {
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]
        });
        assert_eq!(
            status(&list, &[server_only.clone()], &default(), NOW),
            StatusCode::BadCertificateUseNotAllowed
        );
        let as_server = ValidationOptions {
            usage: CertificateUse::Server,
            ..default()
        };
        assert_eq!(
            status(&list, &[server_only], &as_server, NOW),
            StatusCode::Good
        );

        // A leaf used as a CA.
        let not_a_ca = ca("not a ca", 1, T0, T0 + YEAR, Some(&root));
        let mut fake = not_a_ca;
        fake.params.is_ca = rcgen::IsCa::ExplicitNoCa;
        let fake = ca_reissued(&root, fake);
        let below = leaf(&fake, |_| {});
        let list2 = TrustList::new(
            vec![root.cert.clone()],
            vec![fake.cert.clone()],
            vec![crl(&root, &[]), crl(&fake, &[])],
        );
        assert_eq!(
            status(&list2, &[below], &default(), NOW),
            StatusCode::BadCertificateIssuerUseNotAllowed
        );

        let good = leaf(&root, |_| {});
        let right_uri = ValidationOptions {
            application_uri: Some("urn:test:leaf"),
            ..default()
        };
        assert_eq!(
            status(&list, &[good.clone()], &right_uri, NOW),
            StatusCode::Good
        );
        let wrong_uri = ValidationOptions {
            application_uri: Some("urn:test:other"),
            ..default()
        };
        assert_eq!(
            status(&list, &[good.clone()], &wrong_uri, NOW),
            StatusCode::BadCertificateUriInvalid
        );
        let longer_keys = ValidationOptions {
            min_key_bits: 3072,
            ..default()
        };
        assert_eq!(
            status(&list, &[good.clone()], &longer_keys, NOW),
            StatusCode::BadCertificatePolicyCheckFailed
        );
        let shorter_keys = ValidationOptions {
            max_key_bits: 1024,
            min_key_bits: 1024,
            ..default()
        };
        assert_eq!(
            status(&list, &[good], &shorter_keys, NOW),
            StatusCode::BadCertificatePolicyCheckFailed
        );
    }

    /// Re-signs `ca`'s (edited) parameters with `parent`.
    fn ca_reissued(parent: &Ca, mut ca: Ca) -> Ca {
        let issuer = rcgen::Issuer::from_params(&parent.params, &parent.key);
        ca.params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let der = ca
            .params
            .signed_by(&ca.key, &issuer)
            .unwrap()
            .der()
            .to_vec();
        ca.cert = Certificate::from_der(&der).unwrap();
        ca
    }

    #[test]
    fn tampered_signature_is_invalid() {
        let cert = self_signed();
        let mut der = cert.der().to_vec();
        let last = der.len() - 1;
        der[last] ^= 1;
        let tampered = Certificate::from_der(&der).unwrap();
        let list = TrustList::new(vec![tampered.clone()], vec![], vec![]);
        assert_eq!(
            status(&list, &[tampered], &default(), NOW),
            StatusCode::BadCertificateInvalid
        );
        // A leaf whose issuer name matches a CA that did not sign it.
        let root = ca("root", 0, T0, T0 + 10 * YEAR, None);
        let other_root = ca("root", 1, T0, T0 + 10 * YEAR, None);
        let leaf = leaf(&other_root, |_| {});
        let mut only_root = TrustList::new(vec![root.cert.clone()], vec![], vec![crl(&root, &[])]);
        // (its AuthorityKeyIdentifier names the other key: not an issuer)
        assert_eq!(
            status(&only_root, &[leaf.clone()], &default(), NOW),
            StatusCode::BadCertificateChainIncomplete
        );
        // A CA-issued leaf whose signature was altered.
        let mut der = super::pki::leaf(&root, |_| {}).der().to_vec();
        let last = der.len() - 1;
        der[last] ^= 1;
        let tampered = Certificate::from_der(&der).unwrap();
        assert_eq!(
            status(&only_root, &[tampered], &default(), NOW),
            StatusCode::BadCertificateInvalid
        );
        // With both roots trusted, the one that verifies is chosen.
        only_root = TrustList::new(
            vec![root.cert.clone(), other_root.cert.clone()],
            vec![],
            vec![crl(&root, &[]), crl(&other_root, &[])],
        );
        assert_eq!(
            status(&only_root, &[leaf], &default(), NOW),
            StatusCode::Good
        );
    }

    #[test]
    fn sha1_rejected_unless_allowed_and_pss_accepted() {
        let sha1 = Certificate::from_der(include_bytes!("testdata/sha1_self_signed.der")).unwrap();
        assert_eq!(
            sha1.signature_algorithm(),
            crate::x509::SignatureAlgorithm::RsaPkcs1(crate::x509::HashAlgorithm::Sha1)
        );
        let now = crate::x509::unix_seconds(sha1.not_before()) as u64 + 100;
        let list = TrustList::new(vec![sha1.clone()], vec![], vec![]);
        assert_eq!(
            status(&list, &[sha1.clone()], &default(), now),
            StatusCode::BadCertificatePolicyCheckFailed
        );
        let legacy = ValidationOptions {
            allow_sha1_signatures: true,
            application_uri: Some("urn:test:legacy"),
            ..default()
        };
        assert_eq!(status(&list, &[sha1], &legacy, now), StatusCode::Good);

        let pss =
            Certificate::from_der(include_bytes!("testdata/pss_sha256_self_signed.der")).unwrap();
        assert_eq!(
            pss.signature_algorithm(),
            crate::x509::SignatureAlgorithm::RsaPss(crate::x509::HashAlgorithm::Sha256)
        );
        let now = crate::x509::unix_seconds(pss.not_before()) as u64 + 100;
        let list = TrustList::new(vec![pss.clone()], vec![], vec![]);
        assert_eq!(status(&list, &[pss], &default(), now), StatusCode::Good);
    }
}

#[test]
fn ecc_certificates_are_created_and_validated_per_policy() {
    use crate::ecc::{EccCurve, EccPrivateKey};
    use crate::policy::SecurityPolicy;
    let now = at(1_700_000_100);
    for (key_type, curve, policy) in [
        (
            KeyType::EcP256,
            EccCurve::NistP256,
            SecurityPolicy::EccNistP256AesGcm,
        ),
        (
            KeyType::EcP384,
            EccCurve::NistP384,
            SecurityPolicy::EccNistP384,
        ),
        (
            KeyType::Ed25519,
            EccCurve::Curve25519,
            SecurityPolicy::EccCurve25519,
        ),
    ] {
        let mut params = SelfSignedParams::new("urn:test:ecc", "ECC App", at(1_700_000_000));
        params.key_type = key_type;
        let created = create_self_signed(&params).unwrap();
        let cert = &created.certificate;
        assert_eq!(cert.ecc_curve(), Some(curve));
        let key = EccPrivateKey::from_pkcs8_der(&created.private_key_pkcs8_der).unwrap();
        // PKCS#8 v1: version INTEGER 0 (OpenSSL refuses aws-lc's v2 Ed25519 form).
        let der = &created.private_key_pkcs8_der;
        let at = if der[1] & 0x80 != 0 {
            2 + usize::from(der[1] & 0x7f)
        } else {
            2
        };
        assert_eq!(&der[at..at + 3], &[0x02, 0x01, 0x00]);
        assert_eq!(
            key.public_key().spki_der(),
            cert.subject_public_key_info_der()
        );
        let ku = cert.key_usage().unwrap();
        assert!(ku.contains(KeyUsage::DIGITAL_SIGNATURE));
        assert!(!ku.contains(KeyUsage::KEY_ENCIPHERMENT));
        assert_eq!(
            ku.contains(KeyUsage::KEY_AGREEMENT),
            key_type != KeyType::Ed25519
        );
        let list = TrustList::new(vec![cert.clone()], vec![], vec![]);
        let options = |p| ValidationOptions {
            policy: Some(p),
            ..ValidationOptions::default()
        };
        // Trusted, self-signature verified, no keyEncipherment needed.
        list.validate(std::slice::from_ref(cert), &options(policy), now)
            .unwrap();
        // The wrong kind of policy is a policy check failure.
        for other in [SecurityPolicy::Basic256Sha256, SecurityPolicy::EccNistP384]
            .into_iter()
            .filter(|p| *p != policy)
        {
            let e = list
                .validate(std::slice::from_ref(cert), &options(other), now)
                .unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadCertificatePolicyCheckFailed);
        }
    }
    assert_eq!(KeyType::from_name("ec-p384"), Some(KeyType::EcP384));
    assert_eq!(KeyType::from_name("dsa"), None);
}

#[test]
fn der_sequence_lengths() {
    // Short form: 0x30 0x03 and three bytes of contents.
    assert_eq!(der_sequence_len(&[0x30, 0x03, 1, 2, 3, 9]), Some(5));
    // Long form (two length bytes): 0x0102 = 258 bytes of contents.
    let mut long = vec![0x30, 0x82, 0x01, 0x02];
    long.resize(4 + 258, 0);
    assert_eq!(der_sequence_len(&long), Some(262));
    // Contents cut short, a wrong tag, an indefinite length, an empty or
    // truncated header, a length of more than 4 bytes.
    assert_eq!(der_sequence_len(&long[..261]), None);
    assert_eq!(der_sequence_len(&[0x31, 0x01, 0]), None);
    assert_eq!(der_sequence_len(&[0x30, 0x80, 0, 0]), None);
    assert_eq!(der_sequence_len(&[]), None);
    assert_eq!(der_sequence_len(&[0x30]), None);
    assert_eq!(der_sequence_len(&[0x30, 0x82, 0x01]), None);
    assert_eq!(der_sequence_len(&[0x30, 0x85, 0, 0, 0, 0, 1, 0]), None);
    // Garbage after a well-formed header still fails in `from_der`.
    assert!(Certificate::parse_chain(&[0x30, 0x01, 0x00]).is_err());
}
