//! The tokio shell around the sans-IO parts: the opc.tcp listener, one
//! task per connection (socket I/O and timers, [`connection`]), the
//! request workers and the other timers, the crypto threads, the metrics
//! endpoint. It decides nothing: what a connection or a request becomes is
//! the [`crate::endpoint`]'s.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use crate::config::ServerConfig;
use crate::endpoint::Endpoint;
use crate::state::ServerState;
use connection::{refuse, serve, Shell};

mod connection;
mod crypto;
#[cfg(feature = "https")]
mod https;
mod metrics_http;
mod planned;
pub mod proxy;
mod timers;
mod workers;

/// A bound, not yet running server.
pub struct Server {
    shell: Arc<Shell>,
    listener: TcpListener,
    /// The metrics endpoint's listener (`[metrics] listen`).
    metrics: Option<TcpListener>,
    /// The opc.https listener (`[https] listen`).
    #[cfg(feature = "https")]
    https: Option<https::Bound>,
}

/// Binds `[https] listen`, if set (see `https::bind`); a build without
/// the `https` feature refuses to start with it rather than serve
/// without.
fn bind_https(config: &ServerConfig) -> io::Result<Option<(TcpListener, SocketAddr)>> {
    #[cfg(feature = "https")]
    {
        https::bind(config.https.listen, config.limits.listen_backlog)
    }
    #[cfg(not(feature = "https"))]
    match config.https.listen {
        Some(addr) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("https.listen = {addr}: this build has no TLS (uascale-server's `https` feature is off)"),
        )),
        None => Ok(None),
    }
}

impl Server {
    /// Binds the listener with the configured backlog and builds the
    /// server's state ([`ServerState::new`]: namespace 0, the demo
    /// namespace, NodeSets, PKI) with the port actually bound.
    pub fn bind(config: ServerConfig) -> io::Result<Self> {
        Self::bind_with(config, |_, _| {})
    }

    /// Like [`Server::bind`], then lets `setup` add nodes and register node
    /// managers for further namespaces (index 3 and up; 2 is the demo's).
    pub fn bind_with(
        mut config: ServerConfig,
        setup: impl FnOnce(
            &mut crate::address_space::AddressSpace,
            &mut crate::node_manager::NodeManagers,
        ),
    ) -> io::Result<Self> {
        config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let listener = listen(config.server.socket_addr(), config.limits.listen_backlog)?;
        // With port 0 the kernel chose: publish the port actually bound.
        config.server.port = listener.local_addr()?.port();
        let https = bind_https(&config)?;
        if let Some((_, addr)) = &https {
            config.https.listen = Some(*addr);
        }
        let state = ServerState::with_setup(config, setup)?;
        Self::serve_state(state, listener, https.map(|(l, _)| l))
    }

    /// Serves an already built state on its configured address (whose
    /// port must be the one to publish: not 0).
    pub fn bind_state(state: Arc<ServerState>) -> io::Result<Self> {
        let listener = listen(
            state.config.server.socket_addr(),
            state.config.limits.listen_backlog,
        )?;
        let https = bind_https(&state.config)?;
        Self::serve_state(state, listener, https.map(|(l, _)| l))
    }

    fn serve_state(
        state: Arc<ServerState>,
        listener: TcpListener,
        https_listener: Option<TcpListener>,
    ) -> io::Result<Self> {
        #[cfg(feature = "https")]
        let https = match https_listener {
            Some(l) => Some(https::prepare(l, &state)?),
            None => None,
        };
        #[cfg(not(feature = "https"))]
        drop(https_listener);
        // The metrics endpoint is bound now, so a bad address fails the
        // start and port 0 is known before `run`.
        let metrics = match state.config.metrics.listen {
            Some(addr) => Some(listen(addr, METRICS_BACKLOG)?),
            None => None,
        };
        let threads = state.config.runtime.crypto_threads;
        // In place, as many jobs at once as there are workers to run them.
        let workers = state
            .config
            .runtime
            .worker_threads
            .unwrap_or_else(crate::admission::host::usable_cpus);
        let crypto = crypto::HandshakeCrypto::start(threads, workers, "uascale-crypto")?;
        let endpoint = Endpoint::new(state, crate::admission::host::OpenFiles::current().soft);
        Ok(Server {
            shell: Arc::new(Shell { endpoint, crypto }),
            listener,
            metrics,
            #[cfg(feature = "https")]
            https,
        })
    }

    /// The server's state.
    pub fn state(&self) -> &Arc<ServerState> {
        self.shell.endpoint.state()
    }

