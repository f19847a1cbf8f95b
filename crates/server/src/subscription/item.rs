//! A monitored item (Part 4 §5.12.1): what it watches, its monitoring mode,
//! its filter and its queue of notifications waiting for a Publish.
//!
//! Items are fed values either by a push from the node's manager (a write
//! or a simulation step: no timer at all) or by their sampling timer, which
//! the subscription runs from the `now` it is given.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_types::{
    ArrayValues, DataChangeTrigger, DataValue, DateTime, MonitoringMode, NodeId, StatusCode,
    TimestampsToReturn, UaString, Variant,
};

pub use super::event::number;

use crate::quota::{Account, KeptQueue, KeptSize, Stage};

/// The Overflow bit with the DataValue info type (Part 4 §7.39.1, bits 10
/// and 7 of the StatusCode): set on a value next to ones the queue dropped.
pub const OVERFLOW_BITS: u32 = 0x0480;

/// What an item watches. Items share it: the registry hands out one
/// [`Arc`] per (node, attribute, range) that items watch
/// ([`super::registry::Registry::intern_target`]), so a node watched by a
/// thousand items holds its NodeId once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ItemTarget {
    /// The node.
    pub node_id: NodeId,
    /// The attribute (13 = Value).
    pub attribute_id: u32,
    /// The IndexRange of the ReadValueId (null for the whole value).
    pub index_range: UaString,
}

/// How an item decides that a new value is a change worth reporting.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// DataChangeFilter (also the default, StatusValue with no deadband).
    DataChange {
        /// Status, StatusValue or StatusValueTimestamp.
        trigger: DataChangeTrigger,
        /// Absolute deadband (a percent deadband is turned into this from
        /// the node's EURange when the item is created); 0 for none.
        deadband: f64,
    },
    /// An event item: the compiled EventFilter decides what it reports.
    Event(Box<super::event::CompiledEventFilter>),
}

impl Default for Filter {
    fn default() -> Self {
        Filter::DataChange {
            trigger: DataChangeTrigger::StatusValue,
            deadband: 0.0,
        }
    }
}

/// One queued notification.
#[derive(Debug, Clone, PartialEq)]
pub enum Queued {
    /// A data change.
    Value(DataValue),
    /// An event's selected fields.
    Event(Vec<Variant>),
    /// The selected fields of the EventQueueOverflow event an event item
    /// put in place of the events it discarded (its own variant, so that
    /// the queue tells where it stands and a second one is not made).
    Overflow(Vec<Variant>),
}

/// An item's notifications waiting for a Publish. A data-change item with
/// a queue of one (the default, and most items) holds at most its latest
/// value, which `last` already holds: it keeps a mark instead of a copy, so
/// that a million items changing every second hold no queue allocation.
#[derive(Debug, Clone, Default)]
enum Pending {
    /// Nothing waiting.
    #[default]
    Empty,
    /// The item's last value waits (queue of one, data change).
    Last,
    /// Values or events waiting in a queue longer than one, or an event
    /// item's queue, counted against the session's account. Boxed:
    /// inline, the queue would make every item larger for the few with
    /// such queues.
    Queue(Box<KeptQueue<Queued>>),
}

/// What [`MonitoredItem::drain`] hands out.
#[derive(Debug)]
pub enum Drained {
    /// The last value (or nothing).
    One(Option<Queued>),
    /// Taken from a queue.
    Many(std::collections::vec_deque::IntoIter<Queued>),
}

impl Iterator for Drained {
    type Item = Queued;
    fn next(&mut self) -> Option<Queued> {
        match self {
            Drained::One(q) => q.take(),
            Drained::Many(it) => it.next(),
        }
    }
}

