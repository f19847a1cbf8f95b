//! The threads that run the asymmetric work of secured OpenSecureChannel
//! requests (RSA or ECC private-key operations, a quarter of a millisecond
//! and more each) off the event loop, so that a connect storm cannot hold
//! up the reads and publishes of established sessions.
//!
//! A fixed set of threads, started with the server
//! (`runtime.crypto_threads`, by default one per CPU the process may use;
//! with 0 the work runs in place and there is no pool), rather than
//! tokio's blocking pool: that pool starts a thread whenever none is idle
//! at the moment work arrives, and on a busy core the thread that just
//! finished has often not parked yet, so a single-CPU server grew four of
//! them within a thousand handshakes (each with its own malloc arena,
//! which spread the sessions' memory over more arenas and made the memory
//! per session unsteady from run to run).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads for handshake cryptography, and the places that
/// bound the work in flight to their number.
pub(super) struct CryptoPool {
    queue: Arc<Queue>,
    places: tokio::sync::Semaphore,
}

/// The jobs waiting for a thread. A mutex and a condition variable: a
/// thread with nothing to do sleeps at once (std's channels spin and
/// yield first, which on a busy core is a context switch more per job).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// The pool was dropped: the threads end once the jobs are done.
    closed: bool,
}

impl CryptoPool {
    /// Starts `threads` threads (at least one), named `name-0`, `name-1`,
    /// ... They end when the pool is dropped and the work they run has
    /// finished.
    pub(super) fn start(threads: usize, name: &str) -> std::io::Result<CryptoPool> {
        let threads = threads.max(1);
        let pool = CryptoPool {
            queue: Arc::new(Queue::default()),
            places: tokio::sync::Semaphore::new(threads),
        };
        for i in 0..threads {
            let queue = Arc::clone(&pool.queue);
            // On an error the pool is dropped, which ends the threads
            // already started.
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&queue))?;
        }
        Ok(pool)
    }

    /// Runs `f` on one of the threads once one is free, and gives what it
    /// returned; `None` if it panicked (the panic is caught: the thread
    /// lives on) or the pool is gone.
    pub(super) async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let _place = self.places.acquire().await.ok()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let out = std::panic::catch_unwind(AssertUnwindSafe(f));
            // The waiting task may be gone (its connection was aborted).
            let _ = tx.send(out);
        });
        {
            let mut state = self.queue.state.lock().ok()?;
            if state.closed {
                return None;
            }
            state.jobs.push_back(job);
        }
        self.queue.ready.notify_one();
        rx.await.ok()?.ok()
    }
}

impl Drop for CryptoPool {
    fn drop(&mut self) {
        if let Ok(mut state) = self.queue.state.lock() {
            state.closed = true;
        }
        self.queue.ready.notify_all();
    }
}

/// A thread's loop: the next job, until the pool is dropped and no job is
/// left. (A job never panics out: `run` catches it.)
fn work(queue: &Queue) {
    let Ok(mut state) = queue.state.lock() else {
        return;
    };
    loop {
        if let Some(job) = state.jobs.pop_front() {
            drop(state);
            job();
            state = match queue.state.lock() {
                Ok(state) => state,
                Err(_) => return,
            };
        } else if state.closed {
            return;
        } else {
            state = match queue.ready.wait(state) {
                Ok(state) => state,
                Err(_) => return,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads of this process whose name starts with `pool-test` (the
    /// kernel keeps 15 bytes of a name).
    fn pool_threads() -> usize {
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("pool-test"))
            .count()
    }

    /// The pool's thread count once it is `n` (a new thread names itself
    /// when it starts), or after a second.
    fn pool_threads_reach(n: usize) -> usize {
        for _ in 0..100 {
            if pool_threads() == n {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        pool_threads()
    }

    /// Work runs on the pool's threads, at most as many at once as there
    /// are threads; a panic is an answer of None and the thread lives on;
    /// the threads end with the pool.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_work_bounded_survives_panics_and_ends_with_the_pool() {
        let before = pool_threads();
        let pool = Arc::new(CryptoPool::start(2, "pool-test").unwrap());
        assert_eq!(pool_threads_reach(before + 2), before + 2);

        let name = pool
            .run(|| std::thread::current().name().map(str::to_owned))
            .await
            .flatten()
            .unwrap();
        assert!(name.starts_with("pool-test-"), "{name}");

        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (pool, running, most) = (Arc::clone(&pool), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                pool.run(move || {
                    use std::sync::atomic::Ordering::SeqCst;
                    let now = running.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    running.fetch_sub(1, SeqCst);
                    7
                })
                .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Some(7));
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);

        let panicked: Option<()> = pool.run(|| panic!("a panic the test provokes")).await;
        assert_eq!(panicked, None);
        assert_eq!(pool.run(|| 1 + 1).await, Some(2));
        assert_eq!(pool_threads(), before + 2);

        drop(pool);
        assert_eq!(pool_threads_reach(before), before);
    }
}