    /// The endpoint URL clients use (with the port actually bound).
    pub fn endpoint_url(&self) -> String {
        self.shell.endpoint.state().endpoint_url()
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The address the metrics endpoint is bound to (`None` without
    /// `[metrics] listen`; with port 0, the port the kernel chose).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The address the opc.https listener is bound to (`None` without
    /// `[https] listen`; with port 0, the port the kernel chose).
    pub fn https_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "https")]
        {
            self.https.as_ref().and_then(|b| b.local_addr().ok())
        }
        #[cfg(not(feature = "https"))]
        None
    }

    /// With `[cluster] url`: connects to the NATS store (failing the start
    /// when it does not answer) unless a store was joined already
    /// ([`ServerState::join_cluster`]), and runs the node's tasks.
    /// Without it: nothing.
    async fn start_cluster(&self) -> io::Result<Option<tokio::task::JoinHandle<()>>> {
        let state = self.shell.endpoint.state();
        let node = match (state.cluster(), &state.config.cluster.url) {
            (Some(node), _) => Arc::clone(node),
            #[cfg(feature = "nats")]
            (None, Some(url)) => {
                // A NATS cluster that is starting has no JetStream leader
                // for a few seconds: try for a while before giving up.
                let deadline = Instant::now() + CLUSTER_CONNECT_LIMIT;
                let store = loop {
                    match crate::cluster::nats::NatsStore::connect(
                        url,
                        state.config.cluster.replicas,
                        crate::cluster::nats::OPERATION_TIMEOUT,
                    )
                    .await
                    {
                        Ok(s) => break s,
                        Err(e) if Instant::now() >= deadline => {
                            return Err(io::Error::other(format!("cluster store {url}: {e}")));
                        }
                        Err(e) => {
                            tracing::info!(%url, error = %e, "cluster store not ready; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                };
                state.join_cluster(Arc::new(store))
            }
            #[cfg(not(feature = "nats"))]
            (None, Some(url)) => {
                return Err(io::Error::other(format!(
                    "cluster.url = {url}: this build has no NATS client \
                     (uascale-server's `nats` feature is off)"
                )));
            }
            (None, None) => return Ok(None),
        };
        tracing::info!(node = node.node_id(), "cluster node running");
        Ok(Some(tokio::spawn(node.run())))
    }

    /// Serves until `shutdown` completes or a planned shutdown is due
    /// ([`crate::shutdown`]), then closes every connection with
    /// `BadShutdown` and waits (at most 5 s) for them to flush. The metrics
    /// endpoint, when configured, serves from the start until the
    /// connections are gone (`/readyz` answers 503 from shutdown on).
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> io::Result<()> {
        let cluster = self.start_cluster().await?;
        let metrics = self.metrics.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(url = %format!("http://{addr}/metrics"), "metrics endpoint listening");
            }
            tokio::spawn(metrics_http::serve(
                listener,
                Arc::clone(self.shell.endpoint.state()),
            ))
        });
        #[cfg(feature = "https")]
        let https = self.https.map(|bound| {
            if let Ok(addr) = bound.local_addr() {
                tracing::info!(url = %format!("opc.https://{addr}/"), "opc.https listening");
            }
            tokio::spawn(https::serve(bound, Arc::clone(&self.shell.endpoint)))
        });
        let state = Arc::clone(self.shell.endpoint.state());
        state.set_listening(true);
        workers::start(&state.scheduler);
        let reaper = tokio::spawn(reap_sessions(Arc::clone(self.shell.endpoint.state())));
        let ticker = tokio::spawn(tick_demo(Arc::clone(self.shell.endpoint.state())));
        let publisher = tokio::spawn(timers::run_subscriptions(Arc::clone(
            self.shell.endpoint.state(),
        )));
        // A planned shutdown ends the loop too, once it is due.
        let shutdown = planned::stop_or_due(Arc::clone(&state), shutdown);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) if state.config.cluster.proxy_protocol => {
                        // Behind a balancer: the client's address is in the
                        // PROXY header, read first (bounded by the
                        // handshake timeout), and admission judges it.
                        tokio::spawn(accept_proxied(stream, peer, Arc::clone(&self.shell)));
                    }
                    Ok((stream, peer)) => start(stream, peer, &self.shell),
                    Err(e) if is_resource_exhaustion(&e) => {
                        // EMFILE and friends: shed by not accepting for a moment
                        // instead of spinning on an accept that keeps failing.
                        state.metrics.accept_paused();
                        tracing::warn!(error = %e, "accept failed; pausing 100 ms");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "accept failed"),
                },
            }
        }
        self.shell.endpoint.state().set_listening(false);
        // New connections are refused from here on (the front end sends
        // them elsewhere) rather than left in the backlog.
        drop(self.listener);
        // A cluster node draining: nothing more is published, the final
        // records reach the store, then the channels close paced.
        publisher.abort();
        planned::drain(&self.shell.endpoint).await;
        if let Some(task) = cluster {
            task.abort();
        }
        reaper.abort();
        ticker.abort();
        publisher.abort();
        self.shell.endpoint.stop_all();
        // Each task deregisters when it has flushed and closed; what is
        // left after 5 s is dropped with the runtime.
        let drain = async {
            while self.shell.endpoint.connection_count() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .is_err()
        {
            tracing::warn!(
                left = self.shell.endpoint.connection_count(),
                "connections still open 5 s after shutdown began"
            );
        }
        #[cfg(feature = "https")]
        if let Some(task) = https {
            task.abort();
        }
        state.scheduler.stop();
        if let Some(task) = metrics {
            task.abort();
            // Its listener is closed once the task is gone.
            let _ = task.await;
        }
        Ok(())
    }
}

