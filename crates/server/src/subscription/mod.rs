//! The subscription engine, sans-IO: per-session sets of subscriptions with
//! their monitored items, the Publish requests a session has parked, and the
//! publish state machine of Part 4 §5.13.1. Nothing here reads a clock,
//! spawns or touches a socket: every step takes `now` and the caller asks
//! [`SubscriptionSet::poll_timeout`] when to come back. The registry
//! ([`registry`]) shares sets between sessions and runs their timers from
//! one deadline heap; `net/` drives it.
//!
//! The publish state machine, per subscription (Part 4 Table 88, condensed;
//! "queued" means the *session* has a parked Publish, "avail" that
//! publishing is enabled and notifications are ready):
//!
//! ```text
//!            timer: queued & (avail | first msg)  -> send, NORMAL
//!   NORMAL --timer: !queued & (avail | first msg) --> LATE
//!     |  \---timer: msg sent & !avail ------------> KEEPALIVE (reset counter)
//!     |
//!   KEEPALIVE --timer: avail & queued ----------> send, NORMAL
//!             --timer: !avail & counter==1 & queued -> keep-alive, counter reset
//!             --timer: !avail & counter>1 ------> counter - 1
//!             --timer: !queued & (counter==1 | avail) -> LATE
//!   LATE --Publish arrives: avail | more -> send, NORMAL; else keep-alive, KEEPALIVE
//!   any --timer with lifetime counter at 1 -> CLOSED, StatusChange BadTimeout
//! ```
//!
//! A Publish arriving resets every subscription's lifetime counter, applies
//! its acknowledgements, then goes to a LATE subscription (highest priority,
//! then the one late longest) or waits in the session's queue.

pub mod event;
pub mod item;
pub mod registry;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_types::{
    DataChangeNotification, DateTime, EventFieldList, EventNotificationList, ExtensionObject,
    MonitoredItemNotification, NotificationMessage, PublishResponse, ResponseHeader,
    StatusChangeNotification, StatusCode, SubscriptionAcknowledgement,
};

use item::{Filter, ItemTarget, MonitoredItem, Queued};

use crate::quota::{Account, KeptQueue, KeptSize, Stage};

// Collections here grow one element at a time (`reserve_exact(1)`), not to
// the 4 that `push` starts with: most sessions hold one subscription with
// one item, and memory per session is what this server is measured by.

/// The moment a step runs at: monotonic for deadlines, wall clock for the
/// timestamps in messages.
pub use uascale_proto::Now;

/// `GoodSubscriptionTransferred`: the StatusChange the old session gets.
pub const GOOD_SUBSCRIPTION_TRANSFERRED: StatusCode = StatusCode(0x002D_0000);

/// Bounds on what clients may ask for (docs/scalability.md §4): the
/// `[subscriptions]` section of the configuration (the keys are the field
/// names, durations in milliseconds under `..._ms`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubscriptionLimits {
    /// Fastest publishing interval (`min_publishing_interval_ms`). Default
    /// 50 ms: faster costs a Publish round trip per client for values that
    /// rarely change that fast.
    #[serde(rename = "min_publishing_interval_ms", with = "crate::config::millis")]
    pub min_publishing_interval: Duration,
    /// Slowest publishing interval (`max_publishing_interval_ms`). Default
    /// 1 h.
    #[serde(rename = "max_publishing_interval_ms", with = "crate::config::millis")]
    pub max_publishing_interval: Duration,
    /// Largest keep-alive count. Default 10,000.
    pub max_keep_alive_count: u32,
    /// Largest lifetime count (revised to at least 3 x keep-alive; at
    /// least 3). Default 100,000.
    pub max_lifetime_count: u32,
    /// Notifications per Publish response, at most; the client's smaller
    /// value wins. Default 10,000 (0 = no limit).
    pub max_notifications_per_publish: u32,
    /// Publish requests a session may have parked; over it the oldest is
    /// answered `BadTooManyPublishRequests`. Default 20.
    pub max_publish_request_count: usize,
    /// Notification messages kept per subscription for Republish. Default 20.
    pub max_retransmission_queue: usize,
    /// Fastest sampling interval of timer-sampled items
    /// (`min_sampling_interval_ms`). Default 10 ms.
    #[serde(rename = "min_sampling_interval_ms", with = "crate::config::millis")]
    pub min_sampling_interval: Duration,
    /// The subscription timer's grid (`timer_resolution_ms`): publishing
    /// cycles, samples and Publish timeouts due within one step of it run
    /// together in one pass at its end, up to this much late and never
    /// early, so that one wake-up of the server serves many sessions.
    /// Default 5 ms; 0 runs each at its own millisecond. Never more than
    /// [`SubscriptionLimits::timer_grid`] allows.
    #[serde(rename = "timer_resolution_ms", with = "crate::config::millis")]
    pub timer_resolution: Duration,
    /// Largest queue size of a data item. Default 1,000.
    pub max_queue_size: u32,
    /// Queue size of an event item asking for 0. Default 1,000.
    pub default_event_queue_size: u32,
    /// Subscriptions in the server (`max_subscription_count`; 0 = no
    /// limit). Default 50,000.
    pub max_subscription_count: usize,
    /// Monitored items in the server (`max_monitored_item_count`; 0 = no
    /// limit). Default 1,000,000.
    pub max_monitored_item_count: usize,
    /// Items per subscription (`max_monitored_items_per_subscription`; 0 =
    /// no limit). Default 100,000.
    pub max_monitored_items_per_subscription: usize,
    /// Items per Create/Modify/Delete/SetMonitoringMode/SetTriggering call
    /// (`max_monitored_items_per_call`, published as OperationLimits
    /// MaxMonitoredItemsPerCall): over it `BadTooManyOperations`.
    /// Default 10,000.
    pub max_monitored_items_per_call: usize,
}

impl Default for SubscriptionLimits {
    /// The limits of docs/scalability.md §4, sized for one process serving the
    /// 20,000 sessions of `max_session_count`.
    fn default() -> Self {
        SubscriptionLimits {
            // A Publish round trip per client faster than that is load for
            // values that seldom change so fast.
            min_publishing_interval: Duration::from_millis(50),
            // Slower than hourly is a configuration mistake, not a need.
            max_publishing_interval: Duration::from_secs(3600),
            // Bounds on how long a subscription nobody publishes for lives
            // (lifetime count x interval), well above what clients ask.
            max_keep_alive_count: 10_000,
            max_lifetime_count: 100_000,
            // A response of about a megabyte at most.
            max_notifications_per_publish: 10_000,
            // Enough Publishes in flight to cover a round trip at the
            // fastest interval; more only hold memory.
            max_publish_request_count: 20,
            max_retransmission_queue: 20,
            // The timer task's resolution is about a millisecond; 10 ms
            // keeps sampling of many items affordable.
            min_sampling_interval: Duration::from_millis(10),
            // Coarse enough that a wake-up of the timer serves many
            // sessions' cycles (2,000 sessions at 1 s: 200 wake-ups a
            // second instead of about 1,000), fine enough to be half the
            // fastest sampling interval.
            timer_resolution: Duration::from_millis(5),
            // Bounded memory per item under bursts.
            max_queue_size: 1000,
            default_event_queue_size: 1000,
            // Server-wide bounds that fit one process's memory.
            max_subscription_count: 50_000,
            max_monitored_item_count: 1_000_000,
            max_monitored_items_per_subscription: 100_000,
            // As OperationLimits' max_nodes_per_read.
            max_monitored_items_per_call: 10_000,
        }
    }
}

/// What a client asked for in Create/ModifySubscription.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Requested {
    /// Publishing interval in ms (NaN or below the minimum: the minimum).
    pub publishing_interval: f64,
    /// Lifetime count.
    pub lifetime_count: u32,
    /// Keep-alive count.
    pub max_keep_alive_count: u32,
    /// Notifications per Publish (0: the server's limit).
    pub max_notifications_per_publish: u32,
    /// Relative priority among the session's subscriptions.
    pub priority: u8,
}

/// The revised values: interval, lifetime count, keep-alive count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Revised {
    /// The publishing interval.
    pub publishing_interval: Duration,
    /// Lifetime count, at least 3 x the keep-alive count.
    pub lifetime_count: u32,
    /// Keep-alive count, at least 1.
    pub max_keep_alive_count: u32,
}

