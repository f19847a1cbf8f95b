//! The client commands (`endpoints`, `browse`, `read`, `write`, `call`,
//! `subscribe`) run as a user would, against `uascale serve`: their output,
//! their exit codes and their error messages.

mod common;

use std::process::{Command, Output, Stdio};

use common::{Served, BIN};

fn serve() -> Served {
    common::serve(["--security", "none"])
}

fn run(args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN).args(args).output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn client_commands_against_uascale_serve() {
    let s = serve();
    let url = &s.url();

    let (code, out, _) = run(&["endpoints", url]);
    assert_eq!(code, 0);
    assert!(out.contains("None / None"), "{out}");
    assert!(out.contains("token Anonymous"), "{out}");

    let (code, out, _) = run(&["browse", url, "--depth", "2"]);
    assert_eq!(code, 0);
    assert!(out.contains("Server (Object) i=2253"), "{out}");
    assert!(out.contains("  ServerStatus (Variable) i=2256"), "{out}");
    assert!(out.contains("Demo"), "{out}");

    let (code, out, _) = run(&[
        "write",
        url,
        "ns=2;s=Demo.Static.Array.Double",
        "[1.5, -2, 3e3]",
    ]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run(&["read", url, "ns=2;s=Demo.Static.Array.Double", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["value"], serde_json::json!([1.5, -2.0, 3000.0]));
    assert_eq!(v[0]["type"], "Double");

    // A type the node refuses, and a value that is not of the node's type.
    let (code, _, err) = run(&["write", url, "ns=2;s=Demo.Static.Scalar.Byte", "300"]);
    assert_eq!(code, 2);
    assert!(err.contains("\"300\" is not a Byte"), "{err}");
    let (code, out, _) = run(&[
        "write",
        url,
        "ns=2;s=Demo.Static.Scalar.Byte",
        "7",
        "--type",
        "Double",
    ]);
    assert_eq!(code, 1);
    assert!(out.contains("BadTypeMismatch"), "{out}");

    let (code, out, _) = run(&[
        "call",
        url,
        "ns=2;s=Demo.Methods",
        "ns=2;s=Demo.Methods.Add",
        "1.25",
        "2",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("3.25"), "{out}");
    let (code, _, err) = run(&[
        "call",
        url,
        "ns=2;s=Demo.Methods",
        "ns=2;s=Demo.Methods.Add",
        "1",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("takes 2 argument(s)"), "{err}");

    let (code, out, _) = run(&["read", url, "i=2258", "ns=2;s=No.Such"]);
    assert_eq!(code, 1, "a Bad value fails the command");
    assert!(out.contains("ns=2;s=No.Such: BadNodeIdUnknown"), "{out}");

    let (code, _, err) = run(&["read", url, "ns=x;i=1"]);
    assert_eq!(code, 2);
    assert!(err.contains("is not a NodeId"), "{err}");
    assert!(err.contains("examples"), "{err}");
}

#[test]
fn unreachable_servers_are_explained() {
    let port = common::free_port();
    let url = format!("opc.tcp://127.0.0.1:{port}");
    let (code, _, err) = run(&["read", &url, "i=2258"]);
    assert_eq!(code, 1);
    assert!(err.contains("is the server running"), "{err}");
    let (code, _, err) = run(&["read", "localhost:4840", "i=2258"]);
    assert_eq!(code, 1);
    assert!(err.contains("opc.tcp://host:port"), "{err}");
}

#[test]
fn output_cut_short_by_the_reader_is_not_a_panic() {
    use std::io::{BufRead, BufReader};
    let s = serve();
    let mut child = Command::new(BIN)
        .args(["browse", &s.url(), "i=84", "--depth", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read one line, then go away like `| head -1` does.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{:?}: {err}", out.status);
}

#[test]
fn subscribe_prints_data_changes_and_filtered_events() {
    let s = serve();
    let url = &s.url();

    // Data changes, one JSON object per line, until --count.
    let (code, out, err) = run(&[
        "subscribe",
        url,
        "ns=2;s=Demo.Dynamic.Counter",
        "--interval-ms",
        "100",
        "--count",
        "3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let values: Vec<u64> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["node"], "ns=2;s=Demo.Dynamic.Counter");
            assert_eq!(v["status"], "Good");
            v["value"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(values.len(), 3, "{out}");
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");

    // Events of the Server object, filtered on the server by severity.
    let (code, out, err) = run(&[
        "subscribe",
        url,
        "--events",
        "i=2253",
        "--min-severity",
        "500",
        "--fields",
        "Severity,Message",
        "--count",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for line in lines {
        assert!(line.contains("event i=2253 Severity="), "{line}");
        let severity: u16 = line
            .split("Severity=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(severity >= 500, "{line}");
        assert!(line.contains("Message=Demo event"), "{line}");
    }

    // A duration ends it too; an unknown node is reported, the rest kept.
    let (code, out, err) = run(&[
        "subscribe",
        url,
        "ns=2;s=Demo.Dynamic.Counter",
        "ns=2;s=No.Such.Node",
        "--duration-s",
        "1.5",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("ns=2;s=No.Such.Node: BadNodeIdUnknown"),
        "{err}"
    );
    assert!(out.contains("ns=2;s=Demo.Dynamic.Counter = "), "{out}");

    // Nothing to subscribe to, or only unknown nodes: clear errors.
    let (code, _, err) = run(&["subscribe", url]);
    assert_eq!(code, 2);
    assert!(err.contains("nothing to subscribe to"), "{err}");
    let (code, _, err) = run(&["subscribe", url, "ns=2;s=No.Such.Node", "--count", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("refused all 1 monitored items"), "{err}");
    let (code, _, err) = run(&["subscribe", url, "i=2258", "--count", "many"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--count \"many\" is not a valid number"),
        "{err}"
    );
}
