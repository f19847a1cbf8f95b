//! `bench sessions`: N sessions, each on its own connection, with the
//! chosen security policy, mode and identity, at most C establishing at
//! once (the client's [`ConnectGate`]), retried with the §7 backoff on
//! failures, each with one subscription and one monitored item (unless
//! `--subscribe off`), held - counting the sessions notified while held -
//! and closed; sampled once a second.
//!
//! Each session is set up by [`establish`]; its failures (of the session
//! or of its subscription) are counted alike. With `--processes` the
//! sessions are established by child processes (`workers.rs`).

pub(super) mod workers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use uascale_client::{
    Backoff, Client, ClientError, ClientOptions, ConnectGate, MonitorItem, Notification,
    Subscription, SubscriptionEvent,
};
use uascale_types::NodeId;

use super::common::client_options;
use super::progress::Progress;
use super::report::{Chart, Line};
use super::series::SessionPoint;
use super::{
    count_status, list_counts, named, sample_server, source_ips, Args, Outcome, ServerSample,
    StatusCounts,
};

/// The options `bench sessions` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--sessions",
    "--concurrency",
    "--hold-s",
    "--source-ips",
    "--max-retries",
    "--server-pid",
    "--security",
    "--pki",
    "--trust-server",
    "--user",
    "--password",
    "--cert",
    "--key",
    "--subscribe",
    "--node",
    "--publishing-ms",
    "--processes",
];

/// What the sessions of this process (or, in the parent of
/// `--processes`, of all its children, as they report it) have counted.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) established: AtomicU64,
    pub(super) busy: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) failures: Mutex<StatusCounts>,
    /// Sessions that got a data change while held.
    pub(super) notified: AtomicU64,
    /// Data changes received, all sessions, all phases.
    pub(super) data_changes: AtomicU64,
    /// Set when the hold begins.
    pub(super) holding: std::sync::atomic::AtomicBool,
}

/// The subscription each session makes.
#[derive(Clone)]
struct Watch {
    node: NodeId,
    publishing: std::time::Duration,
}

/// What establishing the sessions takes (the same in a worker process).
#[derive(Clone)]
pub(super) struct Setup {
    url: String,
    options: ClientOptions,
    sources: Vec<std::net::IpAddr>,
    watch: Option<Watch>,
    /// `--subscribe after`: the sessions are established bare, and all
    /// subscribe once every one is up.
    subscribe_after: bool,
    max_retries: u32,
}

impl Setup {
    /// The setup the command line asks for.
    pub(super) async fn from_args(a: &Args) -> Result<Setup, String> {
        let mode = a.last("--subscribe").unwrap_or("on");
        let watch = match mode {
            "on" | "after" => Some(Watch {
                node: a
                    .last("--node")
                    .unwrap_or("i=2258")
                    .parse()
                    .map_err(|e| format!("--node: {e}"))?,
                publishing: a.seconds("--publishing-ms", 1000.0)? / 1000,
            }),
            "off" => None,
            other => return Err(format!("--subscribe {other:?}: give on, off or after")),
        };
        Ok(Setup {
            url: a.url.clone(),
            options: client_options(a).await?,
            sources: source_ips(a)?,
            watch,
            subscribe_after: mode == "after",
            max_retries: a.num("--max-retries", 4)?,
        })
    }
}