impl SubscriptionLimits {
    /// The grid the subscription timer runs on: `timer_resolution`, but at
    /// most half the fastest sampling and publishing intervals, so that
    /// no timer runs later than half of the shortest interval a client can
    /// be given.
    pub fn timer_grid(&self) -> Duration {
        self.timer_resolution
            .min(self.min_sampling_interval / 2)
            .min(self.min_publishing_interval / 2)
    }

    /// Revises a request into the configured bounds.
    pub fn revise(&self, r: &Requested) -> Revised {
        let min = self.min_publishing_interval.max(Duration::from_millis(1));
        let max = self.max_publishing_interval.max(min);
        let ms = r.publishing_interval;
        let interval = if ms.is_nan() || ms <= min.as_secs_f64() * 1000.0 {
            min
        } else if ms >= max.as_secs_f64() * 1000.0 {
            max
        } else {
            Duration::from_secs_f64(ms / 1000.0)
        };
        let max_lifetime = self.max_lifetime_count.max(3);
        let mut keep_alive = r
            .max_keep_alive_count
            .clamp(1, self.max_keep_alive_count.max(1));
        let lifetime = r
            .lifetime_count
            .max(keep_alive.saturating_mul(3))
            .min(max_lifetime);
        if lifetime / 3 < keep_alive {
            keep_alive = (lifetime / 3).max(1);
        }
        Revised {
            publishing_interval: interval,
            lifetime_count: lifetime,
            max_keep_alive_count: keep_alive,
        }
    }
}

/// Where a subscription is in the publish state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Publishing on its timer.
    Normal,
    /// Sending keep-alives only, counting down.
    KeepAlive,
    /// Has something to send (or owes a keep-alive) and no Publish to send
    /// it with: the next Publish is answered at once.
    Late,
}

/// A subscription's sampled items.
#[derive(Debug, Clone, Default)]
struct Sampling {
    /// When the earliest of their next samples is due.
    due: Option<Instant>,
    /// Their ids, ascending: a sampling tick visits these and no others
    /// (pushed items, however many, are never walked for it).
    ids: Vec<u32>,
    /// The samples a second their sampling intervals ask for.
    demand: f64,
    /// Where a pass cut short (at [`WORK_PER_PASS`]) goes on,
    /// and the earliest next sample of the items it visited so far.
    cursor: usize,
    round_due: Option<Instant>,
}

/// The samples a sampled item's interval asks for per second.
fn sample_rate(interval: Duration) -> f64 {
    1.0 / interval.as_secs_f64().max(0.001)
}

/// The work one session's timer pass does before the sets due after it
/// have their turn, in item visits ([`SAMPLE_COST`] for a sample): about a
/// thousand samples or eight thousand visits, a few hundred microseconds.
/// A pass over a hundred thousand items would otherwise hold up every
/// other session's samples and Publishes for tens of milliseconds; the
/// rest is done in the next pass, right after.
pub const WORK_PER_PASS: usize = 8192;

/// What a sample costs in item visits (a read of the value and its queueing
/// against a look at the item's next sample time).
pub const SAMPLE_COST: usize = 8;

/// One subscription.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Server-unique id.
    pub id: u32,
    /// Revised publishing interval.
    pub interval: Duration,
    /// Revised lifetime count.
    pub lifetime_count: u32,
    /// Revised keep-alive count.
    pub keep_alive_count: u32,
    /// The client's notifications-per-publish (0 = the server's limit).
    pub max_notifications: u32,
    /// Priority among the session's subscriptions.
    pub priority: u8,
    /// PublishingEnabled.
    pub enabled: bool,
    /// The state.
    pub state: State,
    message_sent: bool,
    more: bool,
    lifetime_counter: u32,
    keep_alive_counter: u32,
    late_since: u64,
    /// When the publishing timer fires next.
    pub next_publish: Instant,
    next_seq: u32,
    /// On a subscription restored from a cluster mirror, until it sends its
    /// first NotificationMessage: the next sequence number it was restored
    /// with (0 otherwise). An acknowledgement at or after it (within
    /// [`RESTORED_ACK_WINDOW`]) is of a message the old node sent after its
    /// last mirrored state: the sequence numbers move past it
    /// ([`Subscription::acknowledge`]).
    restored_seq: u32,
    /// The messages kept for Republish, counted against the session's
    /// account (which holds its items too; unbound until the
    /// subscription is in a session's set).
    retransmission: KeptQueue<NotificationMessage>,
    items: Vec<MonitoredItem>,
    next_item_id: u32,
    /// The items with a sampling timer and when the next sample is due;
    /// None while there are none (boxed: most subscriptions have only
    /// pushed items).
    sampling: Option<Box<Sampling>>,
    /// Set whenever an item may have queued something since the last
    /// publishing cycle; while clear, idle cycles are skipped in one step.
    data_hint: bool,
    /// The ids of the items that may have something to report: every item
    /// changed through [`Subscription::item_mut`] (a pushed value, an
    /// event, a mode change, a trigger) or by a sample is put here, and a
    /// publishing cycle visits these and no others - among a thousand
    /// items of which one changed, it looks at one.
    ready: Vec<u32>,
}

/// What happened to an item operation.
pub type ItemResult<T> = Result<T, StatusCode>;

/// How far past its restored next sequence number a restored subscription
/// accepts an acknowledgement (docs/cluster.md, "the last
/// NotificationMessage"): a node writes its subscriptions record behind
/// each Publish answer, so the old node may have sent a few messages the
/// mirror never heard of; more than this many is not a lagging mirror but a
/// client acknowledging numbers it never got.
pub const RESTORED_ACK_WINDOW: u32 = 10_000;

/// What a cluster mirror keeps of a subscription so that another node can
/// restore it with its sequence numbers (docs/cluster.md): its
/// parameters, the next sequence number, the retransmission queue (the
/// messages not yet acknowledged) and its data-change items. Event items
/// are not kept.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionImage {
    /// Its id (kept across nodes).
    pub id: u32,
    /// Revised publishing interval.
    pub interval: Duration,
    /// Revised lifetime count.
    pub lifetime_count: u32,
    /// Revised keep-alive count.
    pub keep_alive_count: u32,
    /// Notifications per publish (0 = the server's limit).
    pub max_notifications: u32,
    /// Priority.
    pub priority: u8,
    /// PublishingEnabled.
    pub enabled: bool,
    /// The sequence number of the next NotificationMessage.
    pub next_seq: u32,
    /// The messages not yet acknowledged.
    pub retransmission: Vec<NotificationMessage>,
    /// The id the next item gets.
    pub next_item_id: u32,
    /// The monitored items (data-change and event).
    pub items: Vec<ItemImage>,
}

/// An event an event item had queued and not yet published, handed over
/// by a draining node.
#[derive(Debug, Clone, PartialEq)]
pub struct UnsentEvent {
    /// True for the EventQueueOverflow event the item put in place of the
    /// events it discarded.
    pub overflow: bool,
    /// The event's selected fields, as the item's select clauses made them.
    pub fields: Vec<uascale_types::Variant>,
}

/// What a cluster mirror keeps of a monitored item (data-change or event).
#[derive(Debug, Clone, PartialEq)]
pub struct ItemImage {
    /// Its id.
    pub id: u32,
    /// The client's handle.
    pub client_handle: u32,
    /// What it watches.
    pub target: ItemTarget,
    /// Disabled, Sampling or Reporting.
    pub mode: uascale_types::MonitoringMode,
    /// The revised sampling interval.
    pub sampling_interval: Duration,
    /// True when sampled by the timer (else pushed by its node manager).
    pub sampled: bool,
    /// The revised queue size.
    pub queue_size: u32,
    /// Which end of a full queue is dropped.
    pub discard_oldest: bool,
    /// Which timestamps notifications carry.
    pub timestamps: uascale_types::TimestampsToReturn,
    /// The DataChangeFilter's trigger.
    pub trigger: uascale_types::DataChangeTrigger,
    /// The absolute deadband (0: none).
    pub deadband: f64,
    /// An event item's EventFilter as the client sent it (then `trigger`
    /// and `deadband` mean nothing); None for a data-change item.
    pub event_filter: Option<Box<uascale_types::EventFilter>>,
    /// Only in the final records of a drain (else None): the last value
    /// that passed the item's filter, what the next is compared to.
    pub last: Option<uascale_types::DataValue>,
    /// Only in the final records of a drain (else empty): the values
    /// queued and not yet published, oldest first.
    pub queued: Vec<uascale_types::DataValue>,
    /// Only in the final records of a drain (else empty), and only for an
    /// event item: the events queued and not yet published, oldest first.
    pub events: Vec<UnsentEvent>,
}

