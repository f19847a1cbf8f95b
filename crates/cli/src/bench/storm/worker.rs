//! `--processes P`: the storm's clients spread over P child processes of
//! the same binary (one process may hold only so many open files). A child
//! is `uascale bench storm ARGS...` run with `UASCALE_STORM_WORKER=i/P` in
//! its environment: it runs clients `i, i+P, i+2P, ...` and talks to the
//! parent in lines.
//!
//! - stdout, JSON lines: `{"kind":"ready","clients":K}` once set up;
//!   `{"kind":"delta","delta":{...}}` every 100 ms of the storm (a
//!   [`Delta`]: what happened since the last one);
//!   `{"kind":"storm_done"}` when each of its clients has established,
//!   given up or run out of time; `{"kind":"closed","closed":K}` at the
//!   end.
//! - stdin, words: `go` starts the storm; `close` (or the end of stdin,
//!   when the parent is gone) closes its sessions and ends it.
//!
//! A child also ends by itself if told nothing for ten minutes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::clients::{close_all, storm, Plan};
use super::tally::Delta;
use crate::bench::Args;

/// The environment variable that makes `bench storm` a child: `i/P`.
pub const WORKER_ENV: &str = "UASCALE_STORM_WORKER";

/// How often a child reports during the storm.
const FLUSH: Duration = Duration::from_millis(100);

/// How long a child waits for a word from its parent before it ends.
const PATIENCE: Duration = Duration::from_secs(600);

/// One line a child prints.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    /// Set up, waiting for `go`; with its share of the clients.
    Ready {
        /// Clients it runs.
        clients: usize,
    },
    /// What happened since the last one.
    Delta {
        /// The counts.
        delta: Box<Delta>,
    },
    /// Every client of its share is done.
    StormDone,
    /// Its sessions are closed; it ends.
    Closed {
        /// Sessions closed.
        closed: u64,
    },
}

/// Prints one JSON line to the parent (also the `bench sessions` workers').
pub(in crate::bench) fn say<T: Serialize>(line: &T) {
    if let Ok(text) = serde_json::to_string(line) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

/// `i/P` of the environment variable `var`, if it is set (this process is
/// a child).
pub(in crate::bench) fn slot_of(var: &str) -> Option<Result<(usize, usize), String>> {
    let v = std::env::var(var).ok()?;
    let parsed = v
        .split_once('/')
        .and_then(|(i, p)| Some((i.parse().ok()?, p.parse().ok()?)))
        .filter(|(i, p): &(usize, usize)| i < p)
        .ok_or_else(|| format!("{var}={v:?} is not INDEX/COUNT"));
    Some(parsed)
}

/// `i/P` of the environment, if this process is a child.
pub fn worker_slot() -> Option<Result<(usize, usize), String>> {
    slot_of(WORKER_ENV)
}

/// Starts worker `i` of `count`: this program as `uascale bench KIND
/// ARGS...` with `env=i/count`, its stdin and stdout piped (also the
/// `bench sessions` workers').
pub(in crate::bench) fn spawn_worker(
    kind: &str,
    args: &[String],
    env: &str,
    i: usize,
    count: usize,
) -> Result<(Child, Option<ChildStdin>, std::process::ChildStdout), String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to start workers: {e}"))?;
    let mut child = Command::new(&exe)
        .args(["bench", kind])
        .args(args)
        .env(env, format!("{i}/{count}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start worker {i}: {e}"))?;
    let stdout = child.stdout.take().ok_or("a worker without stdout")?;
    let stdin = child.stdin.take();
    Ok((child, stdin, stdout))
}

/// The child's `main`: `uascale bench storm ARGS...` with
/// [`WORKER_ENV`] set.
pub fn child(rest: &[&str]) -> ExitCode {
    let result = worker_slot()
        .unwrap_or_else(|| Err(format!("{WORKER_ENV} is not set")))
        .and_then(|(index, count)| {
            let a = Args::parse("storm", rest, super::FLAGS)?;
            crate::bench::runtime()?.block_on(run_child(&a, index, count))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uascale bench storm (worker): {e}");
            ExitCode::FAILURE
        }
    }
}

/// The words on stdin, `eof` at its end (also the `bench sessions`
/// workers').
pub(in crate::bench) fn words() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(l.trim().to_owned()).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send("eof".to_owned());
    });
    rx
}

/// The next word from the parent, `eof` when it is gone or silent for
/// [`PATIENCE`].
pub(in crate::bench) async fn next_word(words: &mut mpsc::UnboundedReceiver<String>) -> String {
    match tokio::time::timeout(PATIENCE, words.recv()).await {
        Ok(Some(w)) => w,
        Ok(None) | Err(_) => "eof".to_owned(),
    }
}

