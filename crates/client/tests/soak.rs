//! The chaos soak: many secured sessions, each with a
//! subscription, held through the chaos relay for a long time while the
//! relay now and then resets connections in the middle of a chunk and cuts
//! all of them; the server's RSS and its session, channel and subscription
//! counts are sampled as it goes. A measurement, not a test: it is
//! `#[ignore]`d and runs against a server in another process, started by
//! `bench/soak.sh` (see docs/testing.md, "The soak"):
//!
//! ```text
//! SOAK_URL=opc.tcp://127.0.0.1:4855 SOAK_METRICS=127.0.0.1:9465 SOAK_SERVER_PID=1234 \
//!   cargo test --release -p uascale-client --test soak -- --ignored --nocapture
//! ```
//!
//! Settings (environment): `SOAK_SESSIONS` (1000), `SOAK_SECONDS` (1800),
//! `SOAK_SAMPLE_S` (60), `SOAK_CHAOS_S` (60: every so often, `SOAK_RESETS`
//! (10) connections are reset mid-chunk), `SOAK_CUT_EVERY` (5: every fifth
//! chaos round cuts every connection), `SOAK_SECURITY` (`SignAndEncrypt`,
//! `Sign` or `None`), `SOAK_PUBLISHING_MS` (1000), `SOAK_CONCURRENCY` (16
//! sessions established at once).

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::chaos::{Chaos, Dir};
use uascale_client::{
    Backoff, Client, ClientOptions, ConnectGate, MonitorItem, SecurityOptions, ServerTrust,
    SubscriptionEvent, SubscriptionSettings,
};
use uascale_crypto::policy::SecurityPolicy;
use uascale_types as t;
use uascale_types::NodeId;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the sessions saw, summed.
#[derive(Default)]
struct Totals {
    established: AtomicU64,
    failed: AtomicU64,
    messages: AtomicU64,
    republished: AtomicU64,
    /// A sequence number that was not the one after the last (after a
    /// re-created subscription the count starts anew and is not a gap).
    gaps: AtomicU64,
    lost: AtomicU64,
    restored: AtomicU64,
    ended: AtomicU64,
}

