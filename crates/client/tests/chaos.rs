//! The client and the server through a hostile network: a chaos
//! relay (`common::chaos`) between them cuts connections, resets them in
//! the middle of a chunk, stalls, adds latency and delivers one byte at a
//! time. Each test checks what the application saw and what the server
//! holds afterwards. Counts and outcomes are asserted, never durations;
//! the time limits are bounds against hangs.

mod common;

use std::time::Duration;

use common::chaos::{Chaos, Dir};
use common::{config, eventually, Ledger, TestServer};
use uascale_client::{
    Backoff, Client, ClientError, ClientOptions, MonitorItem, Notification, Restore, Subscription,
    SubscriptionEvent, SubscriptionSettings,
};
use uascale_server::metrics::{Service, StatusClass};
use uascale_types as t;
use uascale_types::{DataValue, NodeId, StatusCode, Variant};

/// A bound against hangs for anything that should happen soon.
const LIMIT: Duration = Duration::from_secs(30);

fn options() -> ClientOptions {
    let mut backoff = Backoff::default();
    backoff.initial = Duration::from_millis(20);
    backoff.max = Duration::from_millis(300);
    ClientOptions {
        backoff,
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

fn counter() -> NodeId {
    NodeId::string(2, "Demo.Dynamic.Counter")
}

async fn counter_subscription(client: &Client) -> Subscription {
    let sub = client
        .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(
            50,
        )))
        .await
        .unwrap();
    let items = sub
        .monitor(vec![MonitorItem::value(counter()).sampling(0.0)])
        .await
        .unwrap();
    assert_eq!(items[0].result.status_code, StatusCode::Good);
    sub
}

/// What the application saw of a subscription.
#[derive(Debug, Default)]
struct Seen {
    /// Sequence numbers of the NotificationMessages, in delivery order.
    seqs: Vec<u32>,
    /// Of those, how many came from a Republish.
    republished: usize,
    /// The counter values.
    values: Vec<u32>,
    restores: Vec<Restore>,
    keep_alives: usize,
}

impl Seen {
    /// Takes events until `done` holds; panics on a lost message or the
    /// end of the stream.
    async fn until(&mut self, sub: &mut Subscription, mut done: impl FnMut(&Seen) -> bool) {
        while !done(self) {
            let ev = tokio::time::timeout(LIMIT, sub.recv())
                .await
                .expect("a subscription event in time")
                .expect("the stream goes on");
            match ev {
                SubscriptionEvent::Notifications {
                    sequence_number,
                    notifications,
                    republished,
                    ..
                } => {
                    self.seqs.push(sequence_number);
                    self.republished += usize::from(republished);
                    for n in notifications {
                        match n {
                            Notification::DataChange { value, .. } => match value.value {
                                Some(Variant::UInt32(v)) => self.values.push(v),
                                other => panic!("counter value {other:?}"),
                            },
                            other => panic!("unexpected notification {other:?}"),
                        }
                    }
                }
                SubscriptionEvent::KeepAlive { .. } => self.keep_alives += 1,
                SubscriptionEvent::Restored(how) => self.restores.push(how),
                other => panic!("unexpected {other:?} after {:?}", self.seqs),
            }
        }
    }

