//! What one session or one client may make the server keep: the
//! `[quotas]` section, the per-session [`Account`] of kept bytes and
//! monitored items, and the server-wide [`Budget`] with its fair share.
//!
//! The request queue isolates one client's *requests*; these isolate what
//! a client makes the server *keep* between requests: subscriptions,
//! monitored items, notification values queued for a Publish that does not
//! come, NotificationMessages kept for Republish. A quota is checked where
//! the thing is created or queued, with the session's account at hand: no
//! walk over the other sessions. Counts go to the account (one session,
//! rarely contended); the server-wide totals the fair share is computed
//! from are moved in steps of [`SYNC_STEP`] bytes per session, so a busy
//! queue touches a shared cache line once per few kilobytes, not once per
//! value.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use uascale_types::{NodeId, StatusCode};

/// `[quotas]`: bounds per session and per client on what the server keeps
/// for them, and the memory budget of all of it. 0 is no limit for every
/// count and byte quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Quotas {
    /// Subscriptions one session may hold (`max_subscriptions_per_session`,
    /// ServerCapabilities MaxSubscriptionsPerSession); over it
    /// CreateSubscription is answered `BadTooManySubscriptions`. Default
    /// 1,000.
    pub max_subscriptions_per_session: usize,
    /// Monitored items one session may hold across its subscriptions
    /// (`max_monitored_items_per_session`); over it an item is refused
    /// `BadTooManyMonitoredItems`. Default 250,000.
    pub max_monitored_items_per_session: usize,
    /// Monitored items one client may hold across its sessions
    /// (`max_monitored_items_per_client`; a client is its certificate's
    /// thumbprint, else its ApplicationUri, else the session alone); over
    /// it `BadTooManyMonitoredItems`. Default 0 (none): without a
    /// certificate the ApplicationUri is what the client says, shared by
    /// every instance of a product and by a load generator's sessions, so
    /// a default would refuse legitimate multi-session clients; set it
    /// where clients are known (the per-session quota already keeps one
    /// session from taking the server-wide cap).
    pub max_monitored_items_per_client: usize,
    /// Bytes of notifications one session may have queued for Publish
    /// beyond each item's latest value (`max_queued_notification_bytes_per_session`,
    /// estimated from the values); over it an item queuing a value drops
    /// its oldest one first, and the value next to the gap carries the
    /// Overflow bit. Default 64 MiB.
    pub max_queued_notification_bytes_per_session: u64,
    /// Bytes of NotificationMessages one session may keep for Republish
    /// (`max_retransmission_bytes_per_session`); over it the oldest
    /// message of the subscription sending a new one is dropped (a
    /// Republish of it is `BadMessageNotAvailable`). Default 32 MiB.
    pub max_retransmission_bytes_per_session: u64,
    /// Values per second one session's monitored items may take
    /// (`max_values_per_second_per_session`, 0 = no limit), so that one
    /// session cannot spend the cores the others' samples and Publishes
    /// need. Timer-sampled items whose sampling intervals together ask for
    /// more are all sampled slower, in proportion, until they ask for this
    /// many; pushed values over it are not queued by items with a queue
    /// deeper than one (the next value such an item queues carries the
    /// Overflow bit), while items keeping only their latest value keep it
    /// as always. Default 100,000.
    pub max_values_per_second_per_session: u64,
    /// The memory budget of all kept state (`memory_budget_bytes`: queued
    /// notifications and retransmission queues of every session). Default
    /// derived: `memory_budget_percent` of the cgroup memory limit, else
    /// of physical memory ([`machine_memory`]). 0 = no budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_budget_bytes: Option<u64>,
    /// The share of the machine's memory the derived budget takes
    /// (`memory_budget_percent`, 1-100). Default 25.
    pub memory_budget_percent: u8,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            // A SCADA or MES client holds a few to a few hundred.
            max_subscriptions_per_session: 1_000,
            // A large SCADA gateway monitors some 100,000 tags in a session.
            max_monitored_items_per_session: 250_000,
            max_monitored_items_per_client: 0,
            // A client that publishes holds a few publishing intervals'
            // values; 64 MiB is some 500,000 queued doubles.
            max_queued_notification_bytes_per_session: 64 << 20,
            // 20 messages of a thousand values each per subscription of a
            // client that acknowledges are well under a megabyte.
            max_retransmission_bytes_per_session: 32 << 20,
            // 10,000 values sampled every 100 ms. A session held at it
            // (250,000 items of CurrentTime asking for 10 ms, sampled into
            // full queues of a thousand values) took about 3 % of a core
            // here.
            max_values_per_second_per_session: 100_000,
            memory_budget_bytes: None,
            memory_budget_percent: 25,
        }
    }
}

