//! What the server counts about itself: the ServerDiagnosticsSummary
//! counters of Part 5 that are not the session table's or the
//! subscription engine's own, and every family of the Prometheus endpoint
//! (`docs/metrics.md` lists them; [`crate::scrape`] is the exposition).
//!
//! Everything here is plain relaxed atomics in fixed arrays, indexed by
//! small enums ([`Service`], [`Stage`], [`ShedReason`]): counting never
//! takes a lock, hashes a label or allocates, and labelled series exist
//! only at scrape time. The layers that own a fact call a method here from
//! their wiring point:
//!
//! | What | Who calls |
//! |---|---|
//! | requests by service and status ([`ServerMetrics::requests`]) | `dispatch` (and the fast Read path), `publish_answered` for parked Publishes |
//! | session transitions, sessions by state | the session listener of `ServerState` ([`SessionCounters::record`]) |
//! | session establishment time | ActivateSession ([`ServerMetrics::session_established`]) |
//! | connections accepted, open; channels open | `net` ([`ServerMetrics::connection_accepted`], [`ServerMetrics::channel_opened`], ...) |
//! | connections shed, busy answers, handshakes in flight | admission ([`ServerMetrics::connection_shed`], [`ServerMetrics::busy_answer`], [`ServerMetrics::handshakes_in_flight`]); ServiceFaults with a retry-after are counted by `dispatch` |
//! | authentication failures and lockouts | ActivateSession ([`ServerMetrics::auth_failure`]) |
//! | Publish responses and notifications | the subscription engine's answer observer ([`ServerMetrics::publish_answered`]) |
//!
//! The request counters are the hot path (one per request, ~0.7 us of
//! server CPU for a 1-value Read): each worker thread adds to its own
//! cache-line-aligned stripe of the table, so threads never contend on a
//! counter; a scrape sums the stripes.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use uascale_types::{
    DataChangeNotification, EventNotificationList, StatusChangeNotification, StatusCode,
};

use crate::session::SessionEvent;
use crate::subscription::Answer;

const RELAXED: Ordering = Ordering::Relaxed;

macro_rules! services {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// The service a request was for: the `service` label of
        /// `opcua_server_requests_total`. One variant per request the
        /// dispatcher decodes (its `Request::service` maps each of its
        /// variants here, so a service added there must be added here),
        /// plus [`Service::Unsupported`] and [`Service::Invalid`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Service {
            $(
                #[doc = concat!("`", $name, "`.")]
                $variant,
            )*
        }

        impl Service {
            /// Every service, in index order.
            pub const ALL: &'static [Service] = &[$(Service::$variant),*];
            /// How many there are.
            pub const COUNT: usize = Service::ALL.len();

            /// The label value: the Part 4 service name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Service::$variant => $name,)*
                }
            }
        }
    };
}

services! {
    GetEndpoints => "GetEndpoints",
    FindServers => "FindServers",
    CreateSession => "CreateSession",
    ActivateSession => "ActivateSession",
    CloseSession => "CloseSession",
    Cancel => "Cancel",
    Read => "Read",
    Write => "Write",
    HistoryRead => "HistoryRead",
    Call => "Call",
    Browse => "Browse",
    BrowseNext => "BrowseNext",
    TranslateBrowsePaths => "TranslateBrowsePathsToNodeIds",
    RegisterNodes => "RegisterNodes",
    UnregisterNodes => "UnregisterNodes",
    CreateSubscription => "CreateSubscription",
    ModifySubscription => "ModifySubscription",
    SetPublishingMode => "SetPublishingMode",
    Publish => "Publish",
    Republish => "Republish",
    DeleteSubscriptions => "DeleteSubscriptions",
    TransferSubscriptions => "TransferSubscriptions",
    CreateMonitoredItems => "CreateMonitoredItems",
    ModifyMonitoredItems => "ModifyMonitoredItems",
    SetMonitoringMode => "SetMonitoringMode",
    SetTriggering => "SetTriggering",
    DeleteMonitoredItems => "DeleteMonitoredItems",
    // A service this server does not implement (BadServiceUnsupported).
    Unsupported => "Unsupported",
    // A request that did not decode (its service is not known).
    Invalid => "Invalid",
}

