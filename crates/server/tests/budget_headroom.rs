//! docs/scalability.md §2, the incomplete-message budget: channels without an
//! activated session may use only part of it, so headroom stays for
//! activated sessions. The connection learns that its channel carries an
//! activated session from the session table's transitions (ActivateSession,
//! CloseSession), so a large chunked request that would overrun the
//! unactivated share is served once the session is active, and refused
//! again after it closed.

mod common;

use common::RawClient;
use uascale_server::{Server, ServerConfig};
use uascale_types::{
    ByteString, CloseSessionRequest, CloseSessionResponse, DataValue, NodeId, StatusCode, Variant,
    WriteRequest, WriteResponse, WriteValue,
};

/// A Write of a 100 KB ByteString: two chunks of at most 64 KiB, so the
/// first one (about 64 KiB) is retained while the second is awaited.
fn big_write(c: &mut RawClient) -> WriteRequest {
    WriteRequest {
        request_header: c.header(),
        nodes_to_write: Some(vec![WriteValue {
            node_id: NodeId::string(2, "Demo.Static.Scalar.ByteString"),
            attribute_id: 13,
            value: DataValue {
                value: Some(Variant::ByteString(ByteString::new(vec![0x5a; 100_000]))),
                ..Default::default()
            },
            ..Default::default()
        }]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activated_sessions_get_the_budget_headroom_and_lose_it_when_closed() {
    let config = ServerConfig {
        // 1 MiB in all; channels without an activated session 5 % of it
        // (52 KB): less than one 64 KiB chunk.
        limits: uascale_server::config::LimitsSection {
            reassembly_budget: 1 << 20,
            reassembly_unactivated_percent: 5,
            ..Default::default()
        },
        ..common::loopback_config()
    };
    let server = Server::bind(config).expect("bind");
    let addr = server.local_addr().expect("address");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));

    let outcome = tokio::task::spawn_blocking(move || {
        // Activated: the write is reassembled and served.
        let mut c = RawClient::connect(addr);
        c.session();
        let req = big_write(&mut c);
        c.send(&req);
        let (_, m) = c.read_response();
        let w = m
            .as_any()
            .downcast_ref::<WriteResponse>()
            .expect("a WriteResponse for the activated session");
        assert_eq!(w.results.as_deref(), Some(&[StatusCode::Good][..]));

        // Closed: the channel is back to the unactivated share.
        let header = c.header();
        c.send(&CloseSessionRequest {
            request_header: header,
            delete_subscriptions: true,
        });
        let (_, m) = c.read_response();
        assert!(m.as_any().downcast_ref::<CloseSessionResponse>().is_some());
        let req = big_write(&mut c);
        c.send(&req);
        let refused_after_close = c.read_error();

        // Never activated: refused from the start.
        let mut fresh = RawClient::connect(addr);
        let req = big_write(&mut fresh);
        fresh.send(&req);
        (refused_after_close, fresh.read_error())
    })
    .await
    .expect("client thread");
    for status in [outcome.0, outcome.1] {
        assert!(
            status == StatusCode::BadTcpMessageTooLarge || status == StatusCode::BadRequestTooLarge,
            "refused with {status:?}"
        );
    }
    let _ = stop_tx.send(());
    running.await.expect("run task").expect("run");
}
