//! `bench read`: C connections x M Reads in flight, K values per Read; a
//! warm-up, then a measured window, sampled once a second.
//!
//! The default client (`--client pipeline`) keeps each connection's window
//! in one task ([`uascale_client::net::pipeline`]): the ReadRequest is
//! encoded once per connection and only the ReadResponse's header and
//! value statuses are decoded, so the client costs little next to the
//! server. `--client library` goes through [`Client::read_values`] with M
//! tasks per connection - the cost an application using the library sees.
//! The pipelined client speaks opc.tcp only, so an opc.https URL selects
//! the library client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinHandle;
use uascale_client::net::pipeline::{read_statuses, Pipeline, Template};
use uascale_client::{Client, ClientError};
use uascale_types as t;
use uascale_types::NodeId;

use super::progress::Progress;
use super::report::{Chart, Line};
use super::series::{Interval, ReadPoint};
use super::{list_counts, named, sample_server, Args, Outcome, ServerSample};

/// The options `bench read` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--connections",
    "--inflight",
    "--values-per-read",
    "--node",
    "--warmup-s",
    "--duration-s",
    "--server-pid",
    "--client",
    "--trust-server",
    "--pki",
    "--ignore-hints",
];

/// How the load is generated.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Pipeline,
    Library,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Pipeline => "pipeline",
            Mode::Library => "library",
        }
    }
}

fn lock(m: &Mutex<Interval>) -> MutexGuard<'_, Interval> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn read_value_ids(nodes: &[NodeId]) -> Vec<t::ReadValueId> {
    nodes
        .iter()
        .map(|n| t::ReadValueId {
            node_id: n.clone(),
            attribute_id: t::AttributeId::Value as u32,
            ..Default::default()
        })
        .collect()
}

/// The load of one connection, running until `stop`.
fn spawn_pipeline(
    mut p: Pipeline,
    nodes: Vec<NodeId>,
    window: usize,
    stats: Arc<Mutex<Interval>>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let header = p.request_header();
        let request = t::ReadRequest {
            request_header: header,
            max_age: 0.0,
            timestamps_to_return: t::TimestampsToReturn::Both,
            nodes_to_read: Some(read_value_ids(&nodes)),
        };
        let mut template = match Template::new(&request) {
            Ok(tpl) => tpl,
            Err(e) => {
                lock(&stats).error(e.status_code());
                return;
            }
        };
        let limits = t::DecodeLimits::default();
        let _ = p
            .run(&mut template, window, &stop, |c| {
                let mut iv = lock(&stats);
                match c.result {
                    Ok(body) => match read_statuses(&body, &limits, |s| iv.error(s)) {
                        Ok(n) => iv.read(n, micros(c.latency)),
                        Err(e) => iv.error(e.status_code()),
                    },
                    Err(e) => iv.error(e.status_code()),
                }
            })
            .await;
        p.close().await;
    })
}

