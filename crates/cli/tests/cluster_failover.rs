//! Failover through a real cluster: three nats-servers in one JetStream
//! cluster (buckets replicated 3 times), three `uascale serve` nodes, and
//! HAProxy in front (`mode tcp`, `leastconn`, PROXY protocol v2 to the
//! nodes), all on 127.0.0.1 ports this test picks, all stopped at the end
//! (nats-server and haproxy are installed with apt-get when missing).
//!
//! Clients with sessions connect through the front end; one node is
//! killed with SIGKILL. Every client carries on: its library reconnects
//! through the front end and activates its session on a survivor, which
//! takes it over from the store - no client makes a new session (the
//! survivors' `created` counts do not move, their `restored` counts grow
//! by the sessions the dead node had), and the sessions already on the
//! survivors are untouched (none lost, closed or moved away).

mod common;
#[path = "../../server/tests/support/nats.rs"]
#[allow(dead_code)] // the single-server helpers are the server tests'
mod nats;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uascale_client::{Client, ClientOptions};
use uascale_types::NodeId;

const CLIENTS: usize = 24;
const LIMIT: Duration = Duration::from_secs(40);

/// A running HAProxy, killed on drop.
struct Haproxy {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn haproxy(front: u16, nodes: &[u16]) -> Option<Haproxy> {
    let bin = nats::ensure_installed("haproxy", "haproxy")?;
    let dir = std::env::temp_dir().join(format!("uascale-haproxy-{}-{front}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = format!(
        "global\n  maxconn 4096\n\
         defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n  \
         retries 3\n  option redispatch\n\
         frontend opcua\n  bind 127.0.0.1:{front}\n  default_backend nodes\n\
         backend nodes\n  balance leastconn\n"
    );
    for (i, port) in nodes.iter().enumerate() {
        cfg.push_str(&format!(
            "  server n{i} 127.0.0.1:{port} send-proxy-v2 check inter 300ms fall 1 rise 2\n"
        ));
    }
    let file = dir.join("haproxy.cfg");
    std::fs::write(&file, cfg).unwrap();
    let child = Command::new(bin)
        .arg("-f")
        .arg(&file)
        .arg("-db")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start haproxy");
    let h = Haproxy { child, dir };
    assert!(
        nats::wait_listening(([127, 0, 0, 1], front).into(), Duration::from_secs(10)),
        "haproxy did not listen"
    );
    Some(h)
}

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
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
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

#[test]
fn clients_of_a_killed_node_carry_on_through_the_others() {
    let Some(nats) = nats::start_cluster(3) else {
        return;
    };
    let url = format!("nats://{}", nats[0].addr);
    let front = common::free_port();
    let dir = std::env::temp_dir().join(format!("uascale-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("cluster.toml");
    std::fs::write(
        &config,
        "[cluster]\nheartbeat_ms = 200\nlease_ms = 1000\nreplicas = 3\n",
    )
    .unwrap();
    let metrics_ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut nodes: Vec<Option<common::Served>> = metrics_ports
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Some(common::serve([
                "--config",
                config.to_str().unwrap(),
                "--security",
                "none",
                "--cluster",
                &url,
                "--node-id",
                &format!("n{i}"),
                "--advertise",
                &format!("opc.tcp://127.0.0.1:{front}"),
                "--proxy-protocol",
                "--metrics",
                &format!("127.0.0.1:{m}"),
            ]))
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
    let time = NodeId::ns0(2258); // Server_ServerStatus_CurrentTime
    let clients: Vec<Client> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..CLIENTS {
            let c = Client::connect(&front_url, ClientOptions::default())
                .await
                .expect("connect through the front end");
            c.create_session(&format!("c{i}")).await.expect("a session");
            c.read_values(std::slice::from_ref(&time))
                .await
                .expect("a Read");
            v.push(c);
        }
        v
    });

    // Every session is on some node and mirrored.
    let start = Instant::now();
    let before = loop {
        let f: Vec<NodeFigures> = metrics_ports.iter().map(|p| figures(*p)).collect();
        let active: f64 = f.iter().map(|f| f.active).sum();
        if active == CLIENTS as f64 && f.iter().all(|f| f.pending == 0.0) {
            break f;
        }
        assert!(
            start.elapsed() < LIMIT,
            "sessions not all active and mirrored"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let victim = (0..3)
        .max_by(|a, b| before[*a].active.total_cmp(&before[*b].active))
        .unwrap();
    let on_victim = before[victim].active;
    assert!(on_victim > 0.0, "leastconn put sessions on every node");
    // Let the mirror's last writes settle on the replicas.
    std::thread::sleep(Duration::from_millis(300));

    // SIGKILL: nothing is flushed, nothing is closed politely.
    let mut dead = nodes[victim].take().unwrap();
    dead.child.kill().unwrap();
    let _ = dead.child.wait();

    // Every client reads again, on its own session.
    rt.block_on(async {
        for (i, c) in clients.iter().enumerate() {
            let deadline = Instant::now() + LIMIT;
            loop {
                match c.read_values(std::slice::from_ref(&time)).await {
                    Ok(v) if v.first().is_some_and(|d| d.value.is_some()) => break,
                    r => {
                        assert!(
                            Instant::now() < deadline,
                            "client {i} did not carry on: {r:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    });
    let after: Vec<(usize, NodeFigures)> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| (i, figures(metrics_ports[i])))
        .collect();
    let restored: f64 = after.iter().map(|(_, f)| f.restored).sum();
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
    let _ = std::fs::remove_dir_all(&dir);
}
