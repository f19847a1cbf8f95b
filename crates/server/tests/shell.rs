//! The shell's wiring over real sockets on 127.0.0.1: bytes arriving in
//! any split reach the connection whole, and a build without NATS
//! refuses a cluster configuration at start.

use std::time::Duration;

use common::loopback_config;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use uascale_server::Server;
use uascale_types::StatusCode;

mod common;

/// Reads one whole message (header and body) from `s`.
async fn read_message(s: &mut TcpStream) -> (uascale_proto::tcp::MessageHeader, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 8];
    s.read_exact(&mut head).await.expect("header");
    let h = uascale_proto::tcp::MessageHeader::parse(&head, 1 << 20)
        .expect("valid header")
        .expect("complete header");
    let mut body = vec![0u8; h.message_size as usize - 8];
    s.read_exact(&mut body).await.expect("body");
    (h, body)
}

/// Built without the `nats` feature, a server with `[cluster] url`
/// refuses to start, naming the key, instead of running alone.
/// (`cargo test -p uascale-server --no-default-features`; with the
/// feature, the cluster tests start real NATS servers.)
#[cfg(not(feature = "nats"))]
#[tokio::test]
async fn without_nats_a_cluster_url_fails_the_start() {
    let mut config = loopback_config();
    config.cluster.url = Some("nats://127.0.0.1:4222".to_owned());
    let server = Server::bind(config).expect("bind");
    let e = server
        .run(async {})
        .await
        .expect_err("started without NATS");
    assert!(
        e.to_string()
            .starts_with("cluster.url = nats://127.0.0.1:4222: this build has no NATS client"),
        "{e}"
    );
}

/// A message that arrives in pieces (the start kept by the connection
/// between reads, the rest read into the worker's buffer) and two that
/// arrive in one read are each handled once.
#[tokio::test]
async fn messages_split_across_reads_and_joined_in_one() {
    use uascale_proto::tcp::{Hello, MessageType};
    let config = loopback_config();
    let server = Server::bind(config).expect("bind");
    let addr = server.local_addr().expect("address");
    let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));
    let mut hello = Vec::new();
    Hello {
        protocol_version: 0,
        receive_buffer_size: 65535,
        send_buffer_size: 65535,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: uascale_types::UaString::from(format!("opc.tcp://{addr}")),
    }
    .encode_message(&mut hello);
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client.set_nodelay(true).expect("nodelay");
    for piece in [&hello[..3], &hello[3..10], &hello[10..]] {
        client.write_all(piece).await.expect("send a piece");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let (h, _) = read_message(&mut client).await;
    assert_eq!(h.message_type, MessageType::Acknowledge);
    // A second Hello on the same connection is refused, whole or split.
    let mut twice = TcpStream::connect(addr).await.expect("connect");
    let mut both = hello.clone();
    both.extend_from_slice(&hello);
    twice.write_all(&both).await.expect("send both");
    let (h, _) = read_message(&mut twice).await;
    assert_eq!(h.message_type, MessageType::Acknowledge);
    let (h, body) = read_message(&mut twice).await;
    assert_eq!(h.message_type, MessageType::Error);
    let err = uascale_proto::tcp::ErrorMessage::decode_body(&body).expect("ERR body");
    assert_eq!(err.error, StatusCode::BadTcpMessageTypeInvalid);
}