/// The class of a request's service result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusClass {
    /// Good.
    Good = 0,
    /// Uncertain (no service of this server answers so; kept for the
    /// label's completeness).
    Uncertain = 1,
    /// Bad, for a reason other than security.
    Bad = 2,
    /// Bad for a security reason ([`is_security_rejection`]).
    BadSecurity = 3,
}

const CLASSES: usize = 4;

impl StatusClass {
    /// The class of `status`.
    pub fn of(status: StatusCode) -> StatusClass {
        if status.is_good() {
            StatusClass::Good
        } else if status.is_uncertain() {
            StatusClass::Uncertain
        } else if is_security_rejection(status) {
            StatusClass::BadSecurity
        } else {
            StatusClass::Bad
        }
    }

    /// The `status` label value (security rejections are `bad` too).
    pub const fn label(self) -> &'static str {
        match self {
            StatusClass::Good => "good",
            StatusClass::Uncertain => "uncertain",
            StatusClass::Bad | StatusClass::BadSecurity => "bad",
        }
    }
}

/// True for the statuses that reject a request "due to security
/// constraints" (Part 5 §12.9): what SecurityRejectedSessionCount and
/// SecurityRejectedRequestsCount count - a certificate, signature, nonce,
/// policy, channel or user-identity check failed, or the user may not do it.
pub fn is_security_rejection(status: StatusCode) -> bool {
    [
        StatusCode::BadSecurityChecksFailed,
        StatusCode::BadCertificateUriInvalid,
        StatusCode::BadNonceInvalid,
        StatusCode::BadSecurityPolicyRejected,
        StatusCode::BadSecureChannelIdInvalid,
        StatusCode::BadApplicationSignatureInvalid,
        StatusCode::BadIdentityTokenInvalid,
        StatusCode::BadIdentityTokenRejected,
        StatusCode::BadUserAccessDenied,
        StatusCode::BadUserSignatureInvalid,
    ]
    .contains(&status.code())
}

/// Stripes of the request table: each thread adds to one (threads are
/// spread over them round-robin), so no two workers of a machine with up
/// to this many threads share a counter's cache line.
const STRIPES: usize = 16;

/// One thread's part of the request table, on cache lines of its own.
#[repr(align(128))]
struct Stripe([[AtomicU64; CLASSES]; Service::COUNT]);

impl Default for Stripe {
    fn default() -> Self {
        Stripe(std::array::from_fn(|_| {
            std::array::from_fn(|_| AtomicU64::new(0))
        }))
    }
}

/// The stripe of the calling thread.
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, RELAXED) % STRIPES;
            s.set(i);
        }
        i
    })
}

/// Bad service results by status code: indexed by the code's 12-bit
/// SubCode (bits 16..28), so any code has its counter without a map.
const SUB_CODES: usize = 1 << 12;

fn sub_code(status: StatusCode) -> usize {
    ((status.bits() >> 16) & 0x0FFF) as usize
}

/// Requests answered, by service and [`StatusClass`], and the Bad ones by
/// status code. The count of one request is one relaxed add to the
/// calling thread's stripe (plus one for a Bad answer's code).
pub struct RequestCounters {
    stripes: Box<[Stripe]>,
    by_code: Box<[AtomicU64]>,
}

impl Default for RequestCounters {
    fn default() -> Self {
        RequestCounters {
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            by_code: (0..SUB_CODES).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl std::fmt::Debug for RequestCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestCounters")
            .field("rejected", &self.rejected())
            .finish_non_exhaustive()
    }
}

impl RequestCounters {
    /// Counts a request of `service` answered Good.
    #[inline]
    pub fn good(&self, service: Service) {
        self.stripes[stripe()].0[service as usize][StatusClass::Good as usize]
            .fetch_add(1, RELAXED);
    }

    /// Counts a request of `service` answered with service result `status`.
    pub fn record(&self, service: Service, status: StatusCode) {
        let class = StatusClass::of(status);
        self.stripes[stripe()].0[service as usize][class as usize].fetch_add(1, RELAXED);
        if status.is_bad() {
            self.by_code[sub_code(status)].fetch_add(1, RELAXED);
        }
    }

