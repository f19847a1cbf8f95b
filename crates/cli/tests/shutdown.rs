//! A planned shutdown of a real `uascale serve`: on SIGTERM, and by an
//! administrator with `uascale shutdown` (Server.RequestServerStateChange).
//! A client on the server sees ServerStatus.State Shutdown, a
//! SecondsTillShutdown counting down, the ShutdownReason and ServiceLevel 0;
//! `/readyz` answers 503 at once and new sessions are refused; then the
//! channel closes and the process exits.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, serve_logged, TempDir, BIN};
use uascale_client::{Client, ClientOptions};
use uascale_types::{ids::variable as v, NodeId, StatusCode, Variant};

/// The status of `GET /readyz` on `port` (0 when it does not answer).
fn readyz(port: u16) -> u16 {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// State, SecondsTillShutdown, ShutdownReason text, ServiceLevel.
async fn status(client: &Client) -> Option<(i32, u32, String, u8)> {
    let ids = [
        v::Server_ServerStatus_State,
        v::Server_ServerStatus_SecondsTillShutdown,
        v::Server_ServerStatus_ShutdownReason,
        v::Server_ServiceLevel,
    ]
    .map(NodeId::ns0);
    let values = client.read_values(&ids).await.ok()?;
    let value = |i: usize| values.get(i).and_then(|d| d.value.clone());
    match (value(0), value(1), value(2), value(3)) {
        (
            Some(Variant::Int32(state)),
            Some(Variant::UInt32(secs)),
            Some(Variant::LocalizedText(reason)),
            Some(Variant::Byte(level)),
        ) => Some((state, secs, reason.text.as_str_or_empty().to_owned(), level)),
        other => panic!("unexpected ServerStatus values {other:?}"),
    }
}

fn options() -> ClientOptions {
    ClientOptions {
        reconnect: false,
        ..Default::default()
    }
}

fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_counts_down_with_the_server_status_then_closes() {
    let dir = TempDir::new("shutdown-signal");
    let metrics = free_port();
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!("[server]\nshutdown_delay_s = 4\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n"),
    )
    .unwrap();
    let mut served = serve_logged(["--config", config.to_str().unwrap(), "--security", "none"]);
    let url = served.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = Client::connect(&url, options()).await.unwrap();
        client.create_session("shutdown test").await.unwrap();
        assert_eq!(
            status(&client).await,
            Some((0, 0, String::new(), 255)),
            "running, idle"
        );
        assert_eq!(readyz(metrics), 200);

        let _ = Command::new("kill").args(["-TERM", &served.pid()]).status();
        // Until the channel closes: what the session reads.
        let mut seen = Vec::new();
        let mut readyz_seen = None;
        let mut refused = None;
        while let Some(s) = status(&client).await {
            if s.0 == 4 && readyz_seen.is_none() {
                readyz_seen = Some(readyz(metrics));
                // A new session is refused while the old one goes on.
                let other = Client::connect(&url, options()).await.unwrap();
                refused = Some(other.create_session("late").await.err());
            }
            seen.push(s);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let shutting: Vec<_> = seen.iter().filter(|s| s.0 == 4).collect();
        assert!(!shutting.is_empty(), "State Shutdown seen: {seen:?}");
        assert!(
            shutting
                .iter()
                .all(|s| s.3 == 0 && s.2.contains("SIGTERM") && s.1 <= 4),
            "ServiceLevel 0, the reason, at most the delay: {shutting:?}"
        );
        // The countdown: never up, and through more than one value.
        let secs: Vec<u32> = shutting.iter().map(|s| s.1).collect();
        assert!(secs.windows(2).all(|w| w[1] <= w[0]), "{secs:?}");
        assert!(secs.first() > secs.last(), "counted down: {secs:?}");
        assert_eq!(readyz_seen, Some(503), "/readyz while shutting down");
        let refused = refused.flatten().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("BadServerHalted"), "{refused}");
    });
    assert!(wait_exit(&mut served.child).success());
}

#[test]
fn uascale_shutdown_is_for_administrators_and_can_be_cancelled() {
    let dir = TempDir::new("shutdown-admin");
    let metrics = free_port();
    let password = "s3cret-admin";
    let mut hasher = Command::new(BIN)
        .args(["user", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(hasher.stdin.take().unwrap(), "{password}").unwrap();
    let hash = String::from_utf8(hasher.wait_with_output().unwrap().stdout).unwrap();
    let hash = hash.trim();
    let pki = dir.join("pki");
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nadmin_users = [\"ops\"]\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\n\
             [security]\npki_dir = {pki:?}\n\n\
             [[users]]\nname = \"ops\"\npassword_hash = \"{hash}\"\n\n\
             [[users]]\nname = \"guest\"\npassword_hash = \"{hash}\"\n"
        ),
    )
    .unwrap();
    let mut served = serve_logged(["--config", config.to_str().unwrap()]);
    let url = served.url();
    let client_pki = dir.join("client-pki");
    let uascale = |args: &[&str], user: &str| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--user", user, "--pki", client_pki.to_str().unwrap()])
            .args(["--trust-server"])
            .env("UASCALE_PASSWORD", password)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // ServerStatus.State as a session opened before reads it (a new one
    // is refused while the shutdown is planned).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        let client = Client::connect(&url, options()).await.unwrap();
        client.create_session("watcher").await.unwrap();
        client
    });
    let state = || {
        runtime
            .block_on(status(&client))
            .expect("the session reads")
            .0
    };
    assert_eq!(state(), 0);

    // Not an administrator.
    let (code, out) = uascale(&["shutdown", &url, "--delay", "60"], "guest");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&StatusCode::BadUserAccessDenied.to_string()),
        "{out}"
    );
    assert_eq!(readyz(metrics), 200);
    assert_eq!(state(), 0);

    // An administrator plans it, then cancels it.
    let (code, out) = uascale(
        &[
            "shutdown",
            &url,
            "--delay",
            "60",
            "--reason",
            "maintenance window",
        ],
        "ops",
    );
    assert_eq!(code, Some(0), "{out}");
    let (st, secs, reason, level) = runtime.block_on(status(&client)).unwrap();
    assert_eq!((st, reason.as_str(), level), (4, "maintenance window", 0));
    assert!(secs <= 60 && secs > 0, "{secs}");
    assert_eq!(readyz(metrics), 503);
    // A new session is refused now, but an administrator's.
    let (code, out) = uascale(&["read", &url, "i=2259"], "guest");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("BadServerHalted"), "{out}");
    let (code, out) = uascale(&["shutdown", &url, "--cancel"], "ops");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(state(), 0);
    assert_eq!(readyz(metrics), 200);

    // And now: the server goes.
    let (code, out) = uascale(&["shutdown", &url, "--delay", "0"], "ops");
    assert_eq!(code, Some(0), "{out}");
    assert!(wait_exit(&mut served.child).success());
}
