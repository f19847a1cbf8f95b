//! opc.https (https-uabinary) end to end: uascale's client against the
//! server's HTTPS listener for every service family and a subscription;
//! the HTTP errors with curl; 429 with Retry-After under a flood, honoured
//! by the client while another session goes on; a flood of concurrent
//! Reads that ignores the hints beside session establishment, a
//! subscription and a CloseSession; a TLS certificate of its own
//! (`[https] certificate`); and asyncua's encoder over Python's own HTTP
//! client (tests/interop/https_asyncua.py), bytes checked both ways.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use uascale_client::{
    Client, ClientOptions, MonitorItem, Notification, SecurityOptions, ServerTrust,
    SubscriptionEvent, SubscriptionSettings, UserIdentity,
};
use uascale_server::config::{DemoSection, HttpsSection, SecurityConfig, ServerSection};
use uascale_server::shed::{Reason, Stage};
use uascale_server::state::ServerState;
use uascale_server::{Server, ServerConfig};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode, Variant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A temporary PKI directory (the TLS certificate is the application
/// certificate it creates).
fn pki_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uascale-https-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(name: &str, https: HttpsSection) -> ServerConfig {
    let mut security = SecurityConfig::none_only();
    security.pki_dir = pki_dir(name);
    ServerConfig {
        server: ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            ..Default::default()
        },
        demo: DemoSection {
            rate: Duration::from_millis(50),
            ..Default::default()
        },
        security,
        https: HttpsSection {
            listen: Some("127.0.0.1:0".parse().expect("address")),
            ..https
        },
        ..Default::default()
    }
}

/// Starts a server; its HTTPS address and state.
async fn start(name: &str, https: HttpsSection) -> (SocketAddr, Arc<ServerState>) {
    serve(config(name, https))
}

/// A server of `config` on its task: its opc.https address and state.
fn serve(config: ServerConfig) -> (SocketAddr, Arc<ServerState>) {
    let server = Server::bind(config).expect("server binds");
    let addr = server.https_addr().expect("https listening");
    let state = Arc::clone(server.state());
    tokio::spawn(server.run(std::future::pending()));
    (addr, state)
}

/// The server's application certificate.
fn application_certificate(state: &ServerState) -> uascale_crypto::x509::Certificate {
    state
        .security
        .identity
        .as_ref()
        .expect("the application certificate")
        .certificate()
        .clone()
}

fn options() -> ClientOptions {
    ClientOptions {
        security: SecurityOptions {
            trust: ServerTrust::UnsafeAcceptAny,
            ..Default::default()
        },
        reconnect: false,
        ..Default::default()
    }
}

fn demo(path: &str) -> NodeId {
    NodeId::string(2, path)
}

/// A subscription at 100 ms monitoring the demo counter.
async fn counter_subscription(client: &Client) -> uascale_client::Subscription {
    let sub = client
        .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(
            100,
        )))
        .await
        .expect("subscribe");
    sub.monitor(vec![MonitorItem::value(demo("Demo.Dynamic.Counter"))])
        .await
        .expect("monitor");
    sub
}

/// Subscribes to the demo counter at 100 ms and waits for three of its
/// data changes, reading the server's time after each message: the Reads
/// pass while the subscription's Publishes are held.
async fn three_changes_with_reads_between(client: &Client) {
    let mut sub = counter_subscription(client).await;
    three_changes(&mut sub, Duration::from_secs(10), Some(client)).await;
}

