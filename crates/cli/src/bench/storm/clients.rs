//! The storm's clients: all started at once, each naive or cooperative
//! ([`Behaviour`]), each counted into a shared [`Delta`] as its attempts
//! end; then, at the end of the run, closed a bounded number at a time.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uascale_client::{
    Client, ClientError, ClientOptions, ConnectGate, ConnectReport, OpenAttempt, OpenObserver,
    OpenStage,
};

use super::tally::{Behaviour, Delta, Mix};
use crate::bench::common::client_options;
use crate::bench::{source_ips, Args};

/// What a share of the storm runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The server.
    pub url: String,
    /// Clients in the whole storm (over every process).
    pub clients: usize,
    /// Which behave how.
    pub mix: Mix,
    /// Security and identity; everything else is set per behaviour.
    pub options: ClientOptions,
    /// Local addresses, round robin by client index (none: the OS picks).
    pub sources: Vec<IpAddr>,
    /// `--gate`: the cooperative clients' connect gate over all processes.
    pub gate_total: usize,
    /// The cooperative clients' connect gate in this process.
    pub gate: usize,
    /// `--split-behaviours`: with `mixed` over two or more processes, the
    /// cooperative clients run in the first half of the processes
    /// (rounded up) and the naive ones in the rest.
    pub split: bool,
    /// Cooperative: attempts after the first.
    pub max_retries: u32,
    /// Naive: the per-attempt timeout.
    pub timeout: Duration,
    /// How long the storm may last; clients still trying then stop.
    pub duration: Duration,
}

impl Plan {
    /// The plan of the command line, for a storm over `processes`
    /// processes (the gate is split between them). For a secured policy
    /// the server certificate is looked up here, once per process.
    pub async fn from_args(a: &Args, processes: usize) -> Result<Plan, String> {
        let clients: usize = a.num("--clients", 100)?;
        let gate: usize = a.num("--gate", 50)?;
        let timeout = a.seconds("--timeout-s", 3.0)?;
        let duration = a.seconds("--duration-s", 30.0)?;
        if clients == 0 || gate == 0 || timeout.is_zero() || duration.is_zero() {
            return Err("--clients, --gate, --timeout-s and --duration-s must be > 0".into());
        }
        if processes == 0 || processes > clients {
            return Err(format!("--processes must be 1 to --clients ({clients})"));
        }
        let mix = Mix::parse(a.last("--behaviour").unwrap_or("mixed"))?;
        let split = a.last("--split-behaviours").is_some() && mix == Mix::Mixed && processes > 1;
        // Split, only the cooperative processes hold the gate.
        let gated = if split {
            processes.div_ceil(2)
        } else {
            processes
        };
        Ok(Plan {
            url: a.url.clone(),
            clients,
            mix,
            options: client_options(a).await?,
            sources: source_ips(a)?,
            gate_total: gate,
            gate: gate.div_ceil(gated.max(1)),
            split,
            max_retries: a.num("--max-retries", 4)?,
            timeout,
            duration,
        })
    }

    /// The client indices process `index` of `count` runs: round robin,
    /// or, split, round robin within the processes of its behaviour.
    pub fn share(&self, index: usize, count: usize) -> Vec<usize> {
        let count = count.max(1);
        if !self.split || count < 2 {
            return (0..self.clients).filter(|i| i % count == index).collect();
        }
        let coop_processes = count.div_ceil(2);
        let (behaviour, group, at) = if index < coop_processes {
            (Behaviour::Cooperative, coop_processes, index)
        } else {
            (
                Behaviour::Naive,
                count - coop_processes,
                index - coop_processes,
            )
        };
        (0..self.clients)
            .filter(|&i| self.mix.of(i, self.clients) == behaviour)
            .enumerate()
            .filter(|(n, _)| n % group == at)
            .map(|(_, i)| i)
            .collect()
    }
}

