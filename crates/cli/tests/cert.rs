//! `uascale cert` and `uascale user hash` on a PKI directory of their own.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::TempDir;

fn uascale(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args(args)
        .output()
        .expect("run uascale")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn temp(name: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("uascale-cert-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    TempDir(p)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// The thumbprint on the `thumbprint` line of `cert show`/`create` output.
fn thumbprint(out: &str) -> String {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("thumbprint"))
        .map(|t| t.trim().to_owned())
        .unwrap_or_else(|| panic!("no thumbprint in {out}"))
}

#[test]
fn create_list_trust_reject_show() {
    let server = temp("server");
    let client = temp("client");
    let pki = server.0.to_str().unwrap();
    let other = client.0.to_str().unwrap();

    let out = uascale(&[
        "cert",
        "create",
        "--pki",
        pki,
        "--uri",
        "urn:test:srv",
        "--host",
        "plant-7",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("uri         urn:test:srv"), "{t}");
    assert!(t.contains("plant-7"), "{t}");
    assert!(t.contains("key         Rsa 2048 bits"), "{t}");
    assert!(
        t.contains("digitalSignature, nonRepudiation, keyEncipherment, dataEncipherment"),
        "{t}"
    );
    for dir in [
        "own/certs",
        "own/private",
        "trusted/certs",
        "trusted/crl",
        "issuers/certs",
        "issuers/crl",
        "rejected/certs",
    ] {
        assert!(server.0.join(dir).is_dir(), "{dir}");
    }
    // Never replaced by accident.
    let again = uascale(&["cert", "create", "--pki", pki]);
    assert!(!again.status.success());
    assert!(text(&again).contains("--force"), "{}", text(&again));

    // A client's certificate, trusted from its file.
    let out = uascale(&[
        "cert",
        "create",
        "--pki",
        other,
        "--uri",
        "urn:test:cli",
        "--name",
        "client app",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let client_thumb = thumbprint(&text(&out));
    let client_cert = client.0.join("own/certs/cert.der");
    let out = uascale(&["cert", "trust", client_cert.to_str().unwrap(), "--pki", pki]);
    assert!(out.status.success(), "{}", text(&out));
    let trusted = files(&server.0.join("trusted/certs"));
    assert_eq!(trusted.len(), 1);
    assert_eq!(
        std::fs::read(&trusted[0]).unwrap(),
        std::fs::read(&client_cert).unwrap()
    );
    let list = text(&uascale(&["cert", "list", "--pki", pki]));
    assert!(
        list.contains(&client_thumb) && list.contains("urn:test:cli"),
        "{list}"
    );

    // Reject by thumbprint prefix: moves to rejected/certs.
    let out = uascale(&["cert", "reject", &client_thumb[..10], "--pki", pki]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(files(&server.0.join("trusted/certs")).is_empty());
    assert_eq!(files(&server.0.join("rejected/certs")).len(), 1);
    // ...and trust again from rejected/ by thumbprint: moves back.
    let out = uascale(&["cert", "trust", &client_thumb.to_lowercase(), "--pki", pki]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(files(&server.0.join("rejected/certs")).is_empty());
    assert_eq!(files(&server.0.join("trusted/certs")).len(), 1);

    // show, by thumbprint and by file.
    let shown = text(&uascale(&[
        "cert",
        "show",
        &client_thumb[..8],
        "--pki",
        pki,
    ]));
    assert!(shown.contains("CN=client app"), "{shown}");
    let shown = text(&uascale(&["cert", "show", client_cert.to_str().unwrap()]));
    assert_eq!(thumbprint(&shown), client_thumb);

    // Mistakes are explained.
    let out = uascale(&["cert", "reject", "nothex", "--pki", pki]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("neither a file nor a thumbprint"),
        "{}",
        text(&out)
    );
    let out = uascale(&["cert", "reject", "ABCDEF0123", "--pki", pki]);
    assert!(
        text(&out).contains("no certificate with thumbprint"),
        "{}",
        text(&out)
    );
    let out = uascale(&["cert", "frobnicate"]);
    assert!(!out.status.success());
}

#[test]
fn user_hash_reads_stdin() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args(["user", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap();
    assert!(
        hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
        "{hash}"
    );
    // The hash goes into [[users]] as is.
    let dir = temp("users");
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("users.toml");
    std::fs::write(
        &file,
        format!(
            "[[users]]\nname = \"op\"\npassword_hash = \"{}\"\n",
            hash.trim()
        ),
    )
    .unwrap();
    let out = uascale(&[
        "serve",
        "--config",
        file.to_str().unwrap(),
        "--print-config",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(hash.trim()));
}

#[test]
fn create_ecc_certificates_beside_the_rsa_one() {
    let dir = temp("ecc");
    let pki = dir.0.to_str().unwrap();
    for (key, kind, usage, signature) in [
        ("ec-p256", "Ec 256 bits", "keyAgreement", "Ecdsa(Sha256)"),
        ("ec-p384", "Ec 384 bits", "keyAgreement", "Ecdsa(Sha384)"),
        ("ed25519", "Ed25519 256 bits", "keyCertSign", "Ed25519"),
    ] {
        let out = uascale(&[
            "cert",
            "create",
            "--pki",
            pki,
            "--uri",
            "urn:test:ecc",
            "--key",
            key,
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let t = text(&out);
        assert!(t.contains(&format!("key         {kind}")), "{t}");
        assert!(t.contains(usage), "{t}");
        assert!(t.contains(&format!("signature   {signature}")), "{t}");
        assert!(!t.contains("keyEncipherment"), "{t}");
        assert!(dir.0.join(format!("own/certs/cert_{key}.der")).exists());
        assert!(dir.0.join(format!("own/private/key_{key}.pem")).exists());
        // Not twice without --force.
        let again = uascale(&["cert", "create", "--pki", pki, "--key", key]);
        assert!(!again.status.success());
    }
    // The RSA one is still its own file, and can be made beside them.
    assert!(!dir.0.join("own/certs/cert.der").exists());
    let out = uascale(&["cert", "create", "--pki", pki, "--uri", "urn:test:ecc"]);
    assert!(out.status.success(), "{}", text(&out));
    let bad = uascale(&["cert", "create", "--pki", pki, "--key", "dsa"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("ec-p256"), "{}", text(&bad));
}
