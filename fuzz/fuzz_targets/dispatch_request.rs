//! Every service request through the server's dispatcher, on an activated
//! session of a server with the demo address space and an asynchronous
//! node manager (namespace 3): no panic, and every answer - given at once,
//! produced later by a future, or sent later through the request's
//! responder (a parked Publish) - decodes as a response or a ServiceFault
//! that echoes the request handle.
//!
//! Input: byte 0 picks a request type (the schema's "...Request"
//! structures), byte 1 the mode (`% 4`):
//! - 0: the rest (up to 8 bytes) seeds the type's sample generator, so
//!   well-formed requests with random contents reach the handlers;
//! - 1: the rest is the request body after the RequestHeader, raw, so
//!   arbitrary bytes reach the decoders and handlers of that type;
//! - 2: a Read, Write or Call (byte 0 % 3) of the asynchronous manager's
//!   nodes built from the rest: answered by a future, which is driven to
//!   completion;
//! - 3: a subscription script from the rest: CreateSubscription with fuzzed
//!   settings, CreateMonitoredItems on demo nodes, Publishes (parked) with
//!   fuzzed acknowledgements, Republish, and the subscription engine run at
//!   fuzzed times, which answers the parked Publishes.
//!
//! After every input the engine runs an hour ahead, so the Publishes still
//! parked are answered (and checked) and expired subscriptions go.
//!
//! The RequestHeader always carries the session's token (so requests get
//! past the session check) and the handle 0x5eed.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use uascale_server::address_space::{AddressSpace, Node};
use uascale_server::dispatch::{dispatch, Dispatched};
use uascale_server::node_manager::{AsyncNodeManager, NodeManagers};
use uascale_server::reply::{BoxFuture, ResponseSink};
use uascale_server::services::monitored_item;
use uascale_server::session::Session;
use uascale_server::{ServerConfig, ServerState, ServiceContext};
use uascale_types as t;
use uascale_types::generated::registry::STRUCTURES;
use uascale_types::generated::samples::sample_by_encoding_id;
use uascale_types::sample::Gen;
use uascale_types::{
    decode_message, encode_message, BinaryDecode, BinaryEncode, DataValue, DateTime, DecodeLimits,
    DynStructure, NodeClass, NodeId, QualifiedName, Reader, RequestHeader, ResponseHeader,
    StatusCode, UaString, Variant,
};

const HANDLE: u32 = 0x5eed;
const SESSION_TIMEOUT: Duration = Duration::from_secs(100 * 86_400);
/// Each input runs this long after the one before, so that the server's
/// clock never goes back (its engines assume it does not).
const STEP: Duration = Duration::from_secs(3_700);

/// Where the clock of this input starts.
fn base(f: &Fixture) -> Instant {
    f.t0 + STEP * f.runs.load(std::sync::atomic::Ordering::Relaxed)
}
/// The asynchronous manager's namespace and its variables.
const ASYNC_NS: u16 = 3;
const ASYNC_NODES: u32 = 4;

fn async_node(i: u32) -> NodeId {
    NodeId::numeric(ASYNC_NS, 100 + i)
}

/// Doubles behind futures: a read or write answers after the future was
/// polled twice (so it really is pending once); a write of another type
/// fails; calls echo their inputs.
#[derive(Default)]
struct Deferred {
    values: Mutex<[f64; ASYNC_NODES as usize]>,
}

/// Pending once, then ready with `v`.
fn after_one_poll<T: Send + 'static>(v: T) -> BoxFuture<T> {
    let mut v = Some(v);
    let mut polled = false;
    Box::pin(std::future::poll_fn(move |cx| {
        if !polled {
            polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(v.take().expect("polled after ready"))
    }))
}

impl AsyncNodeManager for Deferred {
    fn namespace_uri(&self) -> &str {
        "urn:uascale:fuzz:deferred"
    }

    fn read_value(&self, node: &NodeId) -> BoxFuture<Result<Variant, StatusCode>> {
        let i = (0..ASYNC_NODES).find(|i| async_node(*i) == *node);
        let v = match i {
            Some(i) => Ok(Variant::Double(self.values.lock().unwrap()[i as usize])),
            None => Err(StatusCode::BadNodeIdUnknown),
        };
        after_one_poll(v)
    }

    fn write_value(&self, node: &NodeId, value: Variant) -> BoxFuture<Result<(), StatusCode>> {
        let i = (0..ASYNC_NODES).find(|i| async_node(*i) == *node);
        let r = match (i, value) {
            (Some(i), Variant::Double(d)) => {
                self.values.lock().unwrap()[i as usize] = d;
                Ok(())
            }
            (Some(_), _) => Err(StatusCode::BadTypeMismatch),
            (None, _) => Err(StatusCode::BadNodeIdUnknown),
        };
        after_one_poll(r)
    }

