//! A chaos TCP relay for tests: it sits between a client and a server on
//! 127.0.0.1 and misbehaves on command, the way real networks do.
//!
//! - latency per direction (every read is delivered that much later;
//!   reading goes on meanwhile, so throughput is not cut);
//! - [`Chaos::cut`]: every relayed connection is closed, both directions
//!   (FIN to both peers);
//! - [`Chaos::stall`]: nothing is read or written until [`Chaos::resume`],
//!   the sockets stay open (kernel buffers fill, the peers see silence);
//! - byte-at-a-time delivery: every byte is its own write (with
//!   `TCP_NODELAY`, its own segment), with an optional gap between bytes;
//! - [`Chaos::reset_mid_chunk`]: the next connection that carries data in
//!   the given direction forwards only part of what it read, then both of
//!   its sockets are reset (RST, `SO_LINGER` 0).
//!
//! Counters say what the relay did, so tests can assert that the chaos
//! really happened.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub enum Dir {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

impl Dir {
    fn index(self) -> usize {
        match self {
            Dir::Up => 0,
            Dir::Down => 1,
        }
    }
}

/// How one direction delivers.
#[derive(Debug, Clone, Copy, Default)]
struct Shape {
    latency: Duration,
    /// `Some(gap)`: one byte per write, `gap` between bytes.
    byte_gap: Option<Duration>,
}

/// What the relay has done so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChaosCounts {
    /// Connections accepted from clients.
    pub accepted: u64,
    /// Connections closed by [`Chaos::cut`].
    pub cut: u64,
    /// Connections reset mid-chunk.
    pub reset: u64,
    /// Bytes forwarded client to server.
    pub bytes_up: u64,
    /// Bytes forwarded server to client.
    pub bytes_down: u64,
}

#[derive(Debug)]
struct Control {
    target: SocketAddr,
    shapes: Mutex<[Shape; 2]>,
    /// Bumped by every cut; connections watch it.
    cuts: watch::Sender<u64>,
    stalled: watch::Sender<bool>,
    /// A reset is armed for this direction: the first connection with data
    /// takes it.
    reset_armed: [AtomicBool; 2],
    /// Relayed connections now open.
    live: AtomicUsize,
    accepted: AtomicU64,
    cut: AtomicU64,
    reset: AtomicU64,
    bytes: [AtomicU64; 2],
}

/// The relay; dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct Chaos {
    addr: SocketAddr,
    control: Arc<Control>,
    acceptor: JoinHandle<()>,
}

impl Drop for Chaos {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}

#[allow(dead_code)]
impl Chaos {
    /// Listens on 127.0.0.1 (a port the kernel chooses) and relays every
    /// connection to `target`.
    pub async fn start(target: SocketAddr) -> Chaos {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let control = Arc::new(Control {
            target,
            shapes: Mutex::new([Shape::default(); 2]),
            cuts: watch::channel(0).0,
            stalled: watch::channel(false).0,
            reset_armed: [AtomicBool::new(false), AtomicBool::new(false)],
            live: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let c = Arc::clone(&control);
        let acceptor = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                c.accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(relay(inbound, Arc::clone(&c)));
            }
        });
        Chaos {
            addr,
            control,
            acceptor,
        }
    }

    /// The relay's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `opc.tcp://` URL of the relay.
    pub fn url(&self) -> String {
        format!("opc.tcp://{}", self.addr)
    }

    fn shape(&self, dir: Dir, f: impl FnOnce(&mut Shape)) {
        f(&mut self.control.shapes.lock().unwrap()[dir.index()]);
    }

    /// Delays every byte in `dir` by `latency` (from now on, for bytes read
    /// from now on).
    pub fn set_latency(&self, dir: Dir, latency: Duration) {
        self.shape(dir, |s| s.latency = latency);
    }

    /// Delivers `dir` one byte per write, `gap` between bytes (zero: a
    /// yield between bytes); `None` back to whole reads.
    pub fn set_byte_at_a_time(&self, dir: Dir, gap: Option<Duration>) {
        self.shape(dir, |s| s.byte_gap = gap);
    }

    /// Closes every relayed connection now (both directions; the client
    /// and the server each see their connection end).
    pub fn cut(&self) {
        self.control.cuts.send_modify(|n| *n += 1);
    }

    /// Stops forwarding (no reads, no writes) until [`resume`](Self::resume);
    /// connections stay open.
    pub fn stall(&self) {
        self.control.stalled.send_replace(true);
    }

    /// Forwards again after a [`stall`](Self::stall).
    pub fn resume(&self) {
        self.control.stalled.send_replace(false);
    }

    /// Arms a reset: the next connection that has bytes to forward in
    /// `dir` forwards part of them (half, at least one byte), then both of
    /// its sockets are reset.
    pub fn reset_mid_chunk(&self, dir: Dir) {
        self.control.reset_armed[dir.index()].store(true, Ordering::SeqCst);
    }

    /// Whether an armed reset is still waiting for data.
    pub fn reset_pending(&self, dir: Dir) -> bool {
        self.control.reset_armed[dir.index()].load(Ordering::SeqCst)
    }

    /// Relayed connections open now.
    pub fn live(&self) -> usize {
        self.control.live.load(Ordering::SeqCst)
    }

    /// What it did so far.
    pub fn counts(&self) -> ChaosCounts {
        let c = &self.control;
        ChaosCounts {
            accepted: c.accepted.load(Ordering::Relaxed),
            cut: c.cut.load(Ordering::Relaxed),
            reset: c.reset.load(Ordering::Relaxed),
            bytes_up: c.bytes[0].load(Ordering::Relaxed),
            bytes_down: c.bytes[1].load(Ordering::Relaxed),
        }
    }
}