fn record(tally: &Mutex<Delta>, behaviour: Behaviour, f: impl FnOnce(&mut super::tally::Part)) {
    let mut t = match tally.lock() {
        Ok(t) => t,
        Err(p) => p.into_inner(),
    };
    f(t.part(behaviour));
}

/// Starts the clients `indices` of `plan` now and waits until each has
/// established, given up or run out of time (`plan.duration`); returns the
/// established ones (with their sessions open).
pub async fn storm(plan: Arc<Plan>, indices: Vec<usize>, tally: Arc<Mutex<Delta>>) -> Vec<Client> {
    let start = Instant::now();
    let deadline = start + plan.duration;
    let gate = ConnectGate::new(plan.gate);
    let mut tasks = Vec::with_capacity(indices.len());
    for i in indices {
        let behaviour = plan.mix.of(i, plan.clients);
        let local_addr = match plan.sources.len() {
            0 => None,
            n => Some(plan.sources[i % n]),
        };
        let (plan, tally) = (Arc::clone(&plan), Arc::clone(&tally));
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            match behaviour {
                Behaviour::Cooperative => {
                    cooperative(&plan, i, local_addr, gate, start, deadline, tally).await
                }
                Behaviour::Naive => naive(&plan, i, local_addr, start, deadline, tally).await,
            }
        }));
    }
    let mut established = Vec::new();
    for t in tasks {
        if let Ok(Some(c)) = t.await {
            established.push(c);
        }
    }
    established
}

/// `Client::open` as shipped, every attempt heard through the options'
/// observer.
async fn cooperative(
    plan: &Plan,
    i: usize,
    local_addr: Option<IpAddr>,
    gate: ConnectGate,
    start: Instant,
    deadline: Instant,
    tally: Arc<Mutex<Delta>>,
) -> Option<Client> {
    let heard = Arc::clone(&tally);
    let observer = OpenObserver(Arc::new(move |a: &OpenAttempt| {
        record(&heard, Behaviour::Cooperative, |p| match &a.failure {
            None => p.attempt_succeeded(),
            Some((stage, e)) => p.attempt_failed(*stage, e, a.retry_in.is_some(), a.retry_in),
        });
    }));
    let options = ClientOptions {
        local_addr,
        connect_gate: Some(gate),
        connect_attempts: plan.max_retries.saturating_add(1),
        on_open_attempt: Some(observer),
        ..plan.options.clone()
    };
    let mut report = ConnectReport::default();
    let name = format!("storm {i}");
    tokio::select! {
        r = Client::open(&plan.url, options, &name, &mut report) => match r {
            Ok(c) => {
                record(&tally, Behaviour::Cooperative, |p| p.established(start.elapsed()));
                Some(c)
            }
            Err(e) => {
                record(&tally, Behaviour::Cooperative, |p| p.gave_up(e.status_code()));
                None
            }
        },
        () = tokio::time::sleep_until(deadline.into()) => {
            record(&tally, Behaviour::Cooperative, |p| p.cut_off += 1);
            None
        }
    }
}