    /// Every sequence number is the one after the previous: no gap, no
    /// duplicate.
    fn assert_consecutive(&self) {
        for w in self.seqs.windows(2) {
            assert_eq!(w[1], w[0] + 1, "sequence numbers {:?}", self.seqs);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Blow {
    Cut,
    ResetDown,
    ResetUp,
}

/// Applies `blow` to the relay; a reset waits until it struck.
async fn strike(chaos: &Chaos, blow: Blow) {
    let dir = match blow {
        Blow::Cut => {
            chaos.cut();
            return;
        }
        Blow::ResetDown => Dir::Down,
        Blow::ResetUp => Dir::Up,
    };
    chaos.reset_mid_chunk(dir);
    assert!(
        eventually(LIMIT, || !chaos.reset_pending(dir)).await,
        "the armed reset struck"
    );
}

/// 1. A subscription keeps its sequence numbers through cuts and resets in
///    the middle of a chunk: the client reactivates its session, Republishes
///    what it missed, and the application sees every NotificationMessage
///    once, in order. The server kept one session and one subscription and
///    answered the Republishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_sequence_survives_cuts_and_resets() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    let client = Client::connect(&chaos.url(), options()).await.unwrap();
    client.create_session("chaos-seq").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let mut seen = Seen::default();
    seen.until(&mut sub, |s| s.seqs.len() >= 5).await;

    let blows = [
        Blow::Cut,
        Blow::ResetDown,
        Blow::ResetUp,
        Blow::ResetDown,
        Blow::Cut,
        Blow::ResetDown,
    ];
    for blow in blows {
        assert!(
            client.wait_connected(LIMIT).await,
            "connected before {blow:?}"
        );
        let (restores, seqs) = (seen.restores.len(), seen.seqs.len());
        strike(&chaos, blow).await;
        // Back, and three more messages after the restore.
        seen.until(&mut sub, |s| {
            s.restores.len() > restores && s.seqs.len() >= seqs + 3
        })
        .await;
        let last = seen.seqs.len();
        seen.until(&mut sub, |s| s.seqs.len() >= last + 3).await;
    }

    seen.assert_consecutive();
    assert_eq!(seen.restores.len(), blows.len(), "{:?}", seen.restores);
    assert!(
        seen.restores.iter().all(|r| *r == Restore::Reactivated),
        "the same session every time: {:?}",
        seen.restores
    );
    // Each reset of the server's direction lost a Publish response that
    // the client had to Republish.
    assert!(
        seen.republished >= 3,
        "republished {} of {:?}",
        seen.republished,
        seen.seqs
    );
    assert_eq!(client.channels_opened(), 1 + blows.len() as u64);
    assert_eq!(chaos.counts().reset, 4);
    assert_eq!(chaos.counts().cut, 2);

    // The server's side: one session all along, one subscription, and it
    // answered the Republishes.
    assert_eq!(server.state.sessions.cumulated_count(), 1);
    assert_eq!(server.sessions(), 1);
    assert_eq!(server.subscriptions(), 1);
    let republishes = server
        .state
        .metrics
        .requests
        .count(Service::Republish, StatusClass::Good);
    assert!(republishes as usize >= seen.republished);
    assert!(eventually(LIMIT, || server.channels() == 1).await);

    drop(sub);
    client.close().await;
    assert!(
        eventually(LIMIT, || server.sessions() == 0 && server.channels() == 0).await,
        "closed: {} sessions, {} channels on the server (client connected: {})",
        server.sessions(),
        server.channels(),
        client.is_connected()
    );
    // And closing made no new session (the Publishes still out come back
    // BadSessionClosed; that is the end, not a lost session to replace).
    assert_eq!(server.state.sessions.cumulated_count(), 1);
}

fn ledger_write(v: u32) -> t::WriteValue {
    t::WriteValue {
        node_id: Ledger::node(),
        attribute_id: t::AttributeId::Value as u32,
        index_range: t::UaString::null(),
        value: DataValue::value(Variant::UInt32(v)),
    }
}

/// 2. Writes through cuts and resets: every Write the client saw
///    acknowledged was applied exactly once; a Write whose request was cut
///    short was never applied; a Write whose answer was cut short was
///    applied once and reported to the application as failed - the client
///    does not send it again on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_are_applied_exactly_once() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    let client = Client::connect(&chaos.url(), options()).await.unwrap();
    client.create_session("chaos-write").await.unwrap();

    let mut acked = Vec::new();
    let mut failed = Vec::new();
    let (mut answer_lost, mut request_lost) = (Vec::new(), Vec::new());
    for v in 1..=40u32 {
        assert!(client.wait_connected(LIMIT).await, "connected before {v}");
        let channels = client.channels_opened();
        match v % 8 {
            2 => chaos.cut(),
            4 => {
                chaos.reset_mid_chunk(Dir::Down);
                answer_lost.push(v);
            }
            6 => {
                chaos.reset_mid_chunk(Dir::Up);
                request_lost.push(v);
            }
            _ => {}
        }
        match client.write(vec![ledger_write(v)]).await {
            Ok(results) => {
                assert_eq!(results, vec![StatusCode::Good], "write {v}");
                acked.push(v);
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        ClientError::Channel { .. } | ClientError::Io(_) | ClientError::Closed
                    ),
                    "write {v}: {e:?}"
                );
                failed.push(v);
            }
        }
        if matches!(v % 8, 2 | 4 | 6) {
            // That connection is gone: wait for the next one before the
            // next blow (so that it cannot strike the reconnect).
            assert!(
                eventually(LIMIT, || client.channels_opened() > channels
                    && client.is_connected())
                .await,
                "reconnected after {v}"
            );
        }
    }
    assert!(!chaos.reset_pending(Dir::Down) && !chaos.reset_pending(Dir::Up));

    let log = server.ledger.log();
    let times = |v: u32| log.iter().filter(|x| **x == v).count();
    for v in &acked {
        assert_eq!(times(*v), 1, "acknowledged write {v} applied once: {log:?}");
    }
    for v in &failed {
        assert!(times(*v) <= 1, "failed write {v} never resent: {log:?}");
    }
    for v in &answer_lost {
        assert!(failed.contains(v), "write {v} lost its answer");
        assert_eq!(times(*v), 1, "write {v} applied before its answer was lost");
    }
    for v in &request_lost {
        assert!(failed.contains(v), "write {v} lost its request");
        assert_eq!(times(*v), 0, "write {v} cut short was not applied");
    }
    assert!(log.iter().all(|v| (1..=40).contains(v)), "{log:?}");
    assert!(log.windows(2).all(|w| w[0] < w[1]), "in order: {log:?}");
    assert_eq!(chaos.counts().reset, 10);
    // The server counted exactly the Writes it applied.
    let writes = server
        .state
        .metrics
        .requests
        .count(Service::Write, StatusClass::Good);
    assert_eq!(writes as usize, log.len());
    // The application retries what failed (here: once, knowing Ledger
    // keeps every write, only what was not applied).
    for v in failed.iter().filter(|v| times(**v) == 0) {
        assert!(client.wait_connected(LIMIT).await);
        let r = client.write(vec![ledger_write(*v)]).await.unwrap();
        assert_eq!(r, vec![StatusCode::Good]);
    }
    let mut log = server.ledger.log();
    log.sort_unstable();
    assert_eq!(log, (1..=40).collect::<Vec<_>>());
    client.close().await;
}