impl Subscription {
    /// What a cluster mirror keeps of it after a Publish answer: no
    /// queued values (a node that fails later may have sent them).
    pub fn image(&self) -> SubscriptionImage {
        self.image_of(false)
    }

    /// What a cluster mirror keeps of it; with `unsent`, also each
    /// data-change item's last and queued values ([`MonitoredItem::unsent`])
    /// and each event item's queued events
    /// ([`MonitoredItem::unsent_events`]): the final record of a node that
    /// publishes nothing more.
    pub fn image_of(&self, unsent: bool) -> SubscriptionImage {
        SubscriptionImage {
            id: self.id,
            interval: self.interval,
            lifetime_count: self.lifetime_count,
            keep_alive_count: self.keep_alive_count,
            max_notifications: self.max_notifications,
            priority: self.priority,
            enabled: self.enabled,
            next_seq: self.next_seq,
            retransmission: self.retransmission.iter().cloned().collect(),
            next_item_id: self.next_item_id,
            items: self
                .items
                .iter()
                .map(|i| {
                    let (trigger, deadband, event_filter) = match &i.filter {
                        Filter::DataChange { trigger, deadband } => (*trigger, *deadband, None),
                        Filter::Event(c) => (
                            uascale_types::DataChangeTrigger::default(),
                            0.0,
                            Some(Box::new(c.source.clone())),
                        ),
                    };
                    let (last, queued, events) = if unsent {
                        let (last, queued) = i.unsent();
                        (last, queued, i.unsent_events())
                    } else {
                        (None, Vec::new(), Vec::new())
                    };
                    ItemImage {
                        id: i.id,
                        client_handle: i.client_handle,
                        target: (*i.target).clone(),
                        mode: i.mode,
                        sampling_interval: i.sampling_interval,
                        sampled: i.sampled,
                        queue_size: i.queue_size,
                        discard_oldest: i.discard_oldest,
                        timestamps: i.timestamps,
                        trigger,
                        deadband,
                        event_filter,
                        last,
                        queued,
                        events,
                    }
                })
                .collect(),
        }
    }

    /// The subscription an image describes, restored at `now` on another
    /// node: the same id, parameters, next sequence number and
    /// retransmission queue; its items have no value yet (the caller puts
    /// back the unsent ones, [`Self::restore_unsent`], once it counts
    /// against its session, then offers each item its current value).
    pub fn from_image(img: &SubscriptionImage, now: Instant) -> Self {
        let mut items: Vec<MonitoredItem> = img
            .items
            .iter()
            .filter_map(|i| {
                let filter = match &i.event_filter {
                    // Compiled on the node that created it, against the
                    // same address space: the event types were checked
                    // there. A filter that no longer compiles (a record
                    // from a newer build) drops only its item.
                    Some(ef) => Filter::Event(Box::new(event::compile(ef, &|_| true).ok()?.0)),
                    None => Filter::DataChange {
                        trigger: i.trigger,
                        deadband: i.deadband,
                    },
                };
                Some(MonitoredItem::new(
                    i.id,
                    i.client_handle,
                    i.target.clone(),
                    i.mode,
                    i.sampling_interval,
                    i.sampled,
                    i.queue_size,
                    i.discard_oldest,
                    i.timestamps,
                    filter,
                ))
            })
            .collect();
        items.sort_by_key(|i| i.id);
        items.dedup_by_key(|i| i.id);
        let mut s = Subscription {
            id: img.id,
            interval: img.interval,
            lifetime_count: img.lifetime_count,
            keep_alive_count: img.keep_alive_count,
            max_notifications: img.max_notifications,
            priority: img.priority,
            enabled: img.enabled,
            state: State::Normal,
            message_sent: false,
            more: false,
            lifetime_counter: img.lifetime_count,
            keep_alive_counter: img.keep_alive_count,
            late_since: 0,
            next_publish: now + img.interval,
            next_seq: img.next_seq.max(1),
            restored_seq: img.next_seq.max(1),
            retransmission: {
                let mut q = KeptQueue::new();
                for m in &img.retransmission {
                    q.push_back(m.clone());
                }
                q
            },
            next_item_id: img.next_item_id.max(1),
            items,
            sampling: None,
            data_hint: true,
            ready: Vec::new(),
        };
        s.list_all();
        s.items_changed();
        s
    }

    /// Puts back the unsent values of `img`'s items (the final record of
    /// a drain) into the items of the same id, ahead of any newer value.
    pub fn restore_unsent(&mut self, img: &SubscriptionImage) {
        let mut any = false;
        let account = Arc::clone(self.account());
        for i in &img.items {
            if i.last.is_none() && i.queued.is_empty() && i.events.is_empty() {
                continue;
            }
            if let Some(item) = self.items.iter_mut().find(|m| m.id == i.id) {
                item.restore_unsent(i.last.clone(), i.queued.clone(), &account);
                item.restore_unsent_events(i.events.clone(), &account);
                any = true;
            }
        }
        if any {
            self.list_all();
            self.items_changed();
        }
    }

    /// The items, to change (a restored subscription's first values).
    pub fn items_mut(&mut self) -> &mut [MonitoredItem] {
        self.list_all();
        &mut self.items
    }

    /// How many items the next publishing cycle visits (those that may
    /// have something to report).
    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }

    /// Puts every item on the ready list (after a change to all of them).
    fn list_all(&mut self) {
        self.data_hint = true;
        self.ready.clear();
        for i in &mut self.items {
            i.listed = true;
            self.ready.push(i.id);
        }
    }

    /// Puts item `idx` on the ready list.
    fn list(&mut self, idx: usize) {
        if let Some(i) = self.items.get_mut(idx) {
            if !i.listed {
                i.listed = true;
                self.ready.push(i.id);
            }
        }
    }
}

impl Subscription {
    /// A new subscription, its first publishing cycle ending one interval
    /// after `now`.
    pub fn new(id: u32, now: Instant, revised: Revised, r: &Requested, enabled: bool) -> Self {
        Subscription {
            id,
            interval: revised.publishing_interval,
            lifetime_count: revised.lifetime_count,
            keep_alive_count: revised.max_keep_alive_count,
            max_notifications: r.max_notifications_per_publish,
            priority: r.priority,
            enabled,
            state: State::Normal,
            message_sent: false,
            more: false,
            lifetime_counter: revised.lifetime_count,
            keep_alive_counter: revised.max_keep_alive_count,
            late_since: 0,
            next_publish: now + revised.publishing_interval,
            next_seq: 1,
            restored_seq: 0,
            retransmission: KeptQueue::new(),
            items: Vec::new(),
            next_item_id: 1,
            sampling: None,
            data_hint: false,
            ready: Vec::new(),
        }
    }

    /// ModifySubscription: new parameters; counters restart.
    pub fn modify(&mut self, now: Instant, revised: Revised, r: &Requested) {
        if revised.publishing_interval != self.interval {
            self.next_publish = now + revised.publishing_interval;
            // Sampled items follow the new publishing times.
            let next_publish = self.next_publish;
            for item in &mut self.items {
                if item.next_sample.is_some() {
                    item.schedule_sampling(now, next_publish);
                }
            }
            self.sampling_changed();
        }
        self.interval = revised.publishing_interval;
        self.lifetime_count = revised.lifetime_count;
        self.keep_alive_count = revised.max_keep_alive_count;
        self.lifetime_counter = revised.lifetime_count;
        self.keep_alive_counter = revised.max_keep_alive_count;
        self.max_notifications = r.max_notifications_per_publish;
        self.priority = r.priority;
        self.data_hint = true;
    }

    /// The items.
    pub fn items(&self) -> &[MonitoredItem] {
        &self.items
    }

    /// Where item `id` is in the list (sorted by id). Ids are handed out
    /// from 1 upwards, so until items are deleted item `id` sits at `id -
    /// 1`: that slot is tried first, and the binary search - about ten
    /// cache misses among a million items - runs only when it misses.
    fn index_of(&self, id: u32) -> Option<usize> {
        Self::find(&self.items, id)
    }

