//! In-memory pairs of the real [`ClientConnection`] and [`ServerConnection`]
//! for every ECC policy and mode: handshake with ephemeral keys, chunked
//! messages both ways, two renewals (the second chains a chained secret
//! under SecureChannelEnhancements), tampered chunks, a nonce on the wrong
//! curve and a point not on the curve, open62541's stray padding byte, and
//! ECC and RSA endpoints side by side on one server.

use super::*;
use crate::channel::{ChannelConfig, Event, PendingConnection, ServerConnection};
use crate::chunk::SendLimits;
use crate::security::{PrivateKey, ServerSecurity, TrustAllCertificates};
use std::sync::OnceLock;
use std::time::UNIX_EPOCH;
use uascale_crypto::ecc::EccPrivateKey;
use uascale_crypto::rsa::RsaPrivateKey;
use uascale_crypto::x509::{create_self_signed, KeyType, SelfSignedParams};
use uascale_types::DateTime;

const MODES: [MessageSecurityMode; 2] = [
    MessageSecurityMode::Sign,
    MessageSecurityMode::SignAndEncrypt,
];

fn make_identity(name: &str, key_type: KeyType) -> Arc<Identity> {
    let mut p = SelfSignedParams::new(
        &format!("urn:uascale:test:{name}"),
        name,
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    );
    p.key_type = key_type;
    let made = create_self_signed(&p).unwrap();
    let key = match key_type {
        KeyType::Rsa => {
            PrivateKey::Rsa(RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap())
        }
        _ => PrivateKey::Ecc(EccPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap()),
    };
    Arc::new(Identity::with_key(made.certificate, key).unwrap())
}

/// Server and client identities: RSA, P-256, P-384, Ed25519.
struct Ids {
    server: [Arc<Identity>; 4],
    client: [Arc<Identity>; 4],
}

const KEYS: [KeyType; 4] = [
    KeyType::Rsa,
    KeyType::EcP256,
    KeyType::EcP384,
    KeyType::Ed25519,
];

fn ids() -> &'static Ids {
    static I: OnceLock<Ids> = OnceLock::new();
    I.get_or_init(|| Ids {
        server: KEYS.map(|k| make_identity(&format!("server-{}", k.name()), k)),
        client: KEYS.map(|k| make_identity(&format!("client-{}", k.name()), k)),
    })
}

fn key_index(policy: SecurityPolicy) -> usize {
    match policy.curve() {
        None => 0,
        Some(uascale_crypto::ecc::EccCurve::NistP256) => 1,
        Some(uascale_crypto::ecc::EccCurve::NistP384) => 2,
        Some(uascale_crypto::ecc::EccCurve::Curve25519) => 3,
    }
}

fn at(t0: Instant, ms: u64) -> Now {
    Now {
        instant: t0 + Duration::from_millis(ms),
        utc: DateTime::from_ticks(1),
    }
}

/// Moves bytes both ways; `to_server` / `to_client` may change them.
fn pump_with(
    c: &mut ClientConnection,
    s: &mut ServerConnection,
    now: Now,
    to_server: &mut dyn FnMut(&mut Vec<u8>),
    to_client: &mut dyn FnMut(&mut Vec<u8>),
) -> Result<(), ChannelError> {
    let mut result = Ok(());
    loop {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let moved = c.poll_transmit(&mut a) | s.poll_transmit(&mut b);
        if !moved {
            return result;
        }
        if !a.is_empty() {
            to_server(&mut a);
            let _ = s.handle_input(now, &mut a);
        }
        if !b.is_empty() {
            to_client(&mut b);
            if let Err(e) = c.handle_input(now, &mut b) {
                result = Err(e);
            }
        }
    }
}

fn pump(c: &mut ClientConnection, s: &mut ServerConnection, now: Now) {
    pump_with(c, s, now, &mut |_| {}, &mut |_| {}).unwrap();
}

/// The server of every test: the RSA identity plus one ECC identity per
/// curve, every policy and mode offered.
fn server_config() -> ChannelConfig {
    let ids = ids();
    let mut endpoints = vec![(SecurityPolicy::None, MessageSecurityMode::None)];
    for p in SecurityPolicy::RSA.into_iter().chain(SecurityPolicy::ECC) {
        for m in MODES {
            endpoints.push((p, m));
        }
    }
    ChannelConfig {
        security: ServerSecurity {
            identity: Some(Arc::clone(&ids.server[0])),
            ecc_identities: ids.server[1..].to_vec(),
            endpoints,
            validator: Some(Arc::new(TrustAllCertificates)),
        },
        ..ChannelConfig::default()
    }
}