/// 3. One byte per write and 20 ms of latency each way: a session, Reads
///    (compared with the server's own values) and a subscription work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_at_a_time_with_latency() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    for dir in [Dir::Up, Dir::Down] {
        chaos.set_latency(dir, Duration::from_millis(20));
        chaos.set_byte_at_a_time(dir, Some(Duration::ZERO));
    }
    let client = Client::connect(&chaos.url(), options()).await.unwrap();
    client.create_session("chaos-bytes").await.unwrap();

    let nodes: Vec<NodeId> = ["Boolean", "Int32", "Double", "String", "DateTime"]
        .iter()
        .map(|n| NodeId::string(2, format!("Demo.Static.Scalar.{n}")))
        .collect();
    for _ in 0..3 {
        let values = client.read_values(&nodes).await.unwrap();
        assert_eq!(values.len(), nodes.len());
        for (node, dv) in nodes.iter().zip(&values) {
            let held = server
                .state
                .managers
                .read_value(node)
                .expect("the demo holds it")
                .expect("readable");
            assert_eq!(dv.value.as_ref(), Some(&held), "{node}");
        }
    }
    let ok = client.write(vec![ledger_write(7)]).await.unwrap();
    assert_eq!(ok, vec![StatusCode::Good]);
    assert_eq!(server.ledger.log(), vec![7]);

    let mut sub = counter_subscription(&client).await;
    let mut seen = Seen::default();
    seen.until(&mut sub, |s| s.seqs.len() >= 5).await;
    seen.assert_consecutive();
    assert!(
        seen.values.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        seen.values
    );
    assert!(seen.restores.is_empty());
    assert_eq!(client.channels_opened(), 1);

    let reads = server
        .state
        .metrics
        .requests
        .count(Service::Read, StatusClass::Good);
    assert_eq!(reads, 3);
    let counts = chaos.counts();
    assert_eq!((counts.accepted, counts.cut, counts.reset), (1, 0, 0));
    assert_eq!(server.state.sessions.cumulated_count(), 1);
    drop(sub);
    client.close().await;
    assert!(
        eventually(LIMIT, || server.sessions() == 0 && server.channels() == 0).await,
        "closed: {} sessions, {} channels on the server (client connected: {})",
        server.sessions(),
        server.channels(),
        client.is_connected()
    );
    // And closing made no new session (the Publishes still out come back
    // BadSessionClosed; that is the end, not a lost session to replace).
    assert_eq!(server.state.sessions.cumulated_count(), 1);
}

