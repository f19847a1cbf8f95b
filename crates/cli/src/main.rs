//! The `uascale` command.
//!
//! `uascale serve` runs the server; `endpoints`, `browse`, `read`, `write`
//! and `call` are the client commands; `uascale decode` prints a binary
//! message.

mod bench;
mod cert;
mod client_cmd;
mod client_common;
mod client_security;
mod config;
mod subscribe;
mod values;

use std::process::ExitCode;

use uascale_server::admission::host;
use uascale_server::{Server, ServerConfig};
use uascale_types::{decode_message, DecodeLimits, Reader};

const USAGE: &str = "usage: uascale serve [--config FILE] [--print-config] [--host NAME] [--port N]
                     [--bind ADDR] [--nodes N] [--rate-ms MS] [--slow-ms MS]
                     [--isolation-profile NAME] [--nodeset FILE]...
                     [--pki DIR] [--security none|all|ecc] [--metrics ADDR]
                     [--https ADDR]
                     [--log-format text|json]
                     [--cluster nats://HOST:PORT [--node-id ID] [--node-index N]
                                                [--advertise URL]]
                     [--proxy-protocol]
       uascale decode <HEX | @FILE>

  serve    run the OPC UA server on opc.tcp://NAME:N (default
           opc.tcp://localhost:4840, bound to 0.0.0.0); log level from
           RUST_LOG (default info); SIGTERM or Ctrl-C shuts down after
           server.shutdown_delay_s (clients see the countdown), a second
           one at once; --nodes N adds N
           changing load-test nodes, --rate-ms how often demo values change;
           --slow-ms how long the demo's slow asynchronous nodes
           (ns=2;s=Demo.Slow.0..9) take per Read and Write (default 2);
           --isolation-profile sets requests.isolation_profile
           (shared_only, fair_share, balanced, trusted_reservations);
           --nodeset loads a companion NodeSet2 XML file (repeatable, in
           order; added to the config file's server.nodesets);
           --config reads a TOML file (keys as --print-config shows them,
           docs/configuration.md describes them),
           flags override it; --pki DIR is the PKI directory (default ./pki,
           created with a self-signed certificate on first start);
           --security none publishes only the unsecured endpoint (no PKI),
           all every RSA policy in Sign and SignAndEncrypt (the default),
           ecc those and every ECC policy beside them (an ECC certificate
           per curve is created in the PKI next to the RSA one);
           --metrics ADDR serves /metrics (Prometheus), /healthz and /readyz
           over HTTP on ADDR, e.g. 127.0.0.1:9464 (metrics.listen);
           --https ADDR serves opc.https (https-uabinary) on ADDR, e.g.
           0.0.0.0:4843, with the application certificate (https.listen);
           --cluster URL makes this server a node of a cluster mirroring
           its sessions through the NATS JetStream server at URL
           (cluster.url; docs/cluster.md), --node-id its id (cluster.node_id,
           default node-PORT), --node-index the top byte of its subscription
           ids (cluster.node_index, 1..=255, different on each node),
           --advertise the front end's URL its endpoints
           name (cluster.endpoint_url); --proxy-protocol reads a PROXY protocol v2
           header on every connection (cluster.proxy_protocol);
           --log-format json writes one JSON object per event for log
           shippers (default text: coloured only on a terminal and without
           NO_COLOR)
  decode   decode one binary OPC UA service message (the NodeId of its
           encoding followed by the body, as in a MSG chunk) and print it;
           HEX may contain spaces, @FILE reads raw bytes from a file
  --help   after serve, a client command, bench or cert: that group's usage";

/// Every command's usage: `uascale --help` (docs/cli.md is checked
/// against it by `tests/cli_doc.rs`).
fn full_usage() -> String {
    let cert = cert::USAGE.replacen("usage: ", "       ", 1);
    format!("{USAGE}\n{cert}\n\n{}\n{}", client_cmd::USAGE, bench::USAGE)
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if digits.len() % 2 != 0 {
        return Err("hex input has an odd number of digits".into());
    }
    digits
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| {
            let text = std::str::from_utf8(pair).map_err(|_| format!("byte {i}: not hex"))?;
            u8::from_str_radix(text, 16).map_err(|_| format!("byte {i}: {text:?} is not hex"))
        })
        .collect()
}

