//! What the client commands (`client_cmd.rs`, `subscribe.rs`) share: the
//! options every command takes, the ways a command fails, NodeId parsing,
//! and stdout lines that end quietly when stdout is closed.

use std::time::Duration;

use serde_json::Value as Json;
use uascale_client::ClientError;
use uascale_types::NodeId;

/// `println!` that ends the process quietly when stdout is closed (e.g. the
/// output is piped into `head`), instead of panicking on EPIPE.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}
pub(crate) use outln;

/// Options every client command takes.
pub(crate) struct Common {
    pub url: String,
    pub json: bool,
    pub trust_server: bool,
    pub timeout: Duration,
    pub rest: Vec<String>,
    pub named: Vec<(String, String)>,
}

impl Common {
    /// The positional arguments as NodeIds.
    pub(crate) fn nodes(&self) -> Result<Vec<NodeId>, Failure> {
        self.rest
            .iter()
            .map(|n| node(n))
            .collect::<Result<_, _>>()
            .map_err(Failure::Usage)
    }

    pub(crate) fn flag(&self, name: &str) -> Option<&str> {
        self.named
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) fn node(text: &str) -> Result<NodeId, String> {
    text.parse().map_err(|e| {
        format!("{text:?} is not a NodeId ({e}); examples: i=2258, ns=2;s=Demo.Dynamic.Counter")
    })
}

pub(crate) enum Failure {
    /// The command line is wrong.
    Usage(String),
    /// Talking to the server failed.
    Client(String),
    /// The server answered, with a Bad status for what was asked.
    Bad(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Client(e.to_string())
    }
}

/// One JSON value on one line (for streamed output).
pub(crate) fn print_json_line(v: &Json) {
    outln!("{}", serde_json::to_string(v).unwrap_or_default());
}

/// One line on stdout (ending quietly when stdout is closed).
pub(crate) fn out_line(line: &str) {
    outln!("{line}");
}
