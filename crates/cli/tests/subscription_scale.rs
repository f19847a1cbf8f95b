//! Scale: 500 sessions, each with one subscription and one monitored item
//! on the shared, changing `ns=2;s=Demo.Dynamic.Counter`, all notified by
//! one change of the counter. The server runs as its own process (`uascale
//! serve`), so its thread count and memory can be read from /proc; they
//! are printed, not timed (performance lives in the benchmark).

#[path = "../../server/tests/common/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod served;

use std::time::{Duration, Instant};

use common::RawClient;
use served::{proc_status, serve_logged};
use uascale_types::{
    CreateMonitoredItemsResponse, DataChangeNotification, NodeId, PublishResponse, StatusCode,
    SubscriptionAcknowledgement, Variant,
};

const SESSIONS: usize = 500;

/// (threads, resident KiB) of a process.
fn threads_and_rss(pid: u32) -> (u64, u64) {
    (proc_status(pid, "Threads:"), proc_status(pid, "VmRSS:"))
}

fn counter_values(p: &PublishResponse) -> Vec<u32> {
    p.notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
        .flat_map(|d| d.monitored_items.iter().flatten())
        .filter_map(|m| match m.value.value {
            Some(Variant::UInt32(v)) => Some(v),
            _ => None,
        })
        .collect()
}

#[test]
fn five_hundred_sessions_with_a_subscription_each_are_all_notified() {
    // 500 connections at once from one address: more than the default
    // per-address burst of the admission stage, which this test is not
    // about.
    let config = std::env::temp_dir().join(format!("uascale-scale-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "[admission]\nconnection_burst_per_address = 1000\n",
    )
    .unwrap();
    let server = serve_logged([
        "--rate-ms".as_ref(),
        "500".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ]);
    let pid = server.child.id();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server.port));
    std::thread::sleep(Duration::from_millis(300));
    let (threads0, rss0) = threads_and_rss(pid);
    let mut clients: Vec<RawClient> = (0..SESSIONS)
        .map(|_| {
            let mut c = RawClient::connect(addr);
            c.session();
            c
        })
        .collect();
    let (_, rss_sessions) = threads_and_rss(pid);
    let counter = NodeId::string(2, "Demo.Dynamic.Counter");
    for c in &mut clients {
        c.send_create_subscription(600, 20);
        let sub = c.read_subscription_id();
        c.send_monitor(sub, counter.clone());
        let (_, m) = c.read_response();
        let r = m
            .as_any()
            .downcast_ref::<CreateMonitoredItemsResponse>()
            .unwrap_or_else(|| panic!("CreateMonitoredItems failed: {m:?}"));
        assert_eq!(
            r.results.as_ref().map(|v| v[0].status_code),
            Some(StatusCode::Good)
        );
        c.publish(vec![]);
        c.publish(vec![]);
    }
    let (threads1, rss1) = threads_and_rss(pid);
    // Every session must see a value the counter took after all were set up:
    // a change pushed to 500 monitored items, not their initial values.
    let mut first: Option<u32> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut notifications = 0usize;
    for (i, c) in clients.iter_mut().enumerate() {
        loop {
            assert!(Instant::now() < deadline, "session {i} was not notified");
            let (_, m) = c.read_response();
            let p = m
                .as_any()
                .downcast_ref::<PublishResponse>()
                .unwrap_or_else(|| panic!("session {i}: not a PublishResponse: {m:?}"));
            let seq = p.notification_message.sequence_number;
            let values = counter_values(p);
            let acks = if values.is_empty() {
                vec![]
            } else {
                notifications += 1;
                vec![SubscriptionAcknowledgement {
                    subscription_id: p.subscription_id,
                    sequence_number: seq,
                }]
            };
            c.publish(acks);
            let Some(&v) = values.last() else { continue };
            // The first session's first value sets the bar: every session
            // must then see a change beyond it.
            let bar = *first.get_or_insert(v);
            if v > bar {
                break;
            }
        }
    }
    let (threads2, rss2) = threads_and_rss(pid);
    println!(
        "{SESSIONS} sessions x 1 subscription x 1 item on a shared node: all notified \
         ({notifications} data-change messages read)"
    );
    println!(
        "server threads: {threads0} idle, {threads1} with the subscriptions, {threads2} after"
    );
    println!(
        "server memory: {:.1} KiB per session (connection + session), {:.2} KiB per \
         subscription with its item and two parked Publishes, {:.1} KiB per session in all",
        (rss_sessions.saturating_sub(rss0)) as f64 / SESSIONS as f64,
        (rss1.saturating_sub(rss_sessions)) as f64 / SESSIONS as f64,
        (rss2.saturating_sub(rss0)) as f64 / SESSIONS as f64,
    );
    assert!(
        threads2 < 64,
        "threads do not grow with sessions or parked Publishes: {threads2}"
    );
    let _ = std::fs::remove_file(&config);
}
