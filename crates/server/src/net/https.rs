//! The opc.https listener (`[https] listen`): TLS 1.2/1.3 through rustls
//! and the socket I/O of each connection; what a request head means and
//! what a request becomes is [`crate::endpoint::https`]'s.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::endpoint::https::{next_request, Framed, Https, HttpsConnection, Outcome, MAX_HEAD};
use crate::endpoint::Endpoint;
use crate::state::{clock, ServerState};

/// A bound HTTPS listener and its TLS configuration.
pub(super) struct Bound {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
}

impl Bound {
    /// The address bound.
    pub(super) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

impl Bound {
    /// `listener` with the TLS configuration of `state`
    /// ([`crate::endpoint::tls::server_config`]).
    pub(super) fn new(listener: TcpListener, state: &ServerState) -> io::Result<Bound> {
        Ok(Bound {
            listener,
            tls: crate::endpoint::tls::server_config(state)?,
        })
    }
}

/// Accepts HTTPS connections until the task is aborted.
pub(super) async fn serve(bound: Bound, endpoint: Arc<Endpoint>) {
    let https = Https::new(endpoint);
    let acceptor = TlsAcceptor::from(bound.tls);
    loop {
        let (stream, peer) = match bound.listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "https: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let local = stream.local_addr().ok().map(|a| a.ip());
        // Refused: closed at once, before any TLS work.
        let Ok(conn) = https.accept(peer, local, Instant::now()) else {
            continue;
        };
        let (acceptor, https) = (acceptor.clone(), Arc::clone(&https));
        tokio::spawn(async move {
            connection(stream, &conn, acceptor, &https).await;
            https.closed(conn, Instant::now());
        });
    }
}

/// Why a connection's loop ended.
enum End {
    /// The peer closed, a read failed or the connection idled out.
    Gone,
}

/// One HTTPS connection: the TLS handshake (within the handshake
/// timeout), then requests one after the other (HTTP/1.1 keep-alive),
/// each head bounded by [`MAX_HEAD`] and each body by `max_body_size`.
async fn connection(
    stream: TcpStream,
    conn: &HttpsConnection,
    acceptor: TlsAcceptor,
    https: &Arc<Https>,
) {
    let _ = stream.set_nodelay(true);
    let state = Arc::clone(https.endpoint().state());
    let handshake = state.config.limits.handshake_timeout;
    let mut tls = match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(peer = %conn.peer, error = %e, "https: TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    if tls.get_ref().1.alpn_protocol() == Some(crate::endpoint::tls::H2) {
        return super::h2::serve(tls, conn, https).await;
    }
    let idle_timeout = https.config().idle_timeout;
    let max_body = https.config().max_body_size;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let (head, body) = match next_request(&mut buf, max_body) {
            Framed::Request(head, body) => (head, body),
            Framed::Refuse(reply) => {
                let _ = write(&mut tls, &reply.to_http1()).await;
                return;
            }
            // The idle timeout before a request's first byte, the
            // handshake timeout (a slow sender) after.
            Framed::Need { up_to, idle } => {
                let limit = if idle { idle_timeout } else { handshake };
                match read_more(&mut tls, &mut buf, up_to, limit).await {
                    Ok(()) => continue,
                    Err(End::Gone) => return,
                }
            }
        };
        let answer = match https.request(conn, &head, &body, clock()) {
            Outcome::Respond(reply) => reply.to_http1(),
            Outcome::Wait { channel, task } => {
                drop(body);
                if let Some(task) = task {
                    tokio::spawn(task);
                }
                match wait(&mut tls, &mut buf, https, &channel, head.close).await {
                    Ok(reply) => reply.to_http1(),
                    Err(End::Gone) => {
                        https.abandon(&channel);
                        return;
                    }
                }
            }
        };
        if write(&mut tls, &answer).await.is_err() || head.close {
            let _ = tls.shutdown().await;
            return;
        }
    }
}

/// Waits for the answer of a request that was not answered at once (a
/// held Publish, a queued request), watching the connection meanwhile: a
/// peer that closes abandons it; bytes it sends ahead (a pipelined
/// request) are kept in `buf`, up to a head's worth.
async fn wait(
    tls: &mut tokio_rustls::server::TlsStream<TcpStream>,
    buf: &mut Vec<u8>,
    https: &Https,
    channel: &crate::endpoint::Channel,
    close: bool,
) -> Result<crate::endpoint::https::Reply, End> {
    loop {
        let reading = buf.len() <= MAX_HEAD;
        tokio::select! {
            () = std::future::poll_fn(|cx| channel.poll_ready(cx)) => {
                if let Some(reply) = https.answered(channel, close, clock().utc) {
                    return Ok(reply);
                }
            }
            read = tls.read_buf(buf), if reading => match read {
                Ok(0) | Err(_) => return Err(End::Gone),
                Ok(_) => {}
            },
        }
    }
}

/// Reads more into `buf` (at most up to `up_to` bytes held), within
/// `limit`.
async fn read_more(
    tls: &mut tokio_rustls::server::TlsStream<TcpStream>,
    buf: &mut Vec<u8>,
    up_to: usize,
    limit: Duration,
) -> Result<(), End> {
    let room = up_to.saturating_sub(buf.len()).clamp(1, 64 * 1024);
    let mut chunk = vec![0u8; room];
    match tokio::time::timeout(limit, tls.read(&mut chunk)).await {
        Ok(Ok(0)) | Ok(Err(_)) | Err(_) => Err(End::Gone),
        Ok(Ok(n)) => {
            buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
            Ok(())
        }
    }
}

/// Writes `bytes` and flushes them through TLS, within 10 s.
async fn write(
    tls: &mut tokio_rustls::server::TlsStream<TcpStream>,
    bytes: &[u8],
) -> io::Result<()> {
    let done = async {
        tls.write_all(bytes).await?;
        tls.flush().await
    };
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}
