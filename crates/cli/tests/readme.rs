//! The README's tour works as written: its shell commands are taken from
//! README.md itself, not copied here, and run in an empty directory
//! against the `uascale` under test.
//!
//! Taken: the indented code blocks of "## A tour", the two-node cluster
//! among them (with real nats-server and HAProxy, installed when missing
//! as for the cluster suites), and the production configuration of
//! "## Security". Changed, so that the
//! test is bounded and runs beside others: `U=target/release/uascale`
//! becomes the binary under test; port 4840, the metrics port 9464 and
//! the HTTPS port 4843 become free ports; every server listens on 127.0.0.1 only; the storm
//! has 40 clients instead of 500. A line `$U serve ...` (not
//! `--print-config`) starts that server in the background, after stopping
//! the one before, and waits until it accepts connections. A line marked
//! `# refused` must fail; every other command must succeed.

mod common;
#[path = "../../server/tests/support/nats.rs"]
#[allow(dead_code)] // only the installer and the port helpers
mod nats;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, TempDir, BIN};

/// The indented code blocks of the README section starting with
/// `## {title}`, each as its lines (indentation removed).
fn blocks(readme: &str, title: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut inside = false;
    let mut open = false;
    for line in readme.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            inside = h.starts_with(title);
            open = false;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(code) = line.strip_prefix("    ") {
            if !open {
                out.push(Vec::new());
                open = true;
            }
            out.last_mut().unwrap().push(code.to_owned());
        } else if !line.trim().is_empty() {
            open = false;
        }
    }
    out
}

/// A block's commands, each line changed by `change` and a line ending in
/// `\\` joined with the next.
fn commands(block: &[String], change: impl Fn(&str) -> String) -> Vec<String> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in block {
        let line = change(line);
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(&line);
        lines.push(std::mem::take(&mut pending));
    }
    lines
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `args` (after `uascale`) in `dir` as a server on `port`, once it
/// accepts connections.
fn start(dir: &Path, args: &[String], port: u16) -> Server {
    let child = Command::new(BIN)
        .args(args)
        .args(["--bind", "127.0.0.1"])
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start uascale serve");
    listening(child, port, &format!("uascale {}", args.join(" ")))
}

/// `child` (running `what`) once `port` accepts connections (at most
/// 60 s); panics if it exits first.
fn listening(mut child: Child, port: u16, what: &str) -> Server {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("`{what}` exited: {status}");
        }
        assert!(Instant::now() < deadline, "`{what}` did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Server(child)
}

