//! In-memory scenarios on a simulated clock: a scripted client drives a
//! [`ServerConnection`] through handshake, chunked requests, renewal, close
//! and abuse; no sockets, no runtime.

use super::*;
use crate::chunk::{write_chunks, SequenceNumbers, POLICY_NONE_URI, SYMMETRIC_OVERHEAD};
use crate::tcp::{Acknowledge, ChunkType};
use uascale_types::{ReadRequest, ReadValueId, RequestHeader};

const CHANNEL: u32 = 42;

pub(super) struct Clock {
    start: Instant,
    offset: Duration,
}

impl Clock {
    // The simulated clock needs one real origin; everything after is offsets.
    #[allow(clippy::disallowed_methods)]
    pub(super) fn new() -> Self {
        Clock {
            start: Instant::now(),
            offset: Duration::ZERO,
        }
    }
    pub(super) fn now(&self) -> Now {
        Now {
            instant: self.start + self.offset,
            utc: DateTime::from_ticks(
                133_590_384_000_000_000 + self.offset.as_micros() as i64 * 10,
            ),
        }
    }
    pub(super) fn advance(&mut self, d: Duration) {
        self.offset += d;
    }
}

/// A scripted client that speaks just enough of the protocol.
struct TestClient {
    seq: SequenceNumbers,
    token: u32,
    chunk_size: usize,
}

impl TestClient {
    fn new() -> Self {
        TestClient {
            seq: SequenceNumbers::starting_at(51),
            token: 0,
            chunk_size: 8192,
        }
    }

    fn hello(&self) -> Vec<u8> {
        let mut w = Vec::new();
        Hello {
            protocol_version: 0,
            receive_buffer_size: self.chunk_size as u32,
            send_buffer_size: self.chunk_size as u32,
            max_message_size: 0,
            max_chunk_count: 0,
            endpoint_url: UaString::from("opc.tcp://localhost:4840"),
        }
        .encode_message(&mut w);
        w
    }

    fn open(
        &mut self,
        request_type: SecurityTokenRequestType,
        channel_id: u32,
        policy: &str,
    ) -> Vec<u8> {
        let req = OpenSecureChannelRequest {
            request_header: RequestHeader {
                request_handle: 1,
                ..Default::default()
            },
            client_protocol_version: 0,
            request_type,
            security_mode: MessageSecurityMode::None,
            client_nonce: ByteString::new(vec![]),
            requested_lifetime: 60_000,
        };
        let mut body = Vec::new();
        encode_message(&req, &mut body);
        let mut out = Vec::new();
        let limits = self.limits();
        let header = AsymmetricHeader {
            policy_uri: UaString::from(policy),
            ..AsymmetricHeader::none()
        };
        write_chunks(
            &mut out,
            MessageType::OpenSecureChannel,
            channel_id,
            &SecurityHeader::Asymmetric(header),
            &mut self.seq,
            1,
            &body,
            &limits,
        )
        .unwrap();
        out
    }

    fn limits(&self) -> SendLimits {
        SendLimits {
            max_chunk_size: self.chunk_size,
            max_message_size: 0,
            max_chunk_count: 0,
        }
    }

    fn request(&mut self, request_id: u32, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let limits = self.limits();
        write_chunks(
            &mut out,
            MessageType::Message,
            CHANNEL,
            &SecurityHeader::Symmetric(self.token),
            &mut self.seq,
            request_id,
            message,
            &limits,
        )
        .unwrap();
        out
    }

    fn close(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        encode_message(&CloseSecureChannelRequest::default(), &mut body);
        let mut out = Vec::new();
        let limits = self.limits();
        write_chunks(
            &mut out,
            MessageType::CloseSecureChannel,
            CHANNEL,
            &SecurityHeader::Symmetric(self.token),
            &mut self.seq,
            99,
            &body,
            &limits,
        )
        .unwrap();
        out
    }
}

fn server(clock: &Clock, budget: &Arc<ReassemblyBudget>) -> ServerConnection {
    PendingConnection::new().accept(
        clock.now(),
        CHANNEL,
        Arc::new(ChannelConfig::default()),
        Arc::clone(budget),
    )
}

pub(super) fn feed(
    s: &mut ServerConnection,
    clock: &Clock,
    bytes: &[u8],
) -> Result<(), ChannelError> {
    let mut input = bytes.to_vec();
    let r = s.handle_input(clock.now(), &mut input);
    if r.is_ok() {
        assert!(input.is_empty(), "whole messages are consumed");
    }
    r
}