/// 4a. A stall shorter than the timeouts: requests made during it are
///     answered after it, the subscription goes on with no gap, and
///     nothing reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_stall_recovers_without_error() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    let client = Client::connect(&chaos.url(), options()).await.unwrap();
    client.create_session("chaos-short-stall").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let mut seen = Seen::default();
    seen.until(&mut sub, |s| s.seqs.len() >= 3).await;

    chaos.stall();
    let nodes = [counter()];
    let read = client.read_values(&nodes);
    let resume = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        chaos.resume();
    };
    let (read, ()) = tokio::join!(read, resume);
    let value = read.expect("the Read is answered after the stall");
    assert!(matches!(value[0].value, Some(Variant::UInt32(_))));
    let before = seen.seqs.len();
    seen.until(&mut sub, |s| s.seqs.len() >= before + 5).await;

    seen.assert_consecutive();
    assert!(seen.restores.is_empty(), "{:?}", seen.restores);
    assert_eq!(client.channels_opened(), 1);
    assert_eq!(chaos.counts().accepted, 1);
    // The server: one connection, one channel, one session all along.
    assert_eq!(server.state.metrics.connections_accepted(), 1);
    assert_eq!(server.channels(), 1);
    assert_eq!(server.state.sessions.cumulated_count(), 1);
    drop(sub);
    client.close().await;
}

/// 4b. A stall longer than the request timeout: the client takes the
///     silent connection for dead, opens a new one (the first attempt may
///     hang in the stall too), reactivates its session, and the
///     subscription goes on without a gap. The server closes the old
///     channel once the relay lets its end through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_stall_ends_in_a_clean_reconnect() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    let mut opts = options();
    opts.request_timeout = Duration::from_secs(1);
    opts.connect_timeout = Duration::from_secs(1);
    let client = Client::connect(&chaos.url(), opts).await.unwrap();
    client.create_session("chaos-long-stall").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let mut seen = Seen::default();
    seen.until(&mut sub, |s| s.seqs.len() >= 3).await;

    chaos.stall();
    let read = client.read_values(&[counter()]).await;
    assert!(
        matches!(
            read,
            Err(ClientError::Timeout | ClientError::Channel { .. })
        ),
        "a Read in the stall times out: {read:?}"
    );
    // The client gives the connection up: it is no longer connected.
    assert!(eventually(LIMIT, || !client.is_connected()).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    chaos.resume();

    assert!(client.wait_connected(LIMIT).await);
    let before = seen.seqs.len();
    seen.until(&mut sub, |s| {
        !s.restores.is_empty() && s.seqs.len() >= before + 5
    })
    .await;
    seen.assert_consecutive();
    assert_eq!(seen.restores, vec![Restore::Reactivated]);
    assert!(client.channels_opened() >= 2);
    let value = client.read_values(&[counter()]).await.unwrap();
    assert!(matches!(value[0].value, Some(Variant::UInt32(_))));

    // The server: the same session, and only the new channel left open.
    assert_eq!(server.state.sessions.cumulated_count(), 1);
    assert!(
        eventually(LIMIT, || server.channels() == 1
            && server.connections() == 1)
        .await
    );
    drop(sub);
    client.close().await;
}

