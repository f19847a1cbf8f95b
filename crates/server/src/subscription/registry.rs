//! The server's subscriptions: one [`SubscriptionSet`] per session behind
//! its own lock, found by session id or by subscription id, one deadline
//! heap for all their timers, and an index from node to the items a value
//! push must reach. No tokio: `net/` sleeps until [`Registry::next_deadline`]
//! and calls [`Registry::run_due`]; `wake` tells it a deadline moved
//! earlier.
//!
//! Locks nest only one way: a set's lock, then the heap, the watcher index
//! or the shared targets (CreateMonitoredItems watches and interns under
//! the set's lock; none of those three takes another lock). The maps are
//! sharded so that thousands of sessions creating, publishing and being
//! notified do not queue behind one lock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use uascale_types::{DataValue, NodeId, StatusCode, SubscriptionAcknowledgement, Variant};

use super::item::{pushed_value, ItemTarget};
use super::{
    next_sequence_number, Answer, Now, Reply, Requested, Revised, Subscription, SubscriptionLimits,
    SubscriptionSet, GOOD_SUBSCRIPTION_TRANSFERRED,
};
use crate::fxhash::FxHashMap;
use crate::quota::{Account, Budget, Quota, Quotas, Stage};

/// Where an answered Publish goes (the connection's outbound queue, in the
/// server; a test's list, in tests).
pub trait PublishSink: Send + 'static {
    /// Sends the answer; false when the client is gone.
    fn deliver(self, answer: Answer) -> bool;
}

/// A [`PublishSink`] behind a box, so the registry need not know the
/// connection type.
pub trait DynSink: Send + 'static {
    /// [`PublishSink::deliver`] through the box.
    fn deliver_boxed(self: Box<Self>, answer: Answer) -> bool;
}

impl<T: PublishSink> DynSink for T {
    fn deliver_boxed(self: Box<Self>, answer: Answer) -> bool {
        (*self).deliver(answer)
    }
}

impl PublishSink for Box<dyn DynSink> {
    fn deliver(self, answer: Answer) -> bool {
        self.deliver_boxed(answer)
    }
}

/// A session's set, shared.
pub type SetRef<P> = Arc<Mutex<SubscriptionSet<P>>>;

const SHARDS: usize = 32;

/// (node, attribute) -> the (subscription, item) pairs a push reaches.
type Watched = FxHashMap<(NodeId, u32), Vec<(u32, u32)>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert/remove or a state
    // step that leaves the set consistent, so a poisoned lock stays usable.
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

struct Entry<P> {
    at: Instant,
    seq: u64,
    set: Weak<Mutex<SubscriptionSet<P>>>,
}

impl<P> PartialEq for Entry<P> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<P> Eq for Entry<P> {}
impl<P> PartialOrd for Entry<P> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<P> Ord for Entry<P> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Owner<P> {
    session: NodeId,
    set: SetRef<P>,
}

/// The counting part of a subscription id (the top byte is the node's).
const ID_COUNTER_MASK: u32 = 0x00FF_FFFF;

/// Every subscription of the server.
pub struct Registry<P> {
    /// The configured bounds.
    pub limits: SubscriptionLimits,
    sessions: Vec<Mutex<FxHashMap<NodeId, SetRef<P>>>>,
    owners: Vec<Mutex<FxHashMap<u32, Owner<P>>>>,
    watched: RwLock<Watched>,
    heap: Mutex<BinaryHeap<Reverse<Entry<P>>>>,
    seq: AtomicU64,
    next_id: AtomicU32,
    /// This node's index, the top byte of every subscription id it makes.
    node_index: std::sync::atomic::AtomicU8,
    subscription_count: AtomicUsize,
    cumulated: AtomicUsize,
    item_count: AtomicUsize,
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Hears every answer to a parked Publish before it is delivered.
    observer: OnceLock<AnswerObserver>,
    diagnostics: Mutex<Option<(Instant, Variant)>>,
    /// The last PublishingIntervalCount and when it was counted.
    intervals: Mutex<Option<(Instant, usize)>>,
    /// What items watch, one shared copy each ([`Registry::intern_target`]).
    targets: Mutex<Targets>,
    /// The `[quotas]` and the memory budget every session's account
    /// counts against.
    budget: Arc<Budget>,
    /// When the last line about sessions over their share was logged, and
    /// the drops counted then (the line is rate-limited).
    over_logged: Mutex<(Option<Instant>, u64)>,
    /// Set by [`Registry::hold`]: nothing is published any more.
    held: std::sync::atomic::AtomicBool,
}

/// How often at most the line about sessions over a quota or their share
/// of the memory budget is logged.
pub const OVER_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// One session's kept state, for the top list ([`Registry::top_kept`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KeptRow {
    /// The session.
    pub session: NodeId,
    /// Its monitored items.
    pub items: usize,
    /// Bytes of notifications queued for Publish.
    pub queued_bytes: u64,
    /// Bytes of NotificationMessages kept for Republish.
    pub retransmission_bytes: u64,
}

/// The shared [`ItemTarget`]s: held weakly, so a target no item watches any
/// more is dropped; dead entries are swept when the map has doubled.
#[derive(Default)]
struct Targets {
    map: FxHashMap<ItemTarget, Weak<ItemTarget>>,
    sweep_at: usize,
}

/// What [`Registry::observe_answers`] takes: called with each answer to a
/// parked Publish (the server's counters).
pub type AnswerObserver = Box<dyn Fn(&Answer) + Send + Sync>;

impl<P> std::fmt::Debug for Registry<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field(
                "subscriptions",
                &self.subscription_count.load(Ordering::Relaxed),
            )
            .field("monitored_items", &self.item_count.load(Ordering::Relaxed))
            .finish()
    }
}

fn shard_of_node(n: &NodeId) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = crate::fxhash::FxHasher::default();
    n.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

impl<P: PublishSink> Registry<P> {
    /// An empty registry with these limits, no quota and no memory budget.
    pub fn new(limits: SubscriptionLimits) -> Self {
        Self::with_budget(limits, Arc::default())
    }

    /// An empty registry with these limits, the quotas `quotas` and a
    /// memory budget of `budget_bytes` (0: none).
    pub fn with_quotas(limits: SubscriptionLimits, quotas: Quotas, budget_bytes: u64) -> Self {
        Self::with_budget(limits, Arc::new(Budget::new(quotas, budget_bytes)))
    }