impl Quotas {
    /// The budget in bytes: `memory_budget_bytes`, or the configured
    /// percentage of `machine` (the machine's memory, when known; else no
    /// budget).
    pub fn budget_of(&self, machine: Option<u64>) -> u64 {
        match self.memory_budget_bytes {
            Some(b) => b,
            None => machine.map_or(0, |m| {
                let share = u128::from(m) * u128::from(self.memory_budget_percent.min(100)) / 100;
                u64::try_from(share).unwrap_or(u64::MAX)
            }),
        }
    }

    /// With `memory_budget_bytes` filled in from the machine under `root`
    /// ("/" in the server) when unset.
    pub fn resolved(&self, root: &Path) -> Quotas {
        let mut q = self.clone();
        q.memory_budget_bytes = Some(self.budget_of(machine_memory(root)));
        q
    }
}

/// The memory the process may use: the cgroup (v2 `memory.max`, else v1
/// `memory.limit_in_bytes`) limit under `root`, if one is set, else the
/// machine's MemTotal from `root`/proc/meminfo; the smaller of both when
/// both are known. `root` is "/" in the server, a fake tree in tests.
pub fn machine_memory(root: &Path) -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    // "max" (v2) or a page-rounded i64::MAX (v1) mean no limit.
    let cgroup = read("sys/fs/cgroup/memory.max")
        .or_else(|| read("sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&b| b > 0 && b < (1 << 60));
    let physical = read("proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    });
    match (cgroup, physical) {
        (Some(c), Some(p)) => Some(c.min(p)),
        (c, p) => c.or(p),
    }
}

/// What kept bytes are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Notifications queued in monitored items, waiting for a Publish.
    Queued = 0,
    /// NotificationMessages kept for Republish until acknowledged.
    Retransmission = 1,
}

impl Stage {
    /// Both stages.
    pub const ALL: [Stage; 2] = [Stage::Queued, Stage::Retransmission];

    /// Its metric label.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Queued => "notification_queue",
            Stage::Retransmission => "retransmission_queue",
        }
    }
}

/// Which quota refused or dropped something (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    /// `max_subscriptions_per_session`.
    SubscriptionsPerSession = 0,
    /// `max_monitored_items_per_session`.
    MonitoredItemsPerSession = 1,
    /// `max_monitored_items_per_client`.
    MonitoredItemsPerClient = 2,
    /// `max_queued_notification_bytes_per_session` (values dropped).
    QueuedBytesPerSession = 3,
    /// `max_retransmission_bytes_per_session` (messages dropped).
    RetransmissionBytesPerSession = 4,
    /// Over its fair share of the memory budget (values or messages
    /// dropped).
    BudgetShare = 5,
    /// `operation_limits.max_browse_continuation_points`.
    ContinuationPoints = 6,
    /// `max_values_per_second_per_session` (pushed values not queued).
    ValuesPerSecondPerSession = 7,
}

impl Quota {
    /// Every quota, in label order.
    pub const ALL: [Quota; 8] = [
        Quota::SubscriptionsPerSession,
        Quota::MonitoredItemsPerSession,
        Quota::MonitoredItemsPerClient,
        Quota::QueuedBytesPerSession,
        Quota::RetransmissionBytesPerSession,
        Quota::BudgetShare,
        Quota::ContinuationPoints,
        Quota::ValuesPerSecondPerSession,
    ];

    /// Its metric label.
    pub fn label(self) -> &'static str {
        match self {
            Quota::SubscriptionsPerSession => "subscriptions_per_session",
            Quota::MonitoredItemsPerSession => "monitored_items_per_session",
            Quota::MonitoredItemsPerClient => "monitored_items_per_client",
            Quota::QueuedBytesPerSession => "queued_bytes_per_session",
            Quota::RetransmissionBytesPerSession => "retransmission_bytes_per_session",
            Quota::BudgetShare => "memory_budget_share",
            Quota::ContinuationPoints => "continuation_points_per_session",
            Quota::ValuesPerSecondPerSession => "values_per_second_per_session",
        }
    }
}

/// How far a session's kept bytes move before the server-wide total is
/// told: the total is off by less than this per session, and a queue
/// touches the shared counter once per this many bytes.
pub const SYNC_STEP: u64 = 4096;

