//! Who owns a session, and how ownership moves - written against the
//! [`Store`] trait so that the races are unit tests on the in-memory store.
//!
//! - A node writes the records of the sessions it serves by
//!   compare-and-set on the revision it last wrote ([`write_owned`]); when
//!   that fails, another node took the session and this one lets it go
//!   ([`ClaimError::Lost`]): a stale owner coming back never overwrites.
//! - A client whose node died calls ActivateSession on another node, which
//!   claims the session ([`claim`]): the record's nonce must still be the
//!   one the client signed over, and the claim is one compare-and-set that
//!   writes the new owner and the next nonce. Two nodes claiming at once:
//!   one wins, the other's write conflicts. A replayed ActivateSession
//!   finds the nonce consumed.
//! - Each node beats a heartbeat record; [`Leases`] judges on the
//!   reader's own clock which nodes are alive. The sessions of a node
//!   whose lease ran out are adopted by a survivor ([`adopt_orphans`]) so
//!   their timeouts still run (they are deleted when no client claims them
//!   in time) - ownership is released by the lease, not by the dead node.
//!   A node that comes back finds them owned by others and leaves them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::record::{RecordError, SessionRecord};
use super::store::{Bucket, Store, StoreError};

/// Why a session could not be claimed or written.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClaimError {
    /// No record of the session in the store.
    Unknown,
    /// The nonce the client signed over was already consumed (by a claim
    /// or activation on any node).
    NonceConsumed,
    /// Another node wrote the record since this one read or wrote it: the
    /// session is no longer this node's.
    Lost,
    /// The store failed.
    Store(StoreError),
    /// The store held a record that does not decode.
    Record(RecordError),
}

impl std::fmt::Display for ClaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimError::Unknown => f.write_str("no such session in the store"),
            ClaimError::NonceConsumed => f.write_str("the session nonce was already consumed"),
            ClaimError::Lost => f.write_str("another node owns the session now"),
            ClaimError::Store(e) => e.fmt(f),
            ClaimError::Record(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ClaimError {}

impl From<StoreError> for ClaimError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict => ClaimError::Lost,
            e => ClaimError::Store(e),
        }
    }
}

impl From<RecordError> for ClaimError {
    fn from(e: RecordError) -> Self {
        ClaimError::Record(e)
    }
}

/// A session record read from the store with its revision.
pub async fn read(
    store: &dyn Store,
    key: &str,
) -> Result<Option<(SessionRecord, u64)>, ClaimError> {
    match store.get(Bucket::Sessions, key).await? {
        None => Ok(None),
        Some(e) => Ok(Some((SessionRecord::decode(&e.value)?, e.revision))),
    }
}

/// What a successful claim tells.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The record as written (owner: the claiming node).
    pub record: SessionRecord,
    /// Its revision: the next write of this node compares against it.
    pub revision: u64,
    /// The node that owned it before.
    pub previous_owner: String,
}

/// Claims the session under `key` for node `me` on behalf of a client
/// whose ActivateSession was signed over `expected_nonce`: the record's
/// nonce must still be that one; `next_nonce` replaces it and `me`
/// becomes the owner, in one compare-and-set on the revision read.
/// `update` sets what the activation changed (channel policy, user, ...).
pub async fn claim(
    store: &dyn Store,
    me: &str,
    key: &str,
    expected_nonce: &[u8; 32],
    next_nonce: [u8; 32],
    update: impl Fn(&mut SessionRecord),
) -> Result<Claimed, ClaimError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (mut record, revision) = read(store, key).await?.ok_or(ClaimError::Unknown)?;
        if record.server_nonce != *expected_nonce {
            return Err(ClaimError::NonceConsumed);
        }
        let previous_owner = std::mem::replace(&mut record.owner, me.to_owned());
        update(&mut record);
        record.server_nonce = next_nonce;
        record.activated = true;
        record.version = record.version.wrapping_add(1);
        match store
            .update(Bucket::Sessions, key, record.encode(), revision)
            .await
        {
            Ok(revision) => {
                return Ok(Claimed {
                    record,
                    revision,
                    previous_owner,
                })
            }
            // Someone wrote in between: a survivor adopting the session
            // of a dead node changes its owner and leaves the nonce, so
            // the claim reads again and goes on while the nonce is the
            // one the client signed; a consumed nonce ends it above.
            Err(StoreError::Conflict) if attempts < CLAIM_ATTEMPTS => {}
            Err(StoreError::Conflict) => return Err(ClaimError::NonceConsumed),
            Err(e) => return Err(e.into()),
        }
    }
}

