//! `uascale bench publish`: S sessions x N subscriptions x K monitored items
//! on changing nodes. Reports notifications delivered per second, their
//! lateness (arrival at the client minus the value's source timestamp),
//! messages lost, and - given the server's PID - the server's CPU per
//! notification and its memory.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hdrhistogram::Histogram;
use serde_json::{json, Value as Json};
use uascale_client::{
    Client, ClientOptions, ConnectGate, ConnectReport, MonitorItem, Notification,
    SubscriptionEvent, SubscriptionSettings,
};
use uascale_types::{DateTime, NodeId};

/// Phases every session task looks at.
const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const DONE: u8 = 2;

/// What `bench publish` is asked to do.
#[derive(Debug, Clone)]
pub struct PublishParams {
    /// The server.
    pub url: String,
    /// Sessions, one connection each.
    pub sessions: usize,
    /// Subscriptions per session.
    pub subscriptions: usize,
    /// Monitored items per subscription.
    pub items: usize,
    /// The nodes the items watch (round robin).
    pub nodes: Vec<NodeId>,
    /// Publishing interval.
    pub interval: Duration,
    /// Sampling interval in ms (-1: the publishing interval).
    pub sampling_ms: f64,
    /// Sessions being established at once.
    pub concurrency: usize,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// The server's PID, for its CPU and memory.
    pub server_pid: Option<u32>,
    /// Retries of a failed session establishment (§7 backoff).
    pub max_retries: u32,
}

#[derive(Default)]
struct Counters {
    notifications: AtomicU64,
    messages: AtomicU64,
    keep_alives: AtomicU64,
    lost: AtomicU64,
    established: AtomicU64,
    failed: AtomicU64,
}

/// Milliseconds from `then` to now (0 if `then` is in the future or null).
fn lateness_us(then: DateTime) -> u64 {
    let now = DateTime::from_system_time(SystemTime::now());
    // DateTime ticks are 100 ns.
    let ticks = now.ticks().saturating_sub(then.ticks());
    if then.ticks() <= 0 || ticks <= 0 {
        return 0;
    }
    (ticks / 10) as u64
}

