//! `bench publish`: S sessions x N subscriptions x K monitored items on
//! changing nodes. Reports notifications delivered per second, their
//! lateness (arrival at the client minus the value's source timestamp) and
//! how many came on time (lateness within `--on-time-ms`, by default the
//! publishing interval plus 10 %), messages lost, and - given the server's
//! PID - the server's CPU per notification; sampled every `--interval-s`
//! for the JSON and the report.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::json;
use uascale_client::{
    Client, ClientError, ClientOptions, ConnectGate, ConnectReport, MonitorItem, Notification,
    Subscription, SubscriptionEvent, SubscriptionSettings,
};
use uascale_types::NodeId;

use super::progress::Progress;
use super::report::{Chart, Line};
use super::series::{lateness_histogram, lateness_us};
use super::{list_counts, sample_server, Args, Outcome, ServerSample};

/// The options `bench publish` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--sessions",
    "--subscriptions",
    "--items",
    "--node",
    "--load-nodes",
    "--interval-ms",
    "--sampling-ms",
    "--concurrency",
    "--warmup-s",
    "--duration-s",
    "--max-retries",
    "--server-pid",
    "--trust-server",
    "--pki",
    "--on-time-ms",
];

const SETUP: u8 = 0;
const WARMUP: u8 = 1;
const MEASURE: u8 = 2;
const DONE: u8 = 3;

#[derive(Default)]
struct Counters {
    notifications: AtomicU64,
    messages: AtomicU64,
    keep_alives: AtomicU64,
    lost: AtomicU64,
    established: AtomicU64,
    failed: AtomicU64,
    retries: AtomicU64,
    busy: AtomicU64,
    /// Round trip of each CreateMonitoredItems call, microseconds.
    create_items: Mutex<Vec<u64>>,
}

/// Lateness of the current interval and of the measured window, and the
/// measured window's count of notifications on time.
struct Lateness {
    interval: Histogram<u64>,
    measured: Histogram<u64>,
    on_time: OnTime,
}

/// The notifications of the measured window that came on time: those
/// whose lateness (arrival minus source timestamp) is within a bound.
/// Only notifications with a timestamp are judged.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OnTime {
    /// The bound, microseconds.
    bound_us: u64,
    /// Notifications judged.
    judged: u64,
    /// Of those, the ones within the bound.
    on_time: u64,
}

impl OnTime {
    fn new(bound: Duration) -> Self {
        OnTime {
            bound_us: u64::try_from(bound.as_micros()).unwrap_or(u64::MAX),
            judged: 0,
            on_time: 0,
        }
    }

    /// One notification `lateness_us` late.
    fn record(&mut self, lateness_us: u64) {
        self.judged += 1;
        if lateness_us <= self.bound_us {
            self.on_time += 1;
        }
    }

    /// The share on time, 0 to 1 (`None` before any was judged).
    fn share(&self) -> Option<f64> {
        (self.judged > 0).then(|| self.on_time as f64 / self.judged as f64)
    }
}

/// `--on-time-ms`: how late a notification may come and count as on time.
/// Default the publishing interval plus 10 %: a value may wait up to one
/// interval for its Publish, and the tenth is a margin for the delivery
/// (100 ms at a 1 s interval).
fn on_time_bound(a: &Args, interval: Duration) -> Result<Duration, String> {
    match a.last("--on-time-ms") {
        None => Ok(interval + interval / 10),
        Some(_) => {
            let ms: f64 = a.num("--on-time-ms", 0.0)?;
            Duration::try_from_secs_f64(ms / 1000.0)
                .map_err(|_| format!("--on-time-ms {ms} is not a duration in milliseconds"))
        }
    }
}

/// One sample of the run.
#[derive(Debug, Clone, Serialize)]
struct PublishPoint {
    /// Seconds since the start.
    t_s: f64,
    /// `setup`, `warm-up` or `measure`.
    phase: &'static str,
    /// Sessions subscribed so far.
    established: u64,
    notifications_per_s: f64,
    messages_per_s: f64,
    lateness_p50_ms: Option<f64>,
    lateness_p99_ms: Option<f64>,
    /// Messages lost so far.
    lost: u64,
    /// The server's CPU time over the interval / its length (with its PID).
    server_cores_busy: Option<f64>,
}

