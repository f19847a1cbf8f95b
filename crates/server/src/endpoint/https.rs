//! The opc.https (https-uabinary) binding without sockets: the HTTP/1.1
//! request head parsed and bounded, the HTTP answer decided as a
//! [`Reply`] either version of HTTP sends (400, 404, 405, 413, 415, 429,
//! 503), the per-client rate limits, and each request
//! routed by its authentication token to its session's logical channel and
//! handed to the same [`submit`](super::submit::submit) as an opc.tcp
//! request - the same dispatcher, request queue and isolation.
//!
//! The wire: a POST with `Content-Type: application/octet-stream` whose
//! body is the binary encoding id of the request followed by the request
//! (no ExtensionObject mask or length), answered 200 with the response or
//! a ServiceFault - a busy one (a shed, with its hint) 429 with
//! `Retry-After` ([`answer`]). The `OPCUA-SecurityPolicy` header names the policy of
//! the session signatures (absent: None). TLS carries the transport
//! security; there is no secure channel, so every CreateSession gets a
//! logical channel of its own (sessions, nonces and tokens never mix) and
//! later requests find it through their token, which is 32 random bytes
//! (a bearer credential here).
//!
//! HTTP/1.1 is parsed here by hand, not by a library: the server needs
//! one request shape (a POST with a length), every limit is the server's
//! own (head size, body size, header count), and the parser is sans-IO
//! and fuzzed like the other decoders. HTTP/2 (ALPN `h2`) is the h2
//! crate's in the shell, which turns each stream into the same [`Head`]
//! and body for [`judge`] and [`Https::request`].

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::x509::PeerCertificate;
use uascale_proto::security::ChannelSecurity;
use uascale_proto::Now;
use uascale_types::{
    BinaryDecode, DateTime, DecodeLimits, MessageSecurityMode, NodeId, Reader, ResponseHeader,
    StatusCode,
};

use super::channel::Channel;
use super::submit::{submit, Submit};
use super::Endpoint;
use crate::admission::address::{AddressBuckets, AddressVerdict};
use crate::admission::bucket::TokenBucket;
use crate::config::HttpsSection;
use crate::context::ServiceContext;
use crate::error::ServiceError;
use crate::reply::ResponseSink;
use crate::scheduler::Spawn;
use crate::session::{SessionEvent, SessionKey};
use crate::shed::{Reason, Shed, Stage};

/// The largest request head (request line and headers), bytes; over it
/// the answer is 431 and the connection closes.
pub const MAX_HEAD: usize = 16 * 1024;
/// The most header lines a request head may have.
pub const MAX_HEADERS: usize = 64;
/// The header naming the security policy of the session signatures.
pub const POLICY_HEADER: &str = "opcua-securitypolicy";
/// The content type of https-uabinary.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// The binary encoding ids whose requests are not charged to their
/// session's bucket: Publish (a session's held Publishes are bounded by
/// the subscription engine; charging them would let a session's own flood
/// of Reads starve its notifications) and CloseSession (a client shedding
/// its own load is never refused).
const UNCHARGED: [u32; 2] = [826, 473];
/// CreateSessionRequest's binary encoding id.
const CREATE_SESSION: u32 = 461;

/// The request head of one HTTP/1.1 request, as far as the binding reads
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Head {
    /// The method (`POST`, ...).
    pub method: String,
    /// The path, without a query.
    pub path: String,
    /// `Content-Type`, lowercased.
    pub content_type: Option<String>,
    /// `Content-Length`.
    pub content_length: Option<usize>,
    /// `Content-Encoding`, lowercased.
    pub content_encoding: Option<String>,
    /// Set when a `Transfer-Encoding` header came (not accepted).
    pub transfer_encoding: bool,
    /// `OPCUA-SecurityPolicy`.
    pub policy: Option<String>,
    /// The connection is to close after the answer (`Connection: close`,
    /// or HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// An HTTP answer that is not a 200 with a response: its status, reason
/// phrase, why (the body, text) and extra headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// The status code.
    pub status: u16,
    /// Why, for the text body.
    pub why: &'static str,
}

impl HttpError {
    /// An error of `status` saying `why`.
    pub const fn new(status: u16, why: &'static str) -> Self {
        HttpError { status, why }
    }

    /// The answer: a text body saying why, and a close (after an error
    /// the rest of an HTTP/1.1 connection's bytes are not trusted).
    pub fn reply(&self) -> Reply {
        Reply {
            status: self.status,
            retry_after: None,
            body: format!("{}\n", self.why).into_bytes(),
            text: true,
            close: true,
        }
    }
}

/// An HTTP answer, whichever version of HTTP carries it: HTTP/1.1 writes
/// it with [`Reply::to_http1`], HTTP/2 as a response's headers and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// `Retry-After`, whole seconds (the busy answers).
    pub retry_after: Option<u64>,
    /// The body: a response message (or ServiceFault), or for an HTTP
    /// error a line of text saying why.
    pub body: Vec<u8>,
    /// The body is text ([`Reply::content_type`] `text/plain`).
    pub text: bool,
    /// HTTP/1.1: the connection closes after this answer.
    pub close: bool,
}