async fn run_child(a: &Args, index: usize, count: usize) -> Result<(), String> {
    let plan = Arc::new(Plan::from_args(a, count).await?);
    let share = plan.share(index, count);
    let tally = Arc::new(Mutex::new(Delta::default()));
    // The random generator's first use is slow; not in the storm.
    let _ = uascale_crypto::policy::SecurityPolicy::Basic256Sha256.random_nonce();
    let mut words = words();
    say(&Line::Ready {
        clients: share.len(),
    });
    if next_word(&mut words).await != "go" {
        return Ok(());
    }
    let mut running = tokio::spawn(storm(Arc::clone(&plan), share, Arc::clone(&tally)));
    let take = |tally: &Mutex<Delta>| match tally.lock() {
        Ok(mut t) => std::mem::take(&mut *t),
        Err(p) => std::mem::take(&mut *p.into_inner()),
    };
    let clients = loop {
        tokio::select! {
            done = &mut running => break done.map_err(|e| format!("the storm task failed: {e}"))?,
            () = tokio::time::sleep(FLUSH) => say(&Line::Delta { delta: Box::new(take(&tally)) }),
        }
    };
    say(&Line::Delta {
        delta: Box::new(take(&tally)),
    });
    say(&Line::StormDone);
    // Hold the sessions until the parent has read the server's counters.
    let _ = next_word(&mut words).await;
    let closed = close_all(clients, plan.gate, Duration::from_secs(60)).await;
    say(&Line::Closed { closed });
    Ok(())
}

/// What a child has said so far.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// `ready` came.
    pub ready: bool,
    /// `storm_done` came.
    pub storm_done: bool,
    /// `closed` came, with the count.
    pub closed: Option<u64>,
    /// Its stdout ended (it exited, or failed).
    pub ended: bool,
}

/// What a reader thread passes on (deltas go straight into the tally).
enum Heard {
    Line(usize, Line),
    Ended(usize),
}

/// The parent's side: the children and what they said.
pub struct Children {
    procs: Vec<(Child, Option<ChildStdin>)>,
    heard: mpsc::UnboundedReceiver<Heard>,
    /// Per child.
    pub states: Vec<State>,
}

impl Children {
    /// Starts `count` children with the parent's `args` (everything after
    /// `bench storm`); their deltas are added to `tally` as they come.
    pub fn spawn(args: &[String], count: usize, tally: Arc<Mutex<Delta>>) -> Result<Self, String> {
        let (tx, heard) = mpsc::unbounded_channel();
        let mut procs = Vec::with_capacity(count);
        for i in 0..count {
            let (child, stdin, stdout) = spawn_worker("storm", args, WORKER_ENV, i, count)?;
            let (tx, tally) = (tx.clone(), Arc::clone(&tally));
            std::thread::spawn(move || {
                for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                    match serde_json::from_str::<Line>(&text) {
                        Ok(Line::Delta { delta }) => match tally.lock() {
                            Ok(mut t) => t.absorb(*delta),
                            Err(p) => p.into_inner().absorb(*delta),
                        },
                        Ok(line) => {
                            let _ = tx.send(Heard::Line(i, line));
                        }
                        Err(e) => eprintln!("worker {i}: unexpected output {text:?}: {e}"),
                    }
                }
                let _ = tx.send(Heard::Ended(i));
            });
            procs.push((child, stdin));
        }
        Ok(Children {
            procs,
            heard,
            states: vec![State::default(); count],
        })
    }

    /// Sends `word` to every child still listening.
    pub fn tell(&mut self, word: &str) {
        for (_, stdin) in &mut self.procs {
            if let Some(s) = stdin {
                if writeln!(s, "{word}").and_then(|()| s.flush()).is_err() {
                    *stdin = None;
                }
            }
        }
    }

    /// Waits for the next thing a child says (false once none can say
    /// anything more). Cancel-safe.
    pub async fn next(&mut self) -> bool {
        match self.heard.recv().await {
            Some(Heard::Line(i, line)) => {
                let s = &mut self.states[i];
                match line {
                    Line::Ready { .. } => s.ready = true,
                    Line::StormDone => s.storm_done = true,
                    Line::Closed { closed } => s.closed = Some(closed),
                    Line::Delta { .. } => {}
                }
                true
            }
            Some(Heard::Ended(i)) => {
                self.states[i].ended = true;
                true
            }
            None => false,
        }
    }

    /// Whether every child satisfies `pred` or has ended.
    pub fn all(&self, pred: impl Fn(&State) -> bool) -> bool {
        self.states.iter().all(|s| s.ended || pred(s))
    }

    /// Waits until [`all`](Self::all) holds, at most `limit`; false when
    /// it did not.
    pub async fn wait_for(&mut self, pred: impl Fn(&State) -> bool, limit: Duration) -> bool {
        let end = tokio::time::Instant::now() + limit;
        while !self.all(&pred) {
            match tokio::time::timeout_at(end, self.next()).await {
                Ok(true) => {}
                Ok(false) | Err(_) => return self.all(&pred),
            }
        }
        true
    }

    /// Children that ended before they said `pred`.
    pub fn failed(&self, pred: impl Fn(&State) -> bool) -> Vec<usize> {
        (0..self.states.len())
            .filter(|&i| self.states[i].ended && !pred(&self.states[i]))
            .collect()
    }

    /// Tells the children to close and waits for them (at most `limit`);
    /// a child still running then is killed. Returns the sessions closed.
    pub async fn finish(mut self, limit: Duration) -> u64 {
        self.tell("close");
        for (_, stdin) in &mut self.procs {
            // The end of stdin is the last word.
            stdin.take();
        }
        self.wait_for(|s| s.closed.is_some(), limit).await;
        let closed = self.states.iter().filter_map(|s| s.closed).sum();
        let end = std::time::Instant::now() + Duration::from_secs(5);
        for (child, _) in &mut self.procs {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if std::time::Instant::now() < end => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        closed
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        // An early return of the parent: its children go with it.
        for (child, stdin) in &mut self.procs {
            stdin.take();
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
