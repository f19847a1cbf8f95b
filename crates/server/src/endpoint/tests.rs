//! The request lifecycle on simulated time, with no sockets and no
//! runtime: requests go through [`submit::submit`] as a connection would
//! hand them over, workers are this test taking jobs from the scheduler,
//! and a request whose answer waits (the demo's slow asynchronous nodes)
//! holds its worker until the test drops its task. Every assertion is on
//! what was answered and in which order.
//!
//! Each policy was broken on purpose once to see its test fail (and put
//! back): lanes that never give up their turn, the per-owner limit
//! ignored, no protected places (for CloseSession, and for a new
//! client's CreateSession: the bootstrap stage), Cancel leaving the queued job in the
//! scheduler, teardown keeping a held Publish's worker, no limit of
//! unfinished handshakes per address - each failed exactly its test.

// Tests take one real instant as the origin of their simulated time.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_proto::security::ChannelSecurity;
use uascale_types::{
    ActivateSessionRequest, AnonymousIdentityToken, AttributeId, CloseSessionRequest,
    CreateSessionRequest, CreateSessionResponse, CreateSubscriptionRequest, DateTime, DecodeLimits,
    DynStructure, ExtensionObject, NodeId, PublishRequest, ReadRequest, ReadValueId, Reader,
    RequestHeader, ServiceFault, StatusCode, UaString,
};

use super::*;
use crate::config::ServerConfig;
use crate::config::{IsolationProfile, RequestsSection};
use crate::scheduler::Job as QueuedJob;

/// A server state, its endpoint and a simulated clock.
struct Sim {
    endpoint: Arc<Endpoint>,
    now: Instant,
    next_request: u32,
}

/// A client on one channel: its record and session token.
struct Client {
    channel: Arc<Channel>,
    token: NodeId,
    handle: u32,
}

fn config(requests: RequestsSection) -> crate::ServerConfig {
    let mut c = ServerConfig {
        server: crate::config::ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            ..Default::default()
        },
        security: crate::config::SecurityConfig::none_only(),
        ..Default::default()
    };
    c.requests = requests;
    // The demo's slow folder answers after an hour: its Reads hold their
    // worker until the test drops their task.
    c.demo.slow = Duration::from_secs(3600);
    c
}

impl Sim {
    /// A subscription for `c` (1 s publishing), answered at once.
    fn subscribe(&mut self, c: &mut Client) {
        let create = CreateSubscriptionRequest {
            request_header: c.header(),
            requested_publishing_interval: 1000.0,
            requested_lifetime_count: 300,
            requested_max_keep_alive_count: 100,
            publishing_enabled: true,
            ..Default::default()
        };
        assert!(matches!(self.submit(c, &create).1, Submit::Answer(_)));
    }

    fn new(requests: RequestsSection) -> Sim {
        let state = ServerState::new(config(requests)).expect("state");
        Sim {
            endpoint: Endpoint::new(state, None),
            now: Instant::now(),
            next_request: 1,
        }
    }

    fn state(&self) -> &Arc<ServerState> {
        self.endpoint.state()
    }

    fn at(&self) -> Now {
        Now {
            instant: self.now,
            utc: DateTime::from_ticks(1),
        }
    }

    /// Submits `request` on `c`'s channel as a connection would; the
    /// secure-channel request id it was given.
    fn submit(&mut self, c: &Client, request: &dyn DynStructure) -> (u32, Submit) {
        let request_id = self.next_request;
        self.next_request += 1;
        let mut body = Vec::new();
        uascale_types::encode_message(request, &mut body);
        let mut ctx = ServiceContext::new(
            Arc::clone(self.state()),
            c.channel.id(),
            ChannelSecurity::none(),
            self.at(),
            Some(Arc::clone(&c.channel) as Arc<dyn ResponseSink>),
        );
        ctx.request_id = request_id;
        (request_id, submit::submit(&mut ctx, &c.channel, &body))
    }

    /// A connection from 127.0.0.`host`, admitted, with no session.
    fn bare(&mut self, host: u8) -> Client {
        let peer = SocketAddr::from(([127, 0, 0, host], 40_000));
        let channel = self
            .endpoint
            .accept(peer, None, self.now)
            .expect("admitted");
        Client {
            channel,
            token: NodeId::default(),
            handle: 0,
        }
    }