/// Waits for three data changes on `sub`, each message within `limit`,
/// reading the server's time with `reads` (if given) after each message.
async fn three_changes(
    sub: &mut uascale_client::Subscription,
    limit: Duration,
    reads: Option<&Client>,
) {
    let mut changes = 0;
    while changes < 3 {
        let event = tokio::time::timeout(limit, sub.recv())
            .await
            .expect("notifications within the limit")
            .expect("the stream goes on");
        match event {
            SubscriptionEvent::Notifications { notifications, .. } => {
                changes += notifications
                    .iter()
                    .filter(|n| matches!(n, Notification::DataChange { .. }))
                    .count();
                if let Some(client) = reads {
                    client
                        .read_values(&[NodeId::ns0(2258)])
                        .await
                        .expect("Read beside held Publishes");
                }
            }
            SubscriptionEvent::KeepAlive { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_a_subscription_over_https() {
    let (addr, state) = start("services", HttpsSection::default()).await;
    let url = format!("opc.https://{addr}/");

    // The TLS certificate is judged: without any trust the connect fails.
    let refused = Client::connect(&url, ClientOptions::default())
        .await
        .expect_err("untrusted TLS certificate");
    assert_eq!(
        refused.status_code(),
        StatusCode::BadCertificateUntrusted,
        "{refused:?}"
    );

    let client = Client::connect(&url, options()).await.expect("connect");
    let endpoints = client.get_endpoints().await.expect("GetEndpoints");
    let https: Vec<_> = endpoints
        .iter()
        .filter(|e| {
            e.transport_profile_uri.as_str()
                == Some("http://opcfoundation.org/UA-Profile/Transport/https-uabinary")
        })
        .collect();
    assert_eq!(https.len(), 1, "{endpoints:?}");
    assert_eq!(
        https[0].endpoint_url.as_str(),
        Some(url.as_str()),
        "the URL the client used"
    );
    assert!(endpoints
        .iter()
        .any(|e| e.endpoint_url.as_str_or_empty().starts_with("opc.tcp://")));

    let created = client.create_session("https").await.expect("session");
    let token = created.authentication_token.clone();
    assert!(
        matches!(&token.identifier, t::Identifier::Opaque(b) if b.as_bytes().is_some_and(|b| b.len() >= 32)),
        "the token is 32 random bytes or more: {token:?}"
    );

    let values = client
        .read_values(&[NodeId::ns0(2259)])
        .await
        .expect("Read");
    assert_eq!(values[0].value, Some(Variant::Int32(0)), "Running");

    let statuses = client
        .write(vec![t::WriteValue {
            node_id: demo("Demo.Static.Scalar.Int32"),
            attribute_id: t::AttributeId::Value as u32,
            value: t::DataValue::value(Variant::Int32(-7)),
            ..Default::default()
        }])
        .await
        .expect("Write");
    assert_eq!(statuses, vec![StatusCode::Good]);
    let back = client
        .read_values(&[demo("Demo.Static.Scalar.Int32")])
        .await
        .expect("Read back");
    assert_eq!(back[0].value, Some(Variant::Int32(-7)));

    let refs = client
        .browse(t::BrowseDescription {
            node_id: NodeId::ns0(85),
            browse_direction: t::BrowseDirection::Forward,
            reference_type_id: NodeId::ns0(33),
            include_subtypes: true,
            result_mask: 63,
            ..Default::default()
        })
        .await
        .expect("Browse");
    assert!(refs
        .iter()
        .any(|r| r.browse_name.name.as_str() == Some("Server")));

    let results = client
        .call(vec![t::CallMethodRequest {
            object_id: demo("Demo.Methods"),
            method_id: demo("Demo.Methods.Add"),
            input_arguments: Some(vec![Variant::Double(1.25), Variant::Double(2.5)]),
        }])
        .await
        .expect("Call");
    assert_eq!(
        results[0].output_arguments,
        Some(vec![Variant::Double(3.75)])
    );

    // A subscription: its Publishes are held while Reads go on beside.
    three_changes_with_reads_between(&client).await;

    // HTTP/2 (offered first): the held Publishes and the Reads beside
    // them were streams of the client's one connection (the other
    // accepted one is the untrusted connect above).
    assert_eq!(
        state.metrics.connections_accepted(),
        2,
        "one HTTP/2 connection carried the session"
    );

    // Sessions of different clients never mix: another client's session
    // is not this one's, and a forged token is refused.
    let other = Client::connect(&url, options()).await.expect("connect");
    let second = other.create_session("other").await.expect("session");
    assert_ne!(second.authentication_token, token);
    assert_ne!(second.session_id, created.session_id);
    other.close().await;

    client.close().await;
    assert_eq!(state.sessions.len(), 0, "both sessions closed");
}

/// Runs curl against the listener: the HTTP status code it got.
fn curl(addr: SocketAddr, args: &[&str]) -> String {
    curl_at(addr, "/", "%{http_code}", args)
}

/// Runs curl against `path` of the listener: what `-w format` printed.
fn curl_at(addr: SocketAddr, path: &str, format: &str, args: &[&str]) -> String {
    let out = Command::new("curl")
        .args([
            "-k",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            format,
            "--max-time",
            "10",
        ])
        .args(args)
        .arg(format!("https://{addr}{path}"))
        .output()
        .expect("curl runs (the HTTP error tests use it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The per-address bucket over real sockets: session-less requests
/// (GetEndpoints) from one address are not charged while session
/// establishment has room, and are once a created, unactivated session
/// holds half its places: then the bucket's burst passes and the next is
/// 429, counted at stage `https` with reason `address_rate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_address_bucket_applies_while_establishment_is_contended() {
    let mut config = config(
        "address",
        HttpsSection {
            address_rate: 1,
            address_burst: 2,
            ..Default::default()
        },
    );
    config.admission.max_concurrent_session_establishment = Some(2);
    let dir = config.security.pki_dir.clone();
    let (addr, state) = serve(config);
    let body = |name: &str, m: &dyn t::DynStructure| {
        let mut out = Vec::new();
        t::encode_message(m, &mut out);
        let path = dir.join(name);
        std::fs::write(&path, out).expect("a request body");
        format!("@{}", path.display())
    };
    let endpoints = body("get-endpoints.bin", &t::GetEndpointsRequest::default());
    let create = body(
        "create-session.bin",
        &t::CreateSessionRequest {
            requested_session_timeout: 60_000.0,
            ..Default::default()
        },
    );
    let post = |file: &str| {
        curl(
            addr,
            &[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/octet-stream",
                "--data-binary",
                file,
            ],
        )
    };
    for _ in 0..5 {
        assert_eq!(post(&endpoints), "200", "uncontended: not charged");
    }
    assert_eq!(
        state.metrics.shed_count(Stage::Https, Reason::AddressRate),
        0
    );
    // A session created and never activated holds one of the two places.
    assert_eq!(post(&create), "200");
    // The burst of 2 passes, then 429 (a token refills each second, so a
    // slow machine may see a third 200 before it).
    let answers: Vec<String> = (0..8).map(|_| post(&endpoints)).collect();
    let first_refused = answers.iter().position(|a| a == "429");
    assert!(
        matches!(first_refused, Some(2..=4)),
        "contended: {answers:?}"
    );
    assert!(state.metrics.shed_count(Stage::Https, Reason::AddressRate) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_with_curl() {
    let (addr, _state) = start(
        "errors",
        HttpsSection {
            max_body_size: 2048,
            ..Default::default()
        },
    )
    .await;
    // Each error over HTTP/1.1 and over HTTP/2 (which curl negotiates by
    // ALPN when asked to).
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let post = |ct: &str, body: &str| {
            vec![
                flag.to_owned(),
                "-X".to_owned(),
                "POST".to_owned(),
                "-H".to_owned(),
                format!("Content-Type: {ct}"),
                "--data-binary".to_owned(),
                body.to_owned(),
            ]
        };
        let status = |args: Vec<String>| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            curl(addr, &args)
        };
        assert_eq!(
            curl_at(addr, "/", "%{http_version}", &[flag]),
            version,
            "the HTTP version curl got"
        );
        // GET: 405.
        assert_eq!(curl(addr, &[flag]), "405", "{flag}");
        // The wrong content type: 415; a gzip body: 415.
        assert_eq!(status(post("text/plain", "x")), "415", "{flag}");
        let mut gz = post("application/octet-stream", "x");
        gz.extend(["-H".to_owned(), "Content-Encoding: gzip".to_owned()]);
        assert_eq!(status(gz), "415", "{flag}");
        // A body that is not a request: 400.
        assert_eq!(
            status(post("application/octet-stream", "not a request")),
            "400",
            "{flag}"
        );
        // Over max_body_size: 413.
        let big = "a".repeat(4096);
        assert_eq!(
            status(post("application/octet-stream", &big)),
            "413",
            "{flag}"
        );
        // Another path: 404.
        let args = post("application/octet-stream", "x");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(
            curl_at(addr, "/other", "%{http_code}", &args),
            "404",
            "{flag}"
        );
        // An unknown security policy: 400.
        let mut policy = post("application/octet-stream", "x");
        policy.extend(["-H".to_owned(), "OPCUA-SecurityPolicy: urn:nope".to_owned()]);
        assert_eq!(status(policy), "400", "{flag}");
    }
    // Over HTTP/2 an error ends only its stream: a second request goes on
    // the same connection (curl reuses it: no new connect).
    let out = Command::new("curl")
        .args(["-k", "-s", "--http2", "--max-time", "10", "-X", "POST"])
        .args(["-H", "Content-Type: application/octet-stream"])
        .args(["--data-binary", "x", "-w", "%{http_code}:%{num_connects} "])
        .args(["-o", "/dev/null", "-o", "/dev/null"])
        .arg(format!("https://{addr}/other"))
        .arg(format!("https://{addr}/"))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404:1 400:0 ");
}

/// With `[https] http2 = false` the server offers HTTP/1.1 only, and
/// uascale's client keeps its held Publishes on a pool of connections
/// while its Reads go over another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_the_client_pools_connections() {
    let (addr, state) = start(
        "http1",
        HttpsSection {
            http2: false,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(curl_at(addr, "/", "%{http_version}", &[]), "1.1");
    let url = format!("opc.https://{addr}/");
    let client = Client::connect(&url, options()).await.expect("connect");
    client.create_session("http1").await.expect("session");
    three_changes_with_reads_between(&client).await;
    // The curl probe, the first connection, and at least one more for
    // the Reads while a Publish was held.
    assert!(
        state.metrics.connections_accepted() >= 3,
        "accepted {}",
        state.metrics.connections_accepted()
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_gets_429_and_the_client_honours_retry_after() {
    let (addr, state) = start(
        "flood",
        HttpsSection {
            session_rate: 2,
            session_burst: 4,
            ..Default::default()
        },
    )
    .await;
    let url = format!("opc.https://{addr}/");
    let flooder = Client::connect(&url, options()).await.expect("connect");
    flooder.create_session("flooder").await.expect("session");
    // Subscribed before the flood (two of its four tokens).
    let mut sub = counter_subscription(&flooder).await;
    let calm = Client::connect(&url, options()).await.expect("connect");
    calm.create_session("calm").await.expect("session");

    let mut busy = None;
    for _ in 0..50 {
        match flooder.read_values(&[NodeId::ns0(2258)]).await {
            Ok(_) => {}
            Err(e) => {
                busy = Some(e);
                break;
            }
        }
    }
    let busy = busy.expect("the flood is refused");
    assert_eq!(busy.status_code(), StatusCode::BadServerTooBusy, "{busy:?}");
    let hint = busy.retry_after_ms().expect("a hint");
    assert!(
        hint >= 1000,
        "Retry-After (whole seconds) is the floor: {hint}"
    );
    let shed = state.metrics.shed_count(Stage::Https, Reason::SessionRate);
    assert_eq!(shed, 1, "counted once");

    // Another session is not starved by the flood.
    calm.read_values(&[NodeId::ns0(2258)])
        .await
        .expect("the calm session reads");

    // The flooder's next Read waits out the hint rather than being sent
    // into a refusal: it succeeds and nothing more is shed.
    flooder
        .read_values(&[NodeId::ns0(2258)])
        .await
        .expect("after Retry-After the Read passes");
    assert_eq!(
        state.metrics.shed_count(Stage::Https, Reason::SessionRate),
        shed,
        "the client held back while the hint ran"
    );
    // Its own Publishes are not charged either: its subscription's
    // notifications keep coming while its Reads are refused.
    let mut refused = false;
    for _ in 0..50 {
        if flooder.read_values(&[NodeId::ns0(2258)]).await.is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "the flood is refused again");
    let mut changes = 0;
    while changes == 0 {
        let event = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .expect("notifications go on while the bucket is empty")
            .expect("the stream goes on");
        if let SubscriptionEvent::Notifications { notifications, .. } = event {
            changes += notifications
                .iter()
                .filter(|n| matches!(n, Notification::DataChange { .. }))
                .count();
        }
    }
    // CloseSession is never charged (nor held back by the client): it
    // passes at once with the bucket empty.
    let before = state.sessions.len();
    flooder.close().await;
    assert_eq!(state.sessions.len(), before - 1, "CloseSession passed");
    calm.close().await;
    assert_eq!(state.sessions.len(), 0, "both sessions closed");
}

/// One session floods - 80 Reads in flight at once, each sent again as
/// soon as it is answered, hints ignored (`hold_after_busy` off) - of a
/// slow node that holds one of the server's two workers 20 ms, so its
/// Reads pile up in the request queue to its per-owner share and past
/// it, and its session's bucket empties: it gets 429s. Meanwhile,
/// answered through the same queue in their own lanes: a new client
/// creates and activates a session, another session's subscription goes
/// on delivering its data changes, and a third session's CloseSession
/// passes. Outcomes only, each with a generous timeout; the flood is
/// stopped when they are done (at most a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_flood_starves_neither_establishment_nor_publishes_nor_close() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut config = config("concurrent", HttpsSection::default());
    config.requests.min_request_thread_count = 2;
    config.requests.max_request_thread_count = 2;
    config.demo.slow = Duration::from_millis(20);
    let (addr, state) = serve(config);
    let url = format!("opc.https://{addr}/");
    let limit = Duration::from_secs(30);

    // Before the flood: the subscriber and the session to close.
    let subscriber = Client::connect(&url, options()).await.expect("connect");
    subscriber
        .create_session("subscriber")
        .await
        .expect("session");
    let mut sub = counter_subscription(&subscriber).await;
    let closer = Client::connect(&url, options()).await.expect("connect");
    closer.create_session("closer").await.expect("session");

    let flooder = ClientOptions {
        hold_after_busy: false,
        ..options()
    };
    let flooder = Arc::new(Client::connect(&url, flooder).await.expect("connect"));
    flooder.create_session("flooder").await.expect("session");
    assert_eq!(state.sessions.len(), 3);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for _ in 0..80 {
        let (flooder, stop, served, busy) = (
            Arc::clone(&flooder),
            Arc::clone(&stop),
            Arc::clone(&served),
            Arc::clone(&busy),
        );
        flood.push(tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < deadline {
                match flooder.read_values(&[demo("Demo.Slow.0")]).await {
                    Ok(_) => served.fetch_add(1, Ordering::Relaxed),
                    Err(e) if e.status_code() == StatusCode::BadServerTooBusy => {
                        busy.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => panic!("the flooder's Read: {e:?}"),
                };
            }
        }));
    }
    // The flood is on once it is refused.
    tokio::time::timeout(limit, async {
        while busy.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the flood gets 429s");
    let busy_before = busy.load(Ordering::Relaxed);

    // Establishment is not starved: a new client's CreateSession and
    // ActivateSession, then a Read.
    let newcomer = tokio::time::timeout(limit, async {
        let c = Client::connect(&url, options()).await.expect("connect");
        c.create_session("newcomer")
            .await
            .expect("a session amid the flood");
        c.read_values(&[NodeId::ns0(2259)])
            .await
            .expect("the newcomer reads");
        c
    })
    .await
    .expect("a session established within 30 s");
    assert_eq!(state.sessions.len(), 4);

    // Publishes are not starved: three data changes keep coming.
    three_changes(&mut sub, limit, None).await;

    // CloseSession passes.
    tokio::time::timeout(limit, closer.close())
        .await
        .expect("CloseSession answered within 30 s");
    assert_eq!(state.sessions.len(), 3, "the closer's session is gone");

    // All of it while the flooder was being refused.
    assert!(
        busy.load(Ordering::Relaxed) > busy_before,
        "the flood went on meanwhile"
    );
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        tokio::time::timeout(limit, task)
            .await
            .expect("the flood stops")
            .expect("a flooding task");
    }
    assert!(
        served.load(Ordering::Relaxed) > 0,
        "some of the flood is served"
    );
    let refused = state.metrics.shed_count(Stage::Https, Reason::SessionRate)
        + state.metrics.shed_count(Stage::Queue, Reason::OwnerLimit)
        + state.metrics.shed_count(Stage::Queue, Reason::Full);
    assert!(refused > 0, "the refusals are counted");
    for c in [&newcomer, &subscriber, &*flooder] {
        c.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncua_encoder_over_python_http_client() {
    let python = root().join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask ci` first",
        python.display()
    );
    let (addr, _state) = start(
        "python",
        HttpsSection {
            session_rate: 5,
            session_burst: 10,
            ..Default::default()
        },
    )
    .await;
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(root().join("tests/interop/https_asyncua.py"))
            .arg(addr.ip().to_string())
            .arg(addr.port().to_string())
            .output()
            .expect("python runs")
    })
    .await
    .expect("harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().last() == Some("OK"),
        "harness failed:\n{stdout}\n{stderr}"
    );
}

/// A client certificate and key for `uri`, made now.
fn client_identity(uri: &str) -> Arc<uascale_proto::security::Identity> {
    use uascale_crypto::x509::{create_self_signed, SelfSignedParams};
    let start = std::time::SystemTime::now() - Duration::from_secs(3600);
    let made = create_self_signed(&SelfSignedParams::new(uri, "https client", start))
        .expect("certificate");
    Arc::new(
        uascale_proto::security::Identity::new(
            made.certificate.clone(),
            uascale_crypto::rsa::RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der)
                .expect("key"),
        )
        .expect("identity"),
    )
}

/// `[https] certificate` and `private_key` (DER, PKCS#8): the listener
/// serves that TLS certificate, not the application certificate. A client
/// trusting only the TLS certificate connects, creates a session and
/// reads; one trusting only the application certificate is refused at the
/// TLS handshake; GetEndpoints still names the application certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_tls_certificate_is_served() {
    use uascale_client::TrustListValidator;
    use uascale_crypto::x509::{create_self_signed, SelfSignedParams, TrustList};
    let dir = pki_dir("tls-certificate-files");
    std::fs::create_dir_all(&dir).expect("a directory");
    let not_before = std::time::SystemTime::now() - Duration::from_secs(3600);
    let made = create_self_signed(&SelfSignedParams::new(
        "urn:uascale:https-tls",
        "https tls",
        not_before,
    ))
    .expect("a TLS certificate");
    let (cert_path, key_path) = (dir.join("tls.der"), dir.join("tls.key.der"));
    std::fs::write(&cert_path, made.certificate.der()).expect("write the certificate");
    std::fs::write(&key_path, &made.private_key_pkcs8_der).expect("write the key");
    let mut config = config(
        "tls-certificate",
        HttpsSection {
            certificate: Some(cert_path),
            private_key: Some(key_path),
            ..Default::default()
        },
    );
    // The secured policies too: the server has an application certificate.
    config.security = SecurityConfig {
        pki_dir: pki_dir("tls-certificate"),
        allow_security_none: true,
        ..SecurityConfig::default()
    };
    let (addr, state) = serve(config);
    let application = application_certificate(&state);
    assert_ne!(application.der(), made.certificate.der());
    let trusting = |cert: uascale_crypto::x509::Certificate| ClientOptions {
        security: SecurityOptions {
            trust: ServerTrust::Validator(Arc::new(TrustListValidator::new(TrustList::new(
                vec![cert],
                vec![],
                vec![],
            )))),
            ..Default::default()
        },
        reconnect: false,
        ..Default::default()
    };
    let url = format!("opc.https://{addr}/");

    let refused = Client::connect(&url, trusting(application.clone()))
        .await
        .expect_err("the application certificate is not the one presented");
    assert_eq!(
        refused.status_code(),
        StatusCode::BadCertificateUntrusted,
        "{refused:?}"
    );

    let client = Client::connect(&url, trusting(made.certificate.clone()))
        .await
        .expect("the TLS certificate is trusted");
    client.create_session("tls").await.expect("session");
    let values = client
        .read_values(&[NodeId::ns0(2259)])
        .await
        .expect("Read");
    assert_eq!(values[0].value, Some(Variant::Int32(0)), "Running");
    let endpoints = client.get_endpoints().await.expect("GetEndpoints");
    let https = endpoints
        .iter()
        .find(|e| e.endpoint_url.as_str() == Some(url.as_str()))
        .expect("the opc.https endpoint");
    assert_eq!(
        https.server_certificate.as_bytes(),
        Some(application.der()),
        "endpoints name the application certificate"
    );
    client.close().await;
}

/// `OPCUA-SecurityPolicy` names a secured policy: CreateSession and
/// ActivateSession carry signatures over the nonces with the client's
/// certificate, which the server validates against its PKI; the TLS
/// certificate (the application certificate) is judged by the client's
/// trust list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_policy_signs_the_session_over_https() {
    use uascale_client::TrustListValidator;
    use uascale_crypto::policy::SecurityPolicy;
    use uascale_crypto::x509::TrustList;
    let mut config = config("secured", HttpsSection::default());
    config.security = SecurityConfig {
        pki_dir: pki_dir("secured"),
        trust_all_client_certificates: true,
        ..SecurityConfig::default()
    };
    let hash = uascale_server::identity::hash_password(b"secret").expect("hash");
    config.users = vec![uascale_server::config::UserConfig::new("operator", &hash)];
    // An X.509 user the server's trust list holds from the start.
    let user = client_identity("urn:uascale:https-user");
    let trusted = pki_dir("secured").join("trusted/certs");
    std::fs::create_dir_all(&trusted).expect("trusted/certs");
    std::fs::write(trusted.join("https-user.der"), user.certificate().der())
        .expect("trust the user certificate");
    let (addr, state) = serve(config);
    let server_cert = application_certificate(&state);
    let url = format!("opc.https://{addr}/");

    let endpoints = Client::connect(&url, options())
        .await
        .expect("connect")
        .get_endpoints()
        .await
        .expect("GetEndpoints");
    let https_secured: Vec<_> = endpoints
        .iter()
        .filter(|e| e.endpoint_url.as_str() == Some(url.as_str()))
        .map(|e| {
            (
                e.security_policy_uri.as_str_or_empty().to_owned(),
                e.security_mode,
            )
        })
        .collect();
    assert!(
        https_secured.contains(&(
            SecurityPolicy::Basic256Sha256.uri().to_owned(),
            t::MessageSecurityMode::Sign
        )),
        "{https_secured:?}"
    );

    let trust = ServerTrust::Validator(Arc::new(TrustListValidator::new(TrustList::new(
        vec![server_cert],
        vec![],
        vec![],
    ))));
    let secured = ClientOptions {
        security: SecurityOptions {
            policy: SecurityPolicy::Basic256Sha256,
            mode: t::MessageSecurityMode::Sign,
            certificate: Some(client_identity("urn:uascale:client")),
            server_certificate: None,
            trust,
        },
        reconnect: false,
        ..Default::default()
    };
    let client = Client::connect(&url, secured.clone())
        .await
        .expect("connect");
    client
        .create_session("signed")
        .await
        .expect("signed session");
    let values = client
        .read_values(&[NodeId::ns0(2259)])
        .await
        .expect("Read");
    assert_eq!(values[0].value, Some(Variant::Int32(0)));
    client.close().await;

    // Every token type over the signed session and over None: UserName
    // (right and wrong password) and the X.509 user.
    let unsigned = ClientOptions {
        security: SecurityOptions {
            trust: secured.security.trust.clone(),
            ..Default::default()
        },
        ..secured.clone()
    };
    for (what, base) in [("signed", &secured), ("None", &unsigned)] {
        let identities = [
            (
                "UserName",
                UserIdentity::UserName {
                    user: "operator".into(),
                    password: "secret".into(),
                },
                None,
            ),
            (
                "wrong password",
                UserIdentity::UserName {
                    user: "operator".into(),
                    password: "guess".into(),
                },
                Some(StatusCode::BadUserAccessDenied),
            ),
            ("X509", UserIdentity::X509(Arc::clone(&user)), None),
        ];
        for (token, identity, refused) in identities {
            let options = ClientOptions {
                identity,
                ..base.clone()
            };
            let client = Client::connect(&url, options).await.expect("connect");
            let activated = client.create_session("identity").await;
            match refused {
                None => {
                    activated.unwrap_or_else(|e| panic!("{what} {token}: {e}"));
                    let values = client
                        .read_values(&[NodeId::ns0(2259)])
                        .await
                        .unwrap_or_else(|e| panic!("{what} {token} Read: {e}"));
                    assert_eq!(values[0].value, Some(Variant::Int32(0)), "{what} {token}");
                }
                Some(status) => {
                    let e = activated.expect_err("a wrong password is refused");
                    assert_eq!(e.status_code(), status, "{what} {token}: {e}");
                }
            }
            client.close().await;
        }
    }
}