fn decode(arg: &str) -> Result<String, String> {
    let bytes = match arg.strip_prefix('@') {
        Some(path) => std::fs::read(path).map_err(|e| format!("{path}: {e}"))?,
        None => parse_hex(arg)?,
    };
    let limits = DecodeLimits::default();
    let mut r = Reader::new(&bytes, &limits).map_err(|e| e.to_string())?;
    let msg = decode_message(&mut r).map_err(|e| format!("{e} ({})", e.status_code()))?;
    let mut out = format!("{msg:#?}");
    if r.remaining() > 0 {
        out.push_str(&format!("\n({} bytes after the message)", r.remaining()));
    }
    Ok(out)
}

/// The configuration from defaults, then `--config FILE`, then the other
/// flags, its derived defaults resolved for the CPUs this process may use,
/// validated; and whether to print it instead of serving.
fn serve_config(args: &[&str]) -> Result<(ServerConfig, bool), String> {
    let mut config = ServerConfig::default();
    let mut print = false;
    let mut it = args.iter();
    // The file first, so that flags override it wherever they stand.
    let mut file = None;
    if let Some(pos) = args.iter().position(|a| *a == "--config") {
        let path = args.get(pos + 1).ok_or("--config needs a file")?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        config = config::parse(&text).map_err(|e| format!("{path}: {e}"))?;
        file = Some(path);
    }
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .copied()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match *flag {
            "--host" => config.server.host_name = value("--host")?.to_owned(),
            "--port" => {
                let v = value("--port")?;
                config.server.port = v
                    .parse()
                    .map_err(|_| format!("--port {v:?} is not a port number"))?;
            }
            "--nodes" => {
                let v = value("--nodes")?;
                config.demo.nodes = v
                    .parse()
                    .map_err(|_| format!("--nodes {v:?} is not a count"))?;
            }
            "--rate-ms" => {
                let v = value("--rate-ms")?;
                let ms: u64 = v
                    .parse()
                    .ok()
                    .filter(|m| *m > 0)
                    .ok_or_else(|| format!("--rate-ms {v:?} is not a positive number"))?;
                config.demo.rate = std::time::Duration::from_millis(ms);
            }
            "--slow-ms" => {
                let v = value("--slow-ms")?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--slow-ms {v:?} is not a number of milliseconds"))?;
                config.demo.slow = std::time::Duration::from_millis(ms);
            }
            "--isolation-profile" => {
                config.requests.isolation_profile = value("--isolation-profile")?
                    .parse()
                    .map_err(|e| format!("--isolation-profile: {e}"))?;
            }
            "--bind" => {
                let v = value("--bind")?;
                config.server.bind = v
                    .parse()
                    .map_err(|_| format!("--bind {v:?} is not an IP address"))?;
            }
            "--nodeset" => config.server.nodesets.push(value("--nodeset")?.into()),
            "--config" => {
                value("--config")?;
            }
            "--pki" => config.security.pki_dir = value("--pki")?.into(),
            "--metrics" => {
                let v = value("--metrics")?;
                config.metrics.listen = Some(v.parse().map_err(|_| {
                    format!("--metrics {v:?} is not an address and port (e.g. 127.0.0.1:9464)")
                })?);
            }
            "--https" => {
                let v = value("--https")?;
                config.https.listen = Some(v.parse().map_err(|_| {
                    format!("--https {v:?} is not an address and port (e.g. 0.0.0.0:4843)")
                })?);
            }
            "--cluster" => {
                let v = value("--cluster")?;
                config.cluster.url = Some(v.to_owned());
            }
            "--node-index" => {
                let v = value("--node-index")?;
                config.cluster.node_index = Some(
                    v.parse()
                        .map_err(|_| format!("--node-index {v:?} is not a number 1..=255"))?,
                );
            }
            "--advertise" => config.cluster.endpoint_url = Some(value("--advertise")?.to_owned()),
            "--node-id" => config.cluster.node_id = Some(value("--node-id")?.to_owned()),
            "--proxy-protocol" => config.cluster.proxy_protocol = true,
            "--security" => match value("--security")? {
                // Only the None endpoint: no PKI, no certificate.
                "none" => {
                    config.security.policies.clear();
                    config.security.allow_security_none = true;
                }
                "all" => {
                    config.security.policies =
                        uascale_server::config::SecurityConfig::default().policies;
                }
                "ecc" => {
                    let mut policies = uascale_server::config::SecurityConfig::default().policies;
                    policies.extend(uascale_crypto::policy::SecurityPolicy::ECC);
                    config.security.policies = policies;
                }
                other => return Err(format!("--security {other:?}: give none, all or ecc")),
            },
            "--print-config" => print = true,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    // What is printed, logged and served is the resolved configuration, so
    // the derived defaults can be read (and read back).
    let config = config.resolved(host::usable_cpus());
    config.validate().map_err(|e| match file {
        Some(path) => format!("{path}: {e}"),
        None => e.to_string(),
    })?;
    Ok((config, print))
}

/// How `serve` writes its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines; coloured only on a terminal, and never when
    /// `NO_COLOR` is set (no escape codes in files and pipes).
    Text,
    /// One JSON object per event, for log shippers.
    Json,
}

