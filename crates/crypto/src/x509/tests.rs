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