    /// The index of item `id` in `items` (sorted by id): tried at `id - 1`
    /// first, where items created in one go sit.
    fn find(items: &[MonitoredItem], id: u32) -> Option<usize> {
        let guess = (id as usize).wrapping_sub(1);
        if items.get(guess).is_some_and(|i| i.id == id) {
            return Some(guess);
        }
        items.binary_search_by_key(&id, |i| i.id).ok()
    }

    /// An item by id.
    pub fn item(&self, id: u32) -> Option<&MonitoredItem> {
        self.index_of(id).and_then(|i| self.items.get(i))
    }

    /// An item by id, to change it; call [`Subscription::items_changed`]
    /// after changing its sampling.
    pub fn item_mut(&mut self, id: u32) -> Option<&mut MonitoredItem> {
        let i = self.index_of(id)?;
        // Whoever changes an item may make it reportable.
        self.data_hint = true;
        self.list(i);
        self.items.get_mut(i)
    }

    /// A pushed value for item `id` was not queued (the session's values
    /// quota): its next queued value carries the Overflow bit.
    pub fn missed_value(&mut self, id: u32) {
        if let Some(i) = self.index_of(id).and_then(|i| self.items.get_mut(i)) {
            i.missed_value();
        }
    }

    /// [`Subscription::item_mut`] with the session's account beside it.
    fn item_mut_with_account(&mut self, id: u32) -> Option<(&mut MonitoredItem, &Arc<Account>)> {
        let i = self.index_of(id)?;
        self.data_hint = true;
        self.list(i);
        let account = self
            .retransmission
            .account()
            .unwrap_or_else(|| Account::detached_ref());
        Some((self.items.get_mut(i)?, account))
    }

    /// Makes room for `n` more items at once (CreateMonitoredItems with
    /// many items grows the list once, not once per item).
    pub fn reserve_items(&mut self, n: usize) {
        self.items.reserve_exact(n);
    }

    /// The id the next added item gets.
    pub fn next_item_id(&self) -> u32 {
        self.next_item_id
    }

    /// Adds an item built with [`Subscription::next_item_id`]; returns its id.
    pub fn add_item(&mut self, mut item: MonitoredItem) -> u32 {
        let id = item.id;
        item.bind_if_unbound(self.account());
        self.next_item_id = id.wrapping_add(1).max(1);
        self.items.reserve_exact(1);
        self.items.push(item);
        // It may carry its first value.
        self.data_hint = true;
        self.list(self.items.len() - 1);
        if self.items.len() > 1 && self.items[self.items.len() - 2].id > id {
            self.items.sort_by_key(|i| i.id);
        }
        // Only this item's timer is new: no walk over the others.
        if let Some(due) = self.item(id).and_then(|i| i.next_sample) {
            let rate = self
                .item(id)
                .map_or(0.0, |i| sample_rate(i.sampling_interval));
            let s = self.sampling.get_or_insert_with(Box::default);
            if let Err(at) = s.ids.binary_search(&id) {
                s.ids.insert(at, id);
                s.demand += rate;
                // The ids moved: the next pass starts a round afresh.
                s.cursor = 0;
                s.round_due = None;
            }
            s.due = Some(s.due.map_or(due, |d| d.min(due)));
        }
        id
    }

    /// The session's account (its item quotas).
    pub fn account(&self) -> &Arc<Account> {
        self.retransmission
            .account()
            .unwrap_or_else(|| Account::detached_ref())
    }

    /// Counts the subscription (items, queues, retained messages) against
    /// `account` from now on, moving it from the account it counted
    /// against: it was inserted into a session's set, created or
    /// transferred.
    pub fn bind(&mut self, account: &Arc<Account>) {
        if Arc::ptr_eq(self.account(), account) {
            return;
        }
        self.account().release_items(self.items.len());
        account.adopt_items(self.items.len());
        for i in &mut self.items {
            i.bind(account);
        }
        self.retransmission.bind(account);
    }

    /// Estimated bytes kept: queued notifications and retained messages.
    pub fn kept_bytes(&self) -> u64 {
        self.retransmission.bytes()
            + self
                .items
                .iter()
                .map(MonitoredItem::queued_bytes)
                .sum::<u64>()
    }

    /// Removes an item and every triggering link to it (its reservation
    /// in the session's account goes with it).
    pub fn remove_item(&mut self, id: u32) -> Option<MonitoredItem> {
        let i = self.index_of(id)?;
        let item = self.items.remove(i);
        self.account().release_items(1);
        for other in &mut self.items {
            other.links.retain(|l| *l != id);
        }
        if let Some(s) = self.sampling.as_mut() {
            if let Ok(at) = s.ids.binary_search(&id) {
                s.ids.remove(at);
                self.sampling_changed();
            }
        }
        Some(item)
    }

    /// Recomputes which items have a sampling timer and when the next
    /// sample is due (after items were changed; adding and removing one
    /// keeps both up to date).
    pub fn items_changed(&mut self) {
        let ids: Vec<u32> = self
            .items
            .iter()
            .filter(|i| i.next_sample.is_some())
            .map(|i| i.id)
            .collect();
        self.sampling = (!ids.is_empty()).then(|| {
            Box::new(Sampling {
                ids,
                ..Sampling::default()
            })
        });
        self.sampling_changed();
    }

    /// Recomputes when the next sample is due from the sampled items only
    /// (and lets the list go when none is left).
    fn sampling_changed(&mut self) {
        let Some(s) = self.sampling.as_mut() else {
            return;
        };
        if s.ids.is_empty() {
            self.sampling = None;
            return;
        }
        let items = &self.items;
        let sampled = || {
            s.ids
                .iter()
                .filter_map(|id| Self::find(items, *id).and_then(|i| items.get(i)))
        };
        let due = sampled().filter_map(|i| i.next_sample).min();
        let demand = sampled()
            .filter(|i| i.next_sample.is_some())
            .map(|i| sample_rate(i.sampling_interval))
            .sum();
        s.due = due;
        s.demand = demand;
        s.cursor = 0;
        s.round_due = None;
    }

    /// The samples a second this subscription's sampled items ask for.
    pub fn sampling_demand(&self) -> f64 {
        self.sampling.as_ref().map_or(0.0, |s| s.demand)
    }

    /// When the next sample of a sampled item is due.
    fn sample_due(&self) -> Option<Instant> {
        self.sampling.as_ref().and_then(|s| s.due)
    }

    /// How many items have a sampling timer (a sampling tick visits these).
    pub fn sampling_count(&self) -> usize {
        self.sampling.as_ref().map_or(0, |s| s.ids.len())
    }

    /// The message sequence numbers Republish can still return.
    pub fn available_sequence_numbers(&self) -> Vec<u32> {
        self.retransmission
            .iter()
            .map(|m| m.sequence_number)
            .collect()
    }

    /// A retained message (Republish).
    pub fn republish(&self, seq: u32) -> Option<&NotificationMessage> {
        self.retransmission
            .iter()
            .find(|m| m.sequence_number == seq)
    }

    /// An acknowledgement of message `seq`: it leaves the retransmission
    /// queue. On a subscription restored from a cluster mirror that has not
    /// sent a message yet, an acknowledgement at or after the restored next
    /// sequence number (within [`RESTORED_ACK_WINDOW`]) is of a message the
    /// old node sent after its last mirrored state: the client has it, so
    /// it is Good, and the next sequence number moves past it (the highest
    /// such acknowledgement wins) - this node never sends that number
    /// again with other content.
    fn acknowledge(&mut self, seq: u32) -> StatusCode {
        match self
            .retransmission
            .iter()
            .position(|m| m.sequence_number == seq)
        {
            Some(i) => {
                self.retransmission.remove(i);
                if self.retransmission.is_empty() {
                    // All acknowledged: keep no buffer while idle.
                    self.retransmission.release_buffer();
                }
                StatusCode::Good
            }
            None if self.acknowledged_past_restore(seq) => StatusCode::Good,
            None => StatusCode::BadSequenceNumberUnknown,
        }
    }

