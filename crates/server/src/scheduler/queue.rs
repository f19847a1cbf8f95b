//! The request queue without a runtime: who may wait, in which stage, and
//! whose request a free worker takes next (docs/scalability.md §3).
//!
//! A request offered to the queue has an owner (the session, or the
//! channel before a session exists - over opc.https the source address),
//! a [`Kind`] and a size. Under
//! `shared_only` every request waits in one FIFO. Under the other profiles
//! each owner has a lane, and workers serve the lanes in weighted turns: a
//! lane gives up its turn after `weight` requests (1, or
//! `trusted_weight` for a trusted owner under `trusted_reservations`), so an
//! owner with 10,000 requests waiting delays an owner with one by at most
//! one turn of every other lane. Under `balanced` and
//! `trusted_reservations` a bootstrap, reconnect or control request that
//! finds the queue (or its owner's share of it) full takes its stage's
//! protected entry instead - places a flood of ordinary requests cannot
//! take, served before the lanes.
//!
//! The queue is generic over the owner key and the payload, so the unit
//! tests below drive it with plain numbers.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::config::IsolationProfile;
use crate::shed::{Reason, Stage};

/// What a request is to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// CreateSession; ActivateSession of a new session.
    Bootstrap,
    /// ActivateSession on a new channel, TransferSubscriptions, Republish.
    Reconnect,
    /// CloseSession, Cancel, DeleteSubscriptions, SetPublishingMode.
    Control,
    /// Everything else (Publish included: it waits here until a worker
    /// takes it; once held it counts in the parked stage).
    Normal,
}

/// The protected stage of a kind (none for [`Kind::Normal`]).
pub fn protecting(kind: Kind) -> Option<Stage> {
    match kind {
        Kind::Bootstrap => Some(Stage::Bootstrap),
        Kind::Reconnect => Some(Stage::Reconnect),
        Kind::Control => Some(Stage::Control),
        Kind::Normal => None,
    }
}

/// A refusal of the queue: the stage that refused and why (the scheduler
/// adds the hint and makes it a [`crate::shed::Shed`]).
pub type Rejection = (Stage, Reason);

/// The index of a queue stage in [`Queue`]'s counts (the parked stage and
/// the admission stages are not counted here).
fn index(stage: Stage) -> Option<usize> {
    match stage {
        Stage::Queue => Some(0),
        Stage::Bootstrap => Some(1),
        Stage::Reconnect => Some(2),
        Stage::Control => Some(3),
        _ => None,
    }
}

/// The limits the queue keeps (from `[requests]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// `isolation_profile`.
    pub profile: IsolationProfile,
    /// `max_queued_request_count` (already raised to its minimum).
    pub max_queued: usize,
    /// `max_queued_requests_per_owner` (not applied under `shared_only`).
    pub per_owner: usize,
    /// `max_retained_request_bytes`.
    pub max_bytes: usize,
    /// `protected_entry_count`: places of each protected stage.
    pub protected: usize,
    /// `trusted_reserved_request_count` (under `trusted_reservations`).
    pub trusted_reserved: usize,
    /// `trusted_weight` (under `trusted_reservations`).
    pub trusted_weight: u32,
}

impl Limits {
    /// The limits of a `[requests]` section.
    pub fn of(r: &crate::config::RequestsSection) -> Limits {
        Limits {
            profile: r.isolation_profile,
            max_queued: r
                .max_queued_request_count
                .max(crate::config::RequestsSection::MIN_QUEUED),
            per_owner: r.max_queued_requests_per_owner.max(1),
            max_bytes: r.max_retained_request_bytes.max(1),
            protected: r.protected_entry_count,
            trusted_reserved: r.trusted_reserved_request_count,
            trusted_weight: r.trusted_weight.max(1),
        }
    }
}

/// A request waiting, with what it occupies.
#[derive(Debug)]
struct Entry<T> {
    stage: Stage,
    bytes: usize,
    payload: T,
}

/// One owner's waiting requests.
#[derive(Debug)]
struct Lane<T> {
    entries: VecDeque<Entry<T>>,
    /// Requests served per turn.
    weight: u32,
    /// Requests left in the current turn.
    credit: u32,
    /// A trusted owner's lane (its places count in the trusted floor).
    trusted: bool,
}

