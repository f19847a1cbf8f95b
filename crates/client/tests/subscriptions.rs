//! Client subscriptions and reconnect against uascale servers in the same
//! process, over real loopback sockets. A small TCP relay between client
//! and server lets the tests cut every connection (a network blip) or send
//! the client to another server (a node that never knew its session).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use uascale_client::{
    event_filter, Backoff, Client, ClientError, ClientOptions, ConnectReport, MonitorItem,
    Notification, OpenAttempt, OpenObserver, OpenStage, Restore, Subscription, SubscriptionEvent,
    SubscriptionSettings, UserIdentity,
};
use uascale_server::config::{SecurityConfig, UserConfig};
use uascale_server::{Server, ServerConfig};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode, Variant};

mod common;

use common::config;

const COUNTER: &str = "Demo.Dynamic.Counter";

/// Starts a server; its address and a handle that stops it.
fn start(config: ServerConfig) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let server = Server::bind(config).unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// A TCP relay: forwards each connection to the current target; `cut`
/// drops every relayed connection at once.
struct Relay {
    addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target));
        let links = Arc::new(Mutex::new(Vec::new()));
        let (t2, l2) = (target.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = *t2.lock().unwrap();
                let link = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                l2.lock().unwrap().push(link);
            }
        });
        Relay {
            addr,
            target,
            links,
        }
    }

    fn url(&self) -> String {
        format!("opc.tcp://{}", self.addr)
    }

    fn cut(&self) {
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn retarget(&self, to: SocketAddr) {
        *self.target.lock().unwrap() = to;
    }
}

fn fast_reconnect() -> ClientOptions {
    let mut backoff = Backoff::default();
    backoff.initial = Duration::from_millis(50);
    backoff.max = Duration::from_millis(500);
    ClientOptions {
        backoff,
        ..Default::default()
    }
}

async fn next(sub: &mut Subscription) -> SubscriptionEvent {
    tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .expect("an event within 10 s")
        .expect("the stream goes on")
}

/// The counter values of data changes, until `n` arrived; panics on Lost
/// or Ended.
async fn counter_values(sub: &mut Subscription, n: usize) -> Vec<u32> {
    let (values, restores) = collect(sub, n, false).await;
    assert!(restores.is_empty(), "{restores:?}");
    values
}

/// After the subscription is restored: how, and the next `n` counter
/// values (the values delivered before the restore are skipped).
async fn after_restore(sub: &mut Subscription, n: usize) -> (Restore, Vec<u32>) {
    let (values, restores) = collect(sub, n, true).await;
    assert_eq!(restores.len(), 1, "restored once: {restores:?}");
    (restores[0], values)
}