/// Runs the benchmark; the summary as JSON.
pub async fn run(p: PublishParams) -> Result<Json, String> {
    if p.sessions == 0 || p.subscriptions == 0 || p.items == 0 || p.duration.is_zero() {
        return Err("--sessions, --subscriptions, --items and --duration-s must be > 0".into());
    }
    if p.nodes.is_empty() {
        return Err("no --node to monitor".into());
    }
    let counters = Arc::new(Counters::default());
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let gate = ConnectGate::new(p.concurrency.max(1));
    let mut tasks = Vec::with_capacity(p.sessions);
    let started = Instant::now();
    eprintln!(
        "bench publish: {} session(s) x {} subscription(s) x {} item(s) on {} node(s), {} at a time ...",
        p.sessions,
        p.subscriptions,
        p.items,
        p.nodes.len(),
        p.concurrency
    );
    for s in 0..p.sessions {
        let (p, counters, phase) = (p.clone(), Arc::clone(&counters), Arc::clone(&phase));
        let options = ClientOptions {
            connect_gate: Some(gate.clone()),
            connect_attempts: p.max_retries.saturating_add(1),
            ..Default::default()
        };
        tasks.push(tokio::spawn(async move {
            session_task(s, p, options, counters, phase).await
        }));
    }
    // Wait until all sessions are up (or failed), then warm up and measure.
    while counters.established.load(Ordering::Relaxed) + counters.failed.load(Ordering::Relaxed)
        < p.sessions as u64
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(600) {
            break;
        }
    }
    let setup = started.elapsed();
    let established = counters.established.load(Ordering::Relaxed);
    eprintln!(
        "  {established} session(s) subscribed in {:.1} s ({} failed); warm-up {:.0} s",
        setup.as_secs_f64(),
        counters.failed.load(Ordering::Relaxed),
        p.warmup.as_secs_f64()
    );
    tokio::time::sleep(p.warmup).await;
    let before = p.server_pid.and_then(crate::bench::sample_server);
    let n0 = counters.notifications.load(Ordering::Relaxed);
    let m0 = counters.messages.load(Ordering::Relaxed);
    phase.store(MEASURE, Ordering::SeqCst);
    let t0 = Instant::now();
    let mut last = n0;
    while t0.elapsed() < p.duration {
        let step = (p.duration - t0.elapsed()).min(Duration::from_secs(1));
        tokio::time::sleep(step).await;
        let now = counters.notifications.load(Ordering::Relaxed);
        eprintln!(
            "  measure {:>5.1} s  {:>10.0} notifications/s",
            t0.elapsed().as_secs_f64(),
            (now - last) as f64 / step.as_secs_f64().max(1e-3)
        );
        last = now;
    }
    phase.store(DONE, Ordering::SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    let after = p.server_pid.and_then(crate::bench::sample_server);
    let notifications = counters.notifications.load(Ordering::Relaxed) - n0;
    let messages = counters.messages.load(Ordering::Relaxed) - m0;
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| e.to_string())?;
    let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
    let mut retries = 0;
    let mut busy = 0;
    for t in tasks {
        match t.await {
            Ok(Ok((h, report))) => {
                let _ = hist.add(h);
                retries += report.retries;
                busy += report.busy_answers;
            }
            Ok(Err(e)) => *errors.entry(e).or_insert(0) += 1,
            Err(_) => *errors.entry("task failed".into()).or_insert(0) += 1,
        }
    }
    let server = match (before, after) {
        (Some(b), Some(a)) => Some(json!({
            "cpu_us_per_notification": if notifications > 0 {
                Some((a.cpu - b.cpu).as_secs_f64() * 1e6 / notifications as f64)
            } else { None },
            "cores_busy": (a.cpu - b.cpu).as_secs_f64() / secs,
            "rss_bytes": a.rss_bytes,
        })),
        _ => None,
    };
    let q = |x: f64| hist.value_at_quantile(x) as f64 / 1000.0;
    Ok(json!({
        "bench": "publish",
        "url": p.url,
        "sessions": p.sessions,
        "subscriptions_per_session": p.subscriptions,
        "items_per_subscription": p.items,
        "nodes": p.nodes.len(),
        "publishing_interval_ms": p.interval.as_secs_f64() * 1000.0,
        "established": established,
        "failed": counters.failed.load(Ordering::Relaxed),
        "setup_s": setup.as_secs_f64(),
        "retries": retries,
        "busy_answers": busy,
        "duration_s": secs,
        "notifications": notifications,
        "notifications_per_s": notifications as f64 / secs,
        "messages_per_s": messages as f64 / secs,
        "keep_alives": counters.keep_alives.load(Ordering::Relaxed),
        "lost_messages": counters.lost.load(Ordering::Relaxed),
        "lateness_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": hist.max() as f64 / 1000.0},
        "errors": errors,
        "server": server,
    }))
}

