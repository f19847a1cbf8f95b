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
use crate::endpoint::timers::{DemoTicker, Reaper, Subscriptions};
use crate::endpoint::Endpoint;
use crate::state::{clock, ServerState, Setup};
use connection::{refuse, serve, Shell};

mod connection;
mod crypto;
#[cfg(feature = "https")]
mod h2;
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
    https: Option<Https>,
}

#[cfg(feature = "https")]
type Https = https::Bound;
/// A build without the `https` feature refuses `[https] listen` rather
/// than serve without it.
#[cfg(not(feature = "https"))]
type Https = std::convert::Infallible;

/// Binds `[https] listen`, if set, so a bad address fails the start and
/// port 0 is known before the state is built.
fn bind_https(config: &ServerConfig) -> io::Result<Option<TcpListener>> {
    let Some(addr) = config.https.listen else {
        return Ok(None);
    };
    if cfg!(not(feature = "https")) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("https.listen = {addr}: this build has no TLS (uascale-server's `https` feature is off)"),
        ));
    }
    listen(addr, config.limits.listen_backlog).map(Some)
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
    pub fn bind_with(mut config: ServerConfig, setup: impl Setup) -> io::Result<Self> {
        config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let listener = listen(config.server.socket_addr(), config.limits.listen_backlog)?;
        // With port 0 the kernel chose: publish the ports actually bound.
        config.server.port = listener.local_addr()?.port();
        let https = bind_https(&config)?;
        if let Some(l) = &https {
            config.https.listen = Some(l.local_addr()?);
        }
        let state = ServerState::with_setup(config, setup)?;
        Self::serve_state(state, listener, https)
    }

    /// Serves an already built state on its configured address (whose
    /// port must be the one to publish: not 0).
    pub fn bind_state(state: Arc<ServerState>) -> io::Result<Self> {
        let listener = listen(
            state.config.server.socket_addr(),
            state.config.limits.listen_backlog,
        )?;
        let https = bind_https(&state.config)?;
        Self::serve_state(state, listener, https)
    }

    fn serve_state(
        state: Arc<ServerState>,
        listener: TcpListener,
        https: Option<TcpListener>,
    ) -> io::Result<Self> {
        #[cfg(feature = "https")]
        let https = https.map(|l| https::Bound::new(l, &state)).transpose()?;
        #[cfg(not(feature = "https"))]
        let https: Option<Https> = https.and(None);
        // The metrics endpoint is bound now, so a bad address fails the
        // start and port 0 is known before `run`.
        let metrics = match state.config.metrics.listen {
            Some(addr) => Some(listen(addr, METRICS_BACKLOG)?),
            None => None,
        };
        let threads = state.config.runtime.crypto_threads;
        // In place, as many jobs at once as there are workers to run them.
        let workers = state.config.runtime.worker_threads.unwrap_or(1);
        let crypto = crypto::HandshakeCrypto::start(threads, workers, "uascale-crypto")?;
        let endpoint = Endpoint::for_host(state);
        Ok(Server {
            shell: Arc::new(Shell { endpoint, crypto }),
            listener,
            metrics,
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
        return self.https.as_ref().and_then(|b| b.local_addr().ok());
        #[cfg(not(feature = "https"))]
        self.https.as_ref().map(|b| match *b {})
    }

    /// Serves until `shutdown` completes or a planned shutdown is due
    /// ([`crate::endpoint::timers::PlannedShutdown`]), then closes every connection with
    /// `BadShutdown` and waits (at most 5 s) for them to flush. The metrics
    /// endpoint, when configured, serves from the start until the
    /// connections are gone (`/readyz` answers 503 from shutdown on). With
    /// `[cluster] url` it joins the store first
    /// ([`ServerState::join_configured_cluster`]) and runs the node's tasks.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> io::Result<()> {
        let state = Arc::clone(self.shell.endpoint.state());
        let cluster = state
            .join_configured_cluster(CLUSTER_CONNECT_LIMIT)
            .await?
            .map(|node| {
                tracing::info!(node = node.node_id(), "cluster node running");
                tokio::spawn(node.run())
            });
        let metrics = self.metrics.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(url = %format!("http://{addr}/metrics"), "metrics endpoint listening");
            }
            tokio::spawn(metrics_http::serve(listener, Arc::clone(&state)))
        });
        #[cfg(feature = "https")]
        let https = self.https.map(|bound| {
            if let Ok(addr) = bound.local_addr() {
                tracing::info!(url = %format!("opc.https://{addr}/"), "opc.https listening");
            }
            tokio::spawn(https::serve(bound, Arc::clone(&self.shell.endpoint)))
        });
        state.set_listening(true);
        workers::start(&state.scheduler);
        let now = clock().instant;
        let publisher = tokio::spawn(timers::drive(Subscriptions::new(Arc::clone(&state), now)));
        let mut tasks = vec![tokio::spawn(timers::drive(Reaper::new(Arc::clone(&state))))];
        if let Some(ticker) = DemoTicker::new(Arc::clone(&state), now) {
            tasks.push(tokio::spawn(timers::drive(ticker)));
        }
        tasks.extend(cluster);
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
        state.set_listening(false);
        // New connections are refused from here on (the front end sends
        // them elsewhere) rather than left in the backlog.
        drop(self.listener);
        // A cluster node draining: nothing more is published, the final
        // records reach the store, then the channels close paced.
        publisher.abort();
        planned::drain(&self.shell.endpoint).await;
        for task in &tasks {
            task.abort();
        }
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
}