/// A monitored item.
#[derive(Debug, Clone)]
pub struct MonitoredItem {
    /// Server-assigned id, unique within its subscription.
    pub id: u32,
    /// The client's handle, echoed in every notification.
    pub client_handle: u32,
    /// What it watches (shared with the other items watching it).
    pub target: Arc<ItemTarget>,
    /// Disabled, Sampling or Reporting.
    pub mode: MonitoringMode,
    /// The revised sampling interval.
    pub sampling_interval: Duration,
    /// When the next sample is due; `None` for pushed items (their manager
    /// reports every change) and disabled ones.
    pub next_sample: Option<Instant>,
    /// True when values come from the sampling timer rather than pushes.
    pub sampled: bool,
    /// The revised queue size (at least 1).
    pub queue_size: u32,
    /// Which end of a full queue is dropped.
    pub discard_oldest: bool,
    /// Which timestamps notifications carry.
    pub timestamps: TimestampsToReturn,
    /// The filter.
    pub filter: Filter,
    /// The last value that passed the filter (what the next is compared to).
    last: Option<DataValue>,
    pending: Pending,
    /// Items this one triggers (SetTriggering).
    pub links: Vec<u32>,
    /// Set when a triggering item reported: a Sampling item's queue goes out
    /// with the next message.
    pub triggered: bool,
    /// On its subscription's ready list (the items that may have something
    /// to report; a publishing cycle visits only those).
    pub(super) listed: bool,
    /// A pushed value was not queued (the session's values quota): the
    /// next value queued carries the Overflow bit. A flag here rather than
    /// a mark on the newest waiting value: that would touch the queue's
    /// memory for every value dropped, which cost a rogue's 250,000 items
    /// more than the values it was spared.
    missed: bool,
}

