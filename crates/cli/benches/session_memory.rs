//! Benchmark (not a test): the server's resident memory per connection and
//! session. For each shape a fresh `uascale serve` (release) is started,
//! `WARMUP` sessions of that shape are opened (so one-time costs - code
//! pages, tables, allocator arenas - are paid), its RSS is read, then
//! `SESSIONS` more are opened, each on its own TCP connection, and after a
//! pause the RSS grown, divided by `SESSIONS`, is reported. Shapes:
//!
//! - `channel`: a connection with an open secure channel (None), no session;
//! - `bare`: plus an activated anonymous session, diagnostics on (default);
//! - `bare-nodiag`: the same with `diagnostics_enabled = false`;
//! - `subscription`: `bare` plus one subscription, one monitored item on
//!   `ns=2;s=Demo.Dynamic.Counter` and two parked Publishes (the first
//!   notification read and acknowledged), diagnostics on.
//!
//! ```text
//! cargo bench -p uascale --bench session_memory                  # 5,000 per shape
//! SESSIONS=10000 SHAPES=bare,subscription cargo bench -p uascale --bench session_memory
//! ```
//!
//! With `SERVER_ADDR=127.0.0.1:PORT SERVER_PID=PID` it measures a server
//! started by hand (one shape, `SHAPES=...`) instead of starting its own.
//!
//! Kernel socket buffers are not in a process's RSS and are not counted;
//! the client (this process, blocking sockets, 4 threads) is not measured.

#[path = "../../server/tests/common/mod.rs"]
mod common;
#[path = "../tests/common/mod.rs"]
mod served;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::RawClient;
use served::{proc_status, serve_logged, Served};
use uascale_types::{
    CreateMonitoredItemsResponse, NodeId, PublishResponse, SubscriptionAcknowledgement,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    Channel,
    Bare,
    BareNoDiagnostics,
    Subscription,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Channel => "channel",
            Shape::Bare => "bare",
            Shape::BareNoDiagnostics => "bare-nodiag",
            Shape::Subscription => "subscription",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Shape::Channel => "connection + secure channel (None), no session",
            Shape::Bare => "connection + channel + anonymous session, diagnostics on",
            Shape::BareNoDiagnostics => "connection + channel + anonymous session, diagnostics off",
            Shape::Subscription => {
                "bare + 1 subscription + 1 monitored item + 2 parked Publishes, diagnostics on"
            }
        }
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn start(diagnostics: bool) -> Served {
    // The counter stays put: what is measured is the resting state.
    let mut args = vec!["--rate-ms".to_owned(), "3600000".into()];
    let config = (!diagnostics).then(|| {
        let path = std::env::temp_dir().join(format!(
            "uascale-session-memory-{}.toml",
            std::process::id()
        ));
        std::fs::write(&path, "[server]\ndiagnostics_enabled = false\n").expect("write config");
        path
    });
    if let Some(path) = &config {
        args.push("--config".into());
        args.push(path.display().to_string());
    }
    let served = serve_logged(&args);
    // Read at start: no longer needed.
    if let Some(path) = config {
        let _ = std::fs::remove_file(path);
    }
    served
}

/// (VmRSS, RssAnon) of a process, KiB.
fn rss(pid: u32) -> (u64, u64) {
    (proc_status(pid, "VmRSS:"), proc_status(pid, "RssAnon:"))
}

/// Asks for one subscription (the answer is read by [`add_item`]).
fn create_subscription(c: &mut RawClient) {
    c.send_create_subscription(30_000, 10_000);
}

/// Reads the subscription, adds one item and parks two Publishes.
fn add_item(c: &mut RawClient) {
    let sub = c.read_subscription_id();
    c.send_monitor(sub, NodeId::string(2, "Demo.Dynamic.Counter"));
    c.publish(vec![]);
    c.publish(vec![]);
    let (_, m) = c.read_response();
    assert!(
        m.as_any()
            .downcast_ref::<CreateMonitoredItemsResponse>()
            .is_some_and(|r| r
                .results
                .as_ref()
                .is_some_and(|v| v.iter().all(|x| x.status_code.is_good()))),
        "CreateMonitoredItems failed: {m:?}"
    );
}

