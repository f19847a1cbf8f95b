//! `cargo xtask ci`: everything CI checks, in one command that works on a
//! fresh machine with the Rust toolchain and Python 3.
//!
//! Steps, cheapest first: rustfmt, clippy, codegen --check, the Python peers
//! in a venv under `target/venv` and the asyncua vectors check, each fuzz
//! target for a bounded time, then the whole test suite last (so that the
//! test runner's summary closes the output).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Seconds each fuzz target runs in CI (override: `UASCALE_FUZZ_SECONDS`).
const FUZZ_SECONDS: u64 = 6;
const FUZZ_TARGETS: &[&str] = &[
    "decode_message",
    "nodeid_parse",
    "chunk_reassembly",
    "server_channel",
    "dispatch_request",
    "config_file",
    "nodeset_import",
    "client_connection",
    "secure_channel",
];

struct Step {
    name: &'static str,
    started: Instant,
}

impl Step {
    fn new(name: &'static str) -> Self {
        eprintln!("\n==> {name}");
        Step {
            name,
            started: Instant::now(),
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        eprintln!(
            "<== {} ({:.1}s)",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| format!("{shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Creates `target/venv` with the pinned Python peers (idempotent).
pub fn python_venv(root: &Path) -> Result<PathBuf, String> {
    let venv = root.join("target/venv");
    let python = venv.join("bin/python");
    let reqs = root.join("tests/requirements.txt");
    let stamp = venv.join(".uascale-requirements");
    let wanted = std::fs::read_to_string(&reqs).map_err(|e| format!("{}: {e}", reqs.display()))?;
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) && python.exists() {
        return Ok(python);
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&reqs))?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(python)
}

fn fuzz(root: &Path) -> Result<(), String> {
    let tools = root.join("target/tools");
    let cargo_fuzz = tools.join("bin/cargo-fuzz");
    if !cargo_fuzz.exists() {
        run(cargo()
            .args([
                "install",
                "cargo-fuzz",
                "--locked",
                "--version",
                "0.13.2",
                "--root",
            ])
            .arg(&tools))?;
    }
    let secs = std::env::var("UASCALE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(FUZZ_SECONDS);
    for target in FUZZ_TARGETS {
        let corpus = root.join("target/fuzz-corpus").join(target);
        std::fs::create_dir_all(&corpus).map_err(|e| format!("{}: {e}", corpus.display()))?;
        // cargo-fuzz needs nightly flags (sanitizer coverage); the machine has
        // one stable toolchain, which accepts them with RUSTC_BOOTSTRAP.
        run(Command::new(&cargo_fuzz)
            .current_dir(root)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", root.join("target/fuzz"))
            .args(["fuzz", "run", "--sanitizer", "none", target])
            .arg(&corpus)
            .arg(root.join("fuzz/seeds").join(target))
            .args([
                "--",
                &format!("-max_total_time={secs}"),
                "-rss_limit_mb=2048",
                "-print_final_stats=1",
            ]))?;
    }
    Ok(())
}

/// The Debian packages the tests start real processes of (the cluster
/// tests: nats-server, HAProxy), with the binary that tells each is there.
const SYSTEM_PACKAGES: [(&str, &str); 2] = [("nats-server", "nats-server"), ("haproxy", "haproxy")];

fn on_path(binary: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .any(|d| d.join(binary).is_file())
}

/// Installs the missing [`SYSTEM_PACKAGES`] with apt-get (CI runs as
/// root). A failure is reported, not fatal: the tests that need a package
/// try once more and skip loudly.
fn system_packages() {
    let missing: Vec<&str> = SYSTEM_PACKAGES
        .iter()
        .filter(|(binary, _)| !on_path(binary))
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return;
    }
    let _ = Command::new("apt-get").args(["update", "-q"]).status();
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "apt-get install -y {} failed: the tests that need them will skip",
            missing.join(" ")
        );
    }
}

/// Runs every CI step; stops at the first failure.
pub fn ci(root: &Path) -> Result<(), String> {
    {
        let _s = Step::new("system packages");
        system_packages();
    }
    {
        let _s = Step::new("rustfmt");
        run(cargo()
            .current_dir(root)
            .args(["fmt", "--all", "--", "--check"]))?;
    }
    {
        let _s = Step::new("clippy");
        run(cargo().current_dir(root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    {
        let _s = Step::new("module cycles");
        // The crates kept free of `use` cycles. Known and left: four in
        // uascale-types (the codec's core types and their generated tables
        // name each other) and one in the cli (a subcommand uses the
        // shared helpers of the module that dispatches to it).
        let strict: Vec<PathBuf> = ["server", "proto", "client", "crypto"]
            .iter()
            .map(|c| root.join("crates").join(c).join("src"))
            .collect();
        crate::modules::check(root, &strict)?;
    }
    {
        let _s = Step::new("codegen --check");
        crate::codegen::run(&crate::schema_dir(root), root, true)?;
    }
    {
        let _s = Step::new("asyncua byte vectors");
        let python = python_venv(root)?;
        run(Command::new(python)
            .current_dir(root)
            .arg("tests/vectors/gen_asyncua.py")
            .arg("--check"))?;
    }
    {
        let _s = Step::new("fuzz");
        fuzz(root)?;
    }
    {
        let _s = Step::new("tests");
        run(cargo()
            .current_dir(root)
            .args(["test", "--workspace", "--all-features"]))?;
    }
    Ok(())
}
