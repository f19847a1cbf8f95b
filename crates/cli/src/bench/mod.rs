//! `uascale bench`: load against any OPC UA server URL, with the server's
//! own CPU and memory read from /proc when its PID is given.
//!
//! - `bench read` ([`read`]): C connections x M Reads in flight, K values
//!   per Read; a warm-up, then a measured window.
//! - `bench sessions` ([`sessions`]): N sessions (one connection each)
//!   established at a bounded concurrency with the §7 backoff on busy
//!   answers, held, closed.
//!
//! - `bench publish` ([`publish`]): S sessions x N subscriptions x K items
//!   on changing nodes: notifications/s, lateness, server CPU per
//!   notification.
//! - `bench storm` ([`storm`]): N clients connecting at once, naive or
//!   cooperative, over P processes: attempts, busy answers by stage and
//!   hint, time to establish, sessions left behind, and the lateness of
//!   steady sessions before, during and after.
//!
//! - `bench fairness` ([`fairness`]): flooding clients and one-at-a-time
//!   victims on one node: per-client throughput, busy answers and
//!   latency - who waits behind whom under the server's isolation profile.
//!
//! - `bench rogue` ([`rogue`]): one client making the server keep as much
//!   as it will (items, queues, subscriptions, continuation points, event
//!   filters), next to a victim subscription: the server's RSS growth and
//!   what the victim still receives.
//! - `bench floor` ([`floor`]): the floor under a publish round trip, an
//!   echo server (`bench floor serve`) and N sockets sending a small
//!   message every interval: server CPU per round trip and per
//!   socket-second.
//! - `bench failover` ([`failover`]): sessions with a subscription through
//!   a cluster's front end, one node killed: sessions moved, time to
//!   resume, notifications lost and duplicated, steady lateness.
//!
//! All sample once a second ([`series`]), show progress on stderr
//! ([`progress`]), print a summary table or `--json` on stdout, and with
//! `--report FILE` write a self-contained HTML page ([`report`]).

mod common;
mod failover;
mod fairness;
mod floor;
mod progress;
mod publish;
mod read;
mod report;
mod rogue;
mod series;
mod sessions;
mod storm;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use uascale_types::StatusCode;