/// What collapses servers: each attempt a new connection, CreateSession
/// and ActivateSession within `plan.timeout`; on any failure or timeout
/// the next attempt at once, until `deadline`. An attempt abandoned after
/// CreateSession leaves its session on the server.
async fn naive(
    plan: &Plan,
    i: usize,
    local_addr: Option<IpAddr>,
    start: Instant,
    deadline: Instant,
    tally: Arc<Mutex<Delta>>,
) -> Option<Client> {
    let options = ClientOptions {
        local_addr,
        connect_timeout: plan.timeout,
        request_timeout: plan.timeout,
        reconnect: false,
        connect_gate: None,
        connect_attempts: 1,
        ..plan.options.clone()
    };
    let name = format!("storm {i}");
    let mut first = true;
    loop {
        let now = Instant::now();
        if now >= deadline {
            record(&tally, Behaviour::Naive, |p| p.cut_off += 1);
            return None;
        }
        if !first {
            record(&tally, Behaviour::Naive, |p| p.retries += 1);
        }
        first = false;
        let full = now + plan.timeout;
        let until = full.min(deadline);
        let mut stage = OpenStage::Connect;
        let attempt = async {
            let c = Client::connect(&plan.url, options.clone()).await?;
            stage = OpenStage::CreateSession;
            c.create_session_only(&name).await?;
            stage = OpenStage::ActivateSession;
            c.activate_session().await?;
            Ok::<_, ClientError>(c)
        };
        let result = tokio::time::timeout_at(until.into(), attempt).await;
        match result {
            Ok(Ok(c)) => {
                record(&tally, Behaviour::Naive, |p| {
                    p.attempt_succeeded();
                    p.established(start.elapsed());
                });
                return Some(c);
            }
            // Retried at once (counted when the next attempt starts).
            Ok(Err(e)) => record(&tally, Behaviour::Naive, |p| {
                p.attempt_failed(stage, &e, false, None);
            }),
            // The storm's end, not the attempt's timeout (a session
            // created by then is left behind all the same).
            Err(_) if until < full => {
                record(&tally, Behaviour::Naive, |p| {
                    p.cut_off += 1;
                    if stage == OpenStage::ActivateSession {
                        p.orphans_left += 1;
                    }
                });
                return None;
            }
            Err(_) => record(&tally, Behaviour::Naive, |p| {
                p.attempt_failed(stage, &ClientError::Timeout, false, None);
            }),
        }
        // At once, but let the other tasks run.
        tokio::task::yield_now().await;
    }
}

/// Closes `clients` (CloseSession, then the channel), `concurrency` at a
/// time, for at most `limit`; the rest are dropped (their channels close,
/// their sessions time out on the server). Returns how many were closed.
pub async fn close_all(clients: Vec<Client>, concurrency: usize, limit: Duration) -> u64 {
    let gate = ConnectGate::new(concurrency);
    let mut set = tokio::task::JoinSet::new();
    for c in clients {
        let gate = gate.clone();
        set.spawn(async move {
            let _turn = gate.enter().await;
            c.close().await;
        });
    }
    let mut closed = 0;
    let end = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(end, set.join_next()).await {
            Ok(Some(_)) => closed += 1,
            Ok(None) => break,
            Err(_) => {
                set.abort_all();
                break;
            }
        }
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(clients: usize, split: bool) -> Plan {
        Plan {
            url: "opc.tcp://127.0.0.1:4840".into(),
            clients,
            mix: Mix::Mixed,
            options: ClientOptions::default(),
            sources: Vec::new(),
            gate_total: 50,
            gate: 25,
            split,
            max_retries: 4,
            timeout: Duration::from_secs(3),
            duration: Duration::from_secs(30),
        }
    }

    #[test]
    fn shares_cover_every_client_once_and_split_by_behaviour() {
        for (clients, processes) in [(10, 2), (11, 3), (7, 4), (5, 1)] {
            for split in [false, true] {
                let p = plan(clients, split);
                let mut all: Vec<usize> =
                    (0..processes).flat_map(|k| p.share(k, processes)).collect();
                all.sort_unstable();
                assert_eq!(
                    all,
                    (0..clients).collect::<Vec<_>>(),
                    "{clients}/{processes}"
                );
                if split && processes > 1 {
                    for k in 0..processes {
                        let want = if k < processes.div_ceil(2) {
                            Behaviour::Cooperative
                        } else {
                            Behaviour::Naive
                        };
                        assert!(
                            p.share(k, processes)
                                .into_iter()
                                .all(|i| p.mix.of(i, clients) == want),
                            "process {k} of {processes} runs only {want:?} clients"
                        );
                    }
                }
            }
        }
        // Not split: every process runs both.
        let p = plan(10, false);
        let kinds: Vec<_> = p.share(0, 2).into_iter().map(|i| p.mix.of(i, 10)).collect();
        assert!(kinds.contains(&Behaviour::Cooperative) && kinds.contains(&Behaviour::Naive));
    }
}
