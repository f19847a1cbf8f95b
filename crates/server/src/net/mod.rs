//! The tokio shell around the sans-IO protocol core: the opc.tcp listener
//! and one task per connection that feeds bytes and time into a
//! [`ServerConnection`] and writes out what it yields.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::{Event, Now, PendingConnection, ServerConnection};
use uascale_types::{encode_message, DateTime, StatusCode};

use crate::config::ServerConfig;
use crate::reply::ResponseSink;
use crate::services::{dispatch, peek_request_handle, service_fault, Dispatched, ServiceContext};

/// The response queue of one connection: answers produced outside the
/// connection's task (asynchronous handlers, parked Publishes) go here and
/// the task writes them out. A mutex-guarded `Vec` and a `Notify` rather
/// than an mpsc channel: a channel allocates a block of slots up front,
/// and this queue holds no allocation while it is empty - which is nearly
/// always (it is multiplied by the connection count).
#[derive(Debug, Default)]
struct ConnectionSink {
    queue: std::sync::Mutex<SinkQueue>,
    ready: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct SinkQueue {
    answers: Vec<(u32, Vec<u8>)>,
    /// Set when the connection's task ends: later answers are refused.
    closed: bool,
    /// Set when the server shuts down: the task closes the connection.
    stopping: bool,
}

impl ConnectionSink {
    fn lock(&self) -> std::sync::MutexGuard<'_, SinkQueue> {
        // Nothing can be left half-done under this lock (a push or a take).
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Everything queued so far, in order (the queue keeps no allocation),
    /// and whether the server is shutting down.
    fn take(&self) -> (Vec<(u32, Vec<u8>)>, bool) {
        let mut q = self.lock();
        (std::mem::take(&mut q.answers), q.stopping)
    }

    /// Tells the task that the server is shutting down.
    fn stop(&self) {
        self.lock().stopping = true;
        self.ready.notify_one();
    }

    /// Refuses further answers and drops the queued ones.
    fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        q.answers = Vec::new();
    }
}

impl ResponseSink for ConnectionSink {
    fn send(&self, request_id: u32, message: Vec<u8>) -> bool {
        {
            let mut q = self.lock();
            if q.closed {
                return false;
            }
            q.answers.push((request_id, message));
        }
        // Stores a permit when the task is not waiting: no wake-up is lost.
        self.ready.notify_one();
        true
    }
}

/// A request whose answer comes from a running task (an asynchronous node
/// manager); Cancel can abort it.
struct Running {
    request_handle: u32,
    request_id: u32,
    /// Set by whoever answers first: the task or a Cancel.
    answered: Arc<std::sync::atomic::AtomicBool>,
    abort: tokio::task::AbortHandle,
}

/// The requests of one connection that are answered later.
#[derive(Default)]
struct Outstanding {
    running: std::cell::RefCell<Vec<Running>>,
}

impl Outstanding {
    /// Aborts the running requests with `request_handle`, answering each
    /// `BadRequestCancelledByClient`; how many there were.
    fn cancel(&self, request_handle: u32, sink: &Arc<dyn ResponseSink>, now: DateTime) -> u32 {
        let mut running = self.running.borrow_mut();
        let mut count = 0;
        running.retain(|r| {
            if r.request_handle != request_handle {
                return true;
            }
            if !r.answered.swap(true, Ordering::AcqRel) {
                r.abort.abort();
                let fault =
                    service_fault(now, request_handle, StatusCode::BadRequestCancelledByClient);
                let mut msg = Vec::new();
                encode_message(&fault, &mut msg);
                sink.send(r.request_id, msg);
                count += 1;
            }
            false
        });
        count
    }

    /// Forgets a request once its answer went out.
    fn finished(&self, request_id: u32) {
        self.running
            .borrow_mut()
            .retain(|r| r.request_id != request_id);
    }
}

fn now() -> Now {
    Now {
        instant: Instant::now(),
        utc: DateTime::from_system_time(SystemTime::now()),
    }
}

