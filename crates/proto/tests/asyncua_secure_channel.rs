//! Interoperability of the secured channel with a client nobody here wrote:
//! Python asyncua (`tests/interop/secure_channel_asyncua.py`) opens channels
//! with Basic256Sha256, Aes128_Sha256_RsaOaep and Aes256_Sha256_RsaPss in
//! Sign and SignAndEncrypt against a loopback harness that drives
//! `ServerConnection` directly (no session layer: every request is answered
//! with a ServiceFault, large when the request was large). The peers live in
//! `target/venv` (`cargo xtask ci` creates it from `tests/requirements.txt`).
#![allow(clippy::disallowed_methods)] // a test harness: real clock, real threads

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPrivateKey;
use uascale_crypto::x509::{create_self_signed, SelfSignedParams};
use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::tcp::TransportLimits;
use uascale_proto::{
    ChannelConfig, Event, Identity, Now, PendingConnection, ServerConnection, ServerSecurity,
    TrustAllCertificates,
};
use uascale_types::{
    encode_message, BinaryDecode, DateTime, DecodeLimits, MessageSecurityMode, NodeId, Reader,
    RequestHeader, ResponseHeader, ServiceFault, StatusCode, UaString,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn now() -> Now {
    Now {
        instant: Instant::now(),
        utc: DateTime::from_system_time(SystemTime::now()),
    }
}

/// What the harness saw on one connection.
#[derive(Debug, Default)]
struct Seen {
    opened: Option<(SecurityPolicy, MessageSecurityMode)>,
    renewed: usize,
    requests: usize,
    /// Largest request body (several chunks of 8 KiB when over 8 KiB).
    largest: usize,
    closed: Option<StatusCode>,
}

fn fault_for(body: &[u8]) -> Vec<u8> {
    let limits = DecodeLimits::default();
    let handle = Reader::new(body, &limits)
        .ok()
        .and_then(|mut r| {
            NodeId::decode(&mut r).ok()?;
            RequestHeader::decode(&mut r).ok()
        })
        .map_or(0, |h| h.request_handle);
    let strings = (body.len() > 10_000).then(|| {
        (0..400)
            .map(|i| UaString::from(format!("{i:0300}")))
            .collect()
    });
    let fault = ServiceFault {
        response_header: ResponseHeader {
            timestamp: now().utc,
            request_handle: handle,
            service_result: StatusCode::BadServiceUnsupported,
            string_table: strings,
            ..Default::default()
        },
    };
    let mut out = Vec::new();
    encode_message(&fault, &mut out);
    out
}

/// Drives one connection until it closes or the peer hangs up.
fn serve(mut stream: TcpStream, mut conn: ServerConnection) -> Seen {
    let mut seen = Seen::default();
    stream
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut input = Vec::new();
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                input.extend_from_slice(&buf[..n]);
                if let Err(e) = conn.handle_input(now(), &mut input) {
                    eprintln!("[harness] channel error: {e}");
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
        if conn.poll_timeout().is_some_and(|t| t <= Instant::now()) {
            conn.handle_timeout(now());
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::Opened { .. } => {
                    let s = conn.security();
                    assert!(s.remote_certificate.is_some());
                    seen.opened = Some((s.policy, s.mode));
                }
                Event::Renewed { .. } => seen.renewed += 1,
                Event::Request { request_id, body } => {
                    seen.requests += 1;
                    seen.largest = seen.largest.max(body.len());
                    conn.send_response(request_id, &fault_for(&body)).unwrap();
                }
                Event::Closed { status } => seen.closed = Some(status),
                // Not held here (`hold_acknowledge` off).
                Event::Hello => conn.acknowledge(),
            }
        }
        if conn.poll_transmit(&mut out) {
            if stream.write_all(&out).is_err() {
                break;
            }
            out.clear();
        }
        if conn.is_closed() {
            break;
        }
    }
    seen
}

#[test]
fn asyncua_opens_secured_channels_with_every_policy_and_mode() {
    let python = root().join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask ci` (or `python3 -m venv target/venv && \
         target/venv/bin/pip install -r tests/requirements.txt`) first",
        python.display()
    );
    let dir = std::env::temp_dir().join(format!("uascale-secure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_before = SystemTime::now() - Duration::from_secs(3600);
    let make = |uri: &str, name: &str| {
        let mut p = SelfSignedParams::new(uri, name, not_before);
        p.dns_names = vec!["localhost".into()];
        create_self_signed(&p).unwrap()
    };
    let server = make("urn:uascale:test:server", "server");
    // asyncua's default ApplicationUri, so that it does not warn.
    let client = make("urn:example.org:FreeOpcUa:opcua-asyncio", "client");
    std::fs::write(dir.join("server.der"), server.certificate.der()).unwrap();
    std::fs::write(dir.join("client.der"), client.certificate.der()).unwrap();
    std::fs::write(dir.join("client_key.der"), &client.private_key_pkcs8_der).unwrap();
    let key = RsaPrivateKey::from_pkcs8_der(&server.private_key_pkcs8_der).unwrap();
    let identity = Arc::new(Identity::new(server.certificate, key).unwrap());

    let mut endpoints = Vec::new();
    for p in [
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
    ] {
        for m in [
            MessageSecurityMode::Sign,
            MessageSecurityMode::SignAndEncrypt,
        ] {
            endpoints.push((p, m));
        }
    }
    let expected = endpoints.clone();
    let config = Arc::new(ChannelConfig {
        security: ServerSecurity {
            identity: Some(identity),
            ecc_identities: Vec::new(),
            endpoints,
            validator: Some(Arc::new(TrustAllCertificates)),
        },
        // Small chunks, so that messages go in several both ways. Both sizes
        // alike: asyncua 2.1.0 takes the Acknowledge's SendBufferSize as its
        // own send limit (the fields swapped), so it would exceed a smaller
        // ReceiveBufferSize.
        transport: TransportLimits {
            receive_buffer_size: 8192,
            send_buffer_size: 8192,
            ..TransportLimits::default()
        },
        ..ChannelConfig::default()
    });
    let budget = ReassemblyBudget::new(16 << 20, 50);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    let count = expected.len();
    std::thread::spawn(move || {
        for (i, stream) in listener.incoming().take(count).enumerate() {
            let Ok(stream) = stream else { break };
            let conn = PendingConnection::new().accept(
                now(),
                100 + i as u32,
                Arc::clone(&config),
                Arc::clone(&budget),
            );
            let _ = tx.send(serve(stream, conn));
        }
    });

    let status = Command::new(&python)
        .arg(root().join("tests/interop/secure_channel_asyncua.py"))
        .arg(format!("opc.tcp://localhost:{port}"))
        .arg(&dir)
        .status()
        .expect("run the asyncua script");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "asyncua script failed: {status}");
    let seen: Vec<Seen> = (0..count)
        .map_while(|_| rx.recv_timeout(Duration::from_secs(10)).ok())
        .collect();
    assert_eq!(seen.len(), count, "{seen:?}");
    for (s, e) in seen.iter().zip(&expected) {
        assert_eq!(s.opened, Some(*e));
        assert_eq!(s.renewed, 1, "{s:?}");
        assert_eq!(s.requests, 3, "{s:?}");
        assert!(s.largest > 3 * 8192, "{s:?}");
        assert_eq!(s.closed, Some(StatusCode::Good), "{s:?}");
    }
}
