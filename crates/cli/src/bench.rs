//! `uascale bench`: load against any OPC UA server URL, with the server's
//! own CPU and memory read from /proc when its PID is given.
//!
//! - `bench read`: C connections x M Reads in flight, K values per Read;
//!   a warm-up, then a measured window.
//! - `bench sessions`: N sessions (one connection each) established at a
//!   bounded concurrency with the §7 backoff on busy answers, held, closed.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use uascale_client::{Backoff, Client, ClientError, ClientOptions};
use uascale_types::{NodeId, StatusCode};

pub const USAGE: &str =
    "       uascale bench read URL [--connections C] [--inflight M] [--values-per-read K]
                          [--node NODE]... [--warmup-s S] [--duration-s S]
                          [--server-pid PID] [--json]
       uascale bench sessions URL [--sessions N] [--concurrency C] [--hold-s S]
                          [--source-ips IP,IP,...] [--max-retries R]
                          [--server-pid PID] [--json]
       uascale bench publish URL [--sessions S] [--subscriptions N] [--items K]
                          [--node NODE]... [--load-nodes L] [--interval-ms MS]
                          [--sampling-ms MS] [--concurrency C] [--warmup-s S]
                          [--duration-s S] [--max-retries R] [--server-pid PID] [--json]

  bench read      C connections (10) x M Reads in flight (100), K values per
                  Read (1) of the NODEs (default i=2258); --warmup-s (3) then
                  --duration-s (5) measured: reads/s, values/s, latency
                  percentiles, errors by status, and with --server-pid the
                  server's CPU microseconds per Read and its RSS
  bench sessions  N sessions (100), each on its own connection, established
                  C at a time (50), each retried up to R times (4) with
                  the backoff of SCALABILITY.md §7 on failures, held
                  --hold-s (5), closed: rate, failures by status, busy
                  answers, retries, server CPU and memory per session
  bench publish   S sessions (10) x N subscriptions (1) x K items (10) on the
                  NODEs (round robin; --load-nodes L adds uascale's
                  ns=2;s=Demo.Load.Node0..L-1; default the four
                  Demo.Dynamic nodes), publishing every --interval-ms (100):
                  notifications/s, lateness (arrival minus source
                  timestamp), lost messages, server CPU per notification";

/// The server's CPU time so far (all its threads) and its resident memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerSample {
    pub cpu: Duration,
    pub rss_bytes: u64,
}

pub(crate) fn sample_server(pid: u32) -> Option<ServerSample> {
    // schedstat gives nanoseconds on the CPU per thread; stat's ticks are
    // 10 ms coarse, so use them only when schedstat is missing.
    let mut ns = 0u64;
    let mut found = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                if let Some(v) = s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    ns += v;
                    found = true;
                }
            }
        }
    }
    let cpu = if found {
        Duration::from_nanos(ns)
    } else {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        Duration::from_millis(ticks * 10)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(ServerSample {
        cpu,
        rss_bytes: rss_kb * 1024,
    })
}

struct Args {
    url: String,
    flags: BTreeMap<String, Vec<String>>,
    json: bool,
}

impl Args {
    fn parse(args: &[&str], known: &[&str]) -> Result<Self, String> {
        let mut url = None;
        let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut json = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match *a {
                "--json" => json = true,
                f if known.contains(&f) => {
                    let v = it.next().ok_or_else(|| format!("{f} needs a value"))?;
                    flags.entry(f.to_owned()).or_default().push((*v).to_owned());
                }
                f if f.starts_with("--") => return Err(format!("unknown option {f:?}")),
                u if url.is_none() => url = Some(u.to_owned()),
                other => return Err(format!("unexpected argument {other:?}")),
            }
        }
        Ok(Args {
            url: url.ok_or("the server URL is missing")?,
            flags,
            json,
        })
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.flags.get(name).and_then(|v| v.last()) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{name} {v:?} is not a valid number")),
        }
    }
}