fn client_for(
    t0: Instant,
    policy: SecurityPolicy,
    mode: MessageSecurityMode,
    me: &Arc<Identity>,
    server: &Arc<Identity>,
) -> ClientConnection {
    let security = ClientSecurity::new(
        policy,
        mode,
        Arc::clone(me),
        Arc::new(server.certificate().clone()),
    )
    .unwrap();
    ClientConnection::new(
        at(t0, 0),
        Arc::new(ClientConfig {
            endpoint_url: "opc.tcp://test".into(),
            requested_lifetime: Duration::from_secs(20),
            send_buffer_size: 8192,
            receive_buffer_size: 8192,
            security,
            ..Default::default()
        }),
    )
}

fn server_for(t0: Instant, config: ChannelConfig) -> ServerConnection {
    PendingConnection::new().accept(
        at(t0, 0),
        7,
        Arc::new(config),
        ReassemblyBudget::new(1 << 20, 50),
    )
}

fn pair(
    t0: Instant,
    policy: SecurityPolicy,
    mode: MessageSecurityMode,
) -> (ClientConnection, ServerConnection) {
    let i = key_index(policy);
    let ids = ids();
    let c = client_for(t0, policy, mode, &ids.client[i], &ids.server[i]);
    (c, server_for(t0, server_config()))
}

fn request_at_server(s: &mut ServerConnection) -> (u32, Vec<u8>) {
    std::iter::from_fn(|| s.poll_event())
        .find_map(|e| match e {
            Event::Request { request_id, body } => Some((request_id, body)),
            _ => None,
        })
        .unwrap()
}

/// The sequence number of every OPN chunk in `bytes` (not encrypted
/// under ECC, so the sequence header is readable as is).
fn opn_sequence_numbers(bytes: &[u8]) -> Vec<u32> {
    crate::tcp::split_messages(bytes)
        .into_iter()
        .filter(|(h, _)| h.message_type == MessageType::OpenSecureChannel)
        .map(|(h, m)| Chunk::parse(&h, m).unwrap().sequence_number)
        .collect()
}

fn exchange(c: &mut ClientConnection, s: &mut ServerConnection, now: Now, len: usize) {
    let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let id = c.send_request(&body).unwrap();
    pump(c, s, now);
    assert_eq!(request_at_server(s), (id, body.clone()));
    s.send_response(id, &body[..len / 2]).unwrap();
    pump(c, s, now);
    assert_eq!(
        c.poll_event(),
        Some(ClientEvent::Response {
            request_id: id,
            body: body[..len / 2].to_vec()
        })
    );
}

#[test]
fn every_ecc_policy_and_mode_opens_exchanges_and_renews_twice() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    for policy in SecurityPolicy::ECC {
        for mode in MODES {
            let what = format!("{policy:?} {mode:?}");
            let (mut c, mut s) = pair(t0, policy, mode);
            let mut seen_by_server = Vec::new();
            let mut seen_by_client = Vec::new();
            pump_with(
                &mut c,
                &mut s,
                at(t0, 0),
                &mut |b| seen_by_server.extend_from_slice(b),
                &mut |b| seen_by_client.extend_from_slice(b),
            )
            .unwrap();
            assert_eq!(
                c.poll_event(),
                Some(ClientEvent::Opened { channel_id: 7 }),
                "{what}"
            );
            // Non-legacy sequence numbers: both OPNs are number 0.
            assert_eq!(opn_sequence_numbers(&seen_by_server), [0], "{what}");
            assert_eq!(opn_sequence_numbers(&seen_by_client), [0], "{what}");
            assert_eq!(s.security().policy, policy);
            assert_eq!(s.security().mode, mode);
            // The ChannelThumbprint: the same on both sides, the length of
            // the server's signature, only with SecureChannelEnhancements.
            let tp = c.channel_thumbprint().to_vec();
            assert_eq!(s.security().thumbprint(), tp, "{what}");
            if policy.secure_channel_enhancements() {
                assert_eq!(tp.len(), 64, "{what}");
            } else {
                assert!(tp.is_empty(), "{what}");
            }
            // Many chunks each way.
            exchange(&mut c, &mut s, at(t0, 1), 30_000);
            // Two renewals: fresh ephemeral keys each time; the second
            // chains an already chained secret.
            for (n, when) in [(2u32, 15_000u64), (3, 30_000)] {
                let early = c.send_request(b"early").unwrap();
                pump(&mut c, &mut s, at(t0, when - 1));
                assert_eq!(request_at_server(&mut s).0, early);
                c.handle_timeout(at(t0, when));
                pump(&mut c, &mut s, at(t0, when));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Renewed { token_id: n }),
                    "{what}"
                );
                // The answer to the request from before the renewal comes
                // under the old token.
                s.send_response(early, b"old token").unwrap();
                pump(&mut c, &mut s, at(t0, when + 1));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Response {
                        request_id: early,
                        body: b"old token".to_vec()
                    }),
                    "{what}"
                );
                exchange(&mut c, &mut s, at(t0, when + 2), 20_000);
                assert_eq!(c.channel_thumbprint(), tp, "kept across renewals");
            }
            c.close(at(t0, 30_010));
            pump(&mut c, &mut s, at(t0, 30_010));
            assert_eq!(s.close_status(), Some(StatusCode::Good), "{what}");
        }
    }
}