/// Reads the first notification (sent at the end of the first publishing
/// interval) and acknowledges it with a new Publish: two stay parked.
fn acknowledge_first(c: &mut RawClient) {
    let (_, m) = c.read_response();
    let p = m
        .as_any()
        .downcast_ref::<PublishResponse>()
        .unwrap_or_else(|| panic!("not a PublishResponse: {m:?}"));
    c.publish(vec![SubscriptionAcknowledgement {
        subscription_id: p.subscription_id,
        sequence_number: p.notification_message.sequence_number,
    }]);
}

/// Opens `n` connections of `shape` from `threads` threads.
fn open(addr: SocketAddr, shape: Shape, n: usize, threads: usize) -> Vec<RawClient> {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let k = n / threads + usize::from(t < n % threads);
            std::thread::spawn(move || {
                let mut clients: Vec<RawClient> = (0..k)
                    .map(|_| {
                        let mut c = RawClient::connect(addr);
                        if shape != Shape::Channel {
                            c.session();
                        }
                        if shape == Shape::Subscription {
                            create_subscription(&mut c);
                        }
                        c
                    })
                    .collect();
                // In phases, so that the first publishing interval of all
                // of them passes once rather than once per session.
                if shape == Shape::Subscription {
                    clients.iter_mut().for_each(add_item);
                    clients.iter_mut().for_each(acknowledge_first);
                }
                clients
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("client thread"))
        .collect()
}

fn run(shape: Shape, sessions: usize, warmup: usize, threads: usize) {
    // SERVER_ADDR and SERVER_PID: measure a server started by hand (under
    // a heap profiler, say) instead of starting one.
    let external = std::env::var("SERVER_ADDR")
        .ok()
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .zip(
            std::env::var("SERVER_PID")
                .ok()
                .and_then(|p| p.parse().ok()),
        );
    let (addr, pid, _server) = match external {
        Some((addr, pid)) => (addr, pid, None),
        None => {
            let s = start(shape != Shape::BareNoDiagnostics);
            (
                SocketAddr::from(([127, 0, 0, 1], s.port)),
                s.child.id(),
                Some(s),
            )
        }
    };
    let warm = open(addr, shape, warmup, threads);
    std::thread::sleep(Duration::from_millis(500));
    let (rss0, anon0) = rss(pid);
    let t = Instant::now();
    let clients = open(addr, shape, sessions, threads);
    let setup_s = t.elapsed().as_secs_f64();
    // Connections let their buffers go after 0.5-1 s of quiet.
    std::thread::sleep(Duration::from_secs(2));
    let (rss1, anon1) = rss(pid);
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1024.0 / sessions as f64;
    println!(
        "{:<12} {sessions} x [{}]: opened in {setup_s:.1} s; server RSS {rss0} -> {rss1} KiB = \
         {:.0} bytes per session ({:.0} of them anonymous)",
        shape.name(),
        shape.describe(),
        per(rss0, rss1),
        per(anon0, anon1),
    );
    // HOLD_S: keep them open a while (to inspect the server meanwhile).
    std::thread::sleep(Duration::from_secs(env_or("HOLD_S", 0)));
    drop(clients);
    drop(warm);
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs it too,
    // where a short smoke run is enough.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let sessions = env_or("SESSIONS", if smoke { 100 } else { 5000 }) as usize;
    let warmup = env_or("WARMUP", if smoke { 10 } else { 200 }) as usize;
    let threads = env_or("CLIENT_THREADS", 4).max(1) as usize;
    let shapes = std::env::var("SHAPES").unwrap_or_default();
    for shape in [
        Shape::Channel,
        Shape::Bare,
        Shape::BareNoDiagnostics,
        Shape::Subscription,
    ] {
        if shapes.is_empty() || shapes.split(',').any(|s| s.trim() == shape.name()) {
            run(shape, sessions, warmup, threads);
        }
    }
}