/// The nodes of `--node` and `--load-nodes` (the demo's
/// `Demo.Load.Node{i}`); none given, the demo's four dynamic values.
pub(super) fn nodes(a: &Args) -> Result<Vec<NodeId>, String> {
    let mut nodes: Vec<NodeId> = a
        .flags
        .get("--node")
        .into_iter()
        .flatten()
        .map(|n| n.parse().map_err(|e| format!("--node {n:?}: {e}")))
        .collect::<Result<_, String>>()?;
    let load: usize = a.num("--load-nodes", 0)?;
    nodes.extend((0..load).map(|i| NodeId::string(2, format!("Demo.Load.Node{i}"))));
    if nodes.is_empty() {
        nodes = ["Counter", "Random", "Sine", "Step"]
            .iter()
            .map(|n| NodeId::string(2, format!("Demo.Dynamic.{n}")))
            .collect();
    }
    Ok(nodes)
}

/// Runs `bench publish`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    let sessions: usize = a.num("--sessions", 10)?;
    let per_session: usize = a.num("--subscriptions", 1)?;
    let items: usize = a.num("--items", 10)?;
    let interval_ms: f64 = a.num("--interval-ms", 100.0)?;
    let sampling_ms: f64 = a.num("--sampling-ms", -1.0)?;
    let concurrency: usize = a.num("--concurrency", 50)?;
    let warmup = a.seconds("--warmup-s", 2.0)?;
    let duration = a.seconds("--duration-s", 5.0)?;
    let max_retries: u32 = a.num("--max-retries", 4)?;
    let pid = a.server_pid()?;
    let every = a.interval()?;
    let nodes = Arc::new(nodes(a)?);
    if sessions == 0 || per_session == 0 || items == 0 || duration.is_zero() || concurrency == 0 {
        return Err(
            "--sessions, --subscriptions, --items, --concurrency and --duration-s must be > 0"
                .into(),
        );
    }
    let interval = Duration::try_from_secs_f64(interval_ms / 1000.0)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--interval-ms {interval_ms} is not a positive duration"))?;
    let on_time_bound = on_time_bound(a, interval)?;

    let transport = super::common::transport_options(a)?;
    let counters = Arc::new(Counters::default());
    // The server's RSS before the first session: memory per item is the
    // growth over the run divided by the items.
    let rss_before = pid.and_then(sample_server).map(|s| s.rss_bytes);
    let lateness = Arc::new(Mutex::new(Lateness {
        interval: lateness_histogram(),
        measured: lateness_histogram(),
        on_time: OnTime::new(on_time_bound),
    }));
    let phase = Arc::new(AtomicU8::new(SETUP));
    let gate = ConnectGate::new(concurrency);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(sessions);
    for s in 0..sessions {
        let options = ClientOptions {
            connect_gate: Some(gate.clone()),
            connect_attempts: max_retries.saturating_add(1),
            ..transport.clone()
        };
        let plan = Plan {
            url: a.url.clone(),
            index: s,
            subscriptions: per_session,
            items,
            nodes: Arc::clone(&nodes),
            interval,
            sampling_ms,
            counters: Arc::clone(&counters),
        };
        let (counters, lateness, phase) = (
            Arc::clone(&counters),
            Arc::clone(&lateness),
            Arc::clone(&phase),
        );
        tasks.push(tokio::spawn(async move {
            session_task(plan, options, counters, lateness, phase).await
        }));
    }

    let mut progress = Progress::new();
    let mut series = Vec::new();
    let mut prev = (started, 0u64, 0u64, pid.and_then(sample_server));
    let mut sample = |phase_name: &'static str, progress: &mut Progress, fraction: f64| {
        let at = Instant::now();
        let secs = at.duration_since(prev.0).as_secs_f64().max(1e-9);
        let n = counters.notifications.load(Ordering::Relaxed);
        let m = counters.messages.load(Ordering::Relaxed);
        let server = pid.and_then(sample_server);
        let cores = match (prev.3, server) {
            (Some(a), Some(b)) => Some(b.cpu.saturating_sub(a.cpu).as_secs_f64() / secs),
            _ => None,
        };
        let (p50, p99) = match lateness.lock() {
            Ok(mut l) => {
                let h = &l.interval;
                let q = (!h.is_empty()).then(|| {
                    (
                        h.value_at_quantile(0.5) as f64 / 1000.0,
                        h.value_at_quantile(0.99) as f64 / 1000.0,
                    )
                });
                l.interval.reset();
                (q.map(|q| q.0), q.map(|q| q.1))
            }
            Err(_) => (None, None),
        };
        let point = PublishPoint {
            t_s: at.duration_since(started).as_secs_f64(),
            phase: phase_name,
            established: counters.established.load(Ordering::Relaxed),
            notifications_per_s: n.saturating_sub(prev.1) as f64 / secs,
            messages_per_s: m.saturating_sub(prev.2) as f64 / secs,
            lateness_p50_ms: p50,
            lateness_p99_ms: p99,
            lost: counters.lost.load(Ordering::Relaxed),
            server_cores_busy: cores,
        };
        progress.update(
            phase_name,
            fraction,
            &format!(
                "{} sessions, {:.0} notifications/s",
                point.established, point.notifications_per_s
            ),
        );
        series.push(point);
        prev = (at, n, m, server);
    };

    // Set-up: until every session is subscribed or has failed.
    let mut next = started + every;
    loop {
        let done =
            counters.established.load(Ordering::Relaxed) + counters.failed.load(Ordering::Relaxed);
        if done >= sessions as u64 {
            break;
        }
        tokio::time::sleep_until(next.min(Instant::now() + Duration::from_millis(50)).into()).await;
        if Instant::now() >= next {
            next += every;
            sample("setup", &mut progress, done as f64 / sessions as f64);
        }
    }
    let setup = started.elapsed();
    sample("setup", &mut progress, 1.0);
    let established = counters.established.load(Ordering::Relaxed);

    // Warm-up, then the measured window.
    phase.store(WARMUP, Ordering::SeqCst);
    window("warm-up", warmup, every, &mut progress, &mut sample).await;
    let before: Option<ServerSample> = pid.and_then(sample_server);
    let n0 = counters.notifications.load(Ordering::Relaxed);
    let m0 = counters.messages.load(Ordering::Relaxed);
    let lost0 = counters.lost.load(Ordering::Relaxed);
    phase.store(MEASURE, Ordering::SeqCst);
    let t0 = Instant::now();
    window("measure", duration, every, &mut progress, &mut sample).await;
    phase.store(DONE, Ordering::SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    let after = pid.and_then(sample_server);
    progress.finish();
    let notifications = counters.notifications.load(Ordering::Relaxed) - n0;
    let messages = counters.messages.load(Ordering::Relaxed) - m0;
    let lost = counters.lost.load(Ordering::Relaxed) - lost0;

    let mut failures: std::collections::BTreeMap<String, u64> = Default::default();
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => *failures.entry(e).or_insert(0) += 1,
            Err(_) => *failures.entry("task failed".into()).or_insert(0) += 1,
        }
    }
    let (measured, on_time) = lateness
        .lock()
        .map(|l| (l.measured.clone(), l.on_time))
        .unwrap_or_else(|_| (lateness_histogram(), OnTime::new(on_time_bound)));
    let on_time_ms = on_time_bound.as_secs_f64() * 1000.0;
    let q = |x: f64| (!measured.is_empty()).then(|| measured.value_at_quantile(x) as f64 / 1000.0);
    let server = match (before, after) {
        (Some(b), Some(e)) => Some((
            (notifications > 0)
                .then(|| e.cpu.saturating_sub(b.cpu).as_secs_f64() * 1e6 / notifications as f64),
            e.cpu.saturating_sub(b.cpu).as_secs_f64() / secs.max(1e-9),
            e.rss_bytes,
        )),
        _ => None,
    };
    // The spread of the per-interval rates in the measured window (flat
    // means no stalls).
    let rates: Vec<f64> = series
        .iter()
        .filter(|p| p.phase == "measure")
        .map(|p| p.notifications_per_s)
        .collect();
    let spread = (!rates.is_empty()).then(|| {
        (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        )
    });
    let mut create_us = counters
        .create_items
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    create_us.sort_unstable();
    let pick = |q: f64| -> Option<f64> {
        let i = ((create_us.len() as f64 - 1.0) * q).round() as usize;
        create_us.get(i).map(|u| *u as f64 / 1000.0)
    };
    let create_ms = (!create_us.is_empty()).then(|| (pick(0.5), pick(0.99), pick(1.0)));
    let total_items = established as usize * per_session * items;
    let bytes_per_item = match (rss_before, &server) {
        (Some(b), Some(s)) if total_items > 0 => {
            Some(s.2.saturating_sub(b) as f64 / total_items as f64)
        }
        _ => None,
    };
    let failed = counters.failed.load(Ordering::Relaxed);
    let retries = counters.retries.load(Ordering::Relaxed);
    let busy = counters.busy.load(Ordering::Relaxed);
    let json = json!({
        "bench": "publish",
        "command": a.command_line(),
        "url": a.url,
        "sessions": sessions,
        "subscriptions_per_session": per_session,
        "items_per_subscription": items,
        "nodes": nodes.len(),
        "publishing_interval_ms": interval_ms,
        "sampling_interval_ms": sampling_ms,
        "established": established,
        "failed": failed,
        "failures": failures,
        "setup_s": setup.as_secs_f64(),
        "retries": retries,
        "busy_answers": busy,
        "duration_s": secs,
        "notifications": notifications,
        "notifications_per_s": notifications as f64 / secs.max(1e-9),
        "messages_per_s": messages as f64 / secs.max(1e-9),
        "keep_alives": counters.keep_alives.load(Ordering::Relaxed),
        "lost_messages": lost,
        "notifications_per_s_min": spread.map(|s| s.0),
        "notifications_per_s_max": spread.map(|s| s.1),
        "create_monitored_items_ms": create_ms.map(|c| json!({"p50": c.0, "p99": c.1, "max": c.2})),
        "lateness_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
                        "max": (!measured.is_empty()).then(|| measured.max() as f64 / 1000.0)},
        "on_time": {"within_ms": on_time_ms, "judged": on_time.judged,
                    "count": on_time.on_time, "share": on_time.share()},
        "server": server.map(|s| json!({
            "cpu_us_per_notification": s.0,
            "cores_busy": s.1,
            "rss_bytes": s.2,
            "rss_bytes_before": rss_before,
            "bytes_per_item": bytes_per_item,
        })),
        "series": series,
    });
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let mut rows = vec![
        (
            "established".to_owned(),
            format!(
                "{established} of {sessions} in {:.1} s ({failed} failed, {retries} retries, {busy} busy answers)",
                setup.as_secs_f64()
            ),
        ),
        ("failures".to_owned(), list_counts(&failures)),
        (
            "notifications".to_owned(),
            format!(
                "{:.0}/s ({:.0} messages/s, {} keep-alives, {lost} lost messages)",
                notifications as f64 / secs.max(1e-9),
                messages as f64 / secs.max(1e-9),
                counters.keep_alives.load(Ordering::Relaxed)
            ),
        ),
        (
            "per interval".to_owned(),
            spread.map_or("-".to_owned(), |(lo, hi)| {
                format!("{lo:.0} to {hi:.0} notifications/s in the measured window")
            }),
        ),
        (
            "create items".to_owned(),
            create_ms.map_or("-".to_owned(), |(p50, p99, max)| {
                format!(
                    "CreateMonitoredItems of {items} items: p50 {} p99 {} max {} ms",
                    ms(p50),
                    ms(p99),
                    ms(max)
                )
            }),
        ),
        (
            "lateness ms".to_owned(),
            format!(
                "p50 {}  p90 {}  p99 {}  max {}",
                ms(q(0.5)),
                ms(q(0.9)),
                ms(q(0.99)),
                ms((!measured.is_empty()).then(|| measured.max() as f64 / 1000.0))
            ),
        ),
        (
            "on time".to_owned(),
            format!(
                "{} of {} notifications ({}) within {on_time_ms:.0} ms of their source timestamp",
                on_time.on_time,
                on_time.judged,
                on_time
                    .share()
                    .map_or("-".to_owned(), |s| format!("{:.2} %", s * 100.0)),
            ),
        ),
    ];
    if let Some((us, cores, rss)) = server {
        rows.push((
            "server".to_owned(),
            format!(
                "{} us CPU per notification ({cores:.2} cores busy), RSS {:.1} MB{}",
                us.map_or("-".to_owned(), |u| format!("{u:.2}")),
                rss as f64 / 1e6,
                bytes_per_item.map_or(String::new(), |b| format!(
                    ", {b:.0} B per item (RSS growth / items)"
                ))
            ),
        ));
    }
    Ok(Outcome {
        title: format!(
            "bench publish  {}  {sessions} sessions x {per_session} subscription(s) x {items} item(s), every {interval_ms} ms, {secs:.1} s measured",
            a.url
        ),
        rows,
        charts: charts(&json, setup.as_secs_f64(), warmup.as_secs_f64()),
        json,
    })
}

