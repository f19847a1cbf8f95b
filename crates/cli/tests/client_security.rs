//! The client commands over secured channels against `uascale serve` with a
//! PKI and a user: every RSA policy in Sign and SignAndEncrypt with the
//! anonymous, user name (and a wrong password) and X.509 identities; the
//! first contact, where each side refuses the other's certificate until
//! `uascale cert trust` moves it out of rejected/; an unknown endpoint. And
//! every ECC policy and mode against `uascale serve --security ecc`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_uascale");

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(args: &[&str], password: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("UASCALE_PASSWORD");
    if let Some(p) = password {
        cmd.env("UASCALE_PASSWORD", p);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = run(args, None);
    assert_eq!(code, 0, "uascale {args:?}: {out}{err}");
    out
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn secured_client_commands_against_uascale_serve() {
    let dir = TempDir::new("clisec");
    let server_pki = dir.0.join("server-pki");
    let client_pki = dir.0.join("client-pki");
    let user_pki = dir.0.join("user-pki");
    let (spki, cpki) = (server_pki.to_str().unwrap(), client_pki.to_str().unwrap());

    let password = "s3cret-cli";
    let mut hasher = Command::new(BIN)
        .args(["user", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(hasher.stdin.take().unwrap(), "{password}").unwrap();
    let hash = String::from_utf8(hasher.wait_with_output().unwrap().stdout).unwrap();
    let config = dir.0.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[security]\npki_dir = {spki:?}\n\n[[users]]\nname = \"operator\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Server(
        Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .args(["--bind", "127.0.0.1", "--host", "localhost"])
            .args(["--port", &port.to_string()])
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("opc.tcp://127.0.0.1:{port}");
    let url = url.as_str();
    let secure = ["--pki", cpki, "--security", "Basic256Sha256:SignAndEncrypt"];

    // First contact: the client does not know the server certificate.
    let (code, _, err) = run(&[&["read", url, "i=2258"][..], &secure].concat(), None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("BadCertificateUntrusted"), "{err}");
    assert!(
        err.contains("rejected") && err.contains("uascale cert trust"),
        "{err}"
    );
    assert!(client_pki.join("own/certs/cert.der").exists());
    let rejected = files(&client_pki.join("rejected/certs"));
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(
        std::fs::read(&rejected[0]).unwrap(),
        std::fs::read(server_pki.join("own/certs/cert.der")).unwrap()
    );
    ok(&[
        "cert",
        "trust",
        rejected[0].to_str().unwrap(),
        "--pki",
        cpki,
    ]);

    // Now the server does not know ours: it says where it went.
    let (code, _, err) = run(&[&["read", url, "i=2258"][..], &secure].concat(), None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("BadCertificateUntrusted"), "{err}");
    assert!(err.contains("uascale cert trust"), "{err}");
    let client_cert = client_pki.join("own/certs/cert.der");
    assert!(files(&server_pki.join("rejected/certs"))
        .iter()
        .any(|f| std::fs::read(f).unwrap() == std::fs::read(&client_cert).unwrap()));
    ok(&[
        "cert",
        "trust",
        client_cert.to_str().unwrap(),
        "--pki",
        spki,
    ]);

    // A user certificate, trusted by the server.
    ok(&[
        "cert",
        "create",
        "--pki",
        user_pki.to_str().unwrap(),
        "--uri",
        "urn:test:user",
        "--name",
        "user",
    ]);
    let user_cert = user_pki.join("own/certs/cert.der");
    let user_key = user_pki.join("own/private/key.pem");
    ok(&["cert", "trust", user_cert.to_str().unwrap(), "--pki", spki]);
    // (The server rechecks its directory at most once a second on a miss.)
    std::thread::sleep(Duration::from_millis(1100));

    let x509 = [
        "--cert",
        user_cert.to_str().unwrap(),
        "--key",
        user_key.to_str().unwrap(),
    ];
    for policy in [
        "Basic256Sha256",
        "Aes128_Sha256_RsaOaep",
        "Aes256_Sha256_RsaPss",
    ] {
        for mode in ["Sign", "SignAndEncrypt"] {
            let sec = format!("{policy}:{mode}");
            let base = ["--pki", cpki, "--security", sec.as_str()];
            // Anonymous.
            let out = ok(&[&["read", url, "i=2259"][..], &base].concat());
            assert!(out.contains("Running") || out.contains('0'), "{sec}: {out}");
            // User name, password from the environment.
            let (code, out, err) = run(
                &[&["read", url, "i=2259"][..], &base, &["--user", "operator"]].concat(),
                Some(password),
            );
            assert_eq!(code, 0, "{sec} user: {out}{err}");
            // X.509 user.
            let out = ok(&[&["browse", url, "i=85"][..], &base, &x509].concat());
            assert!(out.contains("Server"), "{sec} x509: {out}");
        }
    }
    // A wrong password.
    let (code, _, err) = run(
        &[
            &["read", url, "i=2259"][..],
            &secure,
            &["--user", "operator"],
        ]
        .concat(),
        Some("wrong"),
    );
    assert_eq!(code, 1);
    assert!(err.contains("BadUserAccessDenied"), "{err}");
    // No password at all: refused before connecting.
    let (code, _, err) = run(
        &[
            &["read", url, "i=2259"][..],
            &secure,
            &["--user", "operator"],
        ]
        .concat(),
        None,
    );
    assert_eq!(code, 2);
    assert!(err.contains("UASCALE_PASSWORD"), "{err}");
    // An endpoint the server does not offer (Sign over None is no policy;
    // an unknown name is a usage error).
    let (code, _, err) = run(
        &["read", url, "i=2259", "--security", "Basic128Rsa15"],
        None,
    );
    assert_eq!(code, 2);
    assert!(err.contains("unknown policy"), "{err}");
}

/// The client commands over every ECC policy and mode against `uascale
/// serve --security ecc` (an ECC certificate per curve beside the RSA one;
/// client certificates of each curve created in the client PKI on first
/// use): anonymous and user name (an EccEncryptedSecret) reads, a wrong
/// password refused, and an RSA policy on the same server.
#[test]
fn ecc_client_commands_against_uascale_serve() {
    let dir = TempDir::new("cliecc");
    let server_pki = dir.0.join("server-pki");
    let client_pki = dir.0.join("client-pki");
    let (spki, cpki) = (server_pki.to_str().unwrap(), client_pki.to_str().unwrap());
    let password = "s3cret-ecc";
    let mut hasher = Command::new(BIN)
        .args(["user", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(hasher.stdin.take().unwrap(), "{password}").unwrap();
    let hash = String::from_utf8(hasher.wait_with_output().unwrap().stdout).unwrap();
    let config = dir.0.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[security]\npki_dir = {spki:?}\ntrust_all_client_certificates = true\n\n\
             [[users]]\nname = \"operator\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Server(
        Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .args([
                "--security",
                "ecc",
                "--bind",
                "127.0.0.1",
                "--host",
                "localhost",
            ])
            .args(["--port", &port.to_string()])
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("opc.tcp://127.0.0.1:{port}");
    let url = url.as_str();
    for policy in [
        "ECC_nistP256",
        "ECC_nistP384",
        "ECC_curve25519",
        "ECC_nistP256_AesGcm",
        "ECC_nistP256_ChaChaPoly",
        "Basic256Sha256",
    ] {
        for mode in ["Sign", "SignAndEncrypt"] {
            let sec = format!("{policy}:{mode}");
            let base = ["--pki", cpki, "--security", sec.as_str(), "--trust-server"];
            let out = ok(&[&["read", url, "i=2259"][..], &base].concat());
            assert!(out.contains("Running") || out.contains('0'), "{sec}: {out}");
            let (code, out, err) = run(
                &[&["read", url, "i=2259"][..], &base, &["--user", "operator"]].concat(),
                Some(password),
            );
            assert_eq!(code, 0, "{sec} user: {out}{err}");
            let out = ok(&[&["browse", url, "i=85"][..], &base].concat());
            assert!(out.contains("Server"), "{sec}: {out}");
        }
        let base = ["--pki", cpki, "--security", policy, "--trust-server"];
        let (code, _, err) = run(
            &[&["read", url, "i=2259"][..], &base, &["--user", "operator"]].concat(),
            Some("wrong"),
        );
        assert_eq!(code, 1, "{policy}: {err}");
        assert!(err.contains("BadUserAccessDenied"), "{policy}: {err}");
    }
    // One client certificate per curve, beside the RSA one.
    for key in ["ec-p256", "ec-p384", "ed25519"] {
        assert!(client_pki
            .join(format!("own/certs/cert_{key}.der"))
            .exists());
        assert!(server_pki
            .join(format!("own/certs/cert_{key}.der"))
            .exists());
    }
    assert!(client_pki.join("own/certs/cert.der").exists());
}