/// The server-wide side: the quotas, the budget, the kept totals and the
/// over-quota counts.
#[derive(Debug)]
pub struct Budget {
    quotas: Quotas,
    /// The budget in bytes (0: none).
    limit: u64,
    totals: [AtomicU64; 2],
    /// Accounts keeping anything: the fair share is the budget over these.
    active: AtomicUsize,
    over: [AtomicU64; 8],
    /// The last session found over its share, and what it kept (for the
    /// rate-limited log line).
    last_over: Mutex<Option<(NodeId, u64)>>,
    /// Client key -> monitored items of all its sessions.
    clients: Mutex<ClientCounts>,
}

#[derive(Debug, Default)]
struct ClientCounts {
    map: std::collections::HashMap<String, Weak<AtomicUsize>>,
    sweep_at: usize,
}

impl Default for Budget {
    /// No quota and no budget (tests, and accounts not bound yet).
    fn default() -> Self {
        Budget::new(
            Quotas {
                max_subscriptions_per_session: 0,
                max_monitored_items_per_session: 0,
                max_monitored_items_per_client: 0,
                max_queued_notification_bytes_per_session: 0,
                max_retransmission_bytes_per_session: 0,
                max_values_per_second_per_session: 0,
                memory_budget_bytes: Some(0),
                memory_budget_percent: 25,
            },
            0,
        )
    }
}

impl Budget {
    /// Quotas `quotas` under a budget of `limit` bytes (0: none).
    pub fn new(quotas: Quotas, limit: u64) -> Self {
        Budget {
            quotas,
            limit,
            totals: Default::default(),
            active: AtomicUsize::new(0),
            over: Default::default(),
            last_over: Mutex::new(None),
            clients: Mutex::default(),
        }
    }

    /// The quotas.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The budget in bytes (0: none).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes kept for `stage` by every session (each off by less than
    /// [`SYNC_STEP`]).
    pub fn kept(&self, stage: Stage) -> u64 {
        self.totals[stage as usize].load(Ordering::Relaxed)
    }

