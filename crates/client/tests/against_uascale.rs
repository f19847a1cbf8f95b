//! The client against a uascale server in the same process, over real
//! loopback sockets: discovery, session, every service method, many
//! requests in flight on one channel, and the errors a caller sees; every
//! ECC policy through two token renewals.

use std::sync::Arc;
use std::time::Duration;

use uascale_client::{Client, ClientError, ClientOptions};
use uascale_server::{Server, ServerConfig};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode, Variant};

async fn start() -> String {
    let config = ServerConfig {
        server: uascale_server::config::ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            ..Default::default()
        },
        // More references than one Browse page holds: BrowseNext is needed.
        demo: uascale_server::config::DemoSection {
            nodes: 1500,
            ..Default::default()
        },
        security: uascale_server::config::SecurityConfig::none_only(),
        ..Default::default()
    };
    let server = Server::bind(config).unwrap();
    let url = format!("opc.tcp://{}", server.local_addr().unwrap());
    tokio::spawn(server.run(std::future::pending()));
    url
}

fn demo(path: &str) -> NodeId {
    NodeId::string(2, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_method_against_uascale() {
    let url = start().await;
    let client = Client::connect(&url, ClientOptions::default())
        .await
        .unwrap();

    let endpoints = client.get_endpoints().await.unwrap();
    assert!(endpoints
        .iter()
        .any(|e| e.security_mode == t::MessageSecurityMode::None));

    // Without a session the server refuses, and says why.
    let err = client.read_values(&[NodeId::ns0(2258)]).await.unwrap_err();
    assert_eq!(err.status_code(), StatusCode::BadSessionIdInvalid);

    let created = client.create_session("test").await.unwrap();
    assert!(!created.session_id.is_null());

    let values = client
        .read_values(&[NodeId::ns0(2258), NodeId::string(2, "No.Such.Node")])
        .await
        .unwrap();
    assert!(matches!(values[0].value, Some(Variant::DateTime(_))));
    assert_eq!(values[1].status, Some(StatusCode::BadNodeIdUnknown));

    let statuses = client
        .write(vec![
            t::WriteValue {
                node_id: demo("Demo.Static.Scalar.Int32"),
                attribute_id: t::AttributeId::Value as u32,
                value: t::DataValue::value(Variant::Int32(-42)),
                ..Default::default()
            },
            t::WriteValue {
                node_id: demo("Demo.Static.Scalar.Int32"),
                attribute_id: t::AttributeId::Value as u32,
                value: t::DataValue::value("text"),
                ..Default::default()
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        statuses,
        vec![StatusCode::Good, StatusCode::BadTypeMismatch]
    );
    let back = client
        .read_values(&[demo("Demo.Static.Scalar.Int32")])
        .await
        .unwrap();
    assert_eq!(back[0].value, Some(Variant::Int32(-42)));

    // 1,500 children: more than one page, so BrowseNext runs.
    let refs = client
        .browse(t::BrowseDescription {
            node_id: demo("Demo.Load"),
            browse_direction: t::BrowseDirection::Forward,
            reference_type_id: NodeId::ns0(33),
            include_subtypes: true,
            result_mask: 63,
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes = refs
        .iter()
        .filter(|r| {
            r.browse_name
                .name
                .as_str()
                .is_some_and(|n| n.starts_with("Node"))
        })
        .count();
    assert_eq!(nodes, 1500);

    let paths = client
        .translate(vec![t::BrowsePath {
            starting_node: NodeId::ns0(84),
            relative_path: t::RelativePath {
                elements: Some(vec![
                    t::RelativePathElement {
                        reference_type_id: NodeId::ns0(33),
                        include_subtypes: true,
                        target_name: t::QualifiedName::new(0, "Objects"),
                        ..Default::default()
                    },
                    t::RelativePathElement {
                        reference_type_id: NodeId::ns0(33),
                        include_subtypes: true,
                        target_name: t::QualifiedName::new(0, "Server"),
                        ..Default::default()
                    },
                ]),
            },
        }])
        .await
        .unwrap();
    assert_eq!(paths[0].status_code, StatusCode::Good);
    let target = &paths[0].targets.as_ref().unwrap()[0].target_id;
    assert_eq!(target.node_id, NodeId::ns0(2253));

    let results = client
        .call(vec![t::CallMethodRequest {
            object_id: demo("Demo.Methods"),
            method_id: demo("Demo.Methods.Add"),
            input_arguments: Some(vec![Variant::Double(1.25), Variant::Double(2.5)]),
        }])
        .await
        .unwrap();
    assert_eq!(results[0].status_code, StatusCode::Good);
    assert_eq!(
        results[0].output_arguments,
        Some(vec![Variant::Double(3.75)])
    );

    client.close().await;
    // After close every call fails at once with a clear error.
    let err = client.read_values(&[NodeId::ns0(2258)]).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Closed | ClientError::Channel { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_on_one_channel() {
    let url = start().await;
    let client = Arc::new(
        Client::connect(&url, ClientOptions::default())
            .await
            .unwrap(),
    );
    client.create_session("pipelined").await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let c = Arc::clone(&client);
        tasks.push(tokio::spawn(async move {
            let node = demo(&format!("Demo.Load.Node{}", i % 1500));
            c.read_values(&[node]).await.map(|v| v.len())
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    client.close().await;
}

#[tokio::test]
async fn connection_errors_are_clear() {
    // A port nobody listens on (bound, then closed).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = Client::connect(
        &format!("opc.tcp://127.0.0.1:{port}"),
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::Io(_)), "{err:?}");
    assert!(err.to_string().contains(&port.to_string()));
    let err = Client::connect("http://example", ClientOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.status_code(), StatusCode::BadTcpEndpointUrlInvalid);
}

/// Every ECC policy over real sockets against a uascale server offering
/// them all: a session with the user name identity (an EccEncryptedSecret
/// for the server's ECDHKey) lives through two token renewals (fresh
/// ephemeral keys each, chained under SecureChannelEnhancements), reading
/// before and after; then an X.509 user of the same curve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecc_sessions_renew_against_uascale() {
    use uascale_client::{SecurityOptions, ServerTrust, UserIdentity};
    use uascale_crypto::policy::SecurityPolicy;
    use uascale_crypto::x509::{create_self_signed, KeyType, SelfSignedParams};
    use uascale_proto::security::{Identity, PrivateKey};

    let pki = std::env::temp_dir().join(format!("uascale-ecc-renew-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pki);
    let mut security = uascale_server::config::SecurityConfig {
        pki_dir: pki.clone(),
        trust_all_client_certificates: true,
        allow_security_none: true,
        ..Default::default()
    };
    security.policies = SecurityPolicy::ECC.to_vec();
    let mut config = ServerConfig {
        server: uascale_server::config::ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            host_name: "127.0.0.1".into(),
            ..Default::default()
        },
        security,
        users: vec![uascale_server::config::UserConfig {
            name: "operator".into(),
            password_hash: uascale_server::identity::hash_password(b"ecc-pass").unwrap(),
        }],
        ..Default::default()
    };
    config.limits.min_token_lifetime = Duration::from_secs(1);
    // X.509 users, one per curve, trusted by the server's PKI.
    uascale_server::pki::create_layout(&pki).unwrap();
    let users: Vec<(KeyType, Arc<Identity>)> = [KeyType::EcP256, KeyType::EcP384, KeyType::Ed25519]
        .into_iter()
        .map(|k| {
            let mut p = SelfSignedParams::new(
                "urn:uascale:test:ecc-user",
                "ecc user",
                std::time::SystemTime::now() - Duration::from_secs(60),
            );
            p.key_type = k;
            let made = create_self_signed(&p).unwrap();
            std::fs::write(
                pki.join(format!("trusted/certs/user-{}.der", k.name())),
                made.certificate.der(),
            )
            .unwrap();
            let id = Identity::with_key(
                made.certificate,
                PrivateKey::from_der(&made.private_key_pkcs8_der).unwrap(),
            )
            .unwrap();
            (k, Arc::new(id))
        })
        .collect();
    let server = Server::bind(config).unwrap();
    let url = format!("opc.tcp://{}", server.local_addr().unwrap());
    tokio::spawn(server.run(std::future::pending()));

    for policy in SecurityPolicy::ECC {
        let key = match policy.curve().unwrap() {
            uascale_crypto::ecc::EccCurve::NistP256 => KeyType::EcP256,
            uascale_crypto::ecc::EccCurve::NistP384 => KeyType::EcP384,
            uascale_crypto::ecc::EccCurve::Curve25519 => KeyType::Ed25519,
        };
        let mut params = SelfSignedParams::new(
            "urn:uascale:test:ecc-client",
            "ecc client",
            std::time::SystemTime::now() - Duration::from_secs(60),
        );
        params.key_type = key;
        let made = create_self_signed(&params).unwrap();
        let identity = Arc::new(
            Identity::with_key(
                made.certificate,
                PrivateKey::from_der(&made.private_key_pkcs8_der).unwrap(),
            )
            .unwrap(),
        );
        let mut options = ClientOptions {
            security: SecurityOptions {
                policy,
                mode: t::MessageSecurityMode::SignAndEncrypt,
                certificate: Some(Arc::clone(&identity)),
                trust: ServerTrust::UnsafeAcceptAny,
                server_certificate: None,
            },
            identity: UserIdentity::UserName {
                user: "operator".into(),
                password: "ecc-pass".into(),
            },
            application_uri: "urn:uascale:test:ecc-client".into(),
            ..Default::default()
        };
        let x509_options = options.clone();
        options.channel.requested_lifetime = Duration::from_secs(1);
        let client = Client::connect(&url, options)
            .await
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        client
            .create_session("ecc")
            .await
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        for round in 0..3 {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(900)).await;
            }
            let v = client
                .read_values(&[NodeId::ns0(2259)])
                .await
                .unwrap_or_else(|e| panic!("{policy:?} round {round}: {e}"));
            assert_eq!(v[0].value, Some(Variant::Int32(0)), "{policy:?}");
        }
        assert!(client.token_renewals() >= 2, "{policy:?}: renewed twice");
        client.close().await;

        // An X.509 user of the same curve: the token signature (ECDSA or
        // Ed25519, channel-bound under enhancements) is checked.
        let user = users.iter().find(|(k, _)| *k == key).unwrap().1.clone();
        let mut options = x509_options.clone();
        options.security.policy = policy;
        options.security.certificate = Some(Arc::clone(&identity));
        options.identity = UserIdentity::X509(user);
        let client = Client::connect(&url, options).await.unwrap();
        client
            .create_session("ecc x509")
            .await
            .unwrap_or_else(|e| panic!("{policy:?} x509: {e}"));
        let v = client.read_values(&[NodeId::ns0(2259)]).await.unwrap();
        assert_eq!(v[0].value, Some(Variant::Int32(0)), "{policy:?} x509");
        client.close().await;
        // A P-384 user on a P-256 policy signs with SHA-384, which the
        // server checks as ECDSA-SHA256 (.NET's P-384-on-nistP256 form):
        // refused.
        if policy == SecurityPolicy::EccNistP256 {
            let p384 = users.iter().find(|(k, _)| *k == KeyType::EcP384).unwrap();
            let mut options = x509_options.clone();
            options.identity = UserIdentity::X509(Arc::clone(&p384.1));
            let client = Client::connect(&url, options).await.unwrap();
            let e = client.create_session("bad x509").await.unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadUserSignatureInvalid, "{e}");
            client.close().await;
        }
    }
    let _ = std::fs::remove_dir_all(&pki);
}