impl MonitoredItem {
    /// A new item; `queue_size` is already revised (at least 1).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u32,
        client_handle: u32,
        target: impl Into<Arc<ItemTarget>>,
        mode: MonitoringMode,
        sampling_interval: Duration,
        sampled: bool,
        queue_size: u32,
        discard_oldest: bool,
        timestamps: TimestampsToReturn,
        filter: Filter,
    ) -> Self {
        MonitoredItem {
            id,
            client_handle,
            target: target.into(),
            mode,
            sampling_interval,
            next_sample: None,
            sampled,
            queue_size: queue_size.max(1),
            discard_oldest,
            timestamps,
            filter,
            last: None,
            pending: Pending::Empty,
            links: Vec::new(),
            triggered: false,
            listed: false,
            missed: false,
        }
    }

    /// True for event items.
    pub fn is_event(&self) -> bool {
        matches!(self.filter, Filter::Event(_))
    }

    /// Notifications waiting.
    pub fn queued(&self) -> usize {
        match &self.pending {
            Pending::Empty => 0,
            Pending::Last => 1,
            Pending::Queue(q) => q.len(),
        }
    }

    /// True when a value is kept as the mark (the latest value) rather than
    /// in a queue: a data-change item with a queue of one.
    pub fn keeps_last_only(&self) -> bool {
        self.queue_size == 1 && !self.is_event()
    }

    /// The waiting notifications as a queue (the mark becomes the last
    /// value it stands for).
    fn queue_mut(&mut self) -> &mut KeptQueue<Queued> {
        if !matches!(self.pending, Pending::Queue(_)) {
            let mut q = KeptQueue::new();
            if matches!(self.pending, Pending::Last) {
                if let Some(v) = self.last.clone() {
                    q.push_back(Queued::Value(strip_timestamps(v, self.timestamps)));
                }
            }
            self.pending = Pending::Queue(Box::new(q));
        }
        match &mut self.pending {
            Pending::Queue(q) => q,
            _ => unreachable!("set just above"),
        }
    }

    /// True when the next Publish should carry this item's queue.
    pub fn reportable(&self) -> bool {
        self.queued() > 0
            && (self.mode == MonitoringMode::Reporting
                || (self.mode == MonitoringMode::Sampling && self.triggered))
    }

    /// Changes the monitoring mode. Disabling drops the queue and stops
    /// sampling; enabling forgets the last value so the next sample or push
    /// is reported as the first.
    pub fn set_mode(&mut self, mode: MonitoringMode, now: Instant) {
        if mode == self.mode {
            return;
        }
        let was_disabled = self.mode == MonitoringMode::Disabled;
        self.mode = mode;
        if mode == MonitoringMode::Disabled {
            self.pending = Pending::Empty;
            self.last = None;
            self.triggered = false;
            self.next_sample = None;
        } else if was_disabled {
            self.last = None;
            if self.sampled {
                self.next_sample = Some(now);
            }
        }
    }

    /// Starts sampling at `now` (a sampled item's first sample is due at
    /// once; pushed items get their first value from the caller).
    pub fn start(&mut self, now: Instant) {
        if self.sampled && self.mode != MonitoringMode::Disabled && !self.is_event() {
            self.next_sample = Some(now);
        }
    }

    /// Changes the queue size; a shrinking queue drops values from the end
    /// `discard_oldest` says, marking overflow.
    pub fn resize_queue(&mut self, size: u32, discard_oldest: bool) {
        self.queue_size = size.max(1);
        self.discard_oldest = discard_oldest;
        if matches!(self.pending, Pending::Last) && !self.keeps_last_only() {
            // Growing: the waiting value becomes the queue's first entry
            // (before `last` moves on with the next value).
            self.queue_mut();
        }
        if matches!(self.pending, Pending::Queue(_)) {
            while self.queued() > self.queue_size as usize {
                self.drop_one();
            }
            // A queue of one left holds the newest value, which is `last`
            // (a queue of one marks no overflow).
            if self.keeps_last_only() && self.last.is_some() {
                self.pending = match self.queued() {
                    0 => Pending::Empty,
                    _ => Pending::Last,
                };
            }
        }
    }

    /// A new value from a push or a sample. Returns true when it was
    /// queued (it passed the filter and the item is not disabled).
    pub fn offer(&mut self, value: DataValue) -> bool {
        if self.mode == MonitoringMode::Disabled {
            return false;
        }
        let Filter::DataChange { trigger, deadband } = &self.filter else {
            return false;
        };
        if let Some(last) = &self.last {
            if !changed(last, &value, *trigger, *deadband) {
                return false;
            }
        }
        if self.keeps_last_only() {
            self.last = Some(value);
            self.pending = Pending::Last;
            return true;
        }
        self.last = Some(value.clone());
        let mut q = Queued::Value(strip_timestamps(value, self.timestamps));
        if std::mem::take(&mut self.missed) {
            set_overflow(&mut q);
        }
        self.push(q);
        true
    }

    /// A pushed value was not queued (the session's values quota): the
    /// next value queued carries the Overflow bit (the first after the
    /// gap, as when a full queue drops its oldest).
    pub fn missed_value(&mut self) {
        self.missed = true;
    }

    /// Queues an event's fields (the filter already matched).
    pub fn offer_event(&mut self, fields: Vec<Variant>) -> bool {
        if self.mode == MonitoringMode::Disabled || !self.is_event() {
            return false;
        }
        self.push(Queued::Event(fields));
        true
    }

    /// Queues the last value again (TransferSubscriptions with
    /// sendInitialValues).
    pub fn requeue_last(&mut self) {
        if self.mode == MonitoringMode::Disabled || self.queued() > 0 || self.last.is_none() {
            return;
        }
        if self.keeps_last_only() {
            self.pending = Pending::Last;
            return;
        }
        if let Some(v) = self.last.clone() {
            let v = strip_timestamps(v, self.timestamps);
            self.push(Queued::Value(v));
        }
    }

    /// What a draining node hands over of this data-change item: the last
    /// value that passed its filter (what the next is compared to) and the
    /// values waiting for a Publish, oldest first - none of them in a
    /// NotificationMessage yet. An event item hands over no values (its events: [`Self::unsent_events`]).
    pub fn unsent(&self) -> (Option<DataValue>, Vec<DataValue>) {
        if self.is_event() {
            return (None, Vec::new());
        }
        let queued = match &self.pending {
            Pending::Empty => Vec::new(),
            Pending::Last => self
                .last
                .clone()
                .map(|v| vec![strip_timestamps(v, self.timestamps)])
                .unwrap_or_default(),
            Pending::Queue(q) => q
                .iter()
                .filter_map(|q| match q {
                    Queued::Value(v) => Some(v.clone()),
                    Queued::Event(_) | Queued::Overflow(_) => None,
                })
                .collect(),
        };
        (self.last.clone(), queued)
    }

    /// What a draining node hands over of this event item: the events
    /// waiting for a Publish, oldest first, each with whether it is the
    /// EventQueueOverflow event the item put in place of those it
    /// discarded. A data-change item hands over none.
    pub fn unsent_events(&self) -> Vec<super::UnsentEvent> {
        let Pending::Queue(q) = &self.pending else {
            return Vec::new();
        };
        if !self.is_event() {
            return Vec::new();
        }
        q.iter()
            .filter_map(|q| match q {
                Queued::Event(fields) => Some(super::UnsentEvent {
                    overflow: false,
                    fields: fields.clone(),
                }),
                Queued::Overflow(fields) => Some(super::UnsentEvent {
                    overflow: true,
                    fields: fields.clone(),
                }),
                Queued::Value(_) => None,
            })
            .collect()
    }

    /// Puts back the events a draining node handed over
    /// ([`Self::unsent_events`]), ahead of any newer event, through the
    /// ordinary path: the queue size and the session's queued-bytes quota
    /// bound them (the queue counts against `account`, the session's).
    pub fn restore_unsent_events(
        &mut self,
        events: Vec<super::UnsentEvent>,
        account: &Arc<Account>,
    ) {
        if self.mode == MonitoringMode::Disabled || !self.is_event() {
            return;
        }
        for e in events {
            self.push(if e.overflow {
                Queued::Overflow(e.fields)
            } else {
                Queued::Event(e.fields)
            });
            self.bind_if_unbound(account);
        }
    }

    /// Puts back what a draining node handed over ([`Self::unsent`]): `last`
    /// becomes the value the next one is compared to (an unchanged current
    /// value is then not reported again), and `queued` waits for the next
    /// Publish, before any newer value. Queued through the ordinary path,
    /// so the queue size and the session's queued-bytes quota bound them
    /// (the oldest go first, the next kept one marked Overflow): the queue
    /// counts against `account`, the session's.
    pub fn restore_unsent(
        &mut self,
        last: Option<DataValue>,
        queued: Vec<DataValue>,
        account: &Arc<Account>,
    ) {
        if self.mode == MonitoringMode::Disabled || self.is_event() {
            return;
        }
        if last.is_some() {
            self.last = last;
        }
        if self.keeps_last_only() {
            if let Some(v) = queued.into_iter().last() {
                if self.last.is_none() {
                    self.last = Some(v);
                }
                self.pending = Pending::Last;
            }
            return;
        }
        for v in queued {
            self.push(Queued::Value(v));
            self.bind_if_unbound(account);
        }
    }

    fn push(&mut self, q: Queued) {
        let size = self.queue_size as usize;
        let event = self.is_event();
        let queue = self.queue_mut();
        queue.push_back(q);
        if queue.len() > size {
            if event {
                self.event_overflow();
            } else {
                self.drop_one();
            }
        } else if queue.len() > 1 && queue.must_shed() {
            self.shed_for_quota();
        }
    }

    /// The EventQueueOverflow event this event item reports in place of
    /// discarded events (its select clauses applied); `None` for a queue
    /// of one, which keeps its newest event and makes none.
    fn overflow_marker(&self) -> Option<Queued> {
        match &self.filter {
            Filter::Event(f) if self.queue_size >= 2 => {
                Some(Queued::Overflow(f.select(&overflow_event())))
            }
            _ => None,
        }
    }

    /// A full event queue (Part 4 §5.12.1.5): the event `discard_oldest`
    /// says is dropped, and an EventQueueOverflow event takes the place of
    /// one more at that end - the front when `discard_oldest`, else the
    /// back - unless one is there already.
    fn event_overflow(&mut self) {
        let marker = self.overflow_marker();
        let discard_oldest = self.discard_oldest;
        let queue = self.queue_mut();
        let n = queue.len();
        let Some(marker) = marker else {
            if discard_oldest {
                queue.pop_front();
            } else {
                queue.remove(n - 2);
            }
            return;
        };
        if discard_oldest {
            if matches!(queue.front(), Some(Queued::Overflow(_))) {
                // It stays first; the oldest event after it goes.
                queue.remove(1);
            } else {
                queue.pop_front();
                queue.pop_front();
                queue.push_front(marker);
            }
        } else {
            // The new event goes; the one before it makes way unless it
            // is the overflow event already.
            queue.remove(n - 1);
            if !matches!(queue.back(), Some(Queued::Overflow(_))) {
                queue.remove(n - 2);
                queue.push_back(marker);
            }
        }
    }

    /// The session is over its queued-bytes quota, or over its fair share
    /// of the memory budget: the item keeps its newest values and loses
    /// its oldest, marked (at most two a value, so that a queue over the
    /// line shrinks while it is fed). An event queue loses its oldest
    /// events the same way, with an EventQueueOverflow event first in
    /// their place.
    fn shed_for_quota(&mut self) {
        for _ in 0..2 {
            if self.is_event() {
                self.shed_oldest_event();
            } else {
                self.drop_oldest();
            }
            if self.queued() <= 1 || !self.pending_queue().is_some_and(KeptQueue::must_shed) {
                break;
            }
        }
    }

    /// Drops an event queue's oldest event for the quota: with an
    /// overflow event first, the one after it goes; else the first two
    /// make way for one. Of two entries (or in a queue of one) the newest
    /// stays, alone.
    fn shed_oldest_event(&mut self) {
        let marker = self.overflow_marker();
        let queue = self.queue_mut();
        match marker {
            Some(_) if queue.len() > 2 && matches!(queue.front(), Some(Queued::Overflow(_))) => {
                queue.remove(1);
            }
            Some(m) if queue.len() > 2 => {
                queue.pop_front();
                queue.pop_front();
                queue.push_front(m);
            }
            _ => {
                queue.pop_front();
            }
        }
    }

    fn pending_queue(&self) -> Option<&KeptQueue<Queued>> {
        match &self.pending {
            Pending::Queue(q) => Some(q),
            _ => None,
        }
    }

    /// Drops the oldest queued notification, the next one getting the
    /// Overflow bit (a value; an event queue drops its oldest event).
    fn drop_oldest(&mut self) {
        let queue = self.queue_mut();
        queue.pop_front();
        if let Some(first) = queue.front_mut() {
            set_overflow(first);
        }
    }

    /// Counts the item's queue against `account` when it counts against
    /// none yet (a queue is made where no account is at hand).
    pub fn bind_if_unbound(&mut self, account: &Arc<Account>) {
        if let Pending::Queue(q) = &mut self.pending {
            if !q.is_bound() {
                q.bind(account);
            }
        }
    }

    /// Counts the item's queue against `account` (its subscription moved
    /// to another session).
    pub fn bind(&mut self, account: &Arc<Account>) {
        if let Pending::Queue(q) = &mut self.pending {
            q.bind(account);
        }
    }

    /// Estimated bytes of the notifications queued beyond the latest value.
    pub fn queued_bytes(&self) -> u64 {
        self.pending_queue().map_or(0, KeptQueue::bytes)
    }

    /// Drops one value from a full queue: the oldest (the next gets the
    /// overflow bit) or the newest but one (the newest gets it). A queue of
    /// one is a buffer of the latest value and never marks overflow.
    fn drop_one(&mut self) {
        let mark = self.queue_size > 1;
        let discard_oldest = self.discard_oldest;
        let queue = self.queue_mut();
        if discard_oldest {
            queue.pop_front();
            if mark {
                if let Some(first) = queue.front_mut() {
                    set_overflow(first);
                }
            }
        } else {
            let n = queue.len();
            if n >= 2 {
                queue.remove(n - 2);
            }
            if mark {
                if let Some(last) = queue.back_mut() {
                    set_overflow(last);
                }
            }
        }
    }

    /// Takes up to `max` queued notifications (all when `max` is 0). The
    /// taken ones leave with their buffer: an item whose queue was emptied
    /// holds no allocation until its next value (it is multiplied by the
    /// item count).
    pub fn drain(&mut self, max: usize) -> Drained {
        let len = self.queued();
        let n = if max == 0 { len } else { max.min(len) };
        if n == len {
            self.triggered = false;
        }
        match std::mem::take(&mut self.pending) {
            Pending::Empty => Drained::One(None),
            Pending::Last => {
                let v = self
                    .last
                    .clone()
                    .map(|v| strip_timestamps(v, self.timestamps));
                Drained::One(v.map(Queued::Value))
            }
            Pending::Queue(mut q) => {
                let taken = q.take_front(n);
                if !q.is_empty() {
                    self.pending = Pending::Queue(q);
                }
                Drained::Many(taken.into_iter())
            }
        }
    }

    /// A sampled item's next sample, on the grid of [`aligned_sample`]
    /// through the subscription's publishing times (`next_publish` is one).
    pub fn schedule_sampling(&mut self, now: Instant, next_publish: Instant) {
        if self.sampled {
            self.next_sample = Some(aligned_sample(now, self.sampling_interval, next_publish));
        }
    }

    /// The sample that was due at `now` was taken: the next one is a
    /// sampling interval later, or, when the timer ran later than that, the
    /// first point of the same grid after `now` (the grid stays aligned
    /// with the publishing times). Under a [`Stretch`] (the session's
    /// values quota) it is the first point after `now` of the stretched
    /// grid, which every item of the subscription with this interval
    /// shares, so that one pass takes them all.
    pub fn sampled_at(&mut self, now: Instant, stretch: Option<&Stretch>) {
        let Some(due) = self.next_sample else {
            return;
        };
        if let Some(s) = stretch.filter(|s| s.factor > 1.0) {
            // An interval after the sample that was due (the first grid
            // point after now when the timer ran later than that): the
            // first grid point after `now` alone would be the next
            // publishing time, an interval too early.
            let iv = s.interval(self.sampling_interval);
            let from = due
                .checked_add(iv)
                .and_then(|t| t.checked_sub(Duration::from_nanos(1)))
                .map_or(now, |t| t.max(now));
            self.next_sample = Some(aligned_sample(from, iv, s.origin()));
            return;
        }
        let iv = self.sampling_interval.max(Duration::from_millis(1));
        let next = due + iv;
        self.next_sample = Some(if next > now {
            next
        } else {
            let behind = (now - next).as_nanos() / iv.as_nanos() + 1;
            u32::try_from(behind)
                .ok()
                .and_then(|k| iv.checked_mul(k))
                .and_then(|d| next.checked_add(d))
                .unwrap_or(now + iv)
        });
    }
}

