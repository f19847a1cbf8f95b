//! What the integration tests share: `uascale serve` on a free loopback
//! port, waited for until it accepts connections, killed on drop.
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_uascale");

/// A running `uascale serve`.
pub struct Served {
    /// The process.
    pub child: Child,
    /// Its loopback port.
    pub port: u16,
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
    let port = free_port();
    let child = Command::new(BIN)
        .args(["serve", "--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(args)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut served = Served { child, port };
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
