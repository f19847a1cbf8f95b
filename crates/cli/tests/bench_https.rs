//! `uascale bench` against an opc.https listener at tiny sizes: `bench
//! read` (which picks the library client for the URL), `bench sessions`,
//! `bench publish` and `bench storm` succeed over it and count what they
//! did; the benches that take opc.tcp only refuse the URL, saying why.
//! Nothing here times anything.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, serve, Served, TempDir, BIN};
use serde_json::Value;

/// `uascale serve --security none` with HTTPS on a free loopback port (its
/// TLS certificate the application certificate of a PKI in a temporary
/// directory), once that port accepts connections; the served process and
/// the `opc.https://` URL.
fn serve_https() -> (Served, String) {
    let dir = TempDir::new(&format!("bench-https-{}", free_port()));
    let https = free_port();
    let mut served = serve([
        "--security".as_ref(),
        "none".as_ref(),
        "--pki".as_ref(),
        dir.join("pki").as_os_str(),
        "--https".as_ref(),
        format!("127.0.0.1:{https}").as_ref(),
    ]);
    served.dir = Some(dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", https)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the HTTPS listener did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (served, format!("opc.https://127.0.0.1:{https}/"))
}

/// Runs `uascale bench ARGS --json`: its JSON, or its stderr on failure.
fn bench(args: &[&str]) -> Result<Value, String> {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run uascale");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("JSON"))
}

fn ok(args: &[&str]) -> Value {
    bench(args).unwrap_or_else(|e| panic!("bench {args:?} failed: {e}"))
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

#[test]
fn the_benches_run_over_opc_https() {
    let (_served, url) = serve_https();

    // bench read: the library client, chosen by the URL.
    let r = ok(&[
        "read",
        &url,
        "--connections",
        "2",
        "--inflight",
        "2",
        "--warmup-s",
        "0",
        "--duration-s",
        "0.5",
        "--trust-server",
    ]);
    assert_eq!(r["client"], "library", "{r}");
    assert!(count(&r["reads"]) > 0, "{r}");
    // At full speed a session may pass its bucket (`[https]
    // session_rate`): busy answers are the only errors.
    let errors = r["errors"].as_object().expect("errors by status");
    assert!(
        errors.keys().all(|status| status == "BadServerTooBusy"),
        "{r}"
    );
    // The pipelined client is refused for it, by name.
    let refused = bench(&["read", &url, "--client", "pipeline", "--trust-server"])
        .expect_err("--client pipeline over opc.https");
    assert!(refused.contains("opc.tcp only"), "{refused}");

    // bench sessions: each session subscribed, held, closed.
    let r = ok(&[
        "sessions",
        &url,
        "--sessions",
        "3",
        "--concurrency",
        "2",
        "--hold-s",
        "0.5",
        "--publishing-ms",
        "100",
        "--trust-server",
    ]);
    assert_eq!(r["established"], 3, "{r}");
    assert_eq!(r["alive_after_hold"], 3, "{r}");
    assert_eq!(r["failures"], serde_json::json!({}), "{r}");

    // bench publish: notifications counted, the on-time ones among those
    // judged.
    let r = ok(&[
        "publish",
        &url,
        "--sessions",
        "2",
        "--items",
        "2",
        "--interval-ms",
        "100",
        "--warmup-s",
        "0.2",
        "--duration-s",
        "1",
        "--trust-server",
    ]);
    assert_eq!(r["established"], 2, "{r}");
    assert!(count(&r["notifications"]) > 0, "{r}");
    let on_time = &r["on_time"];
    assert_eq!(on_time["within_ms"].as_f64(), Some(110.0), "{r}");
    assert!(count(&on_time["count"]) <= count(&on_time["judged"]), "{r}");
    assert!(count(&on_time["judged"]) > 0, "{r}");

    // bench storm: its options built for the URL, every client
    // established.
    let r = ok(&[
        "storm",
        &url,
        "--clients",
        "3",
        "--behaviour",
        "cooperative",
        "--duration-s",
        "3",
        "--before-s",
        "0",
        "--after-s",
        "0",
        "--trust-server",
    ]);
    assert_eq!(count(&r["established"]), 3, "{r}");
}

/// The benches that take opc.tcp only refuse an opc.https URL before
/// connecting, saying why; `bench floor` takes HOST:PORT, no URL.
#[test]
fn the_tcp_only_benches_refuse_an_https_url() {
    let url = "opc.https://127.0.0.1:1/";
    for kind in ["fairness", "rogue", "failover"] {
        let e = bench(&[kind, url]).expect_err("refused");
        assert!(
            e.contains(&format!("bench {kind} takes opc.tcp URLs only")),
            "{kind}: {e}"
        );
    }
    let e = bench(&["floor", url]).expect_err("refused");
    assert!(e.contains("HOST:PORT"), "{e}");
}