impl Reply {
    /// The body's content type.
    pub fn content_type(&self) -> &'static str {
        if self.text {
            "text/plain"
        } else {
            CONTENT_TYPE
        }
    }

    /// `Allow` (a 405 says which method is served).
    pub fn allow(&self) -> Option<&'static str> {
        (self.status == 405).then_some("POST")
    }

    /// The whole HTTP/1.1 answer: status line, headers and body.
    pub fn to_http1(&self) -> Vec<u8> {
        use std::fmt::Write as _;
        let mut head = format!(
            "HTTP/1.1 {} {}\r\n",
            self.status,
            reason_phrase(self.status)
        );
        if let Some(allow) = self.allow() {
            let _ = write!(head, "Allow: {allow}\r\n");
        }
        if let Some(secs) = self.retry_after {
            let _ = write!(head, "Retry-After: {secs}\r\n");
        }
        let _ = write!(
            head,
            "Content-Type: {}\r\nContent-Length: {}\r\n{}\r\n",
            self.content_type(),
            self.body.len(),
            if self.close {
                "Connection: close\r\n"
            } else {
                ""
            }
        );
        let mut out = head.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// The reason phrase of the statuses this binding answers with.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Parses the request head at the start of `buf`: `Ok(None)` while the
/// blank line that ends it has not come (and `buf` is under
/// [`MAX_HEAD`]); else the head and its length in bytes (the body
/// follows). Never panics, whatever the bytes.
pub fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, HttpError> {
    let Some(end) = find_end(buf) else {
        if buf.len() > MAX_HEAD {
            return Err(HttpError::new(431, "request head too large"));
        }
        return Ok(None);
    };
    if end > MAX_HEAD {
        return Err(HttpError::new(431, "request head too large"));
    }
    let bad = |why| HttpError::new(400, why);
    let text = std::str::from_utf8(buf.get(..end).unwrap_or_default())
        .map_err(|_| bad("request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad("malformed method"));
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(bad("not HTTP/1.1")),
    };
    if !target.starts_with('/') {
        return Err(bad("request target is not a path"));
    }
    let mut head = Head {
        method: method.to_owned(),
        path: target.split('?').next().unwrap_or("/").to_owned(),
        close: http10,
        ..Head::default()
    };
    let mut count = 0;
    for line in lines {
        if line.is_empty() {
            continue;
        }
        count += 1;
        if count > MAX_HEADERS {
            return Err(HttpError::new(431, "too many header lines"));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad("header line without a colon"))?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(bad("malformed header name"));
        }
        let value = value.trim_matches([' ', '\t']);
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| bad("Content-Length is not a number"))?;
                if head.content_length.is_some_and(|m| m != n) {
                    return Err(bad("conflicting Content-Length headers"));
                }
                head.content_length = Some(n);
            }
            "content-type" => head.content_type = Some(value.to_ascii_lowercase()),
            "content-encoding" => head.content_encoding = Some(value.to_ascii_lowercase()),
            "transfer-encoding" => head.transfer_encoding = true,
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.split(',').any(|t| t.trim() == "close") {
                    head.close = true;
                } else if v.split(',').any(|t| t.trim() == "keep-alive") {
                    head.close = false;
                }
            }
            POLICY_HEADER => head.policy = Some(value.to_owned()),
            _ => {}
        }
    }
    Ok(Some((head, end + 4)))
}

/// The offset of the blank line (`\r\n\r\n`) ending a head, if present.
fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// What the bytes read so far on an HTTPS connection are
/// ([`next_request`]).
#[derive(Debug)]
pub enum Framed {
    /// Read more, until `buf` holds `up_to` bytes at most; `idle` is set
    /// while no byte of the next request came (the idle timeout applies
    /// then, the handshake timeout after).
    Need {
        /// The most `buf` should hold after the read.
        up_to: usize,
        /// No byte of the request yet.
        idle: bool,
    },
    /// A whole request: its head and body (taken off `buf`).
    Request(Head, Vec<u8>),
    /// Refused: answer this and close.
    Refuse(Reply),
}

/// The next request in `buf` (what a connection read and did not use
/// yet), its body bounded by `max_body`: a whole request is taken off the
/// front of `buf`, whatever follows stays.
pub fn next_request(buf: &mut Vec<u8>, max_body: usize) -> Framed {
    let (head, head_len) = match parse_head(buf) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            return Framed::Need {
                up_to: MAX_HEAD + 1,
                idle: buf.is_empty(),
            }
        }
        Err(e) => return Framed::Refuse(e.reply()),
    };
    let length = match judge(&head, max_body) {
        Ok(n) => n,
        Err(e) => return Framed::Refuse(e.reply()),
    };
    if buf.len() < head_len + length {
        return Framed::Need {
            up_to: head_len + length,
            idle: false,
        };
    }
    let rest = buf.split_off(head_len + length);
    let mut body = std::mem::replace(buf, rest);
    body.drain(..head_len);
    Framed::Request(head, body)
}

/// The [`Head`] of a request that came as an HTTP/2 stream: its method,
/// path and headers (lowercase names, as HTTP/2 has them; a value that is
/// not text as `None`), at most [`MAX_HEADERS`] of them (431 over); a
/// `Content-Length` that is not a number is 400. HTTP/2 has no
/// `Connection` or `Transfer-Encoding` (h2 refuses them), so a head of
/// this kind never asks to close and is never chunked.
pub fn head_of_stream(
    method: &str,
    path: &str,
    headers: &[(&str, Option<&str>)],
) -> Result<Head, HttpError> {
    if headers.len() > MAX_HEADERS {
        return Err(HttpError::new(431, "too many header lines"));
    }
    let mut head = Head {
        method: method.to_owned(),
        path: path.to_owned(),
        ..Head::default()
    };
    for &(name, value) in headers {
        let Some(value) = value.map(str::trim) else {
            continue;
        };
        match name {
            "content-length" => {
                let n = value
                    .parse()
                    .map_err(|_| HttpError::new(400, "Content-Length is not a number"))?;
                head.content_length = Some(n);
            }
            "content-type" => head.content_type = Some(value.to_ascii_lowercase()),
            "content-encoding" => head.content_encoding = Some(value.to_ascii_lowercase()),
            POLICY_HEADER => head.policy = Some(value.to_owned()),
            _ => {}
        }
    }
    Ok(head)
}

/// Judges a parsed head: the body length to read next, or the error to
/// answer (then close). `max_body` is `[https] max_body_size`.
pub fn judge(head: &Head, max_body: usize) -> Result<usize, HttpError> {
    if head.method != "POST" {
        return Err(HttpError::new(405, "only POST is served"));
    }
    if head.path != "/" {
        return Err(HttpError::new(404, "the endpoint's path is /"));
    }
    if head.transfer_encoding {
        return Err(HttpError::new(
            400,
            "a Transfer-Encoding is not accepted: send Content-Length",
        ));
    }
    if head
        .content_encoding
        .as_deref()
        .is_some_and(|e| e != "identity")
    {
        return Err(HttpError::new(415, "no Content-Encoding is accepted"));
    }
    let media = head
        .content_type
        .as_deref()
        .map(|t| t.split(';').next().unwrap_or("").trim());
    if media != Some(CONTENT_TYPE) {
        return Err(HttpError::new(
            415,
            "Content-Type must be application/octet-stream",
        ));
    }
    let length = head
        .content_length
        .ok_or(HttpError::new(400, "Content-Length is required"))?;
    if length > max_body {
        return Err(HttpError::new(413, "request body over https.max_body_size"));
    }
    if length == 0 {
        return Err(HttpError::new(400, "empty request body"));
    }
    Ok(length)
}

/// A 200 answer carrying `message` (a response or a ServiceFault).
pub fn ok(message: Vec<u8>, close: bool) -> Reply {
    Reply {
        status: 200,
        retry_after: None,
        body: message,
        text: false,
        close,
    }
}

