//! The cluster against a real nats-server (started here on a free port,
//! killed at the end; installed with apt-get when missing):
//! - the NATS JetStream store keeps the store contract the takeover logic
//!   relies on (create once, compare-and-set, delete on a revision, keys,
//!   a watch that reports every change);
//! - two uascale nodes share the store: a client's session made on node 1
//!   is reactivated through a new channel on node 2 after node 1 stopped
//!   - same session, same token, now owned by node 2 - and its Reads work.

mod common;
mod support;

use std::time::{Duration, Instant};

use common::RawClient;
use support::{haproxy, nats};
use uascale_server::cluster::nats::NatsStore;
use uascale_server::cluster::record::{self, session_key, SessionRecord, SubscriptionsRecord};
use uascale_server::cluster::store::{Bucket, Store, StoreError};
use uascale_server::cluster::takeover;
use uascale_server::Server;
use uascale_types::{
    ActivateSessionRequest, ActivateSessionResponse, AnonymousIdentityToken, AttributeId,
    BrowseDescription, BrowseDirection, BrowseNextRequest, BrowseNextResponse, BrowseRequest,
    BrowseResponse, BrowseResult, ByteString, DataChangeNotification, ExtensionObject, NodeId,
    PublishResponse, ReadRequest, ReadResponse, ReadValueId, RepublishRequest, RepublishResponse,
    ServiceFault, StatusCode, SubscriptionAcknowledgement, UaString,
};

const LIMIT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn the_nats_store_keeps_the_store_contract() {
    let Some(server) = nats::start() else { return };
    let rt = runtime();
    rt.block_on(async {
        let s = NatsStore::connect(&server.url(), 1, Duration::from_secs(5))
            .await
            .expect("connect and open the buckets");
        let mut watch = s.watch(Bucket::Sessions).await.expect("watch");
        let r1 = s
            .create(Bucket::Sessions, "s.k", b"one".to_vec())
            .await
            .unwrap();
        assert_eq!(
            s.create(Bucket::Sessions, "s.k", b"two".to_vec()).await,
            Err(StoreError::Conflict)
        );
        let r2 = s
            .update(Bucket::Sessions, "s.k", b"two".to_vec(), r1)
            .await
            .unwrap();
        assert!(r2 > r1);
        assert_eq!(
            s.update(Bucket::Sessions, "s.k", b"three".to_vec(), r1)
                .await,
            Err(StoreError::Conflict),
            "a stale revision loses"
        );
        assert_eq!(
            s.delete(Bucket::Sessions, "s.k", Some(r1)).await,
            Err(StoreError::Conflict)
        );
        let e = s.get(Bucket::Sessions, "s.k").await.unwrap().unwrap();
        assert_eq!((e.value.as_slice(), e.revision), (&b"two"[..], r2));
        s.put(Bucket::Nodes, "n1", b"beat".to_vec()).await.unwrap();
        assert_eq!(s.keys(Bucket::Sessions).await.unwrap(), vec!["s.k"]);
        s.delete(Bucket::Sessions, "s.k", Some(r2)).await.unwrap();
        assert_eq!(s.get(Bucket::Sessions, "s.k").await.unwrap(), None);
        // A deleted key can be created again (a new session, same key).
        s.create(Bucket::Sessions, "s.k", b"again".to_vec())
            .await
            .unwrap();
        assert!(matches!(
            s.put(Bucket::Nodes, "bad key", vec![]).await,
            Err(StoreError::Invalid(_))
        ));
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let c = tokio::time::timeout(LIMIT, watch.recv())
                .await
                .expect("a change within the limit")
                .expect("the watch is open");
            seen.push(c.value);
        }
        assert_eq!(
            seen,
            vec![
                Some(b"one".to_vec()),
                Some(b"two".to_vec()),
                None,
                Some(b"again".to_vec())
            ]
        );
        // A watch opened now starts with the record there is.
        let mut late = s.watch(Bucket::Sessions).await.unwrap();
        let first = tokio::time::timeout(LIMIT, late.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (first.key.as_str(), first.value.as_deref()),
            ("s.k", Some(&b"again"[..]))
        );
        // A second connection (another node) sees the same records and
        // loses the same races.
        let other = NatsStore::connect(&server.url(), 1, Duration::from_secs(5))
            .await
            .unwrap();
        let e = other.get(Bucket::Sessions, "s.k").await.unwrap().unwrap();
        s.update(Bucket::Sessions, "s.k", b"mine".to_vec(), e.revision)
            .await
            .unwrap();
        assert_eq!(
            other
                .update(Bucket::Sessions, "s.k", b"theirs".to_vec(), e.revision)
                .await,
            Err(StoreError::Conflict)
        );
    });
    drop(server);
    // With the server gone every operation is an error, not a hang.
    rt.block_on(async {
        assert!(matches!(
            NatsStore::connect("nats://127.0.0.1:1", 1, Duration::from_secs(2)).await,
            Err(StoreError::Unreachable(_))
        ));
    });
}

