//! Any byte stream from a client, split at arbitrary points and mixed with
//! timer ticks, fed whole or with each secured OpenSecureChannel in two
//! steps (`receive_open`, `answer_open`): the server connection never
//! panics, consumes only whole messages, and once closed stays closed.
//!
//! The server offers None, Basic256Sha256 and every ECC policy (an RSA and
//! a P-256, P-384 and Ed25519 certificate, made once per process). When the
//! first byte asks for it, the stream starts with a genuine Hello and an
//! ECC OpenSecureChannel (policy and mode from the second byte, signed by a
//! client key the harness holds), so the fuzz bytes that follow reach the
//! open channel: AEAD and CBC chunk opening, renewals, token lookups.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use uascale_crypto::ecc::{EccPrivateKey, EphemeralKey};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPrivateKey;
use uascale_crypto::x509::{create_self_signed, KeyType, SelfSignedParams};
use uascale_proto::chunk::{
    write_chunks_protected, AsymmetricHeader, SecurityHeader, SendLimits, SequenceNumbers,
};
use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::security::{Identity, PrivateKey, Protection, ServerSecurity};
use uascale_proto::tcp::{Hello, MessageType};
use uascale_proto::{
    ChannelConfig, Now, PendingConnection, ServerConnection, TrustAllCertificates,
};
use uascale_types::{
    encode_message, ByteString, DateTime, MessageSecurityMode, OpenSecureChannelRequest,
    RequestHeader, SecurityTokenRequestType, UaString,
};

fn identity(name: &str, key_type: KeyType) -> Arc<Identity> {
    let mut p = SelfSignedParams::new(
        &format!("urn:uascale:fuzz:{name}"),
        name,
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    );
    p.key_type = key_type;
    let made = create_self_signed(&p).expect("certificate");
    let key = match key_type {
        KeyType::Rsa => {
            PrivateKey::Rsa(RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap())
        }
        _ => PrivateKey::Ecc(EccPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap()),
    };
    Arc::new(Identity::with_key(made.certificate, key).unwrap())
}

struct Setup {
    config: Arc<ChannelConfig>,
    /// Client identities: P-256, P-384, Ed25519.
    clients: [Arc<Identity>; 3],
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        let curves = [KeyType::EcP256, KeyType::EcP384, KeyType::Ed25519];
        let mut endpoints = vec![(SecurityPolicy::None, MessageSecurityMode::None)];
        for p in std::iter::once(SecurityPolicy::Basic256Sha256).chain(SecurityPolicy::ECC) {
            for m in [MessageSecurityMode::Sign, MessageSecurityMode::SignAndEncrypt] {
                endpoints.push((p, m));
            }
        }
        let config = ChannelConfig {
            security: ServerSecurity {
                identity: Some(identity("server-rsa", KeyType::Rsa)),
                ecc_identities: curves.map(|k| identity(k.name(), k)).to_vec(),
                endpoints,
                validator: Some(Arc::new(TrustAllCertificates)),
            },
            ..ChannelConfig::default()
        };
        Setup {
            config: Arc::new(config),
            clients: curves.map(|k| identity(&format!("client-{}", k.name()), k)),
        }
    })
}

/// Hello and an ECC OPN Issue the server accepts.
fn ecc_prelude(choice: u8) -> Vec<u8> {
    let s = setup();
    let policy = SecurityPolicy::ECC[usize::from(choice % 5)];
    let mode = if choice & 0x80 != 0 {
        MessageSecurityMode::SignAndEncrypt
    } else {
        MessageSecurityMode::Sign
    };
    let curve = policy.curve().unwrap();
    let me = s
        .clients
        .iter()
        .find(|c| c.suits(policy))
        .expect("a client key");
    let server = s.config.security.identity_for(policy).expect("server key");
    let mut out = Vec::new();
    Hello {
        protocol_version: 0,
        receive_buffer_size: 65535,
        send_buffer_size: 65535,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: UaString::from("opc.tcp://fuzz"),
    }
    .encode_message(&mut out);
    let nonce = EphemeralKey::generate(curve).unwrap().public_nonce().to_vec();
    let mut body = Vec::new();
    encode_message(
        &OpenSecureChannelRequest {
            request_header: RequestHeader::default(),
            client_protocol_version: 0,
            request_type: SecurityTokenRequestType::Issue,
            security_mode: mode,
            client_nonce: ByteString::new(nonce),
            requested_lifetime: 60_000,
        },
        &mut body,
    );
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
            max_chunk_size: 65535,
            max_message_size: 0,
            max_chunk_count: 0,
        },
    )
    .expect("OPN");
    out
}

/// Feeds `input` to `conn`, whole or (`two_steps`) with a secured OPN
/// received, then answered, then what followed it; true if an OPN went in
/// two steps.
fn feed(conn: &mut ServerConnection, now: Now, input: &mut Vec<u8>, two_steps: bool) -> bool {
    if !two_steps {
        let _ = conn.handle_input(now, input);
        return false;
    }
    let Ok(Some(received)) = conn.receive_open(now, input) else {
        return false;
    };
    assert!(!conn.is_closed(), "a received OPN leaves it open");
    let _ = conn.answer_open(now, received);
    let _ = conn.handle_input(now, input);
    true
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let origin = Instant::now();
    let mut now = Now {
        instant: origin,
        utc: DateTime::from_ticks(133_590_384_000_000_000),
    };
    let budget = ReassemblyBudget::new(64 * 1024, 50);
    let config = Arc::clone(&setup().config);
    let mut conn = PendingConnection::new().accept(now, 1, config, budget);
    let mut input = Vec::new();
    // Second bit: a secured OPN goes in two steps (receive_open, then
    // answer_open), as the server runs it in place.
    let two_steps = split & 2 != 0;
    // Odd first byte: open an ECC channel first, the rest follows on it.
    let rest = match rest.split_first() {
        Some((&choice, tail)) if split & 1 == 1 => {
            input = ecc_prelude(choice);
            let stepped = feed(&mut conn, now, &mut input, two_steps);
            assert_eq!(stepped, two_steps, "the prelude's OPN");
            assert!(input.is_empty(), "the prelude is taken whole");
            assert!(!conn.is_closed(), "the ECC prelude opens a channel");
            let opened = std::iter::from_fn(|| conn.poll_event())
                .any(|e| matches!(e, uascale_proto::Event::Opened { .. }));
            assert!(opened, "the ECC prelude opens a channel");
            tail
        }
        _ => rest,
    };
    let step = usize::from(split >> 2).max(1);
    let mut out = Vec::new();
    for piece in rest.chunks(step) {
        input.extend_from_slice(piece);
        let was_closed = conn.is_closed();
        feed(&mut conn, now, &mut input, two_steps);
        assert!(!was_closed || conn.is_closed());
        while conn.poll_event().is_some() {}
        conn.poll_transmit(&mut out);
        out.clear();
        now.instant += Duration::from_millis(u64::from(piece[0]) * 20);
        if conn.poll_timeout().is_some_and(|t| t <= now.instant) {
            conn.handle_timeout(now);
        }
    }
});