pub(super) fn take_out(s: &mut ServerConnection) -> Vec<u8> {
    let mut out = Vec::new();
    s.poll_transmit(&mut out);
    out
}

pub(super) fn events(s: &mut ServerConnection) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

/// Splits the server's output into (header, whole message) pairs.
pub(super) fn messages(bytes: &[u8]) -> Vec<(MessageHeader, Vec<u8>)> {
    crate::tcp::split_messages(bytes)
        .into_iter()
        .map(|(h, m)| (h, m.to_vec()))
        .collect()
}

pub(super) fn expect_error(bytes: &[u8], status: StatusCode) {
    let msgs = messages(bytes);
    let (h, m) = msgs.last().expect("an ERR message");
    assert_eq!(h.message_type, MessageType::Error);
    assert_eq!(
        ErrorMessage::decode_body(&m[HEADER_LEN..]).unwrap().error,
        status
    );
}

/// An OPN of SecurityPolicy None does no asymmetric work: given to
/// `receive_open`, it is answered at once, as `handle_input` would; there
/// is no second step.
#[test]
fn an_unsecured_open_has_no_asymmetric_work() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let mut s = server(&clock, &budget);
    let mut c = TestClient::new();
    feed(&mut s, &clock, &c.hello()).unwrap();
    take_out(&mut s);
    let mut opn = c.open(SecurityTokenRequestType::Issue, 0, POLICY_NONE_URI);
    assert!(!s.has_asymmetric_work(&opn));
    assert!(s.receive_open(clock.now(), &mut opn).unwrap().is_none());
    assert!(opn.is_empty());
    let out = take_out(&mut s);
    assert_eq!(
        messages(&out)[0].0.message_type,
        MessageType::OpenSecureChannel
    );
    assert_eq!(
        events(&mut s),
        vec![Event::Opened {
            channel_id: CHANNEL
        }]
    );
}

/// HEL/ACK and OPN; returns the server and the client with its token.
fn open_channel(clock: &Clock, budget: &Arc<ReassemblyBudget>) -> (ServerConnection, TestClient) {
    let mut s = server(clock, budget);
    let mut c = TestClient::new();
    feed(&mut s, clock, &c.hello()).unwrap();
    let out = take_out(&mut s);
    let (h, ack) = &messages(&out)[0];
    assert_eq!(h.message_type, MessageType::Acknowledge);
    let ack = Acknowledge::decode_body(&ack[HEADER_LEN..]).unwrap();
    assert_eq!(ack.receive_buffer_size, 8192);
    feed(
        &mut s,
        clock,
        &c.open(SecurityTokenRequestType::Issue, 0, POLICY_NONE_URI),
    )
    .unwrap();
    let out = take_out(&mut s);
    let (h, m) = &messages(&out)[0];
    assert_eq!(h.message_type, MessageType::OpenSecureChannel);
    let chunk = Chunk::parse(h, m).unwrap();
    assert_eq!(chunk.channel_id, CHANNEL);
    assert_eq!(chunk.request_id, 1);
    let resp =
        decode_message(&mut Reader::new(chunk.body, &DecodeLimits::default()).unwrap()).unwrap();
    let resp = resp
        .as_any()
        .downcast_ref::<OpenSecureChannelResponse>()
        .unwrap();
    assert_eq!(resp.security_token.channel_id, CHANNEL);
    assert_eq!(resp.security_token.revised_lifetime, 60_000);
    assert_eq!(resp.response_header.request_handle, 1);
    c.token = resp.security_token.token_id;
    assert_eq!(
        events(&mut s),
        vec![Event::Opened {
            channel_id: CHANNEL
        }]
    );
    (s, c)
}