/// Moves bytes both ways, the server taking an OPN in two steps
/// (`receive_open`, then `answer_open`).
fn pump_in_two_steps(c: &mut ClientConnection, s: &mut ServerConnection, now: Now) -> usize {
    let mut opens = 0;
    loop {
        let mut a = Vec::new();
        let mut b = Vec::new();
        if !(c.poll_transmit(&mut a) | s.poll_transmit(&mut b)) {
            return opens;
        }
        if let Some(received) = s.receive_open(now, &mut a).unwrap() {
            opens += 1;
            s.answer_open(now, received).unwrap();
            s.handle_input(now, &mut a).unwrap();
        }
        c.handle_input(now, &mut b).unwrap();
    }
}

/// ECC handshakes and renewals taken in two steps: the key agreement and
/// the signature happen in the second.
#[test]
fn ecc_opens_received_then_answered_open_and_renew() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    for policy in SecurityPolicy::ECC {
        for mode in MODES {
            let what = format!("{policy:?} {mode:?}");
            let (mut c, mut s) = pair(t0, policy, mode);
            assert_eq!(pump_in_two_steps(&mut c, &mut s, at(t0, 0)), 1, "{what}");
            assert_eq!(
                c.poll_event(),
                Some(ClientEvent::Opened { channel_id: 7 }),
                "{what}"
            );
            assert_eq!(s.security().thumbprint(), c.channel_thumbprint(), "{what}");
            exchange(&mut c, &mut s, at(t0, 1), 3_000);
            c.handle_timeout(at(t0, 15_000));
            assert_eq!(
                pump_in_two_steps(&mut c, &mut s, at(t0, 15_000)),
                1,
                "{what}"
            );
            assert_eq!(
                c.poll_event(),
                Some(ClientEvent::Renewed { token_id: 2 }),
                "{what}"
            );
            exchange(&mut c, &mut s, at(t0, 15_001), 3_000);
        }
    }
}

#[test]
fn ecc_and_rsa_endpoints_serve_side_by_side() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let config = server_config();
    for policy in [
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::EccNistP256AesGcm,
        SecurityPolicy::Aes256Sha256RsaPss,
        SecurityPolicy::EccCurve25519,
        SecurityPolicy::EccNistP384,
    ] {
        let i = key_index(policy);
        let ids = ids();
        let mut c = client_for(
            t0,
            policy,
            MessageSecurityMode::SignAndEncrypt,
            &ids.client[i],
            &ids.server[i],
        );
        let mut s = server_for(t0, config.clone());
        pump(&mut c, &mut s, at(t0, 0));
        assert_eq!(c.poll_event(), Some(ClientEvent::Opened { channel_id: 7 }));
        // The DER is kept where session signatures cover it (ECC).
        let peer = s.security().remote_certificate.as_ref().unwrap();
        let der = ids.client[i].certificate().der();
        assert!(peer.is(der));
        assert_eq!(peer.der(), policy.is_ecc().then_some(der));
        exchange(&mut c, &mut s, at(t0, 1), 100);
    }
}

