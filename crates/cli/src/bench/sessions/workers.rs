//! `bench sessions --processes P`: the sessions spread over P child
//! processes of the same binary, so that the clients' own work (RSA or ECC
//! per session, a publish response per session and interval) is not one
//! process's while the parent measures the server. A child is `uascale
//! bench sessions ARGS...` run with [`WORKER_ENV`]`=i/P`: it establishes
//! sessions `i, i+P, i+2P, ...`, C/P at a time, and talks to the parent in
//! lines.
//!
//! - stdout, JSON lines: `{"kind":"ready"}` once set up (the server's
//!   endpoint looked up); `{"kind":"counts","counts":{...}}` every 100 ms
//!   (its totals so far); `{"kind":"established"}` when each of its
//!   sessions is established or has failed; `{"kind":"closed","alive":K}`
//!   at the end.
//! - stdin, words: `go` starts establishing; `hold` starts counting the
//!   sessions notified; `close` (or the end of stdin, when the parent is
//!   gone) reads once through each session, closes them and ends it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ExitCode};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uascale_client::ConnectGate;
use uascale_types::StatusCode;

use super::{close_sessions, start_sessions, Counters, Setup, FLAGS};
use crate::bench::storm::worker::{next_word, say, slot_of, spawn_worker, words};
use crate::bench::Args;

/// The environment variable that makes `bench sessions` a child: `i/P`.
pub const WORKER_ENV: &str = "UASCALE_SESSIONS_WORKER";

/// How often a child reports its counts.
const FLUSH: Duration = Duration::from_millis(100);

/// How long the parent waits for its children to set up, and to close.
const SETUP_PATIENCE: Duration = Duration::from_secs(120);
const CLOSE_PATIENCE: Duration = Duration::from_secs(600);

/// A child's totals so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Counts {
    established: u64,
    busy: u64,
    retries: u64,
    failed: u64,
    notified: u64,
    data_changes: u64,
    /// Failures by StatusCode (its numeric value): pairs, as the
    /// internally tagged lines cannot carry a map with number keys.
    failures: Vec<(u32, u64)>,
}

impl Counts {
    fn of(c: &Counters) -> Counts {
        Counts {
            established: c.established.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            notified: c.notified.load(Ordering::Relaxed),
            data_changes: c.data_changes.load(Ordering::Relaxed),
            failures: c
                .failures
                .lock()
                .map(|f| f.iter().map(|(s, n)| (s.0, *n)).collect())
                .unwrap_or_default(),
        }
    }

    /// Writes the sum of `all` into `into`.
    fn sum_into(all: &[Counts], into: &Counters) {
        let total = |f: fn(&Counts) -> u64| all.iter().map(f).sum::<u64>();
        into.established
            .store(total(|c| c.established), Ordering::Relaxed);
        into.busy.store(total(|c| c.busy), Ordering::Relaxed);
        into.retries.store(total(|c| c.retries), Ordering::Relaxed);
        into.failed.store(total(|c| c.failed), Ordering::Relaxed);
        into.notified
            .store(total(|c| c.notified), Ordering::Relaxed);
        into.data_changes
            .store(total(|c| c.data_changes), Ordering::Relaxed);
        if let Ok(mut f) = into.failures.lock() {
            f.clear();
            for c in all {
                for (s, n) in &c.failures {
                    *f.entry(StatusCode(*s)).or_insert(0) += n;
                }
            }
        }
    }
}

/// One line a child prints.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Said {
    /// Set up, waiting for `go`.
    Ready,
    /// Its totals so far.
    Counts {
        /// The totals.
        counts: Counts,
    },
    /// Each of its sessions is established or has failed.
    Established,
    /// Its sessions are closed; it ends.
    Closed {
        /// Sessions that answered a Read before closing.
        alive: u64,
    },
}

/// `i/P` of the environment, if this process is a child.
fn worker_slot() -> Result<(usize, usize), String> {
    slot_of(WORKER_ENV).unwrap_or_else(|| Err(format!("{WORKER_ENV} is not set")))
}