/// The request queue (see the module documentation).
#[derive(Debug)]
pub struct Queue<K, T> {
    limits: Limits,
    /// Under `shared_only`: every request, in arrival order.
    fifo: VecDeque<(K, Entry<T>)>,
    /// Requests in protected entries, in arrival order; served first.
    protected: VecDeque<(K, Entry<T>)>,
    /// The lanes with requests waiting (an empty lane is removed).
    lanes: HashMap<K, Lane<T>>,
    /// The owners of those lanes, in turn order (the front one is served).
    ring: VecDeque<K>,
    /// Places taken, by [`Stage`] index (the parked stage is counted by the
    /// caller: parked requests are not in the queue).
    used: [usize; 4],
    /// Places of the shared queue taken by trusted owners.
    trusted_used: usize,
    /// Bytes of the requests waiting.
    bytes: usize,
}

impl<K: Clone + Eq + Hash, T> Queue<K, T> {
    /// An empty queue.
    pub fn new(limits: Limits) -> Self {
        Queue {
            limits,
            fifo: VecDeque::new(),
            protected: VecDeque::new(),
            lanes: HashMap::new(),
            ring: VecDeque::new(),
            used: [0; 4],
            trusted_used: 0,
            bytes: 0,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Requests waiting, all stages.
    pub fn len(&self) -> usize {
        self.used.iter().sum()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Places taken in `stage` (0 for [`Stage::Parked`], which the caller
    /// counts).
    pub fn usage(&self, stage: Stage) -> usize {
        index(stage).map_or(0, |i| self.used[i])
    }

    /// Bytes of the requests waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Requests `owner` has waiting (0 under `shared_only`, which keeps no
    /// lanes).
    pub fn owner_len(&self, owner: &K) -> usize {
        self.lanes.get(owner).map_or(0, |l| l.entries.len())
    }

    /// Offers a request of `owner` (`trusted` under `trusted_reservations`)
    /// of `kind` and `bytes`: it waits, or it is refused and handed back.
    pub fn offer(
        &mut self,
        owner: K,
        kind: Kind,
        trusted: bool,
        bytes: usize,
        payload: T,
    ) -> Result<Stage, (Rejection, T)> {
        let l = self.limits.clone();
        let profile = l.profile;
        // A request alone is always let in: the limit bounds what piles up.
        if self.bytes > 0 && self.bytes.saturating_add(bytes) > l.max_bytes {
            let stage = Stage::Queue;
            return Err(((stage, Reason::RetainedBytes), payload));
        }
        let trusted = trusted && profile == IsolationProfile::TrustedReservations;
        let queue_free = self.used[0] < l.max_queued;
        // Untrusted owners leave the reserved places to trusted ones.
        let reserved = if profile == IsolationProfile::TrustedReservations && !trusted {
            l.trusted_reserved
        } else {
            0
        };
        let untrusted_used = self.used[0] - self.trusted_used;
        let share_free = trusted || untrusted_used < l.max_queued.saturating_sub(reserved);
        if profile == IsolationProfile::SharedOnly {
            if !queue_free {
                return Err((rejected(Stage::Queue, Reason::Full), payload));
            }
            self.take(Stage::Queue, bytes, false);
            self.fifo.push_back((
                owner,
                Entry {
                    stage: Stage::Queue,
                    bytes,
                    payload,
                },
            ));
            return Ok(Stage::Queue);
        }
        let owner_full = self.owner_len(&owner) >= l.per_owner;
        if queue_free && share_free && !owner_full {
            self.take(Stage::Queue, bytes, trusted);
            let weight = if trusted { l.trusted_weight } else { 1 };
            let entry = Entry {
                stage: Stage::Queue,
                bytes,
                payload,
            };
            match self.lanes.get_mut(&owner) {
                Some(lane) => lane.entries.push_back(entry),
                None => {
                    self.ring.push_back(owner.clone());
                    self.lanes.insert(
                        owner,
                        Lane {
                            entries: VecDeque::from([entry]),
                            weight,
                            credit: weight,
                            trusted,
                        },
                    );
                }
            }
            return Ok(Stage::Queue);
        }
        // The protected entry of its stage, if the profile has them.
        if let Some(stage) = protecting(kind).filter(|_| profile.protects()) {
            if self.usage(stage) < l.protected {
                self.take(stage, bytes, false);
                self.protected.push_back((
                    owner,
                    Entry {
                        stage,
                        bytes,
                        payload,
                    },
                ));
                return Ok(stage);
            }
        }
        let reason = if owner_full {
            Reason::OwnerLimit
        } else if queue_free {
            Reason::Reserved
        } else {
            Reason::Full
        };
        Err((rejected(Stage::Queue, reason), payload))
    }

    /// Queues a request whatever the limits (an answer whose work already
    /// started; see `Scheduler::offer_started`), in `owner`'s lane (the
    /// FIFO under `shared_only`).
    pub fn push(&mut self, owner: K, bytes: usize, payload: T) {
        let entry = Entry {
            stage: Stage::Queue,
            bytes,
            payload,
        };
        // Counted as its lane is (a trusted lane's places are the floor's).
        let trusted = self.lanes.get(&owner).is_some_and(|l| l.trusted);
        self.take(Stage::Queue, bytes, trusted);
        if self.limits.profile == IsolationProfile::SharedOnly {
            self.fifo.push_back((owner, entry));
            return;
        }
        match self.lanes.get_mut(&owner) {
            Some(lane) => lane.entries.push_back(entry),
            None => {
                self.ring.push_back(owner.clone());
                self.lanes.insert(
                    owner,
                    Lane {
                        entries: VecDeque::from([entry]),
                        weight: 1,
                        credit: 1,
                        trusted: false,
                    },
                );
            }
        }
    }

    fn take(&mut self, stage: Stage, bytes: usize, trusted: bool) {
        if let Some(i) = index(stage) {
            self.used[i] += 1;
        }
        if trusted {
            self.trusted_used += 1;
        }
        self.bytes = self.bytes.saturating_add(bytes);
    }

    fn give_back(&mut self, entry: &Entry<T>, trusted: bool) {
        if let Some(slot) = index(entry.stage).map(|i| &mut self.used[i]) {
            *slot = slot.saturating_sub(1);
        }
        if trusted {
            self.trusted_used = self.trusted_used.saturating_sub(1);
        }
        self.bytes = self.bytes.saturating_sub(entry.bytes);
    }

    /// The request a free worker takes next, with its owner: protected
    /// entries first, then the lanes in weighted turns (the FIFO under
    /// `shared_only`).
    pub fn pop(&mut self) -> Option<(K, T)> {
        if let Some((owner, entry)) = self.protected.pop_front() {
            self.give_back(&entry, false);
            return Some((owner, entry.payload));
        }
        if let Some((owner, entry)) = self.fifo.pop_front() {
            self.give_back(&entry, false);
            return Some((owner, entry.payload));
        }
        let owner = self.ring.front()?.clone();
        let lane = self.lanes.get_mut(&owner)?;
        let entry = lane.entries.pop_front()?;
        let trusted = lane.trusted;
        lane.credit = lane.credit.saturating_sub(1);
        let empty = lane.entries.is_empty();
        let turn_over = lane.credit == 0;
        if turn_over {
            lane.credit = lane.weight;
        }
        if empty {
            self.lanes.remove(&owner);
            self.ring.pop_front();
        } else if turn_over {
            self.ring.rotate_left(1);
        }
        self.give_back(&entry, trusted);
        Some((owner, entry.payload))
    }

    /// Removes the waiting requests `matches` selects (those of a
    /// connection that closed, or a cancelled one) and returns them.
    pub fn remove_where(&mut self, mut matches: impl FnMut(&K, &T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for q in [&mut self.fifo, &mut self.protected] {
            let mut kept = VecDeque::with_capacity(q.len());
            for (k, e) in q.drain(..) {
                if matches(&k, &e.payload) {
                    out.push((e, false));
                } else {
                    kept.push_back((k, e));
                }
            }
            *q = kept;
        }
        let mut emptied = Vec::new();
        for (k, lane) in &mut self.lanes {
            let trusted = lane.trusted;
            let mut kept = VecDeque::with_capacity(lane.entries.len());
            for e in lane.entries.drain(..) {
                if matches(k, &e.payload) {
                    out.push((e, trusted));
                } else {
                    kept.push_back(e);
                }
            }
            lane.entries = kept;
            if lane.entries.is_empty() {
                emptied.push(k.clone());
            }
        }
        for k in emptied {
            self.lanes.remove(&k);
            self.ring.retain(|o| *o != k);
        }
        out.into_iter()
            .map(|(e, trusted)| {
                self.give_back(&e, trusted);
                e.payload
            })
            .collect()
    }
}

fn rejected(stage: Stage, reason: Reason) -> Rejection {
    (stage, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(profile: IsolationProfile) -> Limits {
        Limits {
            profile,
            max_queued: 100,
            per_owner: 1000,
            max_bytes: 1 << 30,
            protected: 1,
            trusted_reserved: 10,
            trusted_weight: 4,
        }
    }

    /// Fills the shared queue with owner 1's requests.
    fn flood(q: &mut Queue<u32, u32>) {
        let n = q.limits().max_queued;
        for i in 0..n {
            let i = u32::try_from(i).unwrap();
            q.offer(1, Kind::Normal, false, 10, i).expect("room");
        }
    }

    #[test]
    fn shared_only_is_one_fifo_and_a_flood_starves_the_rest() {
        let mut q = Queue::new(limits(IsolationProfile::SharedOnly));
        flood(&mut q);
        let (rej, _) = q.offer(2, Kind::Normal, false, 10, 999).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::Full));
        // Even session management is refused: there is no protected entry.
        let (rej, _) = q.offer(3, Kind::Bootstrap, false, 10, 998).unwrap_err();
        assert_eq!(rej.0, Stage::Queue);
        // One place frees; owner 2 gets it but waits behind all of owner 1.
        assert_eq!(q.pop(), Some((1, 0)));
        q.offer(2, Kind::Normal, false, 10, 999).expect("a place");
        let order: Vec<u32> = std::iter::from_fn(|| q.pop().map(|(o, _)| o)).collect();
        assert_eq!(order.len(), 100);
        assert_eq!(order.last(), Some(&2), "last in, last out");
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn fair_share_serves_lanes_in_turns() {
        let mut q = Queue::new(limits(IsolationProfile::FairShare));
        for i in 0..50 {
            q.offer(1, Kind::Normal, false, 1, i).unwrap();
        }
        q.offer(2, Kind::Normal, false, 1, 100).unwrap();
        q.offer(2, Kind::Normal, false, 1, 101).unwrap();
        q.offer(3, Kind::Normal, false, 1, 200).unwrap();
        let first: Vec<(u32, u32)> = (0..6).filter_map(|_| q.pop()).collect();
        assert_eq!(
            first,
            vec![(1, 0), (2, 100), (3, 200), (1, 1), (2, 101), (1, 2)],
            "one request per lane per turn, however long the lane"
        );
        // An owner arriving later joins the turn at the end.
        q.offer(4, Kind::Normal, false, 1, 300).unwrap();
        assert_eq!(q.pop(), Some((1, 3)));
        assert_eq!(q.pop(), Some((4, 300)));
        assert_eq!(q.len(), 46);
    }

    #[test]
    fn the_per_owner_limit_leaves_room_for_others() {
        let mut l = limits(IsolationProfile::FairShare);
        l.per_owner = 5;
        let mut q = Queue::new(l);
        for i in 0..5 {
            q.offer(1, Kind::Normal, false, 1, i).unwrap();
        }
        let (rej, _) = q.offer(1, Kind::Normal, false, 1, 5).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::OwnerLimit));
        q.offer(2, Kind::Normal, false, 1, 100)
            .expect("another owner");
        assert_eq!(q.owner_len(&1), 5);
        // Served once: room again for owner 1.
        assert_eq!(q.pop(), Some((1, 0)));
        q.offer(1, Kind::Normal, false, 1, 5)
            .expect("room in its lane");
    }

    #[test]
    fn shared_only_has_no_per_owner_limit() {
        let mut l = limits(IsolationProfile::SharedOnly);
        l.per_owner = 5;
        let mut q = Queue::new(l);
        for i in 0..50 {
            q.offer(1, Kind::Normal, false, 1, i).expect("one FIFO");
        }
    }

    #[test]
    fn retained_bytes_bound_the_queue_but_one_request_always_fits() {
        let mut l = limits(IsolationProfile::Balanced);
        l.max_bytes = 1000;
        let mut q = Queue::new(l);
        q.offer(1, Kind::Normal, false, 5000, 0)
            .expect("alone, a large request waits");
        let (rej, _) = q.offer(2, Kind::Normal, false, 1, 1).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::RetainedBytes));
        assert_eq!(q.pop(), Some((1, 0)));
        assert_eq!(q.bytes(), 0);
        for i in 0..10 {
            q.offer(2, Kind::Normal, false, 100, i).unwrap();
        }
        let (rej, _) = q.offer(3, Kind::Control, false, 1, 99).unwrap_err();
        assert_eq!(rej.1, Reason::RetainedBytes);
    }

    #[test]
    fn balanced_keeps_protected_entries_for_session_management() {
        let mut q = Queue::new(limits(IsolationProfile::Balanced));
        flood(&mut q);
        let (rej, _) = q.offer(2, Kind::Normal, false, 1, 500).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::Full));
        assert_eq!(
            q.offer(2, Kind::Bootstrap, false, 1, 501).unwrap(),
            Stage::Bootstrap
        );
        assert_eq!(
            q.offer(3, Kind::Control, false, 1, 502).unwrap(),
            Stage::Control
        );
        assert_eq!(
            q.offer(4, Kind::Reconnect, false, 1, 503).unwrap(),
            Stage::Reconnect
        );
        // One each: the second bootstrap is refused.
        let (rej, _) = q.offer(5, Kind::Bootstrap, false, 1, 504).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::Full));
        assert_eq!(q.usage(Stage::Queue), 100);
        assert_eq!(q.usage(Stage::Bootstrap), 1);
        assert_eq!(q.len(), 103, "on top of max_queued_request_count");
        // Protected entries are served first, in arrival order.
        assert_eq!(q.pop(), Some((2, 501)));
        assert_eq!(q.pop(), Some((3, 502)));
        assert_eq!(q.pop(), Some((4, 503)));
        assert_eq!(q.pop(), Some((1, 0)));
        // A flooder's own CloseSession gets through its full lane.
        let mut l = limits(IsolationProfile::Balanced);
        l.per_owner = 3;
        let mut q = Queue::new(l);
        for i in 0..3 {
            q.offer(1, Kind::Normal, false, 1, i).unwrap();
        }
        assert_eq!(
            q.offer(1, Kind::Control, false, 1, 9).unwrap(),
            Stage::Control
        );
    }

    #[test]
    fn fair_share_has_no_protected_entries() {
        let mut q = Queue::new(limits(IsolationProfile::FairShare));
        flood(&mut q);
        let (rej, _) = q.offer(2, Kind::Bootstrap, false, 1, 501).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::Full));
    }

    #[test]
    fn trusted_owners_have_a_reserved_floor_and_a_larger_turn() {
        let mut q = Queue::new(limits(IsolationProfile::TrustedReservations));
        // Untrusted owners fill what is not reserved.
        for i in 0..90 {
            q.offer(1, Kind::Normal, false, 1, i).unwrap();
        }
        let (rej, _) = q.offer(2, Kind::Normal, false, 1, 90).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::Reserved));
        for i in 0..10 {
            q.offer(7, Kind::Normal, true, 1, 700 + i)
                .expect("a trusted owner's floor");
        }
        let (rej, _) = q.offer(7, Kind::Normal, true, 1, 799).unwrap_err();
        assert_eq!(rej, rejected(Stage::Queue, Reason::Full));
        // Turns: owner 1 one, owner 7 four.
        let order: Vec<u32> = (0..10).filter_map(|_| q.pop().map(|(o, _)| o)).collect();
        assert_eq!(order, vec![1, 7, 7, 7, 7, 1, 7, 7, 7, 7]);
        // Owner 1's two served requests freed two untrusted places; the
        // eight freed by trusted requests stay reserved.
        q.offer(2, Kind::Normal, false, 1, 91).unwrap();
        q.offer(2, Kind::Normal, false, 1, 92).unwrap();
        let (rej, _) = q.offer(2, Kind::Normal, false, 1, 93).unwrap_err();
        assert_eq!(rej.1, Reason::Reserved);
        q.offer(7, Kind::Normal, true, 1, 710).expect("trusted");
        // Outside the profile, `trusted` means nothing.
        let mut q = Queue::new(limits(IsolationProfile::Balanced));
        q.offer(7, Kind::Normal, true, 1, 0).unwrap();
        q.offer(7, Kind::Normal, true, 1, 1).unwrap();
        q.offer(1, Kind::Normal, false, 1, 2).unwrap();
        let order: Vec<u32> = (0..3).filter_map(|_| q.pop().map(|(o, _)| o)).collect();
        assert_eq!(order, vec![7, 1, 7]);
    }

    #[test]
    fn removed_requests_give_their_places_back() {
        let mut q = Queue::new(limits(IsolationProfile::Balanced));
        flood(&mut q);
        q.offer(2, Kind::Control, false, 10, 1000).unwrap();
        q.offer(3, Kind::Normal, false, 10, 0).unwrap_err();
        let gone = q.remove_where(|owner, v| *owner == 1 && v % 2 == 0 || *v == 1000);
        assert_eq!(gone.len(), 51);
        assert_eq!(q.len(), 50);
        assert_eq!(q.usage(Stage::Control), 0);
        assert_eq!(q.bytes(), 500);
        q.offer(3, Kind::Normal, false, 10, 0).expect("room again");
        let left: Vec<u32> = std::iter::from_fn(|| q.pop().map(|(_, v)| v)).collect();
        assert_eq!(left.len(), 51);
        assert!(q.is_empty() && q.bytes() == 0);
        assert!(q.lanes.is_empty() && q.ring.is_empty());
    }
}