    fn with_budget(limits: SubscriptionLimits, budget: Arc<Budget>) -> Self {
        Registry {
            limits,
            sessions: (0..SHARDS).map(|_| Mutex::default()).collect(),
            owners: (0..SHARDS).map(|_| Mutex::default()).collect(),
            watched: RwLock::default(),
            heap: Mutex::default(),
            seq: AtomicU64::new(0),
            next_id: AtomicU32::new(1),
            node_index: std::sync::atomic::AtomicU8::new(0),
            subscription_count: AtomicUsize::new(0),
            cumulated: AtomicUsize::new(0),
            item_count: AtomicUsize::new(0),
            wake: OnceLock::new(),
            observer: OnceLock::new(),
            diagnostics: Mutex::new(None),
            intervals: Mutex::new(None),
            targets: Mutex::new(Targets::default()),
            budget,
            over_logged: Mutex::new((None, 0)),
            held: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on no Publish request is answered with a
    /// NotificationMessage (nor a keep-alive): each is parked with its
    /// acknowledgements applied ([`SubscriptionSet::park`]; the caller has
    /// stopped the publishing timers). A
    /// draining cluster node holds it before it writes its final records,
    /// so that what they say the clients were sent - sequence numbers and
    /// the values still queued - stays true until its channels close.
    pub fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// True once [`Registry::hold`] was called.
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// The quotas, the memory budget and what is kept against it.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Ties `session` to client `key` (certificate thumbprint, else
    /// ApplicationUri) for `quotas.max_monitored_items_per_client`; a
    /// session never tied is a client of its own. Only the first call per
    /// session counts.
    pub fn identify(&self, session: &NodeId, key: &str) {
        let set = self.set_or_new(session);
        let account = Arc::clone(lock(&set).account());
        account.set_client(key);
    }

    /// The `n` sessions keeping the most bytes (queued notifications and
    /// retained messages), most first. Visits every session: for the
    /// diagnostics view and the log line, never per notification.
    pub fn top_kept(&self, n: usize) -> Vec<KeptRow> {
        let mut rows: Vec<KeptRow> = Vec::new();
        for shard in &self.sessions {
            let sets: Vec<SetRef<P>> = lock(shard).values().cloned().collect();
            for set in sets {
                let a = Arc::clone(lock(&set).account());
                rows.push(KeptRow {
                    session: a.session().clone(),
                    items: a.items(),
                    queued_bytes: a.bytes(Stage::Queued),
                    retransmission_bytes: a.bytes(Stage::Retransmission),
                });
            }
        }
        rows.sort_by_key(|r| std::cmp::Reverse(r.queued_bytes + r.retransmission_bytes));
        rows.truncate(n);
        rows
    }

    /// Logs, at most once per [`OVER_LOG_INTERVAL`], that values or
    /// messages were dropped for a quota or the budget since the last
    /// line, naming the last session found over its share.
    fn log_over(&self, now: Instant) {
        let b = &self.budget;
        let dropped = [
            Quota::QueuedBytesPerSession,
            Quota::RetransmissionBytesPerSession,
            Quota::BudgetShare,
        ]
        .iter()
        .map(|q| b.over_count(*q))
        .sum::<u64>();
        let Ok(mut logged) = self.over_logged.try_lock() else {
            return;
        };
        if dropped == logged.1
            || logged
                .0
                .is_some_and(|t| now.saturating_duration_since(t) < OVER_LOG_INTERVAL)
        {
            return;
        }
        let since = dropped - logged.1;
        *logged = (Some(now), dropped);
        drop(logged);
        let kept = b.kept(Stage::Queued) + b.kept(Stage::Retransmission);
        match b.take_last_over() {
            Some((session, bytes)) => tracing::warn!(
                dropped = since,
                kept_bytes = kept,
                budget_bytes = b.limit(),
                fair_share_bytes = b.fair_share(),
                %session,
                session_kept_bytes = bytes,
                "memory budget: sessions over their fair share lose their oldest queued \
                 values and messages (Overflow bit set); the last one over is named"
            ),
            None => tracing::warn!(
                dropped = since,
                kept_bytes = kept,
                "quotas: sessions over their queued or retransmission bytes quota lose their \
                 oldest values and messages (Overflow bit set)"
            ),
        }
    }

    /// Sets this node's index: every subscription id made from now on
    /// carries it in its top byte (the low 24 bits count), so the nodes of
    /// a cluster serving one address space never hand out the same id.
    /// Default 0.
    pub fn set_node_index(&self, index: u8) {
        self.node_index.store(index, Ordering::Relaxed);
    }

    /// The counter (the low 24 bits) the next subscription id is made
    /// from.
    pub fn id_counter(&self) -> u32 {
        self.next_id.load(Ordering::Relaxed) & ID_COUNTER_MASK
    }

    /// Makes the counter go on from `start` (its low 24 bits; 0 is
    /// skipped): a cluster node seeds it from the range the store
    /// reserved for this process.
    pub fn seed_ids(&self, start: u32) {
        self.next_id
            .store((start & ID_COUNTER_MASK).max(1), Ordering::Relaxed);
    }

    /// Sets the function called when a deadline earlier than every other
    /// is scheduled (the timer task's wake-up). Only the first call counts.
    pub fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        let _ = self.wake.set(wake);
    }

    /// Sets the function that hears every answer to a parked Publish (a
    /// PublishResponse or a fault), before it is delivered. Only the first
    /// call counts.
    pub fn observe_answers(&self, observer: AnswerObserver) {
        let _ = self.observer.set(observer);
    }

    /// Part 5 PublishingIntervalCount: the number of distinct publishing
    /// intervals of the subscriptions in the server now (with those
    /// waiting for a transfer). Counted when asked for, at most once a
    /// second (docs/scalability.md §5): it visits every subscription.
    pub fn publishing_interval_count(&self, now: Instant) -> usize {
        let mut cache = lock(&self.intervals);
        if let Some((counted, n)) = *cache {
            if now.saturating_duration_since(counted) < std::time::Duration::from_secs(1) {
                return n;
            }
        }
        let mut sets: Vec<(u32, SetRef<P>)> = Vec::new();
        for shard in &self.owners {
            sets.extend(lock(shard).iter().map(|(id, o)| (*id, Arc::clone(&o.set))));
        }
        let mut intervals = std::collections::HashSet::new();
        for (id, set) in sets {
            if let Some(s) = lock(&set).get(id) {
                intervals.insert(s.interval);
            }
        }
        *cache = Some((now, intervals.len()));
        intervals.len()
    }

    /// Subscriptions in the server.
    pub fn subscription_count(&self) -> usize {
        self.subscription_count.load(Ordering::Relaxed)
    }

    /// Subscriptions created since the server started.
    pub fn cumulated_subscription_count(&self) -> usize {
        self.cumulated.load(Ordering::Relaxed)
    }

    /// The SubscriptionDiagnosticsArray: rebuilt when asked for, at most
    /// once a second (docs/scalability.md §5), so a burst of creates or of reads
    /// does not rebuild it each time. Counters the engine does not keep
    /// (modify, republish, notification counts) read 0.
    pub fn subscription_diagnostics(&self, now: Instant) -> Variant {
        let mut cache = lock(&self.diagnostics);
        if let Some((built, v)) = cache.as_ref() {
            if now.saturating_duration_since(*built) < std::time::Duration::from_secs(1) {
                return v.clone();
            }
        }
        let mut sets: Vec<(NodeId, SetRef<P>)> = Vec::new();
        for shard in &self.sessions {
            sets.extend(lock(shard).iter().map(|(k, v)| (k.clone(), Arc::clone(v))));
        }
        let mut rows = Vec::new();
        for (session, set) in sets {
            let g = lock(&set);
            for s in g.subscriptions() {
                rows.push(uascale_types::ExtensionObject::new(s.diagnostics(&session)));
            }
        }
        // An empty array stays a (typed) array, not a null value.
        let v = Variant::from(uascale_types::Array::new(
            uascale_types::ArrayValues::ExtensionObject(rows),
        ));
        *cache = Some((now, v.clone()));
        v
    }

    /// The subscriptions of `session` and their monitored items (for the
    /// SessionDiagnosticsArray).
    pub fn session_counts(&self, session: &NodeId) -> (usize, usize) {
        let Some(set) = self.set_of(session) else {
            return (0, 0);
        };
        let g = lock(&set);
        let subs = g.subscriptions();
        (subs.len(), subs.iter().map(|s| s.items.len()).sum())
    }

    /// Monitored items in the server.
    pub fn monitored_item_count(&self) -> usize {
        self.item_count.load(Ordering::Relaxed)
    }

    fn owners(&self, id: u32) -> MutexGuard<'_, FxHashMap<u32, Owner<P>>> {
        lock(&self.owners[id as usize % SHARDS])
    }

    /// The set of `session`, if it has one.
    pub fn set_of(&self, session: &NodeId) -> Option<SetRef<P>> {
        lock(&self.sessions[shard_of_node(session)])
            .get(session)
            .cloned()
    }

