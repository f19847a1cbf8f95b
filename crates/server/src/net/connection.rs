//! One connection's task: socket I/O and timers around the sans-IO
//! [`ServerConnection`]; what the requests become is the endpoint's
//! ([`Endpoint::handle_events`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use uascale_proto::ServerConnection;

use super::crypto::HandshakeCrypto;
use crate::endpoint::{Channel, Endpoint, HandshakeDecision, HandshakeWork, Step};
use crate::state::clock;

/// What the connection tasks share.
pub(super) struct Shell {
    pub(super) endpoint: Arc<Endpoint>,
    /// Where asymmetric (OpenSecureChannel) work runs
    /// (`runtime.crypto_threads`).
    pub(super) crypto: HandshakeCrypto,
}

/// Runs `task` on the runtime (a request's answer that has to wait).
pub(super) fn spawn(task: crate::endpoint::Spawn) {
    tokio::spawn(task);
}

/// One connection's task. Its state is multiplied by the connection count,
/// so what it keeps across awaits is kept small: no buffers while idle, one
/// timer kept armed across iterations, shutdown arriving through the
/// channel's record, the peer address only logged.
pub(super) fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    channel: Arc<Channel>,
    shell: Arc<Shell>,
) -> impl std::future::Future<Output = ()> + Send {
    let _ = stream.set_nodelay(true);
    let mut conn = shell.endpoint.connection(&channel, clock());
    tracing::debug!(%peer, channel = channel.id(), "connection accepted");
    // An async block, not an `async fn`: the parameters of an `async fn`
    // are copied into its state a second time when its body starts.
    let mut stream = stream;
    async move {
        // No buffer is held while the connection is idle, and none is
        // allocated per message while it is busy: it reads into its worker
        // thread's buffer and writes from another one lent to it (see
        // `BUFFERS`); `input` holds only the start of a message still
        // incomplete.
        let mut input: Vec<u8> = Vec::new();
        let mut room = MIN_READ as u32;
        // Re-armed only when the connection's next deadline moves.
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        loop {
            let armed = {
                let due = conn.poll_timeout().map(tokio::time::Instant::from_std);
                if let Some(t) = due.filter(|&t| t != timer.deadline()) {
                    timer.as_mut().reset(t);
                }
                due.is_some()
            };
            let wake = tokio::select! {
                ready = std::future::poll_fn(|cx| stream.poll_read_ready(cx)) => Wake::Readable(ready),
                () = std::future::poll_fn(|cx| channel.poll_ready(cx)) => Wake::Answers,
                () = timer.as_mut(), if armed => Wake::Timer,
            };
            // Set when the bytes read hold a secured OpenSecureChannel: its
            // asymmetric work runs below, after admission gave it a place.
            let mut deferred = false;
            let out = BUFFERS.with(|b| {
                let mut b = b.borrow_mut();
                conn.lend_send_buffer(std::mem::take(&mut b.write));
                conn.set_session_activated(channel.has_activated_session());
                let now = clock();
                match wake {
                    Wake::Readable(ready) => {
                        let read = ready.and_then(|()| {
                            read_and_handle(
                                &mut stream,
                                &mut conn,
                                &mut b.read,
                                &mut input,
                                &mut room,
                                &mut deferred,
                            )
                        });
                        if matches!(read, Ok(Some(0)) | Err(_)) {
                            return None;
                        }
                    }
                    Wake::Answers => shell.endpoint.deliver(&mut conn, &channel, now.utc),
                    Wake::Timer => conn.handle_timeout(now),
                }
                shell
                    .endpoint
                    .handle_events(&mut conn, &channel, now, &mut spawn);
                let mut out = Vec::new();
                conn.poll_transmit(&mut out);
                // Nothing to send costs no syscall.
                if out.is_empty() {
                    b.give_back_write(out);
                    return Some(Ok(Vec::new()));
                }
                match stream.try_write(&out) {
                    Ok(n) if n == out.len() => {
                        b.give_back_write(out);
                        Some(Ok(Vec::new()))
                    }
                    Ok(n) => {
                        out.drain(..n);
                        Some(Ok(out))
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(Ok(out)),
                    Err(e) => Some(Err(e)),
                }
            });
            match out {
                None | Some(Err(_)) => break,
                Some(Ok(rest)) => {
                    if !rest.is_empty() && stream.write_all(&rest).await.is_err() {
                        break;
                    }
                }
            }
            if deferred {
                // Boxed: this rare step's state is not carried by every
                // connection's task.
                let bytes = std::mem::take(&mut input);
                let work = run_handshake(&shell, &channel, &stream, conn, bytes);
                let Some((c, rest)) = Box::pin(work).await else {
                    // The work panicked: the connection is gone.
                    shell.endpoint.teardown(&channel, Instant::now());
                    return;
                };
                conn = c;
                input = rest;
            }
            if conn.is_closed() {
                break;
            }
        }
        shell.endpoint.teardown(&channel, Instant::now());
        let _ = stream.shutdown().await;
        tracing::debug!(channel = channel.id(), status = ?conn.close_status(), "connection closed");
    }
}

/// The asymmetric work of a secured OpenSecureChannel in `bytes`: a place
/// among the handshakes in flight first (refused: the ERR with the hint,
/// and `conn` closes), then the work where [`Shell::crypto`] says, then
/// what it yields goes out. Returns the connection and what was left of
/// the bytes; `None` if the work panicked.
async fn run_handshake(
    shell: &Shell,
    channel: &Arc<Channel>,
    stream: &TcpStream,
    mut conn: ServerConnection,
    bytes: Vec<u8>,
) -> Option<(ServerConnection, Vec<u8>)> {
    let ticket = conn.hello_retry_ticket().map(str::to_owned);
    let decision = shell
        .endpoint
        .handshake(channel, ticket.as_deref(), Instant::now());
    let decided = match decision {
        HandshakeDecision::Admit(place) => Ok(place),
        HandshakeDecision::Wait { waiting, until } => {
            match tokio::time::timeout_at(until.into(), waiting).await {
                Ok(guard) => Ok(shell.endpoint.handshake_admitted(guard)),
                Err(_) => Err(shell.endpoint.handshake_timed_out(channel, Instant::now())),
            }
        }
        HandshakeDecision::Refuse(shed) => Err(shed),
    };
    let place = match decided {
        Ok(place) => place,
        Err(shed) => {
            conn.close_with(shed.status(), &shed.err_reason());
            flush(&mut conn, stream).await;
            return Some((conn, Vec::new()));
        }
    };
    let mut work = HandshakeWork::new(conn, bytes, shell.crypto.in_two_steps());
    let (mut conn, rest) = loop {
        match shell.crypto.run(move || work.step(clock)).await? {
            Step::More(next) => work = next,
            Step::Done(conn, rest) => break (conn, rest),
        }
    };
    place.finish(Instant::now());
    shell
        .endpoint
        .handle_events(&mut conn, channel, clock(), &mut spawn);
    flush(&mut conn, stream).await;
    Some((conn, if rest.is_empty() { Vec::new() } else { rest }))
}

/// Logs why `conn` is closing.
fn closing(conn: &ServerConnection, e: &uascale_proto::ChannelError) {
    tracing::debug!(channel = conn.channel_id(), error = %e, "closing connection");
}

/// Writes out everything `conn` has to send (a write error is left for the
/// next read to find).
async fn flush(conn: &mut ServerConnection, stream: &TcpStream) {
    let mut out = Vec::new();
    conn.poll_transmit(&mut out);
    let mut at = 0;
    while at < out.len() {
        if stream.writable().await.is_err() {
            return;
        }
        match stream.try_write(out.get(at..).unwrap_or_default()) {
            Ok(0) => return,
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Answers a connection refused at accept with `err` (the ERR's bytes)
/// and a close, without parsing anything the peer sent. What it sent (its
/// Hello) is drained for at most 250 ms first, so the close does not reset
/// the connection before the ERR is read.
pub(super) async fn refuse(mut stream: TcpStream, err: Vec<u8>) {
    use tokio::io::AsyncReadExt;
    if stream.write_all(&err).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let drain = async {
        let mut left: usize = 64 * 1024;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_millis(250), drain).await;
}

/// What woke a connection's task.
enum Wake {
    Readable(io::Result<()>),
    Answers,
    Timer,
}

/// A worker thread's read and write buffers, used by whichever connection
/// it runs: a read and the handling of what it brought, and the answers
/// and their (non-blocking) write, happen within one poll with no await in
/// between, so per-connection buffers would only sit idle.
#[derive(Default)]
struct Buffers {
    read: Vec<u8>,
    write: Vec<u8>,
}

impl Buffers {
    fn give_back_write(&mut self, mut out: Vec<u8>) {
        out.clear();
        if out.capacity() <= KEEP_BUFFER && out.capacity() >= self.write.capacity() {
            self.write = out;
        }
    }
}

thread_local! {
    static BUFFERS: std::cell::RefCell<Buffers> = std::cell::RefCell::new(Buffers::default());
}

/// The most a worker thread's buffers keep between uses (one huge message
/// does not pin their size).
const KEEP_BUFFER: usize = 256 * 1024;

/// The smallest read (8 KiB, the smallest chunk size a peer may use).
const MIN_READ: usize = 8 * 1024;
/// The largest read of a busy connection.
const MAX_READ: usize = 64 * 1024;

/// Reads what a readable socket has and feeds it to `conn` (`None`: it was
/// not readable after all; `Some(0)`: the peer closed). The bytes go into
/// the thread's buffer `buf` after the incomplete message kept in
/// `pending` from the last read; what is still incomplete afterwards goes
/// back to `pending`. `room` is the read size: doubled (up to [`MAX_READ`])
/// when a read filled it, halved (down to [`MIN_READ`]) when a read used
/// under a quarter. Bytes holding a secured OpenSecureChannel are not
/// handled here: they all go to `pending` and `deferred` is set, for the
/// caller to ask admission for a handshake place first.
fn read_and_handle(
    stream: &mut TcpStream,
    conn: &mut ServerConnection,
    buf: &mut Vec<u8>,
    pending: &mut Vec<u8>,
    room: &mut u32,
    deferred: &mut bool,
) -> io::Result<Option<usize>> {
    buf.clear();
    buf.extend_from_slice(pending);
    let want = *room as usize;
    buf.reserve(want);
    let spare = buf.capacity() - buf.len();
    let n = match read_now(stream, buf) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    if n >= spare.min(want) {
        *room = (want * 2).min(MAX_READ) as u32;
    } else if n < want / 4 {
        *room = (want / 2).max(MIN_READ) as u32;
    }
    if n > 0 && conn.has_asymmetric_work(buf) {
        // Left for the caller (a handshake place first), all of it (what
        // follows the OPN must be handled after it).
        *deferred = true;
        *pending = buf.to_vec();
    } else if n > 0 {
        if let Err(e) = conn.handle_input(clock(), buf) {
            closing(conn, &e);
        }
        *pending = if buf.is_empty() {
            Vec::new()
        } else {
            buf.to_vec()
        };
    }
    buf.clear();
    if buf.capacity() > KEEP_BUFFER {
        *buf = Vec::new();
    }
    Ok(Some(n))
}

/// One read of what the socket holds now, without waiting (`None`: it
/// holds nothing). Through `AsyncRead` rather than `try_read`: a read
/// shorter than the room shows epoll's edge-triggered socket drained, so
/// tokio clears its readiness and the next wake is a real one. With
/// `try_read` the readiness stayed set, and every message cost a second
/// pass through the loop and a read that found nothing (EAGAIN).
fn read_now(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
    use std::future::Future;
    use tokio::io::AsyncReadExt;
    // A no-op waker: the loop waits on readiness with its own waker next.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(stream.read_buf(buf)).poll(&mut cx) {
        std::task::Poll::Ready(r) => r.map(Some),
        std::task::Poll::Pending => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state of a connection's task is multiplied by the connection
    /// count: this keeps it from growing unnoticed (an `async fn` holds
    /// every local that lives across an await, and each `select!` branch's
    /// future, inline).
    #[tokio::test]
    async fn connection_task_state_stays_small() {
        let config = crate::net::tests::loopback_config();
        let server = crate::net::Server::bind(config).expect("bind");
        let addr = server.local_addr().expect("address");
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (stream, peer) = server.listener.accept().await.expect("accept");
        let channel = server
            .shell
            .endpoint
            .accept(peer, None, Instant::now())
            .expect("admitted");
        let task = serve(stream, peer, channel, Arc::clone(&server.shell));
        let size = std::mem::size_of_val(&task);
        println!(
            "serve future {size} bytes; ServerConnection {} bytes; Channel {} bytes",
            std::mem::size_of::<ServerConnection>(),
            std::mem::size_of::<Channel>()
        );
        // The channel's record is allocated per connection too (in an Arc, 16
        // bytes more): at most 200 keeps glibc's chunk at 224 bytes.
        assert!(
            std::mem::size_of::<Channel>() <= 200,
            "the channel's record grew to {} bytes",
            std::mem::size_of::<Channel>()
        );
        // tokio allocates the task as this state plus about 104 bytes of
        // its own, in steps of 128: at most 536 keeps it at 640 bytes
        // (heaptrack of a release build: 767 per connection at 656 here,
        // 640 at 536). A debug build lays the same state out in 544
        // bytes; its bound catches the same growth.
        let bound = if cfg!(debug_assertions) { 544 } else { 536 };
        assert!(
            size <= bound,
            "the connection task's state grew to {size} bytes"
        );
    }
}
