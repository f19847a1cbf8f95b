//! `cargo xtask ci`: everything CI checks, in one command that works on a
//! fresh machine with the Rust toolchain and Python 3.
//!
//! Steps, cheapest first: rustfmt, the references check (`refs.rs`),
//! clippy, codegen --check, the Python peers
//! in a venv under `target/venv` and the asyncua vectors check, each fuzz
//! target for a bounded time (as many at once as there are cores), then the
//! whole test suite last, its binaries a few at a time (`suite.rs`), so
//! that its summary closes the output.

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
    "https_request",
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

/// The rustc flags `cargo fuzz build --sanitizer none` (cargo-fuzz 0.13)
/// builds libFuzzer targets with: SanitizerCoverage's inline 8-bit
/// counters, PC table, compare tracing and stack depth, `--cfg fuzzing`,
/// no branch folding (finer coverage), one codegen unit (the sancov pass
/// otherwise blocks inlining across units). Building with them directly
/// spares CI compiling cargo-fuzz itself; `cargo fuzz run TARGET` still
/// works for longer local runs (docs/testing.md).
const FUZZ_RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg fuzzing",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Ccodegen-units=1",
];

/// `cargo <subcommand>` for clippy and the tests, which build into
/// `target/<host triple>/debug`: given `--target`, cargo keeps build scripts
/// and their dependencies apart from the checked and built code, so the
/// build script runs that clippy made (aws-lc's C library among them, 55 s
/// cold) are the ones the tests use. Without it, `cargo check` and `cargo
/// build` each compile their own `cc`, `libc`, ... for the build scripts,
/// and so run every build script again. Incremental compilation is off:
/// from nothing it is slower (the workspace's crates took 115 s for the
/// tests without it, 133 s with it). The price is paid by a developer who
/// runs `cargo xtask tests` again after an edit: the changed crates build
/// whole; plain `cargo test` keeps its incremental `target/debug`.
fn cargo_for_host(subcommand: &str, triple: &str) -> Command {
    let mut c = cargo();
    c.env("CARGO_INCREMENTAL", "0")
        .args([subcommand, "--target", triple]);
    c
}

/// The host's target triple (`rustc -vV`): the fuzz targets are built for
/// it explicitly, so that the coverage flags reach only the targets and not
/// build scripts or proc macros.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .ok_or_else(|| "rustc -vV printed no host triple".to_owned())
}

fn fuzz(root: &Path) -> Result<(), String> {
    let triple = host_triple()?;
    let target_dir = root.join("target/fuzz");
    // The flags need nightly's unstable options; the machine has one stable
    // toolchain, which accepts them with RUSTC_BOOTSTRAP.
    run(cargo()
        .current_dir(root)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", FUZZ_RUSTFLAGS.join(" "))
        .env("CARGO_TARGET_DIR", &target_dir)
        // aws-lc's C at -O0 for this build only: it was 135 s of the
        // build's 311 s, 65 s at -O0 (cold, `--timings`, 2 cores; 235 s
        // in all). Its hot paths are assembly either way; a 6 s run
        // exercises uascale's code, not aws-lc's. `cargo fuzz run` keeps
        // fuzz/Cargo.toml's release profile.
        .args([
            "--config",
            "profile.release.package.aws-lc-sys.opt-level=0",
            "build",
            "--release",
            "--bins",
            "--manifest-path",
            "fuzz/Cargo.toml",
        ])
        .args(["--target", &triple]))?;
    let secs = std::env::var("UASCALE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(FUZZ_SECONDS);
    let bins = target_dir.join(&triple).join("release");
    let mut queue = Vec::new();
    for target in FUZZ_TARGETS {
        let corpus = root.join("target/fuzz-corpus").join(target);
        let artifacts = root.join("fuzz/artifacts").join(target);
        for dir in [&corpus, &artifacts] {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut cmd = Command::new(bins.join(target));
        cmd.current_dir(root)
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(format!("-max_total_time={secs}"))
            .arg("-rss_limit_mb=2048")
            .arg("-print_final_stats=1")
            .arg(&corpus)
            .arg(root.join("fuzz/seeds").join(target));
        queue.push((format!("fuzz target {target}, {secs} s"), cmd));
    }
    // Each target runs on one core: as many at once as there are cores.
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let done = crate::suite::pool(queue, jobs, &root.join("target/fuzz-logs"))?;
    crate::suite::failures(&done)
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
/// root). A failure is reported, not fatal here: the tests that need a
/// package try once more and skip loudly; the tests step names every skip
/// in its summary and, under `CI=true`, fails because of them.
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
            "apt-get install -y {} failed (not root?): the cluster tests that need them will \
             skip{}",
            missing.join(" "),
            if crate::suite::skips_fail() {
                ", and under CI=true a skipped test fails the run"
            } else {
                " (counted as SKIPPED in the tests summary)"
            }
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
        let _s = Step::new("references");
        crate::refs::check(root)?;
    }
    {
        let _s = Step::new("clippy");
        run(cargo_for_host("clippy", &host_triple()?)
            .current_dir(root)
            .args([
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
        // Every crate under crates/.
        crate::modules::check(root, &[])?;
    }
    {
        let _s = Step::new("no tokio outside the server's shell");
        crate::shell::check(root)?;
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
        tests(root)?;
    }
    Ok(())
}

/// The tests step alone (`cargo xtask tests`): `cargo test --workspace
/// --all-features`, with the binaries run a few at a time (see `suite.rs`).
pub fn tests(root: &Path) -> Result<(), String> {
    let triple = host_triple()?;
    let test = || {
        let mut c = cargo_for_host("test", &triple);
        c.current_dir(root).args(["--workspace", "--all-features"]);
        c
    };
    crate::suite::run(root, test(), test())
}
