//! A real nats-server with JetStream on a free 127.0.0.1 port, started by
//! the test and killed when dropped. When the binary is missing it is
//! installed with `apt-get install -y nats-server` (CI runs as root); only
//! when that is impossible does the caller skip, loudly.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nats-server.
pub struct Nats {
    child: Child,
    dir: PathBuf,
    /// Its client address.
    pub addr: SocketAddr,
}

impl Nats {
    /// Kills it (SIGKILL), keeping its store directory.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port and store directory (after
    /// [`Nats::kill`]; a single server only).
    pub fn restart(&mut self) {
        let bin = ensure_installed("nats-server", "nats-server").expect("nats-server");
        self.child = Command::new(bin)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.addr.port().to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server again");
        assert!(
            wait_listening(self.addr, Duration::from_secs(10)),
            "nats-server did not listen again on {}",
            self.addr
        );
    }

    /// Its URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn find(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()])
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

/// The path of `binary` from Debian package `package`, installed when
/// missing; `None` (with the reason printed) when it cannot be had.
pub fn ensure_installed(binary: &str, package: &str) -> Option<PathBuf> {
    if let Some(p) = find(binary) {
        return Some(p);
    }
    eprintln!("{binary} not found: trying apt-get install -y {package}");
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        // The package lists may be missing on a fresh machine.
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-q", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    let found = find(binary);
    if found.is_none() {
        // Straight to the process's stderr, past the test harness's
        // capture, so that the line is in the output of a passing test
        // too: `cargo xtask ci` counts these lines in its summary and fails
        // on them under CI=true.
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED {test}: {binary} is not installed and `apt-get install -y {package}` \
             failed (run as root, or install {package}) ***\n"
        );
    }
    found
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits (at most `limit`) until `addr` accepts connections.
pub fn wait_listening(addr: SocketAddr, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Starts one nats-server with JetStream; `None` (skip) only when it
/// cannot be installed.
pub fn start() -> Option<Nats> {
    let bin = ensure_installed("nats-server", "nats-server")?;
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("uascale-nats-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a store directory");
    let child = Command::new(bin)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let nats = Nats { child, dir, addr };
    assert!(
        wait_listening(addr, Duration::from_secs(10)),
        "nats-server did not listen on {addr}"
    );
    Some(nats)
}

/// Starts `n` nats-servers with JetStream routed into one cluster (each
/// knows the others' route ports); the first one's URL reaches them all
/// (the client learns the others from it). `None` (skip) only when the
/// binary cannot be installed.
pub fn start_cluster(n: usize) -> Option<Vec<Nats>> {
    let bin = ensure_installed("nats-server", "nats-server")?;
    let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
    let mut servers = Vec::new();
    for (i, (port, route)) in ports.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("uascale-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a store directory");
        let routes: Vec<String> = ports
            .iter()
            .filter(|(_, r)| r != route)
            .map(|(_, r)| format!("nats://127.0.0.1:{r}"))
            .collect();
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .args([
                "--server_name",
                &format!("s{i}"),
                "--cluster_name",
                "uascale",
            ])
            .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
            .args(["--routes", &routes.join(",")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let addr: SocketAddr = ([127, 0, 0, 1], *port).into();
        servers.push(Nats { child, dir, addr });
    }
    for s in &servers {
        assert!(
            wait_listening(s.addr, Duration::from_secs(10)),
            "nats-server did not listen on {}",
            s.addr
        );
    }
    Some(servers)
}
