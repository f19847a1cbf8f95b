//! Failover through a real cluster: three nats-servers in one JetStream
//! cluster (buckets replicated 3 times), three `uascale serve` nodes, and
//! HAProxy in front (`mode tcp`, `leastconn`, PROXY protocol v2 to the
//! nodes), all on 127.0.0.1 ports this test picks, all stopped at the end
//! (nats-server and haproxy are installed with apt-get when missing).
//!
//! 300 clients (every tenth on Basic256Sha256 SignAndEncrypt, the rest on
//! None; the nodes share one application instance certificate) each hold
//! a session with a subscription, through the front end; the busiest node
//! is killed with SIGKILL. Every client carries on: its library
//! reconnects through the front end and activates its session on a
//! survivor, which takes it over from the store with its subscription -
//! no client makes a new session (the survivors' `created` counts do not
//! move, their `restored` counts grow by the sessions the dead node had),
//! no client sees a sequence number gap that Republish could not fill or a
//! number twice, every item's values go on, and the sessions already on
//! the survivors are untouched (none lost, closed or restored).
//!
//! The other tests here run one nats-server and two or three nodes behind
//! HAProxy: a drain, a rolling restart of every node, `uascale bench
//! failover` killing or draining a node, and Python asyncua's session
//! through a kill and a drain.

mod common;
#[path = "../../server/tests/support/haproxy.rs"]
mod haproxy;
#[path = "../../server/tests/support/nats.rs"]
#[allow(dead_code)] // killing and restarting the store is the server tests'
mod nats;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use uascale_client::{
    Client, ClientOptions, MonitorItem, Notification, Restore, SecurityOptions, ServerTrust,
    SubscriptionEvent, SubscriptionSettings,
};
use uascale_crypto::policy::SecurityPolicy;
use uascale_types::{MessageSecurityMode, NodeId};

use common::TempDir;
use haproxy::{haproxy, haproxy_checking, Haproxy};

const CLIENTS: usize = 300;
/// Every this-many-th client uses Basic256Sha256 SignAndEncrypt.
const SECURE_EVERY: usize = 10;
const LIMIT: Duration = Duration::from_secs(60);

/// The text of `/metrics` on `port`.
fn metrics(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    );
    // Read up to the length the head gives (the connection may stay open).
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|n| n.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                return body.to_owned();
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return text,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The value of the series named exactly `series` (0 when absent).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

struct NodeFigures {
    active: f64,
    created: f64,
    restored: f64,
    closed: f64,
    lost: f64,
    pending: f64,
}

fn figures(port: u16) -> NodeFigures {
    let m = metrics(port);
    let t = |name: &str| {
        value(
            &m,
            &format!("opcua_server_session_transitions_total{{transition=\"{name}\"}}"),
        )
    };
    NodeFigures {
        active: value(&m, "opcua_server_sessions{state=\"active\"}"),
        created: t("created"),
        restored: t("restored"),
        closed: t("closed") + t("timed_out"),
        lost: value(&m, "opcua_cluster_sessions_lost_total"),
        pending: value(&m, "opcua_cluster_pending_writes"),
    }
}

/// What a client's subscription reported, in order.
#[derive(Debug, Clone)]
enum Seen {
    /// A NotificationMessage: its number, when it arrived, the values its
    /// data changes carried (CurrentTime, as ticks), whether it came from
    /// a Republish.
    Message {
        seq: u32,
        at: Instant,
        values: Vec<i64>,
        republished: bool,
    },
    Lost,
    Restored(Restore),
    Ended,
}

impl Seen {
    /// When this arrived, if it is a message with a value (Republished or
    /// not).
    fn value_at(&self) -> Option<Instant> {
        match self {
            Seen::Message { at, values, .. } if !values.is_empty() => Some(*at),
            _ => None,
        }
    }

    /// A message with a value, not a Republish, that arrived after `t`.
    fn fresh_value_after(&self, t: Instant) -> bool {
        matches!(self, Seen::Message { at, values, republished: false, .. } if *at > t && !values.is_empty())
    }
}

/// One client's reports, filled by its subscription's task.
type Log = Arc<Mutex<Vec<Seen>>>;