/// How much slower than asked a subscription's sampled items are sampled
/// (the session's values quota), and the publishing times their grid goes
/// through.
#[derive(Debug, Clone)]
pub struct Stretch {
    /// The factor (more than 1 when it stretches anything).
    pub factor: f64,
    /// The subscription's next publishing time.
    pub next_publish: Instant,
    /// Its publishing interval.
    pub publishing: Duration,
    /// The last interval stretched and what it became (the items of a
    /// subscription mostly share one).
    pub memo: std::cell::Cell<Option<(Duration, Duration)>>,
}

impl Stretch {
    /// A publishing time that stays the same from cycle to cycle (the one
    /// nearest after a process-wide epoch), through which the stretched
    /// grid goes: through the next publishing time instead, a grid of two
    /// publishing intervals would shift by one every cycle, and the items
    /// sampled in different cycles would never meet in one pass again.
    pub fn origin(&self) -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(Instant::now);
        let period = self.publishing.as_nanos();
        if period == 0 {
            return self.next_publish;
        }
        let nanos = |d: Duration| d.as_nanos();
        let phase = if self.next_publish >= epoch {
            nanos(self.next_publish - epoch) % period
        } else {
            (period - nanos(epoch - self.next_publish) % period) % period
        };
        epoch + Duration::from_nanos(u64::try_from(phase).unwrap_or(0))
    }

    /// `interval` stretched, rounded up to whole publishing intervals (so
    /// that the grid is the same through every publishing time).
    pub fn interval(&self, interval: Duration) -> Duration {
        match self.memo.get() {
            Some((asked, stretched)) if asked == interval => stretched,
            _ => {
                let stretched = self.compute(interval);
                self.memo.set(Some((interval, stretched)));
                stretched
            }
        }
    }

    fn compute(&self, interval: Duration) -> Duration {
        let secs =
            interval.max(Duration::from_millis(1)).as_secs_f64() * self.factor.clamp(1.0, 1e6);
        // A day at most: a sample stays on the calendar, and no interval
        // a client asked for overflows.
        let iv = Duration::try_from_secs_f64(secs)
            .unwrap_or(Duration::MAX)
            .min(Duration::from_secs(86_400));
        let step = self.publishing.as_nanos();
        if step == 0 {
            return iv;
        }
        let n = iv.as_nanos().div_ceil(step);
        Duration::from_nanos(u64::try_from(n * step).unwrap_or(u64::MAX))
    }
}