/// Waits `length`, sampling every `every`.
async fn window(
    name: &'static str,
    length: Duration,
    every: Duration,
    progress: &mut Progress,
    sample: &mut dyn FnMut(&'static str, &mut Progress, f64),
) {
    let start = Instant::now();
    let end = start + length;
    while Instant::now() < end {
        let next = (Instant::now() + every).min(end);
        tokio::time::sleep_until(next.into()).await;
        sample(
            name,
            progress,
            start.elapsed().as_secs_f64() / length.as_secs_f64().max(1e-9),
        );
    }
}

/// The report's plots from the series in `json`.
fn charts(json: &serde_json::Value, setup_s: f64, warmup_s: f64) -> Vec<Chart> {
    let series = json["series"].as_array().cloned().unwrap_or_default();
    let xy = |key: &str| -> Vec<(f64, f64)> {
        series
            .iter()
            .filter_map(|p| Some((p["t_s"].as_f64()?, p[key].as_f64()?)))
            .collect()
    };
    let shade = Some((0.0, setup_s + warmup_s, "set-up and warm-up".to_owned()));
    vec![
        Chart {
            title: "Notifications delivered".into(),
            y_label: "per second".into(),
            lines: vec![
                Line {
                    key: "notifications_per_s".into(),
                    label: "notifications/s".into(),
                    points: xy("notifications_per_s"),
                },
                Line {
                    key: "messages_per_s".into(),
                    label: "messages/s".into(),
                    points: xy("messages_per_s"),
                },
            ],
            shade: shade.clone(),
        },
        Chart {
            title: "Lateness (arrival minus source timestamp)".into(),
            y_label: "ms".into(),
            lines: vec![
                Line {
                    key: "lateness_p50_ms".into(),
                    label: "p50".into(),
                    points: xy("lateness_p50_ms"),
                },
                Line {
                    key: "lateness_p99_ms".into(),
                    label: "p99".into(),
                    points: xy("lateness_p99_ms"),
                },
            ],
            shade: shade.clone(),
        },
        Chart {
            title: "Sessions subscribed".into(),
            y_label: "sessions".into(),
            lines: vec![Line {
                key: "established".into(),
                label: "subscribed".into(),
                points: xy("established"),
            }],
            shade,
        },
    ]
}

/// What one session subscribes to.
struct Plan {
    url: String,
    index: usize,
    subscriptions: usize,
    items: usize,
    nodes: Arc<Vec<NodeId>>,
    interval: Duration,
    sampling_ms: f64,
    /// The counters (each CreateMonitoredItems round trip is written
    /// there).
    counters: Arc<Counters>,
}

/// Opens the session and its subscriptions.
async fn set_up(
    plan: &Plan,
    options: ClientOptions,
    report: &mut ConnectReport,
) -> Result<(Client, Vec<Subscription>), ClientError> {
    let client = Client::open(&plan.url, options, "uascale bench publish", report).await?;
    let mut subs = Vec::with_capacity(plan.subscriptions);
    for s in 0..plan.subscriptions {
        let sub = client
            .subscribe(SubscriptionSettings::with_interval(plan.interval))
            .await?;
        let first = (plan.index * plan.subscriptions + s) * plan.items;
        let items = (0..plan.items)
            .map(|i| {
                let n = &plan.nodes[(first + i) % plan.nodes.len()];
                MonitorItem::value(n.clone()).sampling(plan.sampling_ms)
            })
            .collect();
        let t = Instant::now();
        let created = sub.monitor(items).await?;
        if let Ok(mut v) = plan.counters.create_items.lock() {
            v.push(t.elapsed().as_micros() as u64);
        }
        if let Some(bad) = created.iter().find(|c| c.result.status_code.is_bad()) {
            client.close().await;
            return Err(ClientError::Service {
                status: bad.result.status_code,
                retry_after_ms: None,
                retry_ticket: None,
            });
        }
        subs.push(sub);
    }
    Ok((client, subs))
}

/// One session: set up, then count what arrives until the end.
async fn session_task(
    plan: Plan,
    options: ClientOptions,
    counters: Arc<Counters>,
    lateness: Arc<Mutex<Lateness>>,
    phase: Arc<AtomicU8>,
) -> Result<(), String> {
    let mut report = ConnectReport::default();
    let result = set_up(&plan, options, &mut report).await;
    counters
        .retries
        .fetch_add(u64::from(report.retries), Ordering::Relaxed);
    counters
        .busy
        .fetch_add(u64::from(report.busy_answers), Ordering::Relaxed);
    let (client, mut subs) = match result {
        Ok(x) => x,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            return Err(e.status_code().to_string());
        }
    };
    counters.established.fetch_add(1, Ordering::Relaxed);
    let mut late = Vec::new();
    let outcome = loop {
        if phase.load(Ordering::Relaxed) == DONE {
            break Ok(());
        }
        let event = tokio::select! {
            e = next_event(&mut subs) => e,
            () = tokio::time::sleep(Duration::from_millis(250)) => continue,
        };
        let Some(event) = event else {
            break Err("subscription stream ended".to_owned());
        };
        let counting = phase.load(Ordering::Relaxed) >= WARMUP;
        match event {
            SubscriptionEvent::Notifications { notifications, .. } => {
                if !counting {
                    continue;
                }
                counters.messages.fetch_add(1, Ordering::Relaxed);
                late.clear();
                for n in notifications {
                    if let Notification::DataChange { value, .. } = n {
                        counters.notifications.fetch_add(1, Ordering::Relaxed);
                        if let Some(t) = value.source_timestamp.or(value.server_timestamp) {
                            late.push(lateness_us(t).max(1));
                        }
                    }
                }
                let measuring = phase.load(Ordering::Relaxed) == MEASURE;
                if let Ok(mut l) = lateness.lock() {
                    for &us in &late {
                        l.interval.saturating_record(us);
                        if measuring {
                            l.measured.saturating_record(us);
                            l.on_time.record(us);
                        }
                    }
                }
            }
            SubscriptionEvent::KeepAlive { .. } => {
                counters.keep_alives.fetch_add(1, Ordering::Relaxed);
            }
            SubscriptionEvent::Lost { count, .. } => {
                counters.lost.fetch_add(u64::from(count), Ordering::Relaxed);
            }
            SubscriptionEvent::Restored(_) => {}
            SubscriptionEvent::Ended(status) => break Err(format!("subscription ended: {status}")),
        }
    };
    drop(subs);
    client.close().await;
    outcome
}