/// A connection whose first bytes are a PROXY protocol v2 header: reads
/// it (within the handshake timeout), then admits and serves the
/// connection as coming from the address inside. A connection without a
/// valid header is closed.
async fn accept_proxied(mut stream: TcpStream, peer: SocketAddr, shell: Arc<Shell>) {
    let limit = shell.endpoint.state().config.limits.handshake_timeout;
    let header = match tokio::time::timeout(limit, proxy::read(&mut stream)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "PROXY protocol header refused; closed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "no PROXY protocol header in time; closed");
            return;
        }
    };
    start(stream, header.source().unwrap_or(peer), &shell);
}

/// Admission decides on a new connection before any work: refused, the
/// ERR and a close; admitted, its task.
fn start(stream: TcpStream, peer: SocketAddr, shell: &Arc<Shell>) {
    let local = stream.local_addr().ok().map(|a| a.ip());
    match shell.endpoint.accept(peer, local, Instant::now()) {
        Ok(channel) => {
            tokio::spawn(serve(stream, peer, channel, Arc::clone(shell)));
        }
        Err(shed) => {
            tokio::spawn(refuse(stream, Endpoint::refusal(&shed)));
        }
    }
}

/// How long a starting cluster node tries to reach its store.
#[cfg(feature = "nats")]
const CLUSTER_CONNECT_LIMIT: Duration = Duration::from_secs(30);

/// Pending connections the metrics endpoint's listener keeps.
const METRICS_BACKLOG: u32 = 64;

/// A listening socket on `addr` with `backlog` pending accepts.
fn listen(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    TcpListener::from_std(socket.into())
}

/// Closes sessions past their timeout or activation deadline. It sleeps
/// until the earliest deadline (at most 1 s, so new sessions are seen),
/// and logs what each pass closed in one line.
async fn reap_sessions(state: Arc<ServerState>) {
    loop {
        let now = Instant::now();
        let next = state
            .sessions
            .next_deadline()
            .unwrap_or(now + Duration::from_secs(1));
        tokio::time::sleep_until(next.min(now + Duration::from_secs(1)).into()).await;
        let (orphans, timed_out) = state.expire_sessions(Instant::now());
        if orphans + timed_out > 0 {
            tracing::info!(
                timed_out,
                orphans,
                "sessions closed: timed out, or not activated by the activation deadline"
            );
        }
    }
}