    fn set_or_new(&self, session: &NodeId) -> SetRef<P> {
        lock(&self.sessions[shard_of_node(session)])
            .entry(session.clone())
            .or_insert_with(|| {
                let account = Account::new(Arc::clone(&self.budget), session.clone());
                Arc::new(Mutex::new(SubscriptionSet::with_account(Arc::new(account))))
            })
            .clone()
    }

    /// Schedules `set`'s earliest deadline if it moved earlier.
    fn schedule(&self, set: &SetRef<P>, g: &mut SubscriptionSet<P>) {
        let Some(d) = g.poll_timeout() else {
            return;
        };
        if g.scheduled.is_some_and(|s| s <= d) {
            return;
        }
        g.scheduled = Some(d);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let earliest = {
            let mut h = lock(&self.heap);
            let earliest = h.peek().is_none_or(|Reverse(e)| d < e.at);
            h.push(Reverse(Entry {
                at: d,
                seq,
                set: Arc::downgrade(set),
            }));
            earliest
        };
        if earliest {
            if let Some(w) = self.wake.get() {
                w();
            }
        }
    }

    /// The earliest deadline of any subscription or parked Publish.
    pub fn next_deadline(&self) -> Option<Instant> {
        lock(&self.heap).peek().map(|Reverse(e)| e.at)
    }

    /// When the timer should next run [`Registry::run_due`]: the earliest
    /// deadline rounded up to the limits' timer grid
    /// ([`SubscriptionLimits::timer_grid`]) through `origin`, so that the
    /// deadlines of one grid step run in one pass.
    pub fn next_wake(&self, origin: Instant) -> Option<Instant> {
        self.next_deadline()
            .map(|t| on_grid(t, origin, self.limits.timer_grid()))
    }

    fn deliver(&self, out: Vec<Reply<P>>) {
        let observer = self.observer.get();
        for r in out {
            if let Some(o) = observer {
                o(&r.answer);
            }
            let _ = r.to.deliver(r.answer);
        }
    }

    /// Runs `f` on the session's set (created when missing), then
    /// reschedules it and sends what it answered.
    pub fn with_set<R>(
        &self,
        session: &NodeId,
        f: impl FnOnce(&mut SubscriptionSet<P>, &mut Vec<Reply<P>>) -> R,
    ) -> R {
        let set = self.set_or_new(session);
        let mut out = Vec::new();
        let r = {
            let mut g = lock(&set);
            let r = f(&mut g, &mut out);
            self.schedule(&set, &mut g);
            r
        };
        self.deliver(out);
        r
    }

    /// Runs `f` on subscription `id` of `session`; `BadSubscriptionIdInvalid`
    /// when the session has no such subscription.
    pub fn with_subscription<R>(
        &self,
        session: &NodeId,
        id: u32,
        f: impl FnOnce(&mut Subscription) -> R,
    ) -> Result<R, StatusCode> {
        let set = self
            .set_of(session)
            .ok_or(StatusCode::BadSubscriptionIdInvalid)?;
        let mut g = lock(&set);
        let r = f(g.get_mut(id).ok_or(StatusCode::BadSubscriptionIdInvalid)?);
        self.schedule(&set, &mut g);
        Ok(r)
    }