/// A busy answer for `shed`: 429 (a client over its own limit) or 503
/// (the server shutting down), `Retry-After` in whole seconds rounded up,
/// and the ServiceFault `BadServerTooBusy` with the `RetryAfterMs` hint as
/// its body, answering `request_handle` at `now`.
pub fn busy(shed: Shed, status: u16, request_handle: u32, now: DateTime) -> Reply {
    let fault = ServiceError::shed(shed).to_fault(now, request_handle);
    let mut body = Vec::with_capacity(96);
    uascale_types::encode_message(&fault, &mut body);
    Reply {
        status,
        retry_after: Some(retry_after_secs(shed.retry_after)),
        body,
        text: false,
        close: false,
    }
}

/// The HTTP answer carrying `message`, a response or a ServiceFault: a
/// busy ServiceFault - a server-wide stage's shed (the request queue's,
/// session establishment's, the session count's), `BadServerTooBusy` or
/// `BadTooManySessions` with its `RetryAfterMs` hint - is a 429 with
/// `Retry-After` (the hint in whole seconds, rounded up) and the fault as
/// its body, as the binding's own buckets answer; anything else is a 200.
/// Only a ServiceFault's header is decoded, and only its.
pub fn answer(message: Vec<u8>, close: bool) -> Reply {
    match busy_hint(&message) {
        Some(hint) => Reply {
            status: 429,
            retry_after: Some(retry_after_secs(hint)),
            body: message,
            text: false,
            close,
        },
        None => ok(message, close),
    }
}

/// The `RetryAfterMs` hint of `message` when it is a busy ServiceFault
/// (`BadServerTooBusy` or `BadTooManySessions` with a hint).
fn busy_hint(message: &[u8]) -> Option<Duration> {
    const SERVICE_FAULT: u32 = uascale_types::ids::object::ServiceFault_Encoding_DefaultBinary;
    let limits = DecodeLimits::default();
    let mut r = Reader::new(message, &limits).ok()?;
    if NodeId::decode(&mut r).ok()?.as_ns0() != Some(SERVICE_FAULT) {
        return None;
    }
    let header = ResponseHeader::decode(&mut r).ok()?;
    if header.service_result != StatusCode::BadServerTooBusy
        && header.service_result != StatusCode::BadTooManySessions
    {
        return None;
    }
    crate::error::retry_after_of(&header)
}

/// `Retry-After` for a hint: whole seconds, rounded up, at least 1 (HTTP
/// has no finer unit; 0 would invite an immediate retry).
pub fn retry_after_secs(hint: Duration) -> u64 {
    let s = hint.as_nanos().div_ceil(1_000_000_000);
    u64::try_from(s).unwrap_or(u64::MAX).max(1)
}

/// What a request body starts with: its encoding id, authentication token
/// and request handle (read without decoding the rest).
#[derive(Debug, Clone, PartialEq)]
pub struct Peek {
    /// The ns0 binary encoding id (0 for another namespace).
    pub type_id: u32,
    /// `RequestHeader.authenticationToken`.
    pub token: NodeId,
    /// `RequestHeader.requestHandle`.
    pub request_handle: u32,
}

