//! Scale: 500 sessions, each with one subscription and one monitored item
//! on the shared, changing `ns=2;s=Demo.Dynamic.Counter`, all notified by
//! one change of the counter. The server runs as its own process (`uascale
//! serve`), so its thread count and memory can be read from /proc; they
//! are printed, not timed (performance lives in the benchmark).

#[path = "../../server/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::RawClient;
use uascale_types::{
    AttributeId, CreateMonitoredItemsRequest, CreateMonitoredItemsResponse,
    CreateSubscriptionRequest, CreateSubscriptionResponse, DataChangeNotification,
    MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters, NodeId, PublishRequest,
    PublishResponse, ReadValueId, StatusCode, SubscriptionAcknowledgement, TimestampsToReturn,
    Variant,
};

const SESSIONS: usize = 500;

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args([
            "serve",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--rate-ms",
            "500",
        ])
        .env("RUST_LOG", "warn,uascale=info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uascale serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("addr=127.0.0.1:") {
                let port: String = line[at + 15..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let _ = tx.send(port.parse::<u16>().unwrap_or(0));
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server printed its address");
    Server(child, port)
}

/// (threads, resident KiB) of a process.
fn proc_status(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

fn publish(c: &mut RawClient, acks: Vec<SubscriptionAcknowledgement>) {
    let mut h = c.header();
    h.timeout_hint = 0;
    c.send(&PublishRequest {
        request_header: h,
        subscription_acknowledgements: Some(acks),
    });
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
    let server = start();
    let pid = server.0.id();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server.1));
    std::thread::sleep(Duration::from_millis(300));
    let (threads0, rss0) = proc_status(pid);
    let mut clients: Vec<RawClient> = (0..SESSIONS)
        .map(|_| {
            let mut c = RawClient::connect(addr);
            c.session();
            c
        })
        .collect();
    let (_, rss_sessions) = proc_status(pid);
    let counter = NodeId::string(2, "Demo.Dynamic.Counter");
    for c in &mut clients {
        let h = c.header();
        c.send(&CreateSubscriptionRequest {
            request_header: h,
            requested_publishing_interval: 100.0,
            requested_lifetime_count: 600,
            requested_max_keep_alive_count: 20,
            publishing_enabled: true,
            ..Default::default()
        });
        let (_, m) = c.read_response();
        let sub = m
            .as_any()
            .downcast_ref::<CreateSubscriptionResponse>()
            .unwrap_or_else(|| panic!("CreateSubscription failed: {m:?}"))
            .subscription_id;
        let h = c.header();
        c.send(&CreateMonitoredItemsRequest {
            request_header: h,
            subscription_id: sub,
            timestamps_to_return: TimestampsToReturn::Both,
            items_to_create: Some(vec![MonitoredItemCreateRequest {
                item_to_monitor: ReadValueId {
                    node_id: counter.clone(),
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                },
                monitoring_mode: MonitoringMode::Reporting,
                requested_parameters: MonitoringParameters {
                    client_handle: 1,
                    sampling_interval: 100.0,
                    queue_size: 1,
                    discard_oldest: true,
                    ..Default::default()
                },
            }]),
        });
        let (_, m) = c.read_response();
        let r = m
            .as_any()
            .downcast_ref::<CreateMonitoredItemsResponse>()
            .unwrap_or_else(|| panic!("CreateMonitoredItems failed: {m:?}"));
        assert_eq!(
            r.results.as_ref().map(|v| v[0].status_code),
            Some(StatusCode::Good)
        );
        publish(c, vec![]);
        publish(c, vec![]);
    }
    let (threads1, rss1) = proc_status(pid);
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
            publish(c, acks);
            let Some(&v) = values.last() else { continue };
            // The first session's first value sets the bar: every session
            // must then see a change beyond it.
            let bar = *first.get_or_insert(v);
            if v > bar {
                break;
            }
        }
    }
    let (threads2, rss2) = proc_status(pid);
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
}