#[test]
fn our_p384_key_is_refused_for_nistp256() {
    // .NET lets ECC_nistP256 use a P-384 certificate (96-byte ECDSA-SHA256
    // signatures); uascale verifies such signatures (see the crypto
    // vectors) but cannot make them: aws-lc has no P-384 signing with
    // SHA-256. The refusal is a clean policy error.
    let ids = ids();
    let e = ClientSecurity::new(
        SecurityPolicy::EccNistP256,
        MessageSecurityMode::Sign,
        Arc::clone(&ids.client[2]),
        Arc::new(ids.server[1].certificate().clone()),
    )
    .unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadCertificatePolicyCheckFailed);
}

#[test]
fn tampered_chunks_are_refused_both_ways() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    for policy in SecurityPolicy::ECC {
        for mode in MODES {
            let what = format!("{policy:?} {mode:?}");
            // The OPN response: one flipped byte.
            let (mut c, mut s) = pair(t0, policy, mode);
            let r = pump_with(&mut c, &mut s, at(t0, 0), &mut |_| {}, &mut |b| {
                if b.first() == Some(&b'O') {
                    let n = b.len();
                    b[n - 80] ^= 1;
                }
            });
            assert_eq!(
                r.unwrap_err().status_code(),
                StatusCode::BadSecurityChecksFailed,
                "{what}"
            );
            // A request: each position (header, sequence header, body, tag).
            for pick in [9usize, 17, 30, 1] {
                let (mut c, mut s) = pair(t0, policy, mode);
                pump(&mut c, &mut s, at(t0, 0));
                c.send_request(b"a request that is tampered with").unwrap();
                pump_with(
                    &mut c,
                    &mut s,
                    at(t0, 1),
                    &mut |b| {
                        let n = b.len();
                        // pick 1 = the last byte (the signature/tag)
                        let i = if pick == 1 { n - 1 } else { pick };
                        b[i] ^= 0x04;
                    },
                    &mut |_| {},
                )
                .ok();
                let status = s.close_status();
                assert!(
                    status == Some(StatusCode::BadSecurityChecksFailed)
                        || (pick == 9 && status == Some(StatusCode::BadSecureChannelIdInvalid)),
                    "{what} byte {pick}: {status:?}"
                );
                assert!(!std::iter::from_fn(|| s.poll_event())
                    .any(|e| matches!(e, Event::Request { .. })));
            }
            // A response.
            let (mut c, mut s) = pair(t0, policy, mode);
            pump(&mut c, &mut s, at(t0, 0));
            let id = c.send_request(b"hello").unwrap();
            pump(&mut c, &mut s, at(t0, 1));
            assert_eq!(request_at_server(&mut s).0, id);
            s.send_response(id, b"the genuine answer").unwrap();
            let r = pump_with(&mut c, &mut s, at(t0, 2), &mut |_| {}, &mut |b| {
                let n = b.len();
                b[n - 20] ^= 0x80;
            });
            assert_eq!(
                r.unwrap_err().status_code(),
                StatusCode::BadSecurityChecksFailed,
                "{what}"
            );
        }
    }
}

/// An OPN Issue as the client would send it, with `nonce` as ClientNonce
/// and `extra` bytes after the request (inside the signature).
fn crafted_open(policy: SecurityPolicy, nonce: Vec<u8>, extra: &[u8]) -> Vec<u8> {
    let ids = ids();
    let i = key_index(policy);
    let me = &ids.client[i];
    let server = &ids.server[i];
    let mut out = Vec::new();
    crate::tcp::Hello {
        protocol_version: 0,
        receive_buffer_size: 8192,
        send_buffer_size: 8192,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: UaString::from("opc.tcp://test"),
    }
    .encode_message(&mut out);
    let mut body = Vec::new();
    encode_message(
        &OpenSecureChannelRequest {
            request_header: RequestHeader::default(),
            client_protocol_version: 0,
            request_type: SecurityTokenRequestType::Issue,
            security_mode: MessageSecurityMode::SignAndEncrypt,
            client_nonce: ByteString::new(nonce),
            requested_lifetime: 60_000,
        },
        &mut body,
    );
    body.extend_from_slice(extra);
    let header = AsymmetricHeader {
        policy_uri: UaString::from(policy.uri()),
        sender_certificate: ByteString::new(me.certificate().der().to_vec()),
        receiver_thumbprint: ByteString::new(server.thumbprint().to_vec()),
    };
    write_chunks_protected(
        &mut out,
        MessageType::OpenSecureChannel,
        0,
        &SecurityHeader::Asymmetric(header),
        &Protection::EccAsymmetric {
            policy,
            local: me.ecc_key().unwrap(),
            signed_suffix: &[],
        },
        &mut SequenceNumbers::for_policy(policy),
        1,
        &body,
        &SendLimits {
            max_chunk_size: 8192,
            max_message_size: 0,
            max_chunk_count: 0,
        },
    )
    .unwrap();
    out
}