/// One session: open, subscribe, count what arrives until the end.
async fn session_task(
    index: usize,
    p: PublishParams,
    options: ClientOptions,
    counters: Arc<Counters>,
    phase: Arc<AtomicU8>,
) -> Result<(Histogram<u64>, ConnectReport), String> {
    let mut report = ConnectReport::default();
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| e.to_string())?;
    let setup = async {
        let client = Client::open(&p.url, options, "uascale bench publish", &mut report).await?;
        let mut subs = Vec::with_capacity(p.subscriptions);
        for s in 0..p.subscriptions {
            let sub = client
                .subscribe(SubscriptionSettings::with_interval(p.interval))
                .await?;
            let items = (0..p.items)
                .map(|i| {
                    let n = &p.nodes
                        [(index * p.subscriptions * p.items + s * p.items + i) % p.nodes.len()];
                    MonitorItem::value(n.clone()).sampling(p.sampling_ms)
                })
                .collect();
            let created = sub.monitor(items).await?;
            if let Some(bad) = created.iter().find(|c| c.result.status_code.is_bad()) {
                return Err(uascale_client::ClientError::Service {
                    status: bad.result.status_code,
                    retry_after_ms: None,
                });
            }
            subs.push(sub);
        }
        Ok((client, subs))
    };
    let (client, subs) = match setup.await {
        Ok(x) => x,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            return Err(e.status_code().to_string());
        }
    };
    counters.established.fetch_add(1, Ordering::Relaxed);
    // One task per subscription stream would cost more than this session
    // task polling them in turn.
    let mut streams: Vec<_> = subs.into_iter().collect();
    loop {
        if phase.load(Ordering::Relaxed) == DONE {
            break;
        }
        let next = async {
            let futs = streams.iter_mut().map(|s| Box::pin(s.recv()));
            futures_select(futs).await
        };
        let event = tokio::select! {
            e = next => e,
            () = tokio::time::sleep(Duration::from_millis(250)) => continue,
        };
        let Some(event) = event else { break };
        let measuring = phase.load(Ordering::Relaxed) == MEASURE;
        match event {
            SubscriptionEvent::Notifications { notifications, .. } => {
                if !measuring {
                    continue;
                }
                counters.messages.fetch_add(1, Ordering::Relaxed);
                for n in notifications {
                    if let Notification::DataChange { value, .. } = n {
                        counters.notifications.fetch_add(1, Ordering::Relaxed);
                        if let Some(t) = value.source_timestamp.or(value.server_timestamp) {
                            let _ = hist.record(lateness_us(t).max(1));
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
            SubscriptionEvent::Ended(status) => {
                client.close().await;
                return Err(format!("subscription ended: {status}"));
            }
        }
    }
    drop(streams);
    client.close().await;
    Ok((hist, report))
}

/// The first of several `recv` futures to finish.
async fn futures_select<F, T>(futs: impl Iterator<Item = std::pin::Pin<Box<F>>>) -> T
where
    F: std::future::Future<Output = T>,
{
    let mut futs: Vec<_> = futs.collect();
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// The summary as text.
pub fn print_text(r: &Json) {
    println!(
        "bench publish  {}  {} sessions x {} subscription(s) x {} item(s), every {} ms, {:.1} s measured",
        r["url"].as_str().unwrap_or(""),
        r["sessions"],
        r["subscriptions_per_session"],
        r["items_per_subscription"],
        r["publishing_interval_ms"],
        r["duration_s"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  established    {:>12} in {:.1} s ({} failed, {} retries, {} busy)",
        r["established"],
        r["setup_s"].as_f64().unwrap_or(0.0),
        r["failed"],
        r["retries"],
        r["busy_answers"]
    );
    println!(
        "  notifications  {:>12.0} /s ({:.0} messages/s, {} keep-alives, {} lost messages)",
        r["notifications_per_s"].as_f64().unwrap_or(0.0),
        r["messages_per_s"].as_f64().unwrap_or(0.0),
        r["keep_alives"],
        r["lost_messages"]
    );
    let l = &r["lateness_ms"];
    println!(
        "  lateness ms    p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
        l["p50"].as_f64().unwrap_or(0.0),
        l["p90"].as_f64().unwrap_or(0.0),
        l["p99"].as_f64().unwrap_or(0.0),
        l["max"].as_f64().unwrap_or(0.0)
    );
    if let Some(e) = r["errors"].as_object().filter(|e| !e.is_empty()) {
        println!("  errors         {e:?}");
    }
    let s = &r["server"];
    if !s.is_null() {
        println!(
            "  server CPU     {:>12.2} us/notification ({:.2} cores busy), RSS {:.1} MB",
            s["cpu_us_per_notification"].as_f64().unwrap_or(f64::NAN),
            s["cores_busy"].as_f64().unwrap_or(0.0),
            s["rss_bytes"].as_f64().unwrap_or(0.0) / 1e6
        );
    }
}
