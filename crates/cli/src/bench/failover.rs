//! `bench failover`: S sessions, each with a subscription on a changing
//! value, through a cluster's front end (docs/cluster.md); after
//! `--kill-after-s` the node `--kill-pid` is killed (SIGKILL) and the
//! clients carry on through the others. Reports how many sessions moved,
//! the time from the kill to each moved session's first new notification
//! (p50/p99/max), the notifications lost (gaps Republish could not fill)
//! and duplicated (a sequence number twice), and the steady lateness of
//! notifications before the kill - run once against a cluster node and
//! once against a node without `--cluster` to compare the publish latency
//! with mirroring on and off.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use uascale_client::{
    Client, ClientOptions, ConnectGate, MonitorItem, Notification, Restore, SubscriptionEvent,
    SubscriptionSettings,
};
use uascale_types::NodeId;

use super::series::{lateness_histogram, lateness_us};
use super::{Args, Outcome};

/// The options `bench failover` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--sessions",
    "--node",
    "--interval-ms",
    "--concurrency",
    "--kill-pid",
    "--kill-after-s",
    "--duration-s",
];

/// What one session saw.
#[derive(Default)]
struct Log {
    seen: HashSet<u32>,
    duplicates: u64,
    lost: u64,
    restored: Option<Restore>,
    /// When its first notification after the kill arrived.
    resumed: Option<Instant>,
    ended: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `bench failover`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    let sessions: usize = a.num("--sessions", 50)?;
    let interval_ms: f64 = a.num("--interval-ms", 500.0)?;
    let concurrency: usize = a.num("--concurrency", 20)?;
    let kill_after = a.seconds("--kill-after-s", 5.0)?;
    let duration = a.seconds("--duration-s", 15.0)?;
    let pid: Option<u32> = a
        .last("--kill-pid")
        .map(|v| {
            v.parse()
                .map_err(|_| format!("--kill-pid {v:?} is not a process id"))
        })
        .transpose()?;
    let node: NodeId = a
        .last("--node")
        .unwrap_or("i=2258")
        .parse()
        .map_err(|e| format!("--node: {e}"))?;
    if sessions == 0 || concurrency == 0 || duration.is_zero() {
        return Err("--sessions, --concurrency and --duration-s must be > 0".into());
    }
    let interval = Duration::try_from_secs_f64(interval_ms / 1000.0)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--interval-ms {interval_ms} is not a positive duration"))?;

