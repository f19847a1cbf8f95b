//! The client-wide connect gate of docs/scalability.md §7: a concurrency limit
//! with a queue, shared by many clients, so that a bulk connect (or the
//! reconnect of many clients after a network blip) ramps instead of
//! stampeding the server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A limit on concurrent connects, first come first served. Clone it into
/// the [`ClientOptions`](crate::ClientOptions) of every client that shares
/// it.
#[derive(Debug, Clone)]
pub struct ConnectGate {
    permits: Arc<Semaphore>,
    limit: usize,
    waiting: Arc<AtomicUsize>,
}

/// A turn through the gate; the next waiter goes when it is dropped.
#[derive(Debug)]
pub struct GateTurn {
    _permit: OwnedSemaphorePermit,
}

impl ConnectGate {
    /// At most `concurrent` connects at once (at least 1).
    pub fn new(concurrent: usize) -> Self {
        let limit = concurrent.max(1);
        ConnectGate {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Connects going on now.
    pub fn in_progress(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    /// Connects waiting for their turn.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Waits for a turn (in arrival order).
    pub async fn enter(&self) -> GateTurn {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let permit = Arc::clone(&self.permits).acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        match permit {
            Ok(permit) => GateTurn { _permit: permit },
            // The semaphore is never closed.
            Err(_) => unreachable!("the connect gate's semaphore is never closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_most_the_limit_at_once_in_arrival_order() {
        let gate = ConnectGate::new(2);
        let a = gate.enter().await;
        let _b = gate.enter().await;
        assert_eq!(gate.in_progress(), 2);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..3 {
            let gate = gate.clone();
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let _turn = gate.enter().await;
                order.lock().unwrap().push(i);
            }));
            // Let each waiter queue before the next one.
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.waiting(), 3);
        assert!(order.lock().unwrap().is_empty());
        drop(a);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(gate.waiting(), 0);
        assert_eq!(gate.in_progress(), 1);
    }
}
