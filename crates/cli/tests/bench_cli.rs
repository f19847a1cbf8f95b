//! `uascale bench` at tiny sizes against `uascale serve`, so the load
//! generator cannot rot: the counts it reports must be right. (Its numbers
//! are for the README, measured by hand; nothing here times anything.)

mod common;

use std::process::{Command, Stdio};

use common::{serve, Served, TempDir, BIN};

/// `uascale serve --security none` with `extra_config` as its config file.
fn serve_none(extra_config: &str) -> Served {
    let dir = TempDir::new(&format!("bench-{}", common::free_port()));
    let config = dir.join("server.toml");
    std::fs::write(&config, extra_config).unwrap();
    let mut served = serve([
        "--security".as_ref(),
        "none".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ]);
    served.dir = Some(dir);
    served
}

/// Checks the `--report` page of a run: self-contained, with one plotted
/// point per sample of each series (`key` in `r["series"]`).
fn check_report(path: &std::path::Path, r: &serde_json::Value, keys: &[&str]) -> String {
    let html = std::fs::read_to_string(path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains("<svg"), "{html}");
    for external in [
        "http://", "https://", "<script", "<link", "src=", "@import", "url(",
    ] {
        assert!(!html.contains(external), "{external} in {html}");
    }
    let series = r["series"].as_array().unwrap();
    assert!(!series.is_empty(), "{r}");
    for key in keys {
        let samples = series.iter().filter(|p| !p[key].is_null()).count();
        assert!(samples > 0, "{key}: {r}");
        assert_eq!(
            html.matches(&format!("data-series=\"{key}\"")).count(),
            samples,
            "{key}"
        );
    }
    html
}