pub const USAGE: &str =
    "       uascale bench read URL [--connections C] [--inflight M] [--values-per-read K]
                          [--node NODE]... [--warmup-s S] [--duration-s S]
                          [--client pipeline|library] [--ignore-hints]
                          [--server-pid PID] [--pki DIR] [--trust-server]
                          [--interval-s S] [--json]
                          [--report FILE.html]
       uascale bench sessions URL [--sessions N] [--concurrency C] [--hold-s S]
                          [--processes P] [--source-ips IP,IP,...] [--max-retries R]
                          [--security POLICY[:MODE]] [--pki DIR] [--trust-server]
                          [--user NAME | --cert FILE --key FILE]
                          [--subscribe on|off|after] [--node NODE] [--publishing-ms MS]
                          [--server-pid PID] [--interval-s S] [--json]
                          [--report FILE.html]
       uascale bench publish URL [--sessions S] [--subscriptions N] [--items K]
                          [--node NODE]... [--load-nodes L] [--interval-ms MS]
                          [--sampling-ms MS] [--concurrency C] [--warmup-s S]
                          [--duration-s S] [--max-retries R] [--on-time-ms MS]
                          [--server-pid PID] [--pki DIR] [--trust-server]
                          [--interval-s S] [--json] [--report FILE.html]
       uascale bench storm URL [--clients N] [--processes P]
                          [--source-ips IP,IP,...] [--behaviour naive|cooperative|mixed]
                          [--gate C] [--split-behaviours] [--max-retries R]
                          [--timeout-s S] [--duration-s D] [--steady N]
                          [--publishing-ms MS] [--before-s S] [--after-s S]
                          [--security POLICY[:MODE]] [--pki DIR] [--trust-server]
                          [--user NAME [--password PW] | --cert FILE --key FILE]
                          [--server-pid PID] [--interval-s S] [--json]
                          [--report FILE.html]
       uascale bench failover URL [--sessions S] [--node NODE] [--interval-ms MS]
                          [--concurrency C] [--source-ips IP,IP,...]
                          [--security POLICY[:MODE]] [--pki DIR] [--trust-server]
                          [--user NAME | --cert FILE --key FILE]
                          [--kill-pid PID [--drain]] [--kill-after-s T]
                          [--duration-s D] [--json] [--report FILE.html]
       uascale bench fairness URL [--flooders F] [--flood-inflight W]
                          [--victims V] [--node NODE] [--warmup-s S]
                          [--duration-s S] [--server-pid PID] [--json]
                          [--report FILE.html]
       uascale bench rogue URL [--variant items|subscriptions|continuation|events]
                          [--items N] [--subscriptions S] [--queue Q] [--sessions N]
                          [--publishes W] [--select K] [--node NODE]... [--load-nodes L]
                          [--victim-items K] [--victim-ms MS] [--duration-s S]
                          [--server-pid PID] [--json] [--report FILE.html]
       uascale bench floor serve --port P [--bind ADDR]
       uascale bench floor HOST:PORT [--sockets N] [--interval-ms I] [--size B]
                          [--concurrency C] [--warmup-s S] [--duration-s S]
                          [--server-pid PID] [--json]

  bench read      C connections (10) x M Reads in flight (100), K values per
                  Read (1) of the NODEs (default i=2258); --warmup-s (3) then
                  --duration-s (5) measured: reads/s, values/s, latency
                  percentiles, errors by status, and with --server-pid the
                  server's CPU microseconds per Read and its RSS. --client
                  pipeline (the default for opc.tcp) keeps the window in
                  one task per connection; library goes through
                  Client::read_values (the default for an opc.https URL,
                  which the pipelined client does not speak; there
                  --ignore-hints sends on after a 429 instead of waiting
                  out its Retry-After: a flooder)
  bench sessions  N sessions (100), each on its own connection, established
                  C at a time (50), each retried up to R times (4) with
                  the client's backoff on failures (docs/scalability.md §7), held
                  --hold-s (5), closed: rate, failures by status, busy
                  answers, retries, server CPU and memory per session.
                  --security/--user/--cert as for the client commands (the
                  password from UASCALE_PASSWORD); each session subscribes
                  to NODE (i=2258) publishing every --publishing-ms (1000)
                  unless --subscribe off (--subscribe after: once every
                  session is up, the server's CPU given apart for the
                  two), and the sessions that get a data change while
                  held are counted (all notified?);
                  --processes P (1) runs the sessions in P child processes
  bench publish   S sessions (10) x N subscriptions (1) x K items (10) on the
                  NODEs (round robin; --load-nodes L adds uascale's
                  ns=2;s=Demo.Load.Node0..L-1; default the four
                  Demo.Dynamic nodes), publishing every --interval-ms (100),
                  sampling every --sampling-ms (the publishing interval),
                  C sessions opening at once through the client's connect
                  gate: notifications/s, lateness (arrival minus source
                  timestamp), how many were on time (lateness within
                  --on-time-ms, default the publishing interval + 10 %)
                  and their share, lost messages, server CPU per
                  notification
  bench storm     N clients (100) connect at once, each on its own connection
                  and session. --behaviour naive: each attempt (TCP,
                  OpenSecureChannel, CreateSession, ActivateSession) gets
                  --timeout-s (3); after any failure or timeout a new attempt
                  at once, until --duration-s (30); cooperative: the shipped
                  client (Client::open): the backoff of docs/scalability.md §7 with
                  retry-after hints as a lower bound, transient statuses only,
                  at most R retries (4), at most C connecting at once through
                  a connect gate (--gate, 50, split over the processes);
                  mixed (default): half each. --processes P (1) runs the
                  clients in P child processes (one process may hold only so
                  many open files); --source-ips binds them round robin to
                  local addresses (loopback: about 28,000 ports per address
                  pair). --steady N sessions (0), each subscribed to i=2258
                  every --publishing-ms (100), are set up first; their
                  lateness is measured --before-s (2) before the storm,
                  during it, and --after-s (2) after. Reported: established
                  over time, attempts, retries, failures by status and stage,
                  busy answers by stage (connect ERR, session ServiceFault,
                  BadTooManySessions) with and without a RetryAfterMs hint,
                  the hints (min/p50/max), time to establish (p50/p99/max),
                  clients unestablished at the end, sessions left behind
                  (by the clients, and by the server's ServerDiagnostics
                  counters read through a separate session), server CPU and
                  RSS with --server-pid. Security and identity options as
                  for bench sessions
  bench fairness  F clients (1) keep W Reads (500) in flight each while V
                  victims (1) read one at a time, all of NODE (uascale's
                  slow asynchronous ns=2;s=Demo.Slow.0); --warmup-s (2) then
                  --duration-s (10) measured: per role, Reads/s per client,
                  busy answers/s, latency p50/p99/max, errors; run it
                  against servers with each requests.isolation_profile
  bench rogue     one client making the server keep all it will, next to a
                  victim subscription (--victim-items 100 at --victim-ms
                  100); --variant items (default): --items (999900) in
                  --subscriptions (11) with queues of --queue (1000), the
                  fastest sampling, no Publish; subscriptions: S (25000)
                  subscriptions of one item, --publishes (20) Publishes
                  parked and never acknowledged; continuation: --sessions
                  (1000) sessions holding all the Browse continuation
                  points they get; events: --items (10000) event items
                  with --select (1000) select clauses. For --duration-s (30): server RSS
                  baseline/peak/end (--server-pid), the rogue's refusals
                  by status, the victim's values/s, losses and lateness
  bench floor     the floor of a publish round trip: `floor serve` echoes
                  every message with one read and one write; the client
                  opens N sockets (1000), C at a time (50), sends B bytes
                  (100) on each every I ms (1000) and reads the echo;
                  --warmup-s (3) then --duration-s (10): round trips/s,
                  latency, server CPU per round trip and per socket-second
                  (compare with bench sessions --publishing-ms I holding)
  bench failover  S sessions (50) through a cluster's front end, set up C at
                  a time (20), each with a subscription (--interval-ms,
                  500) on NODE (i=2258); after --kill-after-s (5) kills
                  --kill-pid with SIGKILL (with --drain: SIGTERM, the
                  node drains), watches --duration-s (15): sessions moved,
                  time to resume p50/p99/max, each moved session's
                  notification gap p50/p99/max, resumed within 5 s,
                  notifications lost, duplicates, sessions recreated, the steady
                  lateness from the setup to the kill (run against nodes
                  without --cluster for mirroring off). Security, identity
                  and --source-ips as for bench sessions. No series

  An opc.https URL is taken by bench read, sessions, publish and storm
  (--pki DIR judges the server's TLS certificate by its trust list,
  --trust-server accepts any); fairness, rogue and failover refuse one,
  saying why, and floor takes HOST:PORT.

  All sample their series every --interval-s (1). Progress goes to stderr
  (a bar on a terminal, a line per sample otherwise); stdout gets only the
  summary, or JSON with --json (with the series); --report writes an HTML
  page with the summary and plots";