mod timers;

struct Shared {
    sessions: crate::session::SessionTable,
    subscriptions: Arc<crate::services::subscription::SubscriptionRegistry>,
    address_space: crate::address_space::AddressSpace,
    start_time: DateTime,
    managers: crate::node_manager::NodeManagers,
    demo: Arc<crate::node_manager::InMemoryNodeManager>,
    dynamic: crate::demo::Dynamic,
    config: ServerConfig,
    security: crate::security::SecurityState,
    channel_config: Arc<uascale_proto::ChannelConfig>,
    budget: Arc<ReassemblyBudget>,
    next_channel_id: AtomicU32,
    /// Every running connection task, by channel id: shutdown reaches it
    /// through the queue it already waits on (rather than one more future
    /// per task), waits for the map to empty and aborts what is left.
    connections: std::sync::Mutex<Connections>,
    /// Set once shutdown began (a task registering later stops at once).
    stopping: std::sync::atomic::AtomicBool,
}

/// A running connection task (a few words each; a `JoinSet` would add an
/// allocation per task).
struct Registered {
    queue: std::sync::Weak<ConnectionSink>,
    /// Set right after the spawn.
    abort: Option<tokio::task::AbortHandle>,
}

type Connections = crate::fxhash::FxHashMap<u32, Registered>;

impl Shared {
    fn connections(&self) -> std::sync::MutexGuard<'_, Connections> {
        // One insert or remove at a time: a poisoned lock is still usable.
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection task's queue; true when shutdown already began.
    fn register(&self, id: u32, queue: &Arc<ConnectionSink>) -> bool {
        self.connections().insert(
            id,
            Registered {
                queue: Arc::downgrade(queue),
                abort: None,
            },
        );
        self.stopping.load(Ordering::Acquire)
    }

    /// Records how to abort the task registered as `id` (unless it ended).
    fn spawned(&self, id: u32, abort: tokio::task::AbortHandle) {
        if let Some(r) = self.connections().get_mut(&id) {
            r.abort.get_or_insert(abort);
        }
    }

    fn deregister(&self, id: u32, queue: &Arc<ConnectionSink>) {
        let mut all = self.connections();
        if all
            .get(&id)
            .is_some_and(|r| std::ptr::eq(r.queue.as_ptr(), Arc::as_ptr(queue)))
        {
            all.remove(&id);
        }
    }

    /// Asks every connection task to close with `BadShutdown`.
    fn stop_all(&self) {
        self.stopping.store(true, Ordering::Release);
        let queues: Vec<_> = self
            .connections()
            .values()
            .filter_map(|r| r.queue.upgrade())
            .collect();
        for q in queues {
            q.stop();
        }
    }

    /// Aborts the connection tasks still running.
    fn abort_all(&self) {
        let left: Vec<_> = self
            .connections()
            .drain()
            .filter_map(|(_, r)| r.abort)
            .collect();
        for task in left {
            task.abort();
        }
    }
}

/// A bound, not yet running server.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
}

