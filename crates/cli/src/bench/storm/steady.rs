//! `--steady N`: sessions established before the storm, each with one
//! subscription of one monitored item, whose publish lateness (arrival
//! minus the value's source timestamp, as `bench publish` measures it) is
//! recorded per phase: before, during and after the storm.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::json;
use uascale_client::{
    Client, ClientError, ClientOptions, ConnectGate, ConnectReport, MonitorItem, Notification,
    Subscription, SubscriptionEvent,
};
use uascale_types::NodeId;

use crate::bench::series::{lateness_histogram, lateness_us};

/// Setting up; nothing is recorded.
pub const SETUP: u8 = 0;
/// The window before the storm.
pub const BEFORE: u8 = 1;
/// From the first storm client's start to the last one's end.
pub const STORM: u8 = 2;
/// The window after the storm.
pub const AFTER: u8 = 3;
/// Closing; nothing is recorded.
pub const DONE: u8 = 4;

/// The measured phases' names, in order.
pub const PHASES: [&str; 3] = ["before", "storm", "after"];

/// Lateness of the current interval and of each measured phase.
pub struct Lateness {
    /// Since the last sample.
    pub interval: Histogram<u64>,
    /// Per phase (`PHASES`).
    pub phases: [Histogram<u64>; 3],
}

/// The steady sessions.
pub struct Steady {
    clients: Vec<Client>,
    /// Lateness, recorded by the sessions' tasks.
    pub lateness: Arc<Mutex<Lateness>>,
    /// The phase now (`SETUP` .. `DONE`), set by the run.
    pub phase: Arc<AtomicU8>,
    /// Messages lost (gaps Republish could not fill) while measured.
    pub lost: Arc<AtomicU64>,
    /// Sessions asked for.
    pub wanted: usize,
    /// Failures to set one up, by status.
    pub failures: std::collections::BTreeMap<String, u64>,
}

/// One session with its subscription on i=2258 (CurrentTime), sampled at
/// the publishing interval.
async fn set_up(
    url: &str,
    options: ClientOptions,
    i: usize,
    publishing: Duration,
) -> Result<(Client, Subscription), ClientError> {
    let mut report = ConnectReport::default();
    let c = Client::open(url, options, &format!("steady {i}"), &mut report).await?;
    let item = MonitorItem::value(NodeId::ns0(2258)).sampling(publishing.as_secs_f64() * 1000.0);
    let subscribed = super::super::subscribe_one(&c, publishing, item).await;
    match subscribed {
        Ok(sub) => Ok((c, sub)),
        Err(e) => {
            c.close().await;
            Err(e)
        }
    }
}

/// Records the lateness of every data change until the stream ends.
async fn watch(
    mut sub: Subscription,
    lateness: Arc<Mutex<Lateness>>,
    phase: Arc<AtomicU8>,
    lost: Arc<AtomicU64>,
) {
    while let Some(event) = sub.recv().await {
        let now = phase.load(Ordering::Relaxed);
        if !(BEFORE..=AFTER).contains(&now) {
            continue;
        }
        match event {
            SubscriptionEvent::Notifications { notifications, .. } => {
                let late: Vec<u64> = notifications
                    .iter()
                    .filter_map(|n| match n {
                        Notification::DataChange { value, .. } => value
                            .source_timestamp
                            .or(value.server_timestamp)
                            .map(|t| lateness_us(t).max(1)),
                        _ => None,
                    })
                    .collect();
                if let Ok(mut l) = lateness.lock() {
                    for us in late {
                        l.interval.saturating_record(us);
                        l.phases[usize::from(now - BEFORE)].saturating_record(us);
                    }
                }
            }
            SubscriptionEvent::Lost { count, .. } => {
                lost.fetch_add(u64::from(count), Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

impl Steady {
    /// Opens `n` sessions (`gate` at once, with the §7 backoff) and their
    /// subscriptions; those that fail are counted, not retried further.
    pub async fn start(
        url: &str,
        options: &ClientOptions,
        n: usize,
        publishing: Duration,
        gate: usize,
    ) -> Steady {
        let lateness = Arc::new(Mutex::new(Lateness {
            interval: lateness_histogram(),
            phases: [
                lateness_histogram(),
                lateness_histogram(),
                lateness_histogram(),
            ],
        }));
        let phase = Arc::new(AtomicU8::new(SETUP));
        let lost = Arc::new(AtomicU64::new(0));
        let gate = ConnectGate::new(gate);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let options = ClientOptions {
                connect_gate: Some(gate.clone()),
                ..options.clone()
            };
            let url = url.to_owned();
            set.spawn(async move { set_up(&url, options, i, publishing).await });
        }
        let mut clients = Vec::with_capacity(n);
        let mut failures = std::collections::BTreeMap::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok((c, sub))) => {
                    clients.push(c);
                    tokio::spawn(watch(
                        sub,
                        Arc::clone(&lateness),
                        Arc::clone(&phase),
                        Arc::clone(&lost),
                    ));
                }
                Ok(Err(e)) => *failures.entry(e.status_code().to_string()).or_insert(0) += 1,
                Err(_) => *failures.entry("task failed".to_owned()).or_insert(0) += 1,
            }
        }
        Steady {
            clients,
            lateness,
            phase,
            lost,
            wanted: n,
            failures,
        }
    }

    /// Sessions set up.
    pub fn established(&self) -> usize {
        self.clients.len()
    }

    /// Sessions whose channel is open now.
    pub fn connected(&self) -> usize {
        self.clients.iter().filter(|c| c.is_connected()).count()
    }

    /// The interval's p50 and p99 in ms (`None` without data), and a fresh
    /// interval.
    pub fn take_interval(&self) -> (Option<f64>, Option<f64>) {
        let Ok(mut l) = self.lateness.lock() else {
            return (None, None);
        };
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

    /// Per phase: notifications counted, p50, p99 and max in ms.
    pub fn phases_json(&self) -> serde_json::Value {
        let Ok(l) = self.lateness.lock() else {
            return serde_json::Value::Null;
        };
        let mut out = serde_json::Map::new();
        for (name, h) in PHASES.iter().zip(&l.phases) {
            let q = |x: f64| (!h.is_empty()).then(|| h.value_at_quantile(x) as f64 / 1000.0);
            out.insert(
                (*name).to_owned(),
                json!({
                    "notifications": h.len(),
                    "p50": q(0.5),
                    "p99": q(0.99),
                    "max": (!h.is_empty()).then(|| h.max() as f64 / 1000.0),
                }),
            );
        }
        out.into()
    }

    /// Closes every session.
    pub async fn close(self) {
        self.phase.store(DONE, Ordering::SeqCst);
        let mut set = tokio::task::JoinSet::new();
        for c in self.clients {
            set.spawn(async move { c.close().await });
        }
        while set.join_next().await.is_some() {}
    }
}