/// The next event of any of the session's subscriptions.
async fn next_event(subs: &mut [Subscription]) -> Option<SubscriptionEvent> {
    if let [one] = subs {
        return one.recv().await;
    }
    let mut futs: Vec<_> = subs.iter_mut().map(|s| Box::pin(s.recv())).collect();
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(v) = std::future::Future::poll(f.as_mut(), cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A notification is on time up to the bound, inclusive; the share
    /// is of the notifications judged.
    #[test]
    fn notifications_within_the_bound_are_counted_on_time() {
        let mut t = OnTime::new(Duration::from_millis(110));
        assert_eq!(t.share(), None);
        t.record(1);
        t.record(110_000);
        t.record(110_001);
        t.record(5_000_000);
        assert_eq!((t.judged, t.on_time), (4, 2));
        assert_eq!(t.share(), Some(0.5));
    }

    #[test]
    fn the_bound_is_the_interval_plus_a_tenth_unless_given() {
        let args = |extra: &[&str]| {
            let mut v = vec!["opc.tcp://127.0.0.1:4840"];
            v.extend_from_slice(extra);
            Args::parse("publish", &v, FLAGS).expect("valid arguments")
        };
        let second = Duration::from_secs(1);
        assert_eq!(
            on_time_bound(&args(&[]), second),
            Ok(Duration::from_millis(1100))
        );
        assert_eq!(
            on_time_bound(&args(&[]), Duration::from_millis(100)),
            Ok(Duration::from_millis(110))
        );
        assert_eq!(
            on_time_bound(&args(&["--on-time-ms", "250"]), second),
            Ok(Duration::from_millis(250))
        );
        assert!(on_time_bound(&args(&["--on-time-ms", "-1"]), second).is_err());
        assert!(on_time_bound(&args(&["--on-time-ms", "x"]), second).is_err());
    }
}
