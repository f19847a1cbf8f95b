//! The tests step of `cargo xtask ci`: one `cargo test --no-run` builds every
//! test binary of the workspace, then the binaries run a few at a time.
//!
//! `cargo test` runs its binaries one after another. Most of ours spend
//! their time waiting (on Python peers starting, session timeouts, NATS
//! and HAProxy), so on a 2-core machine that left a core idle for most of
//! the step. Here each binary runs as cargo would run it (its package's
//! folder as the working directory, `CARGO_MANIFEST_DIR` set), its output
//! goes to `target/test-logs/` and is printed whole when it ends, so the
//! outputs do not interleave. Every binary runs even after a failure; the
//! step fails at the end, naming the binaries that failed. A test that
//! skipped because something it needs is missing (nats-server, HAProxy)
//! prints a [`SKIP_MARKER`] line; the summary counts and names them, and
//! under `CI=true` a skip fails the step. The fuzz step
//! runs its targets through the same [`pool`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Binaries that run at once unless `UASCALE_TEST_JOBS` says otherwise.
const JOBS: usize = 4;

/// A binary still running after this long is killed and counted failed.
const TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// The binaries that took longest (each 10 s or more on the CI machine),
/// slowest first: they start first, so that the step does not end waiting
/// on one long binary started last. A binary missing here only starts
/// later; a name here that no longer exists is ignored.
const SLOW_FIRST: &[&str] = &[
    "client tests/storm.rs",
    "client tests/interop_peers.rs",
    "cli tests/cluster_failover.rs",
    "cli tests/interop_ecc.rs",
    "cli tests/interop.rs",
    "client tests/chaos.rs",
    "cli tests/interop_security.rs",
    "server src/lib.rs",
    "server tests/isolation.rs",
    "server tests/cluster.rs",
    "client tests/against_uascale.rs",
];

/// The line a test prints (past the harness's capture) when it skipped
/// because something it needs is missing: `*** SKIPPED <test>: <reason>
/// ***` (see `crates/server/tests/support/nats.rs`).
pub const SKIP_MARKER: &str = "*** SKIPPED ";

/// The skip lines of a test binary's output: `<test>: <reason>` each.
pub fn skips(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.trim().strip_prefix(SKIP_MARKER))
        .map(|rest| rest.trim_end_matches('*').trim().to_owned())
        .collect()
}

/// Whether a skipped test fails the run: under CI (`CI` set to anything
/// but `false` or `0`, as CI services set it), where a missing package is
/// a broken machine, not a choice.
pub fn skips_fail() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// One test binary as `cargo test --no-run` reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct Binary {
    /// The crate folder's name and the target's source, e.g.
    /// `client tests/storm.rs`.
    pub name: String,
    /// The built executable.
    pub exe: PathBuf,
    /// The package's folder: the working directory cargo would use.
    pub dir: PathBuf,
}

/// Reads the test binaries out of cargo's JSON messages (one per line):
/// every `compiler-artifact` built with the test profile that has an
/// executable.
pub fn binaries_from_messages(json_lines: &str) -> Result<Vec<Binary>, String> {
    let mut out = Vec::new();
    for line in json_lines.lines().filter(|l| l.starts_with('{')) {
        let msg: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("cargo message {line:?}: {e}"))?;
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let manifest = msg["manifest_path"]
            .as_str()
            .ok_or_else(|| format!("compiler-artifact without manifest_path: {line}"))?;
        let dir = Path::new(manifest)
            .parent()
            .ok_or_else(|| format!("manifest_path {manifest:?} has no folder"))?
            .to_path_buf();
        let src = msg["target"]["src_path"].as_str().unwrap_or(exe);
        let src = Path::new(src).strip_prefix(&dir).unwrap_or(Path::new(src));
        let crate_dir = dir.file_name().unwrap_or_default().to_string_lossy();
        out.push(Binary {
            name: format!("{crate_dir} {}", src.display()),
            exe: PathBuf::from(exe),
            dir,
        });
    }
    Ok(out)
}

/// Puts the binaries of [`SLOW_FIRST`] first, in its order; the rest keep
/// cargo's order.
pub fn slow_first(mut bins: Vec<Binary>) -> Vec<Binary> {
    let rank = |b: &Binary| {
        SLOW_FIRST
            .iter()
            .position(|s| *s == b.name)
            .unwrap_or(SLOW_FIRST.len())
    };
    bins.sort_by_key(rank);
    bins
}

