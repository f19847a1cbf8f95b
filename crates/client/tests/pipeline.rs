//! The pipelined load path (`uascale_client::net::pipeline`) against a
//! uascale server in the same process: every request of the window is
//! answered, each with its own requestHandle, statuses are counted from
//! the raw response, ServiceFaults come out as errors, a silent server
//! times out, and secured channels are refused.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use uascale_client::net::pipeline::{read_statuses, Pipeline, Template};
use uascale_client::{ClientError, ClientOptions, SecurityOptions};
use uascale_server::{Server, ServerConfig};
use uascale_types as t;
use uascale_types::{BinaryDecode, NodeId, Reader, ResponseHeader, StatusCode};

async fn start() -> String {
    let config = ServerConfig {
        server: uascale_server::config::ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            ..Default::default()
        },
        security: uascale_server::config::SecurityConfig::none_only(),
        ..Default::default()
    };
    let server = Server::bind(config).unwrap();
    let url = format!("opc.tcp://{}", server.local_addr().unwrap());
    tokio::spawn(server.run(std::future::pending()));
    url
}

fn read_request(p: &mut Pipeline, nodes: &[NodeId]) -> t::ReadRequest {
    t::ReadRequest {
        request_header: p.request_header(),
        max_age: 0.0,
        timestamps_to_return: t::TimestampsToReturn::Both,
        nodes_to_read: Some(
            nodes
                .iter()
                .map(|n| t::ReadValueId {
                    node_id: n.clone(),
                    attribute_id: t::AttributeId::Value as u32,
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_reads_each_answered_with_its_own_handle() {
    let url = start().await;
    let mut p = Pipeline::connect(&url, ClientOptions::default())
        .await
        .unwrap();
    p.create_session("pipeline test").await.unwrap();
    let nodes = [NodeId::ns0(2258), NodeId::string(2, "Missing")];
    let req = read_request(&mut p, &nodes);
    let mut template = Template::new(&req).unwrap();
    let stop = AtomicBool::new(false);
    let limits = t::DecodeLimits::default();
    let (mut handles, mut values, mut bad, mut reads) = (HashSet::new(), 0, 0, 0);
    p.run(&mut template, 8, &stop, |c| {
        let body = c.result.unwrap();
        let mut r = Reader::new(&body, &limits).unwrap();
        NodeId::decode(&mut r).unwrap();
        let header = ResponseHeader::decode(&mut r).unwrap();
        assert!(handles.insert(header.request_handle), "handle reused");
        values += read_statuses(&body, &limits, |s| {
            assert_eq!(s, StatusCode::BadNodeIdUnknown);
            bad += 1;
        })
        .unwrap();
        reads += 1;
        if reads == 500 {
            stop.store(true, Ordering::Relaxed);
        }
    })
    .await
    .unwrap();
    // The outstanding window drains after the stop.
    assert!((500..=507).contains(&reads), "{reads}");
    assert_eq!(handles.len(), reads);
    assert_eq!((values, bad), (2 * reads, reads));
    // The session still serves a plain request afterwards.
    let req = read_request(&mut p, &nodes[..1]);
    let resp: t::ReadResponse = p.request(&req).await.unwrap();
    assert_eq!(resp.results.unwrap().len(), 1);
    p.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_timeouts_and_unsupported_security_are_reported() {
    let url = start().await;
    // Not a session yet: the server answers with a ServiceFault.
    let mut p = Pipeline::connect(&url, ClientOptions::default())
        .await
        .unwrap();
    let req = read_request(&mut p, &[NodeId::ns0(2258)]);
    let mut template = Template::new(&req).unwrap();
    let stop = AtomicBool::new(false);
    let limits = t::DecodeLimits::default();
    let mut faults = 0;
    p.run(&mut template, 2, &stop, |c| {
        let body = c.result.unwrap();
        match read_statuses(&body, &limits, |_| {}) {
            Err(ClientError::Service { status, .. }) => {
                assert_eq!(status, StatusCode::BadSessionIdInvalid);
            }
            other => panic!("{other:?}"),
        }
        faults += 1;
        stop.store(true, Ordering::Relaxed);
    })
    .await
    .unwrap();
    assert!(faults >= 1);
    p.close().await;

    // A server that accepts but never answers: the OPN times out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("opc.tcp://{}", silent.local_addr().unwrap());
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let e = Pipeline::connect(&silent_url, options).await.unwrap_err();
    assert_eq!(e, ClientError::Timeout);

    let secured = ClientOptions {
        security: SecurityOptions {
            policy: uascale_crypto::policy::SecurityPolicy::Basic256Sha256,
            mode: t::MessageSecurityMode::SignAndEncrypt,
            ..Default::default()
        },
        ..Default::default()
    };
    let e = Pipeline::connect(&url, secured).await.unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadConfigurationError);
}
