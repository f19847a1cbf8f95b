//! A connect storm against tight admission limits (docs/scalability.md §1-2):
//! Basic256Sha256 SignAndEncrypt clients connect at once, half of them
//! naive (a 3 s timeout, an immediate retry with a new session each time),
//! half cooperative (uascale's client: backoff honouring the hints, a
//! connect gate). The server must shed with hints and not collapse:
//! - no busy answer without a retry-after hint;
//! - every cooperative client ends established;
//! - no session is left un-activated once the activation deadline passed;
//! - a session established before the storm keeps getting its Reads
//!   answered throughout (counted, not timed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use uascale_client::{
    Client, ClientError, ClientOptions, ConnectGate, ConnectReport, SecurityOptions, ServerTrust,
};
use uascale_crypto::policy::SecurityPolicy;
use uascale_proto::security::Identity;
use uascale_server::config::{AdmissionSection, SecurityConfig, ServerSection};
use uascale_server::{Server, ServerConfig};
use uascale_types as t;
use uascale_types::NodeId;

mod common;

const COOPERATIVE: usize = 60;
const NAIVE: usize = 60;
/// How long the naive clients keep hammering.
const STORM: Duration = Duration::from_secs(4);
const ACTIVATION_DEADLINE: Duration = Duration::from_secs(2);

fn secured(identity: &Arc<Identity>) -> SecurityOptions {
    SecurityOptions {
        policy: SecurityPolicy::Basic256Sha256,
        mode: t::MessageSecurityMode::SignAndEncrypt,
        certificate: Some(Arc::clone(identity)),
        server_certificate: None,
        trust: ServerTrust::UnsafeAcceptAny,
    }
}

/// Busy answers counted by whether they carried a hint.
#[derive(Default)]
struct Busy {
    with_hint: AtomicU64,
    without_hint: AtomicU64,
}