/// Runs `uascale bench KIND ARGS...`.
pub fn run(args: &[&str]) -> ExitCode {
    let result = match args {
        ["read", rest @ ..] => Args::parse(
            rest,
            &[
                "--connections",
                "--inflight",
                "--values-per-read",
                "--node",
                "--warmup-s",
                "--duration-s",
                "--server-pid",
            ],
        )
        .and_then(|a| runtime()?.block_on(bench_read(a))),
        ["sessions", rest @ ..] => Args::parse(
            rest,
            &[
                "--sessions",
                "--concurrency",
                "--hold-s",
                "--source-ips",
                "--max-retries",
                "--server-pid",
            ],
        )
        .and_then(|a| runtime()?.block_on(bench_sessions(a))),
        ["publish", rest @ ..] => Args::parse(
            rest,
            &[
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
                "--server-pid",
                "--max-retries",
            ],
        )
        .and_then(|a| runtime()?.block_on(bench_publish(a))),
        _ => Err(format!(
            "unknown bench; one of: read, sessions, publish\n{USAGE}"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uascale bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

#[derive(Default)]
struct ReadCounters {
    reads: AtomicU64,
    values: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

fn count_error(errors: &Mutex<BTreeMap<String, u64>>, status: StatusCode) {
    if let Ok(mut e) = errors.lock() {
        *e.entry(status.to_string()).or_insert(0) += 1;
    }
}

async fn bench_read(a: Args) -> Result<(), String> {
    let connections: usize = a.num("--connections", 10)?;
    let inflight: usize = a.num("--inflight", 100)?;
    let per_read: usize = a.num("--values-per-read", 1)?;
    let warmup = Duration::from_secs_f64(a.num("--warmup-s", 3.0)?);
    let duration = Duration::from_secs_f64(a.num("--duration-s", 5.0)?);
    let pid: Option<u32> = a
        .flags
        .get("--server-pid")
        .and_then(|v| v.last()?.parse().ok());
    if connections == 0 || inflight == 0 || per_read == 0 || duration.is_zero() {
        return Err(
            "--connections, --inflight, --values-per-read and --duration-s must be > 0".into(),
        );
    }
    let nodes: Vec<NodeId> = match a.flags.get("--node") {
        None => vec![NodeId::ns0(2258)],
        Some(v) => v
            .iter()
            .map(|n| n.parse().map_err(|e| format!("--node {n:?}: {e}")))
            .collect::<Result<_, String>>()?,
    };
    let read_nodes: Vec<NodeId> = nodes.iter().cycle().take(per_read).cloned().collect();
    eprintln!("connecting {connections} session(s) to {} ...", a.url);
    let mut clients = Vec::new();
    for _ in 0..connections {
        let c = Client::connect(&a.url, ClientOptions::default())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        c.create_session("uascale bench read")
            .await
            .map_err(|e| format!("session: {e}"))?;
        clients.push(Arc::new(c));
    }
    let counters = Arc::new(ReadCounters::default());
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in &clients {
        for _ in 0..inflight {
            let (c, counters, measuring, stop, nodes) = (
                Arc::clone(c),
                Arc::clone(&counters),
                Arc::clone(&measuring),
                Arc::clone(&stop),
                read_nodes.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                    .unwrap_or_else(|_| Histogram::new(3).expect("a histogram"));
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let r = c.read_values(&nodes).await;
                    if !measuring.load(Ordering::Relaxed) {
                        continue;
                    }
                    match r {
                        Ok(values) => {
                            let _ = hist.record(t0.elapsed().as_micros().max(1) as u64);
                            counters.reads.fetch_add(1, Ordering::Relaxed);
                            counters
                                .values
                                .fetch_add(values.len() as u64, Ordering::Relaxed);
                            for v in &values {
                                if let Some(s) = v.status.filter(|s| s.is_bad()) {
                                    count_error(&counters.errors, s);
                                }
                            }
                        }
                        Err(e) => {
                            count_error(&counters.errors, e.status_code());
                            if matches!(e, ClientError::Closed | ClientError::Channel { .. }) {
                                break;
                            }
                        }
                    }
                }
                hist
            }));
        }
    }
    progress("warm-up", warmup, &counters.reads).await;
    let before = pid.and_then(sample_server);
    let reads0 = counters.reads.load(Ordering::Relaxed);
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    progress("measure", duration, &counters.reads).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let after = pid.and_then(sample_server);
    let reads = counters.reads.load(Ordering::Relaxed) - reads0;
    let values = counters.values.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    for t in tasks {
        if let Ok(h) = t.await {
            let _ = hist.add(h);
        }
    }
    for c in &clients {
        c.close().await;
    }
    let secs = elapsed.as_secs_f64();
    let errors = counters
        .errors
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default();
    let server = match (before, after) {
        (Some(b), Some(a)) if reads > 0 => Some((
            (a.cpu - b.cpu).as_secs_f64() * 1e6 / reads as f64,
            (a.cpu - b.cpu).as_secs_f64() / secs,
            a.rss_bytes,
        )),
        _ => None,
    };
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "bench": "read",
                "url": a.url,
                "connections": connections,
                "inflight": inflight,
                "values_per_read": per_read,
                "duration_s": secs,
                "reads": reads,
                "reads_per_s": reads as f64 / secs,
                "values_per_s": values as f64 / secs,
                "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "max": hist.max() as f64 / 1000.0},
                "errors": errors,
                "server_cpu_us_per_read": server.map(|s| s.0),
                "server_cores_busy": server.map(|s| s.1),
                "server_rss_bytes": server.map(|s| s.2),
            }))
            .unwrap_or_default()
        );
    } else {
        println!(
            "bench read  {}  {connections} conn x {inflight} in flight, {per_read} value(s)/Read, {secs:.1} s after {:.0} s warm-up",
            a.url,
            warmup.as_secs_f64()
        );
        println!("  reads/s        {:>12.0}", reads as f64 / secs);
        println!("  values/s       {:>12.0}", values as f64 / secs);
        println!(
            "  latency ms     p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            hist.max() as f64 / 1000.0
        );
        let total_errors: u64 = errors.values().sum();
        println!("  errors         {total_errors:>12} {errors:?}");
        if let Some((us, cores, rss)) = server {
            println!(
                "  server CPU     {us:>12.2} us/Read ({:.3} us/value, {cores:.2} cores busy), RSS {:.1} MB",
                us / per_read as f64,
                rss as f64 / 1e6
            );
        }
    }
    Ok(())
}