/// The server's CPU time so far (all its threads) and its resident memory.
#[derive(Debug, Clone, Copy)]
struct ServerSample {
    cpu: Duration,
    rss_bytes: u64,
}

/// Per server process: each thread's CPU time at the last sample, and the
/// sum of the threads that have exited since sampling started. A thread's
/// schedstat goes with it (the blocking pool's threads exit after 10 s
/// idle, taking the RSA work of an establishment with them), so without
/// this a later sample could read less CPU than an earlier one.
type ThreadTimes = std::collections::HashMap<u32, (std::collections::HashMap<u64, u64>, u64)>;
static THREAD_TIMES: std::sync::Mutex<Option<ThreadTimes>> = std::sync::Mutex::new(None);

fn sample_server(pid: u32) -> Option<ServerSample> {
    // schedstat gives nanoseconds on the CPU per thread; stat's ticks are
    // 10 ms coarse, so use them only when schedstat is missing.
    let mut threads = std::collections::HashMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let tid = t.file_name().to_str().and_then(|n| n.parse::<u64>().ok());
            if let (Some(tid), Ok(s)) = (tid, std::fs::read_to_string(t.path().join("schedstat"))) {
                if let Some(v) = s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    threads.insert(tid, v);
                }
            }
        }
    }
    let cpu = if !threads.is_empty() {
        let live: u64 = threads.values().sum();
        let mut times = THREAD_TIMES.lock().unwrap_or_else(|e| e.into_inner());
        let (last, gone) = times
            .get_or_insert_with(Default::default)
            .entry(pid)
            .or_default();
        *gone += last
            .iter()
            .filter(|(tid, _)| !threads.contains_key(tid))
            .map(|(_, ns)| ns)
            .sum::<u64>();
        *last = threads;
        Duration::from_nanos(live + *gone)
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

/// The parsed command line of one bench.
struct Args {
    /// `read`, `sessions`, `publish` or `storm`.
    kind: &'static str,
    /// Everything after `uascale bench KIND`, for the report.
    raw: Vec<String>,
    url: String,
    flags: BTreeMap<String, Vec<String>>,
    json: bool,
}

impl Args {
    fn parse(kind: &'static str, args: &[&str], known: &[&str]) -> Result<Self, String> {
        let mut url = None;
        let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut json = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match *a {
                "--json" => json = true,
                // Switches without a value.
                "--trust-server" | "--drain" | "--ignore-hints" | "--split-behaviours"
                    if known.contains(a) =>
                {
                    flags
                        .entry((*a).to_owned())
                        .or_default()
                        .push("true".into());
                }
                f if known.contains(&f) || f == "--report" || f == "--interval-s" => {
                    let v = it.next().ok_or_else(|| format!("{f} needs a value"))?;
                    flags.entry(f.to_owned()).or_default().push((*v).to_owned());
                }
                f if f.starts_with("--") => return Err(format!("unknown option {f:?}")),
                u if url.is_none() => url = Some(u.to_owned()),
                other => return Err(format!("unexpected argument {other:?}")),
            }
        }
        Ok(Args {
            kind,
            raw: args.iter().map(|a| (*a).to_owned()).collect(),
            url: url.ok_or("the server URL is missing")?,
            flags,
            json,
        })
    }

    fn last(&self, name: &str) -> Option<&str> {
        self.flags
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.last(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{name} {v:?} is not a valid number")),
        }
    }

    fn seconds(&self, name: &str, default: f64) -> Result<Duration, String> {
        let s: f64 = self.num(name, default)?;
        Duration::try_from_secs_f64(s)
            .map_err(|_| format!("{name} {s} is not a duration in seconds"))
    }

    /// `--interval-s`: how often the series is sampled (1 s; at least
    /// 50 ms).
    fn interval(&self) -> Result<Duration, String> {
        let d = self.seconds("--interval-s", 1.0)?;
        if d < Duration::from_millis(50) {
            return Err("--interval-s must be at least 0.05".into());
        }
        Ok(d)
    }

    fn server_pid(&self) -> Result<Option<u32>, String> {
        self.last("--server-pid")
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("--server-pid {v:?} is not a process id"))
            })
            .transpose()
    }

    /// The command as typed, for the report.
    fn command_line(&self) -> String {
        let mut s = format!("uascale bench {}", self.kind);
        for a in &self.raw {
            s.push(' ');
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
            {
                s.push_str(a);
            } else {
                s.push('\'');
                s.push_str(&a.replace('\'', "'\\''"));
                s.push('\'');
            }
        }
        s
    }
}

