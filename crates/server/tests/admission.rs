//! Admission stages seen from a socket (docs/scalability.md §2): at
//! `max_channel_count` the oldest channel without an activated session is
//! evicted with a busy ERR carrying a hint; when every channel has a
//! session the new connection is refused the same way; and the buckets at
//! accept answer with the busy ERR before reading anything.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use common::RawClient;
use uascale_proto::tcp::{ErrorMessage, MessageHeader, MessageType};
use uascale_server::config::AdmissionSection;
use uascale_server::{Server, ServerConfig};
use uascale_types::StatusCode;

/// Reads one message from a raw stream: it must be an ERR; its status and
/// the hint in its reason.
fn read_err(s: &mut TcpStream) -> (StatusCode, Option<u64>) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        if let Ok(Some(h)) = MessageHeader::parse(&buf, 1 << 20) {
            if buf.len() >= h.message_size as usize {
                assert_eq!(h.message_type, MessageType::Error, "an ERR");
                let e = ErrorMessage::decode_body(&buf[8..h.message_size as usize]).unwrap();
                return (e.error, e.retry_after_ms());
            }
        }
        let n = s.read(&mut tmp).expect("read");
        assert!(n > 0, "closed without an ERR");
        buf.extend_from_slice(&tmp[..n]);
    }
}

fn start(admission: AdmissionSection) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let config = ServerConfig {
        admission,
        ..common::loopback_config()
    };
    let server = Server::bind(config).expect("bind");
    let addr = server.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_channel_limit_the_oldest_sessionless_channel_makes_room() {
    let (addr, stop) = start(AdmissionSection {
        max_channel_count: Some(2),
        ..Default::default()
    });
    let outcome = tokio::task::spawn_blocking(move || {
        let mut idle = RawClient::connect(addr);
        let mut with_session = RawClient::connect(addr);
        with_session.session();
        // A third channel: the oldest without a session is evicted.
        let mut third = RawClient::connect(addr);
        let evicted = idle.read_error_with_hint();
        third.session();
        // Every channel has a session now: a new one is refused.
        let mut refused = TcpStream::connect(addr).unwrap();
        let refusal = read_err(&mut refused);
        (evicted, refusal)
    })
    .await
    .unwrap();
    for (status, hint) in [outcome.0, outcome.1] {
        assert_eq!(status, StatusCode::BadTcpServerTooBusy);
        assert!(hint.is_some(), "a RetryAfterMs hint");
    }
    let _ = stop.send(());
}

/// A connection from `from` (a loopback address) to `addr`.
fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&std::net::SocketAddr::from((from, 0)).into())
        .unwrap();
    s.connect(&addr.into()).unwrap();
    s.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_per_address_burst_connections_get_a_busy_err_at_once() {
    // The per-address buckets apply once the global bucket is under half
    // full: 12 tokens, refilled at 1 a second.
    let (addr, stop) = start(AdmissionSection {
        connections_per_second: 1,
        connection_burst: 12,
        connections_per_second_per_address: Some(1),
        connection_burst_per_address: Some(3),
        ..Default::default()
    });
    let (refusals, other) = tokio::task::spawn_blocking(move || {
        // Seven pass on the global bucket alone (12 down to 5), three more
        // on the address's bucket (and stay open); the next ones from the
        // same address are refused before a byte is read from them.
        let held: Vec<TcpStream> = (0..10)
            .map(|_| connect_from([127, 0, 0, 1], addr))
            .collect();
        let refused: Vec<_> = (0..3)
            .map(|_| read_err(&mut connect_from([127, 0, 0, 1], addr)))
            .collect();
        // Another address still gets in (no ERR comes).
        let mut other = connect_from([127, 0, 0, 2], addr);
        other
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 8];
        let served = matches!(other.read(&mut b), Err(e) if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ));
        drop(held);
        (refused, served)
    })
    .await
    .unwrap();
    for (status, hint) in refusals {
        assert_eq!(status, StatusCode::BadTcpServerTooBusy);
        let ms = hint.expect("a RetryAfterMs hint");
        assert!(
            (1..=36_000).contains(&ms),
            "hint {ms} ms within the documented range"
        );
    }
    assert!(other, "another address is not limited by this one's bucket");
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_address_cannot_hold_every_place() {
    let (addr, stop) = start(AdmissionSection {
        max_unfinished_handshakes_per_address: 2,
        ..Default::default()
    });
    let outcome = tokio::task::spawn_blocking(move || {
        // A connection with an activated session is no longer unfinished.
        let mut served = RawClient::connect(addr);
        served.session();
        // Two that never send a byte take the address's places...
        let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        // ...so a third is refused at once, with a hint.
        let refused = read_err(&mut TcpStream::connect(addr).unwrap());
        // When one goes, a place frees.
        drop(idle);
        std::thread::sleep(Duration::from_millis(300));
        let mut again = RawClient::connect(addr);
        again.session();
        refused
    })
    .await
    .unwrap();
    assert_eq!(outcome.0, StatusCode::BadTcpServerTooBusy);
    assert!(outcome.1.is_some(), "a RetryAfterMs hint");
    let _ = stop.send(());
}