async fn collect(
    sub: &mut Subscription,
    n: usize,
    restore_first: bool,
) -> (Vec<u32>, Vec<Restore>) {
    let mut values = Vec::new();
    let mut restores = Vec::new();
    while values.len() < n || (restore_first && restores.is_empty()) {
        match next(sub).await {
            SubscriptionEvent::Notifications { notifications, .. } => {
                for n in notifications {
                    if let Notification::DataChange { value, .. } = n {
                        match value.value {
                            Some(Variant::UInt32(v)) => {
                                if !restore_first || !restores.is_empty() {
                                    values.push(v)
                                }
                            }
                            other => panic!("counter value {other:?}"),
                        }
                    }
                }
            }
            SubscriptionEvent::Restored(how) => restores.push(how),
            SubscriptionEvent::KeepAlive { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    (values, restores)
}

async fn counter_subscription(client: &Client) -> Subscription {
    let sub = client
        .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(
            50,
        )))
        .await
        .unwrap();
    let items = sub
        .monitor(vec![
            MonitorItem::value(NodeId::string(2, COUNTER)).sampling(0.0)
        ])
        .await
        .unwrap();
    assert_eq!(items[0].result.status_code, StatusCode::Good);
    sub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_changes_events_and_keep_alives_arrive() {
    let (addr, _stop) = start(config());
    let client = Client::connect(&format!("opc.tcp://{addr}"), ClientOptions::default())
        .await
        .unwrap();
    client.create_session("subs").await.unwrap();
    let mut sub = client
        .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(
            50,
        )))
        .await
        .unwrap();
    let revised = sub.revised().unwrap();
    assert_eq!(revised.publishing_interval, Duration::from_millis(50));
    assert!(sub.id() != 0);

    let static_node = NodeId::string(2, "Demo.Static.Scalar.Int32");
    let items = sub
        .monitor(vec![
            MonitorItem::value(NodeId::string(2, COUNTER)).sampling(0.0),
            MonitorItem::events(
                NodeId::ns0(2253),
                event_filter(&["Message", "Severity"], Default::default()),
            ),
            MonitorItem::value(static_node.clone()),
            MonitorItem::value(NodeId::string(2, "No.Such.Node")),
        ])
        .await
        .unwrap();
    assert_eq!(items.len(), 4);
    assert!(items[..3].iter().all(|i| i.result.status_code.is_good()));
    assert_eq!(items[3].result.status_code, StatusCode::BadNodeIdUnknown);
    let (counter, events, written) = (
        items[0].client_handle,
        items[1].client_handle,
        items[2].client_handle,
    );

    let status = client
        .write(vec![t::WriteValue {
            node_id: static_node,
            attribute_id: t::AttributeId::Value as u32,
            value: t::DataValue::value(Variant::Int32(4242)),
            ..Default::default()
        }])
        .await
        .unwrap();
    assert_eq!(status, vec![StatusCode::Good]);

    let mut counter_values = Vec::new();
    let mut messages = Vec::new();
    let mut saw_written = false;
    let mut last_seq = None;
    while counter_values.len() < 5 || messages.len() < 2 || !saw_written {
        match next(&mut sub).await {
            SubscriptionEvent::Notifications {
                sequence_number,
                notifications,
                republished,
                ..
            } => {
                assert!(!republished, "nothing was lost");
                if let Some(last) = last_seq {
                    assert_eq!(sequence_number, last + 1, "in order");
                }
                last_seq = Some(sequence_number);
                for n in notifications {
                    match n {
                        Notification::DataChange {
                            client_handle,
                            value,
                        } if client_handle == counter => {
                            let Some(Variant::UInt32(v)) = value.value else {
                                panic!("counter {value:?}")
                            };
                            counter_values.push(v);
                        }
                        Notification::DataChange {
                            client_handle,
                            value,
                        } if client_handle == written => {
                            if value.value == Some(Variant::Int32(4242)) {
                                saw_written = true;
                            }
                        }
                        Notification::Event {
                            client_handle,
                            fields,
                        } => {
                            assert_eq!(client_handle, events);
                            assert_eq!(fields.len(), 2);
                            let Variant::LocalizedText(text) = &fields[0] else {
                                panic!("Message {:?}", fields[0])
                            };
                            assert!(text.text.as_str().unwrap_or("").starts_with("Demo event"));
                            assert!(matches!(fields[1], Variant::UInt16(100..=1000)));
                            messages.push(text.text.clone());
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
            SubscriptionEvent::KeepAlive { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        counter_values.windows(2).all(|w| w[0] < w[1]),
        "the counter only grows: {counter_values:?}"
    );

    // Without the counter and the events, only keep-alives come.
    let statuses = sub.unmonitor(&[counter, events]).await.unwrap();
    assert_eq!(statuses, vec![StatusCode::Good, StatusCode::Good]);
    let mut keep_alives = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while keep_alives < 2 {
        assert!(tokio::time::Instant::now() < deadline, "keep-alives come");
        if let SubscriptionEvent::KeepAlive { .. } = next(&mut sub).await {
            keep_alives += 1;
        }
    }
    // Modify, pause and resume publishing, disable and enable an item.
    let revised = sub
        .modify(SubscriptionSettings::with_interval(Duration::from_millis(
            200,
        )))
        .await
        .unwrap();
    assert_eq!(revised.publishing_interval, Duration::from_millis(200));
    assert_eq!(sub.revised(), Some(revised));
    sub.set_publishing(false).await.unwrap();
    sub.set_publishing(true).await.unwrap();
    let modes = sub
        .set_monitoring_mode(&[written, 999_999], t::MonitoringMode::Disabled)
        .await
        .unwrap();
    assert_eq!(
        modes,
        vec![StatusCode::Good, StatusCode::BadMonitoredItemIdInvalid]
    );

    let id = sub.id();
    sub.delete().await.unwrap();
    // The server has no such subscription any more.
    let err = client
        .request::<t::SetPublishingModeResponse>(&t::SetPublishingModeRequest {
            request_header: client.request_header(),
            publishing_enabled: false,
            subscription_ids: Some(vec![id]),
        })
        .await;
    match err {
        Ok(r) => assert_eq!(
            r.results.unwrap(),
            vec![StatusCode::BadSubscriptionIdInvalid]
        ),
        Err(e) => assert_eq!(e.status_code(), StatusCode::BadSubscriptionIdInvalid),
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_reactivates_the_same_session() {
    let (addr, _stop) = start(config());
    let relay = Relay::start(addr).await;
    let client = Client::connect(&relay.url(), fast_reconnect())
        .await
        .unwrap();
    let created = client.create_session("blip").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let before = counter_values(&mut sub, 3).await;

    relay.cut();
    let (how, after) = after_restore(&mut sub, 3).await;
    assert_eq!(how, Restore::Reactivated);
    assert!(before.last() < after.first(), "{before:?} then {after:?}");
    assert_eq!(client.channels_opened(), 2);
    assert!(client.is_connected());

    // The same session: its id is in the server's session diagnostics
    // (i=3707 SessionDiagnosticsArray) and requests work.
    let values = client.read_values(&[NodeId::ns0(3707)]).await.unwrap();
    let Some(Variant::Array(rows)) = &values[0].value else {
        panic!("diagnostics array {:?}", values[0]);
    };
    assert_eq!(rows.values().len(), 1, "one session, not a second one");
    let text = format!("{rows:?}");
    assert!(
        text.contains(&format!("{:?}", created.session_id)),
        "the session is still {:?}",
        created.session_id
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_session_gets_it_and_the_subscription_again() {
    let (first, stop_first) = start(config());
    let relay = Relay::start(first).await;
    let client = Client::connect(&relay.url(), fast_reconnect())
        .await
        .unwrap();
    client.create_session("failover").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let old_id = sub.id();
    let _ = counter_values(&mut sub, 2).await;

    // The client's server goes away; the relay now leads to a server that
    // never saw this client.
    let (second, _stop) = start(config());
    relay.retarget(second);
    let _ = stop_first.send(());
    relay.cut();
    let (how, values) = after_restore(&mut sub, 3).await;
    assert_eq!(how, Restore::Recreated);
    assert!(!values.is_empty());
    assert_eq!(client.channels_opened(), 2);
    assert!(sub.id() != 0);
    let _ = old_id;
    let read = client.read_values(&[NodeId::ns0(2258)]).await.unwrap();
    assert!(matches!(read[0].value, Some(Variant::DateTime(_))));
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_may_not_move_is_replaced_and_its_subscription_transferred() {
    let hash = uascale_server::identity::hash_password(b"secret-pw").unwrap();
    let mut cfg = config();
    // UserName tokens need a server certificate to encrypt the password
    // for: a PKI in a directory of this test's own.
    let pki = std::env::temp_dir().join(format!("uascale-client-transfer-{}", std::process::id()));
    cfg.security = SecurityConfig {
        pki_dir: pki.clone(),
        ..Default::default()
    };
    cfg.users = vec![UserConfig::new("op", &hash)];
    let (addr, _stop) = start(cfg);
    let relay = Relay::start(addr).await;
    let options = ClientOptions {
        identity: UserIdentity::UserName {
            user: "op".into(),
            password: "secret-pw".into(),
        },
        ..fast_reconnect()
    };
    let client = Client::connect(&relay.url(), options).await.unwrap();
    client.create_session("user").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let id = sub.id();
    let _ = counter_values(&mut sub, 2).await;

    // On SecurityPolicy None the server moves only anonymous sessions to a
    // new channel: the client creates a new session as the same user and
    // the subscription is transferred to it, keeping its id.
    relay.cut();
    let (how, values) = after_restore(&mut sub, 3).await;
    assert_eq!(how, Restore::Transferred);
    assert!(!values.is_empty());
    assert_eq!(sub.id(), id);
    client.close().await;
    let _ = std::fs::remove_dir_all(pki);
}

/// A cut shows as the server closing (EOF) or as a reset.
fn lost_connection(status: StatusCode) -> bool {
    status == StatusCode::BadConnectionClosed || status == StatusCode::BadCommunicationError
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reconnect_a_cut_ends_the_client() {
    let (addr, _stop) = start(config());
    let relay = Relay::start(addr).await;
    let options = ClientOptions {
        reconnect: false,
        ..Default::default()
    };
    let client = Client::connect(&relay.url(), options).await.unwrap();
    client.create_session("once").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let _ = counter_values(&mut sub, 1).await;
    relay.cut();
    // The stream ends with the reason.
    loop {
        match next(&mut sub).await {
            SubscriptionEvent::Ended(status) => {
                assert!(lost_connection(status), "{status}");
                break;
            }
            SubscriptionEvent::Notifications { .. } | SubscriptionEvent::KeepAlive { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(sub.recv().await.is_none());
    let err = client.read_values(&[NodeId::ns0(2258)]).await.unwrap_err();
    assert!(lost_connection(err.status_code()), "{err}");
    assert!(!client.is_connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_retries_busy_refusals_per_the_backoff() {
    let mut cfg = config();
    cfg.server.max_session_count = 1;
    // Room for the refused clients' channels: the refusal to see is the
    // session limit's.
    cfg.admission.max_channel_count = Some(10);
    let (addr, _stop) = start(cfg);
    let url = format!("opc.tcp://{addr}");
    let mut report = ConnectReport::default();
    let first = Client::open(&url, fast_reconnect(), "first", &mut report)
        .await
        .unwrap();
    assert_eq!(report, ConnectReport::default());

    // The second is refused (BadTooManySessions, a busy signal) until the
    // first closes.
    let closer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        first.close().await;
    });
    let mut report = ConnectReport::default();
    let heard = Arc::new(Mutex::new(Vec::<OpenAttempt>::new()));
    let sink = Arc::clone(&heard);
    let options = ClientOptions {
        connect_attempts: 20,
        on_open_attempt: Some(OpenObserver(Arc::new(move |a: &OpenAttempt| {
            sink.lock().unwrap().push(a.clone());
        }))),
        ..fast_reconnect()
    };
    let second = Client::open(&url, options, "second", &mut report)
        .await
        .unwrap();
    closer.await.unwrap();
    assert!(report.retries >= 1, "{report:?}");
    assert_eq!(report.busy_answers, report.retries);
    // The observer heard every attempt: the refusals at CreateSession, each
    // with its wait, then the success.
    let heard = heard.lock().unwrap().clone();
    assert_eq!(heard.len() as u32, report.retries + 1, "{heard:?}");
    for (i, a) in heard.iter().enumerate() {
        assert_eq!(a.number as usize, i + 1);
    }
    let (last, refused) = heard.split_last().unwrap();
    assert!(
        last.failure.is_none() && last.retry_in.is_none(),
        "{last:?}"
    );
    for a in refused {
        let (stage, e) = a.failure.as_ref().unwrap();
        assert_eq!(*stage, OpenStage::CreateSession, "{a:?}");
        assert_eq!(e.status_code(), StatusCode::BadTooManySessions);
        assert!(a.retry_in.is_some(), "{a:?}");
    }
    second.read_values(&[NodeId::ns0(2258)]).await.unwrap();

    // With too few attempts the refusal is the answer.
    let mut report = ConnectReport::default();
    let options = ClientOptions {
        connect_attempts: 2,
        ..fast_reconnect()
    };
    let err = Client::open(&url, options, "third", &mut report)
        .await
        .unwrap_err();
    assert_eq!(err.status_code(), StatusCode::BadTooManySessions);
    assert_eq!(report.retries, 1);
    assert!(matches!(err, ClientError::Service { .. }));
    second.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_session_is_reactivated_on_a_new_secured_channel() {
    use std::time::{SystemTime, UNIX_EPOCH};
    use uascale_client::{SecurityOptions, ServerTrust};
    use uascale_crypto::policy::SecurityPolicy;
    use uascale_crypto::rsa::RsaPrivateKey;
    use uascale_crypto::x509::{create_self_signed, Certificate, SelfSignedParams};
    use uascale_proto::security::Identity;

    let hash = uascale_server::identity::hash_password(b"secret-pw").unwrap();
    let pki = std::env::temp_dir().join(format!("uascale-client-secure-{}", std::process::id()));
    let mut cfg = config();
    cfg.security = SecurityConfig {
        pki_dir: pki.clone(),
        trust_all_client_certificates: true,
        ..Default::default()
    };
    cfg.users = vec![UserConfig::new("op", &hash)];
    let (addr, _stop) = start(cfg);
    let relay = Relay::start(addr).await;
    let start_time = SystemTime::now()
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or(UNIX_EPOCH);
    let made = create_self_signed(&SelfSignedParams::new(
        "urn:uascale:client",
        "uascale client",
        start_time,
    ))
    .unwrap();
    let identity = Arc::new(
        Identity::new(
            Certificate::from_der(made.certificate.der()).unwrap(),
            RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap(),
        )
        .unwrap(),
    );
    let options = ClientOptions {
        security: SecurityOptions {
            policy: SecurityPolicy::Basic256Sha256,
            mode: t::MessageSecurityMode::SignAndEncrypt,
            certificate: Some(identity),
            server_certificate: None,
            trust: ServerTrust::UnsafeAcceptAny,
        },
        identity: UserIdentity::UserName {
            user: "op".into(),
            password: "secret-pw".into(),
        },
        ..fast_reconnect()
    };
    let client = Client::connect(&relay.url(), options).await.unwrap();
    client.create_session("secure blip").await.unwrap();
    let mut sub = counter_subscription(&client).await;
    let id = sub.id();
    let _ = counter_values(&mut sub, 2).await;

    // A secured channel proves who the client is: the same session (and
    // user) moves to the new channel - a new ClientSignature over the last
    // server nonce, the password encrypted again.
    relay.cut();
    let (how, values) = after_restore(&mut sub, 3).await;
    assert_eq!(how, Restore::Reactivated);
    assert!(!values.is_empty());
    assert_eq!(sub.id(), id);
    assert_eq!(client.channels_opened(), 2);
    let read = client.read_values(&[NodeId::ns0(2258)]).await.unwrap();
    assert!(matches!(read[0].value, Some(Variant::DateTime(_))));
    client.close().await;
    let _ = std::fs::remove_dir_all(pki);
}