/// When a sampled item's next sample is due: the first point after `now`
/// of the grid through the subscription's publishing times (`next_publish`
/// is one of them), a sampling interval apart.
///
/// A sample due together with a publishing cycle is then due at the very
/// same instant, and one timer pass takes the samples before it runs the
/// cycles (`SubscriptionSet::handle_timeout`): the sample always reaches
/// that cycle's message, however late the timer wakes - with equal
/// sampling and publishing intervals and a queue of one, a sample that
/// fell now before and now after the cycle would drop every other value.
/// It also lets one timer wake-up serve both, and a sample reaches its
/// message fresh rather than part of an interval old.
pub fn aligned_sample(now: Instant, interval: Duration, next_publish: Instant) -> Instant {
    let iv = interval.max(Duration::from_millis(1)).as_nanos();
    let steps = |d: Duration| {
        Duration::from_nanos(u64::try_from(d.as_nanos() / iv * iv).unwrap_or(u64::MAX))
    };
    if next_publish > now {
        let back = next_publish - steps(next_publish - now);
        if back > now {
            back
        } else {
            back + Duration::from_nanos(iv as u64)
        }
    } else {
        next_publish + steps(now - next_publish) + Duration::from_nanos(iv as u64)
    }
}

impl KeptSize for Queued {
    const STAGE: Stage = Stage::Queued;
    fn kept_size(&self) -> u64 {
        let own = std::mem::size_of::<Queued>() as u64;
        match self {
            Queued::Value(v) => own + v.value.as_ref().map_or(0, variant_heap),
            Queued::Event(fields) | Queued::Overflow(fields) => {
                own + fields
                    .iter()
                    .map(|f| std::mem::size_of::<Variant>() as u64 + variant_heap(f))
                    .sum::<u64>()
            }
        }
    }
}

