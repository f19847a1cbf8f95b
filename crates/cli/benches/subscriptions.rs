//! Benchmark (not a test): N sessions, each with one subscription and one
//! monitored item on the shared `ns=2;s=Demo.Dynamic.Counter`, which the
//! server changes every `RATE_MS`; every change is pushed to every item and
//! published. Reports notifications/s delivered, server CPU per
//! notification (from /proc), server threads and memory per session.
//!
//!     cargo bench -p uascale --bench subscriptions             # 5,000 and 10,000
//!     SESSIONS=2000 RATE_MS=200 cargo bench -p uascale --bench subscriptions
//!
//! The client is a plain blocking client (several threads, each reading its
//! sessions round-robin), in this process; the server is `uascale serve`
//! (release) in its own.

#[path = "../../server/tests/common/mod.rs"]
mod common;
#[path = "../tests/common/mod.rs"]
mod served;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::RawClient;
use served::{proc_status, serve_logged};
use uascale_types::{DataChangeNotification, NodeId, PublishResponse, SubscriptionAcknowledgement};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (threads, resident KiB, CPU seconds) of a process.
fn proc_stats(pid: u32) -> (u64, u64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime is the
    // 12th, stime the 13th; clock ticks of 1/100 s on Linux.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    (
        proc_status(pid, "Threads:"),
        proc_status(pid, "VmRSS:"),
        ticks as f64 / 100.0,
    )
}

/// A session with one subscription and one item on the counter, and two
/// Publishes parked.
fn setup(c: &mut RawClient) {
    c.session();
    c.send_create_subscription(6000, 100);
    let sub = c.read_subscription_id();
    c.send_monitor(sub, NodeId::string(2, "Demo.Dynamic.Counter"));
    let _ = c.read_response();
    c.publish(vec![]);
    c.publish(vec![]);
}

/// Reads one response of `c`, acknowledges and replaces the Publish;
/// returns the data-change notifications it carried.
fn pump(c: &mut RawClient) -> u64 {
    let (_, m) = c.read_response();
    let Some(p) = m.as_any().downcast_ref::<PublishResponse>() else {
        panic!("not a PublishResponse: {m:?}");
    };
    let n: u64 = p
        .notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
        .map(|d| d.monitored_items.as_ref().map_or(0, |v| v.len() as u64))
        .sum();
    let acks = if n > 0 {
        vec![SubscriptionAcknowledgement {
            subscription_id: p.subscription_id,
            sequence_number: p.notification_message.sequence_number,
        }]
    } else {
        vec![]
    };
    c.publish(acks);
    n
}

fn run(sessions: usize, rate_ms: u64, threads: usize, seconds: u64) {
    let server = serve_logged(["--rate-ms".to_owned(), rate_ms.to_string()]);
    let pid = server.child.id();
    let addr = SocketAddr::from(([127, 0, 0, 1], server.port));
    std::thread::sleep(Duration::from_millis(300));
    let (_, rss0, _) = proc_stats(pid);
    let t_setup = Instant::now();
    let counted = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(threads + 1));
    let mut handles = Vec::new();
    for t in 0..threads {
        let n = sessions / threads + usize::from(t < sessions % threads);
        let (counted, measuring, stop, ready) = (
            Arc::clone(&counted),
            Arc::clone(&measuring),
            Arc::clone(&stop),
            Arc::clone(&ready),
        );
        handles.push(std::thread::spawn(move || {
            let mut clients: Vec<RawClient> = (0..n)
                .map(|_| {
                    let mut c = RawClient::connect(addr);
                    setup(&mut c);
                    c
                })
                .collect();
            ready.wait();
            let mut seen = vec![0u64; n];
            while !stop.load(Ordering::Relaxed) {
                for (i, c) in clients.iter_mut().enumerate() {
                    let got = pump(c);
                    if measuring.load(Ordering::Relaxed) {
                        seen[i] += got;
                        counted.fetch_add(got, Ordering::Relaxed);
                    }
                }
            }
            seen.iter().filter(|&&s| s == 0).count()
        }));
    }
    ready.wait();
    let setup_s = t_setup.elapsed().as_secs_f64();
    let (threads_srv, rss1, _) = proc_stats(pid);
    // Warm up, then measure.
    std::thread::sleep(Duration::from_secs(2));
    let (_, _, cpu0) = proc_stats(pid);
    let t0 = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(seconds));
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let (_, rss2, cpu1) = proc_stats(pid);
    let notifications = counted.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let silent: usize = handles
        .into_iter()
        .map(|h| h.join().unwrap_or(usize::MAX))
        .sum();
    let expected = sessions as f64 * 1000.0 / rate_ms as f64;
    println!(
        "{sessions} sessions (1 subscription + 1 item each, counter every {rate_ms} ms): \
         set up in {setup_s:.1} s; {:.0} notifications/s delivered (ideal {expected:.0}); \
         server CPU {:.2} us per notification ({:.0} % of a core); server threads {threads_srv}; \
         server memory {:.1} KiB per session after setup, {:.1} KiB at the end; \
         sessions without a notification in the window: {silent}",
        notifications as f64 / elapsed,
        (cpu1 - cpu0) * 1e6 / notifications.max(1) as f64,
        (cpu1 - cpu0) * 100.0 / elapsed,
        rss1.saturating_sub(rss0) as f64 / sessions as f64,
        rss2.saturating_sub(rss0) as f64 / sessions as f64,
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs it too,
    // where a short smoke run is enough.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let rate = env_or("RATE_MS", 1000);
    let threads = env_or("CLIENT_THREADS", 4) as usize;
    let seconds = env_or("SECONDS", 5);
    if let Ok(n) = std::env::var("SESSIONS") {
        run(n.parse().unwrap_or(5000), rate, threads, seconds);
    } else if smoke {
        run(50, rate, 2, 1);
    } else {
        run(5000, rate, threads, seconds);
        run(10_000, rate, threads, seconds);
    }
}
