//! A [`Store`] in memory: the takeover logic's unit tests run against it
//! (its futures are ready at once, so no runtime is needed), and so can
//! several in-process nodes. It can be switched unreachable to test what
//! a node does while its store is away, and told to let another writer in
//! before a compare-and-set, to test what a race does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::store::{
    check_key, check_value, Bucket, Change, Entry, Store, StoreError, StoreFuture, WATCH_CAPACITY,
};

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<(Bucket, String), Entry>,
    revision: u64,
    watchers: Vec<(Bucket, mpsc::Sender<Change>)>,
}

/// A write to make over a record before the next compare-and-set
/// ([`MemoryStore::write_before_next_update`]).
type Interloper = Box<dyn FnOnce(Vec<u8>) -> Vec<u8> + Send>;

/// Records in a map under one lock, one revision counter for all buckets
/// (as a NATS stream numbers its messages).
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    down: AtomicBool,
    interloper: Mutex<Option<Interloper>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("inner", &self.inner)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every operation fail with [`StoreError::Unreachable`] (true)
    /// or work again (false).
    pub fn set_unreachable(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Before the next compare-and-set ([`Store::update`]) of any record,
    /// writes `change` of that record's bytes over it, as another writer
    /// coming between the caller's read and its write would: the
    /// caller's compare-and-set then meets the newer revision.
    pub fn write_before_next_update(
        &self,
        change: impl FnOnce(Vec<u8>) -> Vec<u8> + Send + 'static,
    ) {
        *self.interloper.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(change));
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unreachable(
                "the in-memory store is switched off".into(),
            ));
        }
        // Every update below is one map operation: a panic elsewhere
        // cannot leave it half done.
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes (or deletes, when `value` is `None`) if `check` passes on
    /// the current record; tells the watchers.
    fn write(
        &self,
        bucket: Bucket,
        key: &str,
        value: Option<Vec<u8>>,
        check: impl FnOnce(Option<&Entry>) -> bool,
    ) -> Result<u64, StoreError> {
        check_key(key)?;
        if let Some(v) = &value {
            check_value(v)?;
        }
        let mut inner = self.lock()?;
        let map_key = (bucket, key.to_owned());
        if !check(inner.records.get(&map_key)) {
            return Err(StoreError::Conflict);
        }
        inner.revision += 1;
        let revision = inner.revision;
        match &value {
            Some(v) => {
                inner.records.insert(
                    map_key,
                    Entry {
                        value: v.clone(),
                        revision,
                    },
                );
            }
            None => {
                inner.records.remove(&map_key);
            }
        }
        let change = Change {
            bucket,
            key: key.to_owned(),
            value,
            revision,
        };
        // A watcher that is gone or full is dropped (a full one's
        // consumer sees its receiver close and reads again).
        inner
            .watchers
            .retain(|(b, tx)| *b != bucket || tx.try_send(change.clone()).is_ok());
        Ok(revision)
    }
}

fn ready<'a, T: Send + 'a>(r: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(r))
}