    /// The restored-subscription case of [`Subscription::acknowledge`]:
    /// true (and the next sequence number moved past `seq`) when `seq` is
    /// within the window after the restored next sequence number.
    fn acknowledged_past_restore(&mut self, seq: u32) -> bool {
        let floor = self.restored_seq;
        if floor == 0 || seq == 0 {
            return false;
        }
        // Distances along the sequence (numbers wrap from u32::MAX to 1).
        let ahead = seq.wrapping_sub(floor);
        if ahead >= RESTORED_ACK_WINDOW {
            return false;
        }
        let after = if seq == u32::MAX { 1 } else { seq + 1 };
        if self.next_seq.wrapping_sub(floor) <= ahead {
            self.next_seq = after;
        }
        true
    }

    /// [`Subscription::offer`] at `now`: idle cycles before it are counted
    /// first, so the value goes out with the next cycle after `now`.
    pub fn offer_at(&mut self, now: Instant, id: u32, value: uascale_types::DataValue) -> bool {
        self.catch_up(now);
        self.offer(id, value)
    }

    /// [`Subscription::offer_event`] at `now`.
    pub fn offer_event_at(
        &mut self,
        now: Instant,
        id: u32,
        fields: Vec<uascale_types::Variant>,
    ) -> bool {
        self.catch_up(now);
        self.offer_event(id, fields)
    }

    /// A value for item `id` (from a push); true when it was queued.
    pub fn offer(&mut self, id: u32, value: uascale_types::DataValue) -> bool {
        let Some((item, account)) = self.item_mut_with_account(id) else {
            return false;
        };
        if !item.offer(value) {
            return false;
        }
        item.bind_if_unbound(account);
        self.trigger_links_of(id);
        true
    }

    /// An event's fields for item `id`; true when queued.
    pub fn offer_event(&mut self, id: u32, fields: Vec<uascale_types::Variant>) -> bool {
        let Some((item, account)) = self.item_mut_with_account(id) else {
            return false;
        };
        if !item.offer_event(fields) {
            return false;
        }
        item.bind_if_unbound(account);
        self.trigger_links_of(id);
        true
    }

    /// A triggering item queued something: its linked items in Sampling
    /// mode report their queues with the next message.
    fn trigger_links_of(&mut self, id: u32) {
        let links = match self.item(id) {
            Some(i) if !i.links.is_empty() => i.links.clone(),
            _ => return,
        };
        for l in links {
            if let Some(t) = self.item_mut(l) {
                t.triggered = true;
            }
        }
    }

    /// True when publishing is enabled and some item has notifications.
    pub fn notifications_available(&self) -> bool {
        self.enabled
            && self
                .ready
                .iter()
                .any(|id| self.item(*id).is_some_and(MonitoredItem::reportable))
    }

    /// Runs the sampling timers that are due, reading values with `sample`,
    /// each next sample `stretch` times its interval away (the session's
    /// values quota), at most `left` samples (counted down): a pass cut
    /// short goes on where it stopped the next time.
    fn sample(
        &mut self,
        now: Instant,
        sample: &mut dyn FnMut(&item::ItemTarget) -> uascale_types::DataValue,
        stretch: f64,
        left: &mut usize,
    ) {
        let stretch = (stretch > 1.0).then_some(item::Stretch {
            factor: stretch,
            next_publish: self.next_publish,
            publishing: self.interval,
            memo: std::cell::Cell::new(None),
        });
        let Some(first) = self.sample_due().filter(|d| *d <= now) else {
            return;
        };
        // The idle cycles before the first due sample; a cycle due at the
        // same instant as a sample (the grid of `item::aligned_sample`)
        // runs after it, in this timer pass.
        if let Some(before) = first.checked_sub(Duration::from_nanos(1)) {
            self.catch_up(before);
        }
        let mut queued = Vec::new();
        let Some(sampling) = self.sampling.as_mut() else {
            return;
        };
        let mut due = sampling.round_due.take();
        let mut at = sampling.cursor.min(sampling.ids.len());
        let mut cut = false;
        while let Some(id) = sampling.ids.get(at) {
            let Some(item) = Self::find(&self.items, *id).and_then(|i| self.items.get_mut(i))
            else {
                at += 1;
                continue;
            };
            let due_now = item.next_sample.is_some_and(|d| d <= now);
            let cost = if due_now { SAMPLE_COST } else { 1 };
            if *left < cost {
                *left = 0;
                cut = true;
                break;
            }
            *left -= cost;
            if due_now {
                let v = sample(&item.target);
                if item.offer(v) {
                    item.bind_if_unbound(
                        self.retransmission
                            .account()
                            .unwrap_or_else(|| Account::detached_ref()),
                    );
                    self.data_hint = true;
                    if !item.listed {
                        item.listed = true;
                        self.ready.push(item.id);
                    }
                    if !item.links.is_empty() {
                        queued.push(item.id);
                    }
                }
                item.sampled_at(now, stretch.as_ref());
            }
            if let Some(t) = item.next_sample {
                due = Some(due.map_or(t, |d| d.min(t)));
            }
            at += 1;
        }
        if cut {
            // The rest of the round is due now; what was visited is kept.
            sampling.cursor = at;
            sampling.round_due = due;
            sampling.due = Some(now);
        } else {
            sampling.cursor = 0;
            sampling.due = due;
        }
        for id in queued {
            self.trigger_links_of(id);
        }
    }

    /// The earliest of the publishing timer and the next sample.
    pub fn poll_timeout(&self) -> Instant {
        let publish = self.wake_at();
        match self.sample_due() {
            Some(s) => s.min(publish),
            None => publish,
        }
    }

    /// Accounts for `k` idle publishing cycles that were not run one by one
    /// (see [`Subscription::poll_timeout`]): counters count down, the timer
    /// moves on. [`Subscription::wake_at`] never lets them reach the cycle
    /// where something would happen; the bounds here are only a guard.
    fn skip_cycles(&mut self, k: u32) {
        if k == 0 {
            return;
        }
        if self.idle_normal() {
            // The first idle cycle after a message: NORMAL -> KEEPALIVE,
            // counting as the first cycle of the keep-alive period.
            self.state = State::KeepAlive;
            self.keep_alive_counter = self.keep_alive_count.saturating_sub(1).max(1);
        }
        if self.state != State::Normal {
            if self.state == State::KeepAlive {
                self.keep_alive_counter = self.keep_alive_counter.saturating_sub(k).max(1);
            }
            self.lifetime_counter = self.lifetime_counter.saturating_sub(k).max(1);
        }
        if let Some(t) = self
            .interval
            .checked_mul(k)
            .and_then(|d| self.next_publish.checked_add(d))
        {
            self.next_publish = t;
        }
    }

    /// Brings the timer up to `t` (the idle cycles due by then, never the
    /// one where something happens), before something outside the timer
    /// (a Publish) changes the counters.
    fn catch_up(&mut self, t: Instant) {
        let Some(d) = t.checked_duration_since(self.next_publish) else {
            return;
        };
        let iv = self.interval.as_nanos().max(1);
        let idle = self.wake_at().saturating_duration_since(self.next_publish);
        let k = (d.as_nanos() / iv + 1).min(idle.as_nanos() / iv);
        self.skip_cycles(u32::try_from(k).unwrap_or(u32::MAX));
    }

    /// When the publishing timer next has work. With nothing queued, a
    /// KEEPALIVE subscription only counts down to its keep-alive and a LATE
    /// one to its lifetime's end: those cycles are skipped and counted in
    /// one step when it wakes (an item queuing something brings the next
    /// cycle back), so idle subscriptions cost no timer work per cycle.
    fn wake_at(&self) -> Instant {
        let idle_normal = self.idle_normal();
        if self.data_hint || self.more || (self.state == State::Normal && !idle_normal) {
            return self.next_publish;
        }
        let cycle = |k: u32| {
            self.interval
                .checked_mul(k.saturating_sub(1))
                .and_then(|d| self.next_publish.checked_add(d))
                .unwrap_or(self.next_publish)
        };
        let lifetime = cycle(self.lifetime_counter);
        match self.state {
            State::KeepAlive => cycle(self.keep_alive_counter).min(lifetime),
            // Turns KEEPALIVE at the next cycle, keep-alive K cycles on.
            State::Normal => cycle(self.keep_alive_count).min(lifetime),
            State::Late => lifetime,
        }
    }

    /// NORMAL with its first message sent and nothing to send: its next
    /// cycles only count towards a keep-alive (needs a keep-alive count
    /// above 1, else the next cycle already sends one).
    fn idle_normal(&self) -> bool {
        self.state == State::Normal
            && self.message_sent
            && !self.data_hint
            && !self.more
            && self.keep_alive_count > 1
    }