pub(super) fn read_request(n: usize) -> Vec<u8> {
    let req = ReadRequest {
        nodes_to_read: Some(
            (0..n)
                .map(|i| ReadValueId {
                    node_id: uascale_types::NodeId::string(2, format!("Demo.Node{i}")),
                    attribute_id: 13,
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    };
    let mut m = Vec::new();
    encode_message(&req, &mut m);
    m
}

#[test]
fn handshake_request_and_response() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut s, mut c) = open_channel(&clock, &budget);
    let msg = read_request(3);
    feed(&mut s, &clock, &c.request(7, &msg)).unwrap();
    assert_eq!(
        events(&mut s),
        vec![Event::Request {
            request_id: 7,
            body: msg.clone()
        }]
    );
    s.send_response(7, &msg).unwrap();
    let out = take_out(&mut s);
    let (h, m) = &messages(&out)[0];
    let chunk = Chunk::parse(h, m).unwrap();
    assert_eq!(
        (chunk.request_id, chunk.security.clone()),
        (7, SecurityHeader::Symmetric(c.token))
    );
    assert_eq!(chunk.body, &msg[..]);
}

#[test]
fn chunked_messages_both_ways() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut s, mut c) = open_channel(&clock, &budget);
    let msg = read_request(1000); // ~20 KB: three 8 KiB chunks
    let bytes = c.request(8, &msg);
    assert!(messages(&bytes).len() >= 3);
    // Feed one byte at a time: partial input stays buffered.
    let mut input = Vec::new();
    for b in &bytes {
        input.push(*b);
        s.handle_input(clock.now(), &mut input).unwrap();
    }
    assert!(input.is_empty());
    assert_eq!(
        events(&mut s),
        vec![Event::Request {
            request_id: 8,
            body: msg.clone()
        }]
    );
    assert_eq!(budget.used(), 0);
    s.send_response(8, &msg).unwrap();
    let out = take_out(&mut s);
    let chunks = messages(&out);
    assert!(chunks.len() >= 3);
    let mut joined = Vec::new();
    let mut seqs = Vec::new();
    for (h, m) in &chunks {
        assert!(m.len() <= 8192, "within the client's receive buffer");
        let ch = Chunk::parse(h, m).unwrap();
        seqs.push(ch.sequence_number);
        joined.extend_from_slice(ch.body);
    }
    assert_eq!(joined, msg);
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
}

#[test]
fn renewal_keeps_the_old_token_until_the_new_one_is_used() {
    let mut clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut s, mut c) = open_channel(&clock, &budget);
    let old = c.token;
    clock.advance(Duration::from_secs(45));
    feed(
        &mut s,
        &clock,
        &c.open(SecurityTokenRequestType::Renew, CHANNEL, POLICY_NONE_URI),
    )
    .unwrap();
    let out = take_out(&mut s);
    let (h, m) = &messages(&out)[0];
    let chunk = Chunk::parse(h, m).unwrap();
    let resp =
        decode_message(&mut Reader::new(chunk.body, &DecodeLimits::default()).unwrap()).unwrap();
    let new = resp
        .as_any()
        .downcast_ref::<OpenSecureChannelResponse>()
        .unwrap()
        .security_token
        .token_id;
    assert_ne!(new, old);
    assert_eq!(events(&mut s), vec![Event::Renewed { token_id: new }]);
    // Old token still accepted...
    feed(&mut s, &clock, &c.request(2, &read_request(1))).unwrap();
    // ...until the new one is used...
    c.token = new;
    feed(&mut s, &clock, &c.request(3, &read_request(1))).unwrap();
    assert_eq!(events(&mut s).len(), 2);
    // ...after which it is refused.
    c.token = old;
    let e = feed(&mut s, &clock, &c.request(4, &read_request(1))).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadSecureChannelTokenUnknown);
    expect_error(&take_out(&mut s), StatusCode::BadSecureChannelTokenUnknown);
}

#[test]
fn token_expiry_closes_the_channel() {
    let mut clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut s, _c) = open_channel(&clock, &budget);
    let due = s.poll_timeout().unwrap();
    assert_eq!(
        due,
        clock.now().instant + Duration::from_secs(75),
        "lifetime + 25 %"
    );
    clock.advance(Duration::from_secs(74));
    s.handle_timeout(clock.now());
    assert!(!s.is_closed());
    clock.advance(Duration::from_secs(1));
    s.handle_timeout(clock.now());
    assert_eq!(
        s.close_status(),
        Some(StatusCode::BadSecureChannelTokenUnknown)
    );
    expect_error(&take_out(&mut s), StatusCode::BadSecureChannelTokenUnknown);
}

