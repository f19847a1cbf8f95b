//! `bench fairness`: F flooding clients keep W Reads in flight each while V
//! victims read one at a time, all on the same node (by default uascale's
//! slow asynchronous `ns=2;s=Demo.Slow.0`): what each client completes
//! per second, how often it is refused, and the latency of what it
//! completes. Run it against servers with different `isolation_profile`s
//! to see who waits behind whom (docs/notebook/benchmarks.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::json;
use uascale_client::net::pipeline::{read_statuses, Pipeline, Template};
use uascale_client::{ClientError, ClientOptions};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode};

use super::progress::Progress;
use super::series::Interval;
use super::{list_counts, named, sample_server, Args, Outcome};

/// The options `bench fairness` takes (besides `--json` and `--report`).
pub const FLAGS: &[&str] = &[
    "--flooders",
    "--flood-inflight",
    "--victims",
    "--node",
    "--warmup-s",
    "--duration-s",
    "--server-pid",
];

fn lock(m: &Mutex<Interval>) -> MutexGuard<'_, Interval> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One client's load until `stop`: `window` Reads of `node` in flight.
async fn load(
    url: String,
    node: NodeId,
    window: usize,
    stats: Arc<Mutex<Interval>>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut p = Pipeline::connect(&url, ClientOptions::default())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    p.create_session("uascale bench fairness")
        .await
        .map_err(|e| format!("session: {e}"))?;
    let request = t::ReadRequest {
        request_header: p.request_header(),
        max_age: 0.0,
        timestamps_to_return: t::TimestampsToReturn::Both,
        nodes_to_read: Some(vec![t::ReadValueId {
            node_id: node,
            attribute_id: t::AttributeId::Value as u32,
            ..Default::default()
        }]),
    };
    let mut template = Template::new(&request).map_err(|e| format!("encode: {e}"))?;
    let limits = t::DecodeLimits::default();
    let _ = p
        .run(&mut template, window, &stop, |c| {
            let mut iv = lock(&stats);
            match c.result {
                Ok(body) => match read_statuses(&body, &limits, |s| iv.error(s)) {
                    Ok(n) => iv.read(n, u64::try_from(c.latency.as_micros()).unwrap_or(u64::MAX)),
                    Err(e) => iv.error(e.status_code()),
                },
                Err(ClientError::Timeout) => iv.error(StatusCode::BadTimeout),
                Err(e) => iv.error(e.status_code()),
            }
        })
        .await;
    p.close().await;
    Ok(())
}

/// The summary of one role (flood or victim), per client.
fn role(name: &str, clients: &[Interval], secs: f64) -> (Vec<(String, String)>, serde_json::Value) {
    let mut total = Interval::new();
    let mut per_client = Vec::new();
    for c in clients {
        per_client.push(c.reads as f64 / secs);
        let mut copy = Interval::new();
        copy.reads = c.reads;
        copy.values = c.values;
        copy.errors = c.errors.clone();
        let _ = copy.latency_us.add(&c.latency_us);
        total.absorb(&mut copy);
    }
    let busy = total
        .errors
        .get(&StatusCode::BadServerTooBusy)
        .copied()
        .unwrap_or(0);
    let pct =
        |q: f64| (total.reads > 0).then(|| total.latency_us.value_at_quantile(q) as f64 / 1000.0);
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2} ms"));
    let min = per_client.iter().copied().fold(f64::INFINITY, f64::min);
    let max = per_client.iter().copied().fold(0.0f64, f64::max);
    let rows = vec![
        (
            format!("{name}: Reads/s per client"),
            format!(
                "{:.0} (min {:.0}, max {:.0}, {} clients)",
                total.reads as f64 / secs / clients.len().max(1) as f64,
                if min.is_finite() { min } else { 0.0 },
                max,
                clients.len()
            ),
        ),
        (
            format!("{name}: busy answers/s"),
            format!("{:.0}", busy as f64 / secs),
        ),
        (
            format!("{name}: latency p50 / p99 / max"),
            format!(
                "{} / {} / {}",
                show(pct(0.5)),
                show(pct(0.99)),
                show((total.reads > 0).then(|| total.latency_us.max() as f64 / 1000.0))
            ),
        ),
        (
            format!("{name}: errors"),
            list_counts(&named(&total.errors)),
        ),
    ];
    let json = json!({
        "clients": clients.len(),
        "reads": total.reads,
        "reads_per_s_per_client": per_client,
        "busy_answers": busy,
        "errors": named(&total.errors),
        "latency_p50_ms": pct(0.5),
        "latency_p99_ms": pct(0.99),
    });
    (rows, json)
}