/// How one relayed connection ended.
enum End {
    /// Both peers closed (or one failed): close quietly.
    Done,
    /// A cut: close both.
    Cut,
    /// A reset mid-chunk: RST both.
    Reset,
}

async fn relay(mut client: TcpStream, control: Arc<Control>) {
    let Ok(mut server) = TcpStream::connect(control.target).await else {
        return;
    };
    control.live.fetch_add(1, Ordering::SeqCst);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut cuts = control.cuts.subscribe();
    cuts.borrow_and_update();
    let end = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let up = pump(cr, sw, Dir::Up, &control);
        let down = pump(sr, cw, Dir::Down, &control);
        tokio::select! {
            r = async { tokio::try_join!(up, down) } => match r {
                Ok(_) => End::Done,
                Err(end) => end,
            },
            _ = cuts.changed() => End::Cut,
        }
    };
    match end {
        End::Done => {}
        End::Cut => {
            control.cut.fetch_add(1, Ordering::Relaxed);
            let _ = client.shutdown().await;
            let _ = server.shutdown().await;
        }
        End::Reset => {
            control.reset.fetch_add(1, Ordering::Relaxed);
            let _ = client.set_zero_linger();
            let _ = server.set_zero_linger();
        }
    }
    drop(client);
    drop(server);
    control.live.fetch_sub(1, Ordering::SeqCst);
}

/// One direction: reads from `from`, delivers to `to` per the shape, the
/// stall and an armed reset. `Ok` when `from` ended cleanly (the end was
/// passed on), `Err` when the connection must end now.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    dir: Dir,
    control: &Control,
) -> Result<(), End> {
    let mut stalled = control.stalled.subscribe();
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut eof = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let is_stalled = *stalled.borrow_and_update();
        if eof && queue.is_empty() {
            let _ = to.shutdown().await;
            return Ok(());
        }
        let due = queue.front().map(|(at, _)| *at);
        tokio::select! {
            read = from.read(&mut buf), if !eof && !is_stalled => match read {
                Ok(0) => eof = true,
                Ok(n) => {
                    let latency = control.shapes.lock().unwrap()[dir.index()].latency;
                    queue.push_back((Instant::now() + latency, buf[..n].to_vec()));
                }
                Err(_) => return Err(End::Done),
            },
            () = sleep_until(due), if due.is_some() && !is_stalled => {
                let Some((_, data)) = queue.pop_front() else { continue };
                deliver(&mut to, &data, dir, control).await?;
            },
            _ = stalled.changed() => {}
        }
    }
}

async fn deliver(
    to: &mut tokio::net::tcp::WriteHalf<'_>,
    data: &[u8],
    dir: Dir,
    control: &Control,
) -> Result<(), End> {
    let shape = control.shapes.lock().unwrap()[dir.index()];
    let reset = control.reset_armed[dir.index()].swap(false, Ordering::SeqCst);
    let data = if reset {
        &data[..(data.len() / 2).max(1)]
    } else {
        data
    };
    match shape.byte_gap {
        None => {
            to.write_all(data).await.map_err(|_| End::Done)?;
        }
        Some(gap) => {
            for b in data {
                to.write_all(std::slice::from_ref(b))
                    .await
                    .map_err(|_| End::Done)?;
                if gap.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(gap).await;
                }
            }
        }
    }
    control.bytes[dir.index()].fetch_add(data.len() as u64, Ordering::Relaxed);
    if reset {
        return Err(End::Reset);
    }
    Ok(())
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