/// How often a claim reads the record again after a concurrent write that
/// left the nonce alone (an adoption, a transition of the old owner).
const CLAIM_ATTEMPTS: u32 = 4;

/// Writes the record of a session this node serves: created when
/// `revision` is `None`, else compared against it. [`ClaimError::Lost`]
/// when another node wrote it since (this node must let the session go).
pub async fn write_owned(
    store: &dyn Store,
    key: &str,
    record: &SessionRecord,
    revision: Option<u64>,
) -> Result<u64, ClaimError> {
    let bytes = record.encode();
    let r = match revision {
        None => store.create(Bucket::Sessions, key, bytes).await,
        Some(r) => store.update(Bucket::Sessions, key, bytes, r).await,
    };
    Ok(r?)
}

/// Deletes the record of a session this node closed, unless another node
/// wrote it since ([`ClaimError::Lost`]: then it is that node's to keep).
pub async fn delete_owned(store: &dyn Store, key: &str, revision: u64) -> Result<(), ClaimError> {
    Ok(store.delete(Bucket::Sessions, key, Some(revision)).await?)
}

/// Which nodes are alive, judged on this node's clock: a node is alive
/// while its heartbeat counter changed less than one lease ago. A node
/// never seen counts as alive for one lease after this table started
/// (its next beat may not have arrived yet).
#[derive(Debug, Clone)]
pub struct Leases {
    lease: Duration,
    started: Instant,
    seen: HashMap<String, (u64, Instant)>,
}

impl Leases {
    /// A table judging with `lease`, started at `now`.
    pub fn new(lease: Duration, now: Instant) -> Self {
        Leases {
            lease,
            started: now,
            seen: HashMap::new(),
        }
    }

    /// Notes that `node`'s heartbeat counter reads `beat` at `now`.
    pub fn observe(&mut self, node: &str, beat: u64, now: Instant) {
        let e = self.seen.entry(node.to_owned()).or_insert((beat, now));
        if e.0 != beat {
            *e = (beat, now);
        }
    }

    /// Forgets `node` (its heartbeat record was deleted: it left).
    pub fn forget(&mut self, node: &str, now: Instant) {
        // Kept as "last changed long ago": dead at once.
        self.seen.insert(
            node.to_owned(),
            (
                u64::MAX,
                now.checked_sub(self.lease).unwrap_or(self.started),
            ),
        );
    }

    /// True while `node` holds its lease at `now`.
    pub fn alive(&self, node: &str, now: Instant) -> bool {
        match self.seen.get(node) {
            Some((_, at)) => now.saturating_duration_since(*at) < self.lease,
            None => now.saturating_duration_since(self.started) < self.lease,
        }
    }

    /// The nodes seen and alive at `now`.
    pub fn alive_nodes(&self, now: Instant) -> Vec<String> {
        let mut v: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, (_, at))| now.saturating_duration_since(*at) < self.lease)
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }
}

/// A session adopted from a dead node: no client is on it; it is deleted
/// when its timeout passes unless a client claims it first.
#[derive(Debug, Clone, PartialEq)]
pub struct Adopted {
    /// Its key.
    pub key: String,
    /// The record as written by the adoption.
    pub record: SessionRecord,
    /// Its revision.
    pub revision: u64,
}

