//! `bench failover`: S sessions, each with a subscription on a changing
//! value, through a cluster's front end (docs/cluster.md); after
//! `--kill-after-s` the node `--kill-pid` is killed (SIGKILL; with
//! `--drain` it gets SIGTERM and drains) and the clients carry on through
//! the others. Reports how many sessions moved, the time from the kill to
//! each moved session's first new notification (p50/p99/max), each moved
//! session's notification gap (its last notification before the kill to
//! its first after, p50/p99/max), the notifications lost (gaps Republish
//! could not fill) and duplicated (a sequence number twice), the sessions
//! recreated instead of reactivated, and between the end of the
//! setup and the kill the lateness of values (arrival minus source
//! timestamp) and the delay of messages (arrival minus publish time) - run
//! once against a cluster node and
//! once against a node without `--cluster` to compare the publish latency
//! with mirroring on and off.
//!
//! The sessions are set up concurrently (at most `--concurrency` opening
//! at once, through the client's connect gate, which also paces their
//! reconnects after the kill), each with [`Client::open`] - retried with
//! the §7 backoff - and the security and identity options of `bench
//! sessions` (`--security POLICY[:MODE]`, `--pki`, `--trust-server`,
//! `--user`/`--cert`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use uascale_client::{
    Client, ClientError, ClientOptions, ConnectGate, ConnectReport, MonitorItem, Notification,
    Restore, Subscription, SubscriptionEvent,
};
use uascale_types::NodeId;

use super::common::client_options;
use super::progress::Progress;
use super::series::{lateness_histogram, lateness_us};
use super::{count_status, list_counts, named, source_ips, Args, Outcome, StatusCounts};

/// The options `bench failover` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--sessions",
    "--node",
    "--interval-ms",
    "--concurrency",
    "--source-ips",
    "--kill-pid",
    "--drain",
    "--kill-after-s",
    "--duration-s",
    "--security",
    "--pki",
    "--trust-server",
    "--user",
    "--password",
    "--cert",
    "--key",
];

/// The time within which a moved session must resume to count in
/// `resumed_within_5s` (the bound).
const RESUME_BOUND: Duration = Duration::from_secs(5);

