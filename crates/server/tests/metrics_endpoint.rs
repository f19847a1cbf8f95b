//! The metrics endpoint (`[metrics] listen`, docs/metrics.md) of a running
//! server: bound on port 0 (`Server::metrics_addr` tells the port), it
//! counts a session's requests by service and status, the session and its
//! establishment, the channel and a Publish answered by the subscription
//! engine; `/healthz` and `/readyz` answer 200, other paths 404, other
//! methods 405; it goes away when the server shuts down.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::RawClient;
use uascale_server::{Server, ServerConfig};
use uascale_types::{
    AttributeId, NodeId, PublishResponse, ReadRequest, ReadResponse, ReadValueId, RequestHeader,
    ServiceFault, StatusCode,
};

/// One HTTP/1.1 request; the status code and the body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.parse().ok())
        .expect("Content-Length");
    assert_eq!(body.len(), length, "the whole body");
    (status, body.to_owned())
}

/// The value of the unlabelled or labelled sample `series` as printed.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|v| v as u64)
    })
}

fn read(c: &mut RawClient, header: RequestHeader) -> Box<dyn uascale_types::DynStructure> {
    c.send(&ReadRequest {
        request_header: header,
        nodes_to_read: Some(vec![ReadValueId {
            node_id: NodeId::ns0(2258),
            attribute_id: AttributeId::Value as u32,
            ..Default::default()
        }]),
        ..Default::default()
    });
    c.read_response().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_of_a_running_server() {
    let config = ServerConfig {
        metrics: uascale_server::config::MetricsSection {
            listen: Some("127.0.0.1:0".parse().unwrap()),
        },
        ..common::loopback_config()
    };
    let server = Server::bind(config).expect("bind");
    let addr = server.local_addr().expect("address");
    let metrics = server
        .metrics_addr()
        .expect("the metrics endpoint is bound");
    assert_ne!(metrics.port(), 0, "the port the kernel chose");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));

    let text = tokio::task::spawn_blocking(move || {
        let mut c = RawClient::connect(addr);
        c.session();
        for _ in 0..3 {
            let h = c.header();
            let r = read(&mut c, h);
            assert!(r.as_any().downcast_ref::<ReadResponse>().is_some(), "{r:?}");
        }
        // Without the session's token: BadSessionIdInvalid.
        let r = read(&mut c, RequestHeader::default());
        let f = r.as_any().downcast_ref::<ServiceFault>().expect("a fault");
        assert_eq!(
            f.response_header.service_result,
            StatusCode::BadSessionIdInvalid
        );
        // A subscription whose first keep-alive answers a parked Publish.
        c.send_create_subscription(30, 1);
        c.read_subscription_id();
        c.publish(vec![]);
        let (_, m) = c.read_response();
        assert!(
            m.as_any().downcast_ref::<PublishResponse>().is_some(),
            "{m:?}"
        );

        let (status, text) = http(metrics, "GET", "/metrics");
        assert_eq!(status, 200, "{text}");
        assert_eq!(http(metrics, "GET", "/healthz").0, 200);
        let (status, body) = http(metrics, "GET", "/readyz");
        assert_eq!((status, body.as_str()), (200, "ready\n"));
        assert_eq!(http(metrics, "GET", "/nothing-here").0, 404);
        assert_eq!(http(metrics, "POST", "/metrics").0, 405);
        drop(c);
        text
    })
    .await
    .expect("client thread");

    let v = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series} in\n{text}"));
    assert_eq!(
        v(r#"opcua_server_requests_total{service="Read",status="good"}"#),
        3
    );
    assert_eq!(
        v(r#"opcua_server_requests_total{service="Read",status="bad"}"#),
        1
    );
    assert_eq!(
        v(r#"opcua_server_request_errors_total{status="BadSessionIdInvalid"}"#),
        1
    );
    for service in [
        "CreateSession",
        "ActivateSession",
        "CreateSubscription",
        "Publish",
    ] {
        assert_eq!(
            v(&format!(
                r#"opcua_server_requests_total{{service="{service}",status="good"}}"#
            )),
            1,
            "{service}"
        );
    }
    assert_eq!(
        v(r#"opcua_server_publish_responses_total{kind="keep_alive"}"#),
        1
    );
    assert_eq!(v(r#"opcua_server_sessions{state="active"}"#), 1);
    assert_eq!(v(r#"opcua_server_sessions{state="establishing"}"#), 0);
    assert_eq!(
        v(r#"opcua_server_session_transitions_total{transition="activated"}"#),
        1
    );
    assert_eq!(v("opcua_server_session_establishment_seconds_count"), 1);
    assert_eq!(v("opcua_server_channels_open"), 1);
    assert_eq!(v("opcua_server_subscriptions"), 1);
    assert!(
        v(r#"opcua_server_connections_total{outcome="accepted",stage="accept",reason=""}"#) >= 1
    );

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("run ends")
        .expect("run task")
        .expect("run");
    assert!(
        TcpStream::connect(metrics).is_err(),
        "the endpoint closed with the server"
    );
}