/// A hostile-input finding: a chunked request that stalls past the assembly
/// deadline ends the channel with ERR BadTimeout; its leftover chunks are
/// never read as a new request. One that keeps arriving, however slowly,
/// is delivered whole.
#[test]
fn a_stalled_chunked_request_closes_the_channel_and_is_never_misread() {
    let mut clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut s, mut c) = open_channel(&clock, &budget);
    s.set_session_activated(true);
    let body = read_request(1000);
    let chunks = messages(&c.request(7, &body));
    assert!(
        chunks.len() >= 3,
        "a chunked request: {} chunks",
        chunks.len()
    );
    // Slow but steady: a chunk every 8 s (the deadline is 10 s), longer
    // in all than the deadline.
    for (_, m) in &chunks {
        feed(&mut s, &clock, m).unwrap();
        clock.advance(Duration::from_secs(8));
        s.handle_timeout(clock.now());
    }
    assert_eq!(
        events(&mut s),
        vec![Event::Request {
            request_id: 7,
            body: body.clone()
        }]
    );
    assert!(!s.is_closed());
    // Stalled: the first chunk, then nothing for the deadline.
    let chunks = messages(&c.request(8, &body));
    feed(&mut s, &clock, &chunks[0].1).unwrap();
    clock.advance(Duration::from_secs(10));
    s.handle_timeout(clock.now());
    expect_error(&take_out(&mut s), StatusCode::BadTimeout);
    assert!(s.is_closed());
    // The rest arrives late: nothing is made of it.
    for (_, m) in &chunks[1..] {
        let mut input = m.clone();
        let _ = s.handle_input(clock.now(), &mut input);
    }
    assert!(
        !events(&mut s)
            .iter()
            .any(|e| matches!(e, Event::Request { .. })),
        "leftover chunks were read as a request"
    );
}

#[test]
fn handshake_timeout() {
    let mut clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let mut s = server(&clock, &budget);
    clock.advance(Duration::from_secs(10));
    assert_eq!(s.poll_timeout(), Some(clock.now().instant));
    s.handle_timeout(clock.now());
    expect_error(&take_out(&mut s), StatusCode::BadTimeout);
    assert_eq!(
        events(&mut s),
        vec![Event::Closed {
            status: StatusCode::BadTimeout
        }]
    );
}

#[test]
fn close_secure_channel() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut s, mut c) = open_channel(&clock, &budget);
    feed(&mut s, &clock, &c.close()).unwrap();
    assert_eq!(
        events(&mut s),
        vec![Event::Closed {
            status: StatusCode::Good
        }]
    );
    assert!(take_out(&mut s).is_empty(), "no answer to CLO");
}

#[test]
fn refused_connection_gets_a_busy_error_with_a_hint() {
    let out =
        PendingConnection::new().refuse(StatusCode::BadTcpServerTooBusy, "busy; RetryAfterMs=120");
    let (h, m) = &messages(&out)[0];
    assert_eq!(h.message_type, MessageType::Error);
    let e = ErrorMessage::decode_body(&m[HEADER_LEN..]).unwrap();
    assert_eq!(e.error, StatusCode::BadTcpServerTooBusy);
    assert_eq!(e.retry_after_ms(), Some(120));
}

