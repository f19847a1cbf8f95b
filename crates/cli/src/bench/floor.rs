//! `bench floor`: the floor under a publish round trip - what a server
//! that does nothing but one read and one write per small message costs
//! (the steady keep-alive/notification publish cost is compared with it in
//! the same run).
//!
//! `uascale bench floor serve --port P` is that server: a tokio runtime
//! like uascale's, one task per connection, each message read into a
//! buffer and written back, nothing else. `uascale bench floor
//! HOST:PORT --sockets N --interval-ms I --size B` opens N sockets, sends B
//! bytes on each every I ms and reads the echo; measured after a warm-up:
//! round trips per second, latency, and with `--server-pid` the server's
//! CPU per round trip and per socket-second - directly comparable with
//! `bench sessions --subscribe on --publishing-ms I`'s CPU per
//! session-second while holding (docs/notebook/benchmarks.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::progress::Progress;
use super::series::latency_histogram;
use super::{sample_server, Args, Outcome};

/// The options `bench floor` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--sockets",
    "--interval-ms",
    "--size",
    "--concurrency",
    "--warmup-s",
    "--duration-s",
    "--server-pid",
];

/// `bench floor serve --port P [--bind ADDR]`: the echo server, until
/// killed.
pub async fn serve(args: &[&str]) -> Result<(), String> {
    let mut port = None;
    let mut bind = "127.0.0.1".to_owned();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .map(|v| (*v).to_owned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match *a {
            "--port" => {
                let v = value("--port")?;
                port = Some(
                    v.parse::<u16>()
                        .map_err(|_| format!("--port {v:?} is not a port number"))?,
                );
            }
            "--bind" => bind = value("--bind")?,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    let port = port.ok_or("--port is missing")?;
    let listener = tokio::net::TcpListener::bind((bind.as_str(), port))
        .await
        .map_err(|e| format!("bind {bind}:{port}: {e}"))?;
    eprintln!("floor echo server on {bind}:{port}");
    loop {
        let (mut s, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// Runs the `bench floor` client.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    if a.url.contains("://") {
        return Err(format!(
            "bench floor takes HOST:PORT of a `bench floor serve` echo server \
             (plain TCP, no OPC UA), not the URL {}",
            a.url
        ));
    }
    let sockets: usize = a.num("--sockets", 1000)?;
    let interval_ms: u64 = a.num("--interval-ms", 1000)?;
    let size: usize = a.num("--size", 100)?;
    let concurrency: usize = a.num("--concurrency", 50)?;
    let warmup = a.seconds("--warmup-s", 3.0)?;
    let duration = a.seconds("--duration-s", 10.0)?;
    let pid = a.server_pid()?;
    if sockets == 0 || interval_ms == 0 || size == 0 || size > 4096 || duration.is_zero() {
        return Err(
            "--sockets, --interval-ms and --duration-s must be > 0, --size 1..=4096".into(),
        );
    }
    let addr = a.url.trim_start_matches("tcp://").to_owned();
    let mut progress = Progress::new();
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let trips = Arc::new(AtomicU64::new(0));
    let latency = Arc::new(Mutex::new(latency_histogram()));
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(sockets);
    let interval = Duration::from_millis(interval_ms);
    for i in 0..sockets {
        let permit = Arc::clone(&gate)
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        drop(permit);
        let _ = s.set_nodelay(true);
        if i % 100 == 0 {
            progress.update(
                "connect",
                i as f64 / sockets as f64,
                &format!("{i}/{sockets} sockets"),
            );
        }
        let (stop, measuring, trips, latency) = (
            Arc::clone(&stop),
            Arc::clone(&measuring),
            Arc::clone(&trips),
            Arc::clone(&latency),
        );
        // Spread the sockets over the interval, as subscriptions are.
        let offset = interval.mul_f64(i as f64 / sockets as f64);
        tasks.push(tokio::spawn(async move {
            let message = vec![0x5au8; size];
            let mut back = vec![0u8; size];
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let t0 = Instant::now();
                if s.write_all(&message).await.is_err() || s.read_exact(&mut back).await.is_err() {
                    return;
                }
                if measuring.load(Ordering::Relaxed) {
                    trips.fetch_add(1, Ordering::Relaxed);
                    let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                    if let Ok(mut h) = latency.lock() {
                        h.saturating_record(us.max(1));
                    }
                }
            }
        }));
    }
    progress.update("warm-up", 0.0, "");
    tokio::time::sleep(warmup).await;
    let server_start = pid.and_then(sample_server);
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let server_end = pid.and_then(sample_server);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    progress.finish();
    let n = trips.load(Ordering::Relaxed);
    let h = latency.lock().map_err(|_| "latency lock poisoned")?.clone();
    let pct = |q: f64| (n > 0).then(|| h.value_at_quantile(q) as f64 / 1000.0);
    let mut rows = vec![
        (
            "shape".into(),
            format!("{sockets} sockets x {size} B every {interval_ms} ms, {secs:.1} s measured"),
        ),
        ("round trips/s".into(), format!("{:.0}", n as f64 / secs)),
        (
            "latency p50 / p99".into(),
            format!(
                "{} / {}",
                pct(0.5).map_or("-".into(), |v| format!("{v:.3} ms")),
                pct(0.99).map_or("-".into(), |v| format!("{v:.3} ms"))
            ),
        ),
    ];
    let server = match (server_start, server_end) {
        (Some(a), Some(b)) if n > 0 => {
            let cpu = b.cpu.saturating_sub(a.cpu).as_secs_f64();
            let per_trip_us = cpu * 1e6 / n as f64;
            let per_socket_second_us = cpu * 1e6 / (sockets as f64 * secs);
            rows.push((
                "server CPU".into(),
                format!(
                    "{per_trip_us:.2} us per round trip, {per_socket_second_us:.2} us per socket-second, {:.3} cores busy",
                    cpu / secs
                ),
            ));
            json!({"cpu_s": cpu, "us_per_round_trip": per_trip_us,
                   "us_per_socket_second": per_socket_second_us, "rss_bytes": b.rss_bytes})
        }
        _ => serde_json::Value::Null,
    };
    Ok(Outcome {
        title: format!("bench floor against {addr}"),
        rows,
        json: json!({
            "bench": "floor",
            "address": addr,
            "sockets": sockets,
            "interval_ms": interval_ms,
            "size": size,
            "seconds": secs,
            "round_trips": n,
            "latency_p50_ms": pct(0.5),
            "latency_p99_ms": pct(0.99),
            "server": server,
        }),
        charts: Vec::new(),
    })
}
