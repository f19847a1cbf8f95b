//! `bench rogue`: one client that makes the server keep as much as it
//! will, next to a well-behaved victim, and what that costs: the server's
//! RSS (from /proc/PID/status of `--server-pid`), the status codes the
//! rogue gets, and what the victim's subscription (100 items at 100 ms by
//! default) still receives.
//!
//! The variants (`--variant`):
//! - `items`: one session, `--subscriptions` subscriptions holding
//!   `--items` monitored items between them on the `--node`s, queues of
//!   `--queue`, the fastest sampling, and no Publish ever;
//! - `subscriptions`: `--subscriptions` subscriptions of one item each,
//!   Publish requests kept parked (`--publishes` in flight) and never
//!   acknowledged, so every retransmission queue fills;
//! - `continuation`: `--sessions` sessions, each Browsing with one
//!   reference per page until the server refuses another continuation
//!   point (when the server refuses a session, the rogue keeps the ones
//!   it has and the refusal is reported);
//! - `events`: `--items` event items on the Server object, each with an
//!   EventFilter of `--select` select clauses, queues of `--queue`, no
//!   Publish.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use uascale_client::subscription::{MonitorItem, Notification, SubscriptionSettings};
use uascale_client::{Client, ClientOptions, ConnectReport, SubscriptionEvent};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode};

use super::progress::Progress;
use super::series::{lateness_histogram, lateness_us};
use super::{list_counts, named, sample_server, Args, Outcome, StatusCounts};

/// The options `bench rogue` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--variant",
    "--items",
    "--subscriptions",
    "--queue",
    "--sessions",
    "--publishes",
    "--select",
    "--node",
    "--load-nodes",
    "--victim-items",
    "--victim-ms",
    "--duration-s",
    "--server-pid",
];

/// Items per CreateMonitoredItems call (under the default
/// `max_monitored_items_per_call`).
const PER_CALL: usize = 5_000;

/// What the rogue got back, shared with the sampler.
#[derive(Default)]
struct RogueStats {
    statuses: Mutex<StatusCounts>,
    created_items: AtomicU64,
    created_subscriptions: AtomicU64,
    continuation_points: AtomicU64,
    /// Values that came with the overflow bit (only when it publishes).
    overflow_values: AtomicU64,
    values: AtomicU64,
}

impl RogueStats {
    fn count(&self, s: StatusCode) {
        let mut m = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        super::count_status(&mut m, s, 1);
    }
}

async fn open(url: &str, name: &str) -> Result<Client, String> {
    let mut report = ConnectReport::default();
    Client::open(url, ClientOptions::default(), name, &mut report)
        .await
        .map_err(|e| format!("{name}: connect: {e}"))
}

/// CreateSubscription without the client's publish loop (the rogue
/// decides whether it ever publishes).
async fn raw_subscription(c: &Client, stats: &RogueStats) -> Option<u32> {
    // The longest lifetime the server grants: a subscription that never
    // sees a Publish lives on (lifetime x interval) and keeps its queues.
    let settings = SubscriptionSettings {
        lifetime_count: u32::MAX,
        max_keep_alive_count: 10_000,
        ..SubscriptionSettings::with_interval(Duration::from_millis(100))
    };
    let req = settings.request(c.request_header());
    match c.request::<t::CreateSubscriptionResponse>(&req).await {
        Ok(r) => {
            stats.created_subscriptions.fetch_add(1, Ordering::Relaxed);
            Some(r.subscription_id)
        }
        Err(e) => {
            stats.count(e.status_code());
            None
        }
    }
}

