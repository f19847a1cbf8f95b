//! Shared by the chaos tests and the soak: a uascale server on its own
//! runtime (so that its tasks can be counted apart from the test's), a
//! node manager that logs every Write it applies, and the chaos relay.

#![allow(dead_code)]

pub mod chaos;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uascale_server::address_space::Node;
use uascale_server::node_manager::NodeManager;
use uascale_server::state::ServerState;
use uascale_server::{Server, ServerConfig};
use uascale_types::{NodeClass, NodeId, QualifiedName, StatusCode, Variant};

/// A server configuration for the chaos tests: 127.0.0.1 on a port the
/// kernel chooses, the unsecured endpoint, the demo values changing every
/// 50 ms.
pub fn config() -> ServerConfig {
    use uascale_server::config::{DemoSection, SecurityConfig, ServerSection};
    ServerConfig {
        server: ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            ..Default::default()
        },
        demo: DemoSection {
            rate: Duration::from_millis(50),
            ..Default::default()
        },
        security: SecurityConfig::none_only(),
        ..Default::default()
    }
}

/// A server running on a runtime (and thread) of its own; dropping it
/// shuts it down and waits for the thread.
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state (sessions, subscriptions, metrics).
    pub state: Arc<ServerState>,
    /// The log of the [`Ledger`] node, when installed.
    pub ledger: Arc<Ledger>,
    runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server with `config`; a [`Ledger`] is served as
    /// `ns=3;s=Ledger`.
    pub fn start(config: ServerConfig) -> TestServer {
        let ledger = Arc::new(Ledger::default());
        let l2 = Arc::clone(&ledger);
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("server runtime");
            rt.block_on(async move {
                let server = Server::bind_with(config, |space, managers| {
                    let mut var = Node::new(
                        NodeClass::Variable,
                        Ledger::node(),
                        QualifiedName::new(3, "Ledger"),
                    );
                    var.data_type = NodeId::ns0(7); // UInt32
                    var.access_level = 3;
                    space.insert(var);
                    managers.register(3, l2);
                })
                .expect("server binds");
                let addr = server.local_addr().expect("address");
                let state = Arc::clone(server.state());
                tx.send((addr, state, tokio::runtime::Handle::current()))
                    .expect("test waits");
                server
                    .run(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("server runs");
            });
        });
        let (addr, state, runtime) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server started");
        TestServer {
            addr,
            state,
            ledger,
            runtime,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Tasks alive on the server's runtime (its timers plus one per
    /// connection, plus whatever a request is running).
    pub fn alive_tasks(&self) -> usize {
        self.runtime.metrics().num_alive_tasks()
    }

    /// Sessions the server holds.
    pub fn sessions(&self) -> usize {
        self.state.sessions.len()
    }

    /// Channels open on the server.
    pub fn channels(&self) -> i64 {
        self.state.metrics.channels_open()
    }

    /// TCP connections open on the server.
    pub fn connections(&self) -> i64 {
        self.state.metrics.connections_open()
    }

    /// Subscriptions the server holds.
    pub fn subscriptions(&self) -> usize {
        self.state.subscriptions.subscription_count()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A variable (`ns=3;s=Ledger`, UInt32) that keeps every value written to
/// it, in order: a Write applied twice shows up twice.
#[derive(Default)]
pub struct Ledger {
    log: Mutex<Vec<u32>>,
}

impl Ledger {
    /// The node it serves.
    pub fn node() -> NodeId {
        NodeId::string(3, "Ledger")
    }

    /// Every value written so far, in the order applied.
    pub fn log(&self) -> Vec<u32> {
        self.log.lock().unwrap().clone()
    }
}

impl NodeManager for Ledger {
    fn namespace_uri(&self) -> &str {
        "urn:uascale:test:ledger"
    }

    fn read_value(&self, node: &NodeId) -> Option<Result<Variant, StatusCode>> {
        (*node == Self::node()).then(|| {
            Ok(Variant::UInt32(
                self.log.lock().unwrap().last().copied().unwrap_or(0),
            ))
        })
    }

    fn write_value(&self, node: &NodeId, value: Variant) -> Result<(), StatusCode> {
        match value {
            Variant::UInt32(v) if *node == Self::node() => {
                self.log.lock().unwrap().push(v);
                Ok(())
            }
            Variant::UInt32(_) => Err(StatusCode::BadNotWritable),
            _ => Err(StatusCode::BadTypeMismatch),
        }
    }

    fn call(
        &self,
        _object: &NodeId,
        _method: &NodeId,
        _inputs: &[Variant],
    ) -> Option<Result<Vec<Variant>, StatusCode>> {
        None
    }
}

/// Polls `f` every 20 ms until it holds, at most `limit` (a bound against
/// hangs, not a timing assertion); whether it held.
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