/// An estimate of the heap bytes a variant holds besides itself: string
/// and byte lengths, boxed values by their size, arrays by their length.
pub fn variant_heap(v: &Variant) -> u64 {
    let boxed = |n: usize| n as u64 + 16;
    match v {
        Variant::String(s) => s.as_str().map_or(0, |s| s.len() as u64),
        Variant::ByteString(b) => b.as_bytes().map_or(0, |b| b.len() as u64),
        Variant::XmlElement(x) => x.0.as_str().map_or(0, |s| s.len() as u64),
        Variant::NodeId(_) | Variant::ExpandedNodeId(_) | Variant::QualifiedName(_) => boxed(48),
        Variant::LocalizedText(_) | Variant::DiagnosticInfo(_) => boxed(64),
        Variant::ExtensionObject(_) => boxed(128),
        Variant::DataValue(d) => {
            boxed(std::mem::size_of::<DataValue>()) + d.value.as_ref().map_or(0, variant_heap)
        }
        Variant::Array(a) => {
            let n = a.values().len() as u64;
            let each = match a.values() {
                ArrayValues::Boolean(_) | ArrayValues::SByte(_) | ArrayValues::Byte(_) => 1,
                ArrayValues::Int16(_) | ArrayValues::UInt16(_) => 2,
                ArrayValues::Int32(_)
                | ArrayValues::UInt32(_)
                | ArrayValues::Float(_)
                | ArrayValues::StatusCode(_) => 4,
                ArrayValues::Int64(_)
                | ArrayValues::UInt64(_)
                | ArrayValues::Double(_)
                | ArrayValues::DateTime(_) => 8,
                _ => 48,
            };
            boxed(64) + n * each
        }
        _ => 0,
    }
}