    fn take_seq(&mut self) -> u32 {
        // Its first message on this node: from here on the numbers are its
        // own, and acknowledgements past them are unknown again.
        self.restored_seq = 0;
        let s = self.next_seq;
        self.next_seq = if s == u32::MAX { 1 } else { s + 1 };
        s
    }

    /// Builds the next notification message from the item queues, at most
    /// `limit` notifications (0 = all); returns it and whether more remain.
    fn build_message(
        &mut self,
        utc: DateTime,
        limit: usize,
        keep: usize,
    ) -> (NotificationMessage, bool) {
        let mut data = Vec::new();
        let mut events = Vec::new();
        let mut left = limit;
        // Only the listed items, in item order; those left with something
        // to report stay listed.
        let mut ready = std::mem::take(&mut self.ready);
        ready.sort_unstable();
        let mut still = Vec::new();
        for id in ready {
            let Some(idx) = self.index_of(id) else {
                continue;
            };
            let item = &mut self.items[idx];
            if limit != 0 && left == 0 {
                if item.reportable() {
                    still.push(id);
                } else {
                    item.listed = false;
                }
                continue;
            }
            if !item.reportable() {
                // Nothing to send now; listed again when it changes.
                item.listed = false;
                continue;
            }
            let handle = item.client_handle;
            let before = item.queued();
            for q in item.drain(left) {
                match q {
                    Queued::Value(value) => data.push(MonitoredItemNotification {
                        client_handle: handle,
                        value,
                    }),
                    Queued::Event(fields) | Queued::Overflow(fields) => {
                        events.push(EventFieldList {
                            client_handle: handle,
                            event_fields: Some(fields),
                        })
                    }
                }
            }
            if limit != 0 {
                left -= before - item.queued();
            }
            if item.reportable() {
                still.push(id);
            } else {
                item.listed = false;
            }
        }
        let more = !still.is_empty();
        self.ready = still;
        let mut notification_data = Vec::new();
        if !data.is_empty() {
            notification_data.push(ExtensionObject::new(DataChangeNotification {
                monitored_items: Some(data),
                diagnostic_infos: Some(vec![]),
            }));
        }
        if !events.is_empty() {
            notification_data.push(ExtensionObject::new(EventNotificationList {
                events: Some(events),
            }));
        }
        let msg = NotificationMessage {
            sequence_number: self.take_seq(),
            publish_time: utc,
            notification_data: Some(notification_data),
        };
        self.retain(msg.clone(), keep);
        (msg, more)
    }

    fn retain(&mut self, msg: NotificationMessage, keep: usize) {
        if keep == 0 {
            return;
        }
        while self.retransmission.len() >= keep {
            self.retransmission.pop_front();
        }
        self.retransmission.push_back(msg);
        // Over the session's retransmission quota or its fair share of the
        // budget: the oldest unacknowledged messages go first (a Republish
        // of one is BadMessageNotAvailable); the newest stays.
        let mut shed = 0;
        while self.retransmission.len() > 1 && shed < 2 && self.retransmission.must_shed() {
            self.retransmission.pop_front();
            shed += 1;
        }
    }

    fn keep_alive(&self, utc: DateTime) -> NotificationMessage {
        NotificationMessage {
            sequence_number: self.next_seq,
            publish_time: utc,
            notification_data: Some(vec![]),
        }
    }

    /// A transferred subscription starts over in its new session: counters
    /// reset, and its first cycle sends a message (notifications or a
    /// keep-alive) so the new owner knows it is there.
    pub fn reset_for_transfer(&mut self, now: Instant) {
        self.state = State::Normal;
        self.message_sent = false;
        self.lifetime_counter = self.lifetime_count;
        self.keep_alive_counter = self.keep_alive_count;
        self.next_publish = self.next_publish.min(now + self.interval);
    }

    /// Queues every item's last value again (TransferSubscriptions with
    /// sendInitialValues).
    pub fn requeue_last_values(&mut self) {
        for i in &mut self.items {
            i.requeue_last();
            i.bind_if_unbound(
                self.retransmission
                    .account()
                    .unwrap_or_else(|| Account::detached_ref()),
            );
        }
        self.list_all();
    }

    /// Its row of the SubscriptionDiagnosticsArray.
    pub fn diagnostics(
        &self,
        session: &uascale_types::NodeId,
    ) -> uascale_types::SubscriptionDiagnosticsDataType {
        let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        uascale_types::SubscriptionDiagnosticsDataType {
            session_id: session.clone(),
            subscription_id: self.id,
            priority: self.priority,
            publishing_interval: self.interval.as_secs_f64() * 1000.0,
            max_keep_alive_count: self.keep_alive_count,
            max_lifetime_count: self.lifetime_count,
            max_notifications_per_publish: self.max_notifications,
            publishing_enabled: self.enabled,
            current_keep_alive_count: self.keep_alive_counter,
            current_lifetime_count: self.lifetime_counter,
            unacknowledged_message_count: n(self.retransmission.len()),
            monitored_item_count: n(self.items.len()),
            disabled_monitored_item_count: n(self
                .items
                .iter()
                .filter(|i| i.mode == uascale_types::MonitoringMode::Disabled)
                .count()),
            next_sequence_number: self.next_seq,
            ..Default::default()
        }
    }

    /// SetPublishingMode.
    pub fn set_publishing_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        self.data_hint = true;
    }
}

/// What answers a Publish: a response, or a ServiceFault.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A PublishResponse.
    Publish(Box<PublishResponse>),
    /// A ServiceFault with this handle and status.
    Fault {
        /// The request's handle.
        request_handle: u32,
        /// Why.
        status: StatusCode,
    },
}

/// A parked Publish answered, with whatever the caller parked it with.
#[derive(Debug)]
pub struct Reply<P> {
    /// The handle to answer through.
    pub to: P,
    /// The answer.
    pub answer: Answer,
}

#[derive(Debug)]
struct Waiting<P> {
    to: P,
    channel_id: u32,
    handle: u32,
    deadline: Option<Instant>,
    results: Vec<StatusCode>,
}

/// The subscriptions of one session and the Publish requests it parked.
#[derive(Debug)]
pub struct SubscriptionSet<P> {
    subs: Vec<Subscription>,
    queue: VecDeque<Waiting<P>>,
    /// StatusChange messages owed (subscription id, sequence number, status).
    status_changes: VecDeque<(u32, u32, StatusCode)>,
    late_seq: u64,
    /// The earliest deadline this set has in the registry's heap.
    pub(crate) scheduled: Option<Instant>,
    /// False once the session is gone (the set only lives on for transfers).
    pub(crate) alive: bool,
    /// Who the session's user is (TransferSubscriptions: same user only).
    user: Option<crate::identity::UserIdentity>,
    /// The session's account: quotas and kept bytes.
    account: Arc<Account>,
    /// The session's pushed values this second
    /// (`max_values_per_second_per_session`).
    values: crate::quota::ValueRate,
}

impl<P> Default for SubscriptionSet<P> {
    /// A set under no quota.
    fn default() -> Self {
        SubscriptionSet::with_account(Account::detached())
    }
}

impl<P> SubscriptionSet<P> {
    /// An empty set counting against `account`.
    pub fn with_account(account: Arc<Account>) -> Self {
        SubscriptionSet {
            subs: Vec::new(),
            queue: VecDeque::new(),
            status_changes: VecDeque::new(),
            late_seq: 0,
            scheduled: None,
            alive: true,
            user: None,
            account,
            values: crate::quota::ValueRate::default(),
        }
    }

    /// Whether the session may take one more pushed value at `now` under
    /// `max_values_per_second_per_session` (counted when not).
    pub fn take_value(&mut self, now: Instant) -> bool {
        let budget = self.account.budget();
        let ok = self
            .values
            .take(now, budget.quotas().max_values_per_second_per_session);
        if !ok {
            budget.count(crate::quota::Quota::ValuesPerSecondPerSession);
        }
        ok
    }

    /// How much slower than asked the session's sampled items are sampled
    /// (see [`crate::quota::sampling_stretch`]).
    pub fn sampling_stretch(&self) -> f64 {
        let demand: f64 = self.subs.iter().map(Subscription::sampling_demand).sum();
        crate::quota::sampling_stretch(
            demand,
            self.account
                .budget()
                .quotas()
                .max_values_per_second_per_session,
        )
    }