/// Each abuse ends in the right ERR and a close, and another connection on
/// the same budget keeps working.
#[test]
fn abuse_ends_in_the_right_error_and_spares_other_connections() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (mut bystander, mut bc) = open_channel(&clock, &budget);

    type Script = fn(&Clock, &Arc<ReassemblyBudget>) -> (ServerConnection, Vec<u8>);
    let cases: Vec<(&str, Script, StatusCode)> = vec![
        (
            "MSG before HEL",
            |clock, budget| {
                let mut c = TestClient::new();
                (server(clock, budget), c.request(1, b"x"))
            },
            StatusCode::BadTcpMessageTypeInvalid,
        ),
        (
            "garbage after HEL",
            |clock, budget| {
                let c = TestClient::new();
                let mut s = server(clock, budget);
                feed(&mut s, clock, &c.hello()).unwrap();
                take_out(&mut s);
                (s, b"\x00\x01garbage garbage".to_vec())
            },
            StatusCode::BadTcpMessageTypeInvalid,
        ),
        (
            "oversized chunk",
            |clock, budget| {
                let (mut s, mut c) = open_channel(clock, budget);
                take_out(&mut s);
                c.chunk_size = 20_000;
                (s, c.request(1, &read_request(500)))
            },
            StatusCode::BadTcpMessageTooLarge,
        ),
        (
            "sequence number replay",
            |clock, budget| {
                let (mut s, mut c) = open_channel(clock, budget);
                let first = c.request(1, b"x");
                feed(&mut s, clock, &first).unwrap();
                take_out(&mut s);
                (s, first)
            },
            StatusCode::BadSequenceNumberInvalid,
        ),
        (
            "unsupported security policy",
            |clock, budget| {
                let mut c = TestClient::new();
                let mut s = server(clock, budget);
                feed(&mut s, clock, &c.hello()).unwrap();
                take_out(&mut s);
                let opn = c.open(
                    SecurityTokenRequestType::Issue,
                    0,
                    "http://opcfoundation.org/UA/SecurityPolicy#Basic256Sha256",
                );
                (s, opn)
            },
            StatusCode::BadSecurityPolicyRejected,
        ),
        (
            "wrong channel id",
            |clock, budget| {
                let (mut s, mut c) = open_channel(clock, budget);
                take_out(&mut s);
                let mut m = c.request(1, b"x");
                m[8] ^= 1;
                (s, m)
            },
            StatusCode::BadSecureChannelIdInvalid,
        ),
        (
            "second Issue",
            |clock, budget| {
                let (mut s, mut c) = open_channel(clock, budget);
                take_out(&mut s);
                (
                    s,
                    c.open(SecurityTokenRequestType::Issue, CHANNEL, POLICY_NONE_URI),
                )
            },
            StatusCode::BadSecurityChecksFailed,
        ),
    ];
    for (name, script, status) in cases {
        let (mut s, bytes) = script(&clock, &budget);
        let e = feed(&mut s, &clock, &bytes).unwrap_err();
        assert_eq!(e.status_code(), status, "{name}: {e}");
        expect_error(&take_out(&mut s), status);
        assert!(s.is_closed(), "{name}");
        assert!(events(&mut s).contains(&Event::Closed { status }), "{name}");
        // Anything after the close is ignored.
        let mut more = TestClient::new().hello();
        assert!(s.handle_input(clock.now(), &mut more).is_ok());
    }
    feed(&mut bystander, &clock, &bc.request(5, b"still here")).unwrap();
    assert_eq!(
        events(&mut bystander),
        vec![Event::Request {
            request_id: 5,
            body: b"still here".to_vec()
        }]
    );
}

#[test]
fn too_many_chunks_and_budget_exhaustion() {
    let clock = Clock::new();
    // Tight chunk count: negotiate via config.
    let config = ChannelConfig {
        transport: TransportLimits {
            max_chunk_count: 2,
            ..TransportLimits::default()
        },
        ..ChannelConfig::default()
    };
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let mut s = PendingConnection::new().accept(
        clock.now(),
        CHANNEL,
        Arc::new(config),
        Arc::clone(&budget),
    );
    let mut c = TestClient::new();
    feed(&mut s, &clock, &c.hello()).unwrap();
    feed(
        &mut s,
        &clock,
        &c.open(SecurityTokenRequestType::Issue, 0, POLICY_NONE_URI),
    )
    .unwrap();
    c.token = 1;
    c.chunk_size = SYMMETRIC_OVERHEAD + 100;
    let e = feed(&mut s, &clock, &c.request(1, &[0; 250])).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadRequestTooLarge);
    assert_eq!(budget.used(), 0, "the partial message was released");

    // An unactivated channel cannot take more than its share of the budget.
    let small = ReassemblyBudget::new(1000, 10);
    let (mut s, mut c) = open_channel(&clock, &small);
    c.chunk_size = SYMMETRIC_OVERHEAD + 150;
    let bytes = c.request(1, &[0; 400]);
    let e = feed(&mut s, &clock, &bytes).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadTcpMessageTooLarge);
    assert_eq!(small.used(), 0);
    let _ = ChunkType::Final;
}