/// The server's RSS in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The server's gauges from its metrics endpoint: sessions (active),
/// channels, connections, subscriptions.
fn scrape(addr: &str) -> Option<[i64; 4]> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let gauge = |name: &str| {
        body.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(-1, |v| v as i64)
    };
    Some([
        gauge("opcua_server_sessions{state=\"active\"}"),
        gauge("opcua_server_channels_open "),
        gauge("opcua_server_connections_open "),
        gauge("opcua_server_subscriptions "),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long measurement against a server process; run by bench/soak.sh"]
async fn soak() {
    let url = std::env::var("SOAK_URL").expect("SOAK_URL: the server (bench/soak.sh starts one)");
    let metrics = std::env::var("SOAK_METRICS").expect("SOAK_METRICS: its metrics endpoint");
    let pid: u32 = env("SOAK_SERVER_PID", 0);
    let sessions: usize = env("SOAK_SESSIONS", 1000);
    let seconds: u64 = env("SOAK_SECONDS", 1800);
    let sample = Duration::from_secs(env("SOAK_SAMPLE_S", 60));
    let chaos_every = Duration::from_secs(env("SOAK_CHAOS_S", 60));
    let resets: usize = env("SOAK_RESETS", 10);
    let cut_every: u64 = env("SOAK_CUT_EVERY", 5);
    let publishing = Duration::from_millis(env("SOAK_PUBLISHING_MS", 1000));
    let concurrency: usize = env("SOAK_CONCURRENCY", 16);
    let mode = match std::env::var("SOAK_SECURITY").as_deref() {
        Ok("None") => t::MessageSecurityMode::None,
        Ok("Sign") => t::MessageSecurityMode::Sign,
        _ => t::MessageSecurityMode::SignAndEncrypt,
    };

    let (host, port) = uascale_client::net::parse_url(&url).expect("SOAK_URL");
    let target = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolves")
        .next()
        .expect("an address");
    let chaos = Chaos::start(target).await;
    let via = chaos.url();

    let mut backoff = Backoff::default();
    backoff.initial = Duration::from_millis(200);
    backoff.max = Duration::from_secs(5);
    let mut options = ClientOptions {
        backoff,
        connect_gate: Some(ConnectGate::new(concurrency)),
        connect_attempts: 10,
        ..Default::default()
    };
    if mode != t::MessageSecurityMode::None {
        options.security = SecurityOptions {
            policy: SecurityPolicy::Basic256Sha256,
            mode,
            certificate: Some(common::client_identity("soak client")),
            server_certificate: None,
            trust: ServerTrust::UnsafeAcceptAny,
        };
        // The server certificate once, not per session.
        let endpoint = Client::find_endpoint(&via, &options)
            .await
            .expect("the server's endpoint");
        options.security.server_certificate =
            endpoint.server_certificate.as_bytes().map(<[u8]>::to_vec);
    }

    let totals = Arc::new(Totals::default());
    let started = Instant::now();
    let rss_start = rss_kib(pid);
    eprintln!(
        "soak: {sessions} sessions ({mode:?}) through the chaos relay to {url}, {seconds} s, \
         server pid {pid} at {rss_start} KiB before"
    );
    let mut clients = tokio::task::JoinSet::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    for i in 0..sessions {
        let (via, options, totals) = (via.clone(), options.clone(), Arc::clone(&totals));
        let mut stop = stop_rx.clone();
        clients.spawn(async move {
            let mut report = Default::default();
            let client = match Client::open(&via, options, &format!("soak {i}"), &mut report).await
            {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("session {i}: {e}");
                    totals.failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            let sub = async {
                let sub = client
                    .subscribe(SubscriptionSettings::with_interval(publishing))
                    .await?;
                sub.monitor(vec![MonitorItem::value(NodeId::string(
                    2,
                    "Demo.Dynamic.Counter",
                ))])
                .await?;
                Ok::<_, uascale_client::ClientError>(sub)
            };
            let mut sub = match sub.await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("session {i}: subscription: {e}");
                    totals.failed.fetch_add(1, Ordering::Relaxed);
                    client.close().await;
                    return;
                }
            };
            totals.established.fetch_add(1, Ordering::Relaxed);
            let mut last: Option<u32> = None;
            loop {
                let ev = tokio::select! {
                    ev = sub.recv() => ev,
                    _ = stop.wait_for(|s| *s) => break,
                };
                match ev {
                    Some(SubscriptionEvent::Notifications {
                        sequence_number,
                        republished,
                        ..
                    }) => {
                        totals.messages.fetch_add(1, Ordering::Relaxed);
                        totals
                            .republished
                            .fetch_add(u64::from(republished), Ordering::Relaxed);
                        if last.is_some_and(|l| sequence_number != l.wrapping_add(1)) {
                            totals.gaps.fetch_add(1, Ordering::Relaxed);
                        }
                        last = Some(sequence_number);
                    }
                    Some(SubscriptionEvent::Lost { count, .. }) => {
                        totals.lost.fetch_add(u64::from(count), Ordering::Relaxed);
                    }
                    Some(SubscriptionEvent::Restored(how)) => {
                        totals.restored.fetch_add(1, Ordering::Relaxed);
                        if how == uascale_client::Restore::Recreated {
                            last = None;
                        }
                    }
                    Some(SubscriptionEvent::KeepAlive { .. }) => {}
                    Some(SubscriptionEvent::Ended(_)) | None => {
                        totals.ended.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
            drop(sub);
            client.close().await;
        });
    }

    println!(
        "{:>6} {:>10} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>10} {:>7} {:>5} {:>5} {:>8}",
        "min",
        "RSS KiB",
        "sessions",
        "channels",
        "subscr.",
        "estab",
        "failed",
        "chaos",
        "messages",
        "republ",
        "gaps",
        "lost",
        "restored"
    );
    let row = |label: String| {
        let [s, ch, _conn, sub] = scrape(&metrics).unwrap_or([-1; 4]);
        let c = chaos.counts();
        println!(
            "{:>6} {:>10} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>10} {:>7} {:>5} {:>5} {:>8}",
            label,
            rss_kib(pid),
            s,
            ch,
            sub,
            totals.established.load(Ordering::Relaxed),
            totals.failed.load(Ordering::Relaxed),
            c.reset + c.cut,
            totals.messages.load(Ordering::Relaxed),
            totals.republished.load(Ordering::Relaxed),
            totals.gaps.load(Ordering::Relaxed),
            totals.lost.load(Ordering::Relaxed),
            totals.restored.load(Ordering::Relaxed),
        );
    };
    row("0".into());
    let end = started + Duration::from_secs(seconds);
    let mut next_sample = started + sample;
    let mut next_chaos = started + chaos_every;
    let mut round = 0u64;
    let mut last_row = started;
    while Instant::now() < end {
        let now = Instant::now();
        let wake = next_sample.min(next_chaos).min(end);
        tokio::time::sleep(wake.saturating_duration_since(now)).await;
        let now = Instant::now();
        if now >= next_chaos && now < end {
            round += 1;
            if cut_every > 0 && round % cut_every == 0 {
                chaos.cut();
            } else {
                for k in 0..resets {
                    let dir = if k % 2 == 0 { Dir::Down } else { Dir::Up };
                    chaos.reset_mid_chunk(dir);
                    let armed = Instant::now();
                    while chaos.reset_pending(dir) && armed.elapsed() < Duration::from_secs(10) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            next_chaos += chaos_every;
        }
        if now >= next_sample {
            row(format!("{:.1}", started.elapsed().as_secs_f64() / 60.0));
            last_row = Instant::now();
            next_sample += sample;
        }
    }
    if last_row.elapsed() > Duration::from_secs(1) {
        row(format!("{:.1}", started.elapsed().as_secs_f64() / 60.0));
    }
    // The clients close their sessions; the server must come back to none.
    stop_tx.send_replace(true);
    while clients.join_next().await.is_some() {}
    let gone = Instant::now();
    while gone.elapsed() < Duration::from_secs(60) {
        if scrape(&metrics).is_some_and(|[s, ch, _, sub]| s == 0 && ch == 0 && sub == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    row("closed".into());
    let c = chaos.counts();
    println!(
        "relay: {} connections accepted, {} reset mid-chunk, {} cut",
        c.accepted, c.reset, c.cut
    );
    assert_eq!(totals.failed.load(Ordering::Relaxed), 0, "sessions failed");
    assert_eq!(totals.gaps.load(Ordering::Relaxed), 0, "sequence gaps");
    assert_eq!(
        scrape(&metrics).map(|[s, ch, _, sub]| (s, ch, sub)),
        Some((0, 0, 0)),
        "the server holds nothing once the clients left"
    );
}