impl Busy {
    fn note(&self, e: &ClientError) {
        if uascale_client::backoff::is_busy_signal(e.status_code())
            && e.status_code() != t::StatusCode::BadTimeout
        {
            if e.retry_after_ms().is_some() {
                self.with_hint.fetch_add(1, Ordering::Relaxed);
            } else {
                self.without_hint.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_storm_is_shed_with_hints_and_leaves_no_orphans() {
    let pki = std::env::temp_dir().join(format!("uascale-storm-{}", std::process::id()));
    let config = ServerConfig {
        server: ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            activation_deadline: ACTIVATION_DEADLINE,
            ..Default::default()
        },
        security: SecurityConfig {
            pki_dir: pki.clone(),
            trust_all_client_certificates: true,
            ..Default::default()
        },
        // Tight: a handful of handshakes and establishments at once.
        admission: AdmissionSection {
            max_concurrent_handshakes: Some(4),
            max_concurrent_session_establishment: Some(8),
            ..Default::default()
        },
        ..Default::default()
    };
    let (url, state, stop, running) = serve(config);
    let identity = common::client_identity("storm client");

    // A session from before the storm, reading throughout.
    let steady = Client::connect(
        &url,
        ClientOptions {
            security: secured(&identity),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    steady.create_session("steady").await.unwrap();
    let storming = Arc::new(AtomicBool::new(true));
    let reads_ok = Arc::new(AtomicU64::new(0));
    let reads_failed = Arc::new(AtomicU64::new(0));
    let reader = {
        let (storming, ok, failed) = (
            Arc::clone(&storming),
            Arc::clone(&reads_ok),
            Arc::clone(&reads_failed),
        );
        tokio::spawn(async move {
            while storming.load(Ordering::Relaxed) {
                match steady.read_values(&[NodeId::ns0(2258)]).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            steady
        })
    };

    let busy = Arc::new(Busy::default());
    // Naive: a 3 s timeout, then at once a new connection and session.
    let mut naive = Vec::new();
    for i in 0..NAIVE {
        let (url, identity, busy) = (url.clone(), Arc::clone(&identity), Arc::clone(&busy));
        naive.push(tokio::spawn(async move {
            let until = tokio::time::Instant::now() + STORM;
            let mut attempts = 0u32;
            while tokio::time::Instant::now() < until {
                attempts += 1;
                let options = ClientOptions {
                    security: secured(&identity),
                    reconnect: false,
                    connect_attempts: 1,
                    ..Default::default()
                };
                let attempt = tokio::time::timeout(Duration::from_secs(3), async {
                    let c = Client::connect(&url, options).await?;
                    c.create_session(&format!("naive {i}")).await?;
                    Ok::<_, ClientError>(c)
                })
                .await;
                match attempt {
                    Ok(Ok(c)) => c.close().await,
                    Ok(Err(e)) => busy.note(&e),
                    Err(_) => {}
                }
            }
            attempts
        }));
    }
    // Cooperative: uascale's client as shipped, through one connect gate.
    let gate = ConnectGate::new(16);
    let mut cooperative = Vec::new();
    for i in 0..COOPERATIVE {
        let options = ClientOptions {
            security: secured(&identity),
            connect_gate: Some(gate.clone()),
            connect_attempts: 40,
            ..Default::default()
        };
        let url = url.clone();
        cooperative.push(tokio::spawn(async move {
            let mut report = ConnectReport::default();
            let result =
                Client::open(&url, options, &format!("cooperative {i}"), &mut report).await;
            (result, report)
        }));
    }

    let mut established = Vec::new();
    let mut coop_busy = 0;
    for task in cooperative {
        let (result, report) = task.await.unwrap();
        assert_eq!(report.busy_without_hint, 0, "a busy answer without a hint");
        coop_busy += report.busy_answers;
        established.push(result.expect("every cooperative client ends established"));
    }
    let mut naive_attempts = 0;
    for task in naive {
        naive_attempts += task.await.unwrap();
    }
    storming.store(false, Ordering::Relaxed);
    let steady = reader.await.unwrap();

    println!(
        "storm: {COOPERATIVE} cooperative clients established after {coop_busy} busy answers; \
         {NAIVE} naive clients made {naive_attempts} attempts and got {} busy answers with a \
         hint, {} without; the steady session read {} times ({} failed); orphans reaped so \
         far {}",
        busy.with_hint.load(Ordering::Relaxed),
        busy.without_hint.load(Ordering::Relaxed),
        reads_ok.load(Ordering::Relaxed),
        reads_failed.load(Ordering::Relaxed),
        state.sessions.orphaned_count(),
    );
    assert_eq!(
        busy.without_hint.load(Ordering::Relaxed),
        0,
        "a naive client got a busy answer without a hint"
    );
    assert!(
        coop_busy + busy.with_hint.load(Ordering::Relaxed) as u32 > 0,
        "the limits were tight enough to shed something"
    );
    assert!(
        naive_attempts as usize >= NAIVE,
        "the naive clients ran ({naive_attempts} attempts)"
    );
    assert_eq!(
        reads_failed.load(Ordering::Relaxed),
        0,
        "the steady session's Reads failed during the storm"
    );
    assert!(
        reads_ok.load(Ordering::Relaxed) > 0,
        "the steady session read"
    );

    // The sheds are visible by stage on the metrics.
    let text = uascale_server::scrape::render(&state, uascale_server::scrape::Format::Prometheus);
    let shed: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("opcua_server_connections_total") && l.contains("outcome=\"shed\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(shed > 0.0, "no shed connection in the metrics:\n{text}");
    // Past the activation deadline nothing created is left un-activated.
    tokio::time::sleep(ACTIVATION_DEADLINE + Duration::from_millis(1500)).await;
    assert_eq!(
        state.sessions.unactivated_count(),
        0,
        "sessions left un-activated after the deadline"
    );
    for c in established {
        c.close().await;
    }
    steady.close().await;
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(pki);
}

/// The retry tickets' wiring: with one handshake and one establishment at
/// a time and no waiting room, a burst of uascale clients is refused with
/// tickets at both stages, echoes them (Hello URL, CreateSession header),
/// and every client ends established. Counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_clients_come_back_with_their_tickets() {
    const CLIENTS: usize = 24;
    let pki = std::env::temp_dir().join(format!("uascale-tickets-{}", std::process::id()));
    let config = ServerConfig {
        server: ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            ..Default::default()
        },
        security: SecurityConfig {
            pki_dir: pki.clone(),
            trust_all_client_certificates: true,
            ..Default::default()
        },
        admission: AdmissionSection {
            max_concurrent_handshakes: Some(1),
            handshake_wait_ms: 0,
            max_concurrent_session_establishment: Some(1),
            establishment_wait_ms: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let (url, state, stop, running) = serve(config);
    let identity = common::client_identity("ticket client");
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let options = ClientOptions {
            security: secured(&identity),
            connect_attempts: 60,
            ..Default::default()
        };
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut report = ConnectReport::default();
            let r = Client::open(&url, options, &format!("ticket {i}"), &mut report).await;
            (r, report)
        }));
    }
    let mut clients = Vec::new();
    let mut busy = 0;
    for t in tasks {
        let (r, report) = t.await.unwrap();
        busy += report.busy_answers;
        clients.push(r.expect("every client ends established"));
    }
    let hs = state
        .admission
        .stage_counts(uascale_server::admission::Stage::Handshake);
    let es = state
        .admission
        .stage_counts(uascale_server::admission::Stage::Establishment);
    println!("tickets: {busy} busy answers; handshake {hs:?}; establishment {es:?}");
    assert!(busy > 0, "the burst was refused at least once");
    let t = |c: &uascale_server::admission::StageCounts| c.tickets;
    assert!(t(&hs).issued + t(&es).issued > 0, "refusals carry tickets");
    // Echoed tickets reached the server, none taken for forged.
    let presented = |c: &uascale_server::admission::StageCounts| {
        c.tickets.honoured + c.tickets.early + c.tickets.replayed
    };
    assert!(presented(&hs) + presented(&es) > 0, "tickets were echoed");
    assert_eq!(t(&hs).forged + t(&es).forged, 0);
    for c in clients {
        c.close().await;
    }
    let _ = stop.send(());
    let _ = running.await;
    let _ = std::fs::remove_dir_all(pki);
}

/// Runs a server of `config` on its task: its URL and state, the sender
/// that stops it and the task.
fn serve(
    config: ServerConfig,
) -> (
    String,
    Arc<uascale_server::ServerState>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let server = Server::bind(config).unwrap();
    let state = Arc::clone(server.state());
    let url = format!("opc.tcp://{}", server.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    (url, state, stop, running)
}
