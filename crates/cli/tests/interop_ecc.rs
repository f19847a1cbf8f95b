//! ECC interop of `uascale serve` with o6 (open62541's client): the server
//! publishes ECC_nistP256_AesGcm, ECC_nistP256_ChaChaPoly and
//! ECC_curve25519 beside Basic256Sha256 (one ECC certificate per curve
//! beside the RSA one, made at start), and `tests/interop/ecc_o6.py` opens
//! sessions over each in Sign and SignAndEncrypt, Anonymous and UserName
//! (an EccEncryptedSecret), one per policy through two token renewals,
//! then one RSA session on the same server.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TempDir;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn uascale(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args(args)
        .output()
        .expect("run uascale");
    assert!(
        out.status.success(),
        "uascale {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client certificate of `key` made by `uascale cert create`, copied to
/// `peer/client_KEY.{der,pem}` and trusted by the server's PKI.
fn client_cert(dir: &Path, key: &str, server_pki: &str) {
    let pki = dir.join(format!("pki-client-{key}"));
    let pki = pki.to_str().unwrap();
    uascale(&[
        "cert",
        "create",
        "--pki",
        pki,
        "--uri",
        "urn:test:interop-client",
        "--name",
        "client",
        "--key",
        key,
    ]);
    let (cert, private) = if key == "rsa" {
        (
            "own/certs/cert.der".to_owned(),
            "own/private/key.pem".to_owned(),
        )
    } else {
        (
            format!("own/certs/cert_{key}.der"),
            format!("own/private/key_{key}.pem"),
        )
    };
    let der = dir.join(format!("peer/client_{key}.der"));
    std::fs::copy(Path::new(pki).join(cert), &der).unwrap();
    std::fs::copy(
        Path::new(pki).join(private),
        dir.join(format!("peer/client_{key}.pem")),
    )
    .unwrap();
    uascale(&["cert", "trust", der.to_str().unwrap(), "--pki", server_pki]);
}

#[test]
fn ecc_sessions_with_o6_as_client() {
    let python = root().join("target/venv/bin/python");
    assert!(python.exists(), "{} is missing", python.display());
    let dir = TempDir::new("ecc");
    std::fs::create_dir_all(dir.0.join("peer")).unwrap();
    let server_pki = dir.0.join("server-pki");
    let pki = server_pki.to_str().unwrap();
    for key in ["ec-p256", "ed25519", "rsa"] {
        client_cert(&dir.0, key, pki);
    }
    let password = "s3cret-ecc";
    std::fs::write(dir.0.join("peer/password.txt"), password).unwrap();
    let mut hasher = Command::new(env!("CARGO_BIN_EXE_uascale"))
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
            "[security]\npki_dir = {pki:?}\npolicies = [\"Basic256Sha256\", \
             \"ECC_nistP256_AesGcm\", \"ECC_nistP256_ChaChaPoly\", \"ECC_curve25519\"]\n\n\
             [limits]\nmin_token_lifetime_ms = 2000\n\n\
             [[users]]\nname = \"operator\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .args(["--bind", "127.0.0.1", "--host", "localhost", "--port", "0"])
        .env(
            "RUST_LOG",
            "warn,uascale=info,uascale_server::net=debug,uascale_server::endpoint=debug",
        )
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uascale serve");
    let stderr = child.stderr.take().unwrap();
    let server = Serve(child);
    let renewals = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let seen = Arc::clone(&renewals);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("addr=127.0.0.1:") {
                let port: String = line[at + 15..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let _ = tx.send(port.parse::<u16>().unwrap_or(0));
            } else if line.contains("security token renewed") {
                seen.lock().unwrap().push(line);
            } else if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("[serve] {line}");
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("server printed its address");
    let url = format!("opc.tcp://localhost:{port}");
    let out = Command::new(&python)
        .arg(root().join("tests/interop/ecc_o6.py"))
        .args([&url, dir.0.join("peer").to_str().unwrap(), pki])
        .output()
        .expect("run ecc_o6.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("o6 ecc ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for policy in [
        "ECC_nistP256_AesGcm",
        "ECC_nistP256_ChaChaPoly",
        "ECC_curve25519",
    ] {
        assert!(
            stdout.contains(&format!("ok {policy}/SIGN_AND_ENCRYPT/username renewed")),
            "{stdout}"
        );
        // Two renewals on the server side for each policy's long session.
        let n = renewals
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&format!("#{policy}")))
            .count();
        assert!(n >= 2, "{policy}: {n} renewals");
    }
    assert!(stdout.contains("ok Basic256Sha256/SIGN_AND_ENCRYPT/username"));
    drop(server);
}
