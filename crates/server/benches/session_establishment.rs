//! The server's CPU per secure session establishment with Basic256Sha256
//! SignAndEncrypt: a fresh connection takes HEL and an OpenSecureChannel
//! (RSA decrypt, signature verify, client certificate validated against
//! the PKI's trust list, RSA sign and encrypt of the response), then
//! CreateSession (server signature) and ActivateSession (client signature
//! verified, anonymous identity) run through the service handlers. The
//! same with ECC_nistP256 SignAndEncrypt: the OPN verified with the client's
//! P-256 key, an ephemeral key made, ECDH and HKDF, the response signed;
//! ECDSA signatures in CreateSession and ActivateSession.
//!
//! `cargo bench -p uascale-server --bench session_establishment`
//!
//! The client's side is computed once, outside the measurement: the OPN is
//! replayed to each new connection (a server does not remember nonces
//! across channels), and ActivateSession is signed over a server nonce the
//! bench sets on the session before activating it.
#![allow(missing_docs)] // criterion_main! generates an undocumented main
#![allow(clippy::disallowed_methods)] // a bench reads the clock

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion};
use uascale_crypto::ecc::{EccCurve, EphemeralKey};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPublicKey;
use uascale_crypto::x509::{create_self_signed, KeyType, SelfSignedParams};
use uascale_proto::chunk::{
    write_chunks_protected, AsymmetricHeader, SecurityHeader, SendLimits, SequenceNumbers,
};
use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::security::{
    CertificateValidator, Identity, PrivateKey, Protection, ServerSecurity,
};
use uascale_proto::tcp::{Hello, MessageType};
use uascale_proto::{ChannelConfig, Now, PendingConnection};
use uascale_server::identity::UserIdentity;
use uascale_server::pki::{open_own_ecc, OwnIdentity, Pki, PkiOptions};
use uascale_server::security::SecurityState;
use uascale_server::services::session::{activate_session, create_session};
use uascale_server::ServerConfig;
use uascale_server::ServiceContext;
use uascale_types::{
    encode_message, ActivateSessionRequest, ByteString, CreateSessionRequest, DateTime,
    MessageSecurityMode, OpenSecureChannelRequest, RequestHeader, SecurityTokenRequestType,
    SignatureData, UaString,
};

const MODE: MessageSecurityMode = MessageSecurityMode::SignAndEncrypt;

fn now() -> Now {
    Now {
        instant: Instant::now(),
        utc: DateTime::from_system_time(SystemTime::now()),
    }
}

fn bench(c: &mut Criterion) {
    establishment(c, SecurityPolicy::Basic256Sha256);
    establishment(c, SecurityPolicy::EccNistP256);
}