impl Server {
    /// Binds the listener with the configured backlog; the server has
    /// namespace 0 and the demo namespace.
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
        let addr = config.server.socket_addr();
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(i32::try_from(config.limits.listen_backlog).unwrap_or(i32::MAX))?;
        let listener = TcpListener::from_std(socket.into())?;
        let mut address_space = crate::address_space::AddressSpace::ns0().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("namespace-0 table: {e}"),
            )
        })?;
        let (demo, dynamic) = crate::demo::build(&mut address_space, config.demo.nodes);
        let mut managers = crate::node_manager::NodeManagers::default();
        managers.register(
            crate::demo::NS,
            Arc::clone(&demo) as Arc<dyn crate::node_manager::NodeManager>,
        );
        setup(&mut address_space, &mut managers);
        crate::nodeset::load_files(
            &config.server.nodesets,
            &mut address_space,
            &mut managers,
            &config.server.application_uri,
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let subscriptions = Arc::new(crate::services::subscription::SubscriptionRegistry::new(
            config.subscriptions.clone(),
        ));
        // Value changes reach monitored items as they happen (no sampling).
        let registry = Arc::clone(&subscriptions);
        let observer: crate::node_manager::ValueObserver = Arc::new(move |node, value| {
            let now = crate::subscription::Now {
                instant: Instant::now(),
                utc: DateTime::from_system_time(SystemTime::now()),
            };
            registry.value_changed(now, node, value);
        });
        managers.set_observer(&observer);
        // With port 0 the kernel chose: publish the port actually bound.
        config.server.port = listener.local_addr()?.port();
        let security = crate::security::SecurityState::from_config(&config, SystemTime::now())
            .map_err(|e| io::Error::other(format!("PKI: {e}")))?;
        let mut channel_config = config.limits.channel_config();
        channel_config.security = uascale_proto::security::ServerSecurity {
            identity: security.identity.clone(),
            endpoints: security.endpoints.clone(),
            validator: security
                .pki
                .clone()
                .map(|p| p as Arc<dyn uascale_proto::security::CertificateValidator>),
        };
        let shared = Arc::new(Shared {
            security,
            channel_config: Arc::new(channel_config),
            budget: ReassemblyBudget::new(
                config.limits.reassembly_budget,
                config.limits.reassembly_unactivated_percent,
            ),
            next_channel_id: AtomicU32::new(1),
            connections: std::sync::Mutex::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            sessions: crate::session::SessionTable::new(config.server.max_session_count),
            subscriptions,
            address_space,
            managers,
            demo,
            dynamic,
            start_time: DateTime::from_system_time(SystemTime::now()),
            config,
        });
        Ok(Server { shared, listener })
    }

    /// The endpoint URL clients use (with the port actually bound).
    pub fn endpoint_url(&self) -> String {
        self.shared.config.endpoint_url()
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then closes every connection with
    /// `BadShutdown` and waits (at most 5 s) for them to flush.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> io::Result<()> {
        let reaper = tokio::spawn(reap_sessions(Arc::clone(&self.shared)));
        let ticker = tokio::spawn(tick_demo(Arc::clone(&self.shared)));
        let publisher = tokio::spawn(timers::run_subscriptions(Arc::clone(&self.shared)));
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let id = self.shared.next_channel_id.fetch_add(1, Ordering::Relaxed).max(1);
                        let task = tokio::spawn(serve(stream, peer, id, Arc::clone(&self.shared)));
                        self.shared.spawned(id, task.abort_handle());
                    }
                    Err(e) if is_resource_exhaustion(&e) => {
                        // EMFILE and friends: shed by not accepting for a moment
                        // instead of spinning on an accept that keeps failing.
                        tracing::warn!(error = %e, "accept failed; pausing 100 ms");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "accept failed"),
                },
            }
        }
        reaper.abort();
        ticker.abort();
        publisher.abort();
        self.shared.stop_all();
        // Each task deregisters when it has flushed and closed.
        let drain = async {
            while !self.shared.connections().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .is_err()
        {
            self.shared.abort_all();
        }
        Ok(())
    }
}

/// Closes sessions past their timeout or activation deadline. It sleeps
/// until the earliest deadline (at most 1 s, so new sessions are seen).
async fn reap_sessions(shared: Arc<Shared>) {
    loop {
        let now = Instant::now();
        let next = shared
            .sessions
            .next_deadline()
            .unwrap_or(now + Duration::from_secs(1));
        tokio::time::sleep_until(next.min(now + Duration::from_secs(1)).into()).await;
        let expired = shared.sessions.expire(Instant::now());
        if shared.config.server.auditing && !expired.is_empty() {
            audit_timeouts(&shared, &expired);
        }
        for id in expired {
            tracing::info!(session = %id, "session timed out");
            // Its subscriptions live on for a transfer until their lifetime
            // runs out (Part 4 §5.13.7).
            shared
                .subscriptions
                .close_session(&id, false, StatusCode::BadSessionClosed);
        }
    }
}