/// `n` clients through `url`, each with its options (`options(i)`), a
/// session named `{prefix}{i}` and a subscription publishing every
/// `interval` with one item on CurrentTime (sampled every `sampling_ms`:
/// it changes with every sample), its reports going to its log; with the
/// session id each CreateSession answered.
fn subscribed_clients(
    rt: &tokio::runtime::Runtime,
    url: &str,
    n: usize,
    prefix: &str,
    interval: Duration,
    sampling_ms: f64,
    options: impl Fn(usize) -> ClientOptions,
) -> (Vec<Client>, Vec<Log>, Vec<(NodeId, u32)>) {
    let time = NodeId::ns0(2258); // Server_ServerStatus_CurrentTime
    let logs: Vec<Log> = (0..n).map(|_| Arc::default()).collect();
    let mut session_ids = Vec::new();
    let clients = rt.block_on(async {
        let mut v = Vec::new();
        for (i, log) in logs.iter().enumerate() {
            let c = Client::connect(url, options(i))
                .await
                .unwrap_or_else(|e| panic!("client {i} through the front end: {e}"));
            let created = c
                .create_session(&format!("{prefix}{i}"))
                .await
                .expect("a session");
            let mut sub = c
                .subscribe(SubscriptionSettings::with_interval(interval))
                .await
                .expect("a subscription");
            session_ids.push((created.session_id, sub.id()));
            sub.monitor(vec![MonitorItem::value(time.clone()).sampling(sampling_ms)])
                .await
                .expect("an item");
            let log = Arc::clone(log);
            tokio::spawn(async move {
                while let Some(e) = sub.recv().await {
                    let seen = match e {
                        SubscriptionEvent::Notifications {
                            sequence_number,
                            notifications,
                            republished,
                            ..
                        } => Seen::Message {
                            seq: sequence_number,
                            at: Instant::now(),
                            values: notifications
                                .iter()
                                .filter_map(|n| match n {
                                    Notification::DataChange { value, .. } => match &value.value {
                                        Some(uascale_types::Variant::DateTime(d)) => {
                                            Some(d.ticks())
                                        }
                                        _ => None,
                                    },
                                    _ => None,
                                })
                                .collect(),
                            republished,
                        },
                        SubscriptionEvent::Lost { .. } => Seen::Lost,
                        SubscriptionEvent::Restored(how) => Seen::Restored(how),
                        SubscriptionEvent::Ended(_) => Seen::Ended,
                        SubscriptionEvent::KeepAlive { .. } => continue,
                    };
                    log.lock().unwrap().push(seen);
                }
            });
            v.push(c);
        }
        v
    });
    (clients, logs, session_ids)
}