/// Creates `items` on subscription `sub`, `per_call` at a time (built as
/// they go: an event item's filter can be large), counting the results;
/// stops at the first call where none was created.
async fn raw_items(
    c: &Client,
    sub: u32,
    mut items: impl Iterator<Item = MonitorItem>,
    per_call: usize,
    stats: &RogueStats,
    stop: &AtomicBool,
) {
    let per_call = per_call.max(1);
    for k in 0.. {
        let chunk: Vec<MonitorItem> = items.by_ref().take(per_call).collect();
        if chunk.is_empty() || stop.load(Ordering::Relaxed) {
            return;
        }
        let req = t::CreateMonitoredItemsRequest {
            request_header: c.request_header(),
            subscription_id: sub,
            timestamps_to_return: t::TimestampsToReturn::Both,
            items_to_create: Some(
                chunk
                    .iter()
                    .enumerate()
                    .map(|(i, m)| m.request(u32::try_from(k * per_call + i).unwrap_or(0)))
                    .collect(),
            ),
        };
        match c.request::<t::CreateMonitoredItemsResponse>(&req).await {
            Ok(r) => {
                let mut good = 0;
                for res in r.results.unwrap_or_default() {
                    if res.status_code.is_good() {
                        good += 1;
                    } else {
                        stats.count(res.status_code);
                    }
                }
                stats.created_items.fetch_add(good, Ordering::Relaxed);
                if good == 0 {
                    return;
                }
            }
            Err(e) => {
                stats.count(e.status_code());
                return;
            }
        }
    }
}