fn open_with(bytes: Vec<u8>) -> ServerConnection {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let mut s = server_for(t0, server_config());
    let mut input = bytes;
    let _ = s.handle_input(at(t0, 0), &mut input);
    s
}

#[test]
fn a_nonce_on_the_wrong_curve_or_off_the_curve_is_bad_nonce_invalid() {
    for policy in SecurityPolicy::ECC {
        let len = policy.nonce_length();
        let good = EphemeralKey::generate(policy.curve().unwrap()).unwrap();
        let s = open_with(crafted_open(policy, good.public_nonce().to_vec(), &[]));
        assert!(!s.is_closed(), "{policy:?}: a good nonce opens");
        // Another curve's key: the wrong length.
        let other = match policy {
            SecurityPolicy::EccNistP384 => uascale_crypto::ecc::EccCurve::NistP256,
            _ => uascale_crypto::ecc::EccCurve::NistP384,
        };
        let wrong = EphemeralKey::generate(other).unwrap();
        for nonce in [
            wrong.public_nonce().to_vec(),
            Vec::new(),
            vec![0; len - 1],
            vec![0; len + 1],
        ] {
            let s = open_with(crafted_open(policy, nonce, &[]));
            assert_eq!(
                s.close_status(),
                Some(StatusCode::BadNonceInvalid),
                "{policy:?}"
            );
        }
        // The right length, not a point on the curve (NIST curves; every
        // 32-byte string is an X25519 key, but all-zero gives the
        // low-order point that agreement refuses).
        let mut off = good.public_nonce().to_vec();
        if policy.curve() == Some(uascale_crypto::ecc::EccCurve::Curve25519) {
            off.fill(0);
        } else {
            let last = off.len() - 1;
            off[last] ^= 1;
        }
        let s = open_with(crafted_open(policy, off, &[]));
        assert_eq!(
            s.close_status(),
            Some(StatusCode::BadNonceInvalid),
            "{policy:?}"
        );
    }
}

#[test]
fn the_stray_padding_byte_of_open62541_is_tolerated() {
    for policy in SecurityPolicy::ECC {
        let key = EphemeralKey::generate(policy.curve().unwrap()).unwrap();
        let mut s = open_with(crafted_open(policy, key.public_nonce().to_vec(), &[0x00]));
        assert!(!s.is_closed(), "{policy:?}");
        assert!(std::iter::from_fn(|| s.poll_event()).any(|e| matches!(e, Event::Opened { .. })));
    }
}

#[test]
fn certificates_of_the_wrong_kind_are_refused() {
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let ids = ids();
    // RSA client certificate for an ECC policy, P-256 for P-384, Ed25519
    // for P-256: refused before anything is sent.
    for (policy, mine) in [
        (SecurityPolicy::EccNistP256AesGcm, 0),
        (SecurityPolicy::EccNistP384, 1),
        (SecurityPolicy::EccNistP256, 3),
        (SecurityPolicy::Basic256Sha256, 1),
    ] {
        let e = ClientSecurity::new(
            policy,
            MessageSecurityMode::Sign,
            Arc::clone(&ids.client[mine]),
            Arc::new(ids.server[key_index(policy)].certificate().clone()),
        )
        .unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadCertificatePolicyCheckFailed);
    }
    // A server without an ECC certificate refuses the ECC policy.
    let mut config = server_config();
    config.security.ecc_identities.clear();
    let mut c = client_for(
        t0,
        SecurityPolicy::EccNistP256AesGcm,
        MessageSecurityMode::Sign,
        &ids.client[1],
        &ids.server[1],
    );
    let mut s = server_for(t0, config);
    let _ = pump_with(&mut c, &mut s, at(t0, 0), &mut |_| {}, &mut |_| {});
    assert_eq!(
        s.close_status(),
        Some(StatusCode::BadSecurityPolicyRejected)
    );
}
