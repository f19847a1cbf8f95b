//! The answers of the metrics and health endpoint (`[metrics] listen`,
//! docs/metrics.md), sans-IO: a request head in, a [`Response`] out. The
//! listener that reads heads and writes answers is the shell's (`net/`);
//! one request per connection.
//!
//! - `GET /metrics`: every family of [`crate::scrape`], as OpenMetrics
//!   text when the `Accept` header asks for it, else the Prometheus text
//!   format;
//! - `GET /healthz`: 200 while the process serves;
//! - `GET /kept`: the sessions keeping the most bytes for their
//!   subscriptions (the top list, which the metrics have no labels for);
//! - `GET /readyz`: 200 when [`ServerState::readiness`] says ready, else
//!   503 with the reason;
//! - 404 for any other path, 405 for any other method, 400 for a request
//!   line that is not HTTP.
//!
//! It is bounded like anything facing a network: the request head may be
//! at most [`MAX_REQUEST`] bytes and must arrive within [`IO_TIMEOUT`],
//! the answer must be taken within the same time, and at most
//! [`MAX_CONNECTIONS`] requests are served at once (further connections
//! are closed at once). The body of a request, if any, is not read.

use std::sync::Arc;
use std::time::Duration;

use crate::scrape::{render, Format};
use crate::state::ServerState;

/// Largest request head (request line and headers) read, bytes; over it
/// the answer is 431.
pub const MAX_REQUEST: usize = 8 * 1024;
/// Time a client has to send its request head (else 408), and to take the
/// answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// Where the head ends in `bytes` (after `\r\n\r\n`, or `\n\n`).
pub fn find_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Its reason phrase.
    pub reason: &'static str,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// Further header lines (`Name: value`).
    pub headers: Vec<String>,
    /// The body.
    pub body: String,
}

impl Response {
    /// A plain-text answer.
    pub fn text(status: u16, reason: &'static str, body: &str) -> Response {
        Response {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.to_owned(),
        }
    }

    /// The answer as sent: status line, headers (the connection closes
    /// after it), body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        );
        for h in &self.headers {
            out.push_str(h);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(self.body.as_bytes());
        bytes
    }
}

/// The answer to a request head (request line and headers).
pub fn respond(head: &[u8], state: &Arc<ServerState>) -> Response {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.lines();
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Response::text(400, "Bad Request", "not an HTTP request line\n");
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Response::text(400, "Bad Request", "not an HTTP/1.x request\n");
    }
    let path = target.split('?').next().unwrap_or(target);
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz" | "/kept");
    if !known {
        return Response::text(404, "Not Found", "/metrics, /healthz, /readyz, /kept\n");
    }
    if method != "GET" {
        let mut r = Response::text(405, "Method Not Allowed", "only GET\n");
        r.headers.push("Allow: GET".into());
        return r;
    }
    match path {
        "/metrics" => {
            let accept = lines.find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("accept")
                    .then(|| value.trim())
            });
            let format = Format::from_accept(accept);
            Response {
                status: 200,
                reason: "OK",
                content_type: format.content_type(),
                headers: Vec::new(),
                body: render(state, format),
            }
        }
        "/healthz" => Response::text(200, "OK", "ok\n"),
        "/kept" => Response::text(200, "OK", &kept(state)),
        _ => match state.readiness() {
            Ok(()) => Response::text(200, "OK", "ready\n"),
            Err(why) => Response::text(503, "Service Unavailable", &format!("not ready: {why}\n")),
        },
    }
}

/// Sessions listed by `/kept`.
pub const KEPT_ROWS: usize = 20;

/// The `/kept` page: the [`KEPT_ROWS`] sessions keeping the most bytes
/// for their subscriptions (queued notifications and messages kept for
/// Republish), most first, beside the budget - the top list the metrics
/// cannot carry (no per-session labels there). One line per session:
/// the session id, its monitored items, its queued and retransmission
/// bytes.
fn kept(state: &Arc<ServerState>) -> String {
    let subscriptions = &state.subscriptions;
    let budget = subscriptions.budget();
    let mut out = format!(
        "# kept bytes of all sessions {} of a budget of {} (0: none); fair share {}; {} sessions keeping anything\n",
        budget.kept(crate::quota::Stage::Queued) + budget.kept(crate::quota::Stage::Retransmission),
        budget.limit(),
        budget.fair_share(),
        budget.active_sessions(),
    );
    out.push_str("# session items queued_bytes retransmission_bytes\n");
    for row in subscriptions.top_kept(KEPT_ROWS) {
        out.push_str(&format!(
            "{} {} {} {}\n",
            row.session, row.items, row.queued_bytes, row.retransmission_bytes
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<ServerState> {
        crate::state::ServerState::empty(crate::ServerConfig::default())
    }

    #[test]
    fn paths_methods_and_readiness() {
        let s = state();
        let status = |head: &str| respond(head.as_bytes(), &s).status;
        assert_eq!(status("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
        assert_eq!(status("GET /readyz HTTP/1.1\r\n\r\n"), 503, "not listening");
        s.set_listening(true);
        assert_eq!(status("GET /readyz HTTP/1.1\r\n\r\n"), 200);
        s.set_shedding_all(true);
        let r = respond(b"GET /readyz HTTP/1.0\r\n\r\n", &s);
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "not ready: shedding every new connection\n")
        );
        s.set_shedding_all(false);
        assert_eq!(status("GET /nope HTTP/1.1\r\n\r\n"), 404);
        let r = respond(b"GET /kept HTTP/1.1\r\n\r\n", &s);
        assert_eq!(r.status, 200);
        assert!(
            r.body.starts_with("# kept bytes of all sessions 0"),
            "{}",
            r.body
        );
        assert!(r
            .body
            .contains("# session items queued_bytes retransmission_bytes\n"));
        assert_eq!(status("POST /metrics HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status("HEAD /healthz HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status("GET /metrics\r\n\r\n"), 400);
        assert_eq!(status("\u{16}\u{3}\u{1} binary\r\n\r\n"), 400);
        let r = respond(
            b"GET /metrics?x=1 HTTP/1.1\r\nACCEPT: application/openmetrics-text; version=1.0.0\r\n\r\n",
            &s,
        );
        assert_eq!(r.content_type, crate::scrape::OPENMETRICS_CONTENT_TYPE);
        assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
        let r = respond(b"GET /metrics HTTP/1.1\r\n\r\n", &s);
        assert_eq!(r.content_type, crate::scrape::PROMETHEUS_CONTENT_TYPE);
        assert!(r.body.contains("opcua_server_requests_total"), "{}", r.body);
        let bytes = String::from_utf8(Response::text(404, "Not Found", "x").to_bytes()).unwrap();
        assert!(bytes.starts_with("HTTP/1.1 404 Not Found\r\n"), "{bytes}");
        assert!(bytes.contains("Content-Length: 1\r\n"), "{bytes}");
        assert!(bytes.ends_with("\r\n\r\nx"), "{bytes}");
    }

    #[test]
    fn the_head_ends_at_the_blank_line() {
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(find_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