/// Keeps `window` Publish requests in flight on `c`, never acknowledging
/// anything, counting the values and their overflow bits.
async fn unacked_publishes(
    c: Arc<Client>,
    window: usize,
    stats: Arc<RogueStats>,
    stop: Arc<AtomicBool>,
) {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..window.max(1) {
        let (c, stats, stop) = (Arc::clone(&c), Arc::clone(&stats), Arc::clone(&stop));
        set.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = t::PublishRequest {
                    request_header: c.request_header(),
                    subscription_acknowledgements: Some(vec![]),
                };
                match c.request::<t::PublishResponse>(&req).await {
                    Ok(r) => {
                        let n = uascale_client::subscription::notifications(r.notification_message);
                        for n in n {
                            if let Notification::DataChange { value, .. } = n {
                                stats.values.fetch_add(1, Ordering::Relaxed);
                                if value.status_or_good().0 & 0x0480 == 0x0480 {
                                    stats.overflow_values.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        stats.count(e.status_code());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
}

/// A Browse of `node` one reference per page, leaving the continuation
/// point held; true while the server granted one.
async fn park_continuation_point(c: &Client, node: &NodeId, stats: &RogueStats) -> bool {
    let req = t::BrowseRequest {
        request_header: c.request_header(),
        requested_max_references_per_node: 1,
        nodes_to_browse: Some(vec![t::BrowseDescription {
            node_id: node.clone(),
            browse_direction: t::BrowseDirection::Both,
            include_subtypes: true,
            result_mask: 0x3f,
            ..Default::default()
        }]),
        ..Default::default()
    };
    match c.request::<t::BrowseResponse>(&req).await {
        Ok(r) => match r.results.and_then(|r| r.into_iter().next()) {
            Some(res) if res.status_code.is_good() => {
                let held = res
                    .continuation_point
                    .as_bytes()
                    .is_some_and(|b| !b.is_empty());
                if held {
                    stats.continuation_points.fetch_add(1, Ordering::Relaxed);
                }
                held
            }
            Some(res) => {
                stats.count(res.status_code);
                false
            }
            None => false,
        },
        Err(e) => {
            stats.count(e.status_code());
            false
        }
    }
}

/// An EventFilter of `n` select clauses (BaseEventType fields, repeated).
fn huge_filter(n: usize) -> t::EventFilter {
    let fields = [
        "EventId",
        "EventType",
        "SourceName",
        "Time",
        "Message",
        "Severity",
    ];
    let names: Vec<&str> = (0..n.max(1)).map(|i| fields[i % fields.len()]).collect();
    uascale_client::subscription::event_filter(&names, t::ContentFilter::default())
}

/// The rogue's work until `stop` (it keeps its sessions open until then).
async fn rogue(a: RoguePlan, stats: Arc<RogueStats>, stop: Arc<AtomicBool>) -> Result<(), String> {
    let mut clients = Vec::new();
    match a.variant.as_str() {
        "items" | "events" => {
            let c = open(&a.url, "uascale bench rogue").await?;
            let subs = a.subscriptions.max(1);
            let per = a.items.div_ceil(subs);
            for s in 0..subs {
                let Some(id) = raw_subscription(&c, &stats).await else {
                    break;
                };
                let n = per.min(a.items.saturating_sub(s * per));
                let nodes = a.nodes.clone();
                let queue = a.queue;
                if a.variant == "items" {
                    let items = (0..n).map(|i| {
                        MonitorItem::value(nodes[i % nodes.len()].clone())
                            .sampling(0.0)
                            .queue(queue, true)
                    });
                    raw_items(&c, id, items, PER_CALL, &stats, &stop).await;
                } else {
                    let filter = huge_filter(a.select);
                    let items = (0..n).map(|_| {
                        MonitorItem::events(NodeId::ns0(2253), filter.clone()).queue(queue, true)
                    });
                    // A few per call: each carries its whole filter.
                    let per_call = (PER_CALL / a.select.max(1)).max(1);
                    raw_items(&c, id, items, per_call, &stats, &stop).await;
                }
            }
            clients.push(c);
        }
        "subscriptions" => {
            let c = Arc::new(open(&a.url, "uascale bench rogue").await?);
            for s in 0..a.subscriptions {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Some(id) = raw_subscription(&c, &stats).await else {
                    break;
                };
                let node = a.nodes[s % a.nodes.len()].clone();
                raw_items(
                    &c,
                    id,
                    std::iter::once(MonitorItem::value(node).sampling(0.0).queue(a.queue, true)),
                    1,
                    &stats,
                    &stop,
                )
                .await;
            }
            unacked_publishes(
                Arc::clone(&c),
                a.publishes,
                Arc::clone(&stats),
                Arc::clone(&stop),
            )
            .await;
        }
        "continuation" => {
            let node = NodeId::ns0(85); // Objects
            for s in 0..a.sessions {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("uascale bench rogue {s}");
                let mut report = ConnectReport::default();
                let c = match Client::open(&a.url, ClientOptions::default(), &name, &mut report)
                    .await
                {
                    Ok(c) => c,
                    // The server stops taking sessions (a connection
                    // limit): a refusal the report shows, and the rogue
                    // keeps what it has.
                    Err(e) if s > 0 => {
                        stats.count(e.status_code());
                        eprintln!("{name}: connect: {e}; keeping the {s} sessions open");
                        break;
                    }
                    Err(e) => return Err(format!("{name}: connect: {e}")),
                };
                while !stop.load(Ordering::Relaxed)
                    && park_continuation_point(&c, &node, &stats).await
                {}
                clients.push(c);
            }
        }
        other => {
            return Err(format!(
                "--variant {other:?}: one of items, subscriptions, continuation, events"
            ))
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for c in clients {
        c.close().await;
    }
    Ok(())
}

/// What the victim saw.
struct VictimStats {
    values: AtomicU64,
    overflow_values: AtomicU64,
    lost_messages: AtomicU64,
    ended: Mutex<Option<StatusCode>>,
    lateness: Mutex<hdrhistogram::Histogram<u64>>,
}

/// The victim: one subscription of `items` items at `interval`, read
/// until `stop`.
async fn victim(
    url: String,
    nodes: Vec<NodeId>,
    items: usize,
    interval: Duration,
    stats: Arc<VictimStats>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let c = open(&url, "uascale bench rogue victim").await?;
    let mut sub = c
        .subscribe(SubscriptionSettings::with_interval(interval))
        .await
        .map_err(|e| format!("victim: subscribe: {e}"))?;
    let ms = interval.as_secs_f64() * 1000.0;
    let created = sub
        .monitor(
            (0..items)
                .map(|i| MonitorItem::value(nodes[i % nodes.len()].clone()).sampling(ms))
                .collect(),
        )
        .await
        .map_err(|e| format!("victim: monitor: {e}"))?;
    let bad: Vec<StatusCode> = created
        .iter()
        .map(|m| m.result.status_code)
        .filter(|s| !s.is_good())
        .collect();
    if let Some(s) = bad.first() {
        return Err(format!(
            "victim: {} of {items} items refused ({s})",
            bad.len()
        ));
    }
    while !stop.load(Ordering::Relaxed) {
        let ev = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await;
        match ev {
            Ok(Some(SubscriptionEvent::Notifications { notifications, .. })) => {
                let mut h = stats.lateness.lock().unwrap_or_else(|e| e.into_inner());
                for n in notifications {
                    if let Notification::DataChange { value, .. } = n {
                        stats.values.fetch_add(1, Ordering::Relaxed);
                        if value.status_or_good().0 & 0x0480 == 0x0480 {
                            stats.overflow_values.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(ts) = value.source_timestamp {
                            let _ = h.record(lateness_us(ts).max(1));
                        }
                    }
                }
            }
            Ok(Some(SubscriptionEvent::Lost { count, .. })) => {
                stats
                    .lost_messages
                    .fetch_add(u64::from(count), Ordering::Relaxed);
            }
            Ok(Some(SubscriptionEvent::Ended(s))) => {
                *stats.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
                break;
            }
            Ok(Some(_)) | Err(_) => {}
            Ok(None) => break,
        }
    }
    let _ = sub.delete().await;
    c.close().await;
    Ok(())
}

/// The rogue's parameters, owned by its task.
#[derive(Clone)]
struct RoguePlan {
    url: String,
    variant: String,
    items: usize,
    subscriptions: usize,
    queue: u32,
    sessions: usize,
    publishes: usize,
    select: usize,
    nodes: Vec<NodeId>,
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// Runs `bench rogue`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    super::common::tcp_only(
        a,
        "its clients connect with the default options, which trust no TLS \
         certificate (it takes no --pki or --trust-server)",
    )?;
    let variant = a.last("--variant").unwrap_or("items").to_owned();
    let plan = RoguePlan {
        url: a.url.clone(),
        items: a.num(
            "--items",
            if variant == "events" { 10_000 } else { 999_900 },
        )?,
        subscriptions: a.num(
            "--subscriptions",
            if variant == "subscriptions" {
                25_000
            } else {
                11
            },
        )?,
        queue: a.num("--queue", 1000)?,
        sessions: a.num("--sessions", 1000)?,
        publishes: a.num("--publishes", 20)?,
        select: a.num("--select", 1000)?,
        nodes: super::publish::nodes(a)?,
        variant: variant.clone(),
    };
    let victim_items: usize = a.num("--victim-items", 100)?;
    let victim_ms: u64 = a.num("--victim-ms", 100)?;
    let duration = a.seconds("--duration-s", 30.0)?;
    let pid = a.server_pid()?;
    let rss = || pid.and_then(sample_server).map(|s| s.rss_bytes);
    let mut progress = Progress::new();
    let stop = Arc::new(AtomicBool::new(false));
    let baseline = rss();
    let vstats = Arc::new(VictimStats {
        values: AtomicU64::new(0),
        overflow_values: AtomicU64::new(0),
        lost_messages: AtomicU64::new(0),
        ended: Mutex::new(None),
        lateness: Mutex::new(lateness_histogram()),
    });
    let interval = Duration::from_millis(victim_ms.max(1));
    let victim_task = (victim_items > 0).then(|| {
        tokio::spawn(victim(
            a.url.clone(),
            plan.nodes.clone(),
            victim_items,
            interval,
            Arc::clone(&vstats),
            Arc::clone(&stop),
        ))
    });
    let rstats = Arc::new(RogueStats::default());
    let rogue_task = tokio::spawn(rogue(plan.clone(), Arc::clone(&rstats), Arc::clone(&stop)));
    let start = Instant::now();
    let mut series = Vec::new();
    let mut peak = baseline.unwrap_or(0);
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = rss();
        if let Some(r) = r {
            peak = peak.max(r);
        }
        series.push(json!({
            "t_s": start.elapsed().as_secs_f64(),
            "rss_bytes": r,
            "rogue_items": rstats.created_items.load(Ordering::Relaxed),
            "victim_values": vstats.values.load(Ordering::Relaxed),
        }));
        progress.update(
            "rogue",
            start.elapsed().as_secs_f64() / duration.as_secs_f64(),
            &format!(
                "{} items, RSS {}",
                rstats.created_items.load(Ordering::Relaxed),
                r.map_or("-".into(), mb)
            ),
        );
        if rogue_task.is_finished() {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let end = rss();
    stop.store(true, Ordering::Relaxed);
    match rogue_task.await {
        Ok(r) => r?,
        Err(e) => return Err(format!("the rogue task failed: {e}")),
    }
    if let Some(v) = victim_task {
        match v.await {
            Ok(r) => r?,
            Err(e) => return Err(format!("the victim task failed: {e}")),
        }
    }
    progress.finish();
    let statuses: BTreeMap<String, u64> =
        named(&rstats.statuses.lock().unwrap_or_else(|e| e.into_inner()));
    let h = vstats.lateness.lock().unwrap_or_else(|e| e.into_inner());
    let q = |x: f64| (!h.is_empty()).then(|| h.value_at_quantile(x) as f64 / 1000.0);
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
    let victim_values = vstats.values.load(Ordering::Relaxed);
    let ended = *vstats.ended.lock().unwrap_or_else(|e| e.into_inner());
    let rows = vec![
        (
            "rogue".into(),
            format!(
                "variant {variant}: {} subscriptions, {} items, {} continuation points",
                rstats.created_subscriptions.load(Ordering::Relaxed),
                rstats.created_items.load(Ordering::Relaxed),
                rstats.continuation_points.load(Ordering::Relaxed)
            ),
        ),
        ("rogue refused".into(), list_counts(&statuses)),
        (
            "rogue values (overflow bit)".into(),
            format!(
                "{} ({})",
                rstats.values.load(Ordering::Relaxed),
                rstats.overflow_values.load(Ordering::Relaxed)
            ),
        ),
        (
            "server RSS baseline / peak / end".into(),
            match (baseline, end) {
                (Some(b), Some(e)) => format!("{} / {} / {}", mb(b), mb(peak), mb(e)),
                _ => "- (no --server-pid)".into(),
            },
        ),
        (
            "victim values/s (overflow bits)".into(),
            format!(
                "{:.0} ({}), {victim_items} items at {victim_ms} ms",
                victim_values as f64 / secs,
                vstats.overflow_values.load(Ordering::Relaxed)
            ),
        ),
        (
            "victim lost messages".into(),
            format!(
                "{}{}",
                vstats.lost_messages.load(Ordering::Relaxed),
                ended.map_or(String::new(), |s| format!(", subscription ended {s}"))
            ),
        ),
        (
            "victim lateness p50 / p99".into(),
            format!("{} / {}", show(q(0.5)), show(q(0.99))),
        ),
    ];
    let json = json!({
        "bench": "rogue",
        "url": a.url,
        "variant": variant,
        "seconds": secs,
        "rogue": {
            "subscriptions": rstats.created_subscriptions.load(Ordering::Relaxed),
            "items": rstats.created_items.load(Ordering::Relaxed),
            "continuation_points": rstats.continuation_points.load(Ordering::Relaxed),
            "refused": statuses,
            "values": rstats.values.load(Ordering::Relaxed),
            "overflow_values": rstats.overflow_values.load(Ordering::Relaxed),
        },
        "server": {"rss_baseline_bytes": baseline, "rss_peak_bytes": peak, "rss_end_bytes": end},
        "victim": {
            "items": victim_items,
            "interval_ms": victim_ms,
            "values": victim_values,
            "overflow_values": vstats.overflow_values.load(Ordering::Relaxed),
            "lost_messages": vstats.lost_messages.load(Ordering::Relaxed),
            "ended": ended.map(|s| s.to_string()),
            "lateness_p50_ms": q(0.5),
            "lateness_p99_ms": q(0.99),
        },
        "series": series,
    });
    Ok(Outcome {
        title: format!("bench rogue against {}", a.url),
        rows,
        json,
        charts: Vec::new(),
    })
}