async fn bench_publish(a: Args) -> Result<(), String> {
    let mut nodes: Vec<NodeId> = match a.flags.get("--node") {
        None => Vec::new(),
        Some(v) => v
            .iter()
            .map(|n| n.parse().map_err(|e| format!("--node {n:?}: {e}")))
            .collect::<Result<_, String>>()?,
    };
    let load_nodes: usize = a.num("--load-nodes", 0)?;
    nodes.extend((0..load_nodes).map(|i| NodeId::string(2, format!("Demo.Load.Node{i}"))));
    if nodes.is_empty() {
        nodes = ["Counter", "Random", "Sine", "Step"]
            .iter()
            .map(|n| NodeId::string(2, format!("Demo.Dynamic.{n}")))
            .collect();
    }
    let params = crate::bench_publish::PublishParams {
        url: a.url.clone(),
        sessions: a.num("--sessions", 10)?,
        subscriptions: a.num("--subscriptions", 1)?,
        items: a.num("--items", 10)?,
        nodes,
        interval: Duration::from_secs_f64(a.num("--interval-ms", 100.0)? / 1000.0),
        sampling_ms: a.num("--sampling-ms", -1.0)?,
        concurrency: a.num("--concurrency", 50)?,
        warmup: Duration::from_secs_f64(a.num("--warmup-s", 2.0)?),
        duration: Duration::from_secs_f64(a.num("--duration-s", 5.0)?),
        server_pid: a
            .flags
            .get("--server-pid")
            .and_then(|v| v.last()?.parse().ok()),
        max_retries: a.num("--max-retries", 4)?,
    };
    let report = crate::bench_publish::run(params).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        crate::bench_publish::print_text(&report);
    }
    Ok(())
}

/// Waits `d`, printing the rate once a second on stderr.
async fn progress(phase: &str, d: Duration, counter: &AtomicU64) {
    let end = Instant::now() + d;
    let mut last = counter.load(Ordering::Relaxed);
    let mut last_t = Instant::now();
    while Instant::now() < end {
        let step = (end - Instant::now()).min(Duration::from_secs(1));
        tokio::time::sleep(step).await;
        let now = counter.load(Ordering::Relaxed);
        let rate = (now - last) as f64 / last_t.elapsed().as_secs_f64().max(1e-9);
        let left = end.saturating_duration_since(Instant::now()).as_secs_f64();
        eprint!("\r  {phase}: {rate:>10.0}/s, {left:>4.1} s left   ");
        last = now;
        last_t = Instant::now();
    }
    eprintln!();
}

#[derive(Default)]
struct SessionCounters {
    established: AtomicU64,
    busy: AtomicU64,
    retries: AtomicU64,
    failures: Mutex<BTreeMap<String, u64>>,
}