    fn call(
        &self,
        _object: &NodeId,
        _method: &NodeId,
        inputs: Vec<Variant>,
    ) -> BoxFuture<Result<Vec<Variant>, StatusCode>> {
        after_one_poll(Ok(inputs))
    }
}

/// The answers given later through a responder.
#[derive(Debug, Default)]
struct Collect {
    sent: Mutex<Vec<Vec<u8>>>,
}

impl ResponseSink for Collect {
    fn send(&self, _request_id: u32, message: Vec<u8>) -> bool {
        self.sent.lock().unwrap().push(message);
        true
    }
}

/// Polls a future that answers without outside events to its end.
fn drive<T>(mut future: BoxFuture<T>) -> T {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..64 {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("a future of the dispatcher did not finish without outside events");
}

struct Fixture {
    state: Arc<ServerState>,
    sink: Arc<Collect>,
    t0: Instant,
    /// Inputs run so far.
    runs: std::sync::atomic::AtomicU32,
    token: NodeId,
    /// Encoding ids of the service requests.
    requests: Vec<u32>,
}

#[allow(clippy::disallowed_methods)]
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let mut space = AddressSpace::ns0().expect("ns0");
        let (demo, _) = uascale_server::demo::build(&mut space, 5);
        let mut managers = NodeManagers::default();
        managers.register(uascale_server::demo::NS, demo);
        for i in 0..ASYNC_NODES {
            let mut var = Node::new(
                NodeClass::Variable,
                async_node(i),
                QualifiedName::new(ASYNC_NS, format!("Deferred{i}")),
            );
            var.data_type = NodeId::ns0(11); // Double
            var.access_level = 3;
            space.insert(var);
        }
        managers.register_async(ASYNC_NS, Arc::new(Deferred::default()));
        // Sessions the inputs create and never activate hold their places
        // in the establishment stage; once it is full a CreateSession
        // would wait in the waiting room for a place only the session
        // reaper (not run here) frees. Refused at once instead, it stays
        // a request answered without outside events.
        let mut config = ServerConfig::default();
        config.admission.establishment_wait_ms = 0;
        let state = ServerState::from_parts(
            config,
            space,
            managers,
            uascale_server::security::SecurityState::none_only(),
        );
        // Parts of other requests, not service requests themselves.
        let parts = [
            "CallMethodRequest",
            "MonitoredItemCreateRequest",
            "MonitoredItemModifyRequest",
        ];
        let requests = STRUCTURES
            .iter()
            .filter(|(n, _, _)| n.ends_with("Request") && !parts.contains(n))
            .map(|&(_, _, enc)| enc)
            .collect();
        Fixture {
            state,
            sink: Arc::new(Collect::default()),
            t0: Instant::now(),
            runs: std::sync::atomic::AtomicU32::new(0),
            token: NodeId::opaque(0, vec![7; 32]),
            requests,
        }
    })
}

/// (Re)creates the activated session (a fuzzed CloseSession may end it).
fn ensure_session(f: &Fixture) {
    let _ = f.state.sessions.insert(
        f.token.clone(),
        Session {
            session_id: NodeId::numeric(1, 1),
            channel_id: 1,
            // Long: every input runs an hour after the last (`base`),
            // and each request moves the deadline.
            timeout: SESSION_TIMEOUT,
            deadline: base(f) + SESSION_TIMEOUT,
            activated: true,
            name: UaString::from("fuzz"),
            locale_ids: Box::default(),
            continuation_points: None,
            server_nonce: [0; 32],
            client_thumbprint: None,
            client_uri: UaString::null(),
            user: uascale_server::identity::UserIdentity::Anonymous,
            created: uascale_types::DateTime::MIN,
            endpoint_url: UaString::null(),
            security_policy: uascale_crypto::policy::SecurityPolicy::None,
            security_mode: uascale_types::MessageSecurityMode::None,
            ecc: None,
        },
    );
}

/// `msg` (encoding id + RequestHeader + body) with the header's token and
/// handle replaced.
fn with_header(msg: &[u8], token: &NodeId) -> Vec<u8> {
    let limits = DecodeLimits::default();
    let mut r = Reader::new(msg, &limits).expect("sample within limits");
    let id = NodeId::decode(&mut r).expect("sample id");
    let mut header = RequestHeader::decode(&mut r).expect("sample header");
    let rest = &msg[r.position()..];
    header.authentication_token = token.clone();
    header.request_handle = HANDLE;
    let mut out = id.to_bytes();
    header.encode(&mut out);
    out.extend_from_slice(rest);
    out
}

