//! An asynchronous node manager served through a real socket: its Reads and
//! Writes do not hold up other requests of the connection, and Cancel
//! really aborts one that is still waiting.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::RawClient;
use tokio::sync::Semaphore;
use uascale_server::address_space::Node;
use uascale_server::node_manager::AsyncNodeManager;
use uascale_server::reply::BoxFuture;
use uascale_server::Server;
use uascale_types::{
    AttributeId, CancelRequest, CancelResponse, DataValue, NodeClass, NodeId, QualifiedName,
    ReadRequest, ReadResponse, ReadValueId, ServiceFault, StatusCode, Variant, WriteRequest,
    WriteResponse, WriteValue,
};

/// Values behind a gate: each read or write waits for one permit.
struct Gated {
    gate: Arc<Semaphore>,
    value: Arc<std::sync::Mutex<f64>>,
}

impl AsyncNodeManager for Gated {
    fn namespace_uri(&self) -> &str {
        "urn:test:async"
    }

    fn read_value(&self, _node: &NodeId) -> BoxFuture<Result<Variant, StatusCode>> {
        let gate = Arc::clone(&self.gate);
        let value = Arc::clone(&self.value);
        Box::pin(async move {
            let permit = gate.acquire().await.map_err(|_| StatusCode::BadShutdown)?;
            permit.forget();
            Ok(Variant::Double(*value.lock().unwrap()))
        })
    }

    fn write_value(&self, _node: &NodeId, v: Variant) -> BoxFuture<Result<(), StatusCode>> {
        let gate = Arc::clone(&self.gate);
        let value = Arc::clone(&self.value);
        Box::pin(async move {
            let permit = gate.acquire().await.map_err(|_| StatusCode::BadShutdown)?;
            permit.forget();
            match v {
                Variant::Double(d) => {
                    *value.lock().unwrap() = d;
                    Ok(())
                }
                _ => Err(StatusCode::BadTypeMismatch),
            }
        })
    }

    fn call(
        &self,
        _object: &NodeId,
        _method: &NodeId,
        _inputs: Vec<Variant>,
    ) -> BoxFuture<Result<Vec<Variant>, StatusCode>> {
        Box::pin(async { Err(StatusCode::BadNotImplemented) })
    }
}

fn slow() -> NodeId {
    NodeId::string(3, "Slow")
}

fn start(gate: Arc<Semaphore>) -> std::net::SocketAddr {
    let config = common::loopback_config();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = Server::bind_with(config, |space, managers| {
                let mut var = Node::new(NodeClass::Variable, slow(), QualifiedName::new(3, "Slow"));
                var.data_type = NodeId::ns0(11);
                var.access_level = 3;
                space.insert(var);
                managers.register_async(
                    3,
                    Arc::new(Gated {
                        gate,
                        value: Arc::new(std::sync::Mutex::new(1.5)),
                    }),
                );
            })
            .unwrap();
            tx.send(server.local_addr().unwrap()).unwrap();
            // Runs until the test process exits.
            server.run(std::future::pending()).await.unwrap();
        });
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

fn read_of(c: &mut RawClient, nodes: &[NodeId]) -> (u32, u32) {
    let header = c.header();
    let handle = header.request_handle;
    let rid = c.send(&ReadRequest {
        request_header: header,
        nodes_to_read: Some(
            nodes
                .iter()
                .map(|n| ReadValueId {
                    node_id: n.clone(),
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    });
    (rid, handle)
}

#[test]
fn async_reads_do_not_block_the_connection_and_cancel_aborts_them() {
    let gate = Arc::new(Semaphore::new(0));
    let addr = start(Arc::clone(&gate));
    let mut c = RawClient::connect(addr);
    c.session();

    // A: waits at the gate (with a synchronous node in the same request).
    let (rid_a, handle_a) = read_of(&mut c, &[slow(), NodeId::ns0(2259)]);
    // B: a plain read, answered while A waits.
    let (rid_b, _) = read_of(&mut c, &[NodeId::ns0(2259)]);
    let (got, m) = c.read_response();
    assert_eq!(got, rid_b, "the synchronous read overtakes the waiting one");
    assert!(m.as_any().downcast_ref::<ReadResponse>().is_some());

    // Cancel A: one request cancelled, and A is answered with the code.
    let header = c.header();
    let rid_cancel = c.send(&CancelRequest {
        request_header: header,
        request_handle: handle_a,
    });
    let mut cancelled = false;
    let mut count = None;
    for _ in 0..2 {
        let (rid, m) = c.read_response();
        if rid == rid_cancel {
            count = Some(
                m.as_any()
                    .downcast_ref::<CancelResponse>()
                    .expect("a CancelResponse")
                    .cancel_count,
            );
        } else {
            assert_eq!(rid, rid_a);
            let f = m.as_any().downcast_ref::<ServiceFault>().expect("a fault");
            assert_eq!(
                f.response_header.service_result,
                StatusCode::BadRequestCancelledByClient
            );
            assert_eq!(f.response_header.request_handle, handle_a);
            cancelled = true;
        }
    }
    assert_eq!(count, Some(1));
    assert!(cancelled);
    // Cancelling again finds nothing.
    let header = c.header();
    c.send(&CancelRequest {
        request_header: header,
        request_handle: handle_a,
    });
    let (_, m) = c.read_response();
    assert_eq!(
        m.as_any()
            .downcast_ref::<CancelResponse>()
            .unwrap()
            .cancel_count,
        0
    );

    // C: passes the gate once a permit is given.
    let (rid_c, _) = read_of(&mut c, &[slow(), NodeId::ns0(2259)]);
    gate.add_permits(1);
    let (got, m) = c.read_response();
    assert_eq!(got, rid_c);
    let r = m.as_any().downcast_ref::<ReadResponse>().unwrap();
    let results = r.results.as_ref().unwrap();
    assert_eq!(results[0].value, Some(Variant::Double(1.5)));
    assert_eq!(results[0].status, None);
    assert_eq!(
        results[1].value.as_ref().map(|v| v.type_id().is_some()),
        Some(true)
    );

    // A write through the gate, then read back (two permits).
    let header = c.header();
    c.send(&WriteRequest {
        request_header: header,
        nodes_to_write: Some(vec![
            WriteValue {
                node_id: slow(),
                attribute_id: AttributeId::Value as u32,
                value: DataValue::value(7.25),
                ..Default::default()
            },
            WriteValue {
                node_id: slow(),
                attribute_id: AttributeId::Value as u32,
                value: DataValue::value("not a double"),
                ..Default::default()
            },
        ]),
    });
    gate.add_permits(1);
    let (_, m) = c.read_response();
    let w = m.as_any().downcast_ref::<WriteResponse>().unwrap();
    assert_eq!(
        w.results,
        Some(vec![StatusCode::Good, StatusCode::BadTypeMismatch]),
        "the type check runs before the manager is asked"
    );
    read_of(&mut c, &[slow()]);
    gate.add_permits(1);
    let (_, m) = c.read_response();
    let r = m.as_any().downcast_ref::<ReadResponse>().unwrap();
    assert_eq!(
        r.results.as_ref().unwrap()[0].value,
        Some(Variant::Double(7.25))
    );
}