/// Runs a shell script in `dir` with `$U` the binary; its status.
fn sh(dir: &Path, script: &str) -> (bool, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("U", BIN)
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Runs the README's blocks in `dir`, with the substitutions of the module
/// comment; returns the server left running.
fn run_blocks(
    dir: &Path,
    blocks: &[Vec<String>],
    port: u16,
    metrics: u16,
    https: u16,
    mut server: Option<Server>,
) -> Option<Server> {
    for block in blocks {
        let lines = commands(block, |line| {
            line.replace("localhost:4840", &format!("localhost:{port}"))
                .replace("9464", &metrics.to_string())
                .replace("4843", &https.to_string())
                .replace("--clients 500", "--clients 40")
        });
        // Heredocs and the lines between servers run as one script.
        let mut script = String::new();
        let flush = |script: &mut String| {
            if script.trim().is_empty() {
                return;
            }
            let (ok, out) = sh(dir, script);
            assert!(ok, "README commands failed:\n{script}\n--- output:\n{out}");
            script.clear();
        };
        let mut in_heredoc: Option<String> = None;
        for line in lines {
            if let Some(end) = &in_heredoc {
                script.push_str(&line);
                script.push('\n');
                if line.trim() == end {
                    in_heredoc = None;
                }
                continue;
            }
            if line.starts_with("U=") {
                continue; // $U is the binary under test
            }
            if let Some(at) = line.find("<<") {
                let end = line[at + 2..].trim().trim_matches('\'').to_owned();
                in_heredoc = Some(end);
                script.push_str(&line);
                script.push('\n');
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() == Some(&"$U")
                && words.get(1) == Some(&"serve")
                && !line.contains("--print-config")
            {
                flush(&mut script);
                drop(server.take());
                let mut args: Vec<String> = words[1..].iter().map(|w| w.to_string()).collect();
                args.extend(["--port".to_owned(), port.to_string()]);
                server = Some(start(dir, &args, port));
                // A user types the next command seconds later: by then a
                // configured metrics endpoint listens too.
                let config = args
                    .iter()
                    .position(|a| a == "--config")
                    .and_then(|i| args.get(i + 1))
                    .and_then(|f| std::fs::read_to_string(dir.join(f)).ok())
                    .unwrap_or_default();
                let deadline = Instant::now() + Duration::from_secs(10);
                while config.contains(&metrics.to_string())
                    && std::net::TcpStream::connect(("127.0.0.1", metrics)).is_err()
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
            if line.contains("# refused") {
                flush(&mut script);
                let (ok, out) = sh(dir, &line);
                assert!(
                    !ok,
                    "README says this is refused, but it succeeded: {line}\n{out}"
                );
                continue;
            }
            script.push_str(&line);
            script.push('\n');
        }
        flush(&mut script);
    }
    server
}

#[test]
fn the_readme_tour_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let tour = blocks(&readme, "A tour");
    let cluster = tour
        .iter()
        .position(|b| b.iter().any(|l| l.contains("nats-server")))
        .expect("the tour has a cluster block");
    let tour = &tour[..cluster];
    assert!(tour.len() >= 4, "{tour:#?}");
    let dir = TempDir::new("readme-tour");
    let port = free_port();
    let metrics = free_port();
    let https = free_port();
    // The README's first command: the server, in the directory the tour
    // then runs in.
    let first = start(
        dir.as_ref(),
        &["serve".into(), "--port".into(), port.to_string()],
        port,
    );
    drop(run_blocks(
        dir.as_ref(),
        tour,
        port,
        metrics,
        https,
        Some(first),
    ));

    // The production configuration starts, with no None endpoint.
    let security = blocks(&readme, "Security");
    assert!(!security.is_empty());
    let dir = TempDir::new("readme-production");
    let server =
        run_blocks(dir.as_ref(), &security, port, metrics, https, None).expect("a server started");
    let (ok, out) = sh(
        dir.as_ref(),
        &format!("$U endpoints opc.tcp://localhost:{port}"),
    );
    // The endpoints are looked up over a channel that may only discover,
    // and none of them is unsecured.
    assert!(ok, "{out}");
    assert!(out.contains("Basic256Sha256"), "{out}");
    assert!(!out.contains("SecurityPolicy#None"), "{out}");
    drop(server);
}

/// Starts `line` (a README command, `$U` the binary under test) in `dir`
/// in the background, once `port` accepts connections.
fn background(dir: &Path, line: &str, port: u16) -> Server {
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("exec {line}"))
        .current_dir(dir)
        .env("U", BIN)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a README command");
    listening(child, port, line)
}

/// The README's two-node cluster as written, on free ports and with the
/// subscription bounded (`--count 3` for `--duration-s 60`, the nodes on
/// 127.0.0.1): nats-server, the first node alone (it creates the shared
/// certificate), the second, HAProxy with the README's configuration file
/// (its ports changed alike), and the subscription through the front end.
/// Then the first node is killed and a Read through the front end is
/// served by the second.
#[test]
fn the_readme_cluster_runs_as_written() {
    if nats::ensure_installed("nats-server", "nats-server").is_none()
        || nats::ensure_installed("haproxy", "haproxy").is_none()
    {
        return;
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let block = blocks(&readme, "A tour")
        .into_iter()
        .find(|b| b.iter().any(|l| l.contains("nats-server")))
        .expect("the tour has a cluster block");
    let dir = TempDir::new("readme-cluster");
    let dir: &Path = dir.as_ref();
    let (store, front, n1, n2) = (free_port(), free_port(), free_port(), free_port());
    let cfg = "docs/examples/haproxy-two-nodes.cfg";
    let haproxy = std::fs::read_to_string(format!("{root}/{cfg}"))
        .expect("the README's HAProxy configuration")
        .replace("127.0.0.1:4840", &format!("127.0.0.1:{front}"))
        .replace("127.0.0.1:4841", &format!("127.0.0.1:{n1}"))
        .replace("127.0.0.1:4842", &format!("127.0.0.1:{n2}"));
    std::fs::write(dir.join("haproxy.cfg"), haproxy).expect("haproxy.cfg");
    let lines = commands(&block, |line| {
        line.replace("127.0.0.1 -p 4222", &format!("127.0.0.1 -p {store}"))
            .replace("127.0.0.1:4222", &format!("127.0.0.1:{store}"))
            .replace("localhost:4840", &format!("localhost:{front}"))
            .replace("--port 4841", &format!("--port {n1} --bind 127.0.0.1"))
            .replace("--port 4842", &format!("--port {n2} --bind 127.0.0.1"))
            .replace("/tmp/uascale-nats", "nats-store")
            .replace(cfg, "haproxy.cfg")
            .replace("--duration-s 60", "--count 3")
    });
    let mut started = Vec::new();
    let mut subscribed = false;
    for line in &lines {
        let port = if line.starts_with("nats-server") {
            store
        } else if line.starts_with("haproxy") {
            front
        } else if line.contains(&format!("--port {n1} ")) {
            n1
        } else if line.contains(&format!("--port {n2} ")) {
            n2
        } else {
            let (ok, out) = sh(dir, line);
            assert!(ok, "README command failed: {line}\n{out}");
            subscribed |= line.contains("subscribe");
            continue;
        };
        started.push(background(dir, line, port));
    }
    assert_eq!(
        started.len(),
        4,
        "nats-server, two nodes, HAProxy: {lines:#?}"
    );
    assert!(subscribed, "the block subscribes: {lines:#?}");
    // kill -9 of the first node; HAProxy's check (every 300 ms) takes it
    // out and the second serves.
    let mut first = started.remove(1);
    first.0.kill().expect("kill the first node");
    let _ = first.0.wait();
    std::thread::sleep(Duration::from_secs(2));
    let (ok, out) = sh(dir, &format!("$U read opc.tcp://localhost:{front} i=2258"));
    assert!(ok, "a Read through the front end after the kill: {out}");
}

/// The block parser finds the blocks, so the test cannot pass by running
/// nothing.
#[test]
fn readme_blocks_are_found() {
    let text = "## A tour\n\ntext\n\n    one\n    two\n\nmore\n\n    three\n## Next\n\n    four\n";
    assert_eq!(
        blocks(text, "A tour"),
        vec![
            vec!["one".to_owned(), "two".to_owned()],
            vec!["three".to_owned()]
        ]
    );
}