/// Establishes sessions `indices` (each retried with the §7 backoff while
/// the failure is transient), at most as many at once as `gate` lets in,
/// counting into `counters`; the task ends with the sessions established.
pub(super) fn start_sessions(
    setup: &Setup,
    indices: Vec<usize>,
    gate: &ConnectGate,
    counters: &Arc<Counters>,
) -> tokio::task::JoinHandle<Vec<Client>> {
    let mut tasks = Vec::with_capacity(indices.len());
    for i in indices {
        let (gate, counters, url) = (gate.clone(), Arc::clone(counters), setup.url.clone());
        // Subscribing after: established bare here.
        let watch = setup.watch.clone().filter(|_| !setup.subscribe_after);
        let max_retries = setup.max_retries;
        let options = ClientOptions {
            local_addr: setup.sources.get(i % setup.sources.len().max(1)).copied(),
            ..setup.options.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut backoff = Backoff::new(0x5eed_0000 + i as u64);
            // A busy server is retried with the §7 backoff.
            for attempt in 0..=max_retries {
                let turn = gate.enter().await;
                let result = establish(&url, options.clone(), i, watch.as_ref()).await;
                drop(turn);
                match result {
                    Ok((c, sub)) => {
                        counters.established.fetch_add(1, Ordering::Relaxed);
                        if let Some(sub) = sub {
                            tokio::spawn(watch_notifications(sub, Arc::clone(&counters)));
                        }
                        return Some(c);
                    }
                    Err(e) => {
                        let status = e.status_code();
                        if uascale_client::backoff::is_busy_signal(status) {
                            counters.busy.fetch_add(1, Ordering::Relaxed);
                        }
                        // Only transient statuses are worth another try:
                        // an untrusted certificate or a refused user fails
                        // the same way again (§7).
                        let transient = matches!(
                            e,
                            uascale_client::ClientError::Io(_)
                                | uascale_client::ClientError::Timeout
                        ) || uascale_client::backoff::is_transient(status);
                        if attempt == max_retries || !transient {
                            counters.failed.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut f) = counters.failures.lock() {
                                count_status(&mut f, status, 1);
                            }
                            return None;
                        }
                        counters.retries.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(backoff.next_delay(status, e.retry_after_ms())).await;
                    }
                }
            }
            None
        }));
    }
    tokio::spawn(async move {
        let mut clients = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(Some(c)) = t.await {
                clients.push(c);
            }
        }
        clients
    })
}

/// `--subscribe after`: each established session subscribes (as many at
/// once as `gate` lets in); a failure is counted like an establishment
/// failure and leaves the session unsubscribed. Returns the sessions.
async fn subscribe_all(
    clients: Vec<Client>,
    watch: &Watch,
    gate: &ConnectGate,
    counters: &Arc<Counters>,
) -> Vec<Client> {
    let mut subscribing = tokio::task::JoinSet::new();
    for c in clients {
        let (gate, counters, w) = (gate.clone(), Arc::clone(counters), watch.clone());
        subscribing.spawn(async move {
            let turn = gate.enter().await;
            let item = MonitorItem::value(w.node.clone());
            let result = super::subscribe_one(&c, w.publishing, item).await;
            drop(turn);
            match result {
                Ok(sub) => {
                    tokio::spawn(watch_notifications(sub, Arc::clone(&counters)));
                }
                Err(e) => {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut f) = counters.failures.lock() {
                        count_status(&mut f, e.status_code(), 1);
                    }
                }
            }
            c
        });
    }
    let mut clients = Vec::new();
    while let Some(joined) = subscribing.join_next().await {
        if let Ok(c) = joined {
            clients.push(c);
        }
    }
    clients
}

/// Reads once through each session (is it still alive?) and closes it, as
/// many at once as `gate` lets in; returns how many answered.
pub(super) async fn close_sessions(clients: Vec<Client>, gate: &ConnectGate) -> u64 {
    let mut alive = 0;
    let mut closing = tokio::task::JoinSet::new();
    for c in clients {
        let gate = gate.clone();
        closing.spawn(async move {
            let _turn = gate.enter().await;
            let ok = c.read_values(&[NodeId::ns0(2258)]).await.is_ok();
            c.close().await;
            ok
        });
    }
    while let Some(r) = closing.join_next().await {
        if let Ok(true) = r {
            alive += 1;
        }
    }
    alive
}

/// One session, ready for the hold: connected, created and activated, and
/// with its subscription and item when `watch` says so.
async fn establish(
    url: &str,
    options: ClientOptions,
    i: usize,
    watch: Option<&Watch>,
) -> Result<(Client, Option<Subscription>), ClientError> {
    let c = Client::connect(url, options).await?;
    let subscribed = async {
        c.create_session(&format!("bench {i}")).await?;
        let Some(w) = watch else {
            return Ok(None);
        };
        super::subscribe_one(&c, w.publishing, MonitorItem::value(w.node.clone()))
            .await
            .map(Some)
    }
    .await;
    match subscribed {
        Ok(sub) => Ok((c, sub)),
        Err(e) => {
            c.close().await;
            Err(e)
        }
    }
}

