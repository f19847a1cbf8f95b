//! The [`Store`] in NATS JetStream: one key-value bucket per [`Bucket`]
//! (history 1, file storage, the configured replication), compare-and-set
//! through the key-value revision, the change feed through a bucket watch.
//!
//! Every operation is bounded by a timeout; a timeout or a lost connection
//! is [`StoreError::Unreachable`] (the node then marks itself degraded),
//! never a hang. The client library is pinned (see the crate manifest).

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::store::{
    check_key, check_value, Bucket, Change, Entry, Store, StoreError, StoreFuture, WATCH_CAPACITY,
};

/// How long one store operation may take before it counts as unreachable.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// The NATS JetStream store.
pub struct NatsStore {
    buckets: HashMap<Bucket, kv::Store>,
    timeout: Duration,
}

impl std::fmt::Debug for NatsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn unreachable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unreachable(e.to_string())
}

async fn bounded<T, E: std::fmt::Display>(
    timeout: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => r.map_err(|e| StoreError::Unreachable(format!("{what}: {e}"))),
        Err(_) => Err(StoreError::Unreachable(format!(
            "{what}: no answer within {timeout:?}"
        ))),
    }
}

impl NatsStore {
    /// [`NatsStore::connect`] with [`OPERATION_TIMEOUT`], tried again
    /// every half second for up to `limit`: a NATS cluster that is
    /// starting has no JetStream leader for a few seconds. The error
    /// names the URL.
    pub async fn connect_patiently(
        url: &str,
        replicas: usize,
        limit: Duration,
    ) -> Result<Self, String> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            match Self::connect(url, replicas, OPERATION_TIMEOUT).await {
                Ok(store) => return Ok(store),
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(format!("cluster store {url}: {e}"))
                }
                Err(e) => {
                    tracing::info!(%url, error = %e, "cluster store not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Connects to the NATS server at `url` (`nats://host:port`) and opens
    /// (creating them when missing) the buckets, replicated `replicas`
    /// times. Fails when the server does not answer within `timeout` or
    /// has no JetStream.
    pub async fn connect(
        url: &str,
        replicas: usize,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = bounded(
            timeout,
            "connect",
            async_nats::ConnectOptions::new()
                .connection_timeout(timeout)
                .name("uascale")
                .connect(url),
        )
        .await?;
        let js = async_nats::jetstream::new(client);
        let mut buckets = HashMap::new();
        for bucket in Bucket::ALL {
            let store = match bounded(timeout, "open bucket", js.get_key_value(bucket.name())).await
            {
                Ok(s) => s,
                Err(_) => {
                    bounded(
                        timeout,
                        "create bucket",
                        js.create_key_value(kv::Config {
                            bucket: bucket.name().to_owned(),
                            description: "uascale cluster mirror".to_owned(),
                            history: 1,
                            max_value_size: i32::try_from(super::store::MAX_RECORD_BYTES)
                                .unwrap_or(i32::MAX),
                            num_replicas: replicas.max(1),
                            storage: async_nats::jetstream::stream::StorageType::File,
                            ..Default::default()
                        }),
                    )
                    .await?
                }
            };
            buckets.insert(bucket, store);
        }
        Ok(NatsStore { buckets, timeout })
    }

    fn bucket(&self, bucket: Bucket) -> Result<&kv::Store, StoreError> {
        self.buckets
            .get(&bucket)
            .ok_or_else(|| StoreError::Invalid(format!("bucket {} not open", bucket.name())))
    }
}

fn is_value(op: kv::Operation) -> bool {
    matches!(op, kv::Operation::Put)
}

impl Store for NatsStore {
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> StoreFuture<'a, Option<Entry>> {
        Box::pin(async move {
            check_key(key)?;
            let kv = self.bucket(bucket)?;
            let e = bounded(self.timeout, "get", kv.entry(key)).await?;
            Ok(e.filter(|e| is_value(e.operation)).map(|e| Entry {
                value: e.value.to_vec(),
                revision: e.revision,
            }))
        })
    }

    fn create<'a>(&'a self, bucket: Bucket, key: &'a str, value: Vec<u8>) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            check_key(key)?;
            check_value(&value)?;
            let kv = self.bucket(bucket)?;
            match tokio::time::timeout(self.timeout, kv.create(key, value.into())).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    Err(StoreError::Conflict)
                }
                Ok(Err(e)) => Err(unreachable(format!("create: {e}"))),
                Err(_) => Err(unreachable("create: timed out")),
            }
        })
    }

    fn update<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Vec<u8>,
        revision: u64,
    ) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            check_key(key)?;
            check_value(&value)?;
            let kv = self.bucket(bucket)?;
            match tokio::time::timeout(self.timeout, kv.update(key, value.into(), revision)).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    Err(StoreError::Conflict)
                }
                Ok(Err(e)) => Err(unreachable(format!("update: {e}"))),
                Err(_) => Err(unreachable("update: timed out")),
            }
        })
    }

    fn put<'a>(&'a self, bucket: Bucket, key: &'a str, value: Vec<u8>) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            check_key(key)?;
            check_value(&value)?;
            let kv = self.bucket(bucket)?;
            bounded(self.timeout, "put", kv.put(key, value.into())).await
        })
    }

    fn delete<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: Option<u64>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_key(key)?;
            let kv = self.bucket(bucket)?;
            match tokio::time::timeout(self.timeout, kv.delete_expect_revision(key, revision)).await
            {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    Err(StoreError::Conflict)
                }
                Ok(Err(e)) => Err(unreachable(format!("delete: {e}"))),
                Err(_) => Err(unreachable("delete: timed out")),
            }
        })
    }

    fn keys(&self, bucket: Bucket) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            let kv = self.bucket(bucket)?;
            // The timeout bounds each answer, not the whole listing: a
            // bucket of thousands of sessions takes longer than one
            // operation to list on a busy machine (seen: the adoption scan
            // after a failover, 3,000 sessions), and a listing that keeps
            // answering is not an unreachable store.
            let mut stream = bounded(self.timeout, "keys", kv.keys()).await?;
            let mut keys = Vec::new();
            loop {
                match tokio::time::timeout(self.timeout, stream.next()).await {
                    Ok(Some(k)) => keys.push(k.map_err(unreachable)?),
                    Ok(None) => break,
                    Err(_) => {
                        return Err(unreachable(format!(
                            "keys: no answer within {:?} after {} keys",
                            self.timeout,
                            keys.len()
                        )))
                    }
                }
            }
            keys.sort();
            Ok(keys)
        })
    }

    fn watch(&self, bucket: Bucket) -> StoreFuture<'_, mpsc::Receiver<Change>> {
        Box::pin(async move {
            let kv = self.bucket(bucket)?;
            // The last record of every key first, then the changes.
            let mut stream = bounded(self.timeout, "watch", kv.watch_with_history(">")).await?;
            let (tx, rx) = mpsc::channel(WATCH_CAPACITY);
            tokio::spawn(async move {
                while let Some(item) = stream.next().await {
                    let Ok(e) = item else {
                        // The watch broke: closing the receiver tells the
                        // consumer to read again.
                        break;
                    };
                    let change = Change {
                        bucket,
                        key: e.key,
                        value: is_value(e.operation).then(|| e.value.to_vec()),
                        revision: e.revision,
                    };
                    if tx.try_send(change).is_err() {
                        break;
                    }
                }
            });
            Ok(rx)
        })
    }
}