/// `--source-ips IP,IP,...`: local addresses to spread connections over
/// (none when not given).
fn source_ips(a: &Args) -> Result<Vec<std::net::IpAddr>, String> {
    match a.last("--source-ips") {
        None => Ok(vec![]),
        Some(list) => list
            .split(',')
            .map(|ip| {
                ip.trim()
                    .parse()
                    .map_err(|_| format!("--source-ips: {ip:?} is not an IP address"))
            })
            .collect(),
    }
}

/// A finished bench: the summary as rows for the table and the report, and
/// the JSON document.
pub(crate) struct Outcome {
    /// One line above the table.
    title: String,
    /// Label and value, in order.
    rows: Vec<(String, String)>,
    json: serde_json::Value,
    /// The plots of the report.
    charts: Vec<report::Chart>,
}

/// Runs `uascale bench KIND ARGS...`.
/// Subscribes `client` at `interval` to one monitored item and checks that
/// the server created it: a Bad item result is returned as a service
/// error, no result as a decode error. The benches that hold a
/// subscription per session set them up this way.
async fn subscribe_one(
    client: &uascale_client::Client,
    interval: Duration,
    item: uascale_client::MonitorItem,
) -> Result<uascale_client::Subscription, uascale_client::ClientError> {
    use uascale_client::ClientError;
    let sub = client
        .subscribe(uascale_client::SubscriptionSettings::with_interval(
            interval,
        ))
        .await?;
    let created = sub.monitor(vec![item]).await?;
    match created.first().map(|m| m.result.status_code) {
        Some(s) if s.is_good() => Ok(sub),
        Some(status) => Err(ClientError::Service {
            status,
            retry_after_ms: None,
            retry_ticket: None,
        }),
        None => Err(ClientError::Decode("no monitored item result".into())),
    }
}