/// Runs `bench fairness`.
pub async fn run(a: &Args) -> Result<Outcome, String> {
    super::common::tcp_only(
        a,
        "its load is the pipelined client's (one task per connection keeping \
         W Reads in flight), which speaks opc.tcp only",
    )?;
    let flooders: usize = a.num("--flooders", 1)?;
    let window: usize = a.num("--flood-inflight", 500)?;
    let victims: usize = a.num("--victims", 1)?;
    let warmup = a.seconds("--warmup-s", 2.0)?;
    let duration = a.seconds("--duration-s", 10.0)?;
    let pid = a.server_pid()?;
    if flooders == 0 || window == 0 || victims == 0 || duration.is_zero() {
        return Err("--flooders, --flood-inflight, --victims and --duration-s must be > 0".into());
    }
    let node: NodeId = match a.last("--node") {
        None => NodeId::string(2, "Demo.Slow.0"),
        Some(n) => n.parse().map_err(|e| format!("--node {n:?}: {e}"))?,
    };
    let mut progress = Progress::new();
    let stop = Arc::new(AtomicBool::new(false));
    let mut stats = Vec::new();
    let mut tasks = Vec::new();
    for (i, w) in std::iter::repeat_n(window, flooders)
        .chain(std::iter::repeat_n(1, victims))
        .enumerate()
    {
        let s = Arc::new(Mutex::new(Interval::new()));
        stats.push(Arc::clone(&s));
        tasks.push(tokio::spawn(load(
            a.url.clone(),
            node.clone(),
            w,
            s,
            Arc::clone(&stop),
        )));
        progress.update(
            "connect",
            i as f64 / (flooders + victims) as f64,
            &format!("client {} of {}", i + 1, flooders + victims),
        );
    }
    tokio::time::sleep(warmup).await;
    for s in &stats {
        *lock(s) = Interval::new();
    }
    let server_start = pid.and_then(sample_server);
    let start = Instant::now();
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await;
        progress.update(
            "measure",
            start.elapsed().as_secs_f64() / duration.as_secs_f64(),
            "",
        );
    }
    let taken: Vec<Interval> = stats
        .iter()
        .map(|s| std::mem::replace(&mut *lock(s), Interval::new()))
        .collect();
    let secs = start.elapsed().as_secs_f64();
    let server_end = pid.and_then(sample_server);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        match t.await {
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(format!("a client task failed: {e}")),
            Ok(Ok(())) => {}
        }
    }
    progress.finish();
    let (flood_rows, flood_json) = role("flood", &taken[..flooders], secs);
    let (victim_rows, victim_json) = role("victim", &taken[flooders..], secs);
    let mut rows = vec![
        ("node".into(), node.to_string()),
        (
            "shape".into(),
            format!(
                "{flooders} flooder(s) x {window} in flight, {victims} victim(s) x 1, {secs:.1} s measured"
            ),
        ),
    ];
    rows.extend(flood_rows);
    rows.extend(victim_rows);
    let server = match (server_start, server_end) {
        (Some(a), Some(b)) => {
            let cores = b.cpu.saturating_sub(a.cpu).as_secs_f64() / secs;
            rows.push((
                "server".into(),
                format!(
                    "{cores:.2} cores busy, RSS {:.1} MB",
                    b.rss_bytes as f64 / 1e6
                ),
            ));
            json!({"cores_busy": cores, "rss_bytes": b.rss_bytes})
        }
        _ => serde_json::Value::Null,
    };
    Ok(Outcome {
        title: format!("bench fairness against {}", a.url),
        rows,
        json: json!({
            "bench": "fairness",
            "url": a.url,
            "node": node.to_string(),
            "seconds": secs,
            "flood": flood_json,
            "victim": victim_json,
            "server": server,
        }),
        charts: Vec::new(),
    })
}