    /// Sessions keeping anything now.
    pub fn active_sessions(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// What a session may keep when the server nears its budget: the
    /// budget over the sessions keeping anything.
    pub fn fair_share(&self) -> u64 {
        self.limit / (self.active_sessions().max(1) as u64)
    }

    /// True at 90 % of the budget or more: from there the sessions over
    /// their fair share drop their oldest values.
    pub fn near(&self) -> bool {
        if self.limit == 0 {
            return false;
        }
        let kept: u64 = Stage::ALL.iter().map(|s| self.kept(*s)).sum();
        kept >= self.limit / 10 * 9
    }

    /// Counts one refusal or drop by `quota`.
    pub fn count(&self, quota: Quota) {
        self.over[quota as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals and drops by `quota` since the start.
    pub fn over_count(&self, quota: Quota) -> u64 {
        self.over[quota as usize].load(Ordering::Relaxed)
    }

    /// Takes the last session found over its fair share (what the
    /// rate-limited log line names).
    pub fn take_last_over(&self) -> Option<(NodeId, u64)> {
        self.last_over.lock().ok().and_then(|mut g| g.take())
    }

    fn note_over(&self, session: &NodeId, kept: u64) {
        // Never waits: another thread noting the same is as good.
        if let Ok(mut g) = self.last_over.try_lock() {
            *g = Some((session.clone(), kept));
        }
    }

    /// The item count of client `key`, shared by its sessions.
    fn client(&self, key: &str) -> Arc<AtomicUsize> {
        let mut c = match self.clients.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(n) = c.map.get(key).and_then(Weak::upgrade) {
            return n;
        }
        let n = Arc::new(AtomicUsize::new(0));
        c.map.insert(key.to_owned(), Arc::downgrade(&n));
        if c.map.len() > c.sweep_at {
            c.map.retain(|_, w| w.strong_count() > 0);
            c.sweep_at = (2 * c.map.len()).max(1024);
        }
        n
    }

    /// The quota on `stage` per session (0: none).
    fn stage_quota(&self, stage: Stage) -> u64 {
        match stage {
            Stage::Queued => self.quotas.max_queued_notification_bytes_per_session,
            Stage::Retransmission => self.quotas.max_retransmission_bytes_per_session,
        }
    }
}

/// The `max_values_per_second_per_session` bucket of one session's pushed
/// values: `rate` tokens a second, at most one second's worth kept.
#[derive(Debug, Clone, Default)]
pub struct ValueRate {
    tokens: f64,
    at: Option<std::time::Instant>,
}

impl ValueRate {
    /// Takes one value's token at `now`; false when the session took
    /// `rate` values in the last second already (`rate` 0: no limit).
    pub fn take(&mut self, now: std::time::Instant, rate: u64) -> bool {
        if rate == 0 {
            return true;
        }
        let rate = rate as f64;
        let elapsed = self
            .at
            .map_or(1.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// How much slower than asked a session's timer-sampled items are sampled:
/// 1 while their sampling intervals together ask for at most `rate` samples
/// a second (`rate` 0: no limit), else the factor that brings them down to
/// it (`demand` is the samples a second they ask for).
pub fn sampling_stretch(demand: f64, rate: u64) -> f64 {
    if rate == 0 || demand <= rate as f64 {
        1.0
    } else {
        // At most a million times slower (a day at 100 ms): the bound keeps
        // the arithmetic on durations finite.
        (demand / rate as f64).min(1e6)
    }
}

/// One session's kept bytes and monitored items, shared by its
/// subscriptions (and their queues) and moved with them on a transfer.
#[derive(Debug)]
pub struct Account {
    budget: Arc<Budget>,
    /// The session (named in the log line about who is over).
    session: NodeId,
    items: AtomicUsize,
    /// The client's item count, once the client is known.
    client: std::sync::OnceLock<Arc<AtomicUsize>>,
    bytes: [AtomicU64; 2],
    /// What the budget's totals have been told of `bytes`.
    reported: [AtomicU64; 2],
    active: AtomicBool,
}

impl Account {
    /// The account of `session` under `budget`.
    pub fn new(budget: Arc<Budget>, session: NodeId) -> Self {
        Account {
            budget,
            session,
            items: AtomicUsize::new(0),
            client: std::sync::OnceLock::new(),
            bytes: Default::default(),
            reported: Default::default(),
            active: AtomicBool::new(false),
        }
    }

    /// An account under no quota and no budget (a subscription not in a
    /// session's set yet, and tests).
    pub fn detached() -> Arc<Account> {
        Arc::clone(Self::detached_ref())
    }

    /// [`Account::detached`], borrowed.
    pub fn detached_ref() -> &'static Arc<Account> {
        // One for all: what counts against it is never checked.
        static DETACHED: std::sync::OnceLock<Arc<Account>> = std::sync::OnceLock::new();
        DETACHED.get_or_init(|| Arc::new(Account::new(Arc::default(), NodeId::numeric(0, 0))))
    }

    /// The budget it counts against.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Its session.
    pub fn session(&self) -> &NodeId {
        &self.session
    }

    /// Monitored items of the session.
    pub fn items(&self) -> usize {
        self.items.load(Ordering::Relaxed)
    }

    /// Bytes kept for `stage`.
    pub fn bytes(&self, stage: Stage) -> u64 {
        self.bytes[stage as usize].load(Ordering::Relaxed)
    }

    /// Bytes kept, every stage.
    pub fn kept(&self) -> u64 {
        Stage::ALL.iter().map(|s| self.bytes(*s)).sum()
    }

    /// Ties the session to client `key` (certificate thumbprint, else
    /// ApplicationUri): its items count against the client's quota from
    /// now on. Only the first call counts.
    pub fn set_client(&self, key: &str) {
        if self.client.get().is_some() {
            return;
        }
        let c = self.budget.client(key);
        if self.client.set(Arc::clone(&c)).is_ok() {
            c.fetch_add(self.items(), Ordering::AcqRel);
        }
    }

    /// Reserves one monitored item against the session's and the client's
    /// quotas: `BadTooManyMonitoredItems` over either (counted).
    pub fn reserve_item(&self) -> Result<(), StatusCode> {
        let q = &self.budget.quotas;
        let under = |max: usize| move |n: usize| (max == 0 || n < max).then_some(n + 1);
        if self
            .items
            .fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                under(q.max_monitored_items_per_session),
            )
            .is_err()
        {
            self.budget.count(Quota::MonitoredItemsPerSession);
            return Err(StatusCode::BadTooManyMonitoredItems);
        }
        if let Some(c) = self.client.get() {
            if c.fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                under(q.max_monitored_items_per_client),
            )
            .is_err()
            {
                self.items.fetch_sub(1, Ordering::AcqRel);
                self.budget.count(Quota::MonitoredItemsPerClient);
                return Err(StatusCode::BadTooManyMonitoredItems);
            }
        } else if q.max_monitored_items_per_client != 0
            && self.items() > q.max_monitored_items_per_client
        {
            // A session of no known client is a client of its own.
            self.items.fetch_sub(1, Ordering::AcqRel);
            self.budget.count(Quota::MonitoredItemsPerClient);
            return Err(StatusCode::BadTooManyMonitoredItems);
        }
        Ok(())
    }

    /// Adds `n` items without a quota check (a subscription transferred
    /// or restored in: it is not refused half way).
    pub fn adopt_items(&self, n: usize) {
        self.items.fetch_add(n, Ordering::AcqRel);
        if let Some(c) = self.client.get() {
            c.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Returns `n` items (deleted, or moved away).
    pub fn release_items(&self, n: usize) {
        let sub = |c: &AtomicUsize| {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            });
        };
        sub(&self.items);
        if let Some(c) = self.client.get() {
            sub(c);
        }
    }

    /// `n` more bytes kept for `stage`.
    pub fn add(&self, stage: Stage, n: u64) {
        if n == 0 {
            return;
        }
        let now = self.bytes[stage as usize].fetch_add(n, Ordering::Relaxed) + n;
        self.sync(stage, now);
    }

    /// `n` bytes fewer kept for `stage`.
    pub fn sub(&self, stage: Stage, n: u64) {
        if n == 0 {
            return;
        }
        let now = match self.bytes[stage as usize].fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |v| Some(v.saturating_sub(n)),
        ) {
            Ok(v) | Err(v) => v.saturating_sub(n),
        };
        self.sync(stage, now);
    }

    /// Tells the budget's total when `now` moved a step from what it was
    /// told, and keeps the count of active sessions.
    fn sync(&self, stage: Stage, now: u64) {
        let i = stage as usize;
        let told = self.reported[i].load(Ordering::Relaxed);
        if (now.abs_diff(told) >= SYNC_STEP || (now == 0 && told != 0))
            && self.reported[i]
                .compare_exchange(told, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let t = &self.budget.totals[i];
            if now > told {
                t.fetch_add(now - told, Ordering::Relaxed);
            } else {
                let _ = t.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(told - now))
                });
            }
        }
        let keeping = now > 0 || self.kept() > 0;
        if keeping != self.active.load(Ordering::Relaxed)
            && self
                .active
                .compare_exchange(!keeping, keeping, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if keeping {
                self.budget.active.fetch_add(1, Ordering::Relaxed);
            } else {
                self.budget.active.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// True when what the session keeps for `stage` must shrink before it
    /// keeps more: over the stage's quota, or over its fair share while
    /// the server nears its budget. Counted as the drop it leads to.
    pub fn must_shed(&self, stage: Stage) -> bool {
        let quota = self.budget.stage_quota(stage);
        if quota != 0 && self.bytes(stage) > quota {
            self.budget.count(match stage {
                Stage::Queued => Quota::QueuedBytesPerSession,
                Stage::Retransmission => Quota::RetransmissionBytesPerSession,
            });
            return true;
        }
        if self.budget.near() {
            let kept = self.kept();
            if kept > self.budget.fair_share() {
                self.budget.count(Quota::BudgetShare);
                self.budget.note_over(&self.session, kept);
                return true;
            }
        }
        false
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        // Whatever was still counted leaves the totals with it.
        for s in Stage::ALL {
            let told = self.reported[s as usize].load(Ordering::Relaxed);
            let _ = self.budget.totals[s as usize].fetch_update(
                Ordering::Relaxed,
                Ordering::Relaxed,
                |v| Some(v.saturating_sub(told)),
            );
        }
        if self.active.load(Ordering::Relaxed) {
            self.budget.active.fetch_sub(1, Ordering::Relaxed);
        }
        self.release_items(self.items());
    }
}

/// A queue whose entries' bytes count against a session's [`Account`]:
/// whatever enters or leaves it (pushed, dropped, drained, the queue
/// dropped with its item or subscription) moves the count, so no path
/// can forget to. It keeps no byte count of its own (an entry's estimate
/// is computed again as it leaves): it is inside every subscription and
/// every deep item queue.
#[derive(Debug)]
pub struct KeptQueue<T: KeptSize> {
    items: std::collections::VecDeque<T>,
    account: Option<Arc<Account>>,
}

/// What an entry of a [`KeptQueue`] is estimated to hold in memory.
pub trait KeptSize {
    /// The stage its queues count for.
    const STAGE: Stage;
    /// The estimate, in bytes; the same for as long as it is queued.
    fn kept_size(&self) -> u64;
}

impl<T: KeptSize> Default for KeptQueue<T> {
    fn default() -> Self {
        KeptQueue::new()
    }
}

impl<T: KeptSize> KeptQueue<T> {
    /// An empty queue, counted by no account yet.
    pub fn new() -> Self {
        KeptQueue {
            items: std::collections::VecDeque::new(),
            account: None,
        }
    }

    /// Counts the queue against `account` from now on (moving what it
    /// holds from the account it counted against, if another).
    pub fn bind(&mut self, account: &Arc<Account>) {
        if let Some(a) = &self.account {
            if Arc::ptr_eq(a, account) {
                return;
            }
        }
        let bytes = self.bytes();
        if let Some(a) = &self.account {
            a.sub(T::STAGE, bytes);
        }
        account.add(T::STAGE, bytes);
        self.account = Some(Arc::clone(account));
    }

    /// True when bound to an account.
    pub fn is_bound(&self) -> bool {
        self.account.is_some()
    }

    /// The account it counts against.
    pub fn account(&self) -> Option<&Arc<Account>> {
        self.account.as_ref()
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes held (estimated; visits every entry).
    pub fn bytes(&self) -> u64 {
        self.items.iter().map(KeptSize::kept_size).sum()
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> std::collections::vec_deque::Iter<'_, T> {
        self.items.iter()
    }

    /// The oldest entry.
    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    /// The newest entry.
    pub fn back(&self) -> Option<&T> {
        self.items.back()
    }

    /// The oldest entry, to change (its estimate must stay).
    pub fn front_mut(&mut self) -> Option<&mut T> {
        self.items.front_mut()
    }

    /// The newest entry, to change (its estimate must stay).
    pub fn back_mut(&mut self) -> Option<&mut T> {
        self.items.back_mut()
    }

    fn removed(&self, n: u64) {
        if let Some(a) = &self.account {
            a.sub(T::STAGE, n);
        }
    }

    /// Appends `v`.
    pub fn push_back(&mut self, v: T) {
        if let Some(a) = &self.account {
            a.add(T::STAGE, v.kept_size());
        }
        self.items.reserve_exact(1);
        self.items.push_back(v);
    }

    /// Puts `v` before the oldest entry.
    pub fn push_front(&mut self, v: T) {
        if let Some(a) = &self.account {
            a.add(T::STAGE, v.kept_size());
        }
        self.items.reserve_exact(1);
        self.items.push_front(v);
    }

    /// Takes the oldest entry.
    pub fn pop_front(&mut self) -> Option<T> {
        let v = self.items.pop_front()?;
        self.removed(v.kept_size());
        Some(v)
    }

    /// Takes entry `i`.
    pub fn remove(&mut self, i: usize) -> Option<T> {
        let v = self.items.remove(i)?;
        self.removed(v.kept_size());
        Some(v)
    }

    /// Takes the `n` oldest entries (all when `n` is at least the length).
    pub fn take_front(&mut self, n: usize) -> std::collections::VecDeque<T> {
        let taken = if n >= self.items.len() {
            std::mem::take(&mut self.items)
        } else {
            let rest = self.items.split_off(n);
            std::mem::replace(&mut self.items, rest)
        };
        if self.account.is_some() {
            self.removed(taken.iter().map(KeptSize::kept_size).sum());
        }
        taken
    }

    /// Lets the buffer of an empty queue go (an idle subscription keeps
    /// none).
    pub fn release_buffer(&mut self) {
        if self.items.is_empty() {
            self.items = std::collections::VecDeque::new();
        }
    }

    /// Must this queue shrink before it grows (over a quota or the fair
    /// share)? False while unbound.
    pub fn must_shed(&self) -> bool {
        self.account.as_ref().is_some_and(|a| a.must_shed(T::STAGE))
    }
}

impl<T: KeptSize + Clone> Clone for KeptQueue<T> {
    /// A copy counts against the same account (it holds as much again).
    fn clone(&self) -> Self {
        if let Some(a) = &self.account {
            a.add(T::STAGE, self.bytes());
        }
        KeptQueue {
            items: self.items.clone(),
            account: self.account.clone(),
        }
    }
}

impl<T: KeptSize> Drop for KeptQueue<T> {
    fn drop(&mut self) {
        if let Some(a) = &self.account {
            if !self.items.is_empty() {
                a.sub(T::STAGE, self.bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests;
