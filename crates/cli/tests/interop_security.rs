//! Interoperability of the secured endpoints: `uascale serve` with a PKI
//! and a user, driven by Python asyncua over every RSA policy in Sign and
//! SignAndEncrypt with the Anonymous, UserName and X509 identities; and a
//! client certificate the server does not trust, which lands in
//! rejected/certs and works once `uascale cert trust` moves it.
//! o6 (open62541's client) does the same sessions (without its default
//! subscription, which the server does not offer yet).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::TempDir;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    let p = root().join("target/venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask ci` (or `python3 -m venv target/venv && \
         target/venv/bin/pip install -r tests/requirements.txt`) first",
        p.display()
    );
    p
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

/// A running `uascale serve`; killed on drop.
struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    fn start(config: &Path) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_uascale"))
            .args(["serve", "--config", config.to_str().unwrap()])
            .args(["--bind", "127.0.0.1", "--host", "localhost", "--port", "0"])
            .env("RUST_LOG", "info,uascale_server::identity=debug")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start uascale serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                if let Some(at) = line.find("addr=127.0.0.1:") {
                    let port: String = line[at + 15..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    let _ = tx.send(port.parse::<u16>().unwrap_or(0));
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server printed its address");
        Serve { child, port }
    }

    fn url(&self) -> String {
        format!("opc.tcp://localhost:{}", self.port)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_peer(args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(root().join("tests/interop").join(args[0]))
        .args(&args[1..])
        .output()
        .expect("run the Python peer");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Creates an application certificate for `uri` with `uascale cert create`
/// and copies it and its key to `peer/NAME.der` and `peer/NAME.pem`.
fn make_cert(dir: &Path, name: &str, uri: &str) -> PathBuf {
    let pki = dir.join(format!("pki-{name}"));
    uascale(&[
        "cert",
        "create",
        "--pki",
        pki.to_str().unwrap(),
        "--uri",
        uri,
        "--name",
        name,
    ]);
    let der = dir.join(format!("peer/{name}.der"));
    std::fs::copy(pki.join("own/certs/cert.der"), &der).unwrap();
    std::fs::copy(
        pki.join("own/private/key.pem"),
        dir.join(format!("peer/{name}.pem")),
    )
    .unwrap();
    der
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn secured_sessions_with_asyncua() {
    let dir = TempDir::new("sec");
    std::fs::create_dir_all(dir.0.join("peer")).unwrap();
    let server_pki = dir.0.join("server-pki");
    let pki = server_pki.to_str().unwrap();

    let client = make_cert(&dir.0, "client", "urn:test:interop-client");
    let user = make_cert(&dir.0, "user", "urn:test:user");
    let stranger = make_cert(&dir.0, "stranger", "urn:test:stranger");
    uascale(&["cert", "trust", client.to_str().unwrap(), "--pki", pki]);
    uascale(&["cert", "trust", user.to_str().unwrap(), "--pki", pki]);

    // The operator's password, hashed as the README says.
    let password = "s3cret-interop";
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
            "[security]\npki_dir = {pki:?}\n\n[[users]]\nname = \"operator\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();

    let server = Serve::start(&config);
    let url = server.url();
    let peer = dir.0.join("peer");
    let peer = peer.to_str().unwrap();
    assert!(run_peer(&["security_asyncua.py", &url, peer]).contains("asyncua security ok"));
    let server_cert = server_pki.join("own/certs/cert.der");
    assert!(
        run_peer(&["security_o6.py", &url, peer, server_cert.to_str().unwrap()])
            .contains("o6 security ok")
    );

    // An untrusted application certificate: refused and kept for the operator.
    let rejected = server_pki.join("rejected/certs");
    assert!(run_peer(&["untrusted_asyncua.py", &url, peer]).contains("asyncua untrusted ok"));
    let stranger_der = std::fs::read(&stranger).unwrap();
    assert!(
        files(&rejected)
            .iter()
            .any(|f| std::fs::read(f).unwrap() == stranger_der),
        "the untrusted certificate is in rejected/certs: {:?}",
        files(&rejected)
    );
    // The operator trusts it (by thumbprint, from rejected/); the running
    // server picks the change up without a restart.
    let shown =
        String::from_utf8(uascale(&["cert", "show", stranger.to_str().unwrap()]).stdout).unwrap();
    let thumb = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("thumbprint"))
        .unwrap()
        .trim()
        .to_owned();
    uascale(&["cert", "trust", &thumb, "--pki", pki]);
    assert!(files(&rejected)
        .iter()
        .all(|f| std::fs::read(f).unwrap() != stranger_der));
    // (The server rechecks the directory at most once a second on a miss.)
    std::thread::sleep(Duration::from_millis(1100));
    assert!(run_peer(&["untrusted_asyncua.py", &url, peer, "trusted"])
        .contains("asyncua trusted after all ok"));
}