async fn bench_sessions(a: Args) -> Result<(), String> {
    let n: usize = a.num("--sessions", 100)?;
    let concurrency: usize = a.num("--concurrency", 50)?;
    let hold = Duration::from_secs_f64(a.num("--hold-s", 5.0)?);
    let max_retries: u32 = a.num("--max-retries", 4)?;
    let pid: Option<u32> = a
        .flags
        .get("--server-pid")
        .and_then(|v| v.last()?.parse().ok());
    if n == 0 || concurrency == 0 {
        return Err("--sessions and --concurrency must be > 0".into());
    }
    let sources: Vec<std::net::IpAddr> = match a.flags.get("--source-ips").and_then(|v| v.last()) {
        None => vec![],
        Some(list) => list
            .split(',')
            .map(|ip| {
                ip.trim()
                    .parse()
                    .map_err(|_| format!("--source-ips: {ip:?} is not an IP address"))
            })
            .collect::<Result<_, _>>()?,
    };
    let counters = Arc::new(SessionCounters::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let before = pid.and_then(sample_server);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (gate, counters, url) = (Arc::clone(&gate), Arc::clone(&counters), a.url.clone());
        let options = ClientOptions {
            local_addr: (!sources.is_empty()).then(|| sources[i % sources.len()]),
            ..Default::default()
        };
        tasks.push(tokio::spawn(async move {
            let mut backoff = Backoff::new(0x5eed_0000 + i as u64);
            // A busy server is retried with the §7 backoff.
            for attempt in 0..=max_retries {
                let permit = gate.acquire().await.ok()?;
                let result = async {
                    let c = Client::connect(&url, options.clone()).await?;
                    c.create_session(&format!("bench {i}")).await?;
                    Ok::<_, ClientError>(c)
                }
                .await;
                drop(permit);
                match result {
                    Ok(c) => {
                        counters.established.fetch_add(1, Ordering::Relaxed);
                        return Some(c);
                    }
                    Err(e) => {
                        let status = e.status_code();
                        if uascale_client::backoff::is_busy_signal(status) {
                            counters.busy.fetch_add(1, Ordering::Relaxed);
                        }
                        if attempt == max_retries {
                            count_error(&counters.failures, status);
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
    let waiter = {
        let counters = Arc::clone(&counters);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                eprint!(
                    "\r  established {:>7} / {n}",
                    counters.established.load(Ordering::Relaxed)
                );
            }
        })
    };
    let mut clients = Vec::with_capacity(n);
    for t in tasks {
        if let Ok(Some(c)) = t.await {
            clients.push(c);
        }
    }
    waiter.abort();
    eprintln!();
    let establish = started.elapsed();
    let established = after_count(&counters);
    let at_hold = pid.and_then(sample_server);
    tokio::time::sleep(hold).await;
    let held = pid.and_then(sample_server);
    // Each session still answers after the hold.
    let mut alive = 0usize;
    for c in &clients {
        if c.read_values(&[NodeId::ns0(2258)]).await.is_ok() {
            alive += 1;
        }
    }
    for c in &clients {
        c.close().await;
    }
    let failures = counters
        .failures
        .lock()
        .map(|f| f.clone())
        .unwrap_or_default();
    let per_session = match (before, at_hold, held) {
        (Some(b), Some(h), Some(e)) if established > 0 => Some((
            (h.cpu - b.cpu).as_secs_f64() * 1e3 / established as f64,
            (h.rss_bytes.saturating_sub(b.rss_bytes)) as f64 / established as f64,
            (e.cpu - h.cpu).as_secs_f64() / hold.as_secs_f64().max(1e-9),
        )),
        _ => None,
    };
    let rate = established as f64 / establish.as_secs_f64().max(1e-9);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "bench": "sessions",
                "url": a.url,
                "sessions": n,
                "concurrency": concurrency,
                "established": established,
                "establish_s": establish.as_secs_f64(),
                "sessions_per_s": rate,
                "busy_answers": counters.busy.load(Ordering::Relaxed),
                "retries": counters.retries.load(Ordering::Relaxed),
                "failures": failures,
                "alive_after_hold": alive,
                "server_cpu_ms_per_session": per_session.map(|p| p.0),
                "server_bytes_per_session": per_session.map(|p| p.1),
                "server_cores_busy_while_holding": per_session.map(|p| p.2),
            }))
            .unwrap_or_default()
        );
    } else {
        println!(
            "bench sessions  {}  {n} sessions, {concurrency} at a time, held {:.0} s",
            a.url,
            hold.as_secs_f64()
        );
        println!(
            "  established    {established:>8} in {:.2} s ({rate:.0}/s)",
            establish.as_secs_f64()
        );
        println!(
            "  busy answers   {:>8}, retries {}",
            counters.busy.load(Ordering::Relaxed),
            counters.retries.load(Ordering::Relaxed)
        );
        println!("  failures       {failures:?}");
        println!("  alive at end   {alive:>8}");
        if let Some((ms, bytes, cores)) = per_session {
            println!(
                "  server         {ms:.3} ms CPU and {:.1} KB per session; {cores:.3} cores busy while holding",
                bytes / 1024.0
            );
        }
    }
    Ok(())
}

fn after_count(c: &SessionCounters) -> u64 {
    c.established.load(Ordering::Relaxed)
}