    /// A connection from 127.0.0.`host` with an activated session.
    fn client(&mut self, host: u8) -> Client {
        let mut c = self.bare(host);
        let create = c.create_session("sim");
        let Submit::Answer(m) = self.submit(&c, &create).1 else {
            panic!("CreateSession not answered at once");
        };
        let m = decode(&m);
        c.token = m
            .as_any()
            .downcast_ref::<CreateSessionResponse>()
            .unwrap_or_else(|| panic!("CreateSession failed: {m:?}"))
            .authentication_token
            .clone();
        let activate = ActivateSessionRequest {
            request_header: c.header(),
            user_identity_token: ExtensionObject::new(AnonymousIdentityToken {
                policy_id: UaString::from("anonymous"),
            }),
            ..Default::default()
        };
        let Submit::Answer(m) = self.submit(&c, &activate).1 else {
            panic!("ActivateSession not answered at once");
        };
        assert!(
            decode(&m)
                .as_any()
                .downcast_ref::<uascale_types::ActivateSessionResponse>()
                .is_some(),
            "activation failed"
        );
        c
    }

    /// Takes the next queued job for a free worker and runs it; a task it
    /// hands back is dropped (its worker is given back). The channel it
    /// came on; `None` when nothing can be taken.
    fn work_one(&self) -> Option<u32> {
        let (slot, job): (_, QueuedJob) = self.state().scheduler.take(self.now)?;
        let channel = job.channel_id();
        drop(job.run(slot, self.at()));
        Some(channel)
    }

    /// Occupies every worker with a slow Read of `c` (tasks kept, not
    /// run) and queues one more, so that the queue has requests waiting.
    fn saturate(&mut self, c: &mut Client, workers: usize) -> Vec<Spawn> {
        let mut held = Vec::new();
        for i in 0..workers {
            let read = c.read(slow(i));
            match self.submit(c, &read).1 {
                Submit::Spawn(task) => held.push(task),
                other => panic!("a slow Read became {other:?}"),
            }
        }
        let read = c.read(slow(0));
        assert!(matches!(self.submit(c, &read).1, Submit::Queued));
        assert!(self.state().scheduler.has_waiting());
        held
    }
}

impl Client {
    /// A CreateSession request named `name`.
    fn create_session(&mut self, name: &str) -> CreateSessionRequest {
        CreateSessionRequest {
            request_header: self.header(),
            session_name: UaString::from(name),
            requested_session_timeout: 60_000.0,
            ..Default::default()
        }
    }

    fn header(&mut self) -> RequestHeader {
        self.handle += 1;
        RequestHeader {
            authentication_token: self.token.clone(),
            request_handle: self.handle,
            timeout_hint: 60_000,
            ..Default::default()
        }
    }

