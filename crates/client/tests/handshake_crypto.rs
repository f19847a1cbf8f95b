//! The server's handshake crypto, in place and on its own threads
//! (`runtime.crypto_threads`), against the client in the same process over
//! real loopback sockets. A test binary of its own: it counts this
//! process's threads.

mod common;

use std::time::Duration;

use uascale_client::{Client, ClientOptions};
use uascale_server::Server;
use uascale_types as t;
use uascale_types::{NodeId, Variant};

/// The names of this process's threads (`/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim_end().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// How many of this process's threads are crypto threads.
fn crypto_threads_running() -> usize {
    thread_names()
        .iter()
        .filter(|n| n.starts_with("uascale-crypto"))
        .count()
}

/// A server configuration with every RSA policy and a fresh PKI directory
/// named after `name` (returned, for the test to remove), trusting every
/// client certificate or none, with `threads` crypto threads.
fn secured_config(
    name: &str,
    trust_all: bool,
    threads: usize,
) -> (std::path::PathBuf, uascale_server::config::ServerConfig) {
    let pki = std::env::temp_dir().join(format!("uascale-rsa-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pki);
    let mut config = common::config();
    config.security = uascale_server::config::SecurityConfig {
        pki_dir: pki.clone(),
        trust_all_client_certificates: trust_all,
        ..Default::default()
    };
    config.runtime.crypto_threads = threads;
    (pki, config)
}

/// A Basic256Sha256 SignAndEncrypt session through two token renewals
/// (each an asymmetric OpenSecureChannel), with the handshake crypto in
/// place (`runtime.crypto_threads` 0) and on two crypto threads, which
/// the server starts and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_handshakes_in_place_and_on_crypto_threads() {
    use uascale_client::{SecurityOptions, ServerTrust};
    use uascale_crypto::policy::SecurityPolicy;

    let identity = common::client_identity("rsa client");
    for threads in [0, 2] {
        let (pki, mut config) = secured_config(&format!("threads-{threads}"), true, threads);
        config.limits.min_token_lifetime = Duration::from_secs(1);
        let server = Server::bind(config).unwrap();
        // Each thread names itself once it runs.
        common::eventually(Duration::from_secs(5), || {
            crypto_threads_running() >= threads
        })
        .await;
        assert_eq!(crypto_threads_running(), threads, "started with the server");
        let url = format!("opc.tcp://{}", server.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));

        let mut options = ClientOptions {
            security: SecurityOptions {
                policy: SecurityPolicy::Basic256Sha256,
                mode: t::MessageSecurityMode::SignAndEncrypt,
                certificate: Some(std::sync::Arc::clone(&identity)),
                trust: ServerTrust::UnsafeAcceptAny,
                server_certificate: None,
            },
            application_uri: "urn:uascale:client".into(),
            ..Default::default()
        };
        options.channel.requested_lifetime = Duration::from_secs(1);
        let client = Client::connect(&url, options)
            .await
            .unwrap_or_else(|e| panic!("{threads} threads: {e}"));
        client.create_session("rsa").await.unwrap();
        for round in 0..3 {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(900)).await;
            }
            let v = client.read_values(&[NodeId::ns0(2259)]).await.unwrap();
            assert_eq!(v[0].value, Some(Variant::Int32(0)), "{threads} threads");
        }
        assert!(
            client.token_renewals() >= 2,
            "{threads} threads: renewed twice"
        );
        assert_eq!(crypto_threads_running(), threads, "while serving");
        client.close().await;

        let _ = stop.send(());
        running.await.unwrap().unwrap();
        // The threads end with the server.
        common::eventually(Duration::from_secs(5), || crypto_threads_running() == 0).await;
        assert_eq!(crypto_threads_running(), 0, "{threads} threads ended");
        let _ = std::fs::remove_dir_all(&pki);
    }
}

/// In place, a handshake refused while its request is received (the
/// client certificate is not trusted) ends that connection with the ERR;
/// the server goes on serving the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_a_refused_handshake_ends_only_its_connection() {
    use uascale_client::{SecurityOptions, ServerTrust};
    use uascale_crypto::policy::SecurityPolicy;

    let (pki, config) = secured_config("refused", false, 0);
    let server = Server::bind(config).unwrap();
    let url = format!("opc.tcp://{}", server.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let secured = ClientOptions {
        security: SecurityOptions {
            policy: SecurityPolicy::Basic256Sha256,
            mode: t::MessageSecurityMode::SignAndEncrypt,
            certificate: Some(common::client_identity("untrusted client")),
            trust: ServerTrust::UnsafeAcceptAny,
            server_certificate: None,
        },
        application_uri: "urn:uascale:client".into(),
        ..Default::default()
    };
    let refused = Client::connect(&url, secured)
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        refused.status_code(),
        t::StatusCode::BadCertificateUntrusted,
        "{refused}"
    );
    let client = Client::connect(&url, ClientOptions::default())
        .await
        .unwrap();
    client.create_session("after").await.unwrap();
    let v = client.read_values(&[NodeId::ns0(2259)]).await.unwrap();
    assert_eq!(v[0].value, Some(Variant::Int32(0)));
    client.close().await;

    let _ = stop.send(());
    running.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&pki);
}
