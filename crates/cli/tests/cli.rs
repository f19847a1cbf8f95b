//! The command line: configuration errors name the key, `--print-config`
//! prints what `--config` reads back.

use std::process::Command;

fn uascale(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uascale"))
        .args(args)
        .output()
        .expect("run uascale")
}

#[test]
fn bad_config_file_names_the_key() {
    let dir = std::env::temp_dir().join(format!("uascale-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
    let dir = std::env::temp_dir().join(format!("uascale-cli-p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