    let killed: Arc<OnceLock<Instant>> = Arc::default();
    let steady = Arc::new(Mutex::new(lateness_histogram()));
    let gate = ConnectGate::new(concurrency);
    let mut clients = Vec::with_capacity(sessions);
    let mut logs = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let options = ClientOptions {
            connect_gate: Some(gate.clone()),
            ..Default::default()
        };
        let client = Client::connect(&a.url, options)
            .await
            .map_err(|e| format!("session {i}: connect: {e}"))?;
        client
            .create_session(&format!("failover-{i}"))
            .await
            .map_err(|e| format!("session {i}: {e}"))?;
        let mut sub = client
            .subscribe(SubscriptionSettings::with_interval(interval))
            .await
            .map_err(|e| format!("session {i}: subscribe: {e}"))?;
        sub.monitor(vec![MonitorItem::value(node.clone())])
            .await
            .map_err(|e| format!("session {i}: monitor: {e}"))?;
        let log = Arc::new(Mutex::new(Log::default()));
        let (l, k, h) = (Arc::clone(&log), Arc::clone(&killed), Arc::clone(&steady));
        tokio::spawn(async move {
            while let Some(e) = sub.recv().await {
                let Ok(mut log) = l.lock() else { return };
                match e {
                    SubscriptionEvent::Notifications {
                        sequence_number,
                        notifications,
                        ..
                    } => {
                        if !log.seen.insert(sequence_number) {
                            log.duplicates += 1;
                        }
                        let now = Instant::now();
                        match k.get() {
                            Some(at) if now > *at => {
                                log.resumed.get_or_insert(now);
                            }
                            _ => {
                                if let Ok(mut h) = h.lock() {
                                    for n in &notifications {
                                        if let Notification::DataChange { value, .. } = n {
                                            if let Some(t) =
                                                value.source_timestamp.or(value.server_timestamp)
                                            {
                                                let _ = h.record(lateness_us(t).max(1));
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    SubscriptionEvent::Lost { count, .. } => log.lost += u64::from(count),
                    SubscriptionEvent::Restored(how) => log.restored = Some(how),
                    SubscriptionEvent::Ended(_) => log.ended = true,
                    SubscriptionEvent::KeepAlive { .. } => {}
                }
            }
        });
        clients.push(client);
        logs.push(log);
    }
    eprintln!("{sessions} sessions subscribed; the kill in {kill_after:?}");
    tokio::time::sleep(kill_after).await;
    if let Some(pid) = pid {
        let _ = killed.set(Instant::now());
        let status = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .map_err(|e| format!("kill -9 {pid}: {e}"))?;
        if !status.success() {
            return Err(format!("kill -9 {pid}: {status}"));
        }
        eprintln!("killed {pid}; watching for {duration:?}");
    }
    tokio::time::sleep(duration).await;

    let at = killed.get().copied();
    let (mut moved, mut lost, mut duplicates, mut ended, mut silent) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut resume = Vec::new();
    for log in &logs {
        let Ok(log) = log.lock() else { continue };
        lost += log.lost;
        duplicates += log.duplicates;
        ended += u64::from(log.ended);
        if log.restored.is_some() {
            moved += 1;
            match (log.resumed, at) {
                (Some(r), Some(at)) => resume.push(r.saturating_duration_since(at)),
                _ => silent += 1,
            }
        }
    }
    resume.sort();
    // Closed after counting: a close ends the subscriptions.
    for c in &clients {
        c.close().await;
    }
    let h: Histogram<u64> = steady
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|_| lateness_histogram());
    let q = |p: f64| (!h.is_empty()).then(|| h.value_at_quantile(p) as f64 / 1000.0);
    let (p50, p99, max) = (
        percentile(&resume, 0.5),
        percentile(&resume, 0.99),
        resume.last().copied().unwrap_or_default(),
    );
    let fmt_ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"));
    let rows = vec![
        ("sessions".to_owned(), sessions.to_string()),
        (
            "killed".to_owned(),
            pid.map_or_else(
                || "none".to_owned(),
                |p| format!("PID {p} after {kill_after:?}"),
            ),
        ),
        ("sessions moved".to_owned(), moved.to_string()),
        (
            "time to resume".to_owned(),
            format!(
                "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                ms(p50),
                ms(p99),
                ms(max)
            ),
        ),
        ("moved, not resumed".to_owned(), silent.to_string()),
        ("notifications lost".to_owned(), lost.to_string()),
        ("duplicates".to_owned(), duplicates.to_string()),
        ("subscriptions ended".to_owned(), ended.to_string()),
        (
            "steady lateness before the kill".to_owned(),
            format!("p50 {}, p99 {}", fmt_ms(q(0.5)), fmt_ms(q(0.99))),
        ),
    ];
    Ok(Outcome {
        title: format!("uascale bench failover {}", a.url),
        rows,
        json: json!({
            "bench": "failover",
            "url": a.url,
            "sessions": sessions,
            "killed_pid": pid,
            "moved": moved,
            "resume_ms": { "p50": ms(p50), "p99": ms(p99), "max": ms(max) },
            "moved_not_resumed": silent,
            "lost": lost,
            "duplicates": duplicates,
            "ended": ended,
            "steady_lateness_ms": { "p50": q(0.5), "p99": q(0.99) },
        }),
        charts: Vec::new(),
    })
}