/// Checks one response message: it decodes as a `...Response` or a
/// ServiceFault and echoes the request handle.
fn check_response(resp: &[u8]) {
    let limits = DecodeLimits::default();
    let mut r = Reader::new(resp, &limits).expect("response within default limits");
    let m = decode_message(&mut r).expect("response decodes");
    let body = m.as_ref();
    assert!(
        body.type_name().ends_with("Response") || body.type_name() == "ServiceFault",
        "answered with {}",
        body.type_name()
    );
    let mut bytes = Vec::new();
    body.encode_body(&mut bytes);
    let mut rr = Reader::new(&bytes, &limits).expect("body within limits");
    let header = ResponseHeader::decode(&mut rr).expect("response header");
    assert_eq!(
        header.request_handle,
        HANDLE,
        "handle not echoed ({})",
        body.type_name()
    );
}

fn header(f: &Fixture) -> RequestHeader {
    RequestHeader {
        authentication_token: f.token.clone(),
        request_handle: HANDLE,
        timeout_hint: 60_000,
        ..RequestHeader::default()
    }
}

/// Dispatches `message` at `instant`; checks an answer given now or by a
/// future (driven to its end). Parked answers arrive through the sink.
fn run(f: &Fixture, message: &[u8], instant: Instant) {
    let mut ctx = ServiceContext::for_tests(Arc::clone(&f.state), instant);
    ctx.sink = Some(Arc::clone(&f.sink) as Arc<dyn ResponseSink>);
    match dispatch(&mut ctx, message) {
        Dispatched::Now(resp) => check_response(&resp),
        Dispatched::Later { future, .. } => check_response(&drive(future)),
        Dispatched::Parked => {}
    }
}

fn encoded(req: &dyn DynStructure) -> Vec<u8> {
    let mut msg = Vec::new();
    encode_message(req, &mut msg);
    msg
}

/// Runs the subscription engine at `instant` (answering parked Publishes
/// that are due) and checks what it sent.
fn run_engine(f: &Fixture, instant: Instant) {
    let now = uascale_proto::Now {
        instant,
        utc: DateTime::from_ticks(1),
    };
    let ctx = ServiceContext::internal(Arc::clone(&f.state), now);
    f.state
        .subscriptions
        .run_due(now, &mut |t| monitored_item::sample(&ctx, t));
    check_sent(f);
}

fn check_sent(f: &Fixture) {
    let sent = std::mem::take(&mut *f.sink.sent.lock().unwrap());
    for resp in sent {
        check_response(&resp);
    }
}

/// The input's bytes, one at a time; zeros once it runs out.
struct Bytes<'a>(std::slice::Iter<'a, u8>);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        self.0.next().copied().unwrap_or(0)
    }

    /// Mostly one of the asynchronous manager's nodes; sometimes one it
    /// does not have.
    fn node(&mut self) -> NodeId {
        let b = self.next();
        if b % 8 == 7 {
            NodeId::numeric(ASYNC_NS, u32::from(b))
        } else {
            async_node(u32::from(b) % ASYNC_NODES)
        }
    }
}

/// Mode 2: a Read, Write or Call of the asynchronous manager's nodes.
fn deferred(f: &Fixture, which: u8, rest: &[u8]) {
    let mut b = Bytes(rest.iter());
    let n = usize::from(b.next() % 6) + 1;
    let message = match which % 3 {
        0 => {
            let nodes = (0..n)
                .map(|_| {
                    let node_id = b.node();
                    let attr = b.next();
                    t::ReadValueId {
                        node_id,
                        attribute_id: if attr % 4 == 0 {
                            u32::from(attr % 28)
                        } else {
                            t::AttributeId::Value as u32
                        },
                        index_range: if attr % 16 == 5 {
                            UaString::from("0:1")
                        } else {
                            UaString::null()
                        },
                        ..Default::default()
                    }
                })
                .collect();
            encoded(&t::ReadRequest {
                request_header: header(f),
                max_age: 0.0,
                timestamps_to_return: t::TimestampsToReturn::Both,
                nodes_to_read: Some(nodes),
            })
        }
        1 => {
            let values = (0..n)
                .map(|_| {
                    let node_id = b.node();
                    let v = b.next();
                    let value = match v % 4 {
                        0 => Variant::Int32(i32::from(v)),
                        1 => Variant::Empty,
                        _ => Variant::Double(f64::from(v)),
                    };
                    t::WriteValue {
                        node_id,
                        attribute_id: t::AttributeId::Value as u32,
                        index_range: UaString::null(),
                        value: DataValue::value(value),
                    }
                })
                .collect();
            encoded(&t::WriteRequest {
                request_header: header(f),
                nodes_to_write: Some(values),
            })
        }
        _ => {
            let methods = (0..n)
                .map(|_| t::CallMethodRequest {
                    object_id: b.node(),
                    method_id: b.node(),
                    input_arguments: Some(vec![Variant::Double(f64::from(b.next()))]),
                })
                .collect();
            encoded(&t::CallRequest {
                request_header: header(f),
                methods_to_call: Some(methods),
            })
        }
    };
    run(f, &message, base(f));
}