    /// The session's account.
    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// Records the session's user (its subscriptions go only to sessions
    /// of the same user).
    pub fn set_user(&mut self, user: crate::identity::UserIdentity) {
        self.user = Some(user);
    }

    /// The session's user, when recorded.
    pub fn user(&self) -> Option<&crate::identity::UserIdentity> {
        self.user.as_ref()
    }

    /// The subscriptions.
    pub fn subscriptions(&self) -> &[Subscription] {
        &self.subs
    }

    /// A subscription by id.
    pub fn get(&self, id: u32) -> Option<&Subscription> {
        self.subs.iter().find(|s| s.id == id)
    }

    /// The subscriptions, to change.
    pub fn subscriptions_mut(&mut self) -> &mut [Subscription] {
        &mut self.subs
    }

    /// A subscription by id, to change.
    pub fn get_mut(&mut self, id: u32) -> Option<&mut Subscription> {
        self.subs.iter_mut().find(|s| s.id == id)
    }

    /// Publish requests parked now.
    pub fn parked(&self) -> usize {
        self.queue.len()
    }

    /// Adds a subscription (created, or transferred in); it counts
    /// against this session's account from now on.
    pub fn insert(&mut self, mut sub: Subscription) {
        sub.bind(&self.account);
        self.subs.reserve_exact(1);
        self.subs.push(sub);
    }

    /// Removes a subscription (deleted, or transferred out).
    pub fn remove(&mut self, id: u32) -> Option<Subscription> {
        let i = self.subs.iter().position(|s| s.id == id)?;
        Some(self.subs.remove(i))
    }

    /// Owes the client a StatusChange for subscription `id` (the
    /// subscription itself is already gone or moved); it goes out with a
    /// parked Publish if there is one, else with the next.
    pub fn status_change(
        &mut self,
        now: Now,
        id: u32,
        seq: u32,
        status: StatusCode,
        out: &mut Vec<Reply<P>>,
    ) {
        self.status_changes.push_back((id, seq, status));
        self.flush_status_changes(now, out);
    }

    fn flush_status_changes(&mut self, now: Now, out: &mut Vec<Reply<P>>) {
        while !self.status_changes.is_empty() {
            let Some(w) = self.queue.pop_front() else {
                return;
            };
            self.answer_status_change(now, w, out);
        }
    }

    fn answer_status_change(&mut self, now: Now, w: Waiting<P>, out: &mut Vec<Reply<P>>) {
        let Some((id, seq, status)) = self.status_changes.pop_front() else {
            return;
        };
        let msg = NotificationMessage {
            sequence_number: seq,
            publish_time: now.utc,
            notification_data: Some(vec![ExtensionObject::new(StatusChangeNotification {
                status,
                diagnostic_info: Default::default(),
            })]),
        };
        out.push(reply(now, w, id, vec![], false, msg));
    }