    /// Requests of `service` answered in `class` so far.
    pub fn count(&self, service: Service, class: StatusClass) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0[service as usize][class as usize].load(RELAXED))
            .sum()
    }

    fn sum_class(&self, class: StatusClass) -> u64 {
        Service::ALL.iter().map(|s| self.count(*s, class)).sum()
    }

    /// Requests of any service answered with a Bad service result (Part 5
    /// RejectedRequestsCount; includes the security rejections).
    pub fn rejected(&self) -> u64 {
        self.sum_class(StatusClass::Bad) + self.sum_class(StatusClass::BadSecurity)
    }

    /// The part of [`RequestCounters::rejected`] rejected for security
    /// reasons (SecurityRejectedRequestsCount).
    pub fn security_rejected(&self) -> u64 {
        self.sum_class(StatusClass::BadSecurity)
    }

    /// Every Bad service result answered so far with its count (codes
    /// never answered are left out).
    pub fn errors(&self) -> Vec<(StatusCode, u64)> {
        self.by_code
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let n = c.load(RELAXED);
                (n > 0).then(|| (StatusCode::from_u32(0x8000_0000 | ((i as u32) << 16)), n))
            })
            .collect()
    }
}

/// Where admission turned something away, or answered busy: the `stage`
/// label. Add a variant when a stage needs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// At accept, before any byte is read (rate limits, open files;
    /// `admission::Stage::Accept`).
    Accept,
    /// The secure channel count.
    Channel,
    /// Concurrent OpenSecureChannel handshakes (asymmetric work).
    Handshake,
    /// Session establishment (CreateSession, ActivateSession, the session
    /// count; `admission::Stage::Establishment`).
    Establishment,
    /// An ordinary request (the request queue).
    Request,
}

impl Stage {
    /// Every stage, in index order.
    pub const ALL: [Stage; 5] = [
        Stage::Accept,
        Stage::Channel,
        Stage::Handshake,
        Stage::Establishment,
        Stage::Request,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Accept => "accept",
            Stage::Channel => "channel",
            Stage::Handshake => "handshake",
            Stage::Establishment => "establishment",
            Stage::Request => "request",
        }
    }
}

/// Why a connection was shed: the `reason` label. Add a variant when a
/// stage needs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// The listener's overall connection-rate bucket was empty.
    Rate,
    /// The connecting address's own rate bucket was empty.
    AddressRate,
    /// Too few file descriptors left.
    OpenFiles,
    /// The secure channel limit, with nothing to evict.
    ChannelLimit,
    /// An idle channel without a session was evicted for a newer one.
    Evicted,
    /// Too many OpenSecureChannel handshakes in flight.
    HandshakeLimit,
    /// Too many sessions being established at once.
    EstablishmentLimit,
    /// `max_session_count` sessions open.
    SessionLimit,
    /// A queue in front of the work was full.
    QueueFull,
}

impl ShedReason {
    /// Every reason, in index order.
    pub const ALL: [ShedReason; 9] = [
        ShedReason::Rate,
        ShedReason::AddressRate,
        ShedReason::OpenFiles,
        ShedReason::ChannelLimit,
        ShedReason::Evicted,
        ShedReason::HandshakeLimit,
        ShedReason::EstablishmentLimit,
        ShedReason::SessionLimit,
        ShedReason::QueueFull,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            ShedReason::Rate => "rate",
            ShedReason::AddressRate => "address_rate",
            ShedReason::OpenFiles => "open_files",
            ShedReason::ChannelLimit => "channel_limit",
            ShedReason::Evicted => "evicted",
            ShedReason::HandshakeLimit => "handshake_limit",
            ShedReason::EstablishmentLimit => "establishment_limit",
            ShedReason::SessionLimit => "session_limit",
            ShedReason::QueueFull => "queue_full",
        }
    }
}

const STAGES: usize = Stage::ALL.len();
const REASONS: usize = ShedReason::ALL.len();

/// Upper bounds (seconds) of the session establishment histogram: a None
/// session takes well under a millisecond of server time, an RSA one a few
/// milliseconds; the client's own ActivateSession work and round trips
/// come on top.
pub const ESTABLISHMENT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) of the retry-after hint histogram.
pub const RETRY_AFTER_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// A histogram of durations with fixed bucket bounds: relaxed atomics, no
/// lock.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, and the last for +Inf (not cumulative).
    buckets: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

