//! Where the asymmetric work of secured OpenSecureChannel requests runs
//! (RSA or ECC private-key operations, a quarter of a millisecond and more
//! each), so that a connect storm cannot hold up the reads and publishes
//! of established sessions (`runtime.crypto_threads`):
//!
//! - **In place** (0, the default): on the worker that read the request,
//!   taking turns ([`InPlace`]): one job per worker at a time, and the
//!   runtime runs what became ready meanwhile before the next. A
//!   handshake is two jobs, receiving the request (RSA: two private-key
//!   operations) and answering it (one). A request of an established
//!   session that arrives during a job waits for that job's end and for
//!   what was ready before it, not for the jobs queued behind.
//! - **On crypto threads** (1 or more), off the event loop. The kernel
//!   lets a worker that has input preempt them, so established sessions
//!   wait for no handshake. The price is the handoff to the thread and
//!   back and those preemptions: about six context switches more per RSA
//!   handshake on one core, and a few percent more CPU per session.
//!
//! The threads are a fixed set started with the server rather than
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

/// Where the asymmetric work of secured OpenSecureChannel requests runs.
pub(super) enum HandshakeCrypto {
    /// On a fixed set of threads started with the server.
    Threads(CryptoPool),
    /// In place, on the worker that read the request, taking turns.
    InPlace(InPlace),
}

impl HandshakeCrypto {
    /// `threads` crypto threads named `name-0`, `name-1`, ...; with 0 the
    /// work runs in place, `turns` jobs at once (at least one).
    pub(super) fn start(threads: usize, turns: usize, name: &str) -> std::io::Result<Self> {
        Ok(match threads {
            0 => HandshakeCrypto::InPlace(InPlace::new(turns)),
            n => HandshakeCrypto::Threads(CryptoPool::start(n, name)?),
        })
    }

    /// Whether a handshake's work goes in two steps, receiving the
    /// OpenSecureChannel and answering it (for RSA, two private-key
    /// operations and then one): in place each step is a turn, so what
    /// waits for the end of a turn waits for at most one step; on the
    /// threads a second step would be a second handoff and no shorter wait
    /// for anyone.
    pub(super) fn in_two_steps(&self) -> bool {
        matches!(self, HandshakeCrypto::InPlace(_))
    }

    /// Runs `f` where this server runs handshake work, and gives what it
    /// returned; `None` if it panicked (the panic is caught) or the pool
    /// is gone.
    pub(super) async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        match self {
            HandshakeCrypto::Threads(pool) => pool.run(f).await,
            HandshakeCrypto::InPlace(in_place) => in_place.run(f).await,
        }
    }
}

/// Handshake work in place, on the event loop's own workers, without a
/// handoff to another thread and back, and the context switches that
/// come with it. It takes turns, so that a connect storm cannot hold up
/// established sessions for more than one job at a time:
///
/// - at most `turns` jobs run at once (the server gives one per worker
///   thread), the rest wait for a turn in arrival order;
/// - after a job, before the turn passes on, the task yields to the
///   runtime, which first runs every task that is ready and polls for
///   I/O and timers (tokio wakes a yielded task only after that). The
///   reads and publishes of established sessions that arrived during the
///   job therefore go ahead of the next handshake, where without the
///   yield the turn would pass straight to the next waiting handshake.
pub(super) struct InPlace {
    turns: tokio::sync::Semaphore,
}

impl InPlace {
    /// At most `turns` (at least one) jobs at once.
    pub(super) fn new(turns: usize) -> InPlace {
        InPlace {
            turns: tokio::sync::Semaphore::new(turns.max(1)),
        }
    }

    /// Runs `f` on this task once a turn is free, then lets the runtime
    /// run what became ready meanwhile; gives what `f` returned, `None` if
    /// it panicked (the panic is caught, as on the threads).
    pub(super) async fn run<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let _turn = self.turns.acquire().await.ok()?;
        let out = std::panic::catch_unwind(AssertUnwindSafe(f)).ok();
        tokio::task::yield_now().await;
        out
    }
}

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

    /// In place, a handshake's turn passes on only after what became ready
    /// during its job ran: a timer that fired during the first job is
    /// served before the second job starts, though that job's task was
    /// already waiting for the turn. (Without the yield the turn goes
    /// straight to the next job, and the timer waits for all three.)
    #[tokio::test(flavor = "current_thread")]
    async fn in_place_work_lets_what_became_ready_go_before_the_next_turn() {
        use std::time::Duration;
        let in_place = Arc::new(InPlace::new(1));
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let timer_log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            timer_log.lock().unwrap().push("timer".to_owned());
        }));
        for i in 0..3 {
            let (in_place, log) = (Arc::clone(&in_place), Arc::clone(&log));
            tasks.push(tokio::spawn(async move {
                let done = in_place
                    .run(move || {
                        log.lock().unwrap().push(format!("job {i}"));
                        // Blocking, as RSA is: the timer fires meanwhile.
                        std::thread::sleep(Duration::from_millis(20));
                        i
                    })
                    .await;
                assert_eq!(done, Some(i));
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            *log.lock().unwrap(),
            ["job 0", "timer", "job 1", "job 2"],
            "the timer waited for more than one job"
        );
    }

    /// In place, at most as many jobs run at once as there are turns; a
    /// panic is an answer of None and the next job runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_place_work_is_bounded_by_its_turns_and_survives_panics() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let in_place = Arc::new(InPlace::new(1));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..6 {
            let (in_place, running, most) = (in_place.clone(), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                in_place
                    .run(move || {
                        let now = running.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        running.fetch_sub(1, SeqCst);
                        i
                    })
                    .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), Some(i));
        }
        assert_eq!(most.load(SeqCst), 1, "two jobs ran at once on one turn");

        let panicked: Option<()> = in_place.run(|| panic!("a panic the test provokes")).await;
        assert_eq!(panicked, None);
        assert_eq!(in_place.run(|| 1 + 1).await, Some(2));
    }
}
