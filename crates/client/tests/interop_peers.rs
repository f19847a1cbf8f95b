//! The client against servers nobody here wrote: Python asyncua's server
//! and open62541's (through o6), started by `tests/interop/peer_server.py`
//! from the venv that `cargo xtask ci` creates.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use uascale_client::{Client, ClientOptions};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode, Variant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Peer {
    child: Child,
    port: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_peer(kind: &str) -> Peer {
    let python = root().join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask ci` first",
        python.display()
    );
    let port = free_port();
    let mut child = Command::new(python)
        .arg(root().join("tests/interop/peer_server.py"))
        .arg(kind)
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{kind} peer server did not start"));
    Peer { child, port }
}

async fn exercise(kind: &str) {
    let peer = start_peer(kind);
    let url = format!("opc.tcp://127.0.0.1:{}/", peer.port);
    let client = Client::connect(&url, ClientOptions::default())
        .await
        .unwrap();
    let endpoints = client.get_endpoints().await.unwrap();
    assert!(
        endpoints
            .iter()
            .any(|e| e.security_mode == t::MessageSecurityMode::None),
        "{kind}: no None endpoint"
    );
    client.create_session("interop").await.unwrap();

    let temp = NodeId::string(1, "Temperature");
    let values = client
        .read_values(&[NodeId::ns0(2258), temp.clone(), NodeId::string(1, "Nope")])
        .await
        .unwrap();
    assert!(
        matches!(values[0].value, Some(Variant::DateTime(_))),
        "{kind}: {:?}",
        values[0]
    );
    assert_eq!(values[1].value, Some(Variant::Double(20.5)), "{kind}");
    assert_eq!(
        values[2].status,
        Some(StatusCode::BadNodeIdUnknown),
        "{kind}"
    );

    let statuses = client
        .write(vec![t::WriteValue {
            node_id: temp.clone(),
            attribute_id: t::AttributeId::Value as u32,
            value: t::DataValue::value(Variant::Double(-3.5)),
            ..Default::default()
        }])
        .await
        .unwrap();
    assert_eq!(statuses, vec![StatusCode::Good], "{kind}");
    let back = client
        .read_values(std::slice::from_ref(&temp))
        .await
        .unwrap();
    assert_eq!(back[0].value, Some(Variant::Double(-3.5)), "{kind}");

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
        .unwrap();
    assert!(
        refs.iter().any(|r| r.node_id.node_id == NodeId::ns0(2253)),
        "{kind}: Objects has no Server"
    );
    assert!(refs.iter().any(|r| r.node_id.node_id == temp), "{kind}");

    let paths = client
        .translate(vec![t::BrowsePath {
            starting_node: NodeId::ns0(85),
            relative_path: t::RelativePath {
                elements: Some(vec![t::RelativePathElement {
                    reference_type_id: NodeId::ns0(33),
                    include_subtypes: true,
                    target_name: t::QualifiedName::new(0, "Server"),
                    ..Default::default()
                }]),
            },
        }])
        .await
        .unwrap();
    assert_eq!(paths[0].status_code, StatusCode::Good, "{kind}");

    // Many requests in flight at once.
    let client = std::sync::Arc::new(client);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = std::sync::Arc::clone(&client);
            tokio::spawn(async move { c.read_values(&[NodeId::ns0(2258)]).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().len(), 1, "{kind}");
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_the_asyncua_server() {
    exercise("asyncua").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_the_open62541_server() {
    exercise("o6").await;
}