/// Adopts, for node `me`, every session whose owner's lease ran out: one
/// compare-and-set each (of two survivors adopting at once, one gets
/// each session). Records that do not decode are reported, not adopted.
pub async fn adopt_orphans(
    store: &dyn Store,
    me: &str,
    leases: &Leases,
    now: Instant,
) -> Result<(Vec<Adopted>, Vec<(String, RecordError)>), StoreError> {
    let mut adopted = Vec::new();
    let mut bad = Vec::new();
    for key in store.keys(Bucket::Sessions).await? {
        let entry = match store.get(Bucket::Sessions, &key).await? {
            Some(e) => e,
            None => continue,
        };
        let mut record = match SessionRecord::decode(&entry.value) {
            Ok(r) => r,
            Err(e) => {
                bad.push((key, e));
                continue;
            }
        };
        if record.owner == me || leases.alive(&record.owner, now) {
            continue;
        }
        record.owner = me.to_owned();
        record.version = record.version.wrapping_add(1);
        match store
            .update(Bucket::Sessions, &key, record.encode(), entry.revision)
            .await
        {
            Ok(revision) => adopted.push(Adopted {
                key,
                record,
                revision,
            }),
            Err(StoreError::Conflict) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((adopted, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::memory::MemoryStore;
    use crate::cluster::record::tests::sample;
    use crate::cluster::testing::now;

    const KEY: &str = "s.01";

    fn stored(store: &MemoryStore, owner: &str) -> u64 {
        now(write_owned(store, KEY, &sample(owner, 1), None)).unwrap()
    }

    #[test]
    fn a_claim_moves_the_owner_and_consumes_the_nonce() {
        let store = MemoryStore::new();
        stored(&store, "a");
        let c = now(claim(&store, "b", KEY, &[1; 32], [2; 32], |r| {
            r.locale_ids.clear()
        }))
        .unwrap();
        assert_eq!(c.previous_owner, "a");
        assert_eq!(c.record.owner, "b");
        assert_eq!(c.record.version, 2);
        let (r, rev) = now(read(&store, KEY)).unwrap().unwrap();
        assert_eq!(
            (r.owner.as_str(), r.server_nonce, rev),
            ("b", [2; 32], c.revision)
        );
        assert!(r.locale_ids.is_empty());
    }

    #[test]
    fn a_replayed_nonce_is_refused() {
        let store = MemoryStore::new();
        stored(&store, "a");
        now(claim(&store, "b", KEY, &[1; 32], [2; 32], |_| {})).unwrap();
        // The same ActivateSession replayed, on another node or the same.
        for node in ["c", "b"] {
            assert_eq!(
                now(claim(&store, node, KEY, &[1; 32], [3; 32], |_| {})),
                Err(ClaimError::NonceConsumed)
            );
        }
        assert_eq!(now(read(&store, KEY)).unwrap().unwrap().0.owner, "b");
    }

    #[test]
    fn two_nodes_claiming_at_once_one_wins() {
        let store = MemoryStore::new();
        stored(&store, "a");
        // Both read the record (same revision, same nonce) before either
        // writes: interleave by hand what two nodes would do.
        let (rec_b, rev) = now(read(&store, KEY)).unwrap().unwrap();
        let (rec_c, rev_c) = now(read(&store, KEY)).unwrap().unwrap();
        assert_eq!(rev, rev_c);
        let mut b = rec_b.clone();
        b.owner = "b".into();
        b.server_nonce = [2; 32];
        let mut c = rec_c.clone();
        c.owner = "c".into();
        c.server_nonce = [3; 32];
        let first = now(store.update(Bucket::Sessions, KEY, b.encode(), rev));
        let second = now(store.update(Bucket::Sessions, KEY, c.encode(), rev));
        assert!(first.is_ok());
        assert_eq!(second, Err(StoreError::Conflict));
        // And through `claim`: the loser finds the nonce consumed.
        assert_eq!(
            now(claim(&store, "c", KEY, &[1; 32], [3; 32], |_| {})),
            Err(ClaimError::NonceConsumed)
        );
        assert_eq!(now(read(&store, KEY)).unwrap().unwrap().0.owner, "b");
    }

    /// A survivor adopting the dead node's session between a claim's read
    /// and its write leaves the nonce: the claim reads again and wins; a
    /// write that consumed the nonce still ends it.
    #[test]
    fn an_adoption_between_a_claims_read_and_write_does_not_end_it() {
        let store = MemoryStore::new();
        stored(&store, "a");
        store.write_before_next_update(|bytes| {
            let mut r = SessionRecord::decode(&bytes).expect("decodes");
            r.owner = "c".into();
            r.encode()
        });
        let c = now(claim(&store, "b", KEY, &[1; 32], [2; 32], |_| {})).unwrap();
        assert_eq!(
            c.previous_owner, "c",
            "the adopter it took the session from"
        );
        let (r, _) = now(read(&store, KEY)).unwrap().unwrap();
        assert_eq!((r.owner.as_str(), r.server_nonce), ("b", [2; 32]));
        assert_eq!(
            now(claim(&store, "c", KEY, &[1; 32], [3; 32], |_| {})),
            Err(ClaimError::NonceConsumed)
        );
    }

    #[test]
    fn a_stale_owner_coming_back_does_not_overwrite() {
        let store = MemoryStore::new();
        let rev_a = stored(&store, "a");
        now(claim(&store, "b", KEY, &[1; 32], [2; 32], |_| {})).unwrap();
        // Node a, back from a pause, writes what it still holds.
        let mut stale = sample("a", 1);
        stale.version = 7;
        assert_eq!(
            now(write_owned(&store, KEY, &stale, Some(rev_a))),
            Err(ClaimError::Lost)
        );
        assert_eq!(
            now(delete_owned(&store, KEY, rev_a)),
            Err(ClaimError::Lost),
            "nor delete it"
        );
        // Nor does it adopt it back: b is alive.
        let t0 = Instant::now();
        let mut leases = Leases::new(Duration::from_secs(3), t0);
        leases.observe("b", 1, t0);
        let (adopted, _) = now(adopt_orphans(&store, "a", &leases, t0)).unwrap();
        assert!(adopted.is_empty());
        assert_eq!(now(read(&store, KEY)).unwrap().unwrap().0.owner, "b");
    }

    #[test]
    fn a_dead_nodes_sessions_are_adopted_after_its_lease() {
        let store = MemoryStore::new();
        stored(&store, "a");
        let t0 = Instant::now();
        let lease = Duration::from_secs(3);
        let mut on_b = Leases::new(lease, t0);
        let mut on_c = Leases::new(lease, t0);
        for l in [&mut on_b, &mut on_c] {
            l.observe("a", 1, t0);
            l.observe("a", 2, t0 + Duration::from_secs(1));
        }
        // While the lease holds nothing moves.
        let t = t0 + Duration::from_secs(3);
        assert!(on_b.alive("a", t));
        assert!(now(adopt_orphans(&store, "b", &on_b, t))
            .unwrap()
            .0
            .is_empty());
        // a stopped beating at t0+1 s; at t0+4 s its lease is out. Two
        // survivors sweep: one adopts, the other finds it taken.
        let t = t0 + Duration::from_secs(4);
        assert!(!on_b.alive("a", t));
        on_c.observe("b", 1, t0 + Duration::from_secs(2));
        let (got_b, _) = now(adopt_orphans(&store, "b", &on_b, t)).unwrap();
        let (got_c, _) = now(adopt_orphans(&store, "c", &on_c, t)).unwrap();
        assert_eq!(got_b.len(), 1);
        assert!(got_c.is_empty(), "b is alive now: c leaves it");
        assert_eq!(got_b[0].record.owner, "b");
        // The client still comes back with its nonce, through any node.
        let c = now(claim(&store, "c", KEY, &[1; 32], [5; 32], |_| {})).unwrap();
        assert_eq!(c.previous_owner, "b");
        // The adopter's timeout deletion then loses: the session is live.
        assert_eq!(
            now(delete_owned(&store, KEY, got_b[0].revision)),
            Err(ClaimError::Lost)
        );
    }

    #[test]
    fn a_node_never_seen_gets_one_lease_of_grace() {
        let t0 = Instant::now();
        let mut l = Leases::new(Duration::from_secs(2), t0);
        assert!(l.alive("x", t0 + Duration::from_secs(1)));
        assert!(!l.alive("x", t0 + Duration::from_secs(2)));
        l.observe("y", 4, t0 + Duration::from_secs(5));
        assert_eq!(l.alive_nodes(t0 + Duration::from_secs(6)), vec!["y"]);
        l.forget("y", t0 + Duration::from_secs(6));
        assert!(!l.alive("y", t0 + Duration::from_secs(6)));
    }

    #[test]
    fn undecodable_records_are_reported_and_left() {
        let store = MemoryStore::new();
        now(store.put(Bucket::Sessions, "s.bad", b"garbage".to_vec())).unwrap();
        let t0 = Instant::now();
        let leases = Leases::new(Duration::from_secs(1), t0);
        let (adopted, bad) = now(adopt_orphans(
            &store,
            "b",
            &leases,
            t0 + Duration::from_secs(9),
        ))
        .unwrap();
        assert!(adopted.is_empty());
        assert_eq!(bad.len(), 1);
        assert!(matches!(
            now(claim(&store, "b", "s.bad", &[0; 32], [1; 32], |_| {})),
            Err(ClaimError::Record(_))
        ));
        assert_eq!(
            now(claim(&store, "b", "s.none", &[0; 32], [1; 32], |_| {})),
            Err(ClaimError::Unknown)
        );
    }

    #[test]
    fn an_unreachable_store_is_an_error() {
        let store = MemoryStore::new();
        stored(&store, "a");
        store.set_unreachable(true);
        assert!(matches!(
            now(claim(&store, "b", KEY, &[1; 32], [2; 32], |_| {})),
            Err(ClaimError::Store(StoreError::Unreachable(_)))
        ));
    }
}