fn establishment(c: &mut Criterion, policy: SecurityPolicy) {
    let dir = std::env::temp_dir().join(format!(
        "uascale-bench-pki-{}-{}",
        std::process::id(),
        policy.uri().rsplit('#').next().unwrap_or_default()
    ));
    let _ = std::fs::remove_dir_all(&dir);

    // The client: a certificate the server trusts.
    let mut params = SelfSignedParams::new(
        "urn:bench:client",
        "bench client",
        SystemTime::now() - std::time::Duration::from_secs(60),
    );
    if policy.is_ecc() {
        params.key_type = KeyType::EcP256;
    }
    let client = create_self_signed(&params).unwrap();
    let client_key = PrivateKey::from_der(&client.private_key_pkcs8_der).unwrap();
    uascale_server::pki::create_layout(&dir).unwrap();
    std::fs::write(
        dir.join("trusted/certs/client.der"),
        client.certificate.der(),
    )
    .unwrap();

    // The server: its PKI, identity and security state.
    let config = ServerConfig::default();
    let own = OwnIdentity {
        application_uri: config.server.application_uri.clone(),
        application_name: "bench".into(),
        host_names: vec!["localhost".into()],
        ip_addresses: vec![],
    };
    let (pki, key) = Pki::open(&dir, &own, PkiOptions::default(), SystemTime::now()).unwrap();
    let pki = Arc::new(pki);
    let identity = Arc::new(Identity::new(pki.own_certificate().clone(), key).unwrap());
    let (ecc_cert, ecc_key) =
        open_own_ecc(&dir, &own, EccCurve::NistP256, SystemTime::now()).unwrap();
    let ecc_identity = Arc::new(Identity::with_key(ecc_cert, PrivateKey::Ecc(ecc_key)).unwrap());
    let server_cert = if policy.is_ecc() {
        ecc_identity.certificate().clone()
    } else {
        identity.certificate().clone()
    };
    let security = SecurityState {
        pki: Some(Arc::clone(&pki)),
        identity: Some(Arc::clone(&identity)),
        ecc_identities: vec![Arc::clone(&ecc_identity)],
        endpoints: vec![(policy, MODE)],
        allow_anonymous: true,
        users: Default::default(),
        failures: uascale_server::identity::AuthFailures::new(5),
    };
    let channel_config = Arc::new(ChannelConfig {
        security: ServerSecurity {
            identity: Some(Arc::clone(&identity)),
            ecc_identities: vec![Arc::clone(&ecc_identity)],
            endpoints: vec![(policy, MODE)],
            validator: Some(Arc::clone(&pki) as Arc<dyn CertificateValidator>),
        },
        ..ChannelConfig::default()
    });
    let budget = ReassemblyBudget::new(64 << 20, 50);

    // The client's HEL and OPN, once.
    let mut input = Vec::new();
    Hello {
        protocol_version: 0,
        receive_buffer_size: 65536,
        send_buffer_size: 65536,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: UaString::from("opc.tcp://localhost:4840"),
    }
    .encode_message(&mut input);
    let mut body = Vec::new();
    let client_nonce = match policy.curve() {
        Some(curve) => EphemeralKey::generate(curve)
            .unwrap()
            .public_nonce()
            .to_vec(),
        None => policy.random_nonce().unwrap(),
    };
    encode_message(
        &OpenSecureChannelRequest {
            request_header: RequestHeader::default(),
            client_protocol_version: 0,
            request_type: SecurityTokenRequestType::Issue,
            security_mode: MODE,
            client_nonce: ByteString::new(client_nonce),
            requested_lifetime: 600_000,
        },
        &mut body,
    );
    let server_key = (!policy.is_ecc())
        .then(|| RsaPublicKey::from_spki_der(server_cert.subject_public_key_info_der()).unwrap());
    let protection = match (&client_key, &server_key) {
        (PrivateKey::Rsa(local), Some(remote)) => Protection::Asymmetric {
            policy,
            local,
            remote,
        },
        (PrivateKey::Ecc(local), None) => Protection::EccAsymmetric {
            policy,
            local,
            signed_suffix: &[],
        },
        _ => unreachable!("key kinds follow the policy"),
    };
    write_chunks_protected(
        &mut input,
        MessageType::OpenSecureChannel,
        0,
        &SecurityHeader::Asymmetric(AsymmetricHeader {
            policy_uri: UaString::from(policy.uri()),
            sender_certificate: ByteString::new(client.certificate.der().to_vec()),
            receiver_thumbprint: ByteString::new(server_cert.thumbprint().to_vec()),
        }),
        &protection,
        &mut SequenceNumbers::for_policy(policy),
        1,
        &body,
        &SendLimits {
            max_chunk_size: 65536,
            max_message_size: 0,
            max_chunk_count: 0,
        },
    )
    .unwrap();

    let mut create = CreateSessionRequest {
        client_nonce: ByteString::new(vec![7; 32]),
        client_certificate: ByteString::new(client.certificate.der().to_vec()),
        ..Default::default()
    };
    create.client_description.application_uri = UaString::from("urn:bench:client");
    // ActivateSession signed over the server certificate and a fixed nonce
    // (ECC_nistP256 has no ChannelThumbprint: the classic form).
    let fixed_nonce = [3u8; 32];
    let mut data = server_cert.der().to_vec();
    data.extend_from_slice(&fixed_nonce);
    let mut sig = Vec::new();
    client_key.sign(policy, &data, &mut sig).unwrap();
    let client_signature = SignatureData {
        algorithm: uascale_server::identity::signature_algorithm_uri(policy)
            .map_or_else(UaString::null, UaString::from),
        signature: ByteString::new(sig),
    };

    let state = uascale_server::ServerState::from_parts(
        {
            let mut c = config;
            c.server.max_session_count = 1000;
            c
        },
        uascale_server::address_space::AddressSpace::default(),
        uascale_server::node_manager::NodeManagers::default(),
        security,
    );
    let sessions = &state.sessions;
    let mut id = 0u32;
    let mut establish = || {
        id = id.wrapping_add(1).max(1);
        let mut conn = PendingConnection::new().accept(
            now(),
            id,
            Arc::clone(&channel_config),
            Arc::clone(&budget),
        );
        let mut bytes = input.clone();
        conn.handle_input(now(), &mut bytes).unwrap();
        let mut out = Vec::new();
        assert!(conn.poll_transmit(&mut out), "ACK and OPN response");
        let channel = conn.security().clone();
        assert_eq!(channel.policy, policy, "the channel opened secured");
        let ctx = ServiceContext::new(Arc::clone(&state), id, channel, now(), None);
        let created = create_session(&ctx, &create).unwrap();
        let token = created.authentication_token;
        sessions
            .with(&token, None, false, ctx.instant, |s| {
                s.server_nonce = fixed_nonce
            })
            .unwrap();
        let activate = ActivateSessionRequest {
            request_header: RequestHeader {
                authentication_token: token.clone(),
                ..Default::default()
            },
            client_signature: client_signature.clone(),
            ..Default::default()
        };
        activate_session(&ctx, &activate).unwrap();
        let user = sessions.with(&token, Some(id), true, ctx.instant, |s| s.user.clone());
        assert_eq!(user, Ok(UserIdentity::Anonymous));
        sessions.close(&token, true);
    };
    establish();
    let name = format!(
        "OPN + CreateSession + ActivateSession, {} SignAndEncrypt (server side)",
        policy.uri().rsplit('#').next().unwrap_or_default()
    );
    c.bench_function(&name, |b| b.iter(&mut establish));
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