/// Reads the start of a request body; `None` when it is not even that.
pub fn peek(body: &[u8], limits: &DecodeLimits) -> Option<Peek> {
    let mut r = Reader::new(body, limits).ok()?;
    let id = NodeId::decode(&mut r).ok()?;
    let token = NodeId::decode(&mut r).ok()?;
    DateTime::decode(&mut r).ok()?;
    let request_handle = u32::decode(&mut r).ok()?;
    Some(Peek {
        type_id: id.as_ns0().unwrap_or(0),
        token,
        request_handle,
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The request buckets of sessions, bounded: when the table passes its
/// size, the buckets that are full again are forgotten (a new one starts
/// full, so that changes nothing).
#[derive(Debug)]
struct SessionBuckets {
    rate: u32,
    burst: u32,
    /// Swept when the table reaches it; then twice what the sweep left.
    sweep_at: usize,
    entries: crate::fxhash::FxHashMap<SessionKey, TokenBucket>,
}

impl SessionBuckets {
    fn try_take(&mut self, key: SessionKey, now: Instant) -> Result<(), Duration> {
        if self.entries.len() >= self.sweep_at {
            let burst = f64::from(self.burst);
            self.entries.retain(|_, b| b.tokens(now) < burst);
            self.sweep_at = (self.entries.len() * 2).max(1024);
        }
        let (rate, burst) = (self.rate, self.burst);
        self.entries
            .entry(key)
            .or_insert_with(|| TokenBucket::new(rate, burst))
            .try_take(now)
    }
}

/// The HTTPS side of the [`Endpoint`]: its connection count, the
/// per-client buckets and the request ids of the logical channels.
#[derive(Debug)]
pub struct Https {
    endpoint: Arc<Endpoint>,
    config: HttpsSection,
    connections: AtomicUsize,
    /// Request ids, unique over every HTTPS request (several HTTP
    /// connections may serve one session's logical channel at once).
    next_request_id: AtomicU32,
    sessions: Mutex<SessionBuckets>,
    addresses: Mutex<AddressBuckets>,
    /// What the session services see of the logical channels whose
    /// CreateSession named a secured policy (the client certificate
    /// validated then), until their session ends.
    secured: Mutex<crate::fxhash::FxHashMap<u32, ChannelSecurity>>,
}

/// An admitted HTTPS connection: counted until dropped.
#[derive(Debug)]
pub struct HttpsConnection {
    https: Arc<Https>,
    /// The client's address.
    pub peer: SocketAddr,
    /// The local address it arrived on.
    pub local: Option<IpAddr>,
}

impl Drop for HttpsConnection {
    fn drop(&mut self) {
        self.https.connections.fetch_sub(1, Ordering::AcqRel);
        self.https.endpoint.state.metrics.connection_closed();
    }
}

/// What became of a request.
pub enum Outcome {
    /// The answer, to send now.
    Respond(Reply),
    /// The answer comes through `channel`: await [`Channel::poll_ready`]
    /// (running `task` on the runtime, if any), then
    /// [`Https::answered`]; if the connection goes first,
    /// [`Https::abandon`].
    Wait {
        /// The request's channel record.
        channel: Arc<Channel>,
        /// A task to run that produces the answer.
        task: Option<Spawn>,
    },
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Respond(r) => {
                write!(f, "Outcome::Respond({}, {} bytes)", r.status, r.body.len())
            }
            Outcome::Wait { task, .. } => write!(f, "Outcome::Wait(task: {})", task.is_some()),
        }
    }
}

impl Https {
    /// The HTTPS side of `endpoint`, with its `[https]` limits.
    pub fn new(endpoint: Arc<Endpoint>) -> Arc<Self> {
        let config = endpoint.state.config.https.clone();
        let addresses = AddressBuckets::new(
            config.address_rate,
            config.address_burst,
            crate::admission::address::DEFAULT_ADDRESS_TABLE_CAPACITY,
        );
        let https = Arc::new(Https {
            secured: Mutex::default(),
            sessions: Mutex::new(SessionBuckets {
                rate: config.session_rate,
                burst: config.session_burst,
                sweep_at: 1024,
                entries: Default::default(),
            }),
            addresses: Mutex::new(addresses),
            endpoint,
            config,
            connections: AtomicUsize::new(0),
            next_request_id: AtomicU32::new(1),
        });
        let weak = Arc::downgrade(&https);
        https
            .endpoint
            .state
            .sessions
            .listen(Arc::new(move |event: &SessionEvent| {
                let channel_id = match event {
                    SessionEvent::Closed { channel_id, .. }
                    | SessionEvent::TimedOut { channel_id, .. } => *channel_id,
                    _ => return,
                };
                if let Some(h) = weak.upgrade() {
                    lock(&h.secured).remove(&channel_id);
                }
            }));
        https
    }

    /// The `[https]` section.
    pub fn config(&self) -> &HttpsSection {
        &self.config
    }

    /// HTTPS connections open now.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// A new connection from `peer` on `local` at `now`: admitted under
    /// `max_connections` and by admission's accept stage (the connection
    /// rate buckets and the open-files headroom that opc.tcp connections
    /// share: a TLS handshake costs like an OpenSecureChannel), else the
    /// [`Shed`] (counted) - the shell closes it at once, before any TLS
    /// work. Counted in the connection metrics like an opc.tcp one.
    pub fn accept(
        self: &Arc<Self>,
        peer: SocketAddr,
        local: Option<IpAddr>,
        now: Instant,
    ) -> Result<HttpsConnection, Shed> {
        let metrics = &self.endpoint.state.metrics;
        metrics.connection_accepted();
        let refused = |shed: Shed| {
            metrics.shed(&shed);
            metrics.connection_closed();
            Err(shed)
        };
        let open = self.connections.fetch_add(1, Ordering::AcqRel);
        if open >= self.config.max_connections {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            let shed = Shed::new(
                Stage::Https,
                Reason::ConnectionLimit,
                Duration::from_secs(1),
            );
            return refused(shed);
        }
        let all = open + 1 + self.endpoint.connection_count();
        if let crate::admission::Decision::Refuse {
            retry_after, by, ..
        } =
            self.endpoint
                .state
                .admission
                .on_accept(peer, now, all, self.endpoint.open_files_soft)
        {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            let reason = match by {
                crate::admission::AcceptCheck::OpenFiles => Reason::OpenFiles,
                crate::admission::AcceptCheck::AddressRate => Reason::AddressRate,
                crate::admission::AcceptCheck::Rate => Reason::Rate,
            };
            return refused(Shed::new(Stage::Accept, reason, retry_after));
        }
        Ok(HttpsConnection {
            https: Arc::clone(self),
            peer,
            local,
        })
    }

    /// `conn` closed at `now` (admission's close rate feeds its hints).
    pub fn closed(&self, conn: HttpsConnection, now: Instant) {
        self.endpoint.state.admission.connection_closed(now);
        drop(conn);
    }

    /// Serves one request - its `head` already [`judge`]d, its whole
    /// `body` read - that came on `conn` at `now`: rate-limited by its
    /// owner (its session, else its source address), then submitted on
    /// its session's logical channel (a new one for CreateSession and the
    /// session-less services).
    pub fn request(&self, conn: &HttpsConnection, head: &Head, body: &[u8], now: Now) -> Outcome {
        let state = &self.endpoint.state;
        if self.endpoint.stopping.load(Ordering::Acquire) {
            return Outcome::Respond(self.shutting_down(now.utc));
        }
        let policy = match header_policy(head.policy.as_deref()) {
            Ok(p) => p,
            Err(e) => return Outcome::Respond(e.reply()),
        };
        let Some(peek) = peek(body, &state.channel_config.decode) else {
            return Outcome::Respond(
                HttpError::new(400, "the body is not an encoding id and a request").reply(),
            );
        };
        // The owner: the session the token names, else the address.
        let session = if peek.token.is_null() {
            None
        } else {
            let key = SessionKey::of(&peek.token);
            state
                .sessions
                .with_key(&key, |s| s.channel_id)
                .ok()
                .map(|channel_id| (key, channel_id))
        };
        let charged = match &session {
            Some(_) if UNCHARGED.contains(&peek.type_id) => Ok(()),
            Some((key, _)) => lock(&self.sessions)
                .try_take(key.clone(), now.instant)
                .map_err(|wait| Shed::new(Stage::Https, Reason::SessionRate, wait)),
            // The address's bucket applies while session establishment is
            // contended, as the connection buckets' per-address share: a
            // host connecting alone goes at the establishment stage's pace.
            None if !state.admission.establishment().is_contended() => Ok(()),
            None => match lock(&self.addresses).try_take(conn.peer.ip(), now.instant) {
                AddressVerdict::Admit => Ok(()),
                AddressVerdict::Refuse { wait, .. } => {
                    Err(Shed::new(Stage::Https, Reason::AddressRate, wait))
                }
            },
        };
        if let Err(mut shed) = charged {
            // An empty bucket of rate 0 would say "never": the config
            // keeps rates at least 1, this keeps the header finite anyway.
            shed.retry_after = shed.retry_after.min(Duration::from_secs(3600));
            state.metrics.shed(&shed);
            return Outcome::Respond(busy(shed, 429, peek.request_handle, now.utc));
        }
        let sessionless = session.is_none();
        let (channel_id, security) = match session {
            // The security its CreateSession set up (None if none).
            Some((_, id)) => (
                id,
                lock(&self.secured)
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(ChannelSecurity::none),
            ),
            // CreateSession and the session-less services: a logical
            // channel of their own (a session created on it stays there).
            None => {
                let id = self
                    .endpoint
                    .next_channel_id
                    .fetch_add(1, Ordering::Relaxed)
                    .max(1);
                if peek.type_id != CREATE_SESSION {
                    (id, ChannelSecurity::none())
                } else {
                    match self.establishing(policy, body, now.utc) {
                        Ok(security) => {
                            if !policy.is_none() {
                                lock(&self.secured).insert(id, security.clone());
                            }
                            (id, security)
                        }
                        Err(status) => {
                            let fault = crate::dispatch::encoded_fault(
                                now.utc,
                                peek.request_handle,
                                status,
                            );
                            return Outcome::Respond(ok(fault, head.close));
                        }
                    }
                }
            }
        };
        let channel = Arc::new(Channel::new(channel_id, Some(conn.peer.ip()), conn.local));
        let mut ctx = ServiceContext::new(
            Arc::clone(state),
            channel_id,
            security,
            now,
            Some(Arc::clone(&channel) as Arc<dyn ResponseSink>),
        );
        ctx.local_ip = conn.local;
        ctx.peer_ip = Some(conn.peer.ip());
        // Its logical channel lives for this request only: without a
        // session it waits in the request queue as its address.
        ctx.owned_by_address = sessionless;
        ctx.request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed).max(1);
        match submit(&mut ctx, &channel, body) {
            Submit::Answer(message) => Outcome::Respond(answer(message, head.close)),
            Submit::Spawn(task) => Outcome::Wait {
                channel,
                task: Some(task),
            },
            Submit::Queued | Submit::Parked => Outcome::Wait {
                channel,
                task: None,
            },
        }
    }

    /// The security a CreateSession under `policy` (its
    /// `OPCUA-SecurityPolicy`) is served with: the policy must be
    /// published; a secured one (RSA: the ECC policies need a channel's
    /// key agreement) takes the request's ClientCertificate, validated
    /// against the PKI at `now`, as the channel's remote certificate - what
    /// the session services check the signatures with - in mode Sign.
    fn establishing(
        &self,
        policy: SecurityPolicy,
        body: &[u8],
        now: DateTime,
    ) -> Result<ChannelSecurity, StatusCode> {
        let state = &self.endpoint.state;
        if !state.security.endpoints.iter().any(|(p, _)| *p == policy) || policy.is_ecc() {
            return Err(StatusCode::BadSecurityPolicyRejected);
        }
        if policy.is_none() {
            return Ok(ChannelSecurity::none());
        }
        let decoded = crate::dispatch::Request::decode(body, &state.channel_config.decode)
            .map_err(|e| e.status_code())?;
        let crate::dispatch::Request::CreateSession(req) = decoded else {
            return Err(StatusCode::BadDecodingError);
        };
        let pki = state
            .security
            .pki
            .as_ref()
            .ok_or(StatusCode::BadSecurityPolicyRejected)?;
        let cert = pki
            .validate_client(
                req.client_certificate.as_bytes_or_empty(),
                Some(policy),
                Some(req.client_description.application_uri.as_str_or_empty()),
                now.to_system_time(),
            )
            .map_err(|e| e.status_code())?;
        Ok(ChannelSecurity {
            policy,
            mode: MessageSecurityMode::Sign,
            remote_certificate: Some(Arc::new(PeerCertificate::new(&cert, None))),
            channel_thumbprint: None,
        })
    }

    /// The HTTP answer once `channel` is ready: the request's response
    /// ([`answer`]: 429 for a busy ServiceFault), or 503 when the server
    /// closes it (shutdown, counted as a shed). `None`: nothing yet.
    pub fn answered(&self, channel: &Channel, close: bool, now: DateTime) -> Option<Reply> {
        let (mut answers, closing) = channel.take();
        if let Some((_, message)) = answers.pop() {
            return Some(answer(message, close));
        }
        closing.map(|_| self.shutting_down(now))
    }

    /// The 503 of a request the server will not serve because it shuts
    /// down, counted at stage `https` with reason `shutting_down`.
    fn shutting_down(&self, now: DateTime) -> Reply {
        let shed = Shed::new(Stage::Https, Reason::ShuttingDown, Duration::from_secs(1));
        self.endpoint.state.metrics.shed(&shed);
        busy(shed, 503, 0, now)
    }

    /// The connection went away before its request was answered: the
    /// request leaves the queue (or is aborted), a held Publish's answer
    /// is refused.
    pub fn abandon(&self, channel: &Channel) {
        channel.close(&self.endpoint.state.scheduler);
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }
}

