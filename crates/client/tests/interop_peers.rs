//! The client against servers nobody here wrote: Python asyncua's server
//! and open62541's (through o6), started by `tests/interop/peer_server.py`
//! from the venv that `cargo xtask ci` creates.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use uascale_client::{
    event_filter, Client, ClientError, ClientOptions, MonitorItem, Notification, SecurityOptions,
    ServerTrust, SubscriptionEvent, SubscriptionSettings, TrustListValidator, UserIdentity,
};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPrivateKey;
use uascale_crypto::x509::TrustList;
use uascale_crypto::x509::{create_self_signed, to_pem, KeyType, SelfSignedParams};
use uascale_proto::security::CertificateValidator;
use uascale_proto::security::{Identity, PrivateKey};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode, Variant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Peer {
    child: Child,
    port: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_peer(kind: &str, extra: &[&str]) -> Peer {
    let python = root().join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask ci` first",
        python.display()
    );
    let port = free_port();
    let mut child = Command::new(python)
        .arg(root().join("tests/interop/peer_server.py"))
        .arg(kind)
        .arg(port.to_string())
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{kind} peer server did not start"));
    Peer { child, port }
}

async fn exercise(kind: &str) {
    let peer = start_peer(kind, &[]);
    let url = format!("opc.tcp://127.0.0.1:{}/", peer.port);
    let client = Client::connect(&url, ClientOptions::default())
        .await
        .unwrap();
    let endpoints = client.get_endpoints().await.unwrap();
    assert!(
        endpoints
            .iter()
            .any(|e| e.security_mode == t::MessageSecurityMode::None),
        "{kind}: no None endpoint"
    );
    client.create_session("interop").await.unwrap();

    let temp = NodeId::string(1, "Temperature");
    let values = client
        .read_values(&[NodeId::ns0(2258), temp.clone(), NodeId::string(1, "Nope")])
        .await
        .unwrap();
    assert!(
        matches!(values[0].value, Some(Variant::DateTime(_))),
        "{kind}: {:?}",
        values[0]
    );
    assert_eq!(values[1].value, Some(Variant::Double(20.5)), "{kind}");
    assert_eq!(
        values[2].status,
        Some(StatusCode::BadNodeIdUnknown),
        "{kind}"
    );

    let statuses = client
        .write(vec![t::WriteValue {
            node_id: temp.clone(),
            attribute_id: t::AttributeId::Value as u32,
            value: t::DataValue::value(Variant::Double(-3.5)),
            ..Default::default()
        }])
        .await
        .unwrap();
    assert_eq!(statuses, vec![StatusCode::Good], "{kind}");
    let back = client
        .read_values(std::slice::from_ref(&temp))
        .await
        .unwrap();
    assert_eq!(back[0].value, Some(Variant::Double(-3.5)), "{kind}");

    let refs = client
        .browse(t::BrowseDescription {
            node_id: NodeId::ns0(85),
            browse_direction: t::BrowseDirection::Forward,
            reference_type_id: NodeId::ns0(33),
            include_subtypes: true,
            result_mask: 63,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        refs.iter().any(|r| r.node_id.node_id == NodeId::ns0(2253)),
        "{kind}: Objects has no Server"
    );
    assert!(refs.iter().any(|r| r.node_id.node_id == temp), "{kind}");

    let paths = client
        .translate(vec![t::BrowsePath {
            starting_node: NodeId::ns0(85),
            relative_path: t::RelativePath {
                elements: Some(vec![t::RelativePathElement {
                    reference_type_id: NodeId::ns0(33),
                    include_subtypes: true,
                    target_name: t::QualifiedName::new(0, "Server"),
                    ..Default::default()
                }]),
            },
        }])
        .await
        .unwrap();
    assert_eq!(paths[0].status_code, StatusCode::Good, "{kind}");

    subscriptions(kind, &client, &temp).await;

    // Many requests in flight at once.
    let client = std::sync::Arc::new(client);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = std::sync::Arc::clone(&client);
            tokio::spawn(async move { c.read_values(&[NodeId::ns0(2258)]).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().len(), 1, "{kind}");
    }
    client.close().await;
}

/// Data changes of written values arrive in order; with asyncua, which
/// raises an event every 200 ms, events arrive too.
async fn subscriptions(kind: &str, client: &Client, temp: &NodeId) {
    let mut sub = client
        .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(
            50,
        )))
        .await
        .unwrap();
    let mut items = vec![MonitorItem::value(temp.clone()).sampling(0.0)];
    let with_events = kind == "asyncua";
    if with_events {
        items.push(MonitorItem::events(
            NodeId::ns0(2253),
            event_filter(&["Message", "Severity"], Default::default()),
        ));
    }
    let created = sub.monitor(items).await.unwrap();
    for item in &created {
        assert!(item.result.status_code.is_good(), "{kind}: {item:?}");
    }
    let mut events = 0;
    let mut seen = Vec::new();
    for value in [1.25, 2.5, 3.75] {
        let status = client
            .write(vec![t::WriteValue {
                node_id: temp.clone(),
                attribute_id: t::AttributeId::Value as u32,
                value: t::DataValue::value(Variant::Double(value)),
                ..Default::default()
            }])
            .await
            .unwrap();
        assert_eq!(status, vec![StatusCode::Good], "{kind}");
        // Wait for this value before writing the next (queue size 1).
        while seen.last() != Some(&value) {
            let event = tokio::time::timeout(Duration::from_secs(10), sub.recv())
                .await
                .unwrap_or_else(|_| panic!("{kind}: no notification for {value}"))
                .unwrap();
            let SubscriptionEvent::Notifications { notifications, .. } = event else {
                continue;
            };
            for n in notifications {
                match n {
                    Notification::DataChange {
                        client_handle,
                        value,
                    } => {
                        assert_eq!(client_handle, created[0].client_handle, "{kind}");
                        if let Some(Variant::Double(v)) = value.value {
                            seen.push(v);
                        }
                    }
                    Notification::Event { fields, .. } => {
                        let Variant::LocalizedText(text) = &fields[0] else {
                            panic!("{kind}: Message {:?}", fields[0]);
                        };
                        assert!(
                            text.text.as_str().unwrap_or("").starts_with("peer event"),
                            "{kind}: {text:?}"
                        );
                        assert_eq!(fields[1], Variant::UInt16(500), "{kind}");
                        events += 1;
                    }
                    other => panic!("{kind}: {other:?}"),
                }
            }
        }
    }
    let tail: Vec<f64> = seen
        .iter()
        .copied()
        .filter(|v| [1.25, 2.5, 3.75].contains(v))
        .collect();
    assert_eq!(tail, vec![1.25, 2.5, 3.75], "{kind}: {seen:?}");
    if with_events {
        // Events keep coming every 200 ms.
        while events < 2 {
            if let Some(SubscriptionEvent::Notifications { notifications, .. }) =
                tokio::time::timeout(Duration::from_secs(10), sub.recv())
                    .await
                    .unwrap_or_else(|_| panic!("{kind}: no events"))
            {
                events += notifications
                    .iter()
                    .filter(|n| matches!(n, Notification::Event { .. }))
                    .count();
            }
        }
    }
    sub.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_the_asyncua_server() {
    exercise("asyncua").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_the_open62541_server() {
    exercise("o6").await;
}

/// A self-signed certificate and key for `uri`.
fn make_cert(uri: &str, name: &str) -> (Vec<u8>, Vec<u8>) {
    let start = SystemTime::now()
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or(UNIX_EPOCH);
    let mut params = SelfSignedParams::new(uri, name, start);
    params.dns_names = vec!["localhost".into()];
    params.ip_addresses = vec!["127.0.0.1".parse().unwrap()];
    let made = create_self_signed(&params).unwrap();
    (
        made.certificate.der().to_vec(),
        made.private_key_pkcs8_der.clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secured_client_against_the_asyncua_server() {
    let dir = std::env::temp_dir().join(format!("uascale-peer-sec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (server_der, server_key) = make_cert("urn:freeopcua:python:server", "peer server");
    let cert_path = dir.join("server.der");
    let key_path = dir.join("server.pem");
    std::fs::write(&cert_path, &server_der).unwrap();
    std::fs::write(&key_path, to_pem("PRIVATE KEY", &server_key)).unwrap();
    let peer = start_peer(
        "asyncua-secure",
        &[cert_path.to_str().unwrap(), key_path.to_str().unwrap()],
    );
    let url = format!("opc.tcp://127.0.0.1:{}/", peer.port);
    let (client_der, client_key) = make_cert("urn:uascale:client", "uascale client");
    let identity = Arc::new(
        Identity::new(
            uascale_crypto::x509::Certificate::from_der(&client_der).unwrap(),
            RsaPrivateKey::from_pkcs8_der(&client_key).unwrap(),
        )
        .unwrap(),
    );
    let trusted = uascale_crypto::x509::Certificate::from_der(&server_der).unwrap();
    let trust: Arc<dyn CertificateValidator> = Arc::new(TrustListValidator::new(TrustList::new(
        vec![trusted],
        vec![],
        vec![],
    )));
    // Without a trust decision a secured connect is refused.
    let mut untrusting = ClientOptions::default();
    untrusting.security.policy = SecurityPolicy::Basic256Sha256;
    untrusting.security.mode = t::MessageSecurityMode::SignAndEncrypt;
    untrusting.security.certificate = Some(Arc::clone(&identity));
    let e = Client::connect(&url, untrusting).await.unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadCertificateUntrusted, "{e}");
    let options = |user: UserIdentity| ClientOptions {
        security: SecurityOptions {
            policy: SecurityPolicy::Basic256Sha256,
            mode: t::MessageSecurityMode::SignAndEncrypt,
            certificate: Some(Arc::clone(&identity)),
            // Looked up with GetEndpoints over None and validated against
            // a trust list holding it.
            trust: ServerTrust::Validator(Arc::clone(&trust)),
            server_certificate: None,
        },
        identity: user,
        ..Default::default()
    };
    let users = [
        ("anonymous", UserIdentity::Anonymous),
        (
            "user name",
            UserIdentity::UserName {
                user: "peer".into(),
                password: "peer-pass".into(),
            },
        ),
    ];
    for (what, user) in users {
        let client = Client::connect(&url, options(user)).await.unwrap();
        assert_eq!(
            client.security().server_certificate().unwrap().der(),
            &server_der[..]
        );
        client.create_session("secure interop").await.unwrap();
        let temp = NodeId::string(1, "Temperature");
        let values = client
            .read_values(&[NodeId::ns0(2258), temp.clone()])
            .await
            .unwrap();
        assert!(
            matches!(values[0].value, Some(Variant::DateTime(_))),
            "{what}"
        );
        assert_eq!(values[1].value, Some(Variant::Double(20.5)), "{what}");
        // A large response: many encrypted chunks.
        let many = vec![NodeId::ns0(2258); 2000];
        assert_eq!(client.read_values(&many).await.unwrap().len(), 2000);
        client.close().await;
    }
    // A wrong password is refused by the server.
    let client = Client::connect(
        &url,
        options(UserIdentity::UserName {
            user: "peer".into(),
            password: "nope".into(),
        }),
    )
    .await
    .unwrap();
    let e = client.create_session("wrong").await.unwrap_err();
    assert!(
        matches!(e, ClientError::Service { status, .. } if status.is_bad()),
        "{e:?}"
    );
    client.close().await;
    // A policy the server does not offer: the error lists what it does.
    let mut o = options(UserIdentity::Anonymous);
    o.security.policy = SecurityPolicy::Aes256Sha256RsaPss;
    match Client::connect(&url, o).await {
        Err(ClientError::EndpointNotFound { wanted, offered }) => {
            assert_eq!(wanted, "Aes256_Sha256_RsaPss:SignAndEncrypt");
            assert!(
                offered.contains(&"Basic256Sha256:SignAndEncrypt".to_owned()),
                "{offered:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A server certificate other than the endpoint's is refused.
    let (other, _) = make_cert("urn:other", "other");
    let mut o = options(UserIdentity::Anonymous);
    o.security.server_certificate = Some(other.clone());
    let e = Client::connect(&url, o.clone()).await.unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadCertificateUntrusted, "{e}");
    // ... and still when trusted blindly: the OPN is for another key.
    o.security.trust = ServerTrust::UnsafeAcceptAny;
    assert!(Client::connect(&url, o).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// An ECC certificate and PKCS#8 key for `uri`.
fn make_ecc_cert(uri: &str, name: &str, key: KeyType) -> (Vec<u8>, Vec<u8>) {
    let start = SystemTime::now()
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or(UNIX_EPOCH);
    let mut params = SelfSignedParams::new(uri, name, start);
    params.dns_names = vec!["localhost".into()];
    params.ip_addresses = vec!["127.0.0.1".parse().unwrap()];
    params.key_type = key;
    let made = create_self_signed(&params).unwrap();
    (
        made.certificate.der().to_vec(),
        made.private_key_pkcs8_der.clone(),
    )
}

/// The client against open62541's server (o6) over each ECC policy o6
/// offers - ECC_nistP256_AesGcm and ECC_nistP256_ChaChaPoly with a P-256
/// server certificate, ECC_curve25519 with an Ed25519 one - in both modes,
/// Anonymous and UserName (the password as an EccEncryptedSecret for the
/// server's ECDHKey), with two token renewals inside one session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecc_client_against_the_open62541_server() {
    let dir = std::env::temp_dir().join(format!("uascale-peer-ecc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (key, policies) in [
        (
            KeyType::EcP256,
            &[
                SecurityPolicy::EccNistP256AesGcm,
                SecurityPolicy::EccNistP256ChaChaPoly,
            ][..],
        ),
        (KeyType::Ed25519, &[SecurityPolicy::EccCurve25519][..]),
    ] {
        let server_uri = "urn:uascale:test:o6-ecc-server";
        let (server_der, server_key) = make_ecc_cert(server_uri, "o6 ecc server", key);
        let cert_path = dir.join(format!("server-{}.der", key.name()));
        let key_path = dir.join(format!("server-{}.pem", key.name()));
        std::fs::write(&cert_path, &server_der).unwrap();
        std::fs::write(&key_path, to_pem("PRIVATE KEY", &server_key)).unwrap();
        let peer = start_peer(
            "o6-ecc",
            &[
                cert_path.to_str().unwrap(),
                key_path.to_str().unwrap(),
                server_uri,
            ],
        );
        let url = format!("opc.tcp://127.0.0.1:{}/", peer.port);
        let (client_der, client_key) = make_ecc_cert("urn:uascale:client", "uascale client", key);
        let identity = Arc::new(
            Identity::with_key(
                uascale_crypto::x509::Certificate::from_der(&client_der).unwrap(),
                PrivateKey::from_der(&client_key).unwrap(),
            )
            .unwrap(),
        );
        let trust: Arc<dyn CertificateValidator> =
            Arc::new(TrustListValidator::new(TrustList::new(
                vec![uascale_crypto::x509::Certificate::from_der(&server_der).unwrap()],
                vec![],
                vec![],
            )));
        for &policy in policies {
            for mode in [
                t::MessageSecurityMode::Sign,
                t::MessageSecurityMode::SignAndEncrypt,
            ] {
                for (who, user) in [
                    ("anonymous", UserIdentity::Anonymous),
                    (
                        "user name",
                        UserIdentity::UserName {
                            user: "peer".into(),
                            password: "peer-pass".into(),
                        },
                    ),
                ] {
                    let what = format!("{policy:?} {mode:?} {who}");
                    let mut options = ClientOptions {
                        security: SecurityOptions {
                            policy,
                            mode,
                            certificate: Some(Arc::clone(&identity)),
                            trust: ServerTrust::Validator(Arc::clone(&trust)),
                            server_certificate: None,
                        },
                        identity: user,
                        ..Default::default()
                    };
                    // Renewed at 75 % of 2 s.
                    options.channel.requested_lifetime = Duration::from_secs(2);
                    let client = Client::connect(&url, options)
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    client
                        .create_session("ecc interop")
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let temp = NodeId::string(1, "Temperature");
                    let rounds = if mode == t::MessageSecurityMode::SignAndEncrypt {
                        3
                    } else {
                        1
                    };
                    for round in 0..rounds {
                        if round > 0 {
                            // Two renewals happen during these waits.
                            tokio::time::sleep(Duration::from_millis(1800)).await;
                        }
                        let values = client
                            .read_values(&[NodeId::ns0(2258), temp.clone()])
                            .await
                            .unwrap_or_else(|e| panic!("{what} round {round}: {e}"));
                        assert!(
                            matches!(values[0].value, Some(Variant::DateTime(_))),
                            "{what}"
                        );
                        assert_eq!(values[1].value, Some(Variant::Double(20.5)), "{what}");
                    }
                    if rounds > 1 {
                        assert!(client.token_renewals() >= 2, "{what}: renewed twice");
                    }
                    // Many chunks of the AEAD symmetric layer.
                    let many = vec![NodeId::ns0(2258); 1500];
                    assert_eq!(client.read_values(&many).await.unwrap().len(), 1500);
                    client.close().await;
                }
            }
        }
        // A wrong password is refused by the server.
        let mut options = ClientOptions {
            security: SecurityOptions {
                policy: policies[0],
                mode: t::MessageSecurityMode::SignAndEncrypt,
                certificate: Some(Arc::clone(&identity)),
                trust: ServerTrust::Validator(Arc::clone(&trust)),
                server_certificate: None,
            },
            identity: UserIdentity::UserName {
                user: "peer".into(),
                password: "nope".into(),
            },
            ..Default::default()
        };
        options.channel.requested_lifetime = Duration::from_secs(60);
        let client = Client::connect(&url, options).await.unwrap();
        let e = client.create_session("wrong").await.unwrap_err();
        assert!(
            matches!(e, ClientError::Service { status, .. } if status.is_bad()),
            "{e:?}"
        );
        client.close().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