/// Takes `--log-format FORMAT` out of `serve`'s arguments.
fn log_format<'a>(args: &[&'a str]) -> Result<(LogFormat, Vec<&'a str>), String> {
    let mut format = LogFormat::Text;
    let mut rest = Vec::with_capacity(args.len());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == "--log-format" {
            format = match it.next().copied() {
                Some("text") => LogFormat::Text,
                Some("json") => LogFormat::Json,
                Some(other) => return Err(format!("--log-format {other:?}: give text or json")),
                None => return Err("--log-format needs a value".into()),
            };
        } else {
            rest.push(*a);
        }
    }
    Ok((format, rest))
}

fn serve(config: ServerConfig, format: LogFormat) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match format {
        LogFormat::Text => {
            use std::io::IsTerminal;
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(colour)
                .init();
        }
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
    // At start, before any connection: the most descriptors the host allows.
    let open_files = host::raise_open_files_limit();
    let cpus = host::CpuReport::detect();
    let workers = config.runtime.worker_threads.unwrap_or(cpus.usable);
    let crypto = match config.runtime.crypto_threads {
        0 => "handshake crypto in place, taking turns".to_owned(),
        n => format!("{n} crypto threads"),
    };
    tracing::info!("host: {cpus}; {workers} worker threads, {crypto}; {open_files}");
    // Each session holds a connection, and so a descriptor.
    if let Some(soft) = open_files.soft {
        let wanted = config.server.max_session_count as u64 + 64;
        if soft < wanted {
            tracing::warn!(
                "server.max_session_count = {} cannot fit in the open-files limit of {soft} \
                 (each session holds a connection); new connections will be refused busy \
                 near the limit - raise the hard limit (ulimit -Hn, LimitNOFILE) or lower \
                 max_session_count",
                config.server.max_session_count
            );
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uascale serve: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        tracing::info!(
            "effective configuration:\n{}",
            config::for_log(&config).trim_end()
        );
        let server = match Server::bind(config) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("uascale serve: cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        let addr = server
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        tracing::info!(url = %server.endpoint_url(), %addr, "listening");
        // A first signal plans the shutdown (`server.shutdown_delay_s`):
        // clients see it coming, balancers stop sending new ones. A second
        // one stops at once.
        let state = std::sync::Arc::clone(server.state());
        let shutdown = async move {
            let mut signals = Signals::new();
            let first = signals.next().await;
            let delay = std::time::Duration::from_secs(state.config.server.shutdown_delay_s.into());
            state.shutdown.plan(
                std::time::Instant::now(),
                delay,
                &format!("{first} received: the server is shutting down"),
                None,
            );
            tracing::info!(
                "{first}: shutting down in {} s ({first} again to stop now)",
                delay.as_secs()
            );
            let second = signals.next().await;
            tracing::info!("{second} again: shutting down now");
        };
        match server.run(shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("uascale serve: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGINT (Ctrl-C) and, on Unix, SIGTERM (what service managers and
/// Kubernetes send).
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        Signals {
            #[cfg(unix)]
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok(),
        }
    }

    /// The name of the next signal received.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        if let Some(term) = self.term.as_mut() {
            return tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["decode", input] => match decode(input) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("uascale decode: {e}");
                ExitCode::FAILURE
            }
        },
        [cmd @ ("endpoints" | "browse" | "read" | "write" | "call" | "subscribe" | "shutdown"), rest @ ..] =>
        {
            if rest.iter().any(|a| *a == "-h" || *a == "--help") {
                println!("{USAGE}\n{}", client_cmd::USAGE);
                return ExitCode::SUCCESS;
            }
            client_cmd::run(cmd, rest)
        }
        ["bench", "-h" | "--help"] => {
            println!("{}", bench::USAGE);
            ExitCode::SUCCESS
        }
        ["bench", rest @ ..] => bench::run(rest),
        ["serve", "-h" | "--help"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["serve", rest @ ..] => match log_format(rest).and_then(|(format, rest)| {
            serve_config(&rest).map(|(config, print)| (config, print, format))
        }) {
            Ok((config, true, _)) => {
                print!("{}", config::to_toml(&config));
                ExitCode::SUCCESS
            }
            Ok((config, false, format)) => serve(config, format),
            Err(e) => {
                eprintln!("uascale serve: {e}\n(uascale --help for usage)");
                ExitCode::from(2)
            }
        },
        ["cert", "-h" | "--help"] | ["cert"] => {
            println!("{}", cert::USAGE);
            ExitCode::SUCCESS
        }
        ["cert", rest @ ..] => match cert::run(rest) {
            Ok(text) => {
                print!("{text}");
                if !text.ends_with('\n') {
                    println!();
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("uascale cert: {e}");
                ExitCode::FAILURE
            }
        },
        ["user", "hash"] => match cert::hash_from(&mut std::io::stdin().lock()) {
            Ok(hash) => {
                println!("{hash}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("uascale user hash: {e}");
                ExitCode::FAILURE
            }
        },
        ["-h" | "--help" | "help"] => {
            println!("{}", full_usage());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{}", full_usage());
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_read_request() {
        let mut buf = Vec::new();
        uascale_types::encode_message(&uascale_types::ReadRequest::default(), &mut buf);
        let hex: String = buf.iter().map(|b| format!("{b:02x} ")).collect();
        let out = decode(&hex).unwrap();
        assert!(out.starts_with("ReadRequest"), "{out}");
    }

    #[test]
    fn the_cluster_flags_set_the_section() {
        let (config, _) = serve_config(&[
            "--security",
            "none",
            "--cluster",
            "nats://127.0.0.1:4222",
            "--node-id",
            "n1",
        ])
        .unwrap();
        assert_eq!(config.cluster.url.as_deref(), Some("nats://127.0.0.1:4222"));
        assert_eq!(config.cluster.node_id.as_deref(), Some("n1"));
        let (config, _) = serve_config(&["--security", "none"]).unwrap();
        assert_eq!(config.cluster.url, None, "off by default");
        let e = serve_config(&["--cluster", "127.0.0.1:4222"]).unwrap_err();
        assert!(e.contains("cluster.url"), "{e}");
        let e = serve_config(&["--cluster", "nats://h:1", "--node-id", "a b"]).unwrap_err();
        assert!(e.contains("cluster.node_id"), "{e}");
    }

    #[test]
    fn the_metrics_flag_sets_the_endpoint() {
        let (config, _) =
            serve_config(&["--security", "none", "--metrics", "127.0.0.1:9464"]).unwrap();
        assert_eq!(
            config.metrics.listen,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        let (config, _) = serve_config(&["--security", "none"]).unwrap();
        assert_eq!(config.metrics.listen, None, "off by default");
        let e = serve_config(&["--metrics", "localhost"]).unwrap_err();
        assert!(e.contains("--metrics \"localhost\""), "{e}");
    }

    #[test]
    fn bad_input_is_explained() {
        assert!(decode("abc").unwrap_err().contains("odd"));
        assert!(decode("zz").unwrap_err().contains("not hex"));
        assert!(decode("01 d3").unwrap_err().contains("BadDecodingError"));
    }
}