    /// CreateSubscription for `session`.
    pub fn create(
        &self,
        now: Instant,
        session: &NodeId,
        requested: &Requested,
        enabled: bool,
    ) -> Result<(u32, Revised), StatusCode> {
        let max = self.limits.max_subscription_count;
        if self
            .subscription_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(StatusCode::BadTooManySubscriptions);
        }
        let revised = self.limits.revise(requested);
        let id = loop {
            // The low 24 bits count (0 skipped); the top byte is the
            // node's, so ids made by the nodes of one cluster never meet.
            let n = self.next_id.fetch_add(1, Ordering::Relaxed) & ID_COUNTER_MASK;
            let node = u32::from(self.node_index.load(Ordering::Relaxed));
            let id = (node << 24) | n;
            if n == 0 {
                continue;
            }
            if id != 0 && !self.owners(id).contains_key(&id) {
                break id;
            }
        };
        let set = self.set_or_new(session);
        self.owners(id).insert(
            id,
            Owner {
                session: session.clone(),
                set: Arc::clone(&set),
            },
        );
        let mut g = lock(&set);
        let per_session = self.budget.quotas().max_subscriptions_per_session;
        if per_session != 0 && g.subscriptions().len() >= per_session {
            drop(g);
            self.owners(id).remove(&id);
            self.subscription_count.fetch_sub(1, Ordering::AcqRel);
            self.budget.count(Quota::SubscriptionsPerSession);
            return Err(StatusCode::BadTooManySubscriptions);
        }
        g.insert(Subscription::new(id, now, revised, requested, enabled));
        self.cumulated.fetch_add(1, Ordering::Relaxed);
        self.schedule(&set, &mut g);
        Ok((id, revised))
    }

    /// The ids of every subscription in the server now (a cluster node
    /// writes them all to its store before it drains).
    pub fn subscription_ids(&self) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.subscription_count());
        for shard in &self.owners {
            ids.extend(lock(shard).keys().copied());
        }
        ids
    }

    /// The session subscription `id` belongs to, if it exists.
    pub fn session_of(&self, id: u32) -> Option<NodeId> {
        self.owners(id).get(&id).map(|o| o.session.clone())
    }

    /// What a cluster mirror keeps of `session`'s subscriptions (empty
    /// when it has none); with `unsent`, also the items' unsent values
    /// ([`Subscription::image_of`]).
    pub fn images_of(&self, session: &NodeId, unsent: bool) -> Vec<super::SubscriptionImage> {
        match self.set_of(session) {
            Some(set) => lock(&set)
                .subscriptions()
                .iter()
                .map(|s| s.image_of(unsent))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Restores subscriptions of `session` taken over from another cluster
    /// node, with their ids; an id in use here, or one over the limits, is
    /// skipped. Returns the ids restored.
    pub fn restore(
        &self,
        now: Instant,
        session: &NodeId,
        images: &[super::SubscriptionImage],
    ) -> Vec<u32> {
        let mut restored = Vec::new();
        for img in images {
            if img.id == 0 || self.owners(img.id).contains_key(&img.id) {
                continue;
            }
            let max = self.limits.max_subscription_count;
            if self
                .subscription_count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (max == 0 || n < max).then_some(n + 1)
                })
                .is_err()
            {
                break;
            }
            if !self.reserve_items(img.items.len()) {
                self.subscription_count.fetch_sub(1, Ordering::AcqRel);
                break;
            }
            let set = self.set_or_new(session);
            self.owners(img.id).insert(
                img.id,
                Owner {
                    session: session.clone(),
                    set: Arc::clone(&set),
                },
            );
            let sub = Subscription::from_image(img, now);
            for item in sub.items() {
                if !item.sampled {
                    self.watch(
                        &item.target.node_id,
                        item.target.attribute_id,
                        sub.id,
                        item.id,
                    );
                }
            }
            let mut g = lock(&set);
            g.insert(sub);
            // Counted against the session from here on: the queued-bytes
            // quota bounds what is put back.
            if let Some(s) = g.get_mut(img.id) {
                s.restore_unsent(img);
            }
            self.schedule(&set, &mut g);
            restored.push(img.id);
        }
        restored
    }

    /// Reserves `n` monitored items against the server-wide limit.
    pub fn reserve_items(&self, n: usize) -> bool {
        let max = self.limits.max_monitored_item_count;
        self.item_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                let next = c.checked_add(n)?;
                (max == 0 || next <= max).then_some(next)
            })
            .is_ok()
    }

    /// Returns `n` reserved items (deleted, or a failed create).
    pub fn release_items(&self, n: usize) {
        let _ = self
            .item_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(n))
            });
    }

    /// Registers item `item` of subscription `sub` for pushes of `node`'s
    /// attribute `attribute`: 13 (Value) for value changes, 12
    /// (EventNotifier) for events.
    pub fn watch(&self, node: &NodeId, attribute: u32, sub: u32, item: u32) {
        let mut m = match self.watched.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        m.entry((node.clone(), attribute))
            .or_default()
            .push((sub, item));
    }

    /// The shared copy of `target`: items watching the same node,
    /// attribute and range hold one [`Arc`] (a node watched by a thousand
    /// items keeps its NodeId once, not a thousand times).
    pub fn intern_target(&self, target: ItemTarget) -> Arc<ItemTarget> {
        let mut t = lock(&self.targets);
        if let Some(shared) = t.map.get(&target).and_then(Weak::upgrade) {
            return shared;
        }
        let shared = Arc::new(target.clone());
        t.map.insert(target, Arc::downgrade(&shared));
        if t.map.len() > t.sweep_at {
            t.map.retain(|_, w| w.strong_count() > 0);
            t.sweep_at = (2 * t.map.len()).max(1024);
        }
        shared
    }

    /// Undoes [`Registry::watch`].
    pub fn unwatch(&self, node: &NodeId, attribute: u32, sub: u32, item: u32) {
        let mut m = match self.watched.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        Self::unwatch_in(&mut m, node, attribute, sub, item);
    }

    /// [`Registry::unwatch`] under a lock already held. The watcher lists
    /// are unordered: the entry is swapped out, not shifted out.
    fn unwatch_in(m: &mut Watched, node: &NodeId, attribute: u32, sub: u32, item: u32) {
        let key = (node.clone(), attribute);
        if let Some(v) = m.get_mut(&key) {
            if let Some(i) = v.iter().position(|e| *e == (sub, item)) {
                v.swap_remove(i);
            }
            if v.is_empty() {
                m.remove(&key);
            } else if v.capacity() > 2 * v.len() + 8 {
                v.shrink_to_fit();
            }
        }
    }

    fn watchers(&self, node: &NodeId, attribute: u32) -> Vec<(u32, u32)> {
        let m = match self.watched.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        // The key is built only when someone watches anything.
        if m.is_empty() {
            return Vec::new();
        }
        m.get(&(node.clone(), attribute))
            .cloned()
            .unwrap_or_default()
    }

    /// A pushed value change of `node`: every item watching it gets it
    /// (filtered, queued); nothing is sent until the subscription's timer.
    pub fn value_changed(&self, now: Now, node: &NodeId, value: &Variant) {
        let utc = now.utc;
        let watchers = self.watchers(node, 13);
        // The items of one subscription mostly follow each other (they
        // were created together): one lookup and one lock for each run.
        for run in watchers.chunk_by(|a, b| a.0 == b.0) {
            let Some(&(sub, _)) = run.first() else {
                continue;
            };
            let Some(set) = self.owners(sub).get(&sub).map(|o| Arc::clone(&o.set)) else {
                continue;
            };
            let mut g = lock(&set);
            let mut queued = false;
            for &(_, item) in run {
                let Some(s) = g.get_mut(sub) else {
                    break;
                };
                let (range, queues) = match s.item(item) {
                    Some(i) => (
                        (!i.target.index_range.is_null_or_empty())
                            .then(|| i.target.index_range.clone()),
                        !i.keeps_last_only(),
                    ),
                    None => continue,
                };
                // Over the session's values quota an item with a queue
                // drops the value (its newest waiting value, or else its
                // next one, carries the Overflow bit); one keeping only its
                // latest value keeps it.
                if queues && !g.take_value(now.instant) {
                    if let Some(s) = g.get_mut(sub) {
                        s.missed_value(item);
                    }
                    continue;
                }
                let Some(s) = g.get_mut(sub) else {
                    break;
                };
                let dv = match range {
                    None => pushed_value(value.clone(), utc),
                    Some(r) => match range_of(&r, value) {
                        Ok(v) => pushed_value(v, utc),
                        Err(status) => DataValue {
                            status: Some(status),
                            server_timestamp: Some(utc),
                            ..Default::default()
                        },
                    },
                };
                queued |= s.offer_at(now.instant, item, dv);
            }
            if queued {
                // A subscription idling between keep-alives wakes for it.
                self.schedule(&set, &mut g);
            }
        }
    }

    /// Offers an event to the event items watching any of `notifiers`
    /// (the source and the objects it reports to, up to the Server object);
    /// `select` decides per item whether the event passes its filter and
    /// which fields it gets. Returns how many items queued it.
    pub fn raise_event(
        &self,
        now: Instant,
        notifiers: &[NodeId],
        select: &dyn Fn(&super::item::MonitoredItem) -> Option<Vec<Variant>>,
    ) -> usize {
        let mut n = 0;
        for notifier in notifiers {
            for (sub, item) in self.watchers(notifier, 12) {
                let Some(set) = self.owners(sub).get(&sub).map(|o| Arc::clone(&o.set)) else {
                    continue;
                };
                let mut g = lock(&set);
                let Some(s) = g.get_mut(sub) else {
                    continue;
                };
                let Some(fields) = s.item(item).and_then(select) else {
                    continue;
                };
                if s.offer_event_at(now, item, fields) {
                    n += 1;
                    self.schedule(&set, &mut g);
                }
            }
        }
        n
    }

    /// A Publish of `session` on secure channel `channel_id`, answered
    /// through `to` now or later.
    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &self,
        now: Now,
        channel_id: u32,
        session: &NodeId,
        request_handle: u32,
        acks: &[SubscriptionAcknowledgement],
        deadline: Option<Instant>,
        to: P,
    ) {
        let limits = &self.limits;
        self.with_set(session, |set, out| {
            // Read under the set's lock: a drain's image of this set is
            // taken after the hold, so a Publish either came before the
            // image (which shows what it sent) or is parked.
            set.publish_or_park(
                now,
                channel_id,
                request_handle,
                acks,
                deadline,
                to,
                limits,
                self.held(),
                out,
            );
        });
    }

    /// Runs every set whose deadline is due at `now`, sampling with
    /// `sample`. Cost is proportional to what is due, not to the sessions.
    ///
    /// A set whose sampling pass was cut short (at
    /// [`super::WORK_PER_PASS`]) runs once per call: it is due again when
    /// the call returns, after the sets that were due with it, and true is
    /// returned - call again, with a fresh `now`, once the runtime has run
    /// what is waiting for it.
    pub fn run_due(&self, now: Now, sample: &mut dyn FnMut(&ItemTarget) -> DataValue) -> bool {
        let mut again = Vec::new();
        loop {
            let entry = {
                let mut h = lock(&self.heap);
                match h.peek() {
                    Some(Reverse(e)) if e.at <= now.instant => h.pop(),
                    _ => break,
                }
            };
            let Some(Reverse(entry)) = entry else {
                break;
            };
            let Some(set) = entry.set.upgrade() else {
                continue;
            };
            let mut out = Vec::new();
            let gone = {
                let mut g = lock(&set);
                if g.scheduled == Some(entry.at) {
                    g.scheduled = None;
                }
                let gone = g.handle_timeout(now, sample, &self.limits, &mut out);
                if g.poll_timeout().is_some_and(|d| d <= now.instant) {
                    again.push(Arc::clone(&set));
                } else {
                    self.schedule(&set, &mut g);
                }
                gone
            };
            for s in gone {
                tracing::debug!(subscription = s.id, "subscription lifetime expired");
                self.forget(&s);
            }
            self.deliver(out);
        }
        self.log_over(now.instant);
        for set in &again {
            let mut g = lock(set);
            self.schedule(set, &mut g);
        }
        !again.is_empty()
    }

    /// Drops the registry's bookkeeping of a removed subscription.
    pub fn forget(&self, s: &Subscription) {
        self.owners(s.id).remove(&s.id);
        if s.items().iter().any(|i| !i.sampled) {
            // One write lock for all of its items.
            let mut m = match self.watched.write() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            for i in s.items().iter().filter(|i| !i.sampled) {
                Self::unwatch_in(&mut m, &i.target.node_id, i.target.attribute_id, s.id, i.id);
            }
        }
        self.release_items(s.items().len());
        s.account().release_items(s.items().len());
        let _ = self
            .subscription_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(1))
            });
    }

    /// DeleteSubscriptions, one id.
    pub fn delete(&self, now: Now, session: &NodeId, id: u32) -> StatusCode {
        let Some(set) = self.set_of(session) else {
            return StatusCode::BadSubscriptionIdInvalid;
        };
        let mut out = Vec::new();
        let removed = {
            let mut g = lock(&set);
            let r = g.remove(id);
            if r.is_some() {
                g.release_if_empty(now, &mut out);
            }
            r
        };
        self.deliver(out);
        match removed {
            Some(s) => {
                self.forget(&s);
                StatusCode::Good
            }
            None => StatusCode::BadSubscriptionIdInvalid,
        }
    }

    /// TransferSubscriptions, one id, to `session`. The old session (if it
    /// still exists) is owed a StatusChange GoodSubscriptionTransferred.
    /// `may_take` decides from the owning session's user (as recorded with
    /// [`SubscriptionSet::set_user`]) whether the caller may take it.
    pub fn transfer(
        &self,
        now: Now,
        session: &NodeId,
        id: u32,
        send_initial_values: bool,
        may_take: impl Fn(Option<&crate::identity::UserIdentity>) -> bool,
    ) -> Result<Vec<u32>, StatusCode> {
        let (from, old_set) = {
            let owners = self.owners(id);
            let o = owners
                .get(&id)
                .ok_or(StatusCode::BadSubscriptionIdInvalid)?;
            (o.session.clone(), Arc::clone(&o.set))
        };
        if &from == session {
            // Already ours: nothing moves; report what Republish can return.
            let g = lock(&old_set);
            let s = g.get(id).ok_or(StatusCode::BadSubscriptionIdInvalid)?;
            return Ok(s.available_sequence_numbers());
        }
        let mut out = Vec::new();
        let mut sub = {
            let mut g = lock(&old_set);
            if !may_take(g.user()) {
                return Err(StatusCode::BadUserAccessDenied);
            }
            let s = g.remove(id).ok_or(StatusCode::BadSubscriptionIdInvalid)?;
            if g.alive {
                g.status_change(
                    now,
                    id,
                    next_sequence_number(&s),
                    GOOD_SUBSCRIPTION_TRANSFERRED,
                    &mut out,
                );
                g.release_if_empty(now, &mut out);
            }
            s
        };
        self.deliver(out);
        if send_initial_values {
            sub.requeue_last_values();
        }
        sub.reset_for_transfer(now.instant);
        let available = sub.available_sequence_numbers();
        let new_set = self.set_or_new(session);
        self.owners(id).insert(
            id,
            Owner {
                session: session.clone(),
                set: Arc::clone(&new_set),
            },
        );
        let mut g = lock(&new_set);
        g.insert(sub);
        self.schedule(&new_set, &mut g);
        Ok(available)
    }

    /// The session closed (or timed out): its parked Publishes are answered
    /// `status`; with `delete` its subscriptions go, otherwise they live on
    /// (for TransferSubscriptions) until their lifetime runs out.
    pub fn close_session(&self, session: &NodeId, delete: bool, status: StatusCode) {
        let Some(set) = lock(&self.sessions[shard_of_node(session)]).remove(session) else {
            return;
        };
        let mut out = Vec::new();
        let gone = {
            let mut g = lock(&set);
            g.alive = false;
            g.drain_parked(status, &mut out);
            if delete {
                g.take_all()
            } else {
                Vec::new()
            }
        };
        for s in &gone {
            self.forget(s);
        }
        self.deliver(out);
    }
}