/// What one session saw.
#[derive(Default)]
struct Log {
    seen: HashSet<u32>,
    duplicates: u64,
    lost: u64,
    restored: Option<Restore>,
    /// When its first notification after the kill arrived.
    resumed: Option<Instant>,
    /// When its last notification before the kill arrived.
    last_before: Option<Instant>,
    ended: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One session through the front end: opened (retried with the §7
/// backoff), with a subscription publishing every `interval` and one item
/// on `node`.
async fn establish(
    url: &str,
    options: ClientOptions,
    i: usize,
    node: NodeId,
    interval: Duration,
) -> Result<(Client, Subscription), ClientError> {
    let client = Client::open(
        url,
        options,
        &format!("failover-{i}"),
        &mut ConnectReport::default(),
    )
    .await?;
    let subscribed = super::subscribe_one(&client, interval, MonitorItem::value(node)).await;
    match subscribed {
        Ok(sub) => Ok((client, sub)),
        Err(e) => {
            client.close().await;
            Err(e)
        }
    }
}

/// What the steady state measured: each value's lateness (arrival minus
/// its source timestamp: includes up to a sampling interval of age) and
/// each message's delay (arrival minus its publish time: the server's
/// publish path and the network only - the figure to compare with
/// mirroring on and off).
struct Steady {
    lateness: Histogram<u64>,
    delay: Histogram<u64>,
}

impl Steady {
    fn new() -> Self {
        Steady {
            lateness: lateness_histogram(),
            delay: lateness_histogram(),
        }
    }
}

/// When the steady state began (all sessions set up) and when the node
/// was killed.
#[derive(Default)]
struct Window {
    steady: OnceLock<Instant>,
    killed: OnceLock<Instant>,
}

/// Logs what `sub` delivers: sequence numbers (duplicates), losses, the
/// restore, the first notification after the kill, and between the end of
/// the setup and the kill each value's lateness and each message's delay
/// into `steady`.
fn watch(
    mut sub: Subscription,
    window: Arc<Window>,
    steady: Arc<Mutex<Steady>>,
) -> Arc<Mutex<Log>> {
    let log = Arc::new(Mutex::new(Log::default()));
    let l = Arc::clone(&log);
    tokio::spawn(async move {
        while let Some(e) = sub.recv().await {
            let Ok(mut log) = l.lock() else { return };
            match e {
                SubscriptionEvent::Notifications {
                    sequence_number,
                    notifications,
                    publish_time,
                    ..
                } => {
                    if !log.seen.insert(sequence_number) {
                        log.duplicates += 1;
                    }
                    let now = Instant::now();
                    if window.killed.get().is_none_or(|at| now <= *at) {
                        log.last_before = Some(now);
                    }
                    match (window.killed.get(), window.steady.get()) {
                        (Some(at), _) if now > *at => {
                            log.resumed.get_or_insert(now);
                        }
                        (_, Some(from)) if now >= *from => {
                            if let Ok(mut h) = steady.lock() {
                                let _ = h.delay.record(lateness_us(publish_time).max(1));
                                for n in &notifications {
                                    if let Notification::DataChange { value, .. } = n {
                                        if let Some(t) =
                                            value.source_timestamp.or(value.server_timestamp)
                                        {
                                            let _ = h.lateness.record(lateness_us(t).max(1));
                                        }
                                    }
                                }
                            }
                        }
                        // Still setting up the others: not steady yet.
                        _ => {}
                    }
                }
                SubscriptionEvent::Lost { count, .. } => log.lost += u64::from(count),
                SubscriptionEvent::Restored(how) => log.restored = Some(how),
                SubscriptionEvent::Ended(_) => log.ended = true,
                SubscriptionEvent::KeepAlive { .. } => {}
            }
        }
    });
    log
}

/// The share of `part` in `whole`, in percent (100 when `whole` is 0: none
/// had to resume).
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Runs `bench failover`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    super::common::tcp_only(
        a,
        "sessions moving between cluster nodes are built and tested over \
         opc.tcp only (the opc.https listener reads no PROXY protocol header \
         from a front end)",
    )?;
    let sessions: usize = a.num("--sessions", 50)?;
    let interval_ms: f64 = a.num("--interval-ms", 500.0)?;
    let concurrency: usize = a.num("--concurrency", 20)?;
    let kill_after = a.seconds("--kill-after-s", 5.0)?;
    let duration = a.seconds("--duration-s", 15.0)?;
    let drain = a.last("--drain").is_some();
    let signal = if drain { "-TERM" } else { "-9" };
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

    let window: Arc<Window> = Arc::default();
    let steady = Arc::new(Mutex::new(Steady::new()));
    let gate = ConnectGate::new(concurrency);
    let base = ClientOptions {
        // The clients of the killed node reconnect through the front end
        // and reactivate their sessions; the gate paces that as well.
        reconnect: true,
        connect_gate: Some(gate),
        ..client_options(a).await?
    };
    // The first use of the random generator initialises it (tens of ms):
    // once here, not inside the first session's handshake.
    let _ = uascale_crypto::policy::SecurityPolicy::Basic256Sha256.random_nonce();
    // Spread over local addresses, so that admission's per-address limits
    // judge many clients, not one (they see the address in the PROXY
    // header); kept by each client for its reconnects.
    let sources = source_ips(a)?;
    let started = Instant::now();
    let mut setup = tokio::task::JoinSet::new();
    for i in 0..sessions {
        let options = ClientOptions {
            local_addr: sources.get(i % sources.len().max(1)).copied(),
            ..base.clone()
        };
        let (url, node) = (a.url.clone(), node.clone());
        setup.spawn(async move { (i, establish(&url, options, i, node, interval).await) });
    }
    let mut clients = Vec::with_capacity(sessions);
    let mut logs = Vec::with_capacity(sessions);
    let mut failures = StatusCounts::new();
    let mut first_failure = None;
    let mut progress = Progress::new();
    let mut shown = Instant::now();
    while let Some(joined) = setup.join_next().await {
        let (i, result) = joined.map_err(|e| format!("a session task failed: {e}"))?;
        match result {
            Ok((client, sub)) => {
                logs.push(watch(sub, Arc::clone(&window), Arc::clone(&steady)));
                clients.push(client);
            }
            Err(e) => {
                count_status(&mut failures, e.status_code(), 1);
                first_failure.get_or_insert_with(|| format!("session {i}: {e}"));
            }
        }
        let done = clients.len() + failures.values().sum::<u64>() as usize;
        if done < sessions && shown.elapsed() < Duration::from_secs(1) {
            continue;
        }
        shown = Instant::now();
        progress.update(
            "setup",
            done as f64 / sessions as f64,
            &format!(
                "{}/{sessions} subscribed, {} failed",
                clients.len(),
                done - clients.len()
            ),
        );
    }
    progress.finish();
    let setup_time = started.elapsed();
    let established = clients.len();
    if established == 0 {
        return Err(format!(
            "no session was set up: {}",
            first_failure.unwrap_or_default()
        ));
    }
    if let Some(f) = &first_failure {
        eprintln!(
            "{} of {sessions} sessions failed to set up (the first: {f})",
            sessions - established
        );
    }
    eprintln!(
        "{established} sessions subscribed in {:.1} s; the kill in {kill_after:?}",
        setup_time.as_secs_f64()
    );
    // The lateness counts from here: the handshakes of the setup are
    // over.
    let _ = window.steady.set(Instant::now());
    tokio::time::sleep(kill_after).await;
    if let Some(pid) = pid {
        let _ = window.killed.set(Instant::now());
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .map_err(|e| format!("kill {signal} {pid}: {e}"))?;
        if !status.success() {
            return Err(format!("kill {signal} {pid}: {status}"));
        }
        eprintln!("kill {signal} {pid}; watching for {duration:?}");
    }
    tokio::time::sleep(duration).await;

    let at = window.killed.get().copied();
    let (mut moved, mut lost, mut duplicates, mut ended, mut silent, mut recreated) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut resume = Vec::new();
    let mut gaps = Vec::new();
    for log in &logs {
        let Ok(log) = log.lock() else { continue };
        lost += log.lost;
        duplicates += log.duplicates;
        ended += u64::from(log.ended);
        if log.restored.is_some() {
            moved += 1;
            recreated += u64::from(log.restored != Some(Restore::Reactivated));
            match (log.resumed, at) {
                (Some(r), Some(at)) => {
                    resume.push(r.saturating_duration_since(at));
                    if let Some(before) = log.last_before {
                        gaps.push(r.saturating_duration_since(before));
                    }
                }
                _ => silent += 1,
            }
        }
    }
    resume.sort();
    gaps.sort();
    let (gap50, gap99, gap_max) = (
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.99),
        gaps.last().copied().unwrap_or_default(),
    );
    let within = resume.iter().filter(|d| **d <= RESUME_BOUND).count() as u64;
    let within_percent = percent(within, moved);
    // Closed after counting (a close ends the subscriptions), all at once.
    let mut closing = tokio::task::JoinSet::new();
    for c in clients {
        closing.spawn(async move { c.close().await });
    }
    while closing.join_next().await.is_some() {}
    let (h, d) = steady
        .lock()
        .map(|s| (s.lateness.clone(), s.delay.clone()))
        .unwrap_or_else(|_| (lateness_histogram(), lateness_histogram()));
    let q = |p: f64| (!h.is_empty()).then(|| h.value_at_quantile(p) as f64 / 1000.0);
    let qd = |p: f64| (!d.is_empty()).then(|| d.value_at_quantile(p) as f64 / 1000.0);
    let (p50, p99, max) = (
        percentile(&resume, 0.5),
        percentile(&resume, 0.99),
        resume.last().copied().unwrap_or_default(),
    );
    let fmt_ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"));
    let failures = named(&failures);
    let security = a.last("--security").unwrap_or("None");
    let rows = vec![
        (
            "sessions".to_owned(),
            format!(
                "{established} of {sessions} set up in {:.1} s ({security}, {concurrency} at a time)",
                setup_time.as_secs_f64()
            ),
        ),
        ("setup failures".to_owned(), list_counts(&failures)),
        (
            if drain { "drained" } else { "killed" }.to_owned(),
            pid.map_or_else(
                || "none".to_owned(),
                |p| format!("PID {p} after {kill_after:?} (kill {signal})"),
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
        (
            "resumed within 5 s".to_owned(),
            format!("{within} of {moved} moved ({within_percent:.1} %)"),
        ),
        (
            "notification gap".to_owned(),
            format!(
                "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                ms(gap50),
                ms(gap99),
                ms(gap_max)
            ),
        ),
        ("moved, not resumed".to_owned(), silent.to_string()),
        ("sessions recreated".to_owned(), recreated.to_string()),
        ("notifications lost".to_owned(), lost.to_string()),
        ("duplicates".to_owned(), duplicates.to_string()),
        ("subscriptions ended".to_owned(), ended.to_string()),
        (
            "steady lateness (setup to kill)".to_owned(),
            format!("p50 {}, p99 {}", fmt_ms(q(0.5)), fmt_ms(q(0.99))),
        ),
        (
            "steady publish delay".to_owned(),
            format!(
                "p50 {}, p99 {}, max {}",
                fmt_ms(qd(0.5)),
                fmt_ms(qd(0.99)),
                fmt_ms(qd(1.0))
            ),
        ),
    ];
    Ok(Outcome {
        title: format!("uascale bench failover {}", a.url),
        rows,
        json: json!({
            "bench": "failover",
            "url": a.url,
            "command": a.command_line(),
            "sessions": sessions,
            "established": established,
            "setup_s": setup_time.as_secs_f64(),
            "setup_failures": failures,
            "security": security,
            "concurrency": concurrency,
            "interval_ms": interval_ms,
            "killed_pid": pid,
            "drain": drain,
            "kill_after_s": kill_after.as_secs_f64(),
            "duration_s": duration.as_secs_f64(),
            "moved": moved,
            "resume_ms": { "p50": ms(p50), "p99": ms(p99), "max": ms(max) },
            "resumed_within_5s": within,
            "resumed_within_5s_percent": within_percent,
            "gap_ms": { "p50": ms(gap50), "p99": ms(gap99), "max": ms(gap_max) },
            "moved_not_resumed": silent,
            "recreated": recreated,
            "lost": lost,
            "duplicates": duplicates,
            "ended": ended,
            "steady_lateness_ms": { "p50": q(0.5), "p99": q(0.99) },
            "steady_publish_delay_ms": { "p50": qd(0.5), "p99": qd(0.99), "max": qd(1.0) },
        }),
        charts: Vec::new(),
    })
}
