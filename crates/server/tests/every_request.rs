//! Every request type the schema defines, with random-but-valid contents,
//! through the server's dispatcher - with no session, and on an activated
//! session: no panic, and every answer is a decodable response message (a
//! typed response or a ServiceFault) that echoes the request handle.

use std::time::{Duration, Instant};

use uascale_server::address_space::AddressSpace;
use uascale_server::dispatch::dispatch;
use uascale_server::node_manager::NodeManagers;
use uascale_server::session::Session;
use uascale_server::ServerConfig;
use uascale_server::{ServerState, ServiceContext};
use uascale_types::generated::registry::STRUCTURES;
use uascale_types::generated::samples::sample_by_encoding_id;
use uascale_types::sample::Gen;
use uascale_types::{
    decode_message, encode_message, BinaryDecode, BinaryEncode, DecodeLimits, NodeId, Reader,
    RequestHeader, ResponseHeader, UaString,
};

/// The message with its RequestHeader's token and handle replaced.
fn with_header(msg: &[u8], token: &NodeId, handle: u32) -> Vec<u8> {
    let limits = DecodeLimits::default();
    let mut r = Reader::new(msg, &limits).unwrap();
    let id = NodeId::decode(&mut r).unwrap();
    let mut header = RequestHeader::decode(&mut r).unwrap();
    let rest = &msg[r.position()..];
    header.authentication_token = token.clone();
    header.request_handle = handle;
    let mut out = id.to_bytes();
    header.encode(&mut out);
    out.extend_from_slice(rest);
    out
}

// The test's clock origin.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

#[test]
fn every_request_type_gets_a_response() {
    let mut space = AddressSpace::ns0().unwrap();
    let (demo, _) = uascale_server::demo::build(&mut space, 5);
    let mut managers = NodeManagers::default();
    managers.register(uascale_server::demo::NS, demo);
    let state = ServerState::from_parts(
        ServerConfig::default(),
        space,
        managers,
        uascale_server::security::SecurityState::none_only(),
    );
    let sessions = &state.sessions;
    let t0 = now();
    let token = NodeId::opaque(0, vec![7; 32]);
    sessions
        .insert(
            token.clone(),
            Session {
                session_id: NodeId::numeric(1, 1),
                channel_id: 1,
                timeout: Duration::from_secs(3600),
                deadline: t0 + Duration::from_secs(3600),
                activated: true,
                name: UaString::from("t"),
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
        )
        .unwrap();
    let mut ctx = ServiceContext::for_tests(std::sync::Arc::clone(&state), t0);
    let limits = DecodeLimits::default();
    let mut requests = 0;
    // Service requests: every "...Request" except the three that are parts
    // of other requests.
    let parts = [
        "CallMethodRequest",
        "MonitoredItemCreateRequest",
        "MonitoredItemModifyRequest",
    ];
    for &(name, _, enc) in STRUCTURES
        .iter()
        .filter(|(n, _, _)| n.ends_with("Request") && !parts.contains(n))
    {
        for seed in 0..8u64 {
            let value =
                sample_by_encoding_id(enc, &mut Gen::new(seed * 7919 + u64::from(enc))).unwrap();
            let mut msg = Vec::new();
            encode_message(value.as_ref(), &mut msg);
            for (tok, handle) in [(NodeId::NULL, 11u32), (token.clone(), 12)] {
                let req = with_header(&msg, &tok, handle);
                // Without a response sink nothing can be answered later.
                let resp = dispatch(&mut ctx, &req)
                    .now()
                    .unwrap_or_else(|| panic!("{name}: not answered at once"));
                let mut r = Reader::new(&resp, &limits).unwrap();
                let m = decode_message(&mut r)
                    .unwrap_or_else(|e| panic!("{name}: response does not decode: {e}"));
                let body = m.as_ref();
                assert!(
                    body.type_name().ends_with("Response") || body.type_name() == "ServiceFault",
                    "{name} answered with {}",
                    body.type_name()
                );
                // Every response starts with a ResponseHeader.
                let mut bytes = Vec::new();
                body.encode_body(&mut bytes);
                let mut rr = Reader::new(&bytes, &limits).unwrap();
                let header = ResponseHeader::decode(&mut rr).unwrap();
                assert_eq!(
                    header.request_handle,
                    handle,
                    "{name}: handle not echoed ({})",
                    body.type_name()
                );
                requests += 1;
            }
        }
    }
    assert!(requests > 500, "{requests}");
}