fn range_of(range: &uascale_types::UaString, v: &Variant) -> Result<Variant, StatusCode> {
    let r: crate::numeric_range::NumericRange = range
        .as_str()
        .unwrap_or("")
        .parse()
        .map_err(|_| StatusCode::BadIndexRangeInvalid)?;
    r.apply(v)
}

/// `t` rounded up to the next point of the grid `step` apart through
/// `origin`: `t` itself when it lies on the grid, before `origin`, or when
/// `step` is zero.
pub fn on_grid(t: Instant, origin: Instant, step: Duration) -> Instant {
    let step = step.as_nanos();
    let since = t.saturating_duration_since(origin).as_nanos();
    if step == 0 {
        return t;
    }
    let up = since.div_ceil(step) * step - since;
    t + Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX))
}

#[cfg(test)]
// One real instant is the origin of the tests' simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::subscription::item::{Filter, MonitoredItem};
    use uascale_types::DateTime;
    use uascale_types::{
        DataChangeNotification, MonitoringMode, PublishResponse, StatusChangeNotification,
        TimestampsToReturn, UaString,
    };

    type Inbox = Arc<Mutex<Vec<(u32, Answer)>>>;

    struct Sink(u32, Inbox);

    impl PublishSink for Sink {
        fn deliver(self, answer: Answer) -> bool {
            lock(&self.1).push((self.0, answer));
            true
        }
    }

    struct Fixture {
        reg: Registry<Sink>,
        inbox: Inbox,
        t0: Instant,
    }

    impl Fixture {
        fn new(limits: SubscriptionLimits) -> Self {
            Fixture {
                reg: Registry::new(limits),
                inbox: Arc::default(),
                t0: Instant::now(),
            }
        }
        fn at(&self, ms: u64) -> Now {
            Now {
                instant: self.t0 + Duration::from_millis(ms),
                utc: DateTime::from_ticks(ms as i64 * 10_000),
            }
        }
        fn publish(&self, session: &NodeId, tag: u32, ms: u64) {
            self.reg.publish(
                self.at(ms),
                1,
                session,
                tag,
                &[],
                None,
                Sink(tag, Arc::clone(&self.inbox)),
            );
        }
        fn run(&self, ms: u64) {
            self.reg.run_due(self.at(ms), &mut |_| DataValue::default());
        }
        fn take(&self) -> Vec<(u32, Answer)> {
            std::mem::take(&mut *lock(&self.inbox))
        }
        /// A subscription with one pushed item on `node`.
        fn subscribe(&self, session: &NodeId, node: &NodeId) -> u32 {
            self.subscribe_queued(session, node, 1)
        }
        /// A subscription with one pushed item on `node`, queue `queue`.
        fn subscribe_queued(&self, session: &NodeId, node: &NodeId, queue: u32) -> u32 {
            let req = every_100ms();
            let (id, _) = self.reg.create(self.t0, session, &req, true).unwrap();
            assert!(self.reg.reserve_items(1));
            self.reg
                .with_subscription(session, id, |s| {
                    let item = MonitoredItem::new(
                        s.next_item_id(),
                        9,
                        ItemTarget {
                            node_id: node.clone(),
                            attribute_id: 13,
                            index_range: UaString::null(),
                        },
                        MonitoringMode::Reporting,
                        Duration::ZERO,
                        false,
                        queue,
                        true,
                        TimestampsToReturn::Both,
                        Filter::default(),
                    );
                    let item_id = s.add_item(item);
                    self.reg.watch(node, 13, s.id, item_id);
                })
                .unwrap();
            id
        }
    }

    /// What the tests' clients ask for: 100 ms, lifetime 30, keep-alive 10.
    fn every_100ms() -> Requested {
        Requested {
            publishing_interval: 100.0,
            lifetime_count: 30,
            max_keep_alive_count: 10,
            max_notifications_per_publish: 0,
            priority: 0,
        }
    }

    fn values(a: &Answer) -> Vec<Variant> {
        let Answer::Publish(p) = a else {
            return vec![];
        };
        let p: &PublishResponse = p;
        p.notification_message
            .notification_data
            .iter()
            .flatten()
            .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
            .flat_map(|d| d.monitored_items.iter().flatten())
            .filter_map(|m| m.value.value.clone())
            .collect()
    }

    #[test]
    fn pushed_values_reach_every_watching_session_on_its_timer() {
        let f = Fixture::new(SubscriptionLimits::default());
        let node = NodeId::string(2, "shared");
        let sessions: Vec<NodeId> = (0..3).map(|i| NodeId::numeric(1, i)).collect();
        for s in &sessions {
            f.subscribe(s, &node);
        }
        for (i, s) in sessions.iter().enumerate() {
            f.publish(s, i as u32, 0);
        }
        assert_eq!(
            f.reg.next_deadline(),
            Some(f.t0 + Duration::from_millis(100))
        );
        f.reg.value_changed(f.at(0), &node, &Variant::Int32(5));
        f.reg
            .value_changed(f.at(0), &NodeId::string(2, "other"), &Variant::Int32(6));
        f.run(99);
        assert!(
            f.take().is_empty(),
            "nothing before the publishing interval"
        );
        f.run(100);
        let mut got = f.take();
        got.sort_by_key(|(t, _)| *t);
        assert_eq!(got.len(), 3);
        for (_, a) in &got {
            assert_eq!(values(a), vec![Variant::Int32(5)]);
        }
        assert_eq!(f.reg.subscription_count(), 3);
        assert_eq!(f.reg.monitored_item_count(), 3);
    }

    #[test]
    fn transfer_moves_the_subscription_and_tells_the_old_session() {
        let f = Fixture::new(SubscriptionLimits::default());
        let node = NodeId::string(2, "n");
        let (a, b) = (NodeId::numeric(1, 1), NodeId::numeric(1, 2));
        let id = f.subscribe(&a, &node);
        f.publish(&a, 1, 0);
        f.reg.value_changed(f.at(0), &node, &Variant::Int32(1));
        f.run(100);
        assert_eq!(values(&f.take()[0].1), vec![Variant::Int32(1)]);
        // a's next Publish waits; the transfer answers it with the
        // StatusChange, then (a has nothing left) nothing else is owed.
        f.publish(&a, 2, 100);
        let available = f.reg.transfer(f.at(150), &b, id, true, |_| true).unwrap();
        assert_eq!(available, vec![1], "unacknowledged message 1 moves along");
        let got = f.take();
        let (tag, Answer::Publish(p)) = &got[0] else {
            panic!("{got:?}");
        };
        assert_eq!(*tag, 2);
        let sc = p.notification_message.notification_data.as_ref().unwrap()[0]
            .downcast_ref::<StatusChangeNotification>()
            .unwrap();
        assert_eq!(sc.status, GOOD_SUBSCRIPTION_TRANSFERRED);
        // b gets the initial value again, and later pushes.
        f.publish(&b, 3, 150);
        f.run(250);
        assert_eq!(values(&f.take()[0].1), vec![Variant::Int32(1)]);
        f.reg.value_changed(f.at(0), &node, &Variant::Int32(2));
        f.publish(&b, 4, 250);
        f.run(350);
        assert_eq!(values(&f.take()[0].1), vec![Variant::Int32(2)]);
        assert_eq!(
            f.reg.delete(f.at(350), &a, id),
            StatusCode::BadSubscriptionIdInvalid,
            "gone from a"
        );
        assert_eq!(
            f.reg.transfer(f.at(350), &a, id, false, |_| false),
            Err(StatusCode::BadUserAccessDenied)
        );
        // Only the same user may take it: b's set records its user.
        let alice = crate::identity::UserIdentity::UserName("alice".into());
        f.reg.with_set(&b, |set, _| set.set_user(alice.clone()));
        let anonymous = crate::identity::UserIdentity::Anonymous;
        assert_eq!(
            f.reg
                .transfer(f.at(350), &a, id, false, |owner| owner == Some(&anonymous)),
            Err(StatusCode::BadUserAccessDenied)
        );
        assert!(f.reg.with_subscription(&b, id, |_| ()).is_ok(), "still b's");
        assert_eq!(f.reg.delete(f.at(350), &b, id), StatusCode::Good);
        assert_eq!(f.reg.subscription_count(), 0);
        assert_eq!(f.reg.monitored_item_count(), 0);
        // The push index forgot the item.
        f.reg.value_changed(f.at(0), &node, &Variant::Int32(3));
        assert!(f.reg.watchers(&node, 13).is_empty());
    }

    /// Ids carry the node's index in their top byte and count in the low
    /// 24 bits, skipping 0 when the count wraps: two nodes never collide.
    #[test]
    fn subscription_ids_are_partitioned_by_node() {
        let req = every_100ms();
        let a = Fixture::new(SubscriptionLimits::default());
        let b = Fixture::new(SubscriptionLimits::default());
        a.reg.set_node_index(1);
        b.reg.set_node_index(2);
        let s = NodeId::numeric(1, 1);
        let id = |f: &Fixture| f.reg.create(f.t0, &s, &req, true).unwrap().0;
        assert_eq!(id(&a), 0x0100_0001);
        assert_eq!(id(&b), 0x0200_0001);
        // The counter wraps within the node's range and skips 0.
        a.reg.next_id.store(ID_COUNTER_MASK, Ordering::Relaxed);
        assert_eq!(id(&a), 0x01FF_FFFF);
        assert_eq!(id(&a), 0x0100_0002, "0 skipped, 1 still in use");
    }

    #[test]
    fn subscriptions_are_refused_over_the_per_session_quota_only_in_that_session() {
        let reg: Registry<Sink> = Registry::with_quotas(
            SubscriptionLimits::default(),
            crate::quota::Quotas {
                max_subscriptions_per_session: 2,
                ..Default::default()
            },
            0,
        );
        let t0 = Instant::now();
        let (a, b) = (NodeId::numeric(1, 1), NodeId::numeric(1, 2));
        let req = every_100ms();
        assert!(reg.create(t0, &a, &req, true).is_ok());
        let second = reg.create(t0, &a, &req, true);
        assert!(second.is_ok(), "at the quota");
        assert_eq!(
            reg.create(t0, &a, &req, true),
            Err(StatusCode::BadTooManySubscriptions)
        );
        assert_eq!(
            reg.subscription_count(),
            2,
            "the refused one is not counted"
        );
        assert_eq!(reg.cumulated_subscription_count(), 2);
        assert_eq!(
            reg.budget()
                .over_count(crate::quota::Quota::SubscriptionsPerSession),
            1
        );
        assert!(reg.create(t0, &b, &req, true).is_ok(), "another session");
        // Deleting one makes room again.
        let id = second.map(|(id, _)| id).unwrap_or(0);
        let now = Now {
            instant: t0,
            utc: DateTime::from_ticks(0),
        };
        assert_eq!(reg.delete(now, &a, id), StatusCode::Good);
        assert!(reg.create(t0, &a, &req, true).is_ok());
        let top = reg.top_kept(10);
        assert_eq!(top.len(), 2);
    }

    #[test]
    fn limits_and_orphaned_subscriptions() {
        let f = Fixture::new(SubscriptionLimits {
            max_subscription_count: 1,
            max_monitored_item_count: 1,
            ..Default::default()
        });
        let a = NodeId::numeric(1, 1);
        let id = f.subscribe(&a, &NodeId::string(2, "n"));
        let req = every_100ms();
        assert_eq!(
            f.reg.create(f.t0, &a, &req, true),
            Err(StatusCode::BadTooManySubscriptions)
        );
        assert!(!f.reg.reserve_items(1), "the server-wide item limit");
        // The session goes without deleting: the subscription lives on,
        // then expires after its lifetime (30 cycles) and is forgotten.
        f.publish(&a, 1, 0);
        f.reg.close_session(&a, false, StatusCode::BadSessionClosed);
        let got = f.take();
        assert!(matches!(
            got[0].1,
            Answer::Fault {
                status: StatusCode::BadSessionClosed,
                ..
            }
        ));
        assert_eq!(f.reg.subscription_count(), 1, "kept for a transfer");
        for ms in (100..=3000).step_by(100) {
            f.run(ms);
        }
        assert_eq!(f.reg.subscription_count(), 0, "lifetime expired");
        assert_eq!(f.reg.monitored_item_count(), 0);
        assert!(f.reg.transfer(f.at(3000), &a, id, false, |_| true).is_err());
    }

    /// Subscribes session `a` and gives it an event item (client handle 5,
    /// Severity selected) on the Server object; returns the subscription
    /// id and the Server object's id.
    fn event_item(f: &Fixture, a: &NodeId) -> (u32, NodeId) {
        let id = f.subscribe(a, &NodeId::string(2, "unused"));
        let server = NodeId::ns0(2253);
        let filter = crate::subscription::event::compile(
            &uascale_types::EventFilter {
                select_clauses: Some(vec![uascale_types::SimpleAttributeOperand {
                    type_definition_id: NodeId::ns0(2041),
                    browse_path: Some(vec![uascale_types::QualifiedName::new(0, "Severity")]),
                    attribute_id: 13,
                    index_range: UaString::null(),
                }]),
                where_clause: Default::default(),
            },
            &|_| true,
        )
        .unwrap()
        .0;
        let item_id = f
            .reg
            .with_subscription(a, id, |s| {
                let item = MonitoredItem::new(
                    s.next_item_id(),
                    5,
                    ItemTarget {
                        node_id: server.clone(),
                        attribute_id: 12,
                        index_range: UaString::null(),
                    },
                    MonitoringMode::Reporting,
                    Duration::ZERO,
                    false,
                    10,
                    true,
                    TimestampsToReturn::Both,
                    Filter::Event(Box::new(filter)),
                );
                s.add_item(item)
            })
            .unwrap();
        f.reg.watch(&server, 12, id, item_id);
        (id, server)
    }

    /// Raises an event of severity 300 on `server` and checks that the
    /// next Publish of session `a` carries it to the item of handle 5.
    fn event_reaches(f: &Fixture, a: &NodeId, server: &NodeId) {
        let event = crate::subscription::event::Event::new(
            uascale_types::ByteString::new(vec![1]),
            NodeId::ns0(2041),
            server.clone(),
            "S",
            DateTime::from_ticks(1),
            "m",
            300,
        );
        let select = |i: &MonitoredItem| match &i.filter {
            Filter::Event(c) => c.apply(&event, &|_, _| true),
            Filter::DataChange { .. } => None,
        };
        assert_eq!(
            f.reg.raise_event(f.t0, &[NodeId::string(2, "x")], &select),
            0
        );
        assert_eq!(
            f.reg
                .raise_event(f.t0, std::slice::from_ref(server), &select),
            1
        );
        f.publish(a, 1, 0);
        f.run(100);
        let got = f.take();
        let Answer::Publish(p) = &got[0].1 else {
            panic!("{got:?}");
        };
        let list = p.notification_message.notification_data.as_ref().unwrap()[0]
            .downcast_ref::<uascale_types::EventNotificationList>()
            .unwrap();
        let events = list.events.as_ref().unwrap();
        assert_eq!(events[0].client_handle, 5);
        assert_eq!(events[0].event_fields, Some(vec![Variant::UInt16(300)]));
    }

    #[test]
    fn events_reach_items_watching_their_notifiers() {
        let f = Fixture::new(SubscriptionLimits::default());
        let a = NodeId::numeric(1, 1);
        let (_, server) = event_item(&f, &a);
        event_reaches(&f, &a, &server);
    }

    /// An event item moves with its subscription (a cluster takeover): its
    /// image carries the EventFilter, and the registry that restores it
    /// compiles it again and hooks the item to its notifier.
    #[test]
    fn a_restored_event_item_receives_events() {
        let old = Fixture::new(SubscriptionLimits::default());
        let a = NodeId::numeric(1, 1);
        let (id, server) = event_item(&old, &a);
        let images = old.reg.images_of(&a, false);
        let items = &images[0].items;
        assert_eq!(items.len(), 2, "the data-change item and the event item");
        assert_eq!(items.iter().filter(|i| i.event_filter.is_some()).count(), 1);
        let new = Fixture::new(SubscriptionLimits::default());
        assert_eq!(new.reg.restore(new.t0, &a, &images), vec![id]);
        event_reaches(&new, &a, &server);
    }

    /// Raises an event of `severity` on `server` at `f`'s start.
    fn raise(f: &Fixture, server: &NodeId, severity: u16) {
        let event = crate::subscription::event::Event::new(
            uascale_types::ByteString::new(vec![severity as u8]),
            NodeId::ns0(2041),
            server.clone(),
            "S",
            DateTime::from_ticks(1),
            "m",
            severity,
        );
        let select = |i: &MonitoredItem| match &i.filter {
            Filter::Event(c) => c.apply(&event, &|_, _| true),
            Filter::DataChange { .. } => None,
        };
        assert_eq!(
            f.reg
                .raise_event(f.t0, std::slice::from_ref(server), &select),
            1
        );
    }

    /// A drain hands over the events an event item had queued and not
    /// published: the image with unsent values carries them (the image
    /// after a Publish answer does not), and the registry that restores it
    /// publishes them first, in order, then the newer ones.
    #[test]
    fn a_drained_event_items_queued_events_go_out_first_on_the_new_node() {
        let old = Fixture::new(SubscriptionLimits::default());
        let a = NodeId::numeric(1, 1);
        let (id, server) = event_item(&old, &a);
        for severity in [100, 200, 300] {
            raise(&old, &server, severity);
        }
        let event_image = |images: &[crate::subscription::SubscriptionImage]| {
            images[0]
                .items
                .iter()
                .find(|i| i.event_filter.is_some())
                .cloned()
                .expect("the event item")
        };
        assert!(event_image(&old.reg.images_of(&a, false)).events.is_empty());
        let images = old.reg.images_of(&a, true);
        let fields: Vec<_> = event_image(&images)
            .events
            .iter()
            .map(|e| (e.overflow, e.fields.clone()))
            .collect();
        assert_eq!(
            fields,
            [100, 200, 300]
                .map(|s| (false, vec![Variant::UInt16(s)]))
                .to_vec()
        );

        let new = Fixture::new(SubscriptionLimits::default());
        assert_eq!(new.reg.restore(new.t0, &a, &images), vec![id]);
        raise(&new, &server, 400);
        new.publish(&a, 1, 0);
        new.run(100);
        let got = new.take();
        let Answer::Publish(p) = &got[0].1 else {
            panic!("{got:?}");
        };
        let list = p.notification_message.notification_data.as_ref().unwrap()[0]
            .downcast_ref::<uascale_types::EventNotificationList>()
            .unwrap();
        let severities: Vec<_> = list
            .events
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.event_fields.clone())
            .collect();
        assert_eq!(
            severities,
            [100, 200, 300, 400]
                .map(|s| Some(vec![Variant::UInt16(s)]))
                .to_vec(),
            "the unsent events first, in order, then the newer one"
        );
    }

    /// A drain hands over what its items had not published: the image
    /// with unsent values carries the queued values (not the one already
    /// in a sent message), and the registry that restores it publishes
    /// them first, in order, then newer values - an unchanged current
    /// value offered on restore is not reported again.
    #[test]
    fn a_drained_items_unsent_values_go_out_first_on_the_new_node() {
        let old = Fixture::new(SubscriptionLimits::default());
        let a = NodeId::numeric(1, 1);
        let node = NodeId::string(2, "v");
        let id = old.subscribe_queued(&a, &node, 10);
        old.reg.value_changed(old.at(0), &node, &Variant::Int32(1));
        old.publish(&a, 1, 0);
        old.run(100);
        let sent = old.take();
        assert_eq!(values(&sent[0].1), vec![Variant::Int32(1)]);
        for x in 2..=5 {
            old.reg
                .value_changed(old.at(100 + x as u64), &node, &Variant::Int32(x));
        }
        // The image after a Publish answer carries none of them.
        assert!(old.reg.images_of(&a, false)[0].items[0].queued.is_empty());
        let images = old.reg.images_of(&a, true);
        let item = &images[0].items[0];
        let queued: Vec<_> = item.queued.iter().map(|v| v.value.clone()).collect();
        assert_eq!(
            queued,
            (2..=5).map(|x| Some(Variant::Int32(x))).collect::<Vec<_>>()
        );
        assert_eq!(
            item.last.as_ref().and_then(|v| v.value.clone()),
            Some(Variant::Int32(5))
        );

        let new = Fixture::new(SubscriptionLimits::default());
        assert_eq!(new.reg.restore(new.t0, &a, &images), vec![id]);
        // What a takeover does next: offer each item its current value.
        let offered = new
            .reg
            .with_subscription(&a, id, |s| {
                let r = s.items_mut()[0].offer(DataValue::value(Variant::Int32(5)));
                s.items_changed();
                r
            })
            .unwrap();
        assert!(
            !offered,
            "the current value, unchanged, is not queued again"
        );
        new.reg.value_changed(new.at(10), &node, &Variant::Int32(6));
        new.publish(&a, 2, 10);
        new.run(200);
        let got = new.take();
        assert_eq!(
            values(&got[0].1),
            (2..=6).map(Variant::Int32).collect::<Vec<_>>(),
            "the unsent values first, in order, then the newer one"
        );
    }

    /// Held (a drain wrote its final records), the registry answers no
    /// Publish: a late subscription keeps its queued value - the one the
    /// record holds - and the acknowledgement is applied. Not held, the
    /// same Publish is answered at once with that value.
    #[test]
    fn a_held_registry_parks_publishes_and_keeps_what_is_queued() {
        for hold in [false, true] {
            let f = Fixture::new(SubscriptionLimits::default());
            let a = NodeId::numeric(1, 1);
            let node = NodeId::string(2, "v");
            let id = f.subscribe_queued(&a, &node, 10);
            f.reg.value_changed(f.at(0), &node, &Variant::Int32(1));
            f.publish(&a, 1, 0);
            f.run(100);
            let Answer::Publish(first) = &f.take()[0].1 else {
                panic!("a message");
            };
            let seq = first.notification_message.sequence_number;
            f.reg.value_changed(f.at(110), &node, &Variant::Int32(2));
            // No Publish parked at the end of the interval: late.
            f.run(200);
            assert!(f.take().is_empty());
            if hold {
                f.reg.hold();
            }
            let ack = SubscriptionAcknowledgement {
                subscription_id: id,
                sequence_number: seq,
            };
            f.reg.publish(
                f.at(210),
                1,
                &a,
                2,
                &[ack],
                None,
                Sink(2, Arc::clone(&f.inbox)),
            );
            let got = f.take();
            let image = &f.reg.images_of(&a, true)[0];
            if hold {
                assert!(got.is_empty(), "nothing answered: {got:?}");
                let queued: Vec<_> = image.items[0]
                    .queued
                    .iter()
                    .map(|v| v.value.clone())
                    .collect();
                assert_eq!(queued, vec![Some(Variant::Int32(2))]);
            } else {
                assert_eq!(values(&got[0].1), vec![Variant::Int32(2)]);
                assert!(image.items[0].queued.is_empty());
            }
            assert!(
                image
                    .retransmission
                    .iter()
                    .all(|m| m.sequence_number != seq),
                "the acknowledgement was applied"
            );
        }
    }

    #[test]
    fn items_watching_one_target_share_it_and_the_registry_does_not_keep_it() {
        let f = Fixture::new(SubscriptionLimits::default());
        let t = |n: &str| ItemTarget {
            node_id: NodeId::string(2, n),
            attribute_id: 13,
            index_range: UaString::null(),
        };
        let a = f.reg.intern_target(t("a"));
        let b = f.reg.intern_target(t("a"));
        assert!(Arc::ptr_eq(&a, &b));
        let c = f.reg.intern_target(t("b"));
        assert!(!Arc::ptr_eq(&a, &c));
        let ranged = f.reg.intern_target(ItemTarget {
            index_range: UaString::from("1:2"),
            ..t("a")
        });
        assert!(!Arc::ptr_eq(&a, &ranged), "another range is another target");
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "dropped with its last item");
        assert_eq!(*f.reg.intern_target(t("a")), t("a"));
        // Dead entries are swept as the map grows.
        for i in 0..5_000 {
            drop(f.reg.intern_target(t(&format!("n{i}"))));
        }
        assert!(lock(&f.reg.targets).map.len() <= 2_048);
    }

    #[test]
    fn deadlines_are_rounded_up_to_the_timer_grid() {
        let o = Instant::now();
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert_eq!(on_grid(o + ms(10), o, ms(5)), o + ms(10));
        assert_eq!(on_grid(o + ms(10) + us(1), o, ms(5)), o + ms(15));
        assert_eq!(on_grid(o + ms(14) + us(999), o, ms(5)), o + ms(15));
        assert_eq!(on_grid(o + us(1), o, ms(5)), o + ms(5));
        // No grid, and nothing before the origin to round.
        assert_eq!(on_grid(o + us(1), o, Duration::ZERO), o + us(1));
        assert_eq!(on_grid(o, o + ms(3), ms(5)), o);
    }

    #[test]
    fn the_timer_wakes_on_the_grid_for_every_deadline_of_a_step() {
        let limits = SubscriptionLimits::default();
        assert_eq!(limits.timer_grid(), Duration::from_millis(5));
        let f = Fixture::new(limits);
        let req = every_100ms();
        // Two sessions whose first cycles fall 1 and 4 ms past a point of
        // the grid: one wake-up at 105 ms runs both.
        let (a, b) = (NodeId::numeric(1, 1), NodeId::numeric(1, 2));
        for (session, ms) in [(&a, 1), (&b, 4)] {
            f.reg
                .create(f.t0 + Duration::from_millis(ms), session, &req, true)
                .unwrap();
            f.publish(session, u32::try_from(ms).unwrap(), ms);
        }
        let wake = f.reg.next_wake(f.t0).unwrap();
        assert_eq!(wake, f.t0 + Duration::from_millis(105));
        assert_eq!(
            f.reg.next_deadline(),
            Some(f.t0 + Duration::from_millis(101))
        );
        // Run at the wake-up, both first cycles answer their Publish.
        f.run(105);
        let mut answered: Vec<u32> = f.take().into_iter().map(|(tag, _)| tag).collect();
        answered.sort_unstable();
        assert_eq!(answered, vec![1, 4]);
    }

    #[test]
    fn the_timer_grid_stays_within_half_the_fastest_intervals() {
        let mut l = SubscriptionLimits {
            timer_resolution: Duration::from_millis(20),
            ..SubscriptionLimits::default()
        };
        // Half the 10 ms sampling minimum.
        assert_eq!(l.timer_grid(), Duration::from_millis(5));
        l.min_sampling_interval = Duration::from_millis(100);
        assert_eq!(l.timer_grid(), Duration::from_millis(20));
        l.min_publishing_interval = Duration::from_millis(8);
        assert_eq!(l.timer_grid(), Duration::from_millis(4));
        l.timer_resolution = Duration::ZERO;
        assert_eq!(l.timer_grid(), Duration::ZERO);
    }
}