/// Changes the demo's dynamic values every `demo.rate_ms`.
async fn tick_demo(state: Arc<ServerState>) {
    let Some(rate) = state.demo.as_ref().map(|d| d.rate) else {
        return;
    };
    let mut interval = tokio::time::interval(rate.max(Duration::from_millis(1)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for n in 0u64.. {
        interval.tick().await;
        // In a cluster one node runs the changing values; the others
        // follow them through the store (one writer per value).
        if state.cluster().is_some_and(|c| !c.leads()) {
            continue;
        }
        state.tick_demo(n, &mut seed);
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use uascale_types::StatusCode;

    /// A server on 127.0.0.1, a port the kernel chooses, None security only.
    pub(crate) fn loopback_config() -> ServerConfig {
        ServerConfig {
            server: crate::config::ServerSection {
                bind: [127, 0, 0, 1].into(),
                port: 0,
                ..Default::default()
            },
            security: crate::config::SecurityConfig::none_only(),
            ..Default::default()
        }
    }

    /// Reads one whole message (header and body) from `s`.
    async fn read_message(s: &mut TcpStream) -> (uascale_proto::tcp::MessageHeader, Vec<u8>) {
        use tokio::io::AsyncReadExt;
        let mut head = [0u8; 8];
        s.read_exact(&mut head).await.expect("header");
        let h = uascale_proto::tcp::MessageHeader::parse(&head, 1 << 20)
            .expect("valid header")
            .expect("complete header");
        let mut body = vec![0u8; h.message_size as usize - 8];
        s.read_exact(&mut body).await.expect("body");
        (h, body)
    }

    /// Built without the `nats` feature, a server with `[cluster] url`
    /// refuses to start, naming the key, instead of running alone.
    /// (`cargo test -p uascale-server --no-default-features`; with the
    /// feature, the cluster tests start real NATS servers.)
    #[cfg(not(feature = "nats"))]
    #[tokio::test]
    async fn without_nats_a_cluster_url_fails_the_start() {
        let mut config = loopback_config();
        config.cluster.url = Some("nats://127.0.0.1:4222".to_owned());
        let server = Server::bind(config).expect("bind");
        let e = server
            .run(async {})
            .await
            .expect_err("started without NATS");
        assert!(
            e.to_string()
                .starts_with("cluster.url = nats://127.0.0.1:4222: this build has no NATS client"),
            "{e}"
        );
    }

    /// Shutdown reaches connections through their response queues: an idle
    /// connection and one that registers after shutdown began both get an
    /// ERR with BadShutdown, and the server's run ends.
    #[tokio::test]
    async fn shutdown_closes_connections_with_bad_shutdown() {
        use uascale_proto::tcp::{ErrorMessage, Hello, MessageType};
        let config = loopback_config();
        let server = Server::bind(config).expect("bind");
        let addr = server.local_addr().expect("address");
        let shell = Arc::clone(&server.shell);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(server.run(async {
            let _ = stop_rx.await;
        }));
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let mut hello = Vec::new();
        Hello {
            protocol_version: 0,
            receive_buffer_size: 65535,
            send_buffer_size: 65535,
            max_message_size: 0,
            max_chunk_count: 0,
            endpoint_url: uascale_types::UaString::from(format!("opc.tcp://{addr}")),
        }
        .encode_message(&mut hello);
        client.write_all(&hello).await.expect("send Hello");
        let (h, _) = read_message(&mut client).await;
        assert_eq!(h.message_type, MessageType::Acknowledge);
        stop_tx.send(()).expect("server running");
        let (h, body) = read_message(&mut client).await;
        assert_eq!(h.message_type, MessageType::Error);
        let err = ErrorMessage::decode_body(&body).expect("ERR body");
        assert_eq!(err.error, StatusCode::BadShutdown);
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("run ends after shutdown")
            .expect("run task")
            .expect("run result");
        assert_eq!(shell.endpoint.connection_count(), 0, "tasks deregistered");
        // A connection that registers once shutdown began closes at once.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut late = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        let (stream, peer) = listener.accept().await.expect("accept");
        start(stream, peer, &shell);
        let (h, body) = read_message(&mut late).await;
        assert_eq!(h.message_type, MessageType::Error);
        let err = ErrorMessage::decode_body(&body).expect("ERR body");
        assert_eq!(err.error, StatusCode::BadShutdown);
    }

    /// A message that arrives in pieces (the start kept by the connection
    /// between reads, the rest read into the worker's buffer) and two that
    /// arrive in one read are each handled once.
    #[tokio::test]
    async fn messages_split_across_reads_and_joined_in_one() {
        use uascale_proto::tcp::{Hello, MessageType};
        let config = loopback_config();
        let server = Server::bind(config).expect("bind");
        let addr = server.local_addr().expect("address");
        let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async {
            let _ = stop_rx.await;
        }));
        let mut hello = Vec::new();
        Hello {
            protocol_version: 0,
            receive_buffer_size: 65535,
            send_buffer_size: 65535,
            max_message_size: 0,
            max_chunk_count: 0,
            endpoint_url: uascale_types::UaString::from(format!("opc.tcp://{addr}")),
        }
        .encode_message(&mut hello);
        let mut client = TcpStream::connect(addr).await.expect("connect");
        client.set_nodelay(true).expect("nodelay");
        for piece in [&hello[..3], &hello[3..10], &hello[10..]] {
            client.write_all(piece).await.expect("send a piece");
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let (h, _) = read_message(&mut client).await;
        assert_eq!(h.message_type, MessageType::Acknowledge);
        // A second Hello on the same connection is refused, whole or split.
        let mut twice = TcpStream::connect(addr).await.expect("connect");
        let mut both = hello.clone();
        both.extend_from_slice(&hello);
        twice.write_all(&both).await.expect("send both");
        let (h, _) = read_message(&mut twice).await;
        assert_eq!(h.message_type, MessageType::Acknowledge);
        let (h, body) = read_message(&mut twice).await;
        assert_eq!(h.message_type, MessageType::Error);
        let err = uascale_proto::tcp::ErrorMessage::decode_body(&body).expect("ERR body");
        assert_eq!(err.error, StatusCode::BadTcpMessageTypeInvalid);
    }
}