/// Counts the session once it gets a data change while held; drains its
/// stream until the client closes.
async fn watch_notifications(mut sub: Subscription, counters: Arc<Counters>) {
    let mut counted = false;
    while let Some(event) = sub.recv().await {
        let SubscriptionEvent::Notifications { notifications, .. } = event else {
            continue;
        };
        let changes = notifications
            .iter()
            .filter(|n| matches!(n, Notification::DataChange { .. }))
            .count() as u64;
        counters.data_changes.fetch_add(changes, Ordering::Relaxed);
        if !counted && changes > 0 && counters.holding.load(Ordering::Relaxed) {
            counted = true;
            counters.notified.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Samples the counters into a point of `phase`.
struct Sampler {
    start: Instant,
    prev_t: Instant,
    prev_established: u64,
    prev_changes: u64,
    pid: Option<u32>,
    prev_server: Option<ServerSample>,
    series: Vec<SessionPoint>,
}

impl Sampler {
    fn sample(&mut self, phase: &'static str, c: &Counters) -> &SessionPoint {
        let at = Instant::now();
        let secs = at.duration_since(self.prev_t).as_secs_f64();
        let established = c.established.load(Ordering::Relaxed);
        let changes = c.data_changes.load(Ordering::Relaxed);
        let server = self.pid.and_then(sample_server);
        let cores = match (self.prev_server, server) {
            (Some(a), Some(b)) if secs > 0.0 => {
                Some(b.cpu.saturating_sub(a.cpu).as_secs_f64() / secs)
            }
            _ => None,
        };
        self.series.push(SessionPoint {
            t_s: at.duration_since(self.start).as_secs_f64(),
            phase,
            established,
            established_per_s: (established - self.prev_established) as f64 / secs.max(1e-9),
            interval_s: secs,
            data_changes_per_s: (changes - self.prev_changes) as f64 / secs.max(1e-9),
            failures: c.failed.load(Ordering::Relaxed),
            busy_answers: c.busy.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            server_cores_busy: cores,
            server_rss_bytes: server.map(|s| s.rss_bytes),
        });
        self.prev_t = at;
        self.prev_established = established;
        self.prev_changes = changes;
        self.prev_server = server;
        self.series.last().expect("just pushed")
    }
}

/// The establishment CPU per session with the publish load subtracted.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Separated {
    /// Over the whole ramp.
    all_ms: f64,
    /// Over the intervals that established the first half of the sessions
    /// (`None` when none did: a ramp shorter than a sample interval).
    first_half_ms: Option<f64>,
    /// Over the rest.
    second_half_ms: Option<f64>,
}

/// Each `establish` interval's server CPU less `steady` (CPU seconds per
/// subscribed session-second) times the sessions up in it (the mean of its
/// start and end counts), summed per half of the sessions and divided by
/// the sessions each half established. `None` without CPU samples.
fn establishment_cpu(series: &[SessionPoint], steady: f64) -> Option<Separated> {
    let ramp: Vec<&SessionPoint> = series.iter().filter(|p| p.phase == "establish").collect();
    let total = ramp.last()?.established;
    if total == 0 {
        return None;
    }
    let mut halves = [(0.0f64, 0u64); 2];
    let mut before = 0u64;
    for p in &ramp {
        let cpu = p.server_cores_busy? * p.interval_s;
        let new = p.established.saturating_sub(before);
        let up = (before + p.established) as f64 / 2.0;
        let own = (cpu - up * steady * p.interval_s).max(0.0);
        let half = usize::from(before * 2 >= total);
        halves[half].0 += own;
        halves[half].1 += new;
        before = p.established;
    }
    let ms = |(cpu, n): (f64, u64)| (n > 0).then(|| cpu * 1e3 / n as f64);
    Some(Separated {
        all_ms: (halves[0].0 + halves[1].0) * 1e3 / total as f64,
        first_half_ms: ms(halves[0]),
        second_half_ms: ms(halves[1]),
    })
}

/// Runs `bench sessions`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    let n: usize = a.num("--sessions", 100)?;
    let concurrency: usize = a.num("--concurrency", 50)?;
    let hold = a.seconds("--hold-s", 5.0)?;
    let processes: usize = a.num("--processes", 1)?;
    let pid = a.server_pid()?;
    let every = a.interval()?;
    if n == 0 || concurrency == 0 {
        return Err("--sessions and --concurrency must be > 0".into());
    }
    if processes == 0 || processes > n {
        return Err(format!("--processes must be 1 to --sessions ({n})"));
    }
    let setup = Setup::from_args(a).await?;
    if setup.subscribe_after && processes > 1 {
        return Err("--subscribe after works with one bench process (no --processes)".into());
    }
    let watch = setup.watch.clone();
    // The client draws a nonce per session; the random generator's first
    // use initialises it (40-70 ms here), a one-off cost of the process
    // that would otherwise be counted in the establishment time.
    let _ = uascale_crypto::policy::SecurityPolicy::Basic256Sha256.random_nonce();
    let counters = Arc::new(Counters::default());
    let gate = ConnectGate::new(concurrency);
    // With --processes the children establish the sessions (C split
    // between them) and report their counts; this process samples the
    // server and tells them when to hold and to close.
    let mut workers = if processes > 1 {
        Some(workers::Children::spawn(&a.raw, processes, Arc::clone(&counters)).await?)
    } else {
        None
    };
    let before = pid.and_then(sample_server);
    let started = Instant::now();
    if let Some(w) = &mut workers {
        w.say("go");
    }
    let mut sampler = Sampler {
        start: started,
        prev_t: started,
        prev_established: 0,
        prev_changes: 0,
        pid,
        prev_server: before,
        series: Vec::new(),
    };
    let mut joiner = match &workers {
        None => start_sessions(&setup, (0..n).collect(), &gate, &counters),
        Some(w) => {
            let done = w.all_established();
            tokio::spawn(async move {
                done.await;
                Vec::new()
            })
        }
    };
    let mut progress = Progress::new();
    let mut next = started + every;
    let clients = loop {
        tokio::select! {
            joined = &mut joiner => break joined.map_err(|e| format!("the sessions task failed: {e}"))?,
            () = tokio::time::sleep_until(next.into()) => {
                next += every;
                let p = sampler.sample("establish", &counters);
                let done = p.established + p.failures;
                progress.update(
                    "establish",
                    done as f64 / n as f64,
                    &format!("{}/{n} established, {} failed, {} busy answers", p.established, p.failures, p.busy_answers),
                );
            }
        }
    };
    let establish_time = started.elapsed();
    let established = counters.established.load(Ordering::Relaxed);
    sampler.sample("establish", &counters);
    let at_established = pid.and_then(sample_server);
    // --subscribe after: every session up, now each subscribes.
    let (clients, subscribe_time) = match (&watch, setup.subscribe_after) {
        (Some(w), true) => {
            let t = Instant::now();
            let clients = subscribe_all(clients, w, &gate, &counters).await;
            sampler.sample("subscribe", &counters);
            (clients, Some(t.elapsed()))
        }
        _ => (clients, None),
    };
    let at_hold = pid.and_then(sample_server);
    counters.holding.store(true, Ordering::Relaxed);
    if let Some(w) = &mut workers {
        w.say("hold");
    }
    let hold_start = Instant::now();
    let hold_end = hold_start + hold;
    while Instant::now() < hold_end {
        let next = (Instant::now() + every).min(hold_end);
        tokio::time::sleep_until(next.into()).await;
        sampler.sample("hold", &counters);
        progress.update(
            "hold",
            hold_start.elapsed().as_secs_f64() / hold.as_secs_f64().max(1e-9),
            &format!(
                "{established} sessions held, {} notified",
                counters.notified.load(Ordering::Relaxed)
            ),
        );
    }
    let held = pid.and_then(sample_server);
    let notified = counters.notified.load(Ordering::Relaxed);
    progress.finish();
    // Each session still answers after the hold; then all are closed, C at
    // a time.
    let alive = match &mut workers {
        None => close_sessions(clients, &gate).await,
        Some(w) => w.close().await,
    };
    sampler.sample("close", &counters);
    let failures = counters
        .failures
        .lock()
        .map(|f| named(&f))
        .unwrap_or_default();
    let per_session = match (before, at_hold, held) {
        (Some(b), Some(h), Some(e)) if established > 0 => Some((
            h.cpu.saturating_sub(b.cpu).as_secs_f64() * 1e3 / established as f64,
            (h.rss_bytes.saturating_sub(b.rss_bytes)) as f64 / established as f64,
            e.cpu.saturating_sub(h.cpu).as_secs_f64() / hold.as_secs_f64().max(1e-9),
            // At the end of the hold: with what the held sessions
            // allocated since (memory freed meanwhile shows only if the
            // server's allocator gave it back; glibc's keeps it).
            (e.rss_bytes.saturating_sub(b.rss_bytes)) as f64 / established as f64,
        )),
        _ => None,
    };
    // --subscribe after: the server's CPU per session while the sessions
    // were established (no subscription up yet), and while they subscribed.
    let split = match (subscribe_time, before, at_established, at_hold) {
        (Some(_), Some(b), Some(m), Some(h)) if established > 0 => Some((
            m.cpu.saturating_sub(b.cpu).as_secs_f64() * 1e3 / established as f64,
            h.cpu.saturating_sub(m.cpu).as_secs_f64() * 1e3 / established as f64,
        )),
        _ => None,
    };
    // The establishment CPU with the publish load of the sessions already
    // up taken out: each establishing interval's server CPU, less the
    // steady cost per subscribed session-second measured while holding
    // times the sessions up in it.
    let steady_per_session = per_session
        .filter(|_| watch.is_some() && established > 0)
        .map(|p| p.2 / established as f64);
    // (Not with --subscribe after: its ramp carried no publish load.)
    let separated = steady_per_session
        .filter(|_| !setup.subscribe_after)
        .and_then(|c| establishment_cpu(&sampler.series, c));
    let rate = established as f64 / establish_time.as_secs_f64().max(1e-9);
    let busy = counters.busy.load(Ordering::Relaxed);
    let retries = counters.retries.load(Ordering::Relaxed);
    let series = sampler.series;
    let json = json!({
        "bench": "sessions",
        "command": a.command_line(),
        "url": a.url,
        "sessions": n,
        "concurrency": concurrency,
        "processes": processes,
        "hold_s": hold.as_secs_f64(),
        "established": established,
        "establish_s": establish_time.as_secs_f64(),
        "sessions_per_s": rate,
        "busy_answers": busy,
        "retries": retries,
        "failures": failures,
        "alive_after_hold": alive,
        "security": a.last("--security").unwrap_or("None"),
        "subscribed": watch.is_some(),
        "subscribe_after": setup.subscribe_after,
        "subscribe_s": subscribe_time.map(|t| t.as_secs_f64()),
        "establishment_ms_per_session_before_subscribing": split.map(|s| s.0),
        "subscription_ms_per_session": split.map(|s| s.1),
        "notified": watch.as_ref().map(|_| notified),
        "all_notified": watch.as_ref().map(|_| established > 0 && notified == established),
        "server_cpu_ms_per_session": per_session.map(|p| p.0),
        "server_bytes_per_session": per_session.map(|p| p.1),
        "server_bytes_per_session_held": per_session.map(|p| p.3),
        "server_cores_busy_while_holding": per_session.map(|p| p.2),
        "server_us_per_session_second_held": steady_per_session.map(|c| c * 1e6),
        "establishment_ms_per_session_publish_subtracted": separated.map(|s| s.all_ms),
        "establishment_ms_per_session_first_half": separated.and_then(|s| s.first_half_ms),
        "establishment_ms_per_session_second_half": separated.and_then(|s| s.second_half_ms),
        "series": series,
    });
    let mut rows = vec![
        (
            "established".to_owned(),
            format!(
                "{established} of {n} in {:.2} s ({rate:.0}/s)",
                establish_time.as_secs_f64()
            ),
        ),
        (
            "busy answers".to_owned(),
            format!("{busy}, retries {retries}"),
        ),
        ("failures".to_owned(), list_counts(&failures)),
        ("alive at end".to_owned(), alive.to_string()),
    ];
    if watch.is_some() {
        rows.push((
            "notified".to_owned(),
            format!(
                "{notified} of {established} sessions got a data change while held{}",
                if established > 0 && notified == established {
                    " (all)"
                } else {
                    ""
                }
            ),
        ));
    }
    if let Some((ms, bytes, cores, held_bytes)) = per_session {
        rows.push((
            "server".to_owned(),
            format!(
                "{ms:.3} ms CPU and {:.1} KB per session ({:.1} KB when the hold ended); {cores:.3} cores busy while holding",
                bytes / 1024.0,
                held_bytes / 1024.0
            ),
        ));
    }
    if let (Some((est, sub)), Some(t)) = (split, subscribe_time) {
        rows.push((
            "subscribed after".to_owned(),
            format!(
                "{est:.3} ms per session establishing (no subscription up yet), then {sub:.3} ms per session subscribing ({:.2} s for all)",
                t.as_secs_f64()
            ),
        ));
    }
    if let (Some(c), Some(sep)) = (steady_per_session, separated) {
        rows.push((
            "establishment CPU".to_owned(),
            format!(
                "{:.3} ms per session with the publish load taken out ({:.1} us per subscribed session-second while holding); first half of the sessions {}, second half {}",
                sep.all_ms,
                c * 1e6,
                sep.first_half_ms.map_or("-".into(), |v| format!("{v:.3} ms")),
                sep.second_half_ms.map_or("-".into(), |v| format!("{v:.3} ms")),
            ),
        ));
    }
    let xy = |f: &dyn Fn(&SessionPoint) -> f64| -> Vec<(f64, f64)> {
        series.iter().map(|p| (p.t_s, f(p))).collect()
    };
    let xy_opt = |f: &dyn Fn(&SessionPoint) -> Option<f64>| -> Vec<(f64, f64)> {
        series
            .iter()
            .filter_map(|p| f(p).map(|v| (p.t_s, v)))
            .collect()
    };
    let shade = Some((0.0, establish_time.as_secs_f64(), "establishing".to_owned()));
    let charts = vec![
        Chart {
            title: "Sessions established".into(),
            y_label: "sessions".into(),
            lines: vec![
                Line {
                    key: "established".into(),
                    label: "established".into(),
                    points: xy(&|p| p.established as f64),
                },
                Line {
                    key: "failures".into(),
                    label: "failed".into(),
                    points: xy(&|p| p.failures as f64),
                },
                Line {
                    key: "busy_answers".into(),
                    label: "busy answers".into(),
                    points: xy(&|p| p.busy_answers as f64),
                },
            ],
            shade: shade.clone(),
        },
        Chart {
            title: "Establishment rate".into(),
            y_label: "sessions/s".into(),
            lines: vec![Line {
                key: "established_per_s".into(),
                label: "established/s".into(),
                points: xy(&|p| p.established_per_s),
            }],
            shade: shade.clone(),
        },
        Chart {
            title: "Server CPU".into(),
            y_label: "cores busy".into(),
            lines: vec![Line {
                key: "server_cores_busy".into(),
                label: "server cores busy".into(),
                points: xy_opt(&|p| p.server_cores_busy),
            }],
            shade: shade.clone(),
        },
        Chart {
            title: "Server memory".into(),
            y_label: "MB".into(),
            lines: vec![Line {
                key: "server_rss_bytes".into(),
                label: "server RSS".into(),
                points: xy_opt(&|p| p.server_rss_bytes.map(|b| b as f64 / 1e6)),
            }],
            shade: shade.clone(),
        },
        Chart {
            title: "Notifications".into(),
            y_label: "data changes/s".into(),
            lines: vec![Line {
                key: "data_changes_per_s".into(),
                label: "data changes received/s".into(),
                points: xy(&|p| p.data_changes_per_s),
            }],
            shade,
        },
    ];
    Ok(Outcome {
        title: format!(
            "bench sessions  {}  {n} sessions, {concurrency} at a time, held {:.1} s",
            a.url,
            hold.as_secs_f64()
        ),
        rows,
        json,
        charts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(phase: &'static str, established: u64, cores: f64) -> SessionPoint {
        SessionPoint {
            t_s: 0.0,
            phase,
            established,
            established_per_s: 0.0,
            interval_s: 1.0,
            data_changes_per_s: 0.0,
            failures: 0,
            busy_answers: 0,
            retries: 0,
            server_cores_busy: Some(cores),
            server_rss_bytes: None,
        }
    }

    /// 100 sessions a second, 1 ms of CPU each, plus 10 us per session up
    /// per second: the subtraction gives back 1 ms in both halves, where
    /// the raw figure grows with the sessions up.
    #[test]
    fn the_publish_load_is_taken_out_of_the_establishment_cpu() {
        let steady = 10e-6;
        let mut series = Vec::new();
        for i in 1..=10u64 {
            let up = (i * 100 + (i - 1) * 100) as f64 / 2.0;
            series.push(point("establish", i * 100, 0.1 + up * steady));
        }
        series.push(point("hold", 1000, 1000.0 * steady));
        let s = establishment_cpu(&series, steady).unwrap();
        assert!((s.all_ms - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s.first_half_ms.unwrap() - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s.second_half_ms.unwrap() - 1.0).abs() < 1e-9, "{s:?}");
        // Without CPU samples there is nothing to separate.
        let mut blind = series.clone();
        blind[0].server_cores_busy = None;
        assert_eq!(establishment_cpu(&blind, steady), None);
    }
}