/// M tasks calling `read_values` on one shared client until `stop`.
fn spawn_library(
    c: &Arc<Client>,
    nodes: &[NodeId],
    window: usize,
    stats: &Arc<Mutex<Interval>>,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    (0..window)
        .map(|_| {
            let (c, nodes, stats, stop) = (
                Arc::clone(c),
                nodes.to_vec(),
                Arc::clone(stats),
                Arc::clone(stop),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let r = c.read_values(&nodes).await;
                    let mut iv = lock(&stats);
                    match r {
                        Ok(values) => {
                            for v in &values {
                                if let Some(s) = v.status.filter(|s| s.is_bad()) {
                                    iv.error(s);
                                }
                            }
                            iv.read(values.len(), micros(t0.elapsed()));
                        }
                        Err(e) => {
                            iv.error(e.status_code());
                            if matches!(e, ClientError::Closed | ClientError::Channel { .. }) {
                                break;
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

/// Takes what every connection completed since the last call.
fn collect(stats: &[Arc<Mutex<Interval>>]) -> Interval {
    let mut iv = Interval::new();
    for s in stats {
        iv.absorb(&mut lock(s));
    }
    iv
}

fn cores_busy(a: Option<ServerSample>, b: Option<ServerSample>, secs: f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if secs > 0.0 => Some(b.cpu.saturating_sub(a.cpu).as_secs_f64() / secs),
        _ => None,
    }
}

/// Runs `bench read`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    let connections: usize = a.num("--connections", 10)?;
    let inflight: usize = a.num("--inflight", 100)?;
    let per_read: usize = a.num("--values-per-read", 1)?;
    let warmup = a.seconds("--warmup-s", 3.0)?;
    let duration = a.seconds("--duration-s", 5.0)?;
    let pid = a.server_pid()?;
    let every = a.interval()?;
    // The pipelined client speaks opc.tcp only: an opc.https URL selects
    // the library client.
    let https = super::common::is_https(&a.url);
    let mode = match (a.last("--client"), https) {
        (None, true) | (Some("library"), _) => Mode::Library,
        (None | Some("pipeline"), false) => Mode::Pipeline,
        (Some("pipeline"), true) => {
            return Err(format!(
                "--client pipeline speaks opc.tcp only; {} takes --client library \
                 (the default for an opc.https URL)",
                a.url
            ))
        }
        (Some(other), _) => return Err(format!("--client {other:?}: one of pipeline, library")),
    };
    if connections == 0 || inflight == 0 || per_read == 0 || duration.is_zero() {
        return Err(
            "--connections, --inflight, --values-per-read and --duration-s must be > 0".into(),
        );
    }
    let nodes: Vec<NodeId> = match a.flags.get("--node") {
        None => vec![NodeId::ns0(2258)],
        Some(v) => v
            .iter()
            .map(|n| n.parse().map_err(|e| format!("--node {n:?}: {e}")))
            .collect::<Result<_, String>>()?,
    };
    let read_nodes: Vec<NodeId> = nodes.iter().cycle().take(per_read).cloned().collect();

    let transport = super::common::transport_options(a)?;
    let mut progress = Progress::new();
    let stats: Vec<Arc<Mutex<Interval>>> = (0..connections)
        .map(|_| Arc::new(Mutex::new(Interval::new())))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for (i, s) in stats.iter().enumerate() {
        progress.update(
            "connect",
            i as f64 / connections as f64,
            &format!("{i}/{connections} sessions on {}", a.url),
        );
        match mode {
            Mode::Pipeline => {
                let mut p = Pipeline::connect(&a.url, transport.clone())
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                p.create_session("uascale bench read")
                    .await
                    .map_err(|e| format!("session: {e}"))?;
                tasks.push(spawn_pipeline(
                    p,
                    read_nodes.clone(),
                    inflight,
                    Arc::clone(s),
                    Arc::clone(&stop),
                ));
            }
            Mode::Library => {
                let mut options = transport.clone();
                // A flooder that does not wait out busy answers' hints.
                options.hold_after_busy = a.last("--ignore-hints").is_none();
                let c = Client::connect(&a.url, options)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                c.create_session("uascale bench read")
                    .await
                    .map_err(|e| format!("session: {e}"))?;
                let c = Arc::new(c);
                tasks.extend(spawn_library(&c, &read_nodes, inflight, s, &stop));
                clients.push(c);
            }
        }
    }

    // The phases, sampled once a second.
    let load_start = Instant::now();
    drop(collect(&stats));
    let mut series: Vec<ReadPoint> = Vec::new();
    let mut total = Interval::new();
    let mut measured = Duration::ZERO;
    let (mut server_start, mut server_end) = (None, None);
    for (phase, length) in [("warm-up", warmup), ("measure", duration)] {
        if length.is_zero() {
            continue;
        }
        let start = Instant::now();
        let end = start + length;
        let mut prev_t = start;
        let mut prev_server = pid.and_then(sample_server);
        if phase == "measure" {
            server_start = prev_server;
        }
        while prev_t < end {
            let next = (prev_t + every).min(end);
            tokio::time::sleep_until(next.into()).await;
            let mut iv = collect(&stats);
            let at = Instant::now();
            let secs = at.duration_since(prev_t).as_secs_f64();
            let server = pid.and_then(sample_server);
            let point = ReadPoint::new(
                at.duration_since(load_start).as_secs_f64(),
                phase,
                secs,
                &iv,
                cores_busy(prev_server, server, secs),
            );
            progress.update(
                phase,
                at.duration_since(start).as_secs_f64() / length.as_secs_f64(),
                &format!(
                    "{:.0} reads/s, p99 {:.3} ms, {} errors",
                    point.reads_per_s,
                    point.latency_p99_ms.unwrap_or(0.0),
                    point.errors
                ),
            );
            series.push(point);
            if phase == "measure" {
                total.absorb(&mut iv);
                measured += at.duration_since(prev_t);
                server_end = server;
            }
            prev_t = at;
            prev_server = server;
        }
    }
    progress.finish();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    for c in &clients {
        c.close().await;
    }

    let secs = measured.as_secs_f64().max(1e-9);
    let reads = total.reads;
    let server = match (server_start, server_end) {
        (Some(b), Some(e)) if reads > 0 => Some((
            e.cpu.saturating_sub(b.cpu).as_secs_f64() * 1e6 / reads as f64,
            e.cpu.saturating_sub(b.cpu).as_secs_f64() / secs,
            e.rss_bytes,
        )),
        _ => None,
    };
    let hist = &total.latency_us;
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    let errors = named(&total.errors);
    let total_errors: u64 = errors.values().sum();
    let json = json!({
        "bench": "read",
        "command": a.command_line(),
        "url": a.url,
        "client": mode.name(),
        "connections": connections,
        "inflight": inflight,
        "values_per_read": per_read,
        "warmup_s": warmup.as_secs_f64(),
        "duration_s": secs,
        "reads": reads,
        "reads_per_s": reads as f64 / secs,
        "values_per_s": total.values as f64 / secs,
        "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "max": hist.max() as f64 / 1000.0},
        "errors": errors,
        "server_cpu_us_per_read": server.map(|s| s.0),
        "server_cores_busy": server.map(|s| s.1),
        "server_rss_bytes": server.map(|s| s.2),
        "series": series,
    });
    let mut rows = vec![
        ("client".to_owned(), mode.name().to_owned()),
        ("reads/s".to_owned(), format!("{:.0}", reads as f64 / secs)),
        (
            "values/s".to_owned(),
            format!("{:.0}", total.values as f64 / secs),
        ),
        ("reads".to_owned(), reads.to_string()),
        (
            "latency ms".to_owned(),
            format!(
                "p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
                q(0.5),
                q(0.9),
                q(0.99),
                q(0.999),
                hist.max() as f64 / 1000.0
            ),
        ),
        (
            "errors".to_owned(),
            if total_errors == 0 {
                "0".to_owned()
            } else {
                format!("{total_errors} ({})", list_counts(&errors))
            },
        ),
    ];
    if let Some((us, cores, rss)) = server {
        rows.push((
            "server CPU".to_owned(),
            format!(
                "{us:.2} us/Read ({:.3} us/value, {cores:.2} cores busy)",
                us / per_read as f64
            ),
        ));
        rows.push((
            "server RSS".to_owned(),
            format!("{:.1} MB", rss as f64 / 1e6),
        ));
    }
    let measure_from = series
        .iter()
        .find(|p| p.phase == "measure")
        .map(|p| p.t_s - p.interval_s);
    let shade = measure_from
        .filter(|&t| t > 0.0)
        .map(|t| (0.0, t, "warm-up".to_owned()));
    let xy = |f: &dyn Fn(&ReadPoint) -> Option<f64>| -> Vec<(f64, f64)> {
        series
            .iter()
            .filter_map(|p| f(p).map(|v| (p.t_s, v)))
            .collect()
    };
    let charts = vec![
        Chart {
            title: "Throughput".into(),
            y_label: "Reads/s".into(),
            lines: vec![Line {
                key: "reads_per_s".into(),
                label: "Reads/s".into(),
                points: xy(&|p| Some(p.reads_per_s)),
            }],
            shade: shade.clone(),
        },
        Chart {
            title: "Latency".into(),
            y_label: "ms".into(),
            lines: vec![
                Line {
                    key: "latency_p50_ms".into(),
                    label: "p50".into(),
                    points: xy(&|p| p.latency_p50_ms),
                },
                Line {
                    key: "latency_p99_ms".into(),
                    label: "p99".into(),
                    points: xy(&|p| p.latency_p99_ms),
                },
            ],
            shade,
        },
    ];
    Ok(Outcome {
        title: format!(
            "bench read  {}  {connections} conn x {inflight} in flight, {per_read} value(s)/Read, {secs:.1} s after {:.1} s warm-up",
            a.url,
            warmup.as_secs_f64()
        ),
        rows,
        json,
        charts,
    })
}