fn bench(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_read_counts_reads_values_and_server_cost() {
    let s = serve_none("");
    let url = s.url();
    let pid = s.pid();
    let report = std::env::temp_dir().join(format!("uascale-bench-read-{}.html", s.port));
    let r = bench(&[
        "read",
        &url,
        "--connections",
        "2",
        "--inflight",
        "4",
        "--values-per-read",
        "3",
        "--node",
        "i=2258",
        "--node",
        "ns=2;s=Demo.Dynamic.Counter",
        "--warmup-s",
        "0.2",
        "--duration-s",
        "0.5",
        "--server-pid",
        &pid,
        "--interval-s",
        "0.25",
        "--report",
        report.to_str().unwrap(),
    ]);
    let reads = r["reads"].as_u64().unwrap();
    assert!(r["started_utc"].as_str().unwrap().ends_with('Z'), "{r}");
    // On Linux the CPU is named (its model name from /proc/cpuinfo).
    assert!(r["cpu"].as_str().is_some_and(|c| !c.is_empty()), "{r}");
    // The series: a warm-up sample, then measured ones adding up to the
    // totals, each with latencies.
    let series = r["series"].as_array().unwrap();
    assert_eq!(series[0]["phase"], "warm-up", "{r}");
    let measured: Vec<_> = series.iter().filter(|p| p["phase"] == "measure").collect();
    // 0.5 s sampled every 0.25 s (one sample fewer if a sleep overran).
    assert!((1..=2).contains(&measured.len()), "{r}");
    assert_eq!(
        measured
            .iter()
            .map(|p| p["reads"].as_u64().unwrap())
            .sum::<u64>(),
        reads,
        "{r}"
    );
    assert!(
        measured
            .iter()
            .all(|p| p["server_cores_busy"].as_f64().is_some()),
        "{r}"
    );
    let html = check_report(
        &report,
        &r,
        &["reads_per_s", "latency_p50_ms", "latency_p99_ms"],
    );
    assert!(
        html.contains("ns=2;s=Demo.Dynamic.Counter"),
        "the command is on the page"
    );
    assert!(html.contains("server CPU"), "{html}");
    let _ = std::fs::remove_file(&report);
    assert!(reads > 0, "{r}");
    let values_per_s = r["values_per_s"].as_f64().unwrap();
    let reads_per_s = r["reads_per_s"].as_f64().unwrap();
    assert!((values_per_s / reads_per_s - 3.0).abs() < 0.01, "{r}");
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    assert!(r["server_cpu_us_per_read"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["server_rss_bytes"].as_u64().unwrap() > 0, "{r}");
    assert!(r["latency_ms"]["p50"].as_f64().unwrap() > 0.0, "{r}");

    // Unknown nodes are counted as errors by their status, by both clients.
    for client in ["pipeline", "library"] {
        let r = bench(&[
            "read",
            &url,
            "--client",
            client,
            "--connections",
            "1",
            "--inflight",
            "2",
            "--node",
            "ns=2;s=Missing",
            "--warmup-s",
            "0",
            "--duration-s",
            "0.3",
        ]);
        assert_eq!(r["client"], client, "{r}");
        assert!(r["reads"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(
            r["errors"]["BadNodeIdUnknown"].as_u64(),
            r["reads"].as_u64(),
            "{r}"
        );
    }
}

#[test]
fn bench_sessions_establishes_holds_and_reports_refusals() {
    // A channel limit above the session limit: the refusals to count are
    // BadTooManySessions.
    let s = serve_none("[server]\nmax_session_count = 12\n[admission]\nmax_channel_count = 100\n");
    let url = s.url();
    let pid = s.pid();
    let report = std::env::temp_dir().join(format!("uascale-bench-sessions-{}.html", s.port));
    let r = bench(&[
        "sessions",
        &url,
        "--sessions",
        "10",
        "--concurrency",
        "3",
        "--hold-s",
        "0.6",
        "--publishing-ms",
        "50",
        "--server-pid",
        &pid,
        "--report",
        report.to_str().unwrap(),
    ]);
    let last = r["series"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["established"], 10, "{r}");
    assert_eq!(last["failures"], 0, "{r}");
    check_report(&report, &r, &["established", "failures", "busy_answers"]);
    let _ = std::fs::remove_file(&report);
    assert_eq!(r["established"], 10, "{r}");
    assert_eq!(r["alive_after_hold"], 10, "{r}");
    assert_eq!(r["failures"], serde_json::json!({}), "{r}");
    assert!(r["server_bytes_per_session"].as_f64().is_some(), "{r}");
    assert!(r["server_bytes_per_session_held"].as_f64().is_some(), "{r}");
    // Each session's subscription got a data change while held.
    assert_eq!(r["subscribed"], true, "{r}");
    assert_eq!(r["notified"], 10, "{r}");
    assert_eq!(r["all_notified"], true, "{r}");
    // Over max_session_count: refused with BadTooManySessions, counted as
    // busy answers (no retries allowed here).
    let r = bench(&[
        "sessions",
        &url,
        "--sessions",
        "15",
        "--concurrency",
        "15",
        "--hold-s",
        "0",
        "--max-retries",
        "0",
        "--subscribe",
        "off",
    ]);
    assert_eq!(r["established"], 12, "{r}");
    assert_eq!(r["failures"]["BadTooManySessions"], 3, "{r}");
    let last = r["series"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            &last["established"],
            &last["failures"],
            &last["busy_answers"]
        ),
        (&12.into(), &3.into(), &3.into()),
        "{r}"
    );
    assert_eq!(r["busy_answers"], 3, "{r}");
    assert_eq!(r["retries"], 0, "{r}");
    assert_eq!(r["subscribed"], false, "{r}");
    assert_eq!(r["notified"], serde_json::Value::Null, "{r}");
}

#[test]
fn bench_sessions_with_a_secured_policy_and_a_user() {
    let dir = TempDir::new(&format!("bench-sec-{}", common::free_port()));
    let mut hasher = Command::new(BIN)
        .args(["user", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = hasher.stdin.take().unwrap();
        stdin.write_all(b"bench-pass\n").unwrap();
    }
    let hash = hasher.wait_with_output().unwrap();
    assert!(
        hash.status.success(),
        "{}",
        String::from_utf8_lossy(&hash.stderr)
    );
    let hash = String::from_utf8(hash.stdout).unwrap().trim().to_owned();
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[security]\ntrust_all_client_certificates = true\n\n[[users]]\nname = \"bench\"\npassword_hash = \"{hash}\"\n"
        ),
    )
    .unwrap();
    let s = serve([
        "--security".as_ref(),
        "all".as_ref(),
        "--pki".as_ref(),
        dir.join("server-pki").as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
    ]);
    let url = s.url();
    let out = Command::new(BIN)
        .arg("bench")
        .args([
            "sessions",
            &url,
            "--json",
            "--sessions",
            "4",
            "--concurrency",
            "2",
        ])
        .args(["--hold-s", "0.6", "--publishing-ms", "50"])
        .args([
            "--security",
            "Basic256Sha256:SignAndEncrypt",
            "--trust-server",
        ])
        .arg("--pki")
        .arg(dir.join("client-pki"))
        .args(["--user", "bench"])
        .env("UASCALE_PASSWORD", "bench-pass")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["security"], "Basic256Sha256:SignAndEncrypt", "{r}");
    assert_eq!(r["established"], 4, "{r}");
    assert_eq!(r["all_notified"], true, "{r}");
    // A wrong password: every session refused, by status, and not retried
    // (with the default --max-retries): it would fail the same way again.
    let out = Command::new(BIN)
        .arg("bench")
        .args(["sessions", &url, "--json", "--sessions", "2"])
        .args(["--hold-s", "0", "--security", "b256:Sign", "--trust-server"])
        .arg("--pki")
        .arg(dir.join("client-pki"))
        .args(["--user", "bench", "--password", "wrong"])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["established"], 0, "{r}");
    assert_eq!(r["failures"]["BadUserAccessDenied"], 2, "{r}");
    assert_eq!(r["retries"], 0, "{r}");
    drop(s);
}