/// An event of EventQueueOverflowEventType (i=3035), raised by the Server
/// object now (Part 5 §6.4.32).
fn overflow_event() -> super::event::Event {
    super::event::Event::new(
        super::event::new_event_id(),
        uascale_types::NodeId::ns0(super::event::EVENT_QUEUE_OVERFLOW_EVENT_TYPE),
        uascale_types::NodeId::ns0(2253),
        "Server",
        uascale_types::DateTime::from_system_time(std::time::SystemTime::now()),
        "Event queue overflow: events were discarded",
        1,
    )
}

fn set_overflow(q: &mut Queued) {
    if let Queued::Value(v) = q {
        v.status = Some(StatusCode(v.status_or_good().0 | OVERFLOW_BITS));
    }
}

/// Keeps only the timestamps the client asked for.
pub fn strip_timestamps(mut v: DataValue, ts: TimestampsToReturn) -> DataValue {
    match ts {
        TimestampsToReturn::Source => {
            v.server_timestamp = None;
            v.server_picoseconds = None;
        }
        TimestampsToReturn::Server => {
            v.source_timestamp = None;
            v.source_picoseconds = None;
        }
        TimestampsToReturn::Neither => {
            v.server_timestamp = None;
            v.server_picoseconds = None;
            v.source_timestamp = None;
            v.source_picoseconds = None;
        }
        _ => {}
    }
    v
}

