//! HAProxy in front of cluster nodes (`mode tcp`, `leastconn`, PROXY
//! protocol v2 to the nodes, the timeouts and retries of docs/cluster.md),
//! on 127.0.0.1 ports the test picks, killed when dropped; installed with
//! apt-get when missing (see [`super::nats::ensure_installed`]).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::nats;

/// A running HAProxy, killed on drop.
pub struct Haproxy {
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

/// HAProxy on `front` in front of `nodes` (OPC UA ports), a node in the
/// rotation while its port accepts connections.
pub fn haproxy(front: u16, nodes: &[u16]) -> Option<Haproxy> {
    haproxy_checking(front, nodes, None)
}

/// HAProxy in front of `nodes`; with `readyz` (each node's metrics port)
/// a node is in the rotation while its `/readyz` answers 200, else while
/// its OPC UA port accepts connections.
pub fn haproxy_checking(front: u16, nodes: &[u16], readyz: Option<&[u16]>) -> Option<Haproxy> {
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
    if readyz.is_some() {
        cfg.push_str("  option httpchk GET /readyz\n");
    }
    for (i, port) in nodes.iter().enumerate() {
        let check_port = readyz
            .and_then(|m| m.get(i))
            .map(|m| format!(" port {m}"))
            .unwrap_or_default();
        cfg.push_str(&format!(
            "  server n{i} 127.0.0.1:{port} send-proxy-v2 check{check_port} inter 300ms fall 1 rise 2\n"
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
