//! The store a cluster mirrors through: buckets of keyed records, each
//! with a revision that the store assigns, written by compare-and-set, and
//! a watch that tells every change. [`super::memory::MemoryStore`] keeps it
//! in memory (unit tests, one process); [`super::nats::NatsStore`] keeps it
//! in NATS JetStream key-value buckets.
//!
//! The trait is asynchronous because the real store is across a network;
//! the in-memory one answers with futures that are ready at once, so the
//! takeover logic is tested without a runtime.

use std::future::Future;
use std::pin::Pin;

/// What a store operation yields.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// How many changes a watch holds for a consumer that has not read them;
/// a watcher that falls further behind is closed (its consumer re-reads).
pub const WATCH_CAPACITY: usize = 4096;

/// The largest record accepted (a session record is well under 1 KiB;
/// a subscription with its retransmission queue stays under this).
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// A bucket of records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    /// One record per session, keyed by its authentication token.
    Sessions,
    /// One heartbeat record per node, keyed by node id.
    Nodes,
    /// The subscriptions of each session, under the session's key.
    Subscriptions,
    /// The values of in-memory node managers' variables, by node.
    Values,
    /// The trusted certificates (the PKI's `trusted/certs`), by file name.
    Trust,
    /// One status record per node beside its heartbeat, keyed by node id
    /// (its ServiceLevel, ServerState and the record formats it reads).
    Status,
    /// The subscription ids reserved per node index (`n<index>`: the
    /// counter value the next process of that index starts from), so that
    /// a node started again does not hand out ids its predecessor's
    /// subscriptions still carry.
    Ids,
}

impl Bucket {
    /// Every bucket.
    pub const ALL: [Bucket; 7] = [
        Bucket::Sessions,
        Bucket::Nodes,
        Bucket::Subscriptions,
        Bucket::Values,
        Bucket::Trust,
        Bucket::Status,
        Bucket::Ids,
    ];

    /// Its name in the store.
    pub const fn name(self) -> &'static str {
        match self {
            Bucket::Sessions => "uascale_sessions",
            Bucket::Nodes => "uascale_nodes",
            Bucket::Subscriptions => "uascale_subscriptions",
            Bucket::Values => "uascale_values",
            Bucket::Trust => "uascale_trust",
            Bucket::Status => "uascale_status",
            Bucket::Ids => "uascale_ids",
        }
    }
}

/// A record as read: its bytes and the revision the store gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The record.
    pub value: Vec<u8>,
    /// The store's revision of this write (compare-and-set takes it).
    pub revision: u64,
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The bucket it happened in.
    pub bucket: Bucket,
    /// The record's key.
    pub key: String,
    /// The new record, or `None` when it was deleted.
    pub value: Option<Vec<u8>>,
    /// The revision of the change.
    pub revision: u64,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// A compare-and-set lost: the record exists (create), or its
    /// revision is no longer the one given (update, delete).
    Conflict,
    /// The store could not be reached or did not answer in time.
    Unreachable(String),
    /// A key or record the store cannot hold (bad characters, too large).
    Invalid(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Conflict => f.write_str("compare-and-set conflict"),
            StoreError::Unreachable(e) => write!(f, "store unreachable: {e}"),
            StoreError::Invalid(e) => write!(f, "invalid for the store: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A key the store accepts: 1 to 256 characters of `A-Z a-z 0-9 - _ = . /`,
/// not starting or ending with a dot (the NATS key-value key rules, which
/// the in-memory store enforces too so that a test catches a bad key).
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_=./".contains(c);
    if key.is_empty()
        || key.len() > 256
        || key.starts_with('.')
        || key.ends_with('.')
        || !key.chars().all(ok_char)
    {
        return Err(StoreError::Invalid(format!("key {key:?}")));
    }
    Ok(())
}

/// Checks a record's size before it is written.
pub fn check_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_RECORD_BYTES {
        return Err(StoreError::Invalid(format!(
            "record of {} bytes (at most {MAX_RECORD_BYTES})",
            value.len()
        )));
    }
    Ok(())
}

/// Records with revisions, compare-and-set writes and a change feed.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The record under `key`, if any.
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> StoreFuture<'a, Option<Entry>>;

    /// Writes `value` under `key` if there is no record there
    /// ([`StoreError::Conflict`] otherwise); the new revision.
    fn create<'a>(&'a self, bucket: Bucket, key: &'a str, value: Vec<u8>) -> StoreFuture<'a, u64>;

    /// Writes `value` under `key` if the record's revision is still
    /// `revision` ([`StoreError::Conflict`] otherwise); the new revision.
    fn update<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Vec<u8>,
        revision: u64,
    ) -> StoreFuture<'a, u64>;

    /// Writes `value` under `key` whatever is there (heartbeats); the new
    /// revision.
    fn put<'a>(&'a self, bucket: Bucket, key: &'a str, value: Vec<u8>) -> StoreFuture<'a, u64>;

    /// Deletes the record under `key` - only if its revision is still
    /// `revision`, when given ([`StoreError::Conflict`] otherwise).
    fn delete<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: Option<u64>,
    ) -> StoreFuture<'a, ()>;

    /// The keys of the records in `bucket`.
    fn keys(&self, bucket: Bucket) -> StoreFuture<'_, Vec<String>>;

    /// The records of `bucket` now (each as a change), then its changes
    /// (at most [`WATCH_CAPACITY`] unread; the receiver closes when the
    /// watch ends).
    fn watch(&self, bucket: Bucket) -> StoreFuture<'_, tokio::sync::mpsc::Receiver<Change>>;
}
