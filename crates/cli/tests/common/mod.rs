//! What the integration tests and benches share: `uascale serve` on a
//! loopback port, waited for until it accepts connections, killed on drop,
//! and a process's figures from /proc.
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_uascale");

/// A directory under the system's temporary directory, removed with all it
/// holds on drop (also when the test fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `uascale-NAME-PID`, emptied if an earlier run left it, and created.
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("uascale-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `uascale serve`.
pub struct Served {
    /// The process.
    pub child: Child,
    /// Its loopback port.
    pub port: u16,
    /// A directory of its files (configuration, reports), removed after the
    /// process is stopped.
    pub dir: Option<TempDir>,
}

impl Served {
    /// `opc.tcp://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("opc.tcp://127.0.0.1:{}", self.port)
    }

    /// Its PID (for `--server-pid`).
    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `uascale serve --bind 127.0.0.1 --port P ARGS...`, once it accepts
/// connections (at most 60 s).
pub fn serve<I, S>(args: I) -> Served
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    serve_on(free_port(), args)
}

/// [`serve`] on `port` (a node started again in its predecessor's place,
/// where the front end expects it).
pub fn serve_on<I, S>(port: u16, args: I) -> Served
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let child = Command::new(BIN)
        .args(["serve", "--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(args)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut served = Served {
        child,
        port,
        dir: None,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = served.child.try_wait() {
            panic!("uascale serve exited: {status}");
        }
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    served
}

/// `uascale serve --bind 127.0.0.1 --port 0 ARGS...` (no race for a free
/// port): the port comes from the address it logs. Its warnings and errors
/// are passed on to stderr.
pub fn serve_logged<I, S>(args: I) -> Served
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut child = Command::new(BIN)
        .args(["serve", "--bind", "127.0.0.1", "--port", "0"])
        .args(args)
        .env("RUST_LOG", "warn,uascale=info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uascale serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("addr=127.0.0.1:") {
                let port: String = line[at + 15..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let _ = tx.send(port.parse::<u16>().unwrap_or(0));
            } else if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("[serve] {line}");
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server printed its address");
    Served {
        child,
        port,
        dir: None,
    }
}

/// A numeric field of `/proc/PID/status` (`Threads:`, `VmRSS:` in KiB,
/// ...); 0 when it cannot be read.
pub fn proc_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
