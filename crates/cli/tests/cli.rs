//! The command line: configuration errors name the key, `--print-config`
//! prints what `--config` reads back, the start logs the configuration as
//! TOML, and `[operation_limits]` reach the address space and the services.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::TempDir;

fn uascale(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args(args)
        .output()
        .expect("run uascale")
}

#[test]
fn bad_config_file_names_the_key() {
    let dir = TempDir::new("cli");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[server]\nprot = 4841\n").unwrap();
    let out = uascale(&["serve", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown field `prot`") && err.contains("line 2"),
        "{err}"
    );
    std::fs::write(&bad, "[limits]\nsend_buffer_size = 10\n").unwrap();
    let out = uascale(&["serve", "--config", bad.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("limits.send_buffer_size"));
    let out = uascale(&["serve", "--port", "70000"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--port \"70000\" is not a port number"));
}

#[test]
fn print_config_reads_back() {
    let out = uascale(&["serve", "--port", "4999", "--nodes", "3", "--print-config"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("port = 4999") && text.contains("nodes = 3"),
        "{text}"
    );
    let dir = TempDir::new("cli-p");
    let file = dir.join("effective.toml");
    std::fs::write(&file, &text).unwrap();
    let again = uascale(&[
        "serve",
        "--config",
        file.to_str().unwrap(),
        "--print-config",
    ]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), text);
}

#[test]
fn the_start_logs_the_effective_configuration_as_toml() {
    let mut child = Command::new(common::BIN)
        .args(["serve", "--bind", "127.0.0.1", "--port", "0"])
        .args(["--security", "none", "--nodes", "3"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uascale serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.contains("listening") {
            break;
        }
        lines.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    let start = lines
        .iter()
        .position(|l| l.contains("INFO") && l.ends_with("effective configuration:"))
        .unwrap_or_else(|| panic!("no configuration event in {lines:#?}"));
    // The event's message is the TOML text, one key per line.
    let toml_text: String = lines[start + 1..]
        .iter()
        .take_while(|l| !l.contains(" INFO ") && !l.contains(" WARN "))
        .map(|l| format!("{l}\n"))
        .collect();
    let config: toml::Table = toml::from_str(&toml_text)
        .unwrap_or_else(|e| panic!("the logged configuration is TOML: {e}\n{toml_text}"));
    assert_eq!(config["demo"]["nodes"].as_integer(), Some(3), "{toml_text}");
    assert_eq!(config["server"]["bind"].as_str(), Some("127.0.0.1"));
    assert!(config.contains_key("operation_limits"), "{toml_text}");
}

#[test]
fn operation_limits_are_published_and_enforced() {
    let dir = TempDir::new("cli-ol");
    let file = dir.join("limits.toml");
    std::fs::write(
        &file,
        "[operation_limits]\nmax_nodes_per_read = 8\nmax_nodes_per_write = 2\n\
         max_nodes_per_method_call = 3\nmax_nodes_per_browse = 4\n\
         max_nodes_per_register_nodes = 5\n\
         max_nodes_per_translate_browse_paths_to_node_ids = 6\n\
         max_browse_continuation_points = 7\n\
         [subscriptions]\nmax_monitored_items_per_call = 9\n",
    )
    .unwrap();
    let served = common::serve_logged(["--security", "none", "--config", file.to_str().unwrap()]);
    let url = served.url();
    // ServerCapabilities/OperationLimits and MaxBrowseContinuationPoints.
    let ids = [
        "i=11705", "i=11707", "i=11709", "i=11710", "i=11711", "i=11712", "i=11714", "i=2735",
    ];
    let out = uascale(&[&["read", &url][..], &ids, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let values: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<_> = (0..ids.len())
        .map(|i| (values[i]["value"].as_u64(), values[i]["type"].as_str()))
        .collect();
    let u32s = [8, 2, 3, 4, 5, 6, 9].map(|v| (Some(v), Some("UInt32")));
    assert_eq!(got[..7], u32s, "{values}");
    assert_eq!(got[7], (Some(7), Some("UInt16")), "{values}");
    // One node over max_nodes_per_read.
    let out = uascale(&[&["read", &url][..], &ids, &["i=2735"]].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("BadTooManyOperations"), "{err}");
}

/// The start log of `serve` up to its "listening" line, with `envs` set
/// (and NO_COLOR removed unless set there) and `args` added.
fn start_log(args: &[&str], envs: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = Command::new(common::BIN);
    cmd.args([
        "serve",
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--security",
        "none",
    ])
    .args(args)
    .env("RUST_LOG", "info")
    .env_remove("NO_COLOR")
    .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start uascale serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let done = line.contains("listening");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

/// Logs written to a pipe (or a file) carry no colour escape codes; JSON
/// logs on request are one object per line.
#[test]
fn logs_are_plain_off_a_terminal_and_json_on_request() {
    let text = start_log(&[], &[]);
    assert!(text.iter().any(|l| l.contains("listening")), "{text:#?}");
    assert!(
        !text.iter().any(|l| l.contains('\u{1b}')),
        "escape codes in a piped log: {text:#?}"
    );
    let json = start_log(&["--log-format", "json"], &[]);
    assert!(json.len() >= 2, "{json:#?}");
    for line in &json {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }
    assert!(json.iter().any(|l| l.contains("effective configuration")));
    let out = Command::new(common::BIN)
        .args(["serve", "--log-format", "xml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-format"));
}
