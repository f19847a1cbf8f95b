//! A server as a cluster node: the mirror of its sessions, its heartbeat,
//! the watch that tells it when another node took one of its sessions, the
//! adoption of dead nodes' sessions, and the takeover of a session whose
//! client comes back through this node.
//!
//! Writes run behind the request path: a session transition only puts
//! the session's latest record into a map (one per session: later
//! transitions replace earlier ones, so the map is bounded by the session
//! count) and wakes the writer task. When the store is unreachable the
//! node keeps serving its own sessions, marks itself degraded, keeps the
//! latest record of each changed session, and writes them when the store
//! is back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uascale_types::{NodeId, Variant};

use super::record::{
    bounded, drop_unsent_events, fit_unsent, is_plain_file_name, session_key, trust_key, value_key,
    ContinuationRecord, EccRecord, NodeRecord, SessionRecord, StatusRecord, SubscriptionsRecord,
    TrustRecord, ValueRecord, FORMAT_CONTINUATION, FORMAT_EVENT_QUEUES, FORMAT_QUEUES,
};
use super::store::{Bucket, Store, StoreError};
use super::takeover::{self, ClaimError, Claimed, Leases};
use crate::config::ClusterSection;
use crate::session::{Session, SessionEvent};
use crate::subscription::SubscriptionImage;

/// How far a node's status record's beat may be from its heartbeat's and
/// still count (it is written right after the heartbeat).
const STATUS_BEATS_APART: u64 = 2;

/// How long the writer waits before trying again after a store error.
const RETRY: Duration = Duration::from_millis(500);

/// Removes a session from this node's table when another node took it
/// (set by the server state, which owns the table).
pub type Evict = Box<dyn Fn(&NodeId) + Send + Sync>;

/// The subscriptions of a session now (the subscription engine's images),
/// by subscription id: the session and its images, with the items'
/// unsent values when the flag is set (set by the server state).
pub type Images = Box<dyn Fn(u32, bool) -> Option<(NodeId, Vec<SubscriptionImage>)> + Send + Sync>;

/// The subscription id counter of this server (set by the server state):
/// its node index, the counter now, and what seeds it.
pub struct IdCounter {
    /// The node index (the ids' top byte).
    pub index: u8,
    /// The counter now (the low 24 bits of the next id).
    pub now: Box<dyn Fn() -> u32 + Send + Sync>,
    /// Makes the counter go on from a value.
    pub seed: Box<dyn Fn(u32) + Send + Sync>,
}

/// Subscription ids reserved in the store at a time, per process: a
/// process that comes within half of it of its reservation's end
/// reserves the next (each heartbeat looks).
pub const ID_BLOCK: u32 = 1 << 16;

/// The largest id counter (24 bits; the top byte is the node index).
const ID_COUNTER_MAX: u32 = 0x00FF_FFFF;

/// This node's own ServiceLevel and ServerState now (set by the server
/// state): what its heartbeat tells the others.
pub type OwnStatus = Box<dyn Fn() -> (u8, uascale_types::ServerState) + Send + Sync>;

/// One node of the cluster as its last heartbeat described it: an entry of
/// `Server.ServerRedundancy.RedundantServerArray`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node id (the `ServerId`).
    pub id: String,
    /// Its ServiceLevel.
    pub service_level: u8,
    /// Its ServerState.
    pub state: uascale_types::ServerState,
}

/// Applies a value another node wrote to this node's variable (set by the
/// server state: through the node managers, so subscriptions hear it).
pub type ApplyValue = Box<dyn Fn(&NodeId, Variant) + Send + Sync>;