/// The DataChangeFilter test (Part 4 §7.22.2): is `new` a change from
/// `last` under `trigger` and an absolute `deadband`?
pub fn changed(
    last: &DataValue,
    new: &DataValue,
    trigger: DataChangeTrigger,
    deadband: f64,
) -> bool {
    if last.status_or_good() != new.status_or_good() {
        return true;
    }
    if trigger == DataChangeTrigger::Status {
        return false;
    }
    let value_changed = match (&last.value, &new.value) {
        (Some(a), Some(b)) if deadband > 0.0 => exceeds_deadband(a, b, deadband),
        (a, b) => a != b,
    };
    if value_changed {
        return true;
    }
    trigger == DataChangeTrigger::StatusValueTimestamp
        && (last.source_timestamp != new.source_timestamp
            || last.source_picoseconds != new.source_picoseconds)
}

/// True when any element moved by more than `deadband`; values that are not
/// numeric, or whose shape changed, compare by equality.
fn exceeds_deadband(a: &Variant, b: &Variant, deadband: f64) -> bool {
    match (numbers(a), numbers(b)) {
        (Some(x), Some(y)) if x.len() == y.len() => {
            x.iter().zip(&y).any(|(p, q)| (p - q).abs() > deadband)
        }
        _ => a != b,
    }
}

/// The numeric value(s) of a Variant as f64, or `None` when not numeric.
pub fn numbers(v: &Variant) -> Option<Vec<f64>> {
    if let Some(x) = number(v) {
        return Some(vec![x]);
    }
    let Variant::Array(a) = v else {
        return None;
    };
    macro_rules! all {
        ($($name:ident),*) => {
            match a.values() {
                $(ArrayValues::$name(v) => v.iter().map(|x| f64::from(*x)).collect(),)*
                ArrayValues::Int64(v) => v.iter().map(|x| *x as f64).collect(),
                ArrayValues::UInt64(v) => v.iter().map(|x| *x as f64).collect(),
                _ => return None,
            }
        };
    }
    Some(all!(
        SByte, Byte, Int16, UInt16, Int32, UInt32, Float, Double
    ))
}

/// A value as a push delivers it: Good, stamped with `utc` as source and
/// server time.
pub fn pushed_value(value: Variant, utc: DateTime) -> DataValue {
    DataValue {
        value: Some(value),
        status: None,
        source_timestamp: Some(utc),
        server_timestamp: Some(utc),
        ..Default::default()
    }
}