    /// A Publish arrived on secure channel `channel_id`: acknowledgements
    /// are applied, then it is answered
    /// at once (a late subscription, an owed StatusChange, or a fault) or
    /// parked until a subscription's timer needs it or `deadline` passes.
    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &mut self,
        now: Now,
        channel_id: u32,
        request_handle: u32,
        acks: &[SubscriptionAcknowledgement],
        deadline: Option<Instant>,
        to: P,
        limits: &SubscriptionLimits,
        out: &mut Vec<Reply<P>>,
    ) {
        self.publish_or_park(
            now,
            channel_id,
            request_handle,
            acks,
            deadline,
            to,
            limits,
            false,
            out,
        );
    }

    /// [`SubscriptionSet::publish`]; with `park`, on a node that
    /// publishes nothing more (a cluster node that wrote its final records,
    /// [`registry::Registry::hold`]): its acknowledgements are applied and
    /// it is parked, never answered with a NotificationMessage here - what
    /// the records say the client was sent stays true. Its channel closes;
    /// the client publishes again on the node that takes its session over.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish_or_park(
        &mut self,
        now: Now,
        channel_id: u32,
        request_handle: u32,
        acks: &[SubscriptionAcknowledgement],
        deadline: Option<Instant>,
        to: P,
        limits: &SubscriptionLimits,
        park: bool,
        out: &mut Vec<Reply<P>>,
    ) {
        let results = acks
            .iter()
            .map(|a| match self.get_mut(a.subscription_id) {
                Some(s) => s.acknowledge(a.sequence_number),
                None => StatusCode::BadSubscriptionIdInvalid,
            })
            .collect();
        let w = Waiting {
            to,
            channel_id,
            handle: request_handle,
            deadline,
            results,
        };
        // A session lives on one secure channel: Publishes parked from an
        // earlier one (before the client reconnected and re-activated) can
        // never be answered, and must not take messages meant for this one.
        self.queue.retain(|q| q.channel_id == channel_id);
        if !park && !self.status_changes.is_empty() {
            self.answer_status_change(now, w, out);
            return;
        }
        if self.subs.is_empty() {
            out.push(Reply {
                to: w.to,
                answer: Answer::Fault {
                    request_handle,
                    status: StatusCode::BadNoSubscription,
                },
            });
            return;
        }
        for s in &mut self.subs {
            s.catch_up(now.instant);
            s.lifetime_counter = s.lifetime_count;
        }
        let late = self
            .subs
            .iter()
            .enumerate()
            .filter(|(_, s)| !park && s.state == State::Late)
            .max_by_key(|(_, s)| (s.priority, std::cmp::Reverse(s.late_since)))
            .map(|(i, _)| i);
        match late {
            Some(i) => {
                let s = &mut self.subs[i];
                if s.enabled && (s.more || s.notifications_available()) {
                    self.send_notifications(now, i, w, limits, out);
                } else {
                    let s = &mut self.subs[i];
                    s.state = State::KeepAlive;
                    s.keep_alive_counter = s.keep_alive_count;
                    s.message_sent = true;
                    let msg = s.keep_alive(now.utc);
                    let avail = s.available_sequence_numbers();
                    let id = s.id;
                    out.push(reply(now, w, id, avail, false, msg));
                }
            }
            None => {
                self.queue.reserve_exact(1);
                self.queue.push_back(w);
                while self.queue.len() > limits.max_publish_request_count.max(1) {
                    if let Some(old) = self.queue.pop_front() {
                        out.push(fault(old, StatusCode::BadTooManyPublishRequests));
                    }
                }
            }
        }
    }

    /// Sends subscription `i`'s notifications with `w`, then keeps going
    /// with further parked Publishes while notifications remain.
    fn send_notifications(
        &mut self,
        now: Now,
        i: usize,
        w: Waiting<P>,
        limits: &SubscriptionLimits,
        out: &mut Vec<Reply<P>>,
    ) {
        let mut w = Some(w);
        while let Some(this) = w.take() {
            let Some(s) = self.subs.get_mut(i) else {
                return;
            };
            let limit = match (s.max_notifications, limits.max_notifications_per_publish) {
                (0, l) | (l, 0) => l,
                (a, b) => a.min(b),
            } as usize;
            let (msg, more) = s.build_message(now.utc, limit, limits.max_retransmission_queue);
            s.message_sent = true;
            s.more = more;
            s.lifetime_counter = s.lifetime_count;
            s.keep_alive_counter = s.keep_alive_count;
            s.state = State::Normal;
            let avail = s.available_sequence_numbers();
            out.push(reply(now, this, s.id, avail, more, msg));
            if more {
                match self.queue.pop_front() {
                    Some(next) => w = Some(next),
                    None => self.make_late(i),
                }
            }
        }
    }

    fn make_late(&mut self, i: usize) {
        self.late_seq += 1;
        if let Some(s) = self.subs.get_mut(i) {
            if s.state != State::Late {
                s.state = State::Late;
                s.late_since = self.late_seq;
            }
        }
    }

    /// Republish: a retained message of subscription `id`.
    pub fn republish(&self, id: u32, seq: u32) -> Result<NotificationMessage, StatusCode> {
        let s = self.get(id).ok_or(StatusCode::BadSubscriptionIdInvalid)?;
        s.republish(seq)
            .cloned()
            .ok_or(StatusCode::BadMessageNotAvailable)
    }

    /// The earliest moment something is due: a publishing timer, a sample,
    /// or a parked Publish's timeout.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let subs = self.subs.iter().map(Subscription::poll_timeout).min();
        let parked = self.queue.iter().filter_map(|w| w.deadline).min();
        match (subs, parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs what is due at `now`: samples (read with `sample`), publishing
    /// timers, Publish timeouts. Answers go to `out`; subscriptions whose
    /// lifetime ran out are returned (a StatusChange BadTimeout is owed).
    pub fn handle_timeout(
        &mut self,
        now: Now,
        sample: &mut dyn FnMut(&item::ItemTarget) -> uascale_types::DataValue,
        limits: &SubscriptionLimits,
        out: &mut Vec<Reply<P>>,
    ) -> Vec<Subscription> {
        let t = now.instant;
        // Publish requests past their timeoutHint.
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].deadline.is_some_and(|d| d <= t) {
                if let Some(w) = self.queue.remove(i) {
                    out.push(fault(w, StatusCode::BadTimeout));
                }
            } else {
                i += 1;
            }
        }
        // At most WORK_PER_PASS: a pass cut short leaves the
        // set due now, for the registry to run again after the others.
        let stretch = self.sampling_stretch();
        let mut left = WORK_PER_PASS;
        for s in &mut self.subs {
            s.sample(t, sample, stretch, &mut left);
        }
        // Publishing timers, by priority.
        let mut due: Vec<usize> = (0..self.subs.len())
            .filter(|&i| self.subs[i].next_publish <= t)
            .collect();
        due.sort_by_key(|&i| std::cmp::Reverse(self.subs[i].priority));
        let mut expired = Vec::new();
        for i in due {
            if self.publishing_timer(now, i, limits, out) {
                expired.push(i);
            }
        }
        // Removed from the back: `due` ran by priority, so the indices
        // must be put in order first (else a removal shifts the ones
        // after it and the wrong subscription goes, or the index is out of
        // bounds).
        expired.sort_unstable();
        let mut gone = Vec::new();
        for i in expired.into_iter().rev() {
            let s = self.subs.remove(i);
            let seq = s.next_seq;
            self.status_changes
                .push_back((s.id, seq, StatusCode::BadTimeout));
            gone.push(s);
        }
        if !gone.is_empty() {
            self.release_if_empty(now, out);
        }
        gone
    }

    /// One expiry of subscription `i`'s publishing timer; true when its
    /// lifetime ran out.
    fn publishing_timer(
        &mut self,
        now: Now,
        i: usize,
        limits: &SubscriptionLimits,
        out: &mut Vec<Reply<P>>,
    ) -> bool {
        let t = now.instant;
        let Some(s) = self.subs.get_mut(i) else {
            return false;
        };
        // Cycles that passed without a timer run (skipped while idle, or
        // the timer task was late) are counted, then this one is run.
        let behind = t
            .checked_duration_since(s.next_publish)
            .map_or(0, |d| d.as_nanos() / s.interval.as_nanos().max(1));
        s.skip_cycles(u32::try_from(behind).unwrap_or(u32::MAX));
        s.next_publish = s
            .next_publish
            .checked_add(s.interval)
            .unwrap_or(t + s.interval);
        let avail = s.notifications_available() || (s.enabled && s.more);
        let queued = !self.queue.is_empty();
        let mut sent = false;
        match s.state {
            State::Normal | State::KeepAlive if queued && avail => {
                if let Some(w) = self.queue.pop_front() {
                    self.send_notifications(now, i, w, limits, out);
                    sent = true;
                }
            }
            State::Normal if queued && !s.message_sent => {
                sent = self.send_keep_alive(now, i, out);
            }
            State::Normal if !s.message_sent || avail => self.make_late(i),
            State::Normal => {
                // This cycle counts as the first of the keep-alive period.
                s.state = State::KeepAlive;
                s.keep_alive_counter = s.keep_alive_count.saturating_sub(1).max(1);
                if s.keep_alive_count == 1 {
                    if queued {
                        sent = self.send_keep_alive(now, i, out);
                    } else {
                        self.make_late(i);
                    }
                }
            }
            State::KeepAlive if !avail && s.keep_alive_counter > 1 => {
                s.keep_alive_counter -= 1;
            }
            State::KeepAlive if queued => {
                sent = self.send_keep_alive(now, i, out);
            }
            State::KeepAlive => self.make_late(i),
            State::Late => {}
        }
        let Some(s) = self.subs.get_mut(i) else {
            return false;
        };
        s.data_hint = s.notifications_available();
        if sent {
            s.lifetime_counter = s.lifetime_count;
            return false;
        }
        s.lifetime_counter = s.lifetime_counter.saturating_sub(1);
        s.lifetime_counter == 0
    }

    fn send_keep_alive(&mut self, now: Now, i: usize, out: &mut Vec<Reply<P>>) -> bool {
        let Some(w) = self.queue.pop_front() else {
            return false;
        };
        let Some(s) = self.subs.get_mut(i) else {
            return false;
        };
        s.state = State::KeepAlive;
        s.keep_alive_counter = s.keep_alive_count;
        s.message_sent = true;
        let msg = s.keep_alive(now.utc);
        let avail = s.available_sequence_numbers();
        out.push(reply(now, w, s.id, avail, false, msg));
        true
    }

    /// When the last subscription is gone (deleted, transferred, expired),
    /// parked Publishes are answered `BadNoSubscription` (Part 4 §5.13.8),
    /// after any StatusChange they still had to carry.
    pub fn release_if_empty(&mut self, now: Now, out: &mut Vec<Reply<P>>) {
        self.flush_status_changes(now, out);
        if self.subs.is_empty() && self.status_changes.is_empty() {
            self.drain_parked(StatusCode::BadNoSubscription, out);
        }
    }

    /// Answers every parked Publish with `status` (the session closed).
    pub fn drain_parked(&mut self, status: StatusCode, out: &mut Vec<Reply<P>>) {
        while let Some(w) = self.queue.pop_front() {
            out.push(fault(w, status));
        }
    }

    /// Removes every subscription (session closed with deleteSubscriptions).
    pub fn take_all(&mut self) -> Vec<Subscription> {
        std::mem::take(&mut self.subs)
    }
}

fn fault<P>(w: Waiting<P>, status: StatusCode) -> Reply<P> {
    Reply {
        to: w.to,
        answer: Answer::Fault {
            request_handle: w.handle,
            status,
        },
    }
}

impl KeptSize for NotificationMessage {
    const STAGE: Stage = Stage::Retransmission;
    /// The notifications it carries, estimated as they were queued.
    fn kept_size(&self) -> u64 {
        let mut n = std::mem::size_of::<NotificationMessage>() as u64;
        for eo in self.notification_data.iter().flatten() {
            n += 64;
            if let Some(d) = eo.downcast_ref::<DataChangeNotification>() {
                for m in d.monitored_items.iter().flatten() {
                    n += std::mem::size_of::<MonitoredItemNotification>() as u64
                        + m.value.value.as_ref().map_or(0, item::variant_heap);
                }
            } else if let Some(e) = eo.downcast_ref::<EventNotificationList>() {
                for f in e.events.iter().flatten() {
                    n += Queued::Event(Vec::new()).kept_size();
                    for v in f.event_fields.iter().flatten() {
                        n += std::mem::size_of::<uascale_types::Variant>() as u64
                            + item::variant_heap(v);
                    }
                }
            }
        }
        n
    }
}

fn reply<P>(
    now: Now,
    w: Waiting<P>,
    subscription_id: u32,
    available: Vec<u32>,
    more: bool,
    msg: NotificationMessage,
) -> Reply<P> {
    Reply {
        to: w.to,
        answer: Answer::Publish(Box::new(PublishResponse {
            response_header: ResponseHeader {
                timestamp: now.utc,
                request_handle: w.handle,
                service_result: StatusCode::Good,
                ..Default::default()
            },
            subscription_id,
            available_sequence_numbers: Some(available),
            more_notifications: more,
            notification_message: msg,
            results: Some(w.results),
            diagnostic_infos: Some(vec![]),
        })),
    }
}

/// The sequence number the next message of `s` will carry (the
/// StatusChange of a transfer takes it).
pub fn next_sequence_number(s: &Subscription) -> u32 {
    s.next_seq
}
