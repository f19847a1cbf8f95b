//! Every service request through the server's dispatcher, on an activated
//! session of a server with the demo address space: no panic, and every
//! answer given at once decodes as a response or a ServiceFault that echoes
//! the request handle.
//!
//! Input: byte 0 picks a request type (the schema's "...Request"
//! structures), byte 1 the mode:
//! - even: the rest (up to 8 bytes) seeds the type's sample generator, so
//!   well-formed requests with random contents reach the handlers;
//! - odd: the rest is the request body after the RequestHeader, raw, so
//!   arbitrary bytes reach the decoders and handlers of that type.
//!
//! The RequestHeader always carries the session's token (so requests get
//! past the session check) and the handle 0x5eed.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use uascale_server::address_space::AddressSpace;
use uascale_server::dispatch::dispatch;
use uascale_server::node_manager::NodeManagers;
use uascale_server::session::Session;
use uascale_server::{ServerConfig, ServerState, ServiceContext};
use uascale_types::generated::registry::STRUCTURES;
use uascale_types::generated::samples::sample_by_encoding_id;
use uascale_types::sample::Gen;
use uascale_types::{
    decode_message, encode_message, BinaryDecode, BinaryEncode, DecodeLimits, NodeId, Reader,
    RequestHeader, ResponseHeader, UaString,
};

const HANDLE: u32 = 0x5eed;

struct Fixture {
    state: Arc<ServerState>,
    t0: Instant,
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
        let state = ServerState::from_parts(
            ServerConfig::default(),
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
            t0: Instant::now(),
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
            timeout: Duration::from_secs(3600),
            deadline: f.t0 + Duration::from_secs(3600),
            activated: true,
            name: UaString::from("fuzz"),
            locale_ids: vec![],
            continuation_points: vec![],
            server_nonce: [0; 32],
            client_thumbprint: None,
            client_uri: UaString::null(),
            user: uascale_server::identity::UserIdentity::Anonymous,
            created: uascale_types::DateTime::MIN,
            endpoint_url: UaString::null(),
            security_policy: uascale_crypto::policy::SecurityPolicy::None,
            security_mode: uascale_types::MessageSecurityMode::None,
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

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let f = fixture();
    let enc = f.requests[usize::from(data[0]) % f.requests.len()];
    let rest = &data[2..];
    let message = if data[1] % 2 == 0 {
        let mut seed = [0u8; 8];
        let n = rest.len().min(8);
        seed[..n].copy_from_slice(&rest[..n]);
        let Some(value) = sample_by_encoding_id(enc, &mut Gen::new(u64::from_le_bytes(seed)))
        else {
            return;
        };
        let mut msg = Vec::new();
        encode_message(value.as_ref(), &mut msg);
        with_header(&msg, &f.token)
    } else {
        let header = RequestHeader {
            authentication_token: f.token.clone(),
            request_handle: HANDLE,
            ..RequestHeader::default()
        };
        let mut msg = NodeId::numeric(0, enc).to_bytes();
        header.encode(&mut msg);
        msg.extend_from_slice(rest);
        msg
    };
    ensure_session(f);
    let mut ctx = ServiceContext::for_tests(Arc::clone(&f.state), f.t0);
    // Answers given later (futures) or by a parked responder are not run.
    let Some(resp) = dispatch(&mut ctx, &message).now() else {
        return;
    };
    let limits = DecodeLimits::default();
    let mut r = Reader::new(&resp, &limits).expect("response within default limits");
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
});