/// A [`Histogram`] read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Sum of the observations, seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
    /// (upper bound, observations in this bucket alone); the last bound is
    /// `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// An empty histogram with these upper bounds (seconds, ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, RELAXED);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, RELAXED);
    }

    /// The histogram now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.buckets.iter().map(|b| b.load(RELAXED)))
            .collect();
        HistogramSnapshot {
            sum: self.sum_nanos.load(RELAXED) as f64 / 1e9,
            count: buckets.iter().map(|(_, n)| n).sum(),
            buckets,
        }
    }
}

/// Every counter of the server (owned by
/// [`ServerState`](crate::state::ServerState), shared with the
/// subscription engine's answer observer).
#[derive(Debug)]
pub struct ServerMetrics {
    /// Session transitions and sessions by state.
    pub sessions: SessionCounters,
    /// Requests by service and status.
    pub requests: RequestCounters,
    accepted: AtomicU64,
    connections_open: AtomicI64,
    shed: [[AtomicU64; REASONS]; STAGES],
    accept_pauses: AtomicU64,
    channels_open: AtomicI64,
    handshakes: AtomicI64,
    busy: [Histogram; STAGES],
    establishment: Histogram,
    auth_failures: AtomicU64,
    auth_lockouts: AtomicU64,
    auth_locked_out: AtomicU64,
    publish_notifying: AtomicU64,
    publish_keep_alive: AtomicU64,
    /// Data changes, events, status changes.
    notifications: [AtomicU64; 3],
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics {
            sessions: SessionCounters::default(),
            requests: RequestCounters::default(),
            accepted: AtomicU64::new(0),
            connections_open: AtomicI64::new(0),
            shed: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            accept_pauses: AtomicU64::new(0),
            channels_open: AtomicI64::new(0),
            handshakes: AtomicI64::new(0),
            busy: std::array::from_fn(|_| Histogram::new(RETRY_AFTER_BUCKETS)),
            establishment: Histogram::new(ESTABLISHMENT_BUCKETS),
            auth_failures: AtomicU64::new(0),
            auth_lockouts: AtomicU64::new(0),
            auth_locked_out: AtomicU64::new(0),
            publish_notifying: AtomicU64::new(0),
            publish_keep_alive: AtomicU64::new(0),
            notifications: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The kinds of notification a Publish response carries (the `type` label
/// of `opcua_server_notifications_total`).
pub const NOTIFICATION_TYPES: [&str; 3] = ["data_change", "event", "status_change"];

impl ServerMetrics {
    /// The listener accepted a TCP connection (before admission decides).
    pub fn connection_accepted(&self) {
        self.accepted.fetch_add(1, RELAXED);
        self.connections_open.fetch_add(1, RELAXED);
    }

    /// A connection's task ended (the pair of
    /// [`ServerMetrics::connection_accepted`]).
    pub fn connection_closed(&self) {
        self.connections_open.fetch_sub(1, RELAXED);
    }

    /// Admission refused a connection at `stage` for `reason` (call once
    /// per connection; a busy ERR with a hint is also a
    /// [`ServerMetrics::busy_answer`]).
    pub fn connection_shed(&self, stage: Stage, reason: ShedReason) {
        self.shed[stage as usize][reason as usize].fetch_add(1, RELAXED);
    }

    /// The listener paused accepting because descriptors ran out (EMFILE
    /// and friends).
    pub fn accept_paused(&self) {
        self.accept_pauses.fetch_add(1, RELAXED);
    }

    /// A secure channel opened (OpenSecureChannel Issue succeeded).
    pub fn channel_opened(&self) {
        self.channels_open.fetch_add(1, RELAXED);
    }

    /// A secure channel that had opened is gone.
    pub fn channel_closed(&self) {
        self.channels_open.fetch_sub(1, RELAXED);
    }

    /// Changes the number of OpenSecureChannel handshakes in flight by
    /// `delta` (+1 when one starts, -1 when it ends either way).
    pub fn handshakes_in_flight(&self, delta: i64) {
        self.handshakes.fetch_add(delta, RELAXED);
    }

    /// A busy answer went out at `stage` with the retry-after `hint` (an
    /// ERR `BadTcpServerTooBusy` with `RetryAfterMs`, or a ServiceFault with
    /// the header; the dispatcher counts the ServiceFaults itself).
    pub fn busy_answer(&self, stage: Stage, hint: Duration) {
        self.busy[stage as usize].observe(hint);
    }

    /// A session's first ActivateSession succeeded `took` after its
    /// CreateSession.
    pub fn session_established(&self, took: Duration) {
        self.establishment.observe(took);
    }

    /// The server closed a session for an error (Part 5 SessionAbortCount).
    /// Nothing does so today: a session whose channel is gone stays until
    /// it times out, and counts as a timeout.
    pub fn session_aborted(&self) {
        self.sessions.aborted.fetch_add(1, RELAXED);
    }

    /// An authentication failed (a user token or a signature did not
    /// verify); `lockout` when this failure locked its client out.
    pub fn auth_failure(&self, lockout: bool) {
        self.auth_failures.fetch_add(1, RELAXED);
        if lockout {
            self.auth_lockouts.fetch_add(1, RELAXED);
        }
    }

    /// An ActivateSession was refused because its client is locked out.
    pub fn auth_refused_locked_out(&self) {
        self.auth_locked_out.fetch_add(1, RELAXED);
    }

    /// A Publish response went out carrying these notifications (all 0: a
    /// keep-alive).
    pub fn publish_sent(&self, data_changes: u64, events: u64, status_changes: u64) {
        if data_changes + events + status_changes == 0 {
            self.publish_keep_alive.fetch_add(1, RELAXED);
        } else {
            self.publish_notifying.fetch_add(1, RELAXED);
        }
        for (c, n) in self
            .notifications
            .iter()
            .zip([data_changes, events, status_changes])
        {
            if n > 0 {
                c.fetch_add(n, RELAXED);
            }
        }
    }

    /// Counts how the subscription engine answered a parked Publish: as a
    /// Publish request by its status, and a response by what it carries.
    pub fn publish_answered(&self, answer: &Answer) {
        match answer {
            Answer::Publish(p) => {
                self.requests.good(Service::Publish);
                let (mut data, mut events, mut status) = (0u64, 0u64, 0u64);
                for n in p
                    .notification_message
                    .notification_data
                    .as_deref()
                    .unwrap_or(&[])
                {
                    if let Some(d) = n.downcast_ref::<DataChangeNotification>() {
                        data += d.monitored_items.as_ref().map_or(0, |v| v.len() as u64);
                    } else if let Some(e) = n.downcast_ref::<EventNotificationList>() {
                        events += e.events.as_ref().map_or(0, |v| v.len() as u64);
                    } else if n.downcast_ref::<StatusChangeNotification>().is_some() {
                        status += 1;
                    }
                }
                self.publish_sent(data, events, status);
            }
            Answer::Fault { status, .. } => self.requests.record(Service::Publish, *status),
        }
    }

    /// TCP connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(RELAXED)
    }

    /// Connection tasks running now.
    pub fn connections_open(&self) -> i64 {
        self.connections_open.load(RELAXED)
    }

    /// Connections shed at `stage` for `reason` so far.
    pub fn connections_shed(&self, stage: Stage, reason: ShedReason) -> u64 {
        self.shed[stage as usize][reason as usize].load(RELAXED)
    }

    /// Accept pauses so far.
    pub fn accept_pauses(&self) -> u64 {
        self.accept_pauses.load(RELAXED)
    }

    /// Secure channels open now.
    pub fn channels_open(&self) -> i64 {
        self.channels_open.load(RELAXED)
    }

    /// OpenSecureChannel handshakes in flight now.
    pub fn handshakes(&self) -> i64 {
        self.handshakes.load(RELAXED)
    }

    /// The retry-after hints of the busy answers at `stage` (its count is
    /// the number of busy answers).
    pub fn busy_answers(&self, stage: Stage) -> HistogramSnapshot {
        self.busy[stage as usize].snapshot()
    }

    /// Session establishment times.
    pub fn establishment(&self) -> HistogramSnapshot {
        self.establishment.snapshot()
    }

    /// (failures, lockouts, refusals while locked out) so far.
    pub fn auth_counts(&self) -> (u64, u64, u64) {
        (
            self.auth_failures.load(RELAXED),
            self.auth_lockouts.load(RELAXED),
            self.auth_locked_out.load(RELAXED),
        )
    }

    /// (Publish responses with notifications, keep-alives) so far.
    pub fn publish_responses(&self) -> (u64, u64) {
        (
            self.publish_notifying.load(RELAXED),
            self.publish_keep_alive.load(RELAXED),
        )
    }

    /// Notifications sent so far, by [`NOTIFICATION_TYPES`].
    pub fn notifications(&self) -> [u64; 3] {
        std::array::from_fn(|i| self.notifications[i].load(RELAXED))
    }
}

/// Session transitions counted since start, and sessions by state now.
#[derive(Debug, Default)]
pub struct SessionCounters {
    created: AtomicU64,
    activated: AtomicU64,
    moved: AtomicU64,
    closed: AtomicU64,
    timed_out: AtomicU64,
    orphaned: AtomicU64,
    aborted: AtomicU64,
    restored: AtomicU64,
    establishing: AtomicI64,
    active: AtomicI64,
}

/// A copy of [`SessionCounters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounts {
    /// Sessions created (CreateSession succeeded).
    pub created: u64,
    /// First activations.
    pub activated: u64,
    /// Activations on another channel (reconnects, takeovers).
    pub moved: u64,
    /// Sessions closed by CloseSession.
    pub closed: u64,
    /// Activated sessions closed after their timeout passed without a request.
    pub timed_out: u64,
    /// Sessions closed at the activation deadline without ever being
    /// activated (orphans of a client that gave up or retried).
    pub orphaned: u64,
    /// Sessions closed by the server for an error
    /// ([`ServerMetrics::session_aborted`]).
    pub aborted: u64,
    /// Sessions taken over from another cluster node (restored from the
    /// store; docs/cluster.md).
    pub restored: u64,
    /// Sessions created and not yet activated, now.
    pub establishing: i64,
    /// Activated sessions, now.
    pub active: i64,
}

impl SessionCounters {
    /// Counts `event`.
    pub fn record(&self, event: &SessionEvent) {
        let (counter, establishing, active) = match event {
            SessionEvent::Created { .. } => (&self.created, 1, 0),
            SessionEvent::Activated { .. } => (&self.activated, -1, 1),
            SessionEvent::Moved { .. } => (&self.moved, 0, 0),
            SessionEvent::Restored { .. } => (&self.restored, 0, 1),
            SessionEvent::Closed {
                activated: true, ..
            } => (&self.closed, 0, -1),
            SessionEvent::Closed {
                activated: false, ..
            } => (&self.closed, -1, 0),
            SessionEvent::TimedOut {
                activated: true, ..
            } => (&self.timed_out, 0, -1),
            SessionEvent::TimedOut {
                activated: false, ..
            } => (&self.orphaned, -1, 0),
            _ => return,
        };
        counter.fetch_add(1, RELAXED);
        if establishing != 0 {
            self.establishing.fetch_add(establishing, RELAXED);
        }
        if active != 0 {
            self.active.fetch_add(active, RELAXED);
        }
    }