thread_local! {
    /// Set while a value from the feed is applied: its change is not
    /// mirrored back.
    static APPLYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A write waiting for the writer task.
#[derive(Debug, Clone)]
enum Pending {
    /// The session's latest record.
    Write(Box<SessionRecord>),
    /// The session closed.
    Delete,
}

#[derive(Debug, Default)]
struct Mirror {
    /// Revision of each session record this node last wrote (`None`:
    /// queued for its first write).
    owned: HashMap<String, Option<u64>>,
    /// Sessions being claimed: their transitions are not queued (the
    /// claim writes the record).
    claiming: HashMap<String, ()>,
    pending: HashMap<String, Pending>,
    /// When the oldest write still pending was queued.
    oldest: Option<Instant>,
    /// The key of each mirrored session, by session id.
    keys: HashMap<NodeId, String>,
    /// Subscriptions answered since their session's subscriptions record
    /// was last written.
    dirty_subscriptions: std::collections::HashSet<u32>,
    /// The nonce of each session this node serves, as it last heard it:
    /// a record of another owner with the same nonce was adopted by a
    /// janitor (no client came), one with another nonce was claimed by
    /// the client.
    nonces: HashMap<String, [u8; 32]>,
    /// The last record of each session this node serves (rewritten when a
    /// janitor adopted the session by mistake).
    records: HashMap<String, Box<SessionRecord>>,
    /// Values changed here since they were last written (the latest of
    /// each: bounded by the number of variables).
    values: HashMap<NodeId, Variant>,
    /// The keys of the batch being written now.
    in_flight: std::collections::HashSet<String>,
}

/// Counters of the cluster, for /metrics.
#[derive(Debug, Default)]
pub struct ClusterMetrics {
    /// Sessions taken over from another node by a client's ActivateSession.
    pub takeovers: AtomicU64,
    /// Claims refused (nonce consumed, lost race, store error).
    pub takeovers_failed: AtomicU64,
    /// Sessions this node lost to another node.
    pub sessions_lost: AtomicU64,
    /// Sessions adopted from dead nodes.
    pub sessions_adopted: AtomicU64,
    /// Sessions of this node that a janitor adopted while this node still
    /// served them (it was thought dead), taken back.
    pub sessions_reclaimed: AtomicU64,
    /// Failed store operations.
    pub store_errors: AtomicU64,
    /// Records written.
    pub records_written: AtomicU64,
    /// The age of the oldest pending write when the last batch was
    /// written, in microseconds (the mirror lag).
    pub mirror_lag_us: AtomicU64,
}

/// This server as a cluster node.
pub struct ClusterNode {
    store: Arc<dyn Store>,
    me: String,
    settings: ClusterSection,
    mirror: Mutex<Mirror>,
    wake: tokio::sync::Notify,
    /// Told after each batch of session records was written.
    written: tokio::sync::Notify,
    /// Held by whoever writes the mirror (the writer task, or a drain
    /// writing everything at once): once a drain holds it, no write of the
    /// writer is still in flight.
    write_turn: tokio::sync::Mutex<()>,
    leases: Mutex<Leases>,
    /// The last heartbeat of each node seen: its degraded flag and beat.
    beats: Mutex<HashMap<String, (bool, u64)>>,
    /// The last status record of each node seen.
    statuses: Mutex<HashMap<String, StatusRecord>>,
    /// This node's own status, for its heartbeat.
    own_status: std::sync::OnceLock<OwnStatus>,
    /// Adopted sessions of dead nodes: key -> (deadline, revision).
    orphans: Mutex<HashMap<String, (Instant, u64)>>,
    degraded: AtomicBool,
    evict: Evict,
    images: std::sync::OnceLock<Images>,
    /// The subscription id counter, and the end of the ids reserved for
    /// it in the store (0: none reserved yet).
    ids: std::sync::OnceLock<IdCounter>,
    ids_reserved_to: std::sync::atomic::AtomicU32,
    /// Told by [`ClusterNode::write_all_now`] before it writes: this node
    /// answers no Publish with a message from now on (set by the server
    /// state).
    on_drain: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Set by the first [`ClusterNode::write_all_now`]: the node publishes
    /// nothing more, so its subscriptions records carry the items' unsent
    /// values from then on.
    draining: AtomicBool,
    apply: std::sync::OnceLock<ApplyValue>,
    /// The PKI's `trusted/certs`, when the server has a PKI.
    trust_dir: std::sync::OnceLock<std::path::PathBuf>,
    /// The trusted certificate files this node published or wrote, by name.
    trust_known: Mutex<HashMap<String, Vec<u8>>>,
    /// The cluster's counters.
    pub metrics: ClusterMetrics,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("me", &self.me)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each update under these locks is one map operation.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The record of `session` (token `token`) as node `owner` writes it,
/// with its continuation points (those that fit: [`bounded`]).
pub fn record_of(owner: &str, token: &NodeId, s: &Session) -> SessionRecord {
    SessionRecord {
        owner: owner.to_owned(),
        version: 0,
        session_id: s.session_id.clone(),
        token: token.clone(),
        server_nonce: s.server_nonce,
        client_thumbprint: s.client_thumbprint,
        client_uri: s.client_uri.clone(),
        name: s.name.clone(),
        user: s.user.clone(),
        security_policy: s.security_policy,
        security_mode: s.security_mode,
        endpoint_url: s.endpoint_url.clone(),
        timeout: s.timeout,
        locale_ids: s.locale_ids.to_vec(),
        created: s.created,
        activated: s.activated,
        ecc: s.ecc.as_ref().map(|e| EccRecord {
            client_nonce: e.client_nonce.clone(),
            // A key that cannot be exported is left out: the session is
            // taken over without it, as before.
            ephemeral: e
                .ephemeral
                .as_ref()
                .and_then(|k| Some((k.curve(), k.private_bytes().ok()?))),
        }),
        continuation_points: s
            .continuation_points
            .as_deref()
            .map(|cps| {
                bounded(cps.iter().filter_map(|c| {
                    Some(ContinuationRecord {
                        id: c.id.as_bytes()?.to_vec(),
                        browse: c.browse.clone(),
                        max: u32::try_from(c.max).ok()?,
                        returned: u32::try_from(c.returned).ok()?,
                    })
                }))
            })
            .unwrap_or_default(),
    }
}

/// The session a record describes, as this node restores it at `now`:
/// bound to no channel yet (the ActivateSession that takes it over moves
/// it to its own), its timeout running from now, with at most
/// `max_continuation_points` of its continuation points (this node's
/// `max_browse_continuation_points`; the first ones, as they were held).
/// A restored point holds no references: BrowseNext browses again.
pub fn session_of(r: &SessionRecord, now: Instant, max_continuation_points: usize) -> Session {
    let points: crate::session::ContinuationPoints = r
        .continuation_points
        .iter()
        .take(max_continuation_points)
        .map(|c| crate::session::ContinuationPoint {
            id: uascale_types::ByteString::new(c.id.clone()),
            browse: c.browse.clone(),
            max: c.max as usize,
            returned: c.returned as usize,
            rest: None,
        })
        .collect();
    Session {
        session_id: r.session_id.clone(),
        channel_id: 0,
        timeout: r.timeout,
        deadline: now + r.timeout,
        activated: r.activated,
        name: r.name.clone(),
        locale_ids: r.locale_ids.clone().into(),
        continuation_points: (!points.is_empty()).then(|| Box::new(points)),
        server_nonce: r.server_nonce,
        client_thumbprint: r.client_thumbprint,
        client_uri: r.client_uri.clone(),
        user: r.user.clone(),
        created: r.created,
        endpoint_url: r.endpoint_url.clone(),
        security_policy: r.security_policy,
        security_mode: r.security_mode,
        // The ClientNonce and the ephemeral key last sent: the signatures
        // and a UserName token of the ActivateSession that takes it over
        // are checked against them (a key that does not load is left out).
        ecc: r.ecc.as_ref().map(|e| {
            std::sync::Arc::new(crate::session::EccSession {
                client_nonce: e.client_nonce.clone(),
                ephemeral: e.ephemeral.as_ref().and_then(|(curve, private)| {
                    uascale_crypto::ecc::EphemeralKey::from_private_bytes(*curve, private).ok()
                }),
            })
        }),
    }
}

impl ClusterNode {
    /// Node `me` mirroring through `store`; `evict` removes a session
    /// another node took from this node's table.
    pub fn new(
        store: Arc<dyn Store>,
        me: String,
        settings: ClusterSection,
        evict: Evict,
    ) -> Arc<Self> {
        let lease = settings.lease;
        Arc::new(ClusterNode {
            store,
            me,
            settings,
            mirror: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            written: tokio::sync::Notify::new(),
            write_turn: tokio::sync::Mutex::new(()),
            leases: Mutex::new(Leases::new(lease, Instant::now())),
            beats: Mutex::default(),
            statuses: Mutex::default(),
            own_status: std::sync::OnceLock::new(),
            orphans: Mutex::default(),
            degraded: AtomicBool::new(false),
            evict,
            images: std::sync::OnceLock::new(),
            ids: std::sync::OnceLock::new(),
            ids_reserved_to: std::sync::atomic::AtomicU32::new(0),
            draining: AtomicBool::new(false),
            on_drain: std::sync::OnceLock::new(),
            apply: std::sync::OnceLock::new(),
            trust_dir: std::sync::OnceLock::new(),
            trust_known: Mutex::default(),
            metrics: ClusterMetrics::default(),
        })
    }

    /// Sets the PKI directory whose `trusted/certs` is mirrored (once).
    pub fn set_trust_dir(&self, pki_root: &std::path::Path) {
        let _ = self.trust_dir.set(pki_root.join("trusted/certs"));
    }

    /// Publishes the trusted certificate files added here since the last
    /// pass, and deletes from the store the ones removed here.
    async fn sync_trust(&self) -> Result<(), StoreError> {
        let Some(dir) = self.trust_dir.get() else {
            return Ok(());
        };
        let mut now: HashMap<String, Vec<u8>> = HashMap::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !is_plain_file_name(&name) || name.starts_with('.') {
                    continue;
                }
                if let Ok(bytes) = std::fs::read(e.path()) {
                    if bytes.len() <= super::store::MAX_RECORD_BYTES / 2 {
                        now.insert(name, bytes);
                    }
                }
            }
        }
        let known = lock(&self.trust_known).clone();
        for (name, bytes) in &now {
            if known.get(name) == Some(bytes) {
                continue;
            }
            let rec = TrustRecord {
                owner: self.me.clone(),
                file_name: name.clone(),
                bytes: bytes.clone(),
            };
            self.store
                .put(Bucket::Trust, &trust_key(name), rec.encode())
                .await?;
            lock(&self.trust_known).insert(name.clone(), bytes.clone());
        }
        for name in known.keys().filter(|n| !now.contains_key(*n)) {
            self.store
                .delete(Bucket::Trust, &trust_key(name), None)
                .await?;
            lock(&self.trust_known).remove(name);
        }
        Ok(())
    }

    /// Applies a trusted certificate another node published (or removed):
    /// the file is written to (or removed from) `trusted/certs`, where the
    /// PKI's reload finds it.
    fn trust_seen(&self, key: &str, value: Option<&[u8]>) {
        let Some(dir) = self.trust_dir.get() else {
            return;
        };
        let Some(value) = value else {
            // Removed on another node: the file of that key goes here too.
            let name = lock(&self.trust_known)
                .keys()
                .find(|n| trust_key(n) == key)
                .cloned();
            if let Some(name) = name {
                let _ = std::fs::remove_file(dir.join(&name));
                lock(&self.trust_known).remove(&name);
            }
            return;
        };
        let rec = match TrustRecord::decode(value) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(key, error = %e, "undecodable trust record ignored");
                return;
            }
        };
        if lock(&self.trust_known).get(&rec.file_name) == Some(&rec.bytes) {
            return;
        }
        // Written beside, then renamed: the PKI never reads half a file.
        let tmp = dir.join(format!(".{}.part", rec.file_name));
        let done = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, &rec.bytes))
            .and_then(|()| std::fs::rename(&tmp, dir.join(&rec.file_name)));
        match done {
            Ok(()) => {
                tracing::info!(file = %rec.file_name, from = %rec.owner, "trusted certificate from the cluster");
                lock(&self.trust_known).insert(rec.file_name, rec.bytes);
            }
            Err(e) => {
                tracing::warn!(file = %rec.file_name, error = %e, "trusted certificate from the cluster not written");
            }
        }
    }

    /// Sets how values from other nodes are applied here (once).
    pub fn set_apply(&self, apply: ApplyValue) {
        let _ = self.apply.set(apply);
    }

    /// A variable of an in-memory node manager changed here: its value is
    /// written to the store (coalesced) unless it came from the store.
    pub fn value_changed(&self, node: &NodeId, value: &Variant) {
        if APPLYING.with(|a| a.get()) {
            return;
        }
        let fresh = lock(&self.mirror)
            .values
            .insert(node.clone(), value.clone())
            .is_none();
        if fresh {
            self.wake.notify_one();
        }
    }

    /// True when this node is the one that runs the demo's changing
    /// values: the alive node with the smallest id (the others follow
    /// the feed; one writer per value).
    pub fn leads(&self) -> bool {
        let alive = lock(&self.leases).alive_nodes(Instant::now());
        alive.iter().all(|n| self.me <= *n)
    }

    /// Writes the changed values; false when the store failed (they wait).
    async fn write_values(&self) -> bool {
        let values = std::mem::take(&mut lock(&self.mirror).values);
        let mut left = Vec::new();
        let mut failed = false;
        for (node, value) in values {
            if failed {
                left.push((node, value));
                continue;
            }
            let Some(key) = value_key(&node) else {
                continue;
            };
            let rec = ValueRecord {
                owner: self.me.clone(),
                node_id: node.clone(),
                value: value.clone(),
            };
            match self.store.put(Bucket::Values, &key, rec.encode()).await {
                Ok(_) => {
                    self.metrics.records_written.fetch_add(1, Ordering::Relaxed);
                }
                Err(StoreError::Invalid(e)) => {
                    tracing::debug!(node = %node, error = %e, "value not mirrored");
                }
                Err(e) => {
                    self.store_failed(&e);
                    failed = true;
                    left.push((node, value));
                }
            }
        }
        let mut m = lock(&self.mirror);
        for (node, value) in left {
            m.values.entry(node).or_insert(value);
        }
        !failed
    }

    /// Applies a value record another node wrote.
    fn value_seen(&self, key: &str, value: Option<&[u8]>) {
        let Some(value) = value else {
            return;
        };
        let rec = match ValueRecord::decode(value) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(key, error = %e, "undecodable value record ignored");
                return;
            }
        };
        if rec.owner == self.me {
            return;
        }
        if let Some(apply) = self.apply.get() {
            APPLYING.with(|a| a.set(true));
            apply(&rec.node_id, rec.value);
            APPLYING.with(|a| a.set(false));
        }
    }

    /// Sets where the subscriptions' images come from (once).
    pub fn set_images(&self, images: Images) {
        let _ = self.images.set(images);
    }

    /// Sets what stops this node's Publish answers when it drains, before
    /// its final records are taken (once).
    pub fn set_on_drain(&self, hold: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_drain.set(hold);
    }

    /// A Publish of subscription `id` was answered: its session's
    /// subscriptions record is rewritten (coalesced, behind the publish
    /// path: this only marks it).
    pub fn subscription_answered(&self, id: u32) {
        let fresh = lock(&self.mirror).dirty_subscriptions.insert(id);
        if fresh {
            self.wake.notify_one();
        }
    }

    /// Sets the subscription id counter that
    /// [`ClusterNode::reserve_ids`] keeps within the store's reservations
    /// (once).
    pub fn set_id_counter(&self, ids: IdCounter) {
        let _ = self.ids.set(ids);
    }

    /// Keeps the subscription ids of this process out of every earlier
    /// process's of the same node index: the first call reserves
    /// [`ID_BLOCK`] ids from the store's mark for the index and seeds the
    /// counter at their start; a later one reserves the next block once
    /// the counter is within half a block of the reservation's end (each
    /// heartbeat calls it). The mark moves by compare-and-set, and past
    /// the 24-bit counter's end it starts again from 1.
    pub async fn reserve_ids(&self) -> Result<(), StoreError> {
        let Some(ids) = self.ids.get() else {
            return Ok(());
        };
        let reserved_to = self.ids_reserved_to.load(Ordering::Acquire);
        let now = (ids.now)();
        let first = reserved_to == 0;
        if !first && now.wrapping_add(ID_BLOCK / 2) < reserved_to {
            return Ok(());
        }
        let key = format!("n{}", ids.index);
        let (start, end) = loop {
            let current = self.store.get(Bucket::Ids, &key).await?;
            let mark = current
                .as_ref()
                .and_then(|e| e.value.get(..4))
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map_or(1, u32::from_be_bytes);
            // At the mark, or where the counter already is if that is
            // higher (a later block of this process; ids made before the
            // first reservation).
            let mut start = mark.max(now).max(1);
            if start > ID_COUNTER_MAX - ID_BLOCK {
                start = 1;
            }
            let end = start + ID_BLOCK;
            let value = end.to_be_bytes().to_vec();
            let written = match &current {
                None => self.store.create(Bucket::Ids, &key, value).await,
                Some(e) => {
                    self.store
                        .update(Bucket::Ids, &key, value, e.revision)
                        .await
                }
            };
            match written {
                Ok(_) => break (start, end),
                Err(StoreError::Conflict) => continue,
                Err(e) => return Err(e),
            }
        };
        if first || start < now {
            (ids.seed)(start);
        }
        self.ids_reserved_to.store(end, Ordering::Release);
        Ok(())
    }

    /// [`ClusterNode::reserve_ids`], tried again while the store does not
    /// answer, for up to `limit` (then its error).
    pub async fn reserve_ids_patiently(&self, limit: Duration) -> Result<(), StoreError> {
        let deadline = Instant::now() + limit;
        loop {
            match self.reserve_ids().await {
                Err(StoreError::Unreachable(e)) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "reserving subscription ids: again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                done => return done,
            }
        }
    }

    /// The subscriptions record of the session under `key`, if any.
    pub async fn read_subscriptions(
        &self,
        key: &str,
    ) -> Result<Option<SubscriptionsRecord>, ClaimError> {
        match self.store.get(Bucket::Subscriptions, key).await {
            Ok(Some(e)) => Ok(Some(SubscriptionsRecord::decode(&e.value)?)),
            Ok(None) => Ok(None),
            Err(e) => {
                self.store_failed(&e);
                Err(ClaimError::Store(e))
            }
        }
    }

    /// Writes the subscriptions records of the sessions whose
    /// subscriptions were answered; false when the store failed (the rest
    /// stays marked).
    async fn write_subscriptions(&self) -> bool {
        let Some(images) = self.images.get() else {
            return true;
        };
        let dirty: Vec<u32> = lock(&self.mirror).dirty_subscriptions.drain().collect();
        let mut done: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
        // Unsent values only once publishing stopped (else a message sent
        // after the write would be restored twice) and every live node
        // reads their format.
        let unsent = !dirty.is_empty()
            && self.draining.load(Ordering::Acquire)
            && self.all_read(FORMAT_QUEUES);
        // Queued events only where every live node reads their format too.
        let without_events = unsent && !self.all_read(FORMAT_EVENT_QUEUES);
        for (i, id) in dirty.iter().enumerate() {
            let Some((session_id, mut subs)) = images(*id, unsent) else {
                continue;
            };
            if !done.insert(session_id.clone()) {
                continue;
            }
            let key = {
                let m = lock(&self.mirror);
                match m.keys.get(&session_id) {
                    Some(k) if matches!(m.owned.get(k), Some(Some(_))) => k.clone(),
                    _ => continue,
                }
            };
            if without_events {
                let dropped = drop_unsent_events(&mut subs);
                if dropped > 0 {
                    tracing::warn!(
                        session = %session_id,
                        dropped,
                        "unsent events left out: a live node does not read their record format"
                    );
                }
            }
            if unsent {
                let dropped = fit_unsent(
                    &self.me,
                    &session_id,
                    &mut subs,
                    super::store::MAX_RECORD_BYTES,
                );
                if dropped > 0 {
                    tracing::warn!(
                        session = %session_id,
                        dropped,
                        "unsent values over the record size left out (the first kept is marked Overflow)"
                    );
                }
            }
            let rec = SubscriptionsRecord {
                owner: self.me.clone(),
                version: 0,
                session_id,
                subscriptions: subs,
            };
            match self
                .store
                .put(Bucket::Subscriptions, &key, rec.encode())
                .await
            {
                Ok(_) => {
                    self.metrics.records_written.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.store_failed(&e);
                    let mut m = lock(&self.mirror);
                    m.dirty_subscriptions.extend(dirty.iter().skip(i).copied());
                    return false;
                }
            }
        }
        true
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.me
    }

    /// True while the store cannot be written (the node serves its own
    /// sessions and catches up when the store is back).
    pub fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Writes still waiting for the store.
    pub fn pending_writes(&self) -> usize {
        lock(&self.mirror).pending.len()
    }

    /// The nodes whose heartbeat this node sees alive now.
    pub fn alive_nodes(&self) -> Vec<String> {
        lock(&self.leases).alive_nodes(Instant::now())
    }

    /// Sets what this node's heartbeat says about it (once).
    pub fn set_own_status(&self, status: OwnStatus) {
        let _ = self.own_status.set(status);
    }

    /// This node's own ServiceLevel and ServerState now (Running at 255
    /// before the server state set them).
    fn own(&self) -> (u8, uascale_types::ServerState) {
        self.own_status
            .get()
            .map_or((255, uascale_types::ServerState::Running), |f| f())
    }

    /// The cluster's members now: this node with its own status, and
    /// every other node holding its lease with what its status record
    /// says; sorted by id. A node without a fresh status record (an older
    /// build that does not write one) reads Running, at 200 (healthy) or
    /// [`crate::admission::service_level::DEGRADED_SERVICE_LEVEL`] when its heartbeat says it
    /// is degraded. A dead node is gone once its lease ran out.
    pub fn members(&self) -> Vec<Member> {
        let alive = lock(&self.leases).alive_nodes(Instant::now());
        let beats = lock(&self.beats);
        let statuses = lock(&self.statuses);
        let (level, state) = self.own();
        let mut members = vec![Member {
            id: self.me.clone(),
            service_level: level,
            state,
        }];
        for id in alive.into_iter().filter(|n| *n != self.me) {
            let (degraded, beat) = beats.get(&id).copied().unwrap_or((false, 0));
            // Written right after the heartbeat: a beat or two apart.
            let status = statuses
                .get(&id)
                .filter(|s| s.beat.abs_diff(beat) <= STATUS_BEATS_APART);
            let (service_level, state) = match status {
                Some(s) => (s.service_level, s.state),
                None if degraded => (
                    crate::admission::service_level::DEGRADED_SERVICE_LEVEL,
                    uascale_types::ServerState::Running,
                ),
                None => (
                    crate::admission::ServiceLevel::FULL,
                    uascale_types::ServerState::Running,
                ),
            };
            members.push(Member {
                id,
                service_level,
                state,
            });
        }
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members
    }

    /// True when every other node holding its lease reads record format
    /// `format`, as its status record says (a node without a fresh status
    /// record - an older build - reads format 2): the rule for writing a
    /// new format during a rolling upgrade.
    pub fn all_read(&self, format: u8) -> bool {
        let alive = lock(&self.leases).alive_nodes(Instant::now());
        let beats = lock(&self.beats);
        let statuses = lock(&self.statuses);
        alive.iter().filter(|n| **n != self.me).all(|id| {
            let beat = beats.get(id).map_or(0, |b| b.1);
            let reads = statuses
                .get(id)
                .filter(|s| s.beat.abs_diff(beat) <= STATUS_BEATS_APART)
                .map_or(2, |s| s.reads);
            reads >= format
        })
    }

    /// The record this node writes of `session`: [`record_of`], without
    /// the continuation points while a live node does not read their
    /// format (they are mirrored with the next change once every node
    /// does).
    fn record_for(&self, token: &NodeId, session: &Session) -> SessionRecord {
        let mut rec = record_of(&self.me, token, session);
        if !rec.continuation_points.is_empty() && !self.all_read(FORMAT_CONTINUATION) {
            rec.continuation_points.clear();
        }
        rec
    }

    /// The other members that serve on (Running): where the sessions of
    /// this one go when it shuts down.
    fn serving_peers(&self) -> impl Iterator<Item = Member> + '_ {
        self.members()
            .into_iter()
            .filter(move |m| m.id != self.me && m.state == uascale_types::ServerState::Running)
    }

    /// True while another member serves on (holds its lease and is not
    /// shutting down itself): the sessions of this one have somewhere to
    /// go.
    pub fn peers_serving(&self) -> bool {
        self.serving_peers().next().is_some()
    }

    /// The highest ServiceLevel among the other members that serve on:
    /// what the client of a node shutting down is offered through the
    /// front end.
    pub fn serving_peers_level(&self) -> Option<u8> {
        self.serving_peers().map(|m| m.service_level).max()
    }

    fn set_degraded(&self, degraded: bool, why: Option<&StoreError>) {
        let was = self.degraded.swap(degraded, Ordering::Relaxed);
        match (was, degraded, why) {
            (false, true, Some(e)) => {
                tracing::warn!(node = %self.me, error = %e, "cluster store unreachable: degraded, serving own sessions");
            }
            (true, false, _) => tracing::info!(node = %self.me, "cluster store back: caught up"),
            _ => {}
        }
    }

    fn store_failed(&self, e: &StoreError) {
        self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
        self.set_degraded(true, Some(e));
    }

    /// Hears a session transition (the session table's mirror): queues
    /// the session's latest record, or its deletion.
    pub fn heard(&self, _event: &SessionEvent, token: &NodeId, session: Option<&Session>) {
        let Some(key) = session_key(token) else {
            return;
        };
        {
            let mut m = lock(&self.mirror);
            if m.claiming.contains_key(&key) {
                return;
            }
            let p = match session {
                Some(s) => {
                    m.owned.entry(key.clone()).or_insert(None);
                    m.keys.insert(s.session_id.clone(), key.clone());
                    m.nonces.insert(key.clone(), s.server_nonce);
                    let rec = Box::new(self.record_for(token, s));
                    m.records.insert(key.clone(), rec.clone());
                    Pending::Write(rec)
                }
                None => {
                    m.keys.retain(|_, k| *k != key);
                    m.nonces.remove(&key);
                    m.records.remove(&key);
                    Pending::Delete
                }
            };
            m.pending.insert(key, p);
            m.oldest.get_or_insert_with(Instant::now);
        }
        self.wake.notify_one();
    }

    /// Writes what is pending, until the store fails (the rest stays
    /// queued). Returns whether everything was written.
    async fn write_pending(&self) -> bool {
        let (batch, oldest) = {
            let mut m = lock(&self.mirror);
            let batch = std::mem::take(&mut m.pending);
            m.in_flight = batch.keys().cloned().collect();
            (batch, m.oldest.take())
        };
        let all = self.write_batch(batch, oldest).await;
        lock(&self.mirror).in_flight.clear();
        self.written.notify_waiters();
        all
    }

    /// Waits (at most `limit`) until the session record under `key` as it
    /// is now has been written; false when it was not (the store is away).
    /// An ActivateSession answers after this, so that the nonce in the
    /// store is the one the client signs next.
    pub async fn flush(&self, key: &str, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.written.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let m = lock(&self.mirror);
                if !m.pending.contains_key(key) && !m.in_flight.contains(key) {
                    return true;
                }
            }
            self.wake.notify_one();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Writes now, in this task, everything the mirror holds back: the
    /// session transitions queued, the subscriptions `subscriptions` (dirty
    /// or not) and their sessions' records, and the values. False when the
    /// store failed (what is left stays queued). A node that drains calls
    /// it before it closes channels: what a survivor restores is then what
    /// the clients were last sent.
    pub async fn write_all_now(&self, subscriptions: impl IntoIterator<Item = u32>) -> bool {
        if !self.draining.swap(true, Ordering::AcqRel) {
            // No message leaves after the images the records are made of.
            if let Some(hold) = self.on_drain.get() {
                hold();
            }
        }
        lock(&self.mirror).dirty_subscriptions.extend(subscriptions);
        let _turn = self.write_turn.lock().await;
        self.write_pending().await && self.write_subscriptions().await && self.write_values().await
    }

    /// The other members that serve on now.
    pub fn serving_peer_count(&self) -> usize {
        self.serving_peers().count()
    }

    async fn write_batch(&self, batch: HashMap<String, Pending>, oldest: Option<Instant>) -> bool {
        let mut failed: Option<StoreError> = None;
        let mut left = Vec::new();
        for (key, p) in batch {
            if failed.is_some() {
                left.push((key, p));
                continue;
            }
            let known = lock(&self.mirror).owned.get(&key).copied().flatten();
            let r = match &p {
                Pending::Write(rec) => {
                    let mut rec = (**rec).clone();
                    rec.version = known.map_or(1, |v| v.wrapping_add(1));
                    takeover::write_owned(&*self.store, &key, &rec, known)
                        .await
                        .map(Some)
                }
                Pending::Delete => match known {
                    Some(rev) => match takeover::delete_owned(&*self.store, &key, rev).await {
                        Ok(()) => self
                            .store
                            .delete(Bucket::Subscriptions, &key, None)
                            .await
                            .map(|()| None)
                            .map_err(ClaimError::from),
                        Err(e) => Err(e),
                    },
                    None => Ok(None),
                },
            };
            match (r, &p) {
                (Ok(Some(rev)), _) => {
                    self.metrics.records_written.fetch_add(1, Ordering::Relaxed);
                    lock(&self.mirror).owned.insert(key, Some(rev));
                }
                (Ok(None), _) => {
                    lock(&self.mirror).owned.remove(&key);
                }
                (Err(ClaimError::Lost), Pending::Write(rec)) => {
                    match takeover::read(&*self.store, &key).await {
                        // A janitor adopted it while this node still serves
                        // it (it thought this node dead): take it back.
                        Ok(Some((now, rev))) if now.server_nonce == rec.server_nonce => {
                            let mut m = lock(&self.mirror);
                            m.owned.insert(key.clone(), Some(rev));
                            m.pending.entry(key).or_insert(p);
                            m.oldest.get_or_insert_with(Instant::now);
                            drop(m);
                            self.metrics
                                .sessions_reclaimed
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Err(ClaimError::Store(e)) => {
                            self.store_failed(&e);
                            failed = Some(e);
                            left.push((key, p));
                        }
                        // A client claimed it on another node: let it go,
                        // do not fight.
                        _ => {
                            self.forget(&key);
                            self.metrics.sessions_lost.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(node = %self.me, session = %rec.session_id, "session taken over by another node; released");
                            (self.evict)(&rec.token);
                        }
                    }
                }
                (Err(ClaimError::Lost), Pending::Delete) => {
                    lock(&self.mirror).owned.remove(&key);
                }
                (Err(ClaimError::Store(e)), _) => {
                    self.store_failed(&e);
                    failed = Some(e);
                    left.push((key, p));
                }
                (Err(e), _) => {
                    tracing::warn!(node = %self.me, error = %e, "cluster write failed");
                    self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Some(t) = oldest {
            let lag = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.metrics.mirror_lag_us.store(lag, Ordering::Relaxed);
        }
        if left.is_empty() {
            return true;
        }
        let mut m = lock(&self.mirror);
        for (key, p) in left {
            // A newer transition queued meanwhile wins.
            m.pending.entry(key).or_insert(p);
        }
        m.oldest.get_or_insert(oldest.unwrap_or_else(Instant::now));
        false
    }

    /// Writes this node's heartbeat (beat `beat`).
    async fn beat(&self, beat: u64) -> Result<(), StoreError> {
        let rec = NodeRecord {
            node_id: self.me.clone(),
            beat,
            degraded: self.degraded(),
        };
        self.store
            .put(Bucket::Nodes, &self.me, rec.encode())
            .await?;
        let (service_level, state) = self.own();
        let status = StatusRecord {
            node_id: self.me.clone(),
            beat,
            service_level,
            state,
            reads: super::record::READS,
        };
        self.store
            .put(Bucket::Status, &self.me, status.encode())
            .await
            .map(|_| ())
    }

    /// Notes a heartbeat record seen in the store.
    fn heartbeat_seen(&self, key: &str, value: Option<&[u8]>, now: Instant) {
        let mut leases = lock(&self.leases);
        match value.map(NodeRecord::decode) {
            Some(Ok(r)) => {
                leases.observe(&r.node_id, r.beat, now);
                lock(&self.beats).insert(r.node_id, (r.degraded, r.beat));
            }
            Some(Err(e)) => {
                tracing::warn!(key, error = %e, "undecodable heartbeat record ignored");
            }
            None => {
                leases.forget(key, now);
                lock(&self.beats).remove(key);
            }
        }
    }

    /// Notes a status record seen in the store.
    fn status_seen(&self, key: &str, value: Option<&[u8]>) {
        match value.map(StatusRecord::decode) {
            Some(Ok(r)) => {
                lock(&self.statuses).insert(r.node_id.clone(), r);
            }
            Some(Err(e)) => {
                tracing::warn!(key, error = %e, "undecodable status record ignored");
            }
            None => {
                lock(&self.statuses).remove(key);
            }
        }
    }

    /// Notes a session record seen in the store: a session of this node
    /// now owned by another is let go.
    fn session_seen(&self, key: &str, value: Option<&[u8]>, revision: u64) {
        let Some(value) = value else {
            return;
        };
        let rec = match SessionRecord::decode(value) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(key, error = %e, "undecodable session record ignored");
                return;
            }
        };
        if rec.owner == self.me {
            return;
        }
        lock(&self.orphans).remove(key);
        let mine = {
            let mut m = lock(&self.mirror);
            let mine = m
                .owned
                .get(key)
                .is_some_and(|known| known.is_none_or(|k| k < revision));
            if !mine || m.claiming.contains_key(key) {
                false
            } else if m.nonces.get(key) == Some(&rec.server_nonce) {
                // Adopted by a janitor, not claimed by the client: this
                // node still serves it and writes it back.
                m.owned.insert(key.to_owned(), Some(revision));
                if let Some(last) = m.records.get(key).cloned() {
                    m.pending
                        .entry(key.to_owned())
                        .or_insert(Pending::Write(last));
                    m.oldest.get_or_insert_with(Instant::now);
                }
                drop(m);
                self.metrics
                    .sessions_reclaimed
                    .fetch_add(1, Ordering::Relaxed);
                self.wake.notify_one();
                false
            } else {
                m.owned.remove(key);
                m.pending.remove(key);
                m.nonces.remove(key);
                m.records.remove(key);
                true
            }
        };
        if mine {
            self.metrics.sessions_lost.fetch_add(1, Ordering::Relaxed);
            tracing::info!(node = %self.me, session = %rec.session_id, owner = %rec.owner, "session moved to another node; released");
            (self.evict)(&rec.token);
        }
    }

    /// The session record under `key`, if the store has one.
    pub async fn read_session(&self, key: &str) -> Result<Option<SessionRecord>, ClaimError> {
        let r = takeover::read(&*self.store, key).await;
        if let Err(ClaimError::Store(e)) = &r {
            self.store_failed(e);
        }
        Ok(r?.map(|(rec, _)| rec))
    }

    /// Forgets a session this node no longer serves.
    fn forget(&self, key: &str) {
        let mut m = lock(&self.mirror);
        m.owned.remove(key);
        m.nonces.remove(key);
        m.records.remove(key);
    }

    /// Marks `key` as being claimed: its transitions are not queued until
    /// [`ClusterNode::end_claim`].
    pub fn begin_claim(&self, key: &str) {
        lock(&self.mirror).claiming.insert(key.to_owned(), ());
    }

    /// Ends a claim: `revision` is the claimed record's (this node owns
    /// it now), `None` when the claim failed.
    pub fn end_claim(&self, key: &str, claimed: Option<&Claimed>, session_id: &NodeId) {
        let mut m = lock(&self.mirror);
        m.claiming.remove(key);
        if let Some(c) = claimed {
            m.owned.insert(key.to_owned(), Some(c.revision));
            m.keys.insert(session_id.clone(), key.to_owned());
            m.nonces.insert(key.to_owned(), c.record.server_nonce);
            m.records.insert(key.to_owned(), Box::new(c.record.clone()));
        }
    }

    /// Claims the session under `key` for this node, for a client whose
    /// ActivateSession was signed over `expected_nonce` and that now has
    /// the state of `session` (with its next nonce).
    pub async fn claim(
        &self,
        key: &str,
        expected_nonce: &[u8; 32],
        token: &NodeId,
        session: &Session,
    ) -> Result<Claimed, ClaimError> {
        let now = self.record_for(token, session);
        let r = takeover::claim(
            &*self.store,
            &self.me,
            key,
            expected_nonce,
            session.server_nonce,
            |rec| {
                let version = rec.version;
                *rec = now.clone();
                rec.version = version;
            },
        )
        .await;
        match &r {
            Ok(c) => {
                self.metrics.takeovers.fetch_add(1, Ordering::Relaxed);
                lock(&self.orphans).remove(key);
                tracing::info!(node = %self.me, session = %c.record.session_id, from = %c.previous_owner, "session taken over");
            }
            Err(e) => {
                self.metrics
                    .takeovers_failed
                    .fetch_add(1, Ordering::Relaxed);
                if let ClaimError::Store(se) = e {
                    self.store_failed(se);
                }
            }
        }
        r
    }

    /// One sweep: adopts the sessions of nodes whose lease ran out, and
    /// deletes adopted sessions whose timeout passed with no client back.
    async fn sweep(&self, now: Instant) -> Result<(), StoreError> {
        let leases = lock(&self.leases).clone();
        let (adopted, bad) = takeover::adopt_orphans(&*self.store, &self.me, &leases, now).await?;
        for (key, e) in bad {
            tracing::warn!(key, error = %e, "undecodable session record left in the store");
        }
        {
            let mut orphans = lock(&self.orphans);
            for a in adopted {
                self.metrics
                    .sessions_adopted
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(node = %self.me, session = %a.record.session_id, "session of a dead node adopted");
                orphans.insert(a.key, (now + a.record.timeout, a.revision));
            }
        }
        let due: Vec<(String, u64)> = lock(&self.orphans)
            .iter()
            .filter(|(_, (deadline, _))| *deadline <= now)
            .map(|(k, (_, rev))| (k.clone(), *rev))
            .collect();
        for (key, rev) in due {
            match takeover::delete_owned(&*self.store, &key, rev).await {
                Ok(()) | Err(ClaimError::Lost) => {
                    lock(&self.orphans).remove(&key);
                }
                Err(ClaimError::Store(e)) => return Err(e),
                Err(_) => {
                    lock(&self.orphans).remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Runs the node until dropped: the writer, the heartbeat and sweep
    /// timer, and the watches. Store errors make the node degraded, never
    /// stop it.
    pub async fn run(self: Arc<Self>) {
        let writer = {
            let node = Arc::clone(&self);
            async move {
                loop {
                    let turn = node.write_turn.lock().await;
                    let all = node.write_pending().await
                        && node.write_subscriptions().await
                        && node.write_values().await;
                    drop(turn);
                    if all {
                        node.wake.notified().await;
                    } else {
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        };
        let beater = {
            let node = Arc::clone(&self);
            async move {
                let mut beat = 0u64;
                let mut tick = tokio::time::interval(node.settings.heartbeat);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut last_sweep = Instant::now();
                loop {
                    tick.tick().await;
                    beat = beat.wrapping_add(1);
                    match node.beat(beat).await {
                        Ok(()) => {
                            if node.pending_writes() == 0 {
                                node.set_degraded(false, None);
                            } else {
                                node.wake.notify_one();
                            }
                        }
                        Err(e) => node.store_failed(&e),
                    }
                    // After the heartbeat, so that it is never late for
                    // this (a store round trip only near a block's end).
                    if let Err(e) = node.reserve_ids().await {
                        node.store_failed(&e);
                    }
                    if last_sweep.elapsed() >= node.settings.lease / 2 {
                        last_sweep = Instant::now();
                        if let Err(e) = node.sweep(last_sweep).await {
                            node.store_failed(&e);
                        }
                        if let Err(e) = node.sync_trust().await {
                            node.store_failed(&e);
                        }
                    }
                }
            }
        };
        let watcher = {
            let node = Arc::clone(&self);
            async move {
                loop {
                    node.watch_until_closed().await;
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        tokio::join!(writer, beater, watcher);
    }

    /// Watches both buckets until a watch ends or fails.
    async fn watch_until_closed(&self) {
        let (nodes, sessions, values, trust) = match (
            self.store.watch(Bucket::Nodes).await,
            self.store.watch(Bucket::Sessions).await,
            self.store.watch(Bucket::Values).await,
            self.store.watch(Bucket::Trust).await,
        ) {
            (Ok(n), Ok(s), Ok(v), Ok(t)) => (n, s, v, t),
            (Err(e), _, _, _) | (_, Err(e), _, _) | (_, _, Err(e), _) | (_, _, _, Err(e)) => {
                self.store_failed(&e);
                return;
            }
        };
        let mut status = match self.store.watch(Bucket::Status).await {
            Ok(w) => w,
            Err(e) => {
                self.store_failed(&e);
                return;
            }
        };
        let (mut nodes, mut sessions, mut values, mut trust) = (nodes, sessions, values, trust);
        loop {
            tokio::select! {
                c = nodes.recv() => match c {
                    Some(c) => self.heartbeat_seen(&c.key, c.value.as_deref(), Instant::now()),
                    None => return,
                },
                c = sessions.recv() => match c {
                    Some(c) => self.session_seen(&c.key, c.value.as_deref(), c.revision),
                    None => return,
                },
                c = values.recv() => match c {
                    Some(c) => self.value_seen(&c.key, c.value.as_deref()),
                    None => return,
                },
                c = trust.recv() => match c {
                    Some(c) => self.trust_seen(&c.key, c.value.as_deref()),
                    None => return,
                },
                c = status.recv() => match c {
                    Some(c) => self.status_seen(&c.key, c.value.as_deref()),
                    None => return,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node b's encoded status record at beat 4: healthy and running,
    /// reading record formats up to `reads`.
    fn running_status_of_b(reads: u8) -> Vec<u8> {
        StatusRecord {
            node_id: "b".into(),
            beat: 4,
            service_level: 255,
            state: uascale_types::ServerState::Running,
            reads,
        }
        .encode()
    }
    use crate::cluster::memory::MemoryStore;
    use crate::cluster::record::tests::sample;
    use crate::cluster::testing::now;

    fn node(store: &Arc<MemoryStore>, me: &str) -> (Arc<ClusterNode>, Arc<Mutex<Vec<NodeId>>>) {
        let evicted = Arc::new(Mutex::new(Vec::new()));
        let e = Arc::clone(&evicted);
        let n = ClusterNode::new(
            Arc::clone(store) as Arc<dyn Store>,
            me.to_owned(),
            ClusterSection::default(),
            Box::new(move |t| lock(&e).push(t.clone())),
        );
        (n, evicted)
    }

    fn session() -> (NodeId, Session) {
        let r = sample("x", 4);
        (r.token.clone(), session_of(&r, Instant::now(), 10))
    }

    /// A node's id counter, shared with the test.
    fn counter(n: &ClusterNode, index: u8) -> Arc<std::sync::atomic::AtomicU32> {
        let c = Arc::new(std::sync::atomic::AtomicU32::new(1));
        let (get, set) = (Arc::clone(&c), Arc::clone(&c));
        n.set_id_counter(IdCounter {
            index,
            now: Box::new(move || get.load(Ordering::Relaxed)),
            seed: Box::new(move |v| set.store(v, Ordering::Relaxed)),
        });
        c
    }

    /// Each process of a node index counts its subscription ids from past
    /// every earlier one's reservation: a node started again does not
    /// reuse its predecessor's ids; a process that uses half its block
    /// reserves the next; another index is apart; past the 24-bit end
    /// the counter starts again from 1.
    #[test]
    fn a_restarted_node_counts_subscription_ids_past_its_predecessors() {
        let store = Arc::new(MemoryStore::new());
        let (first, _) = node(&store, "a");
        let ids = counter(&first, 3);
        now(first.reserve_ids()).expect("reserved");
        assert_eq!(
            ids.load(Ordering::Relaxed),
            1,
            "a fresh cluster starts at 1"
        );
        // Used a little: no new reservation.
        ids.store(1000, Ordering::Relaxed);
        now(first.reserve_ids()).expect("nothing to do");
        assert_eq!(first.ids_reserved_to.load(Ordering::Relaxed), 1 + ID_BLOCK);
        // Within half a block of the end: the next block.
        ids.store(1 + ID_BLOCK / 2 + 5, Ordering::Relaxed);
        now(first.reserve_ids()).expect("reserved");
        let end = first.ids_reserved_to.load(Ordering::Relaxed);
        assert!(end > 1 + ID_BLOCK, "the next block: {end}");
        assert_eq!(
            ids.load(Ordering::Relaxed),
            1 + ID_BLOCK / 2 + 5,
            "not reseeded"
        );
        // The same index again (a restart): it starts past everything the
        // first process reserved, so past every id it made.
        let (second, _) = node(&store, "a");
        let again = counter(&second, 3);
        now(second.reserve_ids()).expect("reserved");
        assert_eq!(again.load(Ordering::Relaxed), end);
        // Another index has its own range.
        let (other, _) = node(&store, "b");
        let apart = counter(&other, 4);
        now(other.reserve_ids()).expect("reserved");
        assert_eq!(apart.load(Ordering::Relaxed), 1);
        // Near the 24-bit end: the next process starts again from 1.
        now(store.put(
            Bucket::Ids,
            "n3",
            (ID_COUNTER_MAX - 10).to_be_bytes().to_vec(),
        ))
        .expect("put");
        let (third, _) = node(&store, "a");
        let wrapped = counter(&third, 3);
        wrapped.store(7, Ordering::Relaxed);
        now(third.reserve_ids()).expect("reserved");
        assert_eq!(wrapped.load(Ordering::Relaxed), 1);
    }

    /// A node "a" on a memory store with one session written: the store,
    /// the node, the session and its key.
    fn node_with_a_session() -> (
        Arc<MemoryStore>,
        Arc<ClusterNode>,
        crate::session::Session,
        String,
    ) {
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let (token, s) = session();
        let key = session_key(&token).unwrap();
        let ev = SessionEvent::Created {
            session_id: s.session_id.clone(),
            channel_id: 1,
        };
        a.heard(&ev, &token, Some(&s));
        assert!(now(a.write_pending()));
        (store, a, s, key)
    }

    /// The items' unsent values reach the store only in a drain's final
    /// records (once publishing stopped: [`ClusterNode::write_all_now`])
    /// and only while every other live node reads their format 4; from
    /// then on the node's later writes keep them.
    #[test]
    fn unsent_values_are_written_only_by_a_drain_every_node_reads() {
        let (store, a, s, key) = node_with_a_session();
        let full = crate::cluster::record::tests::with_unsent().subscriptions;
        let id = full[0].id;
        let session_id = s.session_id.clone();
        let holds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = Arc::clone(&holds);
        a.set_on_drain(Box::new(move || {
            h.fetch_add(1, Ordering::Relaxed);
        }));
        a.set_images(Box::new(move |_, unsent| {
            let mut subs = full.clone();
            if !unsent {
                for i in subs.iter_mut().flat_map(|s| s.items.iter_mut()) {
                    i.last = None;
                    i.queued.clear();
                }
            }
            Some((session_id.clone(), subs))
        }));
        let stored = || {
            let e = now(store.get(Bucket::Subscriptions, &key))
                .unwrap()
                .unwrap();
            let rec = SubscriptionsRecord::decode(&e.value).unwrap();
            (e.value[4], rec.subscriptions[0].items[0].queued.len())
        };
        // Serving: after a Publish answer, no unsent values.
        a.subscription_answered(id);
        assert!(now(a.write_subscriptions()));
        assert_eq!(stored(), (1, 0));
        assert_eq!(
            holds.load(Ordering::Relaxed),
            0,
            "serving: publishing goes on"
        );
        // A peer of an older build, then one reading format 3: a drain
        // leaves them out (the peer could not read the record).
        let t0 = Instant::now();
        a.heartbeat_seen("b", Some(&beat_of("b", 4)), t0);
        let status = running_status_of_b;
        assert!(now(a.write_all_now([id])));
        assert_eq!(stored(), (1, 0));
        assert_eq!(
            holds.load(Ordering::Relaxed),
            1,
            "the drain stops the Publish answers before its first write"
        );
        a.status_seen("b", Some(&status(3)));
        assert!(!a.all_read(FORMAT_QUEUES));
        assert!(now(a.write_all_now([id])));
        assert_eq!(stored(), (1, 0));
        // Every node reads format 4: the drain writes them, and so does
        // every later write of this node (it publishes nothing more).
        a.status_seen("b", Some(&status(4)));
        assert!(now(a.write_all_now([id])));
        assert_eq!(stored(), (FORMAT_QUEUES, 3));
        a.subscription_answered(id);
        assert!(now(a.write_subscriptions()));
        assert_eq!(stored(), (FORMAT_QUEUES, 3));
        assert_eq!(holds.load(Ordering::Relaxed), 1, "once");
    }

    /// A drain hands over an event item's queued events only when every
    /// live node reads format 5; where a node reads format 4 it writes the
    /// rest of the final record without them.
    #[test]
    fn unsent_events_are_written_only_where_every_node_reads_them() {
        let (store, a, s, key) = node_with_a_session();
        let full = crate::cluster::record::tests::with_unsent_events().subscriptions;
        let id = full[0].id;
        let session_id = s.session_id.clone();
        a.set_images(Box::new(move |_, _| {
            Some((session_id.clone(), full.clone()))
        }));
        let stored = || {
            let e = now(store.get(Bucket::Subscriptions, &key))
                .unwrap()
                .unwrap();
            let rec = SubscriptionsRecord::decode(&e.value).unwrap();
            (e.value[4], rec.subscriptions[0].items[1].events.len())
        };
        a.heartbeat_seen("b", Some(&beat_of("b", 4)), Instant::now());
        a.status_seen("b", Some(&running_status_of_b(FORMAT_QUEUES)));
        assert!(now(a.write_all_now([id])));
        // Nothing else unsent: the event item's format 2.
        assert_eq!(stored(), (2, 0));
        a.status_seen("b", Some(&running_status_of_b(FORMAT_EVENT_QUEUES)));
        assert!(now(a.write_all_now([id])));
        assert_eq!(stored(), (FORMAT_EVENT_QUEUES, 3));
    }

    #[test]
    fn transitions_are_coalesced_and_written() {
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let (token, mut s) = session();
        let key = session_key(&token).unwrap();
        let ev = SessionEvent::Created {
            session_id: s.session_id.clone(),
            channel_id: 1,
        };
        a.heard(&ev, &token, Some(&s));
        s.locale_ids = Box::new(["de".into()]);
        a.heard(&ev, &token, Some(&s));
        assert_eq!(a.pending_writes(), 1, "one write per session");
        assert!(now(a.write_pending()));
        let (rec, _) = now(takeover::read(&*store, &key)).unwrap().unwrap();
        assert_eq!((rec.owner.as_str(), rec.version), ("a", 1));
        assert_eq!(rec.locale_ids, vec![uascale_types::UaString::from("de")]);
        a.heard(&ev, &token, None);
        assert!(now(a.write_pending()));
        assert_eq!(now(takeover::read(&*store, &key)).unwrap(), None);
    }

    #[test]
    fn flush_waits_for_the_record_to_be_written() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let (token, s) = session();
        let key = session_key(&token).unwrap();
        rt.block_on(async {
            a.heard(
                &SessionEvent::Created {
                    session_id: s.session_id.clone(),
                    channel_id: 1,
                },
                &token,
                Some(&s),
            );
            // No writer runs: the record is not written in time.
            assert!(!a.flush(&key, Duration::from_millis(50)).await);
            let writer = {
                let a = Arc::clone(&a);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    a.write_pending().await
                })
            };
            assert!(a.flush(&key, Duration::from_secs(5)).await);
            assert!(now(takeover::read(&*store, &key)).unwrap().is_some());
            assert!(writer.await.unwrap());
            // Nothing pending: at once.
            assert!(a.flush(&key, Duration::ZERO).await);
        });
    }

    #[test]
    fn an_unreachable_store_degrades_and_the_writes_wait() {
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let (token, s) = session();
        let ev = SessionEvent::Created {
            session_id: s.session_id.clone(),
            channel_id: 1,
        };
        store.set_unreachable(true);
        a.heard(&ev, &token, Some(&s));
        assert!(!now(a.write_pending()));
        assert!(a.degraded());
        assert_eq!(a.pending_writes(), 1, "kept for later");
        store.set_unreachable(false);
        assert!(now(a.write_pending()));
        assert_eq!(a.pending_writes(), 0);
        assert!(now(takeover::read(&*store, &session_key(&token).unwrap()))
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_live_owner_takes_back_what_a_janitor_adopted() {
        let store = Arc::new(MemoryStore::new());
        let (a, evicted_a) = node(&store, "a");
        let (token, mut s) = session();
        let key = session_key(&token).unwrap();
        let ev = SessionEvent::Created {
            session_id: s.session_id.clone(),
            channel_id: 1,
        };
        a.heard(&ev, &token, Some(&s));
        assert!(now(a.write_pending()));
        // c thought a dead (a slow heartbeat) and adopted its session.
        let t0 = Instant::now();
        let leases = Leases::new(Duration::from_millis(10), t0);
        let (adopted, _) = now(takeover::adopt_orphans(
            &*store,
            "c",
            &leases,
            t0 + Duration::from_secs(1),
        ))
        .unwrap();
        assert_eq!(adopted.len(), 1);
        // a still serves it: its next write conflicts, sees the same nonce
        // (no client came) and writes it back instead of letting it go.
        s.locale_ids = Box::new(["it".into()]);
        a.heard(&ev, &token, Some(&s));
        assert!(now(a.write_pending()));
        assert!(now(a.write_pending()));
        assert!(lock(&evicted_a).is_empty(), "nothing evicted");
        let (rec, _) = now(takeover::read(&*store, &key)).unwrap().unwrap();
        assert_eq!(rec.owner, "a");
        assert_eq!(a.metrics.sessions_reclaimed.load(Ordering::Relaxed), 1);
        // The same through the watch: an adoption seen is written back.
        let (_, rev) = now(takeover::adopt_orphans(
            &*store,
            "c",
            &leases,
            t0 + Duration::from_secs(2),
        ))
        .map(|(mut v, _)| {
            let a = v.remove(0);
            (a.record, a.revision)
        })
        .unwrap();
        let adopted = now(takeover::read(&*store, &key)).unwrap().unwrap().0;
        a.session_seen(&key, Some(&adopted.encode()), rev);
        assert!(lock(&evicted_a).is_empty());
        assert!(now(a.write_pending()));
        assert_eq!(
            now(takeover::read(&*store, &key)).unwrap().unwrap().0.owner,
            "a"
        );
    }

    #[test]
    fn trusted_certificates_follow_the_cluster() {
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let (b, _) = node(&store, "b");
        let root = std::env::temp_dir().join(format!("uascale-trust-{}", std::process::id()));
        let (pa, pb) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(pa.join("trusted/certs")).unwrap();
        a.set_trust_dir(&pa);
        b.set_trust_dir(&pb);
        let mut feed = now(store.watch(Bucket::Trust)).unwrap();
        std::fs::write(pa.join("trusted/certs/client.der"), b"\x30\x82cert").unwrap();
        now(a.sync_trust()).unwrap();
        now(a.sync_trust()).unwrap(); // nothing new: nothing written again
        let c = feed.try_recv().expect("published");
        assert!(feed.try_recv().is_err(), "published once");
        b.trust_seen(&c.key, c.value.as_deref());
        assert_eq!(
            std::fs::read(pb.join("trusted/certs/client.der")).unwrap(),
            b"\x30\x82cert"
        );
        // Removed on a: removed on b.
        std::fs::remove_file(pa.join("trusted/certs/client.der")).unwrap();
        now(a.sync_trust()).unwrap();
        let c = feed.try_recv().expect("deleted");
        assert_eq!(c.value, None);
        b.trust_seen(&c.key, None);
        assert!(!pb.join("trusted/certs/client.der").exists());
        // A record naming a path outside the directory is refused.
        let evil = TrustRecord {
            owner: "x".into(),
            file_name: "ok.der".into(),
            bytes: vec![1],
        }
        .encode()
        .iter()
        .map(|b| if *b == b'o' { b'/' } else { *b })
        .collect::<Vec<u8>>();
        b.trust_seen("t.x", Some(&evil));
        assert!(!pb.join("trusted/certs/ok.der").exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_node_whose_session_was_claimed_lets_it_go() {
        let store = Arc::new(MemoryStore::new());
        let (a, evicted_a) = node(&store, "a");
        let (b, _) = node(&store, "b");
        let (token, mut s) = session();
        let key = session_key(&token).unwrap();
        let ev = SessionEvent::Created {
            session_id: s.session_id.clone(),
            channel_id: 1,
        };
        a.heard(&ev, &token, Some(&s));
        assert!(now(a.write_pending()));
        // b claims it for the client, with the nonce a issued.
        let nonce = s.server_nonce;
        let mut next = s.clone();
        next.server_nonce = [0xee; 32];
        b.begin_claim(&key);
        let c = now(b.claim(&key, &nonce, &token, &next)).unwrap();
        b.end_claim(&key, Some(&c), &s.session_id);
        assert_eq!(c.previous_owner, "a");
        // a, not having heard yet, writes what it has: it loses and evicts.
        s.locale_ids = Box::new(["fr".into()]);
        a.heard(&ev, &token, Some(&s));
        assert!(now(a.write_pending()));
        assert_eq!(*lock(&evicted_a), vec![token.clone()]);
        assert_eq!(a.metrics.sessions_lost.load(Ordering::Relaxed), 1);
        let (rec, _) = now(takeover::read(&*store, &key)).unwrap().unwrap();
        assert_eq!(rec.owner, "b");
        assert_eq!(rec.server_nonce, [0xee; 32]);
        // The watch path: b's later write seen by a changes nothing more.
        a.session_seen(&key, Some(&rec.encode()), c.revision + 1);
        assert_eq!(lock(&evicted_a).len(), 1);
    }

    /// An ECC session taken over keeps its ClientNonce and its ephemeral
    /// key: the record carries them, and the session restored from it
    /// agrees on the same secret with the client's key.
    #[test]
    fn an_ecc_session_keeps_its_client_nonce_and_ephemeral_key() {
        use uascale_crypto::ecc::{EccCurve, EphemeralKey};
        let t0 = Instant::now();
        let key = EphemeralKey::generate(EccCurve::NistP256).unwrap();
        let public = key.public_nonce().to_vec();
        let mut session = session_of(&crate::cluster::record::tests::sample("a", 1), t0, 10);
        session.ecc = Some(Arc::new(crate::session::EccSession {
            client_nonce: vec![3; 64],
            ephemeral: Some(key),
        }));
        let token = NodeId::opaque(0, vec![1; 32]);
        let bytes = record_of("a", &token, &session).encode();
        let back = session_of(&SessionRecord::decode(&bytes).unwrap(), t0, 10);
        let ecc = back.ecc.expect("the ECC state");
        assert_eq!(ecc.client_nonce, vec![3; 64]);
        let restored = ecc.ephemeral.as_ref().expect("the ephemeral key");
        assert_eq!(restored.public_nonce(), public.as_slice());
        let client = EphemeralKey::generate(EccCurve::NistP256).unwrap();
        let original = session.ecc.as_ref().unwrap().ephemeral.as_ref().unwrap();
        assert_eq!(
            restored.agree(client.public_nonce()).unwrap().as_bytes(),
            original.agree(client.public_nonce()).unwrap().as_bytes()
        );
        // Without ECC state nothing is made up.
        session.ecc = None;
        let plain = record_of("a", &token, &session);
        assert_eq!(plain.ecc, None);
        assert!(session_of(&plain, t0, 10).ecc.is_none());
    }

    /// A session's continuation points go into its record and come back
    /// on the node that restores it - without their references (that
    /// node browses again), at most as many as that node allows.
    #[test]
    fn continuation_points_are_restored_with_their_session() {
        use crate::cluster::record::tests::point;
        let t0 = Instant::now();
        let mut r = sample("a", 1);
        r.continuation_points = vec![point(1, 85, 3), point(2, 2253, 6)];
        let s = session_of(&SessionRecord::decode(&r.encode()).unwrap(), t0, 10);
        let cps = s.continuation_points.as_deref().expect("restored");
        assert_eq!(cps.len(), 2);
        assert_eq!(cps[0].id.as_bytes(), Some(&[1u8; 16][..]));
        assert_eq!(cps[0].browse, point(1, 85, 3).browse);
        assert_eq!((cps[0].max, cps[0].returned), (3, 3));
        assert_eq!(cps[1].returned, 6);
        assert!(cps.iter().all(|c| c.rest.is_none()));
        // Written again as they came.
        assert_eq!(
            record_of("b", &r.token, &s).continuation_points,
            r.continuation_points
        );
        // A node allowing fewer keeps the first ones; none is no box.
        let one = session_of(&r, t0, 1);
        assert_eq!(one.continuation_points.as_ref().map(|c| c.len()), Some(1));
        assert!(session_of(&r, t0, 0).continuation_points.is_none());
        assert!(session_of(&sample("a", 1), t0, 10)
            .continuation_points
            .is_none());
    }

    /// The rule for a new record format: the continuation points (format
    /// 3) are written only while every other live node's status says it
    /// reads format 3; a node of an older build (no status record, or a
    /// status saying 2) gets the session's format 1 record without them.
    #[test]
    fn continuation_points_wait_until_every_node_reads_their_format() {
        use crate::cluster::record::tests::point;
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let mut r = sample("a", 1);
        r.continuation_points = vec![point(1, 85, 3)];
        let (token, s) = (r.token.clone(), session_of(&r, Instant::now(), 10));
        let key = session_key(&token).unwrap();
        let written = || {
            let ev = SessionEvent::ContinuationPointsChanged {
                session_id: s.session_id.clone(),
            };
            a.heard(&ev, &token, Some(&s));
            assert!(now(a.write_pending()));
            let e = now(store.get(Bucket::Sessions, &key)).unwrap().unwrap();
            (e.value[4], SessionRecord::decode(&e.value).unwrap())
        };
        // Alone: nobody to wait for.
        assert!(a.all_read(3));
        let (format, rec) = written();
        assert_eq!((format, rec.continuation_points.len()), (3, 1));
        // A peer of an older build (a heartbeat, no status record).
        let t0 = Instant::now();
        a.heartbeat_seen("b", Some(&beat_of("b", 4)), t0);
        assert!(!a.all_read(3) && a.all_read(2));
        let (format, rec) = written();
        assert_eq!(format, 1, "a record the older build reads");
        assert!(rec.continuation_points.is_empty());
        // Its status says it reads format 2 only: still not.
        let status = running_status_of_b;
        a.status_seen("b", Some(&status(2)));
        assert!(!a.all_read(3));
        assert_eq!(written().0, 1);
        // Upgraded: the next change writes them.
        a.status_seen("b", Some(&status(3)));
        assert!(a.all_read(3));
        let (format, rec) = written();
        assert_eq!((format, rec.continuation_points.len()), (3, 1));
        // A stale status (the node restarted on an older build) counts as
        // no status.
        a.heartbeat_seen("b", Some(&beat_of("b", 40)), t0);
        assert!(!a.all_read(3));
    }

    fn beat_of(id: &str, beat: u64) -> Vec<u8> {
        NodeRecord {
            node_id: id.into(),
            beat,
            degraded: false,
        }
        .encode()
    }

    fn status_of(
        id: &str,
        beat: u64,
        service_level: u8,
        state: uascale_types::ServerState,
    ) -> Vec<u8> {
        StatusRecord {
            node_id: id.into(),
            beat,
            service_level,
            state,
            reads: crate::cluster::record::READS,
        }
        .encode()
    }

    /// The members come from the heartbeats and status records: each
    /// node's ServiceLevel and ServerState (this node's own as it is now);
    /// a node shutting down does not count as serving; a dead node is gone
    /// after its lease; a stale status does not count.
    #[test]
    fn members_follow_the_heartbeats() {
        use uascale_types::ServerState as S;
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        let own = Arc::new(Mutex::new((230u8, S::Running)));
        let o = Arc::clone(&own);
        a.set_own_status(Box::new(move || *lock(&o)));
        let t0 = Instant::now();
        for (id, level, state) in [
            ("a", 1, S::Running),
            ("b", 210, S::Running),
            ("c", 0, S::Shutdown),
        ] {
            a.heartbeat_seen(id, Some(&beat_of(id, 7)), t0);
            a.status_seen(id, Some(&status_of(id, 7, level, state)));
        }
        let m = |id: &str, service_level: u8, state: S| Member {
            id: id.into(),
            service_level,
            state,
        };
        assert_eq!(
            a.members(),
            [
                m("a", 230, S::Running),
                m("b", 210, S::Running),
                m("c", 0, S::Shutdown)
            ]
        );
        assert!(a.peers_serving());
        assert_eq!(a.serving_peers_level(), Some(210));
        // b goes away (its record deleted): only c, shutting down, is left.
        a.heartbeat_seen("b", None, t0);
        assert!(!a.peers_serving());
        assert_eq!(a.serving_peers_level(), None);
        *lock(&own) = (0, S::Shutdown);
        assert_eq!(
            a.members(),
            [m("a", 0, S::Shutdown), m("c", 0, S::Shutdown)]
        );
        // A node whose heartbeat last changed a lease ago is gone.
        if let Some(long_ago) = t0.checked_sub(Duration::from_secs(60)) {
            a.heartbeat_seen("e", Some(&beat_of("e", 1)), long_ago);
            assert!(a.members().iter().all(|m| m.id != "e"));
        }
        // A node of an older build (no status record) reads Running and
        // healthy; so does one whose status is stale (restarted on an older
        // build: its heartbeat counter started again).
        a.heartbeat_seen("d", Some(&beat_of("d", 1)), t0);
        assert_eq!(a.members()[2], m("d", 200, S::Running));
        a.status_seen("d", Some(&status_of("d", 900, 0, S::Shutdown)));
        assert_eq!(a.members()[2], m("d", 200, S::Running));
        assert!(a.peers_serving());
    }

    /// A beat writes the heartbeat and, beside it, the node's status.
    #[test]
    fn a_beat_writes_the_status_beside_the_heartbeat() {
        use uascale_types::ServerState as S;
        let store = Arc::new(MemoryStore::new());
        let (a, _) = node(&store, "a");
        a.set_own_status(Box::new(|| (0, S::Shutdown)));
        now(a.beat(3)).unwrap();
        let e = now(store.get(Bucket::Nodes, "a")).unwrap().unwrap();
        assert_eq!(NodeRecord::decode(&e.value).unwrap().beat, 3);
        let e = now(store.get(Bucket::Status, "a")).unwrap().unwrap();
        assert_eq!(
            StatusRecord::decode(&e.value).unwrap(),
            StatusRecord {
                node_id: "a".into(),
                beat: 3,
                service_level: 0,
                state: S::Shutdown,
                reads: crate::cluster::record::READS
            }
        );
    }
}
