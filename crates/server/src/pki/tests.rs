use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use uascale_crypto::x509::{create_self_signed, Certificate, SelfSignedParams};
use uascale_types::StatusCode;

use super::*;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("uascale-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn identity() -> OwnIdentity {
    OwnIdentity {
        application_uri: "urn:test:server".into(),
        application_name: "test server".into(),
        host_names: vec!["localhost".into()],
        ip_addresses: vec![IpAddr::from([127, 0, 0, 1])],
    }
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn client(uri: &str) -> Certificate {
    let params = SelfSignedParams::new(uri, "client", now() - Duration::from_secs(60));
    create_self_signed(&params).unwrap().certificate
}

fn files(dir: &Path) -> Vec<PathBuf> {
    files_in(dir).unwrap()
}

#[test]
fn first_start_creates_layout_and_own_certificate() {
    let dir = TempDir::new("create");
    let (pki, own_key) = Pki::open(&dir.0, &identity(), PkiOptions::default(), now()).unwrap();
    for sub in LAYOUT {
        assert!(dir.0.join(sub).is_dir(), "{sub}");
    }
    let cert = pki.own_certificate().clone();
    assert_eq!(cert.application_uri(), Some("urn:test:server"));
    assert_eq!(cert.key_bits(), 2048);
    assert!(cert.is_time_valid(now()));
    assert_eq!(std::fs::read(dir.0.join(OWN_CERT)).unwrap(), cert.der());
    let key = std::fs::read_to_string(dir.0.join(OWN_KEY)).unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.0.join(OWN_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(own_key.bits(), 2048);
    drop(pki);

    // Second start: the same certificate.
    let (again, _) = Pki::open(&dir.0, &identity(), PkiOptions::default(), now()).unwrap();
    assert_eq!(again.own_certificate(), &cert);

    // Another applicationUri in the configuration: refused, file named.
    let mut other = identity();
    other.application_uri = "urn:test:other".into();
    let e = Pki::open(&dir.0, &other, PkiOptions::default(), now()).unwrap_err();
    assert!(e.to_string().contains("cert.der"), "{e}");
    assert!(e.to_string().contains("urn:test:other"), "{e}");

    // A certificate without its key: refused, nothing overwritten.
    std::fs::remove_file(dir.0.join(OWN_KEY)).unwrap();
    let e = Pki::open(&dir.0, &identity(), PkiOptions::default(), now()).unwrap_err();
    assert!(e.to_string().contains("key.pem"), "{e}");
    assert_eq!(std::fs::read(dir.0.join(OWN_CERT)).unwrap(), cert.der());
}

#[test]
fn untrusted_goes_to_rejected_and_trusting_it_takes_effect_without_restart() {
    let dir = TempDir::new("reject");
    let (pki, _) = Pki::open(&dir.0, &identity(), PkiOptions::default(), now()).unwrap();
    let cert = client("urn:test:client");
    let e = pki.validate(cert.der(), now()).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadCertificateUntrusted);
    let rejected = files(&dir.0.join("rejected/certs"));
    assert_eq!(rejected.len(), 1);
    assert_eq!(std::fs::read(&rejected[0]).unwrap(), cert.der());
    assert!(rejected[0]
        .to_string_lossy()
        .contains(&cert.thumbprint_hex()));

    // The operator moves it to trusted/certs; the next attempt (a second
    // later) passes without a restart.
    let target = dir
        .0
        .join("trusted/certs")
        .join(rejected[0].file_name().unwrap());
    std::fs::rename(&rejected[0], &target).unwrap();
    let later = now() + Duration::from_secs(2);
    pki.validate(cert.der(), later).unwrap();
    let got = pki
        .validate_client(
            cert.der(),
            Some(SecurityPolicy::Basic256Sha256),
            Some("urn:test:client"),
            later,
        )
        .unwrap();
    assert_eq!(got, cert);
    let e = pki
        .validate_client(cert.der(), None, Some("urn:test:liar"), later)
        .unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadCertificateUriInvalid);

    // Removing it is seen at the next periodic check.
    std::fs::remove_file(&target).unwrap();
    let much_later = later + Duration::from_secs(10);
    assert_eq!(pki.trust_list(much_later).trusted_count(), 0);
    assert_eq!(
        pki.validate(cert.der(), much_later)
            .unwrap_err()
            .status_code(),
        StatusCode::BadCertificateUntrusted
    );
}

#[test]
fn rejected_store_is_bounded_and_trust_all_is_named() {
    let dir = TempDir::new("bounded");
    let options = PkiOptions {
        max_rejected_certificates: 2,
        ..PkiOptions::default()
    };
    let (pki, _) = Pki::open(&dir.0, &identity(), options, now()).unwrap();
    let certs: Vec<Certificate> = (0..4).map(|i| client(&format!("urn:c{i}"))).collect();
    for (i, c) in certs.iter().enumerate() {
        assert!(pki
            .validate(c.der(), now() + Duration::from_secs(i as u64))
            .is_err());
    }
    assert_eq!(files(&dir.0.join("rejected/certs")).len(), 2);
    // The same certificate again does not add a file.
    assert!(pki.validate(certs[3].der(), now()).is_err());
    assert_eq!(files(&dir.0.join("rejected/certs")).len(), 2);
    // Garbage is rejected without a file.
    assert_eq!(
        pki.validate(b"junk", now()).unwrap_err().status_code(),
        StatusCode::BadCertificateInvalid
    );
    drop(pki);

    let open = PkiOptions {
        trust_all_client_certificates: true,
        ..PkiOptions::default()
    };
    let (pki, _) = Pki::open(&dir.0, &identity(), open, now()).unwrap();
    pki.validate(certs[0].der(), now()).unwrap();
    // ...but not for user certificates, and not expired ones.
    assert_eq!(
        pki.validate_user(certs[0].der(), None, now())
            .unwrap_err()
            .status_code(),
        StatusCode::BadCertificateUntrusted
    );
    let expired = now() + Duration::from_secs(10 * 365 * 24 * 3600);
    assert_eq!(
        pki.validate(certs[0].der(), expired)
            .unwrap_err()
            .status_code(),
        StatusCode::BadCertificateTimeInvalid
    );
}

#[test]
fn pem_files_and_bad_files_in_trusted() {
    let dir = TempDir::new("pem");
    create_layout(&dir.0).unwrap();
    let cert = client("urn:test:pem");
    std::fs::write(
        dir.0.join("trusted/certs/client.pem"),
        uascale_crypto::x509::to_pem("CERTIFICATE", cert.der()),
    )
    .unwrap();
    std::fs::write(dir.0.join("trusted/certs/broken.der"), b"not a certificate").unwrap();
    std::fs::write(dir.0.join("trusted/crl/broken.crl"), b"not a CRL").unwrap();
    let (pki, _) = Pki::open(&dir.0, &identity(), PkiOptions::default(), now()).unwrap();
    assert_eq!(pki.trust_list(now()).trusted_count(), 1);
    pki.validate(cert.der(), now()).unwrap();
}