    fn read(&mut self, node: NodeId) -> ReadRequest {
        ReadRequest {
            request_header: self.header(),
            nodes_to_read: Some(vec![ReadValueId {
                node_id: node,
                attribute_id: AttributeId::Value as u32,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }
}

fn slow(i: usize) -> NodeId {
    NodeId::string(2, format!("Demo.Slow.{i}"))
}

/// A node every Read answers at once (Server_ServerStatus_State).
fn fast() -> NodeId {
    NodeId::ns0(2259)
}

fn decode(message: &[u8]) -> Box<dyn DynStructure> {
    let limits = DecodeLimits::default();
    uascale_types::decode_message(&mut Reader::new(message, &limits).expect("reader"))
        .expect("an answer that decodes")
}

/// The status of a ServiceFault answer (`None` for any other answer).
fn fault_of(message: &[u8]) -> Option<(StatusCode, Option<Duration>)> {
    let m = decode(message);
    let f = m.as_any().downcast_ref::<ServiceFault>()?;
    Some((
        f.response_header.service_result,
        crate::error::retry_after_of(&f.response_header),
    ))
}

fn requests(profile: IsolationProfile) -> RequestsSection {
    RequestsSection {
        min_request_thread_count: 2,
        max_request_thread_count: 2,
        isolation_profile: profile,
        ..Default::default()
    }
}

/// Client A floods (20 Reads waiting behind a full pool), client B sends
/// one; the order in which workers take them.
fn flood_order(profile: IsolationProfile) -> Vec<u32> {
    let mut sim = Sim::new(requests(profile));
    let mut a = sim.client(1);
    let mut b = sim.client(2);
    let held = sim.saturate(&mut a, 2);
    for _ in 0..20 {
        let read = a.read(fast());
        assert!(matches!(sim.submit(&a, &read).1, Submit::Queued));
    }
    let read = b.read(fast());
    assert!(matches!(sim.submit(&b, &read).1, Submit::Queued));
    // The workers come free; every queued job is taken in turn.
    drop(held);
    let mut order = Vec::new();
    while let Some(channel) = sim.work_one() {
        order.push(if channel == a.channel.id() { 1 } else { 2 });
    }
    assert_eq!(order.len(), 22, "every queued request ran");
    // B's answer went to B's channel, A's 21 to A's.
    assert_eq!(b.channel.take().0.len(), 1);
    order
}

/// Under `fair_share` and `balanced` each owner has a lane, served in
/// turns: B's one Read is taken second, after the answer of A's that was
/// first in line, not behind A's twenty.
#[test]
fn fair_profiles_serve_a_lone_request_in_turn() {
    for profile in [IsolationProfile::FairShare, IsolationProfile::Balanced] {
        let order = flood_order(profile);
        let at = order.iter().position(|&o| o == 2).expect("B ran");
        assert!(
            at <= 2,
            "{profile:?}: B's request was taken {at}th: {order:?}"
        );
    }
}

/// Under `shared_only` one FIFO: B waits behind all of A's flood.
#[test]
fn shared_only_starves_the_lone_request() {
    let order = flood_order(IsolationProfile::SharedOnly);
    assert_eq!(order.last(), Some(&2), "{order:?}");
}

/// A queue of 100 full of A's Reads (both workers held by A's slow
/// Reads, 99 fast ones waiting behind one more slow one) under `profile`;
/// B has a session and nothing queued.
fn full_queue(profile: IsolationProfile) -> (Sim, Client, Client, Vec<Spawn>) {
    let mut sim = Sim::new(RequestsSection {
        max_queued_request_count: 100,
        max_queued_requests_per_owner: 1000,
        ..requests(profile)
    });
    let mut a = sim.client(1);
    let b = sim.client(2);
    let held = sim.saturate(&mut a, 2);
    for _ in 0..99 {
        let read = a.read(fast());
        assert!(matches!(sim.submit(&a, &read).1, Submit::Queued));
    }
    (sim, a, b, held)
}

/// A full queue sheds an ordinary request with a hint, counted by stage and
/// reason; under `balanced` a control request (CloseSession) still finds
/// its protected place, and under `fair_share` it does not.
#[test]
fn protected_places_take_control_requests_a_flood_cannot() {
    for (profile, protected) in [
        (IsolationProfile::Balanced, true),
        (IsolationProfile::FairShare, false),
    ] {
        let (mut sim, _a, mut b, _held) = full_queue(profile);
        let read = b.read(fast());
        let Submit::Answer(m) = sim.submit(&b, &read).1 else {
            panic!("{profile:?}: B's Read was not shed");
        };
        let (status, hint) = fault_of(&m).expect("a ServiceFault");
        assert_eq!(status, StatusCode::BadServerTooBusy);
        assert!(hint.is_some_and(|h| h > Duration::ZERO), "no hint");
        let metrics = &sim.state().metrics;
        assert_eq!(metrics.shed_count(Stage::Queue, Reason::Full), 1);
        let close = CloseSessionRequest {
            request_header: b.header(),
            delete_subscriptions: true,
        };
        let (_, outcome) = sim.submit(&b, &close);
        assert_eq!(
            matches!(outcome, Submit::Queued),
            protected,
            "{profile:?}: CloseSession became {outcome:?}"
        );
        if protected {
            assert_eq!(sim.state().scheduler.usage(Stage::Control), 1);
        }
    }
}

/// With the queue full of A's Reads, a new client's CreateSession and an
/// established client's CloseSession take their protected places under
/// `balanced` (queued, not shed) and are refused busy with a hint under
/// `shared_only`.
#[test]
fn session_management_gets_through_a_full_queue_under_balanced_only() {
    for (profile, protected) in [
        (IsolationProfile::Balanced, true),
        (IsolationProfile::SharedOnly, false),
    ] {
        let (mut sim, mut a, mut b, _held) = full_queue(profile);
        let read = a.read(fast());
        assert!(
            matches!(sim.submit(&a, &read).1, Submit::Answer(_)),
            "queue full"
        );
        let mut c = sim.bare(3);
        let create = c.create_session("late");
        let close = CloseSessionRequest {
            request_header: b.header(),
            delete_subscriptions: true,
        };
        for (what, outcome) in [
            ("CreateSession", sim.submit(&c, &create).1),
            ("CloseSession", sim.submit(&b, &close).1),
        ] {
            match outcome {
                Submit::Queued => assert!(protected, "{profile:?}: {what} queued"),
                Submit::Answer(m) => {
                    assert!(!protected, "{profile:?}: {what} answered at once");
                    let (status, hint) = fault_of(&m).expect("a ServiceFault");
                    assert_eq!(status, StatusCode::BadServerTooBusy, "{what}");
                    assert!(hint.is_some_and(|h| h > Duration::ZERO), "{what}: no hint");
                }
                other => panic!("{profile:?}: {what} became {other:?}"),
            }
        }
    }
}

/// An owner with `max_queued_requests_per_owner` waiting is shed (reason
/// `owner_limit`) while another owner still gets in.
#[test]
fn per_owner_limit_sheds_only_the_flooder() {
    let mut sim = Sim::new(RequestsSection {
        max_queued_requests_per_owner: 5,
        ..requests(IsolationProfile::FairShare)
    });
    let mut a = sim.client(1);
    let mut b = sim.client(2);
    // The queued slow Read is the first of A's five.
    let _held = sim.saturate(&mut a, 2);
    for _ in 0..4 {
        let read = a.read(fast());
        assert!(matches!(sim.submit(&a, &read).1, Submit::Queued));
    }
    let read = a.read(fast());
    let Submit::Answer(m) = sim.submit(&a, &read).1 else {
        panic!("A's sixth was not shed");
    };
    assert_eq!(
        fault_of(&m).map(|f| f.0),
        Some(StatusCode::BadServerTooBusy)
    );
    assert_eq!(
        sim.state()
            .metrics
            .shed_count(Stage::Queue, Reason::OwnerLimit),
        1
    );
    let read = b.read(fast());
    assert!(matches!(sim.submit(&b, &read).1, Submit::Queued));
}

/// Cancel looks in the channel's one table: a queued Read and a running
/// one named by the handle are both answered
/// `BadRequestCancelledByClient`, the queued one leaves the queue, the
/// running one's worker is given back when its task ends.
#[test]
fn cancel_reaches_queued_and_running_requests() {
    let mut sim = Sim::new(requests(IsolationProfile::Balanced));
    let mut a = sim.client(1);
    let mut running = Vec::new();
    let mut ids = Vec::new();
    for i in 0..2 {
        let mut read = a.read(slow(i));
        read.request_header.request_handle = 77;
        let (id, outcome) = sim.submit(&a, &read);
        let Submit::Spawn(task) = outcome else {
            panic!("a slow Read became {outcome:?}");
        };
        ids.push(id);
        running.push(task);
    }
    // A third finds every worker busy: its answer queues for one.
    let mut read = a.read(slow(2));
    read.request_header.request_handle = 77;
    let (id, outcome) = sim.submit(&a, &read);
    assert!(matches!(outcome, Submit::Queued));
    ids.push(id);
    let scheduler = &sim.state().scheduler;
    assert_eq!((scheduler.busy(), scheduler.waiting()), (2, 1));
    let ctx = ServiceContext::new(
        Arc::clone(sim.state()),
        a.channel.id(),
        ChannelSecurity::none(),
        sim.at(),
        Some(Arc::clone(&a.channel) as Arc<dyn ResponseSink>),
    );
    let cancelled = a.channel.cancel(scheduler, 77, ctx.now);
    assert_eq!(cancelled, 3);
    assert_eq!(scheduler.waiting(), 0, "the queued one left the queue");
    let (answers, _) = a.channel.take();
    let mut answered: Vec<u32> = answers.iter().map(|(id, _)| *id).collect();
    answered.sort_unstable();
    assert_eq!(answered, ids);
    for (_, m) in &answers {
        assert_eq!(
            fault_of(m).map(|f| f.0),
            Some(StatusCode::BadRequestCancelledByClient)
        );
    }
    // The aborted tasks end at their next poll and give their workers back.
    for task in running {
        poll_once(task);
    }
    assert_eq!(scheduler.busy(), 0);
    // A second Cancel finds nothing.
    assert_eq!(a.channel.cancel(scheduler, 77, ctx.now), 0);
}

/// Teardown is the one way out: it drops the channel's queued requests,
/// aborts its running ones, gives back its unfinished-handshake place and
/// deregisters it - whatever ended the connection.
#[test]
fn teardown_releases_every_place() {
    let mut sim = Sim::new(requests(IsolationProfile::Balanced));
    let mut a = sim.client(1);
    let b = sim.client(2);
    let held = sim.saturate(&mut a, 2);
    assert_eq!(sim.endpoint.connection_count(), 2);
    sim.endpoint.teardown(&a.channel, sim.now);
    let scheduler = &sim.state().scheduler;
    assert_eq!(scheduler.waiting(), 0, "queued requests dropped");
    for task in held {
        poll_once(task);
    }
    assert_eq!(scheduler.busy(), 0, "running requests aborted");
    assert_eq!(sim.endpoint.connection_count(), 1);
    assert!(!a.channel.is_open(), "later answers are refused");
    assert!(!a.channel.send(1, vec![1]));
    drop(b);
}

/// An address may hold `max_unfinished_handshakes_per_address`
/// connections without an activated session; the next is shed at the
/// handshake stage (reason `address_handshakes`), counted, and the place
/// comes back when one of them closes or activates a session.
#[test]
fn unfinished_handshakes_per_address_are_bounded_and_given_back() {
    let mut config = config(requests(IsolationProfile::Balanced));
    config.admission.max_unfinished_handshakes_per_address = 2;
    let state = ServerState::new(config).expect("state");
    let endpoint = Endpoint::new(state, None);
    let now = Instant::now();
    let peer = SocketAddr::from(([127, 0, 0, 9], 1));
    let one = endpoint.accept(peer, None, now).expect("first");
    let _two = endpoint.accept(peer, None, now).expect("second");
    let shed = endpoint.accept(peer, None, now).expect_err("third");
    assert_eq!(
        (shed.stage, shed.reason),
        (Stage::Handshake, Reason::AddressHandshakes)
    );
    assert_eq!(shed.status(), StatusCode::BadTcpServerTooBusy);
    assert!(shed.err_reason().contains("RetryAfterMs="));
    assert_eq!(
        endpoint
            .state()
            .metrics
            .shed_count(Stage::Handshake, Reason::AddressHandshakes),
        1
    );
    // Another address is not affected.
    let _other = endpoint
        .accept(SocketAddr::from(([127, 0, 0, 10], 1)), None, now)
        .expect("another address");
    endpoint.teardown(&one, now);
    assert!(endpoint.accept(peer, None, now).is_ok(), "place given back");
}

/// A held Publish parks (no worker kept); the parked stage is bounded and
/// a Publish over it is shed (`parked`, `full`) with a hint.
#[test]
fn held_publishes_park_within_their_stage() {
    let mut sim = Sim::new(RequestsSection {
        max_parked_request_count: Some(1),
        ..requests(IsolationProfile::Balanced)
    });
    let mut a = sim.client(1);
    sim.subscribe(&mut a);
    let publish = |a: &mut Client| PublishRequest {
        request_header: a.header(),
        subscription_acknowledgements: None,
    };
    let p = publish(&mut a);
    assert!(matches!(sim.submit(&a, &p).1, Submit::Parked));
    let scheduler = &sim.state().scheduler;
    assert_eq!(scheduler.usage(Stage::Parked), 1);
    assert_eq!(scheduler.busy(), 0, "a parked Publish holds no worker");
    let p = publish(&mut a);
    let Submit::Answer(m) = sim.submit(&a, &p).1 else {
        panic!("the second Publish was not shed");
    };
    let (status, hint) = fault_of(&m).expect("a ServiceFault");
    assert_eq!(status, StatusCode::BadServerTooBusy);
    assert!(hint.is_some());
    assert_eq!(
        sim.state().metrics.shed_count(Stage::Parked, Reason::Full),
        1
    );
}

/// In the legacy mode (`decouple_held_publish_requests = false`) a held
/// Publish keeps its worker slot until it is answered; the channel's
/// teardown gives that slot back with everything else.
#[test]
fn teardown_gives_back_the_worker_a_held_publish_kept() {
    let mut sim = Sim::new(RequestsSection {
        decouple_held_publish_requests: false,
        ..requests(IsolationProfile::Balanced)
    });
    let mut a = sim.client(1);
    sim.subscribe(&mut a);
    let p = PublishRequest {
        request_header: a.header(),
        subscription_acknowledgements: None,
    };
    assert!(matches!(sim.submit(&a, &p).1, Submit::Parked));
    let scheduler = &sim.state().scheduler;
    assert_eq!(scheduler.busy(), 1, "the held Publish keeps a worker");
    sim.endpoint.teardown(&a.channel, sim.now);
    assert_eq!(scheduler.busy(), 0, "teardown gave the worker back");
}

/// Polls a task once with a waker that does nothing (an aborted task ends
/// there, dropping what it held).
fn poll_once(mut task: Spawn) {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let _ = task.as_mut().poll(&mut cx);
}

/// A Hello, as the bytes a client sends.
fn hello_bytes(url: &str) -> Vec<u8> {
    let mut b = Vec::new();
    uascale_proto::tcp::Hello {
        protocol_version: 0,
        receive_buffer_size: 65535,
        send_buffer_size: 65535,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: uascale_types::UaString::from(url),
    }
    .encode_message(&mut b);
    b
}

/// Feeds `bytes` to a new connection of `endpoint` from `peer` and hands
/// its events over; what it sends, as message types and the ERR's reason.
fn hello_answer(
    endpoint: &Arc<Endpoint>,
    peer: SocketAddr,
    url: &str,
    now: Instant,
) -> (Vec<uascale_proto::tcp::MessageType>, String) {
    let channel = endpoint.accept(peer, None, now).expect("accepted");
    let clock = Now {
        instant: now,
        utc: DateTime::from_ticks(1),
    };
    let mut conn = endpoint.connection(&channel, clock);
    let mut bytes = hello_bytes(url);
    conn.handle_input(clock, &mut bytes).expect("a valid Hello");
    endpoint.handle_events(&mut conn, &channel, clock, &mut |_| {});
    let mut out = Vec::new();
    conn.poll_transmit(&mut out);
    let (mut kinds, mut reason, mut at) = (Vec::new(), String::new(), 0);
    while let Ok(Some(h)) = uascale_proto::tcp::MessageHeader::parse(&out[at..], 1 << 20) {
        let end = at + h.message_size as usize;
        if h.message_type == uascale_proto::tcp::MessageType::Error {
            let e = uascale_proto::tcp::ErrorMessage::decode_body(&out[at + 8..end]).expect("ERR");
            reason = e.reason.as_str().unwrap_or_default().to_owned();
        }
        kinds.push(h.message_type);
        at = end;
    }
    endpoint.teardown(&channel, now);
    (kinds, reason)
}

/// While the handshake stage would refuse a secured OpenSecureChannel,
/// a Hello is answered with the busy ERR (its hint and a retry ticket,
/// counted at the handshake stage) instead of the Acknowledge, so the
/// client spends nothing on an OpenSecureChannel; with room, and for a
/// ticket holder at its slot, the Acknowledge.
#[test]
fn a_hello_is_refused_while_its_handshake_would_be() {
    use uascale_proto::tcp::MessageType;
    let mut config = config(requests(IsolationProfile::Balanced));
    config.admission.max_concurrent_handshakes = Some(1);
    config.admission.handshake_wait_ms = 0;
    let state = ServerState::new(config).expect("state");
    let endpoint = Endpoint::new(state, None);
    let now = Instant::now();
    let peer = SocketAddr::from(([127, 0, 0, 9], 1));
    let url = "opc.tcp://127.0.0.1:4840/";
    assert_eq!(
        hello_answer(&endpoint, peer, url, now).0,
        [MessageType::Acknowledge]
    );
    let busy = endpoint.accept(peer, None, now).expect("accepted");
    let HandshakeDecision::Admit(place) = endpoint.handshake(&busy, None, now) else {
        panic!("the one place")
    };
    let (kinds, reason) = hello_answer(&endpoint, peer, url, now);
    assert_eq!(kinds, [MessageType::Error]);
    assert!(reason.contains("RetryAfterMs="), "{reason}");
    let ticket = reason
        .split("RetryTicket=")
        .nth(1)
        .and_then(|t| t.split([';', ' ']).next())
        .expect("a ticket")
        .to_owned();
    assert_eq!(
        endpoint
            .state()
            .metrics
            .shed_count(Stage::Handshake, Reason::HandshakeLimit),
        1
    );
    let hint: u64 = reason
        .split("RetryAfterMs=")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("a hint");
    let back = now + Duration::from_millis(hint);
    let with_ticket = format!("{url}?RetryTicket={ticket}");
    assert_eq!(
        hello_answer(&endpoint, peer, &with_ticket, back).0,
        [MessageType::Acknowledge],
        "a ticket holder at its slot"
    );
    drop(place);
    endpoint.teardown(&busy, now);
    assert_eq!(
        hello_answer(&endpoint, peer, url, back).0,
        [MessageType::Acknowledge],
        "room again"
    );
}