/// 4c. A stall longer than the session timeout: the server drops the
///     session (and its subscription); after the stall the client
///     reconnects with a new session and the subscription is created
///     again - reported as such, and delivering again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_beyond_the_session_timeout_recreates() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    let mut opts = options();
    // The shortest session timeout the server grants (10 s).
    opts.session_timeout = Duration::from_secs(10);
    opts.request_timeout = Duration::from_secs(2);
    opts.connect_timeout = Duration::from_secs(2);
    let client = Client::connect(&chaos.url(), opts).await.unwrap();
    client.create_session("chaos-session-stall").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let mut seen = Seen::default();
    seen.until(&mut sub, |s| s.seqs.len() >= 3).await;
    assert_eq!(server.sessions(), 1);

    chaos.stall();
    // The server's reaper removes the session once its timeout passed.
    assert!(eventually(LIMIT, || server.sessions() == 0).await);
    assert_eq!(server.subscriptions(), 0);
    chaos.resume();

    assert!(client.wait_connected(LIMIT).await);
    seen.until(&mut sub, |s| !s.restores.is_empty()).await;
    assert!(
        matches!(seen.restores[0], Restore::Recreated | Restore::Transferred),
        "{:?}",
        seen.restores
    );
    let before = seen.values.len();
    seen.until(&mut sub, |s| s.values.len() >= before + 3).await;
    let value = client.read_values(&[counter()]).await.unwrap();
    assert!(matches!(value[0].value, Some(Variant::UInt32(_))));
    // The server: a second session with a subscription, one channel.
    assert_eq!(server.state.sessions.cumulated_count(), 2);
    assert_eq!(server.sessions(), 1);
    assert_eq!(server.subscriptions(), 1);
    assert!(eventually(LIMIT, || server.channels() == 1).await);
    drop(sub);
    client.close().await;
}

/// 4d. The server loses the session while the channel stays up (it timed
///     out - here the server's clock is run ahead - as it does when a
///     client was suspended longer than its session timeout): the client
///     creates a new session on the same channel and takes the
///     subscription over, once, instead of Publishing into the void.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lost_on_a_live_channel_is_replaced() {
    let server = TestServer::start(config());
    let chaos = Chaos::start(server.addr).await;
    let client = Client::connect(&chaos.url(), options()).await.unwrap();
    client.create_session("chaos-lost-session").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let mut seen = Seen::default();
    seen.until(&mut sub, |s| s.seqs.len() >= 3).await;

    let (_, timed_out) = server
        .state
        .expire_sessions(std::time::Instant::now() + Duration::from_secs(3600));
    assert_eq!(timed_out, 1);
    assert_eq!(server.sessions(), 0);

    seen.until(&mut sub, |s| !s.restores.is_empty()).await;
    let before = seen.values.len();
    seen.until(&mut sub, |s| s.values.len() >= before + 3).await;
    // The server keeps a timed-out session's subscription for its
    // lifetime, so the new session can take it over.
    assert_eq!(seen.restores.len(), 1, "{:?}", seen.restores);
    assert!(matches!(
        seen.restores[0],
        Restore::Transferred | Restore::Recreated
    ));
    let value = client.read_values(&[counter()]).await.unwrap();
    assert!(matches!(value[0].value, Some(Variant::UInt32(_))));
    // The same channel; on the server one new session (not one per
    // Publish that was out), with the subscription.
    assert_eq!(client.channels_opened(), 1);
    assert_eq!(server.state.metrics.connections_accepted(), 1);
    assert_eq!(server.state.sessions.cumulated_count(), 2);
    assert_eq!(server.sessions(), 1);
    assert_eq!(server.subscriptions(), 1);
    drop(sub);
    client.close().await;
}

