//! `bench storm`: N clients connect at once. Naive ones retry at once with
//! a new connection and session after any failure or a fixed timeout;
//! cooperative ones are the shipped client (`Client::open`: the §7
//! backoff, hints as a lower bound, a shared connect gate, only transient
//! statuses retried, bounded attempts). Counted: attempts, failures by
//! status and stage, busy answers by stage with and without a retry-after
//! hint, the hints, time to establish, who is still unestablished, the
//! sessions left behind (by the clients' count and the server's own
//! diagnostics), and - with `--steady` - the publish lateness of sessions
//! established before the storm, before, during and after it.
//!
//! The run: the diagnostics client and the steady sessions are set up;
//! the storm's workers (this process, or `--processes` children, see
//! [`worker`]) get ready; `before` (`--before-s`), `storm` (from the start
//! until every client has established, given up or reached
//! `--duration-s`), `after` (`--after-s`) are sampled every
//! `--interval-s`; the server's counters are read again, and everything is
//! closed.

mod clients;
mod diag;
mod steady;
mod tally;
pub(super) mod worker;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use uascale_client::{Backoff, Client, ClientError, ClientOptions, ConnectReport};

use super::progress::Progress;
use super::report::{Chart, Line};
use super::{list_counts, sample_server, Args, Outcome, ServerSample};
use clients::{close_all, storm, Plan};
use steady::Steady;
use tally::{quantile, Behaviour, Delta, Part};

pub use worker::{child, WORKER_ENV};

/// The options `bench storm` takes (besides `--json`, `--report` and
/// `--interval-s`).
pub const FLAGS: &[&str] = &[
    "--clients",
    "--processes",
    "--source-ips",
    "--behaviour",
    "--gate",
    "--split-behaviours",
    "--max-retries",
    "--timeout-s",
    "--duration-s",
    "--steady",
    "--publishing-ms",
    "--before-s",
    "--after-s",
    "--server-pid",
    "--security",
    "--pki",
    "--trust-server",
    "--user",
    "--password",
    "--cert",
    "--key",
];

/// One sample of the run; counts are totals since the start unless the
/// name says per second.
#[derive(Debug, Clone, Serialize)]
struct StormPoint {
    /// Seconds since the `before` window began.
    t_s: f64,
    /// `before`, `storm` or `after`.
    phase: &'static str,
    /// Storm clients with an activated session.
    established: u64,
    /// Storm clients without one.
    unestablished: u64,
    established_per_s: f64,
    /// Attempts that ended.
    attempts: u64,
    attempts_per_s: f64,
    /// Failed attempts.
    failures: u64,
    retries: u64,
    busy_answers: u64,
    busy_without_hint: u64,
    busy_per_s: f64,
    /// Busy answers while connecting (ERR BadTcpServerTooBusy) per second.
    busy_connect_per_s: f64,
    /// At CreateSession/ActivateSession (ServiceFault BadServerTooBusy).
    busy_session_per_s: f64,
    /// BadTooManySessions.
    busy_too_many_sessions_per_s: f64,
    /// The steady sessions' lateness in the interval (null without data).
    steady_lateness_p50_ms: Option<f64>,
    steady_lateness_p99_ms: Option<f64>,
    /// The server's CPU time over the interval / its length (with its PID).
    server_cores_busy: Option<f64>,
    /// The server's resident memory at the end of the interval.
    server_rss_bytes: Option<u64>,
}

/// Samples the counts into the series and the progress line.
struct Sampler {
    start: Instant,
    prev_t: Instant,
    pid: Option<u32>,
    prev_server: Option<ServerSample>,
    pending: Arc<Mutex<Delta>>,
    total: Delta,
    clients: usize,
    series: Vec<StormPoint>,
    rss_peak: Option<u64>,
    progress: Progress,
}