impl Store for MemoryStore {
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> StoreFuture<'a, Option<Entry>> {
        ready(
            check_key(key)
                .and_then(|()| self.lock())
                .map(|inner| inner.records.get(&(bucket, key.to_owned())).cloned()),
        )
    }

    fn create<'a>(&'a self, bucket: Bucket, key: &'a str, value: Vec<u8>) -> StoreFuture<'a, u64> {
        ready(self.write(bucket, key, Some(value), |e| e.is_none()))
    }

    fn update<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Vec<u8>,
        revision: u64,
    ) -> StoreFuture<'a, u64> {
        let interloper = self
            .interloper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(change) = interloper {
            let current = self
                .lock()
                .map(|i| i.records.get(&(bucket, key.to_owned())).cloned());
            if let Ok(Some(e)) = current {
                if let Err(e) = self.write(bucket, key, Some(change(e.value)), |_| true) {
                    return ready(Err(e));
                }
            }
        }
        ready(self.write(bucket, key, Some(value), |e| {
            e.is_some_and(|e| e.revision == revision)
        }))
    }

    fn put<'a>(&'a self, bucket: Bucket, key: &'a str, value: Vec<u8>) -> StoreFuture<'a, u64> {
        ready(self.write(bucket, key, Some(value), |_| true))
    }

    fn delete<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: Option<u64>,
    ) -> StoreFuture<'a, ()> {
        ready(
            self.write(bucket, key, None, |e| match revision {
                None => true,
                Some(r) => e.is_some_and(|e| e.revision == r),
            })
            .map(|_| ()),
        )
    }

    fn keys(&self, bucket: Bucket) -> StoreFuture<'_, Vec<String>> {
        ready(self.lock().map(|inner| {
            let mut keys: Vec<String> = inner
                .records
                .keys()
                .filter(|(b, _)| *b == bucket)
                .map(|(_, k)| k.clone())
                .collect();
            keys.sort();
            keys
        }))
    }

    fn watch(&self, bucket: Bucket) -> StoreFuture<'_, mpsc::Receiver<Change>> {
        ready(self.lock().map(|mut inner| {
            let (tx, rx) = mpsc::channel(WATCH_CAPACITY);
            let mut now: Vec<Change> = inner
                .records
                .iter()
                .filter(|((b, _), _)| *b == bucket)
                .map(|((_, key), e)| Change {
                    bucket,
                    key: key.clone(),
                    value: Some(e.value.clone()),
                    revision: e.revision,
                })
                .collect();
            now.sort_by_key(|c| c.revision);
            let all_sent = now.into_iter().all(|c| tx.try_send(c).is_ok());
            if all_sent {
                inner.watchers.push((bucket, tx));
            }
            rx
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::testing::now;

    #[test]
    fn compare_and_set_and_watch() {
        let s = MemoryStore::new();
        let mut w = now(s.watch(Bucket::Sessions)).unwrap();
        let r1 = now(s.create(Bucket::Sessions, "a", b"1".to_vec())).unwrap();
        assert_eq!(
            now(s.create(Bucket::Sessions, "a", b"2".to_vec())),
            Err(StoreError::Conflict)
        );
        let r2 = now(s.update(Bucket::Sessions, "a", b"2".to_vec(), r1)).unwrap();
        assert!(r2 > r1);
        assert_eq!(
            now(s.update(Bucket::Sessions, "a", b"3".to_vec(), r1)),
            Err(StoreError::Conflict),
            "a stale revision loses"
        );
        assert_eq!(
            now(s.delete(Bucket::Sessions, "a", Some(r1))),
            Err(StoreError::Conflict)
        );
        // Buckets are apart.
        now(s.put(Bucket::Nodes, "a", b"n".to_vec())).unwrap();
        assert_eq!(
            now(s.get(Bucket::Sessions, "a")).unwrap().unwrap().value,
            b"2"
        );
        now(s.delete(Bucket::Sessions, "a", Some(r2))).unwrap();
        assert_eq!(now(s.get(Bucket::Sessions, "a")).unwrap(), None);
        assert_eq!(now(s.keys(Bucket::Nodes)).unwrap(), vec!["a".to_owned()]);
        let seen: Vec<Option<Vec<u8>>> = std::iter::from_fn(|| w.try_recv().ok())
            .map(|c| c.value)
            .collect();
        assert_eq!(seen, vec![Some(b"1".to_vec()), Some(b"2".to_vec()), None]);
        // A new watch starts with the records there are.
        let mut late = now(s.watch(Bucket::Nodes)).unwrap();
        assert_eq!(late.try_recv().map(|c| c.key).ok().as_deref(), Some("a"));
        assert!(late.try_recv().is_err());
    }

    #[test]
    fn bad_keys_and_an_unreachable_store_are_errors() {
        let s = MemoryStore::new();
        for key in ["", ".a", "a.", "a b", "a*", "ä"] {
            assert!(
                matches!(
                    now(s.put(Bucket::Nodes, key, vec![])),
                    Err(StoreError::Invalid(_))
                ),
                "{key:?}"
            );
        }
        s.set_unreachable(true);
        assert!(matches!(
            now(s.get(Bucket::Nodes, "a")),
            Err(StoreError::Unreachable(_))
        ));
        s.set_unreachable(false);
        assert_eq!(now(s.get(Bucket::Nodes, "a")), Ok(None));
    }
}