/// A running in-process node: its address and what stops it.
struct Node {
    addr: std::net::SocketAddr,
    state: std::sync::Arc<uascale_server::state::ServerState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Stops `node` (as a node that goes away) and waits for it to end.
fn stop_node(rt: &tokio::runtime::Runtime, node: &mut Node) {
    let _ = node.stop.take().map(|s| s.send(()));
    rt.block_on(async {
        let _ = tokio::time::timeout(LIMIT, &mut node.task).await;
    });
}

/// Opens a channel to `addr` and activates the session of `token` there
/// (what a client does when its node went away); panics unless the node
/// took the session over.
fn reactivate_on(addr: std::net::SocketAddr, token: &NodeId) -> RawClient {
    let mut moved = RawClient::connect(addr);
    moved.auth = token.clone();
    let answer = activate(&mut moved);
    assert!(
        answer
            .as_any()
            .downcast_ref::<ActivateSessionResponse>()
            .is_some(),
        "the session was not taken over: {answer:?}"
    );
    moved
}

/// A nats-server and two cluster nodes on it, `n1` and `n2`, both
/// listening; None when nats-server cannot be had (the test then skips).
/// Bound in this order, they are dropped nodes first, the server last.
fn two_nodes() -> Option<(nats::Nats, tokio::runtime::Runtime, String, Node, Node)> {
    let nats = nats::start()?;
    let rt = runtime();
    let url = nats.url();
    let n1 = start_node(&rt, &url, "n1");
    let n2 = start_node(&rt, &url, "n2");
    assert!(nats::wait_listening(n1.addr, LIMIT));
    assert!(nats::wait_listening(n2.addr, LIMIT));
    Some((nats, rt, url, n1, n2))
}

fn start_node(rt: &tokio::runtime::Runtime, url: &str, id: &str) -> Node {
    start_node_with(rt, url, id, |_| {})
}

/// [`start_node`] with `change` made to the node's configuration.
fn start_node_with(
    rt: &tokio::runtime::Runtime,
    url: &str,
    id: &str,
    change: impl FnOnce(&mut uascale_server::ServerConfig),
) -> Node {
    let mut config = common::loopback_config();
    config.cluster.url = Some(url.to_owned());
    config.cluster.node_id = Some(id.to_owned());
    // Different top bytes, so that ids made on n2 cannot meet n1's.
    config.cluster.node_index = Some(if id == "n1" { 1 } else { 2 });
    config.cluster.heartbeat = Duration::from_millis(200);
    config.cluster.lease = Duration::from_millis(1000);
    change(&mut config);
    let _guard = rt.enter();
    let server = Server::bind(config).expect("bind");
    let addr = server.local_addr().unwrap();
    let state = std::sync::Arc::clone(server.state());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(server.run(async move {
        let _ = rx.await;
    }));
    Node {
        addr,
        state,
        stop: Some(tx),
        task,
    }
}

fn read_state(c: &mut RawClient) -> Box<dyn uascale_types::DynStructure> {
    read_node(c, NodeId::ns0(2259)) // Server_ServerStatus_State
}

fn read_node(c: &mut RawClient, node_id: NodeId) -> Box<dyn uascale_types::DynStructure> {
    let h = c.header();
    c.send(&ReadRequest {
        request_header: h,
        nodes_to_read: Some(vec![ReadValueId {
            node_id,
            attribute_id: AttributeId::Value as u32,
            ..Default::default()
        }]),
        ..Default::default()
    });
    c.read_response().1
}

fn activate(c: &mut RawClient) -> Box<dyn uascale_types::DynStructure> {
    let h = c.header();
    c.send(&ActivateSessionRequest {
        request_header: h,
        user_identity_token: ExtensionObject::new(AnonymousIdentityToken {
            policy_id: UaString::from("anonymous"),
        }),
        ..Default::default()
    });
    c.read_response().1
}

fn stored(rt: &tokio::runtime::Runtime, url: &str, token: &NodeId) -> Option<SessionRecord> {
    let key = session_key(token).expect("an issued token");
    rt.block_on(async {
        let s = NatsStore::connect(url, 1, Duration::from_secs(5))
            .await
            .ok()?;
        takeover::read(&s, &key).await.ok()?.map(|(r, _)| r)
    })
}

#[test]
fn a_session_moves_to_another_node_when_its_node_stops() {
    let Some((_nats, rt, url, mut n1, n2)) = two_nodes() else {
        return;
    };

    let mut c = RawClient::connect(n1.addr);
    c.session();
    assert!(read_state(&mut c)
        .as_any()
        .downcast_ref::<ReadResponse>()
        .is_some());
    // The mirror writes behind the request path: wait for the record.
    let start = Instant::now();
    let record = loop {
        if let Some(r) = stored(&rt, &url, &c.auth).filter(|r| r.activated) {
            break r;
        }
        assert!(start.elapsed() < LIMIT, "the session was never mirrored");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(record.owner, "n1");

    // A token no node knows is refused as before.
    let mut stranger = RawClient::connect(n2.addr);
    stranger.auth = NodeId::opaque(0, vec![0x42; 32]);
    let fault = activate(&mut stranger);
    let fault = fault
        .as_any()
        .downcast_ref::<ServiceFault>()
        .expect("a fault");
    assert_eq!(
        fault.response_header.service_result,
        StatusCode::BadSessionIdInvalid
    );

    // Node 1 goes away; the client opens a channel to node 2 and
    // activates its session there.
    stop_node(&rt, &mut n1);
    let mut moved = reactivate_on(n2.addr, &c.auth);
    let read = read_state(&mut moved);
    let read = read
        .as_any()
        .downcast_ref::<ReadResponse>()
        .expect("a Read on the taken-over session");
    assert_eq!(read.results.as_ref().map(Vec::len), Some(1));
    // A cluster node says its redundancy is transparent.
    let r = read_node(&mut moved, NodeId::ns0(3709));
    let r = r.as_any().downcast_ref::<ReadResponse>().expect("a Read");
    let support = r
        .results
        .as_ref()
        .and_then(|v| v.first())
        .and_then(|d| d.value.clone());
    assert_eq!(
        support,
        Some(uascale_types::Variant::Int32(4)),
        "Transparent"
    );
    let after = stored(&rt, &url, &c.auth).expect("still mirrored");
    assert_eq!(after.owner, "n2");
    assert_eq!(after.session_id, record.session_id, "the same session");
    assert_ne!(
        after.server_nonce, record.server_nonce,
        "the nonce was consumed"
    );
    drop(n2);
}

fn publish_response(c: &mut RawClient, acks: Vec<SubscriptionAcknowledgement>) -> PublishResponse {
    c.publish(acks);
    let (_, m) = c.read_response();
    m.as_any()
        .downcast_ref::<PublishResponse>()
        .unwrap_or_else(|| panic!("a PublishResponse: {m:?}"))
        .clone()
}

fn subscriptions_record(
    rt: &tokio::runtime::Runtime,
    url: &str,
    token: &NodeId,
) -> Option<SubscriptionsRecord> {
    let key = session_key(token).expect("an issued token");
    rt.block_on(async {
        let s = NatsStore::connect(url, 1, Duration::from_secs(5))
            .await
            .ok()?;
        let e = s.get(Bucket::Subscriptions, &key).await.ok()??;
        SubscriptionsRecord::decode(&e.value).ok()
    })
}

/// Waits until the mirrored subscriptions record of the session `token`
/// satisfies `ok` and returns it; `what` names the wait in the failure.
fn mirrored(
    rt: &tokio::runtime::Runtime,
    url: &str,
    token: &NodeId,
    what: &str,
    ok: impl Fn(&SubscriptionsRecord) -> bool,
) -> SubscriptionsRecord {
    let start = Instant::now();
    loop {
        let r = subscriptions_record(rt, url, token);
        if let Some(r) = r.as_ref().filter(|r| ok(r)) {
            return r.clone();
        }
        assert!(start.elapsed() < LIMIT, "{what} was never mirrored: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Publishes (acknowledging nothing) until `n` NotificationMessages with
/// notifications came; their sequence numbers.
fn notified_seqs(c: &mut RawClient, n: usize) -> Vec<u32> {
    let mut seqs = Vec::new();
    while seqs.len() < n {
        let p = publish_response(c, vec![]);
        if p.notification_message
            .notification_data
            .as_ref()
            .is_some_and(|d| !d.is_empty())
        {
            seqs.push(p.notification_message.sequence_number);
        }
    }
    seqs
}

/// A subscription moves with its session: the node that takes the
/// session over restores it from the mirror with the same id, answers
/// Republish for the messages the client did not acknowledge, and goes on
/// with the next sequence number and the item's current value.
#[test]
fn a_subscription_continues_with_its_sequence_numbers_on_the_new_node() {
    let Some((_nats, rt, url, mut n1, n2)) = two_nodes() else {
        return;
    };

    let mut c = RawClient::connect(n1.addr);
    c.session();
    c.send_create_subscription(600, 10);
    let sub = c.read_subscription_id();
    // A client of n2 has a subscription there too: the ids of the two
    // nodes must not meet when n1's moves to n2.
    let mut other = RawClient::connect(n2.addr);
    other.session();
    other.send_create_subscription(600, 10);
    let theirs = other.read_subscription_id();
    assert_ne!(theirs, sub, "subscription ids carry the node index");
    c.send_monitor(sub, NodeId::ns0(2258)); // CurrentTime: a new value each sample
    let _ = c.read_response();
    // Three notifications, none acknowledged.
    let seqs = notified_seqs(&mut c, 3);
    let last = *seqs.last().unwrap();
    mirrored(&rt, &url, &c.auth, "the subscription", |r| {
        r.subscriptions
            .first()
            .is_some_and(|s| s.next_seq == last + 1)
    });

    stop_node(&rt, &mut n1);
    let mut moved = reactivate_on(n2.addr, &c.auth);
    // Republish answers from the mirrored retransmission queue.
    for seq in &seqs {
        let h = moved.header();
        moved.send(&RepublishRequest {
            request_header: h,
            subscription_id: sub,
            retransmit_sequence_number: *seq,
        });
        let (_, m) = moved.read_response();
        let r = m
            .as_any()
            .downcast_ref::<RepublishResponse>()
            .unwrap_or_else(|| panic!("Republish of {seq}: {m:?}"));
        assert_eq!(r.notification_message.sequence_number, *seq);
    }
    // Publishing goes on: the next number, the item's current value.
    let acks = seqs
        .iter()
        .map(|s| SubscriptionAcknowledgement {
            subscription_id: sub,
            sequence_number: *s,
        })
        .collect();
    let p = publish_response(&mut moved, acks);
    assert_eq!(p.subscription_id, sub, "the same subscription id");
    assert_eq!(
        p.notification_message.sequence_number,
        last + 1,
        "no gap, no reuse"
    );
    let data = p.notification_message.notification_data.unwrap_or_default();
    let change = data
        .iter()
        .find_map(|d| d.downcast_ref::<DataChangeNotification>())
        .expect("a data change");
    let items = change.monitored_items.as_deref().unwrap_or_default();
    assert_eq!(items.first().map(|i| i.client_handle), Some(1));
    assert!(items[0].value.value.is_some(), "the item's current value");
    drop(n2);
}

/// A restart of the whole cluster: both nodes stop, the store's
/// nats-server is killed and started again on its files (JetStream file
/// storage), both nodes start again as new processes would; the client
/// comes back with its session's token and activates it on a restarted
/// node - the same session, its subscription with the same id, and the
/// sequence numbers going on without a gap.
#[test]
fn sessions_survive_a_restart_of_the_whole_cluster() {
    let Some((mut nats, rt, url, mut n1, mut n2)) = two_nodes() else {
        return;
    };
    let mut c = RawClient::connect(n1.addr);
    c.session();
    c.send_create_subscription(600, 10);
    let sub = c.read_subscription_id();
    c.send_monitor(sub, NodeId::ns0(2258));
    let _ = c.read_response();
    let seqs = notified_seqs(&mut c, 2);
    let last = *seqs.last().unwrap();
    mirrored(&rt, &url, &c.auth, "the subscription", |r| {
        r.subscriptions
            .first()
            .is_some_and(|s| s.next_seq == last + 1)
    });

    stop_node(&rt, &mut n1);
    stop_node(&rt, &mut n2);
    drop((n1, n2));
    nats.kill();
    nats.restart();
    assert!(nats::wait_listening(nats.addr, LIMIT));
    let n1 = start_node(&rt, &url, "n1");
    let n2 = start_node(&rt, &url, "n2");
    assert!(nats::wait_listening(n1.addr, LIMIT));
    assert!(nats::wait_listening(n2.addr, LIMIT));

    let mut back = reactivate_on(n2.addr, &c.auth);
    let acks = seqs
        .iter()
        .map(|s| SubscriptionAcknowledgement {
            subscription_id: sub,
            sequence_number: *s,
        })
        .collect();
    let p = publish_response(&mut back, acks);
    assert_eq!(p.subscription_id, sub, "the same subscription id");
    assert_eq!(
        p.notification_message.sequence_number,
        last + 1,
        "no gap, no reuse"
    );
    drop((n1, n2));
}

/// An event item on the Server object in `sub`, selecting the
/// BaseEventType fields `select`, with a queue of `queue`; its id.
fn monitor_events(c: &mut RawClient, sub: u32, queue: u32, select: &[&str]) -> u32 {
    use uascale_types::{
        ContentFilter, CreateMonitoredItemsRequest, CreateMonitoredItemsResponse, EventFilter,
        MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters, QualifiedName,
        SimpleAttributeOperand, TimestampsToReturn,
    };
    let field = |name: &&str| SimpleAttributeOperand {
        type_definition_id: NodeId::ns0(2041),
        browse_path: Some(vec![QualifiedName::new(0, *name)]),
        attribute_id: AttributeId::Value as u32,
        index_range: UaString::null(),
    };
    let h = c.header();
    c.send(&CreateMonitoredItemsRequest {
        request_header: h,
        subscription_id: sub,
        timestamps_to_return: TimestampsToReturn::Both,
        items_to_create: Some(vec![MonitoredItemCreateRequest {
            item_to_monitor: ReadValueId {
                node_id: NodeId::ns0(2253),
                attribute_id: AttributeId::EventNotifier as u32,
                ..Default::default()
            },
            monitoring_mode: MonitoringMode::Reporting,
            requested_parameters: MonitoringParameters {
                client_handle: 9,
                queue_size: queue,
                discard_oldest: true,
                filter: ExtensionObject::new(EventFilter {
                    select_clauses: Some(select.iter().map(field).collect()),
                    where_clause: ContentFilter { elements: None },
                }),
                ..Default::default()
            },
        }]),
    });
    let (_, m) = c.read_response();
    let created = m
        .as_any()
        .downcast_ref::<CreateMonitoredItemsResponse>()
        .unwrap_or_else(|| panic!("{m:?}"));
    let result = &created.results.as_deref().unwrap_or_default()[0];
    assert_eq!(result.status_code, StatusCode::Good);
    result.monitored_item_id
}

/// Drains `node` at once (a planned shutdown due now): `c`, a client of
/// it, is closed with `BadShutdown`, and the node's task ends.
fn drain_now(rt: &tokio::runtime::Runtime, node: &mut Node, c: &mut RawClient, why: &str) {
    node.state
        .shutdown
        .plan(Instant::now(), Duration::ZERO, why, None);
    assert_eq!(c.read_error(), StatusCode::BadShutdown);
    rt.block_on(async {
        let _ = tokio::time::timeout(LIMIT, &mut node.task).await;
    });
}

/// Which of `n1`, `n2` owns the session of `token` once it is mirrored
/// (0 or 1), and its session id.
fn owner_of(rt: &tokio::runtime::Runtime, url: &str, token: &NodeId) -> (usize, NodeId) {
    let start = Instant::now();
    loop {
        if let Some(r) = stored(rt, url, token) {
            return (if r.owner == "n1" { 0 } else { 1 }, r.session_id);
        }
        assert!(start.elapsed() < LIMIT, "the session was never mirrored");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An event item moves with its subscription: created on n1 (an
/// EventFilter on the Server object), mirrored with its filter, and there
/// on n2 after the takeover - SetMonitoringMode on its id succeeds, as it
/// does only for an item the subscription holds.
#[test]
fn an_event_item_moves_with_its_subscription() {
    use uascale_types::{MonitoringMode, SetMonitoringModeRequest, SetMonitoringModeResponse};
    let Some((_nats, rt, url, mut n1, n2)) = two_nodes() else {
        return;
    };

    let mut c = RawClient::connect(n1.addr);
    c.session();
    c.send_create_subscription(600, 10);
    let sub = c.read_subscription_id();
    let item = monitor_events(&mut c, sub, 10, &["Severity"]);
    // A Publish answer writes the record; wait for the item in it.
    let _ = publish_response(&mut c, vec![]);
    mirrored(&rt, &url, &c.auth, "the event item", |r| {
        r.subscriptions.iter().any(|s| {
            s.items
                .iter()
                .any(|i| i.id == item && i.event_filter.is_some())
        })
    });

    stop_node(&rt, &mut n1);
    let mut moved = reactivate_on(n2.addr, &c.auth);
    let mut set = |id: u32| {
        let h = moved.header();
        moved.send(&SetMonitoringModeRequest {
            request_header: h,
            subscription_id: sub,
            monitoring_mode: MonitoringMode::Reporting,
            monitored_item_ids: Some(vec![id]),
        });
        let (_, m) = moved.read_response();
        let r = m
            .as_any()
            .downcast_ref::<SetMonitoringModeResponse>()
            .unwrap_or_else(|| panic!("{m:?}"));
        r.results.as_deref().unwrap_or_default()[0]
    };
    assert_eq!(set(item), StatusCode::Good, "the event item is on n2");
    assert_eq!(
        set(item + 1000),
        StatusCode::BadMonitoredItemIdInvalid,
        "an id the subscription never had"
    );
    drop(n2);
}

/// The window of the last NotificationMessage (docs/cluster.md): the old
/// node sent a message its mirror never recorded (written here: the
/// record's next sequence number and retransmission queue put back to
/// before it, as if the node died between the Publish answer and the
/// write behind it). The client acknowledges that message in its first
/// Publish on the new node; the new node answers the acknowledgement Good
/// and numbers its first message after it - the client never sees a
/// number twice with different content.
#[test]
fn an_acknowledgement_past_the_mirror_moves_the_sequence_on() {
    let Some((_nats, rt, url, mut n1, n2)) = two_nodes() else {
        return;
    };

    let mut c = RawClient::connect(n1.addr);
    c.session();
    c.send_create_subscription(600, 10);
    let sub = c.read_subscription_id();
    c.send_monitor(sub, NodeId::ns0(2258));
    let _ = c.read_response();
    let seqs = notified_seqs(&mut c, 2);
    let last = *seqs.last().unwrap();
    let mut record = mirrored(&rt, &url, &c.auth, "the subscription", |r| {
        r.subscriptions
            .first()
            .is_some_and(|s| s.next_seq == last + 1)
    });
    stop_node(&rt, &mut n1);
    // The mirror as it was before message `last`.
    let image = &mut record.subscriptions[0];
    image.next_seq = last;
    image.retransmission.retain(|m| m.sequence_number < last);
    record.version += 1;
    let key = session_key(&c.auth).expect("an issued token");
    rt.block_on(async {
        let s = NatsStore::connect(&url, 1, Duration::from_secs(5))
            .await
            .expect("the store");
        s.put(Bucket::Subscriptions, &key, record.encode())
            .await
            .expect("the record written back");
    });

    let mut moved = reactivate_on(n2.addr, &c.auth);
    let acks = seqs
        .iter()
        .map(|s| SubscriptionAcknowledgement {
            subscription_id: sub,
            sequence_number: *s,
        })
        .collect();
    let p = publish_response(&mut moved, acks);
    assert_eq!(p.subscription_id, sub);
    assert_eq!(
        p.results,
        Some(vec![StatusCode::Good; seqs.len()]),
        "both messages were known: one mirrored, one acknowledged past it"
    );
    assert_eq!(
        p.notification_message.sequence_number,
        last + 1,
        "the number the old node used is not used again"
    );
    drop(n2);
}

fn service_level(c: &mut RawClient) -> u8 {
    let r = read_node(c, NodeId::ns0(2267)); // Server_ServiceLevel
    let r = r.as_any().downcast_ref::<ReadResponse>().expect("a Read");
    match r
        .results
        .as_ref()
        .and_then(|v| v.first())
        .and_then(|d| d.value.clone())
    {
        Some(uascale_types::Variant::Byte(b)) => b,
        other => panic!("ServiceLevel: {other:?}"),
    }
}

/// The store goes away: the node keeps serving its sessions, says it is
/// degraded (ServiceLevel at most 100), keeps what changed, and writes it
/// when the store is back (ServiceLevel back up).
#[test]
fn without_its_store_a_node_serves_degraded_and_catches_up() {
    let Some(mut nats) = nats::start() else {
        return;
    };
    let rt = runtime();
    let url = nats.url();
    let n1 = start_node(&rt, &url, "n1");
    assert!(nats::wait_listening(n1.addr, LIMIT));
    let mut c = RawClient::connect(n1.addr);
    c.session();
    let start = Instant::now();
    while stored(&rt, &url, &c.auth).is_none() {
        assert!(start.elapsed() < LIMIT, "the session was never mirrored");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(service_level(&mut c), 255);

    nats.kill();
    let start = Instant::now();
    while service_level(&mut c) > uascale_server::state::DEGRADED_SERVICE_LEVEL {
        assert!(
            start.elapsed() < LIMIT,
            "the node never said it was degraded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its sessions are served; a new one too, mirrored later.
    assert!(read_state(&mut c)
        .as_any()
        .downcast_ref::<ReadResponse>()
        .is_some());
    let mut late = RawClient::connect(n1.addr);
    late.session();

    nats.restart();
    let start = Instant::now();
    while service_level(&mut c) != 255 || stored(&rt, &url, &late.auth).is_none() {
        assert!(
            start.elapsed() < LIMIT * 2,
            "the node did not catch up when the store came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(n1);
}

/// A Write on one node is seen on the other: the value goes through the
/// store and the other node applies it to its in-memory node manager.
#[test]
fn a_write_on_one_node_is_read_on_the_other() {
    let Some((_nats, _rt, _url, n1, n2)) = two_nodes() else {
        return;
    };
    let node = NodeId::string(2, "Demo.Static.Scalar.Double");
    let mut a = RawClient::connect(n1.addr);
    a.session();
    let mut b = RawClient::connect(n2.addr);
    b.session();
    let h = a.header();
    a.send(&uascale_types::WriteRequest {
        request_header: h,
        nodes_to_write: Some(vec![uascale_types::WriteValue {
            node_id: node.clone(),
            attribute_id: AttributeId::Value as u32,
            value: uascale_types::DataValue {
                value: Some(uascale_types::Variant::Double(4242.5)),
                ..Default::default()
            },
            ..Default::default()
        }]),
    });
    let (_, w) = a.read_response();
    let w = w
        .as_any()
        .downcast_ref::<uascale_types::WriteResponse>()
        .expect("a WriteResponse");
    assert_eq!(w.results.as_deref(), Some(&[StatusCode::Good][..]));
    let start = Instant::now();
    loop {
        let r = read_node(&mut b, node.clone());
        let r = r.as_any().downcast_ref::<ReadResponse>().expect("a Read");
        let v = r
            .results
            .as_ref()
            .and_then(|v| v.first())
            .and_then(|d| d.value.clone());
        if v == Some(uascale_types::Variant::Double(4242.5)) {
            break;
        }
        assert!(start.elapsed() < LIMIT, "node 2 still reads {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((n1, n2));
}

/// The Value of `node_id` as a session reads it.
fn value_of(c: &mut RawClient, node_id: u32) -> Option<uascale_types::Variant> {
    let r = read_node(c, NodeId::ns0(node_id));
    let r = r.as_any().downcast_ref::<ReadResponse>().expect("a Read");
    r.results.as_ref()?.first()?.value.clone()
}

/// `RedundantServerArray` as a session reads it: (ServerId, ServiceLevel,
/// ServerState) of each member.
fn members(c: &mut RawClient) -> Vec<(String, u8, i32)> {
    let Some(uascale_types::Variant::Array(a)) = value_of(c, 11313) else {
        panic!("RedundantServerArray is an array");
    };
    let uascale_types::ArrayValues::ExtensionObject(rows) = a.values() else {
        panic!("of structures");
    };
    rows.iter()
        .map(|e| {
            let r = e
                .downcast_ref::<uascale_types::RedundantServerDataType>()
                .expect("RedundantServerDataType");
            (
                r.server_id.as_str_or_empty().to_owned(),
                r.service_level,
                r.server_state.0,
            )
        })
        .collect()
}

/// Reads `what` through `c` until `done` holds (within [`LIMIT`]).
fn until<T: std::fmt::Debug>(
    c: &mut RawClient,
    what: impl Fn(&mut RawClient) -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let start = Instant::now();
    loop {
        let v = what(c);
        if done(&v) {
            return v;
        }
        assert!(start.elapsed() < LIMIT, "never reached: {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The transparent redundancy surface: TransparentRedundancyType with
/// CurrentServerId (the serving node) and RedundantServerArray built from
/// the heartbeats. A node shutting down while the other serves on marks
/// only its own entry and its own readiness, and refuses new sessions busy;
/// its sessions still read Running and a healthy ServiceLevel. When every
/// node shuts down, the set does: State Shutdown, ServiceLevel 0.
#[test]
fn a_node_shutting_down_marks_only_its_own_entry() {
    let Some((_nats, _rt, _url, n1, n2)) = two_nodes() else {
        return;
    };
    let mut c1 = RawClient::connect(n1.addr);
    c1.session();
    let mut c2 = RawClient::connect(n2.addr);
    c2.session();
    // HasTypeDefinition TransparentRedundancyType, CurrentServerId.
    assert_eq!(
        value_of(&mut c1, 11312),
        Some(uascale_types::Variant::String("n1".into()))
    );
    assert_eq!(
        value_of(&mut c2, 11312),
        Some(uascale_types::Variant::String("n2".into()))
    );
    let both_running =
        |m: &Vec<(String, u8, i32)>| m.len() == 2 && m.iter().all(|(_, l, s)| *l >= 200 && *s == 0);
    let m = until(&mut c1, members, both_running);
    assert_eq!(
        m.iter().map(|(id, _, _)| id.as_str()).collect::<Vec<_>>(),
        ["n1", "n2"]
    );
    until(&mut c2, members, both_running);

    // n1 shuts down; n2 serves on.
    n1.state
        .shutdown
        .plan(Instant::now(), Duration::from_secs(60), "maintenance", None);
    assert_eq!(n1.state.readiness(), Err("shutting down"));
    assert_eq!(n2.state.readiness(), Ok(()));
    let n1_down = |m: &Vec<(String, u8, i32)>| {
        m.iter().any(|(id, l, s)| id == "n1" && *l == 0 && *s == 4)
            && m.iter()
                .any(|(id, l, s)| id == "n2" && *l >= 200 && *s == 0)
    };
    until(&mut c2, members, n1_down);
    until(&mut c1, members, n1_down);
    // n1's own session reads the set's state, not n1's.
    assert_eq!(
        value_of(&mut c1, 2259),
        Some(uascale_types::Variant::Int32(0)),
        "State Running"
    );
    match value_of(&mut c1, 2267) {
        Some(uascale_types::Variant::Byte(l)) => assert!(l >= 200, "ServiceLevel {l}"),
        other => panic!("ServiceLevel {other:?}"),
    }
    // A new session on n1 is refused busy: the front end sends it to n2.
    let mut late = RawClient::connect(n1.addr);
    let h = late.header();
    late.send(&uascale_types::CreateSessionRequest {
        request_header: h,
        requested_session_timeout: 60_000.0,
        ..Default::default()
    });
    let (_, m) = late.read_response();
    let fault = m
        .as_any()
        .downcast_ref::<ServiceFault>()
        .unwrap_or_else(|| panic!("a fault: {m:?}"));
    assert_eq!(
        fault.response_header.service_result,
        StatusCode::BadServerTooBusy
    );

    // n2 shuts down too: now the whole set goes, and n1's session says so.
    n2.state
        .shutdown
        .plan(Instant::now(), Duration::from_secs(60), "maintenance", None);
    until(
        &mut c1,
        |c| (value_of(c, 2259), value_of(c, 2267)),
        |v| {
            *v == (
                Some(uascale_types::Variant::Int32(4)),
                Some(uascale_types::Variant::Byte(0)),
            )
        },
    );
}

/// A node draining (its planned shutdown due while another node serves
/// on) writes each session's final state to the store before it closes
/// the session's channel: the record holds every notification the client
/// was sent, and on the other node the session and its subscription
/// continue with the next sequence number - no gap, no number reused.
#[test]
fn a_draining_node_writes_the_final_state_before_it_closes() {
    let Some((_nats, rt, url, mut n1, n2)) = two_nodes() else {
        return;
    };
    let mut c = RawClient::connect(n1.addr);
    c.session();
    c.send_create_subscription(600, 10);
    let sub = c.read_subscription_id();
    c.send_monitor(sub, NodeId::ns0(2258)); // CurrentTime: a new value each sample
    let _ = c.read_response();
    // The drain needs n2 serving, as n1's heartbeats tell it.
    let start = Instant::now();
    while n1.state.cluster().map(|n| n.serving_peer_count()) != Some(1) {
        assert!(start.elapsed() < LIMIT, "n1 never saw n2");
        std::thread::sleep(Duration::from_millis(20));
    }
    let seqs = notified_seqs(&mut c, 3);
    let last = *seqs.last().unwrap();
    // A second item, and no Publish after it: only the next answer would
    // have written it to the store - the drain writes it.
    c.send_monitor(sub, NodeId::ns0(2258));
    let _ = c.read_response();

    n1.state
        .shutdown
        .plan(Instant::now(), Duration::ZERO, "drain test", None);
    assert_eq!(c.read_error(), StatusCode::BadShutdown);
    // Written before the close: at once, no waiting for the mirror.
    let record = subscriptions_record(&rt, &url, &c.auth).expect("mirrored");
    let s = record.subscriptions.first().expect("the subscription");
    assert_eq!(
        (s.next_seq, s.items.len()),
        (last + 1, 2),
        "the final sequence number and both items were written before the close"
    );
    rt.block_on(async {
        let _ = tokio::time::timeout(LIMIT, &mut n1.task).await;
    });

    let mut moved = reactivate_on(n2.addr, &c.auth);
    let acks = seqs
        .iter()
        .map(|s| SubscriptionAcknowledgement {
            subscription_id: sub,
            sequence_number: *s,
        })
        .collect();
    let p = publish_response(&mut moved, acks);
    assert_eq!(p.subscription_id, sub, "the same subscription id");
    assert_eq!(
        p.notification_message.sequence_number,
        last + 1,
        "no gap, no reuse"
    );
    drop(n2);
}

fn browse_of(c: &mut RawClient, nodes: &[u32], max: u32) -> Vec<BrowseResult> {
    let h = c.header();
    c.send(&BrowseRequest {
        request_header: h,
        requested_max_references_per_node: max,
        nodes_to_browse: Some(
            nodes
                .iter()
                .map(|n| BrowseDescription {
                    node_id: NodeId::ns0(*n),
                    browse_direction: BrowseDirection::Both,
                    include_subtypes: true,
                    result_mask: 0x3f,
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    });
    let (_, m) = c.read_response();
    m.as_any()
        .downcast_ref::<BrowseResponse>()
        .unwrap_or_else(|| panic!("a BrowseResponse: {m:?}"))
        .results
        .clone()
        .unwrap_or_default()
}

fn browse_next_of(c: &mut RawClient, cp: &ByteString, release: bool) -> BrowseResult {
    let h = c.header();
    c.send(&BrowseNextRequest {
        request_header: h,
        release_continuation_points: release,
        continuation_points: Some(vec![cp.clone()]),
    });
    let (_, m) = c.read_response();
    let r = m
        .as_any()
        .downcast_ref::<BrowseNextResponse>()
        .unwrap_or_else(|| panic!("a BrowseNextResponse: {m:?}"));
    r.results
        .clone()
        .unwrap_or_default()
        .into_iter()
        .next()
        .expect("one result")
}

/// A nats-server, two cluster nodes (PROXY protocol on) and HAProxy in
/// front of them (`front`). Dropped in this order (and bound by the
/// tests in the reverse order, so dropped the same way): the nodes
/// first, the server last.
struct HaproxyCluster {
    front: std::net::SocketAddr,
    _haproxy: haproxy::Haproxy,
    nodes: [Node; 2],
    url: String,
    rt: tokio::runtime::Runtime,
    _nats: nats::Nats,
}

/// [`HaproxyCluster`], once each node sees the other serving and reading
/// record format `format`; None when nats-server or haproxy cannot be had
/// (the test then skips).
fn behind_haproxy(format: u8) -> Option<HaproxyCluster> {
    behind_haproxy_with(format, |_| {})
}

/// [`behind_haproxy`] with `change` made to both nodes' configuration.
fn behind_haproxy_with(
    format: u8,
    change: fn(&mut uascale_server::ServerConfig),
) -> Option<HaproxyCluster> {
    let nats = nats::start()?;
    let rt = runtime();
    let url = nats.url();
    let proxied = |c: &mut uascale_server::ServerConfig| {
        c.cluster.proxy_protocol = true;
        change(c);
    };
    let nodes = [
        start_node_with(&rt, &url, "n1", proxied),
        start_node_with(&rt, &url, "n2", proxied),
    ];
    for n in &nodes {
        assert!(nats::wait_listening(n.addr, LIMIT));
    }
    let front = nats::free_port();
    let ports: Vec<u16> = nodes.iter().map(|n| n.addr.port()).collect();
    let haproxy = haproxy::haproxy(front, &ports)?;
    let start = Instant::now();
    while !nodes.iter().all(|n| {
        n.state
            .cluster()
            .is_some_and(|c| c.serving_peer_count() == 1 && c.all_read(format))
    }) {
        assert!(start.elapsed() < LIMIT, "the nodes never saw each other");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(HaproxyCluster {
        _nats: nats,
        rt,
        url,
        nodes,
        _haproxy: haproxy,
        front: ([127, 0, 0, 1], front).into(),
    })
}

/// Browse continuation points move with their session: a client behind
/// HAProxy browses the Server object three references at a time and an
/// Objects folder too, holding two continuation points; they reach the
/// store with the session's record; its node drains; the client comes
/// back through HAProxy and activates its session on the survivor, where
/// BrowseNext answers exactly the references it had not seen (each once,
/// in order, none left out) and releasing the other point works - and
/// both leave the mirror.
#[test]
fn browse_next_goes_on_on_the_node_that_took_the_session_over() {
    // Each node sees the other serving and reading the continuation
    // points' record format (it writes them only then).
    let Some(HaproxyCluster {
        _nats,
        rt,
        url,
        mut nodes,
        _haproxy,
        front,
    }) = behind_haproxy(record::FORMAT_CONTINUATION)
    else {
        return;
    };

    let mut c = RawClient::connect(front);
    c.session();
    let first = browse_of(&mut c, &[2253, 85], 3);
    assert_eq!(first.len(), 2);
    for r in &first {
        assert_eq!(r.status_code, StatusCode::Good);
        assert!(!r.continuation_point.is_null(), "more than 3 references");
    }
    let seen = first[0].references.clone().unwrap_or_default();
    assert_eq!(seen.len(), 3);
    // The mirror writes behind the request path: wait for the points.
    let start = Instant::now();
    let record = loop {
        if let Some(r) = stored(&rt, &url, &c.auth).filter(|r| r.continuation_points.len() == 2) {
            break r;
        }
        assert!(
            start.elapsed() < LIMIT,
            "the continuation points were never mirrored"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let cp = &record.continuation_points[0];
    assert_eq!(
        (cp.id.as_slice(), cp.max, cp.returned),
        (first[0].continuation_point.as_bytes().unwrap(), 3, 3)
    );
    let (owner, survivor) = match record.owner.as_str() {
        "n1" => (0, 1),
        "n2" => (1, 0),
        other => panic!("owned by {other}"),
    };

    // Its node drains: the final records, then the close.
    drain_now(&rt, &mut nodes[owner], &mut c, "browse test");

    // Back through the front end, on the survivor.
    let mut moved = reactivate_on(front, &c.auth);
    let after = stored(&rt, &url, &c.auth).expect("still mirrored");
    assert_eq!(
        after.owner,
        ["n1", "n2"][survivor],
        "taken over by the survivor"
    );
    assert_eq!(after.session_id, record.session_id, "the same session");
    let mut rest = Vec::new();
    let mut next = first[0].continuation_point.clone();
    let mut pages = 0;
    while !next.is_null() {
        let r = browse_next_of(&mut moved, &next, false);
        assert_eq!(
            r.status_code,
            StatusCode::Good,
            "BrowseNext on the survivor"
        );
        let page = r.references.unwrap_or_default();
        assert!(
            !page.is_empty() && page.len() <= 3,
            "{} references",
            page.len()
        );
        rest.extend(page);
        next = r.continuation_point;
        pages += 1;
        assert!(pages < 100, "the browse never ended");
    }
    assert!(pages >= 2, "several pages were left");
    let all = browse_of(&mut moved, &[2253], 0)
        .remove(0)
        .references
        .unwrap_or_default();
    let mut together = seen;
    together.extend(rest);
    assert_eq!(together, all, "the references not yet seen, each once");
    // The other point is released; then it is gone.
    let other = &first[1].continuation_point;
    let released = browse_next_of(&mut moved, other, true);
    assert_eq!(
        (released.status_code, released.references),
        (StatusCode::Good, None)
    );
    assert_eq!(
        browse_next_of(&mut moved, other, false).status_code,
        StatusCode::BadContinuationPointInvalid
    );
    // Both left the mirror (used up, released).
    let start = Instant::now();
    while !stored(&rt, &url, &c.auth).is_some_and(|r| r.continuation_points.is_empty()) {
        assert!(
            start.elapsed() < LIMIT,
            "the mirror still holds continuation points"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(nodes);
}

fn create_subscription(c: &mut RawClient, interval_ms: f64) -> u32 {
    let h = c.header();
    c.send(&uascale_types::CreateSubscriptionRequest {
        request_header: h,
        requested_publishing_interval: interval_ms,
        requested_lifetime_count: 600,
        requested_max_keep_alive_count: 10,
        publishing_enabled: true,
        ..Default::default()
    });
    c.read_subscription_id()
}

/// A pushed item (no sampling) on `node`'s Value with a queue of `queue`,
/// every timestamp returned.
fn monitor_queued(c: &mut RawClient, sub: u32, node: NodeId, queue: u32) {
    let h = c.header();
    c.send(&uascale_types::CreateMonitoredItemsRequest {
        request_header: h,
        subscription_id: sub,
        timestamps_to_return: uascale_types::TimestampsToReturn::Both,
        items_to_create: Some(vec![uascale_types::MonitoredItemCreateRequest {
            item_to_monitor: ReadValueId {
                node_id: node,
                attribute_id: AttributeId::Value as u32,
                ..Default::default()
            },
            monitoring_mode: uascale_types::MonitoringMode::Reporting,
            requested_parameters: uascale_types::MonitoringParameters {
                client_handle: 7,
                sampling_interval: 0.0,
                queue_size: queue,
                discard_oldest: true,
                ..Default::default()
            },
        }]),
    });
    let (_, m) = c.read_response();
    let r = m
        .as_any()
        .downcast_ref::<uascale_types::CreateMonitoredItemsResponse>()
        .unwrap_or_else(|| panic!("a CreateMonitoredItemsResponse: {m:?}"));
    let result = &r.results.as_ref().expect("a result")[0];
    assert_eq!(result.status_code, StatusCode::Good);
    assert!(result.revised_queue_size >= queue, "{result:?}");
}

/// The data values of a NotificationMessage, in order.
fn data_values(p: &PublishResponse) -> Vec<uascale_types::DataValue> {
    p.notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
        .flat_map(|d| d.monitored_items.iter().flatten().map(|m| m.value.clone()))
        .collect()
}

/// The values a draining node had not yet published move with their
/// session: a client behind HAProxy has an item with a queue of 50 on a
/// value written every 20 ms, ten times inside one publishing interval of
/// 1.5 s; its node drains in the middle of that interval; the final
/// record holds the ten queued values; the client activates its session
/// through HAProxy on the survivor, and what it receives there - the ten,
/// then newer values written on the survivor - follows what it received
/// before with no value missing and none twice (values and source
/// timestamps checked), the sequence numbers without a gap.
#[test]
fn values_queued_at_a_drain_are_delivered_by_the_survivor() {
    let Some(HaproxyCluster {
        _nats,
        rt,
        url,
        mut nodes,
        _haproxy,
        front,
    }) = behind_haproxy(record::FORMAT_QUEUES)
    else {
        return;
    };
    let var = NodeId::string(2, "Demo.Static.Scalar.Double");
    let write = |node: &Node, x: f64| {
        node.state
            .managers
            .write_value(&var, uascale_types::Variant::Double(x))
            .expect("a demo variable takes a Double");
    };
    for n in &nodes {
        write(n, 0.0);
    }
    let mut c = RawClient::connect(front);
    c.session();
    let sub = create_subscription(&mut c, 1500.0);
    monitor_queued(&mut c, sub, var.clone(), 50);
    let (owner, session_id) = owner_of(&rt, &url, &c.auth);
    let survivor = 1 - owner;
    // The first message: the item's first value, 0. A publishing
    // interval starts with it.
    let mut got = Vec::new();
    let mut seqs = Vec::new();
    while got.is_empty() {
        let p = publish_response(&mut c, vec![]);
        let values = data_values(&p);
        if !values.is_empty() {
            seqs.push(p.notification_message.sequence_number);
            got.extend(values);
        }
    }
    // Ten values inside the interval (200 ms of its 1.5 s), none published.
    for x in 1..=10 {
        write(&nodes[owner], f64::from(x));
        std::thread::sleep(Duration::from_millis(20));
    }
    drain_now(&rt, &mut nodes[owner], &mut c, "queue test");
    // The final record holds the ten, oldest first.
    let record = subscriptions_record(&rt, &url, &c.auth).expect("mirrored");
    let queued: Vec<_> = record.subscriptions[0].items[0]
        .queued
        .iter()
        .map(|v| v.value.clone())
        .collect();
    assert_eq!(
        queued,
        (1..=10)
            .map(|x| Some(uascale_types::Variant::Double(f64::from(x))))
            .collect::<Vec<_>>(),
        "the unsent values in the drain's final record"
    );
    // The survivor follows the written values (the cluster's value feed):
    // its current value is the last one queued.
    let start = Instant::now();
    while nodes[survivor].state.managers.read_value(&var)
        != Some(Ok(uascale_types::Variant::Double(10.0)))
    {
        assert!(start.elapsed() < LIMIT, "the survivor never had value 10");
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut moved = reactivate_on(front, &c.auth);
    assert_eq!(
        stored(&rt, &url, &c.auth).map(|r| (r.owner, r.session_id)),
        Some((["n1", "n2"][survivor].to_owned(), session_id)),
        "the same session, taken over by the survivor"
    );
    for x in 11..=13 {
        write(&nodes[survivor], f64::from(x));
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut acks: Vec<_> = seqs
        .iter()
        .map(|s| SubscriptionAcknowledgement {
            subscription_id: sub,
            sequence_number: *s,
        })
        .collect();
    let start = Instant::now();
    while got.last().and_then(|v| v.value.clone()) != Some(uascale_types::Variant::Double(13.0)) {
        assert!(start.elapsed() < LIMIT, "value 13 never came: {got:?}");
        let p = publish_response(&mut moved, std::mem::take(&mut acks));
        assert_eq!(p.subscription_id, sub, "the same subscription");
        let values = data_values(&p);
        if !values.is_empty() {
            let seq = p.notification_message.sequence_number;
            acks.push(SubscriptionAcknowledgement {
                subscription_id: sub,
                sequence_number: seq,
            });
            seqs.push(seq);
            got.extend(values);
        }
    }
    let xs: Vec<_> = got.iter().map(|v| v.value.clone()).collect();
    assert_eq!(
        xs,
        (0..=13)
            .map(|x| Some(uascale_types::Variant::Double(f64::from(x))))
            .collect::<Vec<_>>(),
        "every value once, in order, across the move"
    );
    for pair in got.windows(2) {
        assert!(
            pair[0].source_timestamp < pair[1].source_timestamp,
            "source timestamps in order, none twice: {pair:?}"
        );
    }
    assert!(
        got.iter().all(|v| v.status_or_good() == StatusCode::Good),
        "no value marked Overflow: none was dropped"
    );
    for pair in seqs.windows(2) {
        assert_eq!(
            pair[1],
            pair[0] + 1,
            "sequence numbers without a gap: {seqs:?}"
        );
    }
    drop(nodes);
}

/// The events of a NotificationMessage, each one's fields, in order.
fn event_fields(p: &PublishResponse) -> Vec<Vec<uascale_types::Variant>> {
    p.notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<uascale_types::EventNotificationList>())
        .flat_map(|l| {
            l.events
                .iter()
                .flatten()
                .map(|e| e.event_fields.clone().unwrap_or_default())
        })
        .collect()
}

/// The events an event item had queued at a drain move with their
/// session: with auditing on, a client behind HAProxy watches the Server
/// object's events (EventId and EventType, a queue of 50, publishing every
/// 1.5 s, no Publish sent); sessions opened through the front end until
/// three landed on its node raise their audit events there, into its
/// queue; its node drains; the final record holds those events, and the
/// survivor's first notifications after the client activates its session
/// there are exactly them, in order - then only newer events, none twice.
#[test]
fn events_queued_at_a_drain_are_delivered_by_the_survivor() {
    use uascale_types::Variant;
    let Some(HaproxyCluster {
        _nats,
        rt,
        url,
        mut nodes,
        _haproxy,
        front,
    }) = behind_haproxy_with(record::FORMAT_EVENT_QUEUES, |c| c.server.auditing = true)
    else {
        return;
    };
    let mut c = RawClient::connect(front);
    c.session();
    let sub = create_subscription(&mut c, 1500.0);
    monitor_events(&mut c, sub, 50, &["EventId", "EventType"]);
    let (owner, _) = owner_of(&rt, &url, &c.auth);
    let survivor = 1 - owner;
    // Sessions through the front end until three landed on the owner.
    let mut others = Vec::new();
    let mut landed = 0;
    while landed < 3 {
        assert!(others.len() < 40, "sessions never landed on the owner");
        let before = nodes[owner].state.sessions.len();
        let mut o = RawClient::connect(front);
        o.session();
        if nodes[owner].state.sessions.len() > before {
            landed += 1;
        }
        others.push(o);
    }

    drain_now(&rt, &mut nodes[owner], &mut c, "event queue test");
    // The final record: the audit events of the three, in order.
    let record = subscriptions_record(&rt, &url, &c.auth).expect("mirrored");
    let queued: Vec<Vec<Variant>> = record.subscriptions[0]
        .items
        .iter()
        .find(|i| i.event_filter.is_some())
        .expect("the event item")
        .events
        .iter()
        .map(|e| {
            assert!(!e.overflow, "nothing discarded");
            e.fields.clone()
        })
        .collect();
    // Each of the three raised AuditCreateSession and AuditActivateSession.
    assert!(
        queued.len() >= 6,
        "the three sessions' audit events: {queued:?}"
    );

    let mut moved = reactivate_on(front, &c.auth);
    assert_eq!(
        stored(&rt, &url, &c.auth).map(|r| r.owner),
        Some(["n1", "n2"][survivor].to_owned()),
        "taken over by the survivor"
    );
    let mut got: Vec<Vec<Variant>> = Vec::new();
    let mut acks = Vec::new();
    let start = Instant::now();
    while got.len() < queued.len() {
        assert!(
            start.elapsed() < LIMIT,
            "the queued events never came: {got:?}"
        );
        let p = publish_response(&mut moved, std::mem::take(&mut acks));
        assert_eq!(p.subscription_id, sub, "the same subscription");
        let events = event_fields(&p);
        if !events.is_empty() {
            acks.push(SubscriptionAcknowledgement {
                subscription_id: sub,
                sequence_number: p.notification_message.sequence_number,
            });
            got.extend(events);
        }
    }
    assert_eq!(
        &got[..queued.len()],
        &queued[..],
        "the events queued at the drain first, in order"
    );
    let ids: std::collections::HashSet<String> =
        got.iter().map(|f| format!("{:?}", f[0])).collect();
    assert_eq!(ids.len(), got.len(), "no event twice: {got:?}");
    drop(others);
    drop(nodes);
}