pub fn run(args: &[&str]) -> ExitCode {
    let context = Context::now();
    let result = match args {
        [_, rest @ ..] if rest.iter().any(|a| *a == "-h" || *a == "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        ["read", rest @ ..] => Args::parse("read", rest, read::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(read::run(&a))?, a))),
        // A child process of `bench sessions --processes P`.
        ["sessions", rest @ ..] if std::env::var_os(sessions::workers::WORKER_ENV).is_some() => {
            return sessions::workers::child(rest);
        }
        ["sessions", rest @ ..] => Args::parse("sessions", rest, sessions::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(sessions::run(&a))?, a))),
        ["publish", rest @ ..] => Args::parse("publish", rest, publish::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(publish::run(&a))?, a))),
        ["floor", "serve", rest @ ..] => {
            return match runtime().and_then(|rt| rt.block_on(floor::serve(rest))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("uascale bench floor serve: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        ["floor", rest @ ..] => Args::parse("floor", rest, floor::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(floor::run(&a))?, a))),
        ["failover", rest @ ..] => Args::parse("failover", rest, failover::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(failover::run(&a))?, a))),
        ["fairness", rest @ ..] => Args::parse("fairness", rest, fairness::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(fairness::run(&a))?, a))),
        ["rogue", rest @ ..] => Args::parse("rogue", rest, rogue::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(rogue::run(&a))?, a))),
        // A child process of `bench storm --processes P`.
        ["storm", rest @ ..] if std::env::var_os(storm::WORKER_ENV).is_some() => {
            return storm::child(rest);
        }
        ["storm", rest @ ..] => Args::parse("storm", rest, storm::FLAGS)
            .and_then(|a| Ok((runtime()?.block_on(storm::run(&a))?, a))),
        _ => Err(format!(
            "unknown bench; one of: read, sessions, publish, storm, fairness, rogue, floor, failover\n{USAGE}"
        )),
    };
    match result.and_then(|(mut outcome, a)| {
        context.add_to(&mut outcome);
        emit(&a, &outcome)
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uascale bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// When a run started, how busy the machine was and on which CPU
/// (numbers from a shared machine mean little without it; the same
/// virtual machine has landed on CPUs whose RSA differed fourfold).
struct Context {
    started_utc: String,
    load_average: Option<String>,
    cpu: Option<String>,
}

impl Context {
    fn now() -> Self {
        Context {
            started_utc: uascale_types::DateTime::from_system_time(std::time::SystemTime::now())
                .to_string(),
            load_average: load_average(),
            cpu: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|c| cpu_of(&c)),
        }
    }

    /// Adds the start and the load averages (then and now) to the rows and
    /// the JSON.
    fn add_to(&self, outcome: &mut Outcome) {
        let end = load_average();
        let load = match (&self.load_average, &end) {
            (Some(a), Some(b)) => Some(format!("{a} at the start, {b} at the end")),
            _ => None,
        };
        outcome
            .rows
            .push(("started (UTC)".into(), self.started_utc.clone()));
        if let Some(l) = &load {
            outcome.rows.push(("load average".into(), l.clone()));
        }
        if let Some(c) = &self.cpu {
            outcome.rows.push(("cpu".into(), c.clone()));
        }
        if let Some(o) = outcome.json.as_object_mut() {
            o.insert("started_utc".into(), self.started_utc.clone().into());
            o.insert("cpu".into(), self.cpu.clone().into());
            o.insert("loadavg_start".into(), self.load_average.clone().into());
            o.insert("loadavg_end".into(), end.into());
        }
    }
}

/// The load averages over 1, 5 and 15 minutes (`/proc/loadavg`).
fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// The first processor of `/proc/cpuinfo` text: its model name, family
/// and model, and whether it has AVX-512 (`avx512f`; with `avx512ifma`
/// RSA runs several times faster): "AMD EPYC (family 23, model 1; no
/// AVX-512)". `None` without a model name.
fn cpu_of(cpuinfo: &str) -> Option<String> {
    let first = cpuinfo.split("\n\n").next()?;
    let field = |name: &str| {
        first.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_owned())
        })
    };
    let model_name = field("model name")?;
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let avx512 = match (has("avx512f"), has("avx512ifma")) {
        (true, true) => "AVX-512 with IFMA",
        (true, false) => "AVX-512 without IFMA",
        _ => "no AVX-512",
    };
    let mut out = model_name;
    match (field("cpu family"), field("model")) {
        (Some(f), Some(m)) => out.push_str(&format!(" (family {f}, model {m}; {avx512})")),
        _ => out.push_str(&format!(" ({avx512})")),
    }
    Some(out)
}