/// The child's `main`: `uascale bench sessions ARGS...` with
/// [`WORKER_ENV`] set.
pub fn child(rest: &[&str]) -> ExitCode {
    let result = worker_slot().and_then(|(index, count)| {
        let a = Args::parse("sessions", rest, FLAGS)?;
        crate::bench::runtime()?.block_on(run_child(&a, index, count))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uascale bench sessions (worker): {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run_child(a: &Args, index: usize, count: usize) -> Result<(), String> {
    let n: usize = a.num("--sessions", 100)?;
    let concurrency: usize = a.num("--concurrency", 50)?;
    let setup = Setup::from_args(a).await?;
    let _ = uascale_crypto::policy::SecurityPolicy::Basic256Sha256.random_nonce();
    let counters = Arc::new(Counters::default());
    let gate = ConnectGate::new(concurrency.div_ceil(count).max(1));
    let mut words = words();
    say(&Said::Ready);
    if next_word(&mut words).await != "go" {
        return Ok(());
    }
    let mine: Vec<usize> = (index..n).step_by(count).collect();
    let mut joiner = start_sessions(&setup, mine, &gate, &counters);
    let counts = |c: &Counters| Said::Counts {
        counts: Counts::of(c),
    };
    let clients = loop {
        tokio::select! {
            done = &mut joiner => break done.map_err(|e| format!("the sessions task failed: {e}"))?,
            () = tokio::time::sleep(FLUSH) => say(&counts(&counters)),
        }
    };
    say(&counts(&counters));
    say(&Said::Established);
    loop {
        tokio::select! {
            w = next_word(&mut words) => {
                if w == "hold" {
                    counters.holding.store(true, Ordering::Relaxed);
                } else {
                    break;
                }
            }
            () = tokio::time::sleep(FLUSH) => say(&counts(&counters)),
        }
    }
    let alive = close_sessions(clients, &gate).await;
    say(&counts(&counters));
    say(&Said::Closed { alive });
    Ok(())
}

/// What the children have said so far.
#[derive(Debug, Default)]
struct Heard {
    counts: Vec<Counts>,
    ready: Vec<bool>,
    established: Vec<bool>,
    closed: Vec<Option<u64>>,
    /// Its stdout ended (it exited, or failed).
    ended: Vec<bool>,
}

impl Heard {
    fn all(&self, f: impl Fn(usize) -> bool) -> bool {
        (0..self.ended.len()).all(|i| self.ended[i] || f(i))
    }
}

/// The parent's side: the children, their stdin, and what they said.
pub struct Children {
    procs: Vec<(Child, Option<ChildStdin>)>,
    heard: Arc<Mutex<Heard>>,
}

fn lock(h: &Mutex<Heard>) -> std::sync::MutexGuard<'_, Heard> {
    match h.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Children {
    /// Starts `count` children with the parent's `args` (everything after
    /// `bench sessions`) and waits until each is set up; their counts are
    /// summed into `counters` as they come.
    pub async fn spawn(
        args: &[String],
        count: usize,
        counters: Arc<Counters>,
    ) -> Result<Self, String> {
        let heard = Arc::new(Mutex::new(Heard {
            counts: vec![Counts::default(); count],
            ready: vec![false; count],
            established: vec![false; count],
            closed: vec![None; count],
            ended: vec![false; count],
        }));
        let mut procs = Vec::with_capacity(count);
        for i in 0..count {
            let (child, stdin, stdout) = spawn_worker("sessions", args, WORKER_ENV, i, count)?;
            let (heard, counters) = (Arc::clone(&heard), Arc::clone(&counters));
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let said = match serde_json::from_str::<Said>(&line) {
                        Ok(said) => said,
                        Err(e) => {
                            eprintln!("uascale bench sessions: worker {i} said {line:?}: {e}");
                            continue;
                        }
                    };
                    let mut h = lock(&heard);
                    match said {
                        Said::Ready => h.ready[i] = true,
                        Said::Counts { counts } => {
                            h.counts[i] = counts;
                            Counts::sum_into(&h.counts, &counters);
                        }
                        Said::Established => h.established[i] = true,
                        Said::Closed { alive } => h.closed[i] = Some(alive),
                    }
                }
                lock(&heard).ended[i] = true;
            });
            procs.push((child, stdin));
        }
        let me = Children { procs, heard };
        let deadline = tokio::time::Instant::now() + SETUP_PATIENCE;
        loop {
            {
                let h = lock(&me.heard);
                if h.ready.iter().all(|r| *r) {
                    break;
                }
                if h.ended.iter().any(|e| *e) {
                    return Err("a worker ended before it was set up (see its error above)".into());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err("the workers did not set up within 120 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(me)
    }

    /// Tells every child `word`.
    pub fn say(&mut self, word: &str) {
        for (_, stdin) in &mut self.procs {
            if let Some(s) = stdin {
                if writeln!(s, "{word}").and_then(|()| s.flush()).is_err() {
                    *stdin = None;
                }
            }
        }
    }

    /// Resolves when every child has established its sessions (or ended).
    pub fn all_established(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let heard = Arc::clone(&self.heard);
        async move {
            loop {
                let done = {
                    let h = lock(&heard);
                    h.all(|i| h.established[i])
                };
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Tells the children to close their sessions and waits for them;
    /// returns how many sessions answered a Read before closing.
    pub async fn close(&mut self) -> u64 {
        self.say("close");
        let deadline = tokio::time::Instant::now() + CLOSE_PATIENCE;
        loop {
            let done = {
                let h = lock(&self.heard);
                h.all(|i| h.closed[i].is_some())
            };
            if done || tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let alive = lock(&self.heard).closed.iter().flatten().sum();
        for (child, stdin) in &mut self.procs {
            drop(stdin.take());
            let _ = child.wait();
        }
        alive
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (child, stdin) in &mut self.procs {
            drop(stdin.take());
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_children_counts_add_up() {
        let a = Counts {
            established: 3,
            busy: 1,
            retries: 2,
            failed: 1,
            notified: 3,
            data_changes: 9,
            failures: vec![(StatusCode::BadTimeout.0, 1)],
        };
        let b = Counts {
            established: 4,
            failed: 2,
            failures: vec![
                (StatusCode::BadTimeout.0, 1),
                (StatusCode::BadTooManySessions.0, 1),
            ],
            ..Counts::default()
        };
        // Through JSON, as the children send it.
        let back: Vec<Counts> = [&a, &b]
            .iter()
            .map(|c| {
                let line = serde_json::to_string(&Said::Counts {
                    counts: (*c).clone(),
                })
                .unwrap();
                match serde_json::from_str(&line).unwrap() {
                    Said::Counts { counts } => counts,
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        let into = Counters::default();
        Counts::sum_into(&back, &into);
        assert_eq!(into.established.load(Ordering::Relaxed), 7);
        assert_eq!(into.failed.load(Ordering::Relaxed), 3);
        assert_eq!(into.data_changes.load(Ordering::Relaxed), 9);
        let f = into.failures.lock().unwrap();
        assert_eq!(f.get(&StatusCode::BadTimeout), Some(&2));
        assert_eq!(f.get(&StatusCode::BadTooManySessions), Some(&1));
        // Summing again replaces, never adds twice.
        drop(f);
        Counts::sum_into(&back, &into);
        assert_eq!(into.established.load(Ordering::Relaxed), 7);
    }
}