/// Writes a seed for the `server_channel` fuzz target: a whole session of a
/// well-behaved client (HEL, OPN, a chunked request, CLO), prefixed with the
/// split byte. Run with `UASCALE_WRITE_FUZZ_SEED=1`.
#[test]
fn fuzz_seed_for_server_channel() {
    let mut c = TestClient::new();
    let mut seed = vec![0xffu8];
    seed.extend(c.hello());
    seed.extend(c.open(SecurityTokenRequestType::Issue, 0, POLICY_NONE_URI));
    c.token = 1;
    c.chunk_size = SYMMETRIC_OVERHEAD + 200;
    seed.extend(c.request(2, &read_request(20)));
    seed.extend(c.close());
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/server_channel/session"
    );
    if std::env::var_os("UASCALE_WRITE_FUZZ_SEED").is_some() {
        std::fs::write(path, &seed).unwrap();
    }
    // The committed seed is what this client sends.
    assert_eq!(
        std::fs::read(path).unwrap(),
        seed,
        "regenerate with UASCALE_WRITE_FUZZ_SEED=1"
    );
}

#[test]
fn the_hellos_retry_ticket_is_read_from_its_url_query() {
    let hello = |url: &str| Hello {
        protocol_version: 0,
        receive_buffer_size: 8192,
        send_buffer_size: 8192,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: UaString::from(url),
    };
    assert_eq!(
        retry_ticket(&hello("opc.tcp://h:4840/ua?RetryTicket=00ff")).as_deref(),
        Some("00ff")
    );
    assert_eq!(
        retry_ticket(&hello("opc.tcp://h:4840?a=b&RetryTicket=ab")).as_deref(),
        Some("ab")
    );
    assert_eq!(retry_ticket(&hello("opc.tcp://h:4840")), None);
    assert_eq!(retry_ticket(&hello("opc.tcp://h:4840?RetryTicket=")), None);
    let long = format!("opc.tcp://h:4840?RetryTicket={}", "a".repeat(65));
    assert_eq!(retry_ticket(&hello(&long)), None);
}

/// With `hold_acknowledge` a Hello is reported and answered only when the
/// driver says: acknowledged, the Acknowledge is what it would have been at
/// once and the OpenSecureChannel follows; refused, the ERR is all that
/// goes out; an OpenSecureChannel sent without waiting gets the
/// Acknowledge first, then its answer.
#[test]
fn a_held_hello_is_acknowledged_or_refused_by_the_driver() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let held = Arc::new(ChannelConfig {
        hold_acknowledge: true,
        ..ChannelConfig::default()
    });
    let start = |config: &Arc<ChannelConfig>| {
        PendingConnection::new().accept(
            clock.now(),
            CHANNEL,
            Arc::clone(config),
            Arc::clone(&budget),
        )
    };
    let mut c = TestClient::new();
    let open = c.open(SecurityTokenRequestType::Issue, 0, POLICY_NONE_URI);

    // Acknowledged: the same bytes as without holding.
    let mut plain = start(&Arc::new(ChannelConfig::default()));
    feed(&mut plain, &clock, &c.hello()).unwrap();
    let at_once = take_out(&mut plain);
    let mut s = start(&held);
    feed(&mut s, &clock, &c.hello()).unwrap();
    assert!(
        take_out(&mut s).is_empty(),
        "nothing before the driver's word"
    );
    assert_eq!(events(&mut s), vec![Event::Hello]);
    assert!(s.is_hello_held());
    s.acknowledge();
    assert!(!s.is_hello_held());
    assert_eq!(take_out(&mut s), at_once);
    feed(&mut s, &clock, &open).unwrap();
    let out = take_out(&mut s);
    assert_eq!(
        messages(&out)[0].0.message_type,
        MessageType::OpenSecureChannel
    );

    // Refused: only the ERR.
    let mut s = start(&held);
    feed(&mut s, &clock, &c.hello()).unwrap();
    s.close_with(StatusCode::BadTcpServerTooBusy, "busy; RetryAfterMs=100");
    let out = take_out(&mut s);
    let kinds: Vec<_> = messages(&out).iter().map(|(h, _)| h.message_type).collect();
    assert_eq!(kinds, vec![MessageType::Error]);
    assert!(s.is_closed());

    // Not waited for: the Acknowledge, then the OpenSecureChannel's answer.
    let mut s = start(&held);
    let mut both = c.hello();
    both.extend_from_slice(&open);
    feed(&mut s, &clock, &both).unwrap();
    let out = take_out(&mut s);
    let kinds: Vec<_> = messages(&out).iter().map(|(h, _)| h.message_type).collect();
    assert_eq!(
        kinds,
        vec![MessageType::Acknowledge, MessageType::OpenSecureChannel]
    );
}