/// Raises the "Session/Timeout" audit events of `expired`.
fn audit_timeouts(shared: &Shared, expired: &[uascale_types::NodeId]) {
    let ctx = crate::services::ServiceContext {
        config: &shared.config,
        sessions: &shared.sessions,
        channel_id: 0,
        now: DateTime::from_system_time(std::time::SystemTime::now()),
        instant: Instant::now(),
        address_space: &shared.address_space,
        start_time: shared.start_time,
        managers: &shared.managers,
        request_id: 0,
        sink: None,
        canceller: None,
        security: &shared.security,
        // The reaper runs on no channel.
        channel: crate::services::no_security().1,
        subscriptions: &shared.subscriptions,
    };
    let header = uascale_types::RequestHeader::default();
    for id in expired {
        crate::audit::audit_session(
            &ctx,
            crate::audit::SessionAction::Timeout,
            &header,
            Ok(()),
            id.clone(),
            "",
            None,
        );
    }
}

/// Changes the demo's dynamic values every `demo.rate`.
async fn tick_demo(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(shared.config.demo.rate.max(Duration::from_millis(1)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for n in 0u64.. {
        interval.tick().await;
        crate::demo::tick(&shared.demo, &shared.dynamic, n, &mut seed);
        timers::raise_demo_event(&shared, n);
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// One connection's task. Its state is multiplied by the connection count,
/// so what it keeps across awaits is kept small: no buffers while idle, one
/// timer kept armed across iterations, shutdown arriving through the
/// response queue, the peer address only logged.
fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    id: u32,
    shared: Arc<Shared>,
) -> impl std::future::Future<Output = ()> + Send {
    let _ = stream.set_nodelay(true);
    // Admission will decide here, before any work (SCALABILITY.md §2).
    let conn = PendingConnection::new().accept(
        now(),
        id,
        Arc::clone(&shared.channel_config),
        Arc::clone(&shared.budget),
    );
    tracing::debug!(%peer, channel = id, "connection accepted");
    // An async block, not an `async fn`: the parameters of an `async fn`
    // are copied into its state a second time when its body starts, and
    // that state is multiplied by the connection count.
    let mut stream = stream;
    let mut conn = conn;
    let queue = Arc::new(ConnectionSink::default());
    if shared.register(id, &queue) {
        conn.close_with(StatusCode::BadShutdown, "server shutting down");
    }
    async move {
        let outstanding = Outstanding::default();
        // No buffer is held while the connection is idle, and none is
        // allocated per message while it is busy: it reads into its worker
        // thread's buffer and writes from another one lent to it (see
        // `BUFFERS`); `input` holds only the start of a message still
        // incomplete.
        let mut input: Vec<u8> = Vec::new();
        let mut room = MIN_READ as u32;
        // Re-armed only when the connection's next deadline moves (a timer
        // that fired and is not moved fires again when polled).
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        loop {
            let due = conn.poll_timeout().map(tokio::time::Instant::from_std);
            if let Some(t) = due.filter(|&t| t != timer.deadline()) {
                timer.as_mut().reset(t);
            }
            let armed = due.is_some();
            // What woke the task; the work happens after, with no await.
            let wake = tokio::select! {
                // Waiting on the stream's readiness directly keeps this
                // branch's state to a reference (`readable()` is 168 bytes).
                ready = std::future::poll_fn(|cx| stream.poll_read_ready(cx)) => Wake::Readable(ready),
                () = queue.ready.notified() => Wake::Answers,
                () = timer.as_mut(), if armed => Wake::Timer,
            };
            let out = BUFFERS.with(|b| {
                let mut b = b.borrow_mut();
                conn.lend_send_buffer(std::mem::take(&mut b.write));
                match wake {
                    Wake::Readable(ready) => {
                        let read = ready.and_then(|()| {
                            read_and_handle(&stream, &mut conn, &mut b.read, &mut input, &mut room)
                        });
                        if matches!(read, Ok(Some(0)) | Err(_)) {
                            return None;
                        }
                    }
                    Wake::Answers => {
                        // Whatever is ready goes out in the same write.
                        let (answers, stopping) = queue.take();
                        for (request_id, message) in answers {
                            send_answer(&mut conn, &outstanding, request_id, message, &shared);
                        }
                        if stopping {
                            conn.close_with(StatusCode::BadShutdown, "server shutting down");
                        }
                    }
                    Wake::Timer => conn.handle_timeout(now()),
                }
                handle_events(&mut conn, &shared, &queue, &outstanding);
                let mut out = Vec::new();
                conn.poll_transmit(&mut out);
                // Most writes complete at once; the buffer then goes back to
                // the thread. What does not stays with the task until sent.
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
            if conn.is_closed() {
                break;
            }
        }
        queue.close();
        shared.deregister(id, &queue);
        // Answers still running have nowhere to go.
        for r in outstanding.running.borrow().iter() {
            r.abort.abort();
        }
        let _ = stream.shutdown().await;
        tracing::debug!(channel = id, status = ?conn.close_status(), "connection closed");
    }
}

fn send_answer(
    conn: &mut ServerConnection,
    outstanding: &Outstanding,
    request_id: u32,
    message: Vec<u8>,
    shared: &Shared,
) {
    outstanding.finished(request_id);
    send_or_fault(conn, request_id, &message, shared);
}

/// Sends a response; one too large for the client's limits becomes a
/// `BadResponseTooLarge` ServiceFault.
fn send_or_fault(conn: &mut ServerConnection, request_id: u32, message: &[u8], shared: &Shared) {
    if let Err(e) = conn.send_response(request_id, message) {
        if e.status_code() == StatusCode::BadResponseTooLarge {
            let limits = &shared.channel_config.decode;
            let fault = service_fault(
                DateTime::from_system_time(SystemTime::now()),
                peek_response_handle(message, limits),
                StatusCode::BadResponseTooLarge,
            );
            let mut small = Vec::new();
            encode_message(&fault, &mut small);
            let _ = conn.send_response(request_id, &small);
        }
    }
}

/// The requestHandle of an encoded response (its ResponseHeader starts the
/// body after the encoding id, and the handle follows the timestamp).
fn peek_response_handle(message: &[u8], limits: &uascale_types::DecodeLimits) -> u32 {
    use uascale_types::{BinaryDecode, NodeId, Reader};
    let Ok(mut r) = Reader::new(message, limits) else {
        return 0;
    };
    if NodeId::decode(&mut r).is_err() || DateTime::decode(&mut r).is_err() {
        return 0;
    }
    u32::decode(&mut r).unwrap_or(0)
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
/// under a quarter.
fn read_and_handle(
    stream: &TcpStream,
    conn: &mut ServerConnection,
    buf: &mut Vec<u8>,
    pending: &mut Vec<u8>,
    room: &mut u32,
) -> io::Result<Option<usize>> {
    buf.clear();
    buf.extend_from_slice(pending);
    let want = *room as usize;
    buf.reserve(want);
    let spare = buf.capacity() - buf.len();
    let n = match stream.try_read_buf(buf) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    if n >= spare.min(want) {
        *room = (want * 2).min(MAX_READ) as u32;
    } else if n < want / 4 {
        *room = (want / 2).max(MIN_READ) as u32;
    }
    if n > 0 {
        if let Err(e) = conn.handle_input(now(), buf) {
            tracing::debug!(channel = conn.channel_id(), error = %e, "closing connection");
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

fn handle_events(
    conn: &mut ServerConnection,
    shared: &Shared,
    queue: &Arc<ConnectionSink>,
    outstanding: &Outstanding,
) {
    let sink: Arc<dyn ResponseSink> = Arc::clone(queue) as Arc<dyn ResponseSink>;
    let sink = &sink;
    let now = DateTime::from_system_time(SystemTime::now());
    let cancel = |handle: u32| outstanding.cancel(handle, sink, now);
    // Arcs inside: cheap, and frees `conn` for sending.
    let channel = conn.security().clone();
    // One clock reading for the requests that arrived together.
    let mut ctx = ServiceContext {
        config: &shared.config,
        sessions: &shared.sessions,
        channel_id: conn.channel_id(),
        now,
        instant: Instant::now(),
        address_space: &shared.address_space,
        start_time: shared.start_time,
        managers: &shared.managers,
        request_id: 0,
        sink: Some(sink),
        canceller: Some(&cancel),
        security: &shared.security,
        channel: &channel,
        subscriptions: &shared.subscriptions,
    };
    let limits = &shared.channel_config.decode;
    while let Some(event) = conn.poll_event() {
        let Event::Request { request_id, body } = event else {
            continue;
        };
        ctx.request_id = request_id;
        match dispatch(&ctx, &body, limits) {
            Dispatched::Now(response) => {
                if let Err(e) = conn.send_response(request_id, &response) {
                    if e.status_code() == StatusCode::BadResponseTooLarge {
                        let fault = service_fault(
                            ctx.now,
                            peek_request_handle(&body, limits),
                            StatusCode::BadResponseTooLarge,
                        );
                        let mut small = Vec::new();
                        encode_message(&fault, &mut small);
                        let _ = conn.send_response(request_id, &small);
                    }
                }
            }
            Dispatched::Later {
                request_handle,
                future,
            } => {
                let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let done = Arc::clone(&answered);
                let to = Arc::clone(sink);
                let task = tokio::spawn(async move {
                    let message = future.await;
                    if !done.swap(true, Ordering::AcqRel) {
                        to.send(request_id, message);
                    }
                });
                outstanding.running.borrow_mut().push(Running {
                    request_handle,
                    request_id,
                    answered,
                    abort: task.abort_handle(),
                });
            }
            Dispatched::Parked => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let config = ServerConfig {
            server: crate::config::ServerSection {
                bind: [127, 0, 0, 1].into(),
                port: 0,
                ..Default::default()
            },
            security: crate::config::SecurityConfig::none_only(),
            ..Default::default()
        };
        let server = Server::bind(config).expect("bind");
        let addr = server.local_addr().expect("address");
        let shared = Arc::clone(&server.shared);
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
        assert!(shared.connections().is_empty(), "tasks deregistered");
        // A task that registers once shutdown began closes at once.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut late = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        let (stream, peer) = listener.accept().await.expect("accept");
        tokio::spawn(serve(stream, peer, 7, shared));
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
        let config = ServerConfig {
            server: crate::config::ServerSection {
                bind: [127, 0, 0, 1].into(),
                port: 0,
                ..Default::default()
            },
            security: crate::config::SecurityConfig::none_only(),
            ..Default::default()
        };
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

    /// The state of a connection's task is multiplied by the connection
    /// count: this keeps it from growing unnoticed (an `async fn` holds
    /// every local that lives across an await, and each `select!` branch's
    /// future, inline).
    #[tokio::test]
    async fn connection_task_state_stays_small() {
        let config = ServerConfig {
            server: crate::config::ServerSection {
                bind: [127, 0, 0, 1].into(),
                port: 0,
                ..Default::default()
            },
            security: crate::config::SecurityConfig::none_only(),
            ..Default::default()
        };
        let server = Server::bind(config).expect("bind");
        let addr = server.local_addr().expect("address");
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (stream, peer) = server.listener.accept().await.expect("accept");
        let task = serve(stream, peer, 1, Arc::clone(&server.shared));
        let size = std::mem::size_of_val(&task);
        println!(
            "serve future {size} bytes; ServerConnection {} bytes",
            std::mem::size_of::<ServerConnection>()
        );
        assert!(
            size <= 700,
            "the connection task's state grew to {size} bytes"
        );
    }
}