    /// The counts now.
    pub fn snapshot(&self) -> SessionCounts {
        let get = |c: &AtomicU64| c.load(RELAXED);
        SessionCounts {
            created: get(&self.created),
            activated: get(&self.activated),
            moved: get(&self.moved),
            closed: get(&self.closed),
            timed_out: get(&self.timed_out),
            orphaned: get(&self.orphaned),
            aborted: get(&self.aborted),
            restored: get(&self.restored),
            establishing: self.establishing.load(RELAXED),
            active: self.active.load(RELAXED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::NodeId;

    #[test]
    fn each_transition_has_its_counter_and_orphans_are_apart() {
        let c = SessionCounters::default();
        let id = NodeId::ns0(1);
        for e in [
            SessionEvent::Created {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Created {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Activated {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Reactivated {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Moved {
                session_id: id.clone(),
                from: 1,
                to: 2,
            },
            SessionEvent::TimedOut {
                session_id: id.clone(),
                channel_id: 2,
                activated: false,
            },
            SessionEvent::Created {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::Activated {
                session_id: id.clone(),
                channel_id: 1,
            },
            SessionEvent::TimedOut {
                session_id: id.clone(),
                channel_id: 2,
                activated: true,
            },
            SessionEvent::Closed {
                session_id: id.clone(),
                channel_id: 2,
                activated: true,
                delete_subscriptions: true,
            },
        ] {
            c.record(&e);
        }
        assert_eq!(
            c.snapshot(),
            SessionCounts {
                created: 3,
                activated: 2,
                moved: 1,
                closed: 1,
                timed_out: 1,
                orphaned: 1,
                aborted: 0,
                restored: 0,
                establishing: 0,
                active: 0,
            }
        );
        c.record(&SessionEvent::Created {
            session_id: id.clone(),
            channel_id: 1,
        });
        assert_eq!(c.snapshot().establishing, 1);
    }

    #[test]
    fn requests_are_counted_by_service_and_class_across_threads() {
        let r = std::sync::Arc::new(RequestCounters::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = std::sync::Arc::clone(&r);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        r.good(Service::Read);
                    }
                    r.record(Service::Read, StatusCode::BadSessionIdInvalid);
                    r.record(Service::ActivateSession, StatusCode::BadUserAccessDenied);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(r.count(Service::Read, StatusClass::Good), 4000);
        assert_eq!(r.count(Service::Read, StatusClass::Bad), 4);
        assert_eq!(
            r.count(Service::ActivateSession, StatusClass::BadSecurity),
            4
        );
        assert_eq!(r.rejected(), 8);
        assert_eq!(r.security_rejected(), 4);
        let mut errors = r.errors();
        errors.sort_by_key(|(s, _)| s.bits());
        assert_eq!(
            errors,
            [
                (StatusCode::BadUserAccessDenied, 4),
                (StatusCode::BadSessionIdInvalid, 4)
            ]
        );
    }

    #[test]
    fn publish_answers_count_as_requests_responses_and_notifications() {
        use uascale_types as t;
        let m = ServerMetrics::default();
        let publish = |data: Vec<t::ExtensionObject>| {
            Answer::Publish(Box::new(t::PublishResponse {
                notification_message: t::NotificationMessage {
                    notification_data: Some(data),
                    ..Default::default()
                },
                ..Default::default()
            }))
        };
        m.publish_answered(&publish(vec![
            t::ExtensionObject::new(t::DataChangeNotification {
                monitored_items: Some(vec![Default::default(); 2]),
                diagnostic_infos: None,
            }),
            t::ExtensionObject::new(t::EventNotificationList {
                events: Some(vec![Default::default(); 3]),
            }),
            t::ExtensionObject::new(t::StatusChangeNotification::default()),
        ]));
        m.publish_answered(&publish(vec![]));
        m.publish_answered(&Answer::Fault {
            request_handle: 1,
            status: StatusCode::BadTooManyPublishRequests,
        });
        assert_eq!(m.publish_responses(), (1, 1));
        assert_eq!(m.notifications(), [2, 3, 1]);
        assert_eq!(m.requests.count(Service::Publish, StatusClass::Good), 2);
        assert_eq!(m.requests.count(Service::Publish, StatusClass::Bad), 1);
        assert_eq!(
            m.requests.errors(),
            [(StatusCode::BadTooManyPublishRequests, 1)]
        );
    }

    #[test]
    fn histogram_buckets_hold_each_observation_once() {
        let h = Histogram::new(&[0.01, 0.1]);
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(10));
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_secs(2));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert!((s.sum - 2.065).abs() < 1e-9, "{}", s.sum);
        assert_eq!(s.buckets, [(0.01, 2), (0.1, 1), (f64::INFINITY, 1)]);
    }

    #[test]
    fn service_names_are_unique() {
        let mut names: Vec<_> = Service::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Service::COUNT);
        assert_eq!(Service::ALL[Service::Invalid as usize], Service::Invalid);
    }
}