impl Sampler {
    /// Moves what the clients counted since the last call into the total;
    /// returns it.
    fn take(&mut self) -> Part {
        let d = match self.pending.lock() {
            Ok(mut d) => std::mem::take(&mut *d),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        let part = d.total();
        self.total.absorb(d);
        part
    }

    /// One point of `phase`; the progress shows `fraction` done, or
    /// without it the share of clients done.
    fn sample(&mut self, phase: &'static str, steady: Option<&Steady>, fraction: Option<f64>) {
        let at = Instant::now();
        let secs = at.duration_since(self.prev_t).as_secs_f64().max(1e-9);
        let d = self.take();
        let t = self.total.total();
        let fraction = fraction.unwrap_or_else(|| {
            (t.established + t.gave_up_count() + t.cut_off) as f64 / self.clients.max(1) as f64
        });
        let server = self.pid.and_then(sample_server);
        let cores = match (self.prev_server, server) {
            (Some(a), Some(b)) => Some(b.cpu.saturating_sub(a.cpu).as_secs_f64() / secs),
            _ => None,
        };
        if let Some(s) = server {
            self.rss_peak = Some(self.rss_peak.unwrap_or(0).max(s.rss_bytes));
        }
        let (p50, p99) = steady.map_or((None, None), Steady::take_interval);
        let failures: u64 = t.failures_by_status().values().sum();
        let point = StormPoint {
            t_s: at.duration_since(self.start).as_secs_f64(),
            phase,
            established: t.established,
            unestablished: (self.clients as u64).saturating_sub(t.established),
            established_per_s: d.established as f64 / secs,
            attempts: t.attempts,
            attempts_per_s: d.attempts as f64 / secs,
            failures,
            retries: t.retries,
            busy_answers: t.busy,
            busy_without_hint: t.busy_without_hint(),
            busy_per_s: d.busy as f64 / secs,
            busy_connect_per_s: d.busy_in("connect") as f64 / secs,
            busy_session_per_s: d.busy_in("session") as f64 / secs,
            busy_too_many_sessions_per_s: d.busy_in("too_many_sessions") as f64 / secs,
            steady_lateness_p50_ms: p50,
            steady_lateness_p99_ms: p99,
            server_cores_busy: cores,
            server_rss_bytes: server.map(|s| s.rss_bytes),
        };
        let late = p99.map_or(String::new(), |l| format!(", steady p99 {l:.1} ms"));
        self.progress.update(
            phase,
            fraction,
            &format!(
                "{}/{} established, {} attempts, {} busy ({} without a hint), {failures} failed{late}",
                point.established,
                self.clients,
                point.attempts,
                point.busy_answers,
                point.busy_without_hint,
            ),
        );
        self.series.push(point);
        self.prev_t = at;
        self.prev_server = server;
    }

    /// Samples every `every` for `length`.
    async fn window(
        &mut self,
        phase: &'static str,
        length: Duration,
        every: Duration,
        steady: Option<&Steady>,
    ) {
        let start = Instant::now();
        let end = start + length;
        while Instant::now() < end {
            let next = (Instant::now() + every).min(end);
            tokio::time::sleep_until(next.into()).await;
            let f = start.elapsed().as_secs_f64() / length.as_secs_f64().max(1e-9);
            self.sample(phase, steady, Some(f));
        }
    }
}

/// Where the storm's clients run.
enum Workers {
    /// In this process; the task returns the established clients.
    Here(Option<tokio::task::JoinHandle<Vec<Client>>>),
    /// In child processes.
    Children(worker::Children),
}

/// What the limits of this machine say about the planned storm: open
/// files per process and loopback ports per source address.
fn limit_warnings(per_process: usize, per_source: usize, naive: bool) -> Vec<String> {
    let mut out = Vec::new();
    let files = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<usize>().ok())
        });
    if let Some(limit) = files {
        if per_process + 64 > limit {
            out.push(format!(
                "a process runs up to {per_process} clients but may open only {limit} files \
                 (ulimit -n): raise the limit or use more --processes"
            ));
        }
    }
    let ports = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            let v: Vec<usize> = r
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() == 2 && v[1] >= v[0]).then(|| v[1] - v[0] + 1)
        });
    if let Some(ports) = ports {
        if per_source > ports {
            out.push(format!(
                "{per_source} clients per source address but only {ports} local ports: \
                 give more --source-ips"
            ));
        } else if naive && per_source * 2 > ports {
            out.push(format!(
                "{per_source} clients per source address and {ports} local ports: naive \
                 retries leave connections in TIME_WAIT; more --source-ips may be needed"
            ));
        }
    }
    out
}

/// The diagnostics session's backoff: one short wait (or the server's
/// hint) before its second and last attempt.
fn quick_backoff() -> Backoff {
    let mut b = Backoff::default();
    b.initial = Duration::from_millis(250);
    b.max = Duration::from_secs(2);
    b
}

fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|u| u as f64 / 1000.0)
}

/// A part's figures as JSON (`clients` of that part).
fn part_json(p: &Part, clients: usize) -> serde_json::Value {
    let mut times = p.establish_us.clone();
    times.sort_unstable();
    let mut hints = p.hints_ms.clone();
    hints.sort_unstable();
    let by_stage: serde_json::Map<String, serde_json::Value> =
        ["connect", "session", "too_many_sessions"]
            .iter()
            .map(|b| ((*b).to_owned(), p.busy_in(b).into()))
            .collect();
    json!({
        "clients": clients,
        "established": p.established,
        "unestablished": (clients as u64).saturating_sub(p.established),
        "gave_up": p.gave_up_count(),
        "gave_up_by_status": p.gave_up,
        "cut_off": p.cut_off,
        "attempts": p.attempts,
        "retries": p.retries,
        "failures": p.failures_by_status(),
        "failures_by_stage": p.failures,
        "busy_answers": {
            "total": p.busy,
            "with_hint": p.busy_with_hint,
            "without_hint": p.busy_without_hint(),
            "all_hinted": (p.busy > 0).then_some(p.busy_with_hint == p.busy),
            "by_stage": by_stage,
            "by_answer": p.busy_by_answer,
        },
        "hints_ms": {
            "count": hints.len(),
            "min": hints.first(),
            "p50": quantile(&hints, 0.5),
            "max": hints.last(),
        },
        "hinted_waits": {
            "checked": p.hinted_waits,
            "shorter_than_hint": p.waits_below_hint,
        },
        "time_to_establish_ms": {
            "p50": ms(quantile(&times, 0.5)),
            "p99": ms(quantile(&times, 0.99)),
            "max": ms(times.last().copied()),
        },
        "orphans_left": p.orphans_left,
    })
}

/// One line of a part for the summary.
fn part_row(p: &Part, clients: usize) -> String {
    let mut times = p.establish_us.clone();
    times.sort_unstable();
    let f = |v: Option<u64>| ms(v).map_or("-".to_owned(), |m| format!("{m:.0}"));
    format!(
        "{} of {clients} established (ms to establish p50 {} p99 {} max {}), {} attempts, {} retries, {} busy answers, {} sessions left behind",
        p.established,
        f(quantile(&times, 0.5)),
        f(quantile(&times, 0.99)),
        f(times.last().copied()),
        p.attempts,
        p.retries,
        p.busy,
        p.orphans_left
    )
}