/// The counts of a test harness's `test result:` lines, summed.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests ignored.
    pub ignored: u64,
}

impl Counts {
    /// Sums every `test result: ok. 3 passed; 0 failed; 1 ignored; ...`
    /// line of `output`.
    pub fn parse(output: &str) -> Counts {
        let mut c = Counts::default();
        for line in output.lines() {
            let Some(rest) = line.trim().strip_prefix("test result: ") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => c.passed += n,
                    "failed" => c.failed += n,
                    "ignored" => c.ignored += n,
                    _ => {}
                }
            }
        }
        c
    }

    fn add(&mut self, o: Counts) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.ignored += o.ignored;
    }
}

struct Running {
    name: String,
    child: Child,
    log: PathBuf,
    started: Instant,
}

fn spawn(name: String, cmd: &mut Command, logs: &Path, n: usize) -> Result<Running, String> {
    let log = logs.join(format!("{n:02}.log"));
    let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(Running {
        name,
        child,
        log,
        started: Instant::now(),
    })
}

/// Builds the tests with `cargo_test` (a `cargo test ...` command to which
/// `--no-run --message-format=json-render-diagnostics` is added), runs
/// every binary and then `doc` (the doc tests), `jobs` at a time.
pub fn run(root: &Path, mut cargo_test: Command, mut doc: Command) -> Result<(), String> {
    let out = cargo_test
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo test --no-run: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo test --no-run failed with {}", out.status));
    }
    let bins = slow_first(binaries_from_messages(&String::from_utf8_lossy(
        &out.stdout,
    ))?);
    let jobs = std::env::var("UASCALE_TEST_JOBS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&j| j > 0)
        .unwrap_or(JOBS);
    let logs = root.join("target/test-logs");
    println!(
        "running {} test binaries and the doc tests, {jobs} at a time",
        bins.len()
    );

    let mut queue: Vec<(String, Command)> = bins
        .into_iter()
        .map(|b| {
            let mut cmd = Command::new(&b.exe);
            cmd.current_dir(&b.dir).env("CARGO_MANIFEST_DIR", &b.dir);
            (b.name, cmd)
        })
        .collect();
    doc.args(["--doc"]);
    queue.push(("doc tests".to_string(), doc));
    let started = Instant::now();
    let done = pool(queue, jobs, &logs)?;
    let total = done.iter().fold(Counts::default(), |mut t, d| {
        t.add(d.counts);
        t
    });
    let mut times: Vec<&Done> = done.iter().collect();
    times.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    let slowest: Vec<String> = times
        .iter()
        .take(5)
        .map(|d| format!("{} {:.1} s", d.name, d.secs))
        .collect();
    let skipped: Vec<&String> = done.iter().flat_map(|d| &d.skipped).collect();
    if !skipped.is_empty() {
        println!("\nskipped (something they need is missing):");
        for s in &skipped {
            println!("  {s}");
        }
    }
    let require = skips_fail();
    println!(
        "\nall tests: {} passed; {} failed; {} ignored; {} SKIPPED{}; {} binaries in {:.1} s, {jobs} at a time (slowest: {})",
        total.passed,
        total.failed,
        total.ignored,
        skipped.len(),
        match (skipped.is_empty(), require) {
            (true, _) => "",
            (false, true) => " (a failure under CI=true)",
            (false, false) => " (passed as skipped: not under CI=true)",
        },
        done.len(),
        started.elapsed().as_secs_f64(),
        slowest.join(", ")
    );
    failures(&done)?;
    if require && !skipped.is_empty() {
        return Err(format!(
            "{} tests skipped under CI=true, which requires every suite: {}",
            skipped.len(),
            skipped
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    Ok(())
}

/// One command [`pool`] ran.
pub struct Done {
    /// The name it was given.
    pub name: String,
    /// Seconds it ran.
    pub secs: f64,
    /// The test counts in its output.
    pub counts: Counts,
    /// Its tests that skipped (see [`skips`]).
    pub skipped: Vec<String>,
    /// If it failed (a non-zero exit, a failed test, or killed after
    /// [`TIMEOUT`]), its name as the failure is reported.
    pub failed: Option<String>,
}

/// `Ok` if none of `done` failed, else an error naming those that did.
pub fn failures(done: &[Done]) -> Result<(), String> {
    let failed: Vec<&str> = done.iter().filter_map(|d| d.failed.as_deref()).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

/// Runs every command of `queue` (in its order), `jobs` at a time, each
/// with its output in a file of `logs`, printed whole under a `--- name`
/// line when it ends. Every command runs, whatever the others did.
pub fn pool(
    mut queue: Vec<(String, Command)>,
    jobs: usize,
    logs: &Path,
) -> Result<Vec<Done>, String> {
    std::fs::create_dir_all(logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    queue.reverse();
    let mut running: Vec<Running> = Vec::new();
    let mut done = Vec::new();
    let mut n = 0;
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < jobs.max(1) {
            let Some((name, mut cmd)) = queue.pop() else {
                break;
            };
            n += 1;
            running.push(spawn(name, &mut cmd, logs, n)?);
        }
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            let timed_out = r.started.elapsed() > TIMEOUT;
            if timed_out {
                let _ = r.child.kill();
            }
            let status = match r.child.try_wait() {
                Ok(Some(s)) => s,
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Err(e) => return Err(format!("{}: {e}", r.name)),
            };
            let r = running.swap_remove(i);
            let secs = r.started.elapsed().as_secs_f64();
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            let counts = Counts::parse(&text);
            let skipped = skips(&text);
            println!("\n--- {} ({secs:.1} s, {status})", r.name);
            print!("{text}");
            let failed = if timed_out {
                Some(format!("{} (killed after {} s)", r.name, TIMEOUT.as_secs()))
            } else if !status.success() || counts.failed > 0 {
                Some(r.name.clone())
            } else {
                None
            };
            done.push(Done {
                name: r.name,
                secs,
                counts,
                skipped,
                failed,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_are_read_from_cargo_messages() {
        let lines = concat!(
            r#"{"reason":"compiler-artifact","package_id":"p","manifest_path":"/w/crates/client/Cargo.toml","target":{"kind":["test"],"name":"storm","src_path":"/w/crates/client/tests/storm.rs"},"profile":{"test":true},"executable":"/w/target/debug/deps/storm-1"}"#,
            "\n",
            // A library built for a test binary, not one itself.
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/cli/Cargo.toml","target":{"kind":["lib"],"name":"x","src_path":"/w/crates/cli/src/lib.rs"},"profile":{"test":false},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/server/Cargo.toml","target":{"kind":["lib"],"name":"uascale_server","src_path":"/w/crates/server/src/lib.rs"},"profile":{"test":true},"executable":"/w/target/debug/deps/uascale_server-2"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\n",
            "plain text is skipped\n",
        );
        let bins = binaries_from_messages(lines).unwrap();
        assert_eq!(
            bins,
            vec![
                Binary {
                    name: "client tests/storm.rs".into(),
                    exe: "/w/target/debug/deps/storm-1".into(),
                    dir: "/w/crates/client".into(),
                },
                Binary {
                    name: "server src/lib.rs".into(),
                    exe: "/w/target/debug/deps/uascale_server-2".into(),
                    dir: "/w/crates/server".into(),
                },
            ]
        );
        // Slow ones first: the server's unit tests are on the list, after
        // the storm test.
        let order: Vec<String> = slow_first(bins.into_iter().rev().collect())
            .into_iter()
            .map(|b| b.name)
            .collect();
        assert_eq!(order, ["client tests/storm.rs", "server src/lib.rs"]);
        assert!(binaries_from_messages("{not json").is_err());
    }

    #[test]
    fn counts_sum_every_result_line() {
        let out = "running 3 tests\n\
            test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.2s\n\
            test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
        assert_eq!(
            Counts::parse(out),
            Counts {
                passed: 4,
                failed: 2,
                ignored: 1
            }
        );
        assert_eq!(Counts::parse("no results"), Counts::default());
    }

    #[test]
    fn skip_lines_are_found() {
        let out = "running 2 tests\n\n\
            *** SKIPPED a_session_moves: nats-server is not installed and `apt-get install -y nats-server` failed (run as root, or install nats-server) ***\n\n\
            test a_session_moves ... ok\n";
        assert_eq!(
            skips(out),
            ["a_session_moves: nats-server is not installed and `apt-get install -y nats-server` \
              failed (run as root, or install nats-server)"]
        );
        assert!(skips("test x ... ok\nSKIPPED in prose\n").is_empty());
    }
}
