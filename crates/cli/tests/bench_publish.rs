//! `uascale bench publish` at a tiny size against `uascale serve`: the
//! counts it reports must be right (nothing here times anything).

mod common;

use std::process::Command;

use common::{serve, TempDir, BIN};

#[test]
fn bench_publish_counts_what_arrives() {
    let server = serve(["--security", "none", "--nodes", "20", "--rate-ms", "50"]);
    let url = server.url();
    let pid = server.pid();
    let dir = TempDir::new("publish");
    let report = dir.join("report.html");
    let out = Command::new(BIN)
        .args(["bench", "publish", &url, "--json"])
        .args(["--sessions", "3", "--subscriptions", "2", "--items", "4"])
        .args(["--load-nodes", "20", "--interval-ms", "50"])
        .args([
            "--warmup-s",
            "0.5",
            "--duration-s",
            "1.5",
            "--concurrency",
            "2",
        ])
        .args(["--server-pid", &pid, "--interval-s", "0.25"])
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["bench"], "publish");
    assert_eq!(r["established"], 3, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    assert_eq!(r["failures"], serde_json::json!({}), "{r}");
    assert_eq!(r["lost_messages"], 0, "{r}");
    // 24 items on nodes that change every 50 ms: at most 20 changes per
    // second each (twice that bounds the measuring window's edges).
    let n = r["notifications"].as_u64().unwrap();
    let secs = r["duration_s"].as_f64().unwrap();
    assert!(n > 0, "{r}");
    assert!((n as f64) <= 2.0 * 24.0 * 20.0 * secs, "{r}");
    assert!(r["lateness_ms"]["p50"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["server"]["cpu_us_per_notification"].as_f64().unwrap() > 0.0,
        "{r}"
    );

    // Without a server: a failure per session, reported, not a hang.
    drop(server);
    let out = Command::new(BIN)
        .args([
            "bench",
            "publish",
            &url,
            "--json",
            "--sessions",
            "2",
            "--max-retries",
            "0",
        ])
        .args(["--warmup-s", "0", "--duration-s", "0.2"])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["established"], 0, "{r}");
    assert_eq!(r["failed"], 2, "{r}");
}