/// Mode 3: a subscription, items, parked Publishes and the engine.
fn subscription_script(f: &Fixture, rest: &[u8]) {
    let mut bytes = rest.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    let created = {
        let mut ctx = ServiceContext::for_tests(Arc::clone(&f.state), base(f));
        ctx.sink = Some(Arc::clone(&f.sink) as Arc<dyn ResponseSink>);
        let msg = encoded(&t::CreateSubscriptionRequest {
            request_header: header(f),
            requested_publishing_interval: f64::from(next()) * 10.0,
            requested_lifetime_count: u32::from(next()),
            requested_max_keep_alive_count: u32::from(next() % 16),
            max_notifications_per_publish: u32::from(next() % 4),
            publishing_enabled: next() % 4 != 0,
            priority: 0,
        });
        let Some(resp) = dispatch(&mut ctx, &msg).now() else {
            return;
        };
        check_response(&resp);
        let limits = DecodeLimits::default();
        let m = decode_message(&mut Reader::new(&resp, &limits).expect("limits")).expect("decodes");
        match m.as_any().downcast_ref::<t::CreateSubscriptionResponse>() {
            Some(c) => c.subscription_id,
            None => return,
        }
    };
    let demo = [
        "Demo.Dynamic.Counter",
        "Demo.Static.Scalar.Double",
        "Demo.Static.Scalar.String",
    ];
    let items = (0..usize::from(next() % 4))
        .map(|i| {
            let name = demo[usize::from(next()) % demo.len()];
            t::MonitoredItemCreateRequest {
                item_to_monitor: t::ReadValueId {
                    node_id: NodeId::string(2, name),
                    attribute_id: t::AttributeId::Value as u32,
                    ..Default::default()
                },
                monitoring_mode: t::MonitoringMode::Reporting,
                requested_parameters: t::MonitoringParameters {
                    client_handle: i as u32,
                    sampling_interval: f64::from(next()) * 5.0,
                    filter: t::ExtensionObject::null(),
                    queue_size: u32::from(next() % 5),
                    discard_oldest: true,
                },
            }
        })
        .collect();
    run(
        f,
        &encoded(&t::CreateMonitoredItemsRequest {
            request_header: header(f),
            subscription_id: created,
            timestamps_to_return: t::TimestampsToReturn::Both,
            items_to_create: Some(items),
        }),
        base(f),
    );
    // Steps: Publish (with acks), Republish, or time passing.
    let mut at = base(f);
    for _ in 0..16 {
        match next() % 4 {
            0 | 1 => {
                let acks = (0..usize::from(next() % 3))
                    .map(|_| t::SubscriptionAcknowledgement {
                        subscription_id: if next() % 8 == 0 { 0 } else { created },
                        sequence_number: u32::from(next() % 8),
                    })
                    .collect();
                run(
                    f,
                    &encoded(&t::PublishRequest {
                        request_header: header(f),
                        subscription_acknowledgements: Some(acks),
                    }),
                    at,
                );
            }
            2 => run(
                f,
                &encoded(&t::RepublishRequest {
                    request_header: header(f),
                    subscription_id: created,
                    retransmit_sequence_number: u32::from(next() % 8),
                }),
                at,
            ),
            _ => {
                at += Duration::from_millis(u64::from(next()) * 20);
                run_engine(f, at);
            }
        }
        check_sent(f);
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let f = fixture();
    ensure_session(f);
    let rest = &data[2..];
    match data[1] % 4 {
        2 => deferred(f, data[0], rest),
        3 => subscription_script(f, rest),
        mode => {
            let enc = f.requests[usize::from(data[0]) % f.requests.len()];
            let message = if mode == 0 {
                let mut seed = [0u8; 8];
                let n = rest.len().min(8);
                seed[..n].copy_from_slice(&rest[..n]);
                let Some(value) =
                    sample_by_encoding_id(enc, &mut Gen::new(u64::from_le_bytes(seed)))
                else {
                    return;
                };
                let mut msg = Vec::new();
                encode_message(value.as_ref(), &mut msg);
                with_header(&msg, &f.token)
            } else {
                let mut msg = NodeId::numeric(0, enc).to_bytes();
                header(f).encode(&mut msg);
                msg.extend_from_slice(rest);
                msg
            };
            run(f, &message, base(f));
        }
    }
    check_sent(f);
    // An hour on: the Publishes still parked are answered, expired
    // subscriptions go (so they do not pile up over the run).
    run_engine(f, base(f) + Duration::from_secs(3600));
    f.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
});