/// `bench fairness` against a server whose four workers serve the slow
/// folder: the flooder's window overflows its lane (busy answers, counted
/// as such), the victim's one-at-a-time Reads are all served, and the
/// counts add up (nothing timed).
#[test]
fn bench_fairness_reports_the_flood_and_the_victim() {
    let s = serve_none(
        "[requests]\nmin_request_thread_count = 4\nmax_request_thread_count = 4\n\
         isolation_profile = \"balanced\"\n",
    );
    let url = s.url();
    let pid = s.pid();
    let r = bench(&[
        "fairness",
        &url,
        "--flood-inflight",
        "200",
        "--warmup-s",
        "0.3",
        "--duration-s",
        "1",
        "--server-pid",
        &pid,
    ]);
    assert_eq!(r["bench"], "fairness", "{r}");
    let flood = &r["flood"];
    let victim = &r["victim"];
    assert!(flood["reads"].as_u64().unwrap() > 0, "{r}");
    assert!(
        flood["busy_answers"].as_u64().unwrap() > 0,
        "200 in flight overflow a lane of 64: {r}"
    );
    assert_eq!(
        flood["errors"]["BadServerTooBusy"].as_u64(),
        flood["busy_answers"].as_u64(),
        "{r}"
    );
    assert!(victim["reads"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(victim["busy_answers"], 0, "{r}");
    assert!(victim["errors"].as_object().unwrap().is_empty(), "{r}");
    assert!(r["server"]["rss_bytes"].as_u64().unwrap() > 0, "{r}");
}

/// `bench floor`: its echo server answers every message, and the client
/// counts the round trips of its sockets (a tiny run; nothing timed).
#[test]
fn bench_floor_counts_round_trips_against_its_echo_server() {
    let port = common::free_port();
    let mut server = Command::new(BIN)
        .args(["bench", "floor", "serve", "--port", &port.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The listener is up once a connection succeeds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the echo server never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = server.id().to_string();
    let r = bench(&[
        "floor",
        &format!("127.0.0.1:{port}"),
        "--sockets",
        "20",
        "--interval-ms",
        "50",
        "--warmup-s",
        "0.2",
        "--duration-s",
        "1",
        "--server-pid",
        &pid,
    ]);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(r["bench"], "floor", "{r}");
    // 20 sockets x 20 per second for 1 s: about 400; a loaded machine
    // delays ticks (they are not made up), so only a floor is asserted.
    let trips = r["round_trips"].as_u64().unwrap();
    assert!((50..=420).contains(&trips), "{r}");
    assert!(
        r["server"]["us_per_round_trip"].as_f64().unwrap() > 0.0,
        "{r}"
    );
}

#[test]
fn bench_sessions_subscribes_after_establishing() {
    let s = serve_none("[server]\nmax_session_count = 12\n[admission]\nmax_channel_count = 100\n");
    let url = s.url();
    let pid = s.pid();
    // Ten sessions established bare, then subscribed: all notified, and
    // the server's CPU given for the two phases apart.
    let r = bench(&[
        "sessions",
        &url,
        "--sessions",
        "10",
        "--concurrency",
        "3",
        "--subscribe",
        "after",
        "--hold-s",
        "0.6",
        "--publishing-ms",
        "50",
        "--server-pid",
        &pid,
    ]);
    assert_eq!(r["established"], 10, "{r}");
    assert_eq!(r["subscribed"], true, "{r}");
    assert_eq!(r["subscribe_after"], true, "{r}");
    assert_eq!(r["notified"], 10, "{r}");
    assert_eq!(r["alive_after_hold"], 10, "{r}");
    assert_eq!(r["failures"], serde_json::json!({}), "{r}");
    assert!(r["subscribe_s"].as_f64().unwrap() > 0.0, "{r}");
    let est = r["establishment_ms_per_session_before_subscribing"]
        .as_f64()
        .unwrap();
    let sub = r["subscription_ms_per_session"].as_f64().unwrap();
    assert!(est > 0.0 && sub > 0.0, "{r}");
    // The two phases add up to the server's CPU up to the hold.
    let all = r["server_cpu_ms_per_session"].as_f64().unwrap();
    assert!((est + sub - all).abs() < 1e-6, "{r}");
    // No publish load to take out of a ramp that had none.
    assert_eq!(
        r["establishment_ms_per_session_publish_subtracted"],
        serde_json::Value::Null,
        "{r}"
    );
    // Not with worker processes; and only on, off or after.
    for (args, says) in [
        (
            vec!["--subscribe", "after", "--processes", "2"],
            "--subscribe after works with one bench process",
        ),
        (
            vec!["--subscribe", "later"],
            "--subscribe \"later\": give on, off or after",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["bench", "sessions", &url, "--sessions", "2"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn bench_sessions_spreads_its_clients_over_processes() {
    let s = serve_none("[server]\nmax_session_count = 12\n[admission]\nmax_channel_count = 100\n");
    let url = s.url();
    let pid = s.pid();
    // Ten subscribed sessions over three worker processes: all established,
    // held, notified and alive, as one process would report them.
    let r = bench(&[
        "sessions",
        &url,
        "--sessions",
        "10",
        "--concurrency",
        "3",
        "--processes",
        "3",
        "--hold-s",
        "0.6",
        "--publishing-ms",
        "50",
        "--server-pid",
        &pid,
    ]);
    assert_eq!(r["processes"], 3, "{r}");
    assert_eq!(r["established"], 10, "{r}");
    assert_eq!(r["alive_after_hold"], 10, "{r}");
    assert_eq!(r["notified"], 10, "{r}");
    assert_eq!(r["failures"], serde_json::json!({}), "{r}");
    let last = r["series"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["established"], 10, "{r}");
    assert!(r["server_cpu_ms_per_session"].as_f64().is_some(), "{r}");
    // Refusals counted in the children add up in the parent.
    let r = bench(&[
        "sessions",
        &url,
        "--sessions",
        "15",
        "--concurrency",
        "15",
        "--processes",
        "2",
        "--hold-s",
        "0",
        "--max-retries",
        "0",
        "--subscribe",
        "off",
    ]);
    assert_eq!(r["established"], 12, "{r}");
    assert_eq!(r["failures"]["BadTooManySessions"], 3, "{r}");
    assert_eq!(r["busy_answers"], 3, "{r}");
    // More processes than sessions is a usage error.
    let out = Command::new(BIN)
        .args([
            "bench",
            "sessions",
            &url,
            "--sessions",
            "2",
            "--processes",
            "3",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--processes must be 1 to --sessions (2)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