/// Waits (at most [`LIMIT`]) until the nodes on `metrics_ports` hold `n`
/// active sessions with no write pending (every session mirrored) and
/// every client's subscription has reported; their figures then.
fn all_active_and_reporting(metrics_ports: &[u16], logs: &[Log], n: usize) -> Vec<NodeFigures> {
    let start = Instant::now();
    loop {
        let f: Vec<NodeFigures> = metrics_ports.iter().map(|p| figures(*p)).collect();
        let active: f64 = f.iter().map(|f| f.active).sum();
        let silent: Vec<usize> = (0..logs.len())
            .filter(|i| {
                !logs[*i]
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|s| matches!(s, Seen::Message { .. }))
            })
            .collect();
        let pending: Vec<f64> = f.iter().map(|f| f.pending).collect();
        if active == n as f64 && silent.is_empty() && pending.iter().all(|p| *p == 0.0) {
            return f;
        }
        assert!(
            start.elapsed() < LIMIT,
            "sessions not all active, mirrored and reporting: {active} active, \
             silent: {silent:?}, pending writes {pending:?}; a node's metrics: {:?}",
            metrics(metrics_ports[0])
                .lines()
                .filter(|l| l.contains("sessions{") || l.contains("transitions"))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (at most [`LIMIT`]) until every client's subscription delivered
/// a value (not a Republish) after `t`.
fn values_go_on_after(logs: &[Log], t: Instant) {
    let start = Instant::now();
    loop {
        let waiting: Vec<usize> = (0..logs.len())
            .filter(|i| {
                !logs[*i]
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|s| s.fresh_value_after(t))
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "clients {waiting:?}: their values did not continue"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Checks client `i`'s log: no gap Republish could not fill, no
/// subscription ended, every restore its own session reactivated, the
/// sequence numbers without a gap and none twice. Returns how often its
/// session moved.
fn check_log(i: usize, log: &[Seen]) -> usize {
    assert!(
        !log.iter().any(|s| matches!(s, Seen::Lost | Seen::Ended)),
        "client {i}: a gap Republish could not fill, or the subscription ended: {log:?}"
    );
    let restored: Vec<&Restore> = log
        .iter()
        .filter_map(|s| match s {
            Seen::Restored(how) => Some(how),
            _ => None,
        })
        .collect();
    assert!(
        restored.iter().all(|how| **how == Restore::Reactivated),
        "client {i}: not its own session: {log:?}"
    );
    let mut seqs: Vec<u32> = log
        .iter()
        .filter_map(|s| match s {
            Seen::Message { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    let count = seqs.len();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(
        seqs.len(),
        count,
        "client {i}: a sequence number twice: {log:?}"
    );
    assert_eq!(
        seqs.last().copied().unwrap_or(0) - seqs.first().copied().unwrap_or(0) + 1,
        count as u32,
        "client {i}: a gap in the sequence numbers: {log:?}"
    );
    restored.len()
}

/// Checks that client `i`'s values, in the order of their sequence
/// numbers, each came once and newer than the one before (CurrentTime
/// changes with every sample: a value delivered twice, or an older one
/// after a newer, shows).
fn values_once_in_order(i: usize, log: &[Seen]) {
    let mut messages: Vec<(u32, &[i64])> = log
        .iter()
        .filter_map(|s| match s {
            Seen::Message { seq, values, .. } => Some((*seq, &values[..])),
            _ => None,
        })
        .collect();
    messages.sort_by_key(|(seq, _)| *seq);
    let values: Vec<i64> = messages
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "client {i}: a value twice or out of order: {messages:?}"
    );
}

fn client_identity() -> Arc<uascale_proto::security::Identity> {
    use uascale_crypto::x509::{create_self_signed, SelfSignedParams};
    let made = create_self_signed(&SelfSignedParams::new(
        "urn:uascale:test:failover",
        "failover",
        std::time::SystemTime::now() - Duration::from_secs(3600),
    ))
    .expect("a client certificate");
    let key = uascale_crypto::rsa::RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der)
        .expect("its key");
    Arc::new(uascale_proto::security::Identity::new(made.certificate, key).expect("an identity"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// The tests of this file one at a time (each starts a whole cluster).
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn clients_of_a_killed_node_carry_on_through_the_others() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(nats) = nats::start_cluster(3) else {
        return;
    };
    let url = format!("nats://{}", nats[0].addr);
    let front = common::free_port();
    let dir = TempDir::new("cluster");
    let dir = &dir.0;
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("cluster.toml");
    std::fs::write(
        &config,
        "[cluster]\nheartbeat_ms = 300\nlease_ms = 3000\nreplicas = 3\n\
         [security]\nallow_security_none = true\ntrust_all_client_certificates = true\n",
    )
    .unwrap();
    let pki = dir.join("pki");
    let metrics_ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    // One after the other: the first creates the shared certificate.
    let mut nodes: Vec<Option<common::Served>> = metrics_ports
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // The OPC UA port listens before the state (and the PKI) is
            // built; the metrics port after: the next node must find the
            // certificate this one created.
            let node = start_node(
                common::free_port(),
                *m,
                &[
                    "--config",
                    config.to_str().unwrap(),
                    "--host",
                    "127.0.0.1",
                    "--pki",
                    pki.to_str().unwrap(),
                    "--cluster",
                    &url,
                    "--node-id",
                    &format!("n{i}"),
                    "--node-index",
                    &(i + 1).to_string(),
                    "--advertise",
                    &format!("opc.tcp://127.0.0.1:{front}"),
                    "--proxy-protocol",
                    "--metrics",
                    &format!("127.0.0.1:{m}"),
                ],
            );
            Some(node)
        })
        .collect();
    let ports: Vec<u16> = nodes.iter().flatten().map(|n| n.port).collect();
    let Some(_haproxy) = haproxy(front, &ports) else {
        return;
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let front_url = format!("opc.tcp://127.0.0.1:{front}");
    let identity = client_identity();
    let setup = Instant::now();
    let (clients, logs, _) = subscribed_clients(
        &rt,
        &front_url,
        CLIENTS,
        "c",
        Duration::from_millis(1000),
        500.0,
        |i| {
            let mut options = ClientOptions {
                application_uri: "urn:uascale:test:failover".into(),
                ..ClientOptions::default()
            };
            if i % SECURE_EVERY == 0 {
                options.security = SecurityOptions {
                    policy: SecurityPolicy::Basic256Sha256,
                    mode: MessageSecurityMode::SignAndEncrypt,
                    certificate: Some(Arc::clone(&identity)),
                    server_certificate: None,
                    trust: ServerTrust::UnsafeAcceptAny,
                };
            }
            options
        },
    );

    eprintln!(
        "failover: {CLIENTS} clients set up in {:?}",
        setup.elapsed()
    );
    // Every session is on some node, mirrored, and its subscription
    // reports.
    let before = all_active_and_reporting(&metrics_ports, &logs, CLIENTS);
    let victim = (0..3)
        .max_by(|a, b| before[*a].active.total_cmp(&before[*b].active))
        .unwrap();
    let on_victim = before[victim].active;
    assert!(on_victim > 0.0, "leastconn put sessions on every node");

    // SIGKILL: nothing is flushed, nothing is closed politely.
    let mut dead = nodes[victim].take().unwrap();
    let killed = Instant::now();
    dead.child.kill().unwrap();
    let _ = dead.child.wait();

    // Every client's subscription reports again, with a value.
    values_go_on_after(&logs, killed);
    // Two more publishing intervals, for anything still in flight.
    std::thread::sleep(Duration::from_millis(2000));

    let mut resumed = Vec::new();
    let mut moved = 0usize;
    for (i, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap().clone();
        let moves = check_log(i, &log);
        assert!(moves <= 1, "client {i}: reactivated once: {log:?}");
        moved += moves;
        if let Some(at) = log
            .iter()
            .filter_map(Seen::value_at)
            .find(|at| *at > killed)
        {
            if moves == 1 {
                resumed.push(at - killed);
            }
        }
    }
    resumed.sort();
    eprintln!(
        "failover: {moved} sessions moved; time to the first value after the kill p50 {:?} p99 {:?} max {:?}",
        percentile(&resumed, 0.5),
        percentile(&resumed, 0.99),
        resumed.last().copied().unwrap_or_default()
    );
    assert_eq!(
        moved as f64, on_victim,
        "the dead node's clients, and only they, moved"
    );

    let after: Vec<(usize, NodeFigures)> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| (i, figures(metrics_ports[i])))
        .collect();
    let restored: f64 = after
        .iter()
        .map(|(i, f)| f.restored - before[*i].restored)
        .sum();
    assert_eq!(
        restored, on_victim,
        "the dead node's sessions were taken over, each once"
    );
    let active: f64 = after.iter().map(|(_, f)| f.active).sum();
    assert_eq!(active, CLIENTS as f64, "every session lives on a survivor");
    for (i, f) in &after {
        assert_eq!(
            f.created, before[*i].created,
            "node {i}: no new session was made"
        );
        assert_eq!(f.closed, 0.0, "node {i}: no session closed");
        assert_eq!(f.lost, 0.0, "node {i}: its own sessions stayed");
    }
    rt.block_on(async {
        for c in &clients {
            c.close().await;
        }
    });
    drop(nodes);
}

/// A small cluster for the tests below: one nats-server, `n` nodes (None
/// only), HAProxy in front; `None` when a package cannot be installed.
struct Small {
    _nats: nats::Nats,
    nodes: Vec<Option<common::Served>>,
    /// Each node's OPC UA port (where the front end sends its clients).
    ports: Vec<u16>,
    metrics: Vec<u16>,
    /// Each node's arguments after `serve --bind 127.0.0.1 --port P`.
    args: Vec<Vec<String>>,
    _haproxy: Haproxy,
    front: u16,
}

impl Small {
    /// Starts node `i` again with its arguments on its ports (once its
    /// predecessor exited).
    fn start_again(&mut self, i: usize) {
        self.nodes[i] = Some(start_node(self.ports[i], self.metrics[i], &self.args[i]));
    }
}

/// `uascale serve` with `args` on `port`, once its metrics port (on
/// `metrics`) listens: after its state, and its PKI, is built.
fn start_node<S: AsRef<std::ffi::OsStr>>(port: u16, metrics: u16, args: &[S]) -> common::Served {
    let node = common::serve_on(port, args);
    assert!(
        nats::wait_listening(([127, 0, 0, 1], metrics).into(), LIMIT),
        "the node on {port} did not start"
    );
    node
}

fn small_cluster(n: usize, prefix: &str) -> Option<Small> {
    small_cluster_with(n, prefix, &[], false)
}

/// [`small_cluster`] with `extra` arguments to every node, and HAProxy
/// checking each node's `/readyz` when `readyz`.
fn small_cluster_with(n: usize, prefix: &str, extra: &[&str], readyz: bool) -> Option<Small> {
    let nats = nats::start()?;
    let url = nats.url();
    let front = common::free_port();
    let metrics: Vec<u16> = (0..n).map(|_| common::free_port()).collect();
    let args: Vec<Vec<String>> = metrics
        .iter()
        .enumerate()
        .map(|(i, m)| {
            [
                "--security",
                "none",
                "--cluster",
                &url,
                "--node-id",
                &format!("{prefix}{i}"),
                "--node-index",
                &(i + 1).to_string(),
                "--advertise",
                &format!("opc.tcp://127.0.0.1:{front}"),
                "--proxy-protocol",
                "--metrics",
                &format!("127.0.0.1:{m}"),
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .map(str::to_owned)
            .collect()
        })
        .collect();
    let ports: Vec<u16> = (0..n).map(|_| common::free_port()).collect();
    // One after the other, each once it is up.
    let nodes: Vec<Option<common::Served>> = (0..n)
        .map(|i| Some(start_node(ports[i], metrics[i], &args[i])))
        .collect();
    let haproxy = haproxy_checking(front, &ports, readyz.then_some(&metrics[..]))?;
    Some(Small {
        _nats: nats,
        nodes,
        ports,
        metrics,
        args,
        _haproxy: haproxy,
        front,
    })
}

/// `uascale bench failover` against a small cluster, killing one node:
/// what it reports agrees with the survivor (sessions moved = sessions it
/// restored) and nothing was lost or duplicated.
#[test]
fn bench_failover_reports_what_the_cluster_did() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = small_cluster(2, "b") else {
        return;
    };
    let victim = c.nodes[0].as_ref().unwrap().child.id().to_string();
    let out = Command::new(common::BIN)
        .args([
            "bench",
            "failover",
            &format!("opc.tcp://127.0.0.1:{}", c.front),
            "--sessions",
            "8",
            "--interval-ms",
            "300",
            "--kill-pid",
            &victim,
            "--kill-after-s",
            "2",
            "--duration-s",
            "6",
            "--json",
        ])
        .output()
        .expect("run uascale bench failover");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The killed node is reaped by its Served on drop.
    let _ = c.nodes[0].take().map(|mut n| n.child.wait());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let survivor = figures(c.metrics[1]);
    assert_eq!(report["sessions"], 8);
    assert_eq!(
        report["moved"].as_f64(),
        Some(survivor.restored),
        "{report}"
    );
    assert!(
        survivor.restored >= 1.0,
        "leastconn put sessions on both nodes: {report}"
    );
    assert_eq!(report["moved_not_resumed"], 0, "{report}");
    assert_eq!(report["lost"], 0, "{report}");
    assert_eq!(report["duplicates"], 0, "{report}");
    assert_eq!(report["ended"], 0, "{report}");
    assert!(
        report["resume_ms"]["max"].as_f64().unwrap_or(0.0) > 0.0,
        "{report}"
    );
}

/// The repository's root and the Python of its `target/venv` (which
/// `cargo xtask ci` makes); panics when the venv is missing.
fn venv_python() -> (std::path::PathBuf, std::path::PathBuf) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask ci` first",
        python.display()
    );
    (root, python)
}

/// tests/interop/cluster_asyncua.py through the front end: asyncua's
/// session made and read (`READY`); [`AsyncuaScript::carry_on`] then has
/// it activate the same session on a new channel and read again.
struct AsyncuaScript {
    child: Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl AsyncuaScript {
    fn start(front: u16) -> Self {
        use std::io::BufRead;
        let (root, python) = venv_python();
        let mut child = Command::new(&python)
            .arg(root.join("tests/interop/cluster_asyncua.py"))
            .arg(format!("opc.tcp://127.0.0.1:{front}"))
            .current_dir(root.join("tests/interop"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the asyncua script");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(line, "READY", "the script's first session");
        Self { child, lines }
    }

    /// Reactivates the session through the front end; panics unless the
    /// script read on it and ended well.
    fn carry_on(mut self) {
        writeln!(self.child.stdin.as_mut().unwrap()).unwrap();
        let line = self.lines.next().and_then(Result::ok).unwrap_or_default();
        let status = self.child.wait().unwrap();
        assert_eq!(line, "OK", "the script did not carry on ({status})");
        assert!(status.success(), "{status}");
    }
}

/// Of two nodes, the one whose metrics show the one session active and
/// mirrored, and the other: (victim, survivor).
fn node_with_the_session(metrics_ports: &[u16]) -> (usize, usize) {
    let start = Instant::now();
    loop {
        let f: Vec<NodeFigures> = metrics_ports.iter().map(|p| figures(*p)).collect();
        if let Some(v) = (0..2).find(|i| f[*i].active == 1.0 && f[*i].pending == 0.0) {
            return (v, 1 - v);
        }
        assert!(
            start.elapsed() < LIMIT,
            "the session is not active and mirrored"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Python asyncua through the front end: its session, made through
/// HAProxy, is activated again through HAProxy on a new channel after its
/// node was killed (tests/interop/cluster_asyncua.py drives asyncua's own
/// steps with the old token: asyncua 2.1 itself would make a new session).
#[test]
fn python_asyncua_reactivates_its_session_after_its_node_died() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = small_cluster(2, "p") else {
        return;
    };
    let script = AsyncuaScript::start(c.front);
    let (victim, survivor) = node_with_the_session(&c.metrics);
    let created_before = figures(c.metrics[survivor]).created;
    let mut dead = c.nodes[victim].take().unwrap();
    dead.child.kill().unwrap();
    let _ = dead.child.wait();
    // HAProxy sends the next connection to the survivor once its check
    // fails (or redispatches after a refused connect).
    std::thread::sleep(Duration::from_millis(700));
    script.carry_on();
    let f = figures(c.metrics[survivor]);
    assert_eq!(f.restored, 1.0, "the survivor took the session over");
    assert_eq!(f.created, created_before, "no new session was made");
}

/// `n` nodes whose planned shutdown waits `delay_s` (heartbeats every
/// 300 ms), HAProxy checking their `/readyz`; with the directory of their
/// configuration file, kept while they run.
fn draining_cluster(n: usize, prefix: &str, delay_s: u32) -> Option<(TempDir, Small)> {
    let dir = TempDir::new(prefix);
    let config = dir.join("drain.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nshutdown_delay_s = {delay_s}\n[cluster]\nheartbeat_ms = 300\nlease_ms = 3000\n"
        ),
    )
    .unwrap();
    let c = small_cluster_with(n, prefix, &["--config", config.to_str().unwrap()], true)?;
    Some((dir, c))
}

/// Waits (at most [`LIMIT`]) for a drained node to exit by itself; panics
/// unless it exits 0.
fn exits_cleanly(node: &mut common::Served) {
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = node.child.try_wait() {
            break s;
        }
        assert!(start.elapsed() < LIMIT, "the drained node did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the drained node: {status}");
}

/// Python asyncua through a drain: its node gets SIGTERM (HAProxy checking
/// `/readyz`), writes the session's final record, closes the channel and
/// exits; asyncua, on a new channel through HAProxy, activates the same
/// session on the survivor (tests/interop/cluster_asyncua.py, as for the
/// kill): no new session, no busy answer from the survivor.
#[test]
fn python_asyncua_keeps_its_session_through_a_drain() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_dir, mut c)) = draining_cluster(2, "pd", 1) else {
        return;
    };
    let script = AsyncuaScript::start(c.front);
    let (victim, survivor) = node_with_the_session(&c.metrics);
    let created_before = figures(c.metrics[survivor]).created;
    let busy_before = busy_answers(c.metrics[survivor]);
    let mut drained = c.nodes[victim].take().unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &drained.pid()])
        .status();
    exits_cleanly(&mut drained);
    script.carry_on();
    let f = figures(c.metrics[survivor]);
    assert_eq!(f.restored, 1.0, "the survivor took the session over");
    assert_eq!(f.created, created_before, "no new session was made");
    assert_eq!(busy_answers(c.metrics[survivor]), busy_before);
}

/// The node serving each client (CurrentServerId, per session).
fn serving(rt: &tokio::runtime::Runtime, clients: &[Client]) -> Vec<String> {
    rt.block_on(async {
        let mut v = Vec::new();
        for c in clients {
            let d = c.read_values(&[NodeId::ns0(11312)]).await.expect("a Read");
            let id = match d.first().and_then(|d| d.value.clone()) {
                Some(uascale_types::Variant::String(s)) => s.as_str_or_empty().to_owned(),
                other => panic!("CurrentServerId {other:?}"),
            };
            v.push(id);
        }
        v
    })
}

/// The status code of `GET /readyz` on `port` (0 when nothing answers).
fn readyz(port: u16) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0)
}

/// Busy answers a node sent, all stages together.
fn busy_answers(port: u16) -> f64 {
    metrics(port)
        .lines()
        .filter(|l| l.starts_with("opcua_server_busy_answers_total{"))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// A draining node, through the front end: SIGTERM on the busiest of two
/// nodes, HAProxy checking `/readyz`. Its `/readyz` answers 503 and the
/// survivor's RedundantServerArray shows it shutting down; its channels
/// close only after its final records are in the store, and every one of
/// its clients activates its own session on the survivor (CurrentServerId
/// now the survivor): no new session, no sequence number missing or seen
/// twice, values going on, no busy answer from the survivor; the drained
/// node exits cleanly.
#[test]
fn clients_of_a_draining_node_move_without_a_gap() {
    const N: usize = 20;
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_dir, mut c)) = draining_cluster(2, "d", 2) else {
        return;
    };
    let front_url = format!("opc.tcp://127.0.0.1:{}", c.front);
    let metrics_ports = c.metrics.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (clients, logs, _) = subscribed_clients(
        &rt,
        &front_url,
        N,
        "d",
        Duration::from_millis(300),
        100.0,
        |_| ClientOptions::default(),
    );
    // Every session active, mirrored and reporting.
    let before = all_active_and_reporting(&metrics_ports, &logs, N);
    let victim = if before[0].active >= before[1].active {
        0
    } else {
        1
    };
    let survivor = 1 - victim;
    let on_victim = before[victim].active;
    assert!(on_victim > 0.0, "leastconn put sessions on both nodes");
    let ids = serving(&rt, &clients);
    let victim_id = format!("d{victim}");
    assert_eq!(
        ids.iter().filter(|id| **id == victim_id).count() as f64,
        on_victim,
        "CurrentServerId names the serving node: {ids:?}"
    );
    let busy_before = busy_answers(metrics_ports[survivor]);
    let watcher = ids
        .iter()
        .position(|id| *id != victim_id)
        .expect("a client on the survivor");

    // SIGTERM: the drain.
    let mut drained = c.nodes[victim].take().unwrap();
    let term = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &drained.pid()])
        .status();
    let start = Instant::now();
    while readyz(metrics_ports[victim]) != 503 {
        assert!(start.elapsed() < LIMIT, "/readyz of the draining node");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(readyz(metrics_ports[survivor]), 200);
    // The survivor's clients see the drained node's entry shut down.
    let start = Instant::now();
    loop {
        let members = rt.block_on(clients[watcher].read_values(&[NodeId::ns0(11313)]));
        let entries: Vec<(String, u8, i32)> = match members
            .ok()
            .and_then(|d| d.first().and_then(|d| d.value.clone()))
        {
            Some(uascale_types::Variant::Array(a)) => match a.values() {
                uascale_types::ArrayValues::ExtensionObject(rows) => rows
                    .iter()
                    .filter_map(|e| e.downcast_ref::<uascale_types::RedundantServerDataType>())
                    .map(|r| {
                        (
                            r.server_id.as_str_or_empty().to_owned(),
                            r.service_level,
                            r.server_state.0,
                        )
                    })
                    .collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        if entries.contains(&(victim_id.clone(), 0, 4)) {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "RedundantServerArray never showed {victim_id} shutting down: {entries:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The drained node ends by itself.
    exits_cleanly(&mut drained);
    // Every client's values go on.
    values_go_on_after(&logs, term + Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(1000));
    let mut moved = 0usize;
    for (i, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap().clone();
        let moves = check_log(i, &log);
        assert!(moves <= 1, "client {i}: reactivated once: {log:?}");
        moved += moves;
        values_once_in_order(i, &log);
    }
    assert_eq!(
        moved as f64, on_victim,
        "the drained node's clients, and only they, moved"
    );
    let after = figures(metrics_ports[survivor]);
    assert_eq!(
        after.created, before[survivor].created,
        "no new session was made"
    );
    assert_eq!(
        after.restored - before[survivor].restored,
        on_victim,
        "the drained node's sessions were taken over, each once"
    );
    assert_eq!(
        after.active, N as f64,
        "every session lives on the survivor"
    );
    assert_eq!(
        busy_answers(metrics_ports[survivor]),
        busy_before,
        "no busy answer from the survivor"
    );
    let survivor_id = format!("d{survivor}");
    assert!(
        serving(&rt, &clients).iter().all(|id| *id == survivor_id),
        "CurrentServerId follows the session"
    );
    rt.block_on(async {
        for c in &clients {
            c.close().await;
        }
    });
}

/// A rolling restart of every node, the way docs/cluster.md tells a user
/// to run one: three nodes on one nats-server, HAProxy checking their
/// `/readyz`, and 20 uascale clients through HAProxy with a subscription
/// each, publishing every 300 ms all along. Each node in turn gets
/// SIGTERM, drains and exits 0; a new process with the same node id,
/// index, ports and configuration takes its place, and the next node waits
/// until the new one's `/readyz` answers 200. The new process is the same
/// binary: it stands in for a rebuilt one, since what the roll needs of it
/// is a new process reading the records the old ones wrote and taking
/// sessions over in the next move. Each move takes over exactly the
/// drained node's sessions, on the other two, with no busy answer from
/// them; at the end every session has the session id its CreateSession
/// gave it (its node's SessionDiagnosticsArray), no node made a session
/// after the setup and no client one (each restore `Reactivated`), no
/// sequence number is missing or there twice, and every value came once
/// and in order; and a subscription each client makes after the roll
/// has an id no earlier subscription carries.
#[test]
fn a_rolling_restart_of_every_node_recreates_no_session() {
    const N: usize = 20;
    const NODES: usize = 3;
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_dir, mut c)) = draining_cluster(NODES, "roll", 1) else {
        return;
    };
    let front_url = format!("opc.tcp://127.0.0.1:{}", c.front);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (clients, logs, made) = subscribed_clients(
        &rt,
        &front_url,
        N,
        "r",
        Duration::from_millis(300),
        100.0,
        |_| ClientOptions::default(),
    );
    let restores = |logs: &[Log]| -> usize {
        logs.iter()
            .map(|l| {
                l.lock()
                    .unwrap()
                    .iter()
                    .filter(|s| matches!(s, Seen::Restored(_)))
                    .count()
            })
            .sum()
    };
    // The sessions each node's process made: a new process starts at 0
    // and must stay there.
    let mut created: Vec<f64> = all_active_and_reporting(&c.metrics, &logs, N)
        .iter()
        .map(|f| f.created)
        .collect();
    assert_eq!(created.iter().sum::<f64>(), N as f64);
    let mut moved = 0usize;
    for k in 0..NODES {
        let before = all_active_and_reporting(&c.metrics, &logs, N);
        for (i, f) in before.iter().enumerate() {
            assert_eq!(f.created, created[i], "move {k}: node {i} made a session");
        }
        let on_node = before[k].active;
        assert!(on_node > 0.0, "move {k}: node {k} serves no session");
        let survivors: Vec<usize> = (0..NODES).filter(|i| *i != k).collect();
        let survivor_ports: Vec<u16> = survivors.iter().map(|i| c.metrics[*i]).collect();
        let busy_before: Vec<f64> = survivor_ports.iter().map(|p| busy_answers(*p)).collect();
        let restores_before = restores(&logs);

        // SIGTERM: out of the balancer at once, then the drain.
        let mut old = c.nodes[k].take().unwrap();
        let _ = Command::new("kill").args(["-TERM", &old.pid()]).status();
        let start = Instant::now();
        while readyz(c.metrics[k]) != 503 {
            assert!(
                start.elapsed() < LIMIT,
                "move {k}: /readyz of the draining node"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        exits_cleanly(&mut old);
        let exited = Instant::now();
        drop(old);

        // Every client's values go on, the drained node's on the others.
        values_go_on_after(&logs, exited);
        let after = all_active_and_reporting(&survivor_ports, &logs, N);
        let restored: f64 = survivors
            .iter()
            .zip(&after)
            .map(|(i, f)| f.restored - before[*i].restored)
            .sum();
        assert_eq!(
            restored, on_node,
            "move {k}: the drained node's sessions were taken over, each once"
        );
        assert_eq!(
            (restores(&logs) - restores_before) as f64,
            on_node,
            "move {k}: the drained node's clients, and only they, moved"
        );
        moved += on_node as usize;
        for (p, busy) in survivor_ports.iter().zip(&busy_before) {
            assert_eq!(
                busy_answers(*p),
                *busy,
                "move {k}: a busy answer from a survivor"
            );
        }

        // The new process in the old one's place, ready before the next.
        c.start_again(k);
        created[k] = 0.0;
        let start = Instant::now();
        while readyz(c.metrics[k]) != 200 {
            assert!(
                start.elapsed() < LIMIT,
                "move {k}: the new node is not ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // One more second, for anything in flight (and for the diagnostics
    // arrays, built at most once a second).
    std::thread::sleep(Duration::from_millis(1000));
    let mut moves = 0usize;
    for (i, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap().clone();
        moves += check_log(i, &log);
        values_once_in_order(i, &log);
    }
    assert_eq!(moves, moved, "each move is one restore of its client");
    let end = all_active_and_reporting(&c.metrics, &logs, N);
    assert!(
        end.iter().all(|f| f.created == 0.0),
        "a node made a session after the roll"
    );
    // Each client's session, as its node lists it, is the one it made.
    let start = Instant::now();
    for (i, client) in clients.iter().enumerate() {
        let name = format!("r{i}");
        let id = loop {
            let rows = rt
                .block_on(client.read_values(&[NodeId::ns0(3707)]))
                .expect("a Read of the SessionDiagnosticsArray");
            let id = match rows.first().and_then(|d| d.value.clone()) {
                Some(uascale_types::Variant::Array(a)) => match a.values() {
                    uascale_types::ArrayValues::ExtensionObject(rows) => rows
                        .iter()
                        .filter_map(|e| {
                            e.downcast_ref::<uascale_types::SessionDiagnosticsDataType>()
                        })
                        .find(|r| r.session_name.as_str_or_empty() == name)
                        .map(|r| r.session_id.clone()),
                    _ => None,
                },
                _ => None,
            };
            if let Some(id) = id {
                break id;
            }
            // The array may be a second old: the session moved since.
            assert!(
                start.elapsed() < LIMIT,
                "client {i}: its session is not listed"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(id, made[i].0, "client {i}: its session id changed");
    }
    // New subscriptions after the roll, made by the new processes (and
    // the sessions are spread over all three): no id is one that a
    // subscription made before the roll still carries.
    let mut ids: Vec<u32> = made.iter().map(|(_, id)| *id).collect();
    rt.block_on(async {
        for c in &clients {
            let sub = c
                .subscribe(SubscriptionSettings::with_interval(Duration::from_secs(1)))
                .await
                .expect("a subscription after the roll");
            ids.push(sub.id());
        }
    });
    let distinct: std::collections::HashSet<u32> = ids.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "a subscription id made twice: {ids:x?}"
    );
    eprintln!("rolling restart: {moved} sessions moved in {NODES} drains, none recreated");
    rt.block_on(async {
        for c in &clients {
            c.close().await;
        }
    });
}

/// `uascale bench failover --drain` against a small cluster whose front
/// end checks `/readyz`: the node gets SIGTERM and drains; the bench's
/// report agrees with the survivor, and nothing was lost, duplicated or
/// recreated.
#[test]
fn bench_failover_drain_reports_what_the_cluster_did() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("bench-drain");
    let config = dir.join("drain.toml");
    std::fs::write(&config, "[server]\nshutdown_delay_s = 1\n").unwrap();
    let Some(mut c) = small_cluster_with(2, "e", &["--config", config.to_str().unwrap()], true)
    else {
        return;
    };
    let victim = c.nodes[0].as_ref().unwrap().pid();
    let out = Command::new(common::BIN)
        .args([
            "bench",
            "failover",
            &format!("opc.tcp://127.0.0.1:{}", c.front),
            "--sessions",
            "8",
            "--interval-ms",
            "300",
            "--kill-pid",
            &victim,
            "--drain",
            "--kill-after-s",
            "2",
            "--duration-s",
            "6",
            "--json",
        ])
        .output()
        .expect("run uascale bench failover --drain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = c.nodes[0].take().map(|mut n| n.child.wait());
    assert!(
        status.is_some_and(|s| s.is_ok_and(|s| s.success())),
        "the drained node exits cleanly"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let survivor = figures(c.metrics[1]);
    assert_eq!(report["drain"], true, "{report}");
    assert_eq!(
        report["moved"].as_f64(),
        Some(survivor.restored),
        "{report}"
    );
    assert!(survivor.restored >= 1.0, "{report}");
    for zero in [
        "moved_not_resumed",
        "lost",
        "duplicates",
        "ended",
        "recreated",
    ] {
        assert_eq!(report[zero], 0, "{zero}: {report}");
    }
    assert!(
        report["gap_ms"]["max"].as_f64().unwrap_or(0.0) > 0.0,
        "{report}"
    );
}

/// Python asyncua reads the redundancy surface through the front end
/// (tests/interop/cluster_redundancy_asyncua.py): a
/// TransparentRedundancyType, RedundancySupport Transparent, its session's
/// CurrentServerId one of the nodes, RedundantServerArray both nodes,
/// Running and Healthy.
#[test]
fn python_asyncua_reads_the_redundancy_surface() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (root, python) = venv_python();
    let Some(c) = small_cluster(2, "r") else {
        return;
    };
    let out = Command::new(&python)
        .arg(root.join("tests/interop/cluster_redundancy_asyncua.py"))
        .arg(format!("opc.tcp://127.0.0.1:{}", c.front))
        .args(["r0", "r1"])
        .current_dir(root.join("tests/interop"))
        .output()
        .expect("run the asyncua script");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let current = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(current == "r0" || current == "r1", "{current}");
}