/// Runs `bench storm`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    let processes: usize = a.num("--processes", 1)?;
    let steady_n: usize = a.num("--steady", 0)?;
    let publishing = a.seconds("--publishing-ms", 100.0)? / 1000;
    let before = a.seconds("--before-s", 2.0)?;
    let after = a.seconds("--after-s", 2.0)?;
    let pid = a.server_pid()?;
    let every = a.interval()?;
    let plan = Arc::new(Plan::from_args(a, processes).await?);
    let n = plan.clients;
    if steady_n > 0 && publishing.is_zero() {
        return Err("--publishing-ms must be > 0".into());
    }
    let naive_n = plan.mix.naive_count(n);
    let warnings = limit_warnings(
        n.div_ceil(processes),
        n.div_ceil(plan.sources.len().max(1)),
        naive_n > 0,
    );
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    // The random generator's first use is slow; not in the storm.
    let _ = uascale_crypto::policy::SecurityPolicy::Basic256Sha256.random_nonce();

    // A session of its own for the server's counters. A server that
    // cannot be reached ends the run here; one that refuses (busy, say)
    // is stormed all the same, without its counters.
    let mut report = ConnectReport::default();
    let diag_client = match Client::open(
        &a.url,
        ClientOptions {
            connect_attempts: 2,
            backoff: quick_backoff(),
            ..plan.options.clone()
        },
        "uascale bench storm diagnostics",
        &mut report,
    )
    .await
    {
        Ok(c) => Ok(c),
        Err(e @ (ClientError::Io(_) | ClientError::BadUrl(_))) => {
            return Err(format!("cannot reach {}: {e}", a.url))
        }
        Err(e) => {
            let e = format!("no session for the server's diagnostics: {e}");
            eprintln!("warning: {e}");
            Err(e)
        }
    };
    let steady = if steady_n > 0 {
        let s = Steady::start(
            &a.url,
            &ClientOptions {
                reconnect: true,
                ..plan.options.clone()
            },
            steady_n,
            publishing,
            plan.gate,
        )
        .await;
        eprintln!(
            "{} of {steady_n} steady sessions subscribed{}",
            s.established(),
            if s.failures.is_empty() {
                String::new()
            } else {
                format!(" (failures: {})", list_counts(&s.failures))
            }
        );
        Some(s)
    } else {
        None
    };

    let pending = Arc::new(Mutex::new(Delta::default()));
    let mut workers = if processes > 1 {
        let mut children = worker::Children::spawn(&a.raw, processes, Arc::clone(&pending))?;
        children
            .wait_for(|s| s.ready, Duration::from_secs(120))
            .await;
        let not_ready: Vec<usize> = (0..processes)
            .filter(|&i| !children.states[i].ready)
            .collect();
        if !not_ready.is_empty() {
            return Err(format!(
                "workers {not_ready:?} did not get ready (see their messages above)"
            ));
        }
        Workers::Children(children)
    } else {
        Workers::Here(None)
    };
    let diag_before = diag::read_from(&diag_client).await;

    let started = Instant::now();
    let mut s = Sampler {
        start: started,
        prev_t: started,
        pid,
        prev_server: pid.and_then(sample_server),
        pending: Arc::clone(&pending),
        total: Delta::default(),
        clients: n,
        series: Vec::new(),
        rss_peak: None,
        progress: Progress::new(),
    };
    let phase = |st: &Option<Steady>, p: u8| {
        if let Some(st) = st {
            st.phase.store(p, Ordering::SeqCst);
        }
    };
    let cpu = |pid: Option<u32>| pid.and_then(sample_server);

    // Before.
    phase(&steady, steady::BEFORE);
    let cpu0 = cpu(pid);
    s.window("before", before, every, steady.as_ref()).await;

    // The storm.
    phase(&steady, steady::STORM);
    let cpu1 = cpu(pid);
    let storm_start = Instant::now();
    match &mut workers {
        Workers::Here(task) => {
            *task = Some(tokio::spawn(storm(
                Arc::clone(&plan),
                (0..n).collect(),
                Arc::clone(&pending),
            )));
        }
        Workers::Children(c) => c.tell("go"),
    }
    // Workers stop their clients at --duration-s; this is the parent's
    // own limit for workers that do not say so.
    let cap = storm_start + plan.duration + Duration::from_secs(30);
    let mut next = storm_start + every;
    let mut here_clients = Vec::new();
    let mut unfinished_workers = Vec::new();
    let mut failed_workers = Vec::new();
    loop {
        let finished = match &mut workers {
            Workers::Here(Some(task)) => task.is_finished(),
            Workers::Here(None) => true,
            Workers::Children(c) => c.all(|st| st.storm_done),
        };
        if finished {
            break;
        }
        if Instant::now() >= cap {
            if let Workers::Children(c) = &workers {
                unfinished_workers = (0..c.states.len())
                    .filter(|&i| !c.states[i].storm_done)
                    .collect();
            }
            break;
        }
        let wake = next.min(cap);
        match &mut workers {
            Workers::Children(c) => {
                tokio::select! {
                    _ = c.next() => {}
                    () = tokio::time::sleep_until(wake.into()) => {}
                }
            }
            Workers::Here(_) => {
                tokio::time::sleep_until(
                    wake.min(Instant::now() + Duration::from_millis(50)).into(),
                )
                .await;
            }
        }
        if Instant::now() >= next {
            next += every;
            s.sample("storm", steady.as_ref(), None);
        }
    }
    if let Workers::Children(c) = &workers {
        failed_workers = c.failed(|st| st.storm_done);
        for i in &failed_workers {
            eprintln!("warning: worker {i} ended before its storm did; its clients are missing");
        }
    }
    if let Workers::Here(task) = &mut workers {
        if let Some(t) = task.take() {
            here_clients = t.await.map_err(|e| format!("the storm task failed: {e}"))?;
        }
    }
    let storm_s = storm_start.elapsed().as_secs_f64();
    s.sample("storm", steady.as_ref(), None);
    let storm_end_t = s.series.last().map_or(0.0, |p| p.t_s);
    let storm_start_t = storm_start.duration_since(started).as_secs_f64();

    // After.
    phase(&steady, steady::AFTER);
    let cpu2 = cpu(pid);
    s.window("after", after, every, steady.as_ref()).await;
    let cpu3 = cpu(pid);
    s.progress.finish();
    let diag_after = diag::read_from(&diag_client).await;
    let steady_connected = steady.as_ref().map(|st| st.connected());

    // Close everything.
    let closed = match workers {
        Workers::Here(_) => close_all(here_clients, plan.gate, Duration::from_secs(60)).await,
        Workers::Children(c) => c.finish(Duration::from_secs(90)).await,
    };
    let steady_json = steady.as_ref().map(|st| {
        json!({
            "sessions": st.wanted,
            "established": st.established(),
            "failures": st.failures,
            "connected_at_end": steady_connected,
            "publishing_ms": publishing.as_secs_f64() * 1000.0,
            "lost_messages": st.lost.load(Ordering::Relaxed),
            "lateness_ms": st.phases_json(),
        })
    });
    if let Some(st) = steady {
        st.close().await;
    }
    if let Ok(c) = &diag_client {
        c.close().await;
    }
    s.take();

    // The figures.
    let t = s.total.total();
    let (db, da) = (diag_before.as_ref().ok(), diag_after.as_ref().ok());
    let mut diag_notes = diag::notes(db, da);
    let mut errors: Vec<&String> = [&diag_before, &diag_after]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    errors.dedup();
    diag_notes.extend(errors.into_iter().cloned());
    let current = diag::delta(db, da, "CurrentSessionCount");
    let cumulated = diag::delta(db, da, "CumulatedSessionCount");
    let est = t.established as i64;
    let orphans = json!({
        "left_by_clients": t.orphans_left,
        "server_sessions_unaccounted": current.map(|c| c - est),
        "created_not_kept": cumulated.map(|c| c - est),
        "session_timeouts": diag::delta(db, da, "SessionTimeoutCount"),
        "session_aborts": diag::delta(db, da, "SessionAbortCount"),
        "rejected_sessions": diag::delta(db, da, "RejectedSessionCount"),
        "notes": diag_notes,
    });
    let phase_cpu = |a: Option<ServerSample>, b: Option<ServerSample>, secs: f64| match (a, b) {
        (Some(a), Some(b)) => Some((
            b.cpu.saturating_sub(a.cpu).as_secs_f64(),
            b.cpu.saturating_sub(a.cpu).as_secs_f64() / secs.max(1e-9),
        )),
        _ => None,
    };
    let server_phases = [
        ("before", phase_cpu(cpu0, cpu1, before.as_secs_f64())),
        ("storm", phase_cpu(cpu1, cpu2, storm_s)),
        ("after", phase_cpu(cpu2, cpu3, after.as_secs_f64())),
    ];
    let server = pid.map(|_| {
        let mut cpu_s = serde_json::Map::new();
        let mut cores = serde_json::Map::new();
        for (name, v) in &server_phases {
            cpu_s.insert((*name).to_owned(), v.map(|v| v.0).into());
            cores.insert((*name).to_owned(), v.map(|v| v.1).into());
        }
        json!({
            "cpu_s": cpu_s,
            "cores_busy": cores,
            "rss_bytes_peak": s.rss_peak,
            "rss_bytes_end": cpu3.map(|c| c.rss_bytes),
        })
    });
    let coop_n = n - naive_n;
    let mut by_behaviour = serde_json::Map::new();
    for (b, part, count) in [
        (Behaviour::Naive, &s.total.naive, naive_n),
        (Behaviour::Cooperative, &s.total.cooperative, coop_n),
    ] {
        if count > 0 {
            let key = serde_json::to_value(b)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            by_behaviour.insert(key, part_json(part, count));
        }
    }
    let mut json = json!({
        "bench": "storm",
        "command": a.command_line(),
        "url": a.url,
        "processes": processes,
        "behaviour": plan.mix.name(),
        "source_ips": plan.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "gate": plan.gate_total,
        "gate_per_process": plan.gate,
        "split_behaviours": plan.split,
        "max_retries": plan.max_retries,
        "timeout_s": plan.timeout.as_secs_f64(),
        "duration_s": plan.duration.as_secs_f64(),
        "security": a.last("--security").unwrap_or("None"),
        "storm_s": storm_s,
        "unfinished_workers": unfinished_workers,
        "failed_workers": failed_workers,
        "closed": closed,
        "warnings": warnings,
    });
    if let (Some(o), serde_json::Value::Object(totals)) = (json.as_object_mut(), part_json(&t, n)) {
        o.extend(totals);
        o.insert("orphans".into(), orphans.clone());
        o.insert(
            "diagnostics".into(),
            json!({"before": diag::to_json(db), "after": diag::to_json(da)}),
        );
        o.insert("steady".into(), steady_json.clone().into());
        o.insert("server".into(), server.clone().into());
        o.insert("by_behaviour".into(), by_behaviour.into());
        o.insert("series".into(), json!(s.series));
    }

    // The summary.
    let mut hints = t.hints_ms.clone();
    hints.sort_unstable();
    let mut rows = vec![
        (
            "clients".to_owned(),
            format!(
                "{n} ({naive_n} naive, {coop_n} cooperative) over {processes} process(es), gate {}, {} source address(es)",
                plan.gate_total,
                plan.sources.len().max(1)
            ),
        ),
        ("established".to_owned(), part_row(&t, n)),
        (
            "unestablished".to_owned(),
            format!(
                "{} ({} gave up: {}; {} still trying after {:.0} s)",
                (n as u64).saturating_sub(t.established),
                t.gave_up_count(),
                list_counts(&t.gave_up),
                t.cut_off,
                plan.duration.as_secs_f64()
            ),
        ),
        (
            "failed attempts".to_owned(),
            list_counts(&t.failures_by_status()),
        ),
        (
            "busy answers".to_owned(),
            format!(
                "{} (connect: {}, session: {}, BadTooManySessions: {}); {} with a hint, {} without{}",
                t.busy,
                t.busy_in("connect"),
                t.busy_in("session"),
                t.busy_in("too_many_sessions"),
                t.busy_with_hint,
                t.busy_without_hint(),
                match (t.busy > 0, t.busy_without_hint() == 0) {
                    (true, true) => " (every busy answer carried a hint)",
                    (true, false) => " (NOT every busy answer carried a hint)",
                    _ => "",
                }
            ),
        ),
        (
            "hints ms".to_owned(),
            match (hints.first(), quantile(&hints, 0.5), hints.last()) {
                (Some(a), Some(m), Some(b)) => format!(
                    "min {a}  p50 {m}  max {b} ({} received); {} waits checked, {} shorter than the hint",
                    hints.len(),
                    t.hinted_waits,
                    t.waits_below_hint
                ),
                _ => "none received".to_owned(),
            },
        ),
    ];
    for (b, part, count) in [
        ("naive", &s.total.naive, naive_n),
        ("cooperative", &s.total.cooperative, coop_n),
    ] {
        if count > 0 && count < n {
            rows.push((b.to_owned(), part_row(part, count)));
        }
    }
    let opt = |v: &serde_json::Value| {
        if v.is_null() {
            "-".to_owned()
        } else {
            v.to_string()
        }
    };
    rows.push((
        "orphans".to_owned(),
        format!(
            "{} left by clients; server: sessions unaccounted {}, created and not kept {}, SessionTimeoutCount +{}, SessionAbortCount +{}",
            t.orphans_left,
            opt(&orphans["server_sessions_unaccounted"]),
            opt(&orphans["created_not_kept"]),
            opt(&orphans["session_timeouts"]),
            opt(&orphans["session_aborts"]),
        ),
    ));
    if let Some(notes) = orphans["notes"].as_array().filter(|n| !n.is_empty()) {
        rows.push((
            "diagnostics notes".to_owned(),
            notes
                .iter()
                .filter_map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    if let Some(st) = &steady_json {
        let l = &st["lateness_ms"];
        let f = |p: &str, q: &str| {
            l[p][q]
                .as_f64()
                .map_or("-".to_owned(), |v| format!("{v:.1}"))
        };
        rows.push((
            "steady lateness ms".to_owned(),
            format!(
                "p50/p99 before {}/{}, storm {}/{}, after {}/{} ({} of {} sessions, {} lost messages)",
                f("before", "p50"),
                f("before", "p99"),
                f("storm", "p50"),
                f("storm", "p99"),
                f("after", "p50"),
                f("after", "p99"),
                st["established"],
                st["sessions"],
                st["lost_messages"]
            ),
        ));
    }
    if let Some(srv) = &server {
        let f = |p: &str| {
            srv["cores_busy"][p]
                .as_f64()
                .map_or("-".to_owned(), |v| format!("{v:.2}"))
        };
        rows.push((
            "server".to_owned(),
            format!(
                "cores busy before {}, storm {}, after {}; RSS peak {}",
                f("before"),
                f("storm"),
                f("after"),
                srv["rss_bytes_peak"]
                    .as_u64()
                    .map_or("-".to_owned(), |b| format!("{:.1} MB", b as f64 / 1e6))
            ),
        ));
    }
    for w in &warnings {
        rows.push(("warning".to_owned(), w.clone()));
    }
    let shade = Some((storm_start_t, storm_end_t, "storm".to_owned()));
    let charts = charts(&json, steady_n > 0, pid.is_some(), shade);
    Ok(Outcome {
        title: format!(
            "bench storm  {}  {n} clients ({}), {:.1} s storm",
            a.url,
            plan.mix.name(),
            storm_s
        ),
        rows,
        json,
        charts,
    })
}

/// The report's plots from the series in `json`.
fn charts(
    json: &serde_json::Value,
    steady: bool,
    server: bool,
    shade: Option<(f64, f64, String)>,
) -> Vec<Chart> {
    let series = json["series"].as_array().cloned().unwrap_or_default();
    let line = |key: &str, label: &str| Line {
        key: key.into(),
        label: label.into(),
        points: series
            .iter()
            .filter_map(|p| Some((p["t_s"].as_f64()?, p[key].as_f64()?)))
            .collect(),
    };
    let mut charts = vec![
        Chart {
            title: "Storm clients established".into(),
            y_label: "clients".into(),
            lines: vec![
                line("established", "established"),
                line("unestablished", "unestablished"),
            ],
            shade: shade.clone(),
        },
        Chart {
            title: "Busy answers per second, by stage".into(),
            y_label: "per second".into(),
            lines: vec![
                line("busy_connect_per_s", "connect (ERR)"),
                line("busy_session_per_s", "session (ServiceFault)"),
                line("busy_too_many_sessions_per_s", "BadTooManySessions"),
            ],
            shade: shade.clone(),
        },
        Chart {
            title: "Attempts and establishments per second".into(),
            y_label: "per second".into(),
            lines: vec![
                line("attempts_per_s", "attempts/s"),
                line("established_per_s", "established/s"),
            ],
            shade: shade.clone(),
        },
    ];
    if steady {
        charts.push(Chart {
            title: "Steady sessions' publish lateness".into(),
            y_label: "ms".into(),
            lines: vec![
                line("steady_lateness_p50_ms", "p50"),
                line("steady_lateness_p99_ms", "p99"),
            ],
            shade: shade.clone(),
        });
    }
    if server {
        charts.push(Chart {
            title: "Server CPU".into(),
            y_label: "cores busy".into(),
            lines: vec![line("server_cores_busy", "cores busy")],
            shade,
        });
    }
    charts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_json_has_every_field() {
        let mut p = Part::default();
        p.attempt_succeeded();
        p.established(Duration::from_millis(20));
        let j = part_json(&p, 3);
        assert_eq!(j["established"], 1);
        assert_eq!(j["unestablished"], 2);
        assert_eq!(j["busy_answers"]["all_hinted"], serde_json::Value::Null);
        assert_eq!(j["time_to_establish_ms"]["max"], 20.0);
        assert_eq!(j["hints_ms"]["min"], serde_json::Value::Null);
        assert!(part_row(&p, 3).starts_with("1 of 3 established"));
    }

    #[test]
    fn limits_are_checked() {
        assert!(limit_warnings(10, 10, true).is_empty());
        // Where the open-file limit is a number, a billion files exceed it.
        let numeric = std::fs::read_to_string("/proc/self/limits").is_ok_and(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .is_some_and(|v| v.parse::<u64>().is_ok())
        });
        if numeric {
            let w = limit_warnings(1_000_000_000, 1, false);
            assert!(w.iter().any(|w| w.contains("ulimit")), "{w:?}");
        }
    }
}