/// Prints the summary (or the JSON) and writes the report.
fn emit(a: &Args, outcome: &Outcome) -> Result<(), String> {
    if let Some(path) = a.last("--report") {
        let html = report::page(
            &a.command_line(),
            &outcome.title,
            &outcome.rows,
            &outcome.charts,
        );
        std::fs::write(path, html).map_err(|e| format!("--report {path}: {e}"))?;
        eprintln!("report written to {path}");
    }
    if a.json {
        let text = serde_json::to_string_pretty(&outcome.json)
            .map_err(|e| format!("cannot encode the JSON: {e}"))?;
        println!("{text}");
    } else {
        println!("{}", outcome.title);
        let width = outcome.rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (k, v) in &outcome.rows {
            println!("  {k:<width$}  {v}");
        }
    }
    Ok(())
}

/// A multi-threaded runtime, or a single-threaded one when the process may
/// use one core only (`taskset -c 1`): one worker thread there would only
/// add hand-offs between it and the thread that samples.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut b = if cores == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    b.enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// Counts by status.
type StatusCounts = BTreeMap<StatusCode, u64>;

fn count_status(counts: &mut StatusCounts, status: StatusCode, n: u64) {
    *counts.entry(status).or_insert(0) += n;
}

/// `BadTimeout: 3, BadNodeIdUnknown: 1`, or `none`.
fn list_counts(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The counts by status name (`BadTimeout`), for output.
fn named(counts: &StatusCounts) -> BTreeMap<String, u64> {
    counts.iter().map(|(s, n)| (s.to_string(), *n)).collect()
}

fn merge_counts(into: &mut StatusCounts, from: &StatusCounts) {
    for (s, n) in from {
        count_status(into, *s, *n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU line comes from the first processor's block.
    #[test]
    fn the_cpu_is_named_from_cpuinfo() {
        let two = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\n\
                   model\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 adx\n\n\
                   processor\t: 1\nmodel name\t: Other\n";
        assert_eq!(
            cpu_of(two).as_deref(),
            Some("AMD EPYC (family 23, model 1; no AVX-512)")
        );
        let ifma = "model name\t: Xeon\ncpu family\t: 6\nmodel\t\t: 106\n\
                    flags\t\t: avx512f avx512ifma\n";
        assert_eq!(
            cpu_of(ifma).as_deref(),
            Some("Xeon (family 6, model 106; AVX-512 with IFMA)")
        );
        assert_eq!(
            cpu_of("model name : Arm\nflags : neon\n").as_deref(),
            Some("Arm (no AVX-512)")
        );
        assert_eq!(cpu_of("processor : 0\n"), None);
        assert_eq!(cpu_of(""), None);
    }

    /// A thread that worked and exited still counts: the CPU time read
    /// after it is gone is not less than before.
    #[test]
    fn server_cpu_keeps_exited_threads() {
        let pid = std::process::id();
        // The thread's own time on a CPU (the first field of schedstat, in
        // ns): it spins until it has had 200 ms, however busy the machine.
        fn own_cpu() -> Duration {
            let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
            Duration::from_nanos(s.split_whitespace().next().unwrap().parse().unwrap())
        }
        let busy = std::thread::spawn(|| {
            let start = own_cpu();
            let mut x = 0u64;
            while own_cpu() - start < Duration::from_millis(200) {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            }
            // Sampled while this thread is still alive.
            let during = sample_server(std::process::id()).unwrap();
            (x, during)
        });
        let (_, during) = busy.join().unwrap();
        let after = sample_server(pid).unwrap();
        assert!(
            during.cpu >= Duration::from_millis(150),
            "the busy thread's time counts: {:?}",
            during.cpu
        );
        assert!(
            after.cpu >= during.cpu,
            "{:?} after the thread exited, {:?} before",
            after.cpu,
            during.cpu
        );
    }
}