/// 5. Nothing leaks on the server: clients that close, clients cut off
///    for good (their sessions time out) and a connection reset in the
///    middle of a chunk all leave the server's sessions, subscriptions,
///    channels, connections, reassembly budget and tasks as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_leaks_on_the_server() {
    let server = TestServer::start(config());
    // The server's own tasks, once it runs: a connection accepted means
    // its accept loop runs, and the tasks beside it were spawned before.
    drop(tokio::net::TcpStream::connect(server.addr).await.unwrap());
    assert!(
        eventually(LIMIT, || server.state.metrics.connections_accepted() == 1
            && server.connections() == 0)
        .await
    );
    let baseline = server.alive_tasks();
    assert!(baseline > 0, "the server's timers run");
    assert_eq!((server.sessions(), server.channels()), (0, 0));
    let chaos = Chaos::start(server.addr).await;

    let mut polite = Vec::new();
    let mut doomed = Vec::new();
    for i in 0..6 {
        let mut opts = options();
        opts.session_timeout = Duration::from_secs(10);
        // The cut ones stay away.
        opts.reconnect = i < 3;
        let client = Client::connect(&chaos.url(), opts).await.unwrap();
        client.create_session(&format!("leak-{i}")).await.unwrap();
        let mut sub = counter_subscription(&client).await;
        let mut seen = Seen::default();
        seen.until(&mut sub, |s| s.seqs.len() >= 2).await;
        if i < 3 {
            polite.push((client, sub));
        } else {
            doomed.push((client, sub));
        }
    }
    assert_eq!(server.sessions(), 6);
    assert_eq!(server.subscriptions(), 6);
    assert_eq!(server.channels(), 6);
    assert!(server.alive_tasks() > baseline);

    // A client that stops halfway through a chunk (raw, not through the
    // client): Hello and part of an OpenSecureChannel, then a reset. It
    // goes to the server directly: the relay's armed reset strikes the
    // next data of any of its connections, and the six clients' Publishes
    // go up through it too.
    {
        use tokio::io::AsyncWriteExt;
        let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let hello = hello_bytes(&format!("opc.tcp://{}", server.addr));
        raw.write_all(&hello).await.unwrap();
        raw.write_all(b"OPNF\x00\x10\x00\x00\x00\x00\x00\x00")
            .await
            .unwrap();
        raw.write_all(&[0u8; 32]).await.unwrap();
        assert!(eventually(LIMIT, || server.connections() == 7).await);
        raw.set_zero_linger().unwrap();
        drop(raw);
        assert!(eventually(LIMIT, || server.connections() == 6).await);
    }

    // Three close their sessions; the relay cuts the other three for good.
    for (client, sub) in polite {
        sub.delete().await.unwrap();
        client.close().await;
    }
    chaos.cut();
    for (client, _sub) in &doomed {
        assert!(
            eventually(LIMIT, || !client.is_connected()).await,
            "cut off"
        );
    }
    // Their sessions wait for their timeout (10 s); the channels are gone
    // at once.
    assert!(
        eventually(LIMIT, || server.channels() == 0
            && server.connections() == 0)
        .await
    );
    assert_eq!(server.sessions(), 3);
    assert!(
        eventually(LIMIT, || server.sessions() == 0).await,
        "sessions time out"
    );
    assert_eq!(server.subscriptions(), 0);
    assert_eq!(server.state.budget.used(), 0);
    assert!(
        eventually(LIMIT, || server.alive_tasks() == baseline).await,
        "the connection tasks are gone: {} alive, {baseline} at start",
        server.alive_tasks()
    );
    assert_eq!(chaos.live(), 0);
    drop(doomed);
}

/// A Hello message for `url` (protocol 0, 64 KiB buffers).
fn hello_bytes(url: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [0u32, 65536, 65536, 0, 0] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.extend_from_slice(&(url.len() as i32).to_le_bytes());
    body.extend_from_slice(url.as_bytes());
    let mut msg = b"HELF".to_vec();
    msg.extend_from_slice(&((body.len() + 8) as u32).to_le_bytes());
    msg.extend_from_slice(&body);
    msg
}