/// The policy an `OPCUA-SecurityPolicy` header names: None when absent;
/// an unknown URI is 400.
fn header_policy(policy: Option<&str>) -> Result<SecurityPolicy, HttpError> {
    match policy {
        None => Ok(SecurityPolicy::None),
        Some(uri) => {
            SecurityPolicy::from_uri(uri).ok_or(HttpError::new(400, "unknown OPCUA-SecurityPolicy"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<(Head, usize)>, HttpError> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn a_request_head_is_parsed_and_judged() {
        let text = "POST /?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/octet-stream\r\nContent-Length: 12\r\nOPCUA-SecurityPolicy: http://opcfoundation.org/UA/SecurityPolicy#None\r\n\r\nBODY";
        let (h, len) = head(text).expect("valid").expect("complete");
        assert_eq!(len, text.len() - 4);
        assert_eq!(h.path, "/");
        assert_eq!(h.content_length, Some(12));
        assert!(!h.close);
        assert_eq!(
            h.policy.as_deref(),
            Some("http://opcfoundation.org/UA/SecurityPolicy#None")
        );
        assert_eq!(judge(&h, 100), Ok(12));
        assert_eq!(judge(&h, 11).map_err(|e| e.status), Err(413));
        // Incomplete: wait for more.
        assert_eq!(head("POST / HTTP/1.1\r\nHost: a\r\n"), Ok(None));
    }

    /// Requests are framed off the front of what was read, whatever the
    /// pieces: more is asked for (idle only before a request's first byte)
    /// until head and body are whole, a pipelined request stays for the
    /// next call, a bad head is refused with its answer.
    #[test]
    fn requests_are_framed_off_the_bytes_read() {
        let one = "POST / HTTP/1.1\r\nContent-Type: application/octet-stream\r\nContent-Length: 3\r\n\r\nabc";
        let mut buf = Vec::new();
        assert!(matches!(
            next_request(&mut buf, 100),
            Framed::Need { up_to, idle: true } if up_to == MAX_HEAD + 1
        ));
        let head_len = one.len() - 3;
        buf.extend_from_slice(&one.as_bytes()[..head_len + 1]);
        assert!(matches!(
            next_request(&mut buf, 100),
            Framed::Need { up_to, idle: false } if up_to == one.len()
        ));
        buf.extend_from_slice(&one.as_bytes()[head_len + 1..]);
        buf.extend_from_slice(one.as_bytes());
        for _ in 0..2 {
            match next_request(&mut buf, 100) {
                Framed::Request(head, body) => {
                    assert_eq!(head.content_length, Some(3));
                    assert_eq!(body, b"abc");
                }
                other => panic!("not a request: {other:?}"),
            }
        }
        assert!(buf.is_empty());
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        match next_request(&mut buf, 100) {
            Framed::Refuse(r) => assert!(r.to_http1().starts_with(b"HTTP/1.1 405")),
            other => panic!("not refused: {other:?}"),
        }
        // Over the body bound: 413 before the body is read.
        let mut big = one.replace("Length: 3", "Length: 101").into_bytes();
        big.truncate(head_len + 2);
        assert!(matches!(next_request(&mut big, 100), Framed::Refuse(r) if r.status == 413));
    }

    #[test]
    fn each_error_has_its_status() {
        let status = |t: &str| match head(t) {
            Err(e) => e.status,
            Ok(Some((h, _))) => judge(&h, 1000).err().map_or(200, |e| e.status),
            Ok(None) => 0,
        };
        let ct = "Content-Type: application/octet-stream\r\n";
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(
            status(&format!(
                "POST /x HTTP/1.1\r\n{ct}Content-Length: 1\r\n\r\n"
            )),
            404
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\n"),
            415
        );
        assert_eq!(
            status(&format!(
                "POST / HTTP/1.1\r\n{ct}Content-Encoding: gzip\r\nContent-Length: 1\r\n\r\n"
            )),
            415
        );
        assert_eq!(status(&format!("POST / HTTP/1.1\r\n{ct}\r\n")), 400);
        assert_eq!(
            status(&format!(
                "POST / HTTP/1.1\r\n{ct}Transfer-Encoding: chunked\r\n\r\n"
            )),
            400
        );
        assert_eq!(
            status(&format!(
                "POST / HTTP/1.1\r\n{ct}Content-Length: 2000\r\n\r\n"
            )),
            413
        );
        assert_eq!(status("POST / HTTP/2\r\n\r\n"), 400);
        assert_eq!(status("POST\r\n\r\n"), 400);
        assert_eq!(
            status(&format!("POST / HTTP/1.1\r\n{ct}Content-Length: x\r\n\r\n")),
            400
        );
        assert_eq!(status("POST / HTTP/1.1\r\nbad header\r\n\r\n"), 400);
        let big = format!("POST / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(status(&big), 431);
        assert_eq!(
            status(&format!(
                "POST / HTTP/1.1\r\n{ct}Content-Length: 5\r\nConnection: close\r\n\r\n"
            )),
            200
        );
    }

    #[test]
    fn an_http2_head_is_read_like_an_http1_one() {
        let h = head_of_stream(
            "POST",
            "/",
            &[
                ("content-type", Some("Application/Octet-Stream")),
                ("content-length", Some("12")),
                (
                    "opcua-securitypolicy",
                    Some("http://opcfoundation.org/UA/SecurityPolicy#None"),
                ),
                ("x-binary", None),
            ],
        )
        .expect("a head");
        assert_eq!(h.content_type.as_deref(), Some(CONTENT_TYPE));
        assert_eq!(h.content_length, Some(12));
        assert!(h.policy.is_some() && !h.close && !h.transfer_encoding);
        assert_eq!(judge(&h, 100), Ok(12));
        let bad = head_of_stream("POST", "/", &[("content-length", Some("x"))]);
        assert_eq!(bad.map_err(|e| e.status), Err(400));
        let many: Vec<(&str, Option<&str>)> = (0..=MAX_HEADERS).map(|_| ("x", Some("y"))).collect();
        let over = head_of_stream("POST", "/", &many);
        assert_eq!(over.map_err(|e| e.status), Err(431));
        let get = head_of_stream("GET", "/", &[]).expect("a head");
        assert_eq!(judge(&get, 100).map_err(|e| e.status), Err(405));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        let b = busy(
            Shed::new(
                Stage::Https,
                Reason::SessionRate,
                Duration::from_millis(1500),
            ),
            429,
            7,
            DateTime::default(),
        )
        .to_http1();
        let text = String::from_utf8_lossy(&b);
        assert!(
            text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nRetry-After: 2\r\n"), "{text}");
    }

    /// The decisions on simulated time, without sockets: each
    /// CreateSession on a logical channel of its own, later requests
    /// routed by token to it, session-less requests charged to their
    /// address while establishment is contended (429 once its bucket is
    /// empty, another address untouched),
    /// a full connection table refusing at accept, all counted at stage
    /// `https`.
    #[test]
    fn requests_are_routed_by_token_and_limited_per_client() {
        use uascale_types::{
            encode_message, CreateSessionRequest, GetEndpointsRequest, RequestHeader,
        };
        let mut config = crate::config::ServerConfig {
            security: crate::config::SecurityConfig::none_only(),
            ..Default::default()
        };
        config.https.address_rate = 1;
        config.https.address_burst = 3;
        config.https.max_connections = 2;
        // Two sessions created and not activated take half the places.
        config.admission.max_concurrent_session_establishment = Some(4);
        let state = crate::state::ServerState::new(config).expect("state");
        let https = Https::new(Endpoint::new(state, None));
        let at = Now {
            instant: Instant::now(),
            utc: DateTime::from_ticks(1),
        };
        let peer = |host: u8| SocketAddr::from(([127, 0, 0, host], 40_000));
        let a = https.accept(peer(1), None, at.instant).expect("admitted");
        let b = https.accept(peer(2), None, at.instant).expect("admitted");
        let refused = https
            .accept(peer(3), None, at.instant)
            .expect_err("over max_connections");
        assert_eq!(refused.reason, Reason::ConnectionLimit);
        let head = Head {
            method: "POST".into(),
            path: "/".into(),
            ..Head::default()
        };
        let body = |m: &dyn uascale_types::DynStructure| {
            let mut out = Vec::new();
            encode_message(m, &mut out);
            out
        };
        let answer = |o: Outcome| match o {
            Outcome::Respond(reply) => reply.to_http1(),
            other => panic!("answered later: {other:?}"),
        };
        let create = |token: &NodeId| {
            body(&CreateSessionRequest {
                request_header: RequestHeader {
                    authentication_token: token.clone(),
                    ..Default::default()
                },
                requested_session_timeout: 60_000.0,
                ..Default::default()
            })
        };
        // While session establishment is not contended the address's
        // bucket is not charged: a host connecting alone is not slowed.
        let endpoints = body(&GetEndpointsRequest::default());
        for _ in 0..10 {
            let fine = answer(https.request(&a, &head, &endpoints, at));
            assert!(fine.starts_with(b"HTTP/1.1 200 OK\r\n"));
        }
        // Two CreateSessions from one address: two sessions on two
        // logical channels.
        let first = answer(https.request(&a, &head, &create(&NodeId::NULL), at));
        let second = answer(https.request(&a, &head, &create(&NodeId::NULL), at));
        assert!(first.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert!(second.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert_eq!(https.endpoint.state.sessions.len(), 2);
        let channel_of = |http: &[u8]| {
            let at = find_end(http).expect("a head") + 4;
            let limits = DecodeLimits::default();
            let mut r = Reader::new(http.get(at..).unwrap_or_default(), &limits).expect("body");
            let m = uascale_types::decode_message(&mut r).expect("a response");
            let created = m
                .into_any()
                .downcast::<uascale_types::CreateSessionResponse>()
                .expect("CreateSessionResponse");
            https
                .endpoint
                .state
                .sessions
                .with_key(&SessionKey::of(&created.authentication_token), |s| {
                    s.channel_id
                })
                .expect("the session")
        };
        assert_ne!(
            channel_of(&first),
            channel_of(&second),
            "one logical channel each"
        );
        // Now establishment is contended: the address's third
        // session-less request empties its bucket, the fourth is 429 with
        // Retry-After and a ServiceFault.
        for _ in 0..3 {
            let fine = answer(https.request(&a, &head, &endpoints, at));
            assert!(fine.starts_with(b"HTTP/1.1 200 OK\r\n"));
        }
        let busy = answer(https.request(&a, &head, &endpoints, at));
        let text = String::from_utf8_lossy(&busy);
        assert!(text.starts_with("HTTP/1.1 429 "), "{text}");
        assert!(text.contains("\r\nRetry-After: 1\r\n"), "{text}");
        // Another address has its own bucket.
        let other = answer(https.request(&b, &head, &endpoints, at));
        assert!(other.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert_eq!(
            https
                .endpoint
                .state
                .metrics
                .shed_count(Stage::Https, Reason::AddressRate),
            1
        );
        assert_eq!(
            https
                .endpoint
                .state
                .metrics
                .shed_count(Stage::Https, Reason::ConnectionLimit),
            1
        );
        // A body that is not a request: 400.
        let bad = answer(https.request(&b, &head, b"\xff", at));
        assert!(bad.starts_with(b"HTTP/1.1 400 "));
        https.closed(a, at.instant);
        https.closed(b, at.instant);
        assert_eq!(https.connection_count(), 0);
        assert_eq!(https.endpoint.state.metrics.connections_open(), 0);
    }

    /// An HTTPS endpoint of `config` (SecurityPolicy None only), the
    /// clock reading its requests arrive at, and the head of a POST.
    fn https_of(edit: impl FnOnce(&mut crate::config::ServerConfig)) -> (Arc<Https>, Now, Head) {
        let mut config = crate::config::ServerConfig {
            security: crate::config::SecurityConfig::none_only(),
            ..Default::default()
        };
        edit(&mut config);
        let state = crate::state::ServerState::new(config).expect("state");
        let at = Now {
            instant: Instant::now(),
            utc: DateTime::from_ticks(1),
        };
        let head = Head {
            method: "POST".into(),
            path: "/".into(),
            ..Head::default()
        };
        (Https::new(Endpoint::new(state, None)), at, head)
    }

    fn encoded(m: &dyn uascale_types::DynStructure) -> Vec<u8> {
        let mut out = Vec::new();
        uascale_types::encode_message(m, &mut out);
        out
    }

    fn peer(host: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, host], 40_000))
    }

    fn respond(o: Outcome) -> Reply {
        match o {
            Outcome::Respond(reply) => reply,
            other => panic!("answered later: {other:?}"),
        }
    }

    fn decoded(body: &[u8]) -> Box<dyn uascale_types::DynStructure> {
        let limits = DecodeLimits::default();
        let mut r = Reader::new(body, &limits).expect("a body");
        uascale_types::decode_message(&mut r).expect("a message")
    }

    /// A busy answer's status, `Retry-After` and its fault's status and
    /// hint; the hint in whole seconds, rounded up, is the `Retry-After`.
    fn busy_of(reply: &Reply) -> (u16, StatusCode) {
        let m = decoded(&reply.body);
        let fault = m
            .as_any()
            .downcast_ref::<uascale_types::ServiceFault>()
            .expect("a ServiceFault body");
        let hint = crate::error::retry_after_of(&fault.response_header).expect("a hint");
        assert_eq!(reply.retry_after, Some(retry_after_secs(hint)), "{hint:?}");
        let text = String::from_utf8_lossy(&reply.to_http1()).into_owned();
        assert!(text.contains("\r\nRetry-After: "), "{text}");
        (reply.status, fault.response_header.service_result)
    }

    /// A session created and activated over `conn`: its token.
    fn session(https: &Https, conn: &HttpsConnection, head: &Head, at: Now) -> NodeId {
        use uascale_types::{
            ActivateSessionRequest, AnonymousIdentityToken, CreateSessionRequest,
            CreateSessionResponse, ExtensionObject, RequestHeader, UaString,
        };
        let create = encoded(&CreateSessionRequest {
            requested_session_timeout: 60_000.0,
            ..Default::default()
        });
        let created = decoded(&respond(https.request(conn, head, &create, at)).body);
        let token = created
            .as_any()
            .downcast_ref::<CreateSessionResponse>()
            .expect("CreateSessionResponse")
            .authentication_token
            .clone();
        let activate = encoded(&ActivateSessionRequest {
            request_header: RequestHeader {
                authentication_token: token.clone(),
                ..Default::default()
            },
            user_identity_token: ExtensionObject::new(AnonymousIdentityToken {
                policy_id: UaString::from("anonymous"),
            }),
            ..Default::default()
        });
        let activated = decoded(&respond(https.request(conn, head, &activate, at)).body);
        assert!(
            activated
                .as_any()
                .downcast_ref::<uascale_types::ActivateSessionResponse>()
                .is_some(),
            "activated"
        );
        token
    }

    /// Session-less requests (each on a logical channel of its own) wait
    /// in the request queue as their source address: one address's third
    /// GetEndpoints is over `max_queued_requests_per_owner` (2) while
    /// another address's is queued - with an owner per logical channel
    /// none would ever be. The request queue's shed is a 429 with
    /// `Retry-After` and the ServiceFault with its hint.
    #[test]
    fn a_sessionless_request_waits_as_its_address_and_a_queue_shed_is_429() {
        use uascale_types::{GetEndpointsRequest, ReadRequest, ReadValueId, RequestHeader};
        let (https, at, head) = https_of(|c| {
            c.requests.min_request_thread_count = 2;
            c.requests.max_request_thread_count = 2;
            c.requests.max_queued_requests_per_owner = 2;
            // The demo's slow folder answers after an hour: its Reads
            // hold their worker until the test drops their task.
            c.demo.slow = Duration::from_secs(3600);
        });
        let a = https.accept(peer(1), None, at.instant).expect("admitted");
        let b = https.accept(peer(2), None, at.instant).expect("admitted");
        let token = session(&https, &a, &head, at);
        // Two slow Reads take both workers, a third waits for one.
        let mut held = Vec::new();
        for i in 0..3 {
            let read = encoded(&ReadRequest {
                request_header: RequestHeader {
                    authentication_token: token.clone(),
                    request_handle: i + 1,
                    ..Default::default()
                },
                nodes_to_read: Some(vec![ReadValueId {
                    node_id: NodeId::string(2, format!("Demo.Slow.{i}")),
                    attribute_id: uascale_types::AttributeId::Value as u32,
                    ..Default::default()
                }]),
                ..Default::default()
            });
            match https.request(&a, &head, &read, at) {
                Outcome::Wait { channel, task } => held.push((channel, task)),
                other => panic!("a slow Read became {other:?}"),
            }
        }
        let scheduler = &https.endpoint.state.scheduler;
        assert_eq!((scheduler.busy(), scheduler.waiting()), (2, 1));
        let endpoints = encoded(&GetEndpointsRequest::default());
        for _ in 0..2 {
            let waits = https.request(&a, &head, &endpoints, at);
            assert!(
                matches!(waits, Outcome::Wait { task: None, .. }),
                "{waits:?}"
            );
        }
        let shed = respond(https.request(&a, &head, &endpoints, at));
        assert_eq!(busy_of(&shed), (429, StatusCode::BadServerTooBusy));
        let metrics = &https.endpoint.state.metrics;
        assert_eq!(metrics.shed_count(Stage::Queue, Reason::OwnerLimit), 1);
        let other = https.request(&b, &head, &endpoints, at);
        assert!(matches!(other, Outcome::Wait { .. }), "{other:?}");
        assert_eq!(scheduler.waiting(), 4);
        drop(held);
    }

    /// Session establishment's shed (every place taken, no waiting room)
    /// and the session count's (`BadTooManySessions`, its fixed hint) are
    /// 429s with `Retry-After` too, the ServiceFault as the body.
    #[test]
    fn establishment_sheds_are_429_with_retry_after() {
        use uascale_types::CreateSessionRequest;
        let create = encoded(&CreateSessionRequest {
            requested_session_timeout: 60_000.0,
            ..Default::default()
        });
        // One place: a session created and not activated holds it.
        let (https, at, head) = https_of(|c| {
            c.admission.max_concurrent_session_establishment = Some(1);
            c.admission.session_establishment_queue_limit = 0;
            c.admission.establishment_wait_ms = 0;
        });
        let a = https.accept(peer(1), None, at.instant).expect("admitted");
        assert_eq!(respond(https.request(&a, &head, &create, at)).status, 200);
        let refused = respond(https.request(&a, &head, &create, at));
        assert_eq!(busy_of(&refused), (429, StatusCode::BadServerTooBusy));
        let metrics = &https.endpoint.state.metrics;
        assert_eq!(
            metrics.shed_count(Stage::Establishment, Reason::EstablishmentLimit),
            1
        );

        // One session at most: the second CreateSession is over it.
        let (https, at, head) = https_of(|c| c.server.max_session_count = 1);
        let a = https.accept(peer(1), None, at.instant).expect("admitted");
        session(&https, &a, &head, at);
        let refused = respond(https.request(&a, &head, &create, at));
        assert_eq!(busy_of(&refused), (429, StatusCode::BadTooManySessions));
        assert_eq!(refused.retry_after, Some(1));
    }

    /// A ServiceFault that is not a busy answer, and a response, stay 200s.
    #[test]
    fn only_a_busy_fault_is_429() {
        let fault = |status: StatusCode, hint: bool| {
            let mut f = crate::error::ServiceError::client(status).to_fault(DateTime::default(), 1);
            if hint {
                f.response_header.additional_header =
                    crate::error::retry_after_header(Duration::from_millis(2500));
            }
            encoded(&f)
        };
        let busy = answer(fault(StatusCode::BadServerTooBusy, true), false);
        assert_eq!((busy.status, busy.retry_after), (429, Some(3)));
        assert_eq!(
            answer(fault(StatusCode::BadServerTooBusy, false), false).status,
            200,
            "no hint: not a shed"
        );
        assert_eq!(
            answer(fault(StatusCode::BadSessionIdInvalid, true), false).status,
            200
        );
        let response = encoded(&uascale_types::GetEndpointsResponse::default());
        let ok = answer(response.clone(), true);
        assert_eq!((ok.status, ok.body, ok.close), (200, response, true));
    }

    /// While the server shuts down a request is answered 503 with
    /// `Retry-After`, counted at stage `https` with reason `shutting_down`.
    #[test]
    fn a_request_during_shutdown_is_503_and_counted() {
        let (https, at, head) = https_of(|_| {});
        let a = https.accept(peer(1), None, at.instant).expect("admitted");
        https.endpoint.stop_all();
        let endpoints = encoded(&uascale_types::GetEndpointsRequest::default());
        let reply = respond(https.request(&a, &head, &endpoints, at));
        assert_eq!(busy_of(&reply), (503, StatusCode::BadServerTooBusy));
        let metrics = &https.endpoint.state.metrics;
        assert_eq!(metrics.shed_count(Stage::Https, Reason::ShuttingDown), 1);
    }

    #[test]
    fn no_input_panics_the_parser() {
        // A cheap sweep; the fuzz target goes further.
        let mut seed = 0x9e37_79b9_u32;
        for len in 0..300usize {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    b"POST /\r\n:Content-Length 0123456789HTTP/1.1"
                        .get(seed as usize % 42)
                        .copied()
                        .unwrap_or(b'\n')
                })
                .collect();
            if let Ok(Some((h, _))) = parse_head(&bytes) {
                let _ = judge(&h, 100);
            }
        }
    }
}
