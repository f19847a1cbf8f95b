//! A pipelined request path for load generation: one task owns the
//! connection and keeps a window of requests in flight on it, without a
//! command channel, a reply channel or a timer per request.
//!
//! [`Client`](super::Client) is the general client: any task can call it,
//! each request gets its own reply and timeout, and responses are decoded
//! into typed messages. That costs several task wake-ups, allocations and
//! a timer registration per request - fine for applications, but a load
//! generator built on it measures itself rather than the server. A
//! [`Pipeline`] is driven by one task: it sends the same request (a
//! [`Template`], encoded once, only its requestHandle patched) as long as
//! fewer than the window are outstanding, reads whatever answers arrived,
//! and hands each raw response to a callback with its latency; timeouts
//! are found by a scan every [`SCAN_INTERVAL`]. [`read_statuses`] decodes
//! just what a Read benchmark counts.
//!
//! Scope: SecurityPolicy None and an anonymous session (what a load test of
//! the service path needs); [`Pipeline::connect`] refuses other security.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use uascale_proto::{ClientConnection, ClientEvent, ClientSecurity};
use uascale_types as t;
use uascale_types::{
    encode_message, BinaryDecode, DataValue, DateTime, DynStructure, NodeId, Reader,
    ResponseHeader, StatusCode, UaString,
};

use super::{now, open_tcp, parse_url, retry_after_ms, retry_ticket, ClientOptions};
use crate::error::ClientError;

/// How often outstanding requests are checked against the request timeout
/// (and the channel's own timers run).
pub const SCAN_INTERVAL: Duration = Duration::from_millis(100);

/// Hashes the request ids of the window: they are consecutive, so a
/// multiplication spreads them well enough, at a fraction of SipHash's cost.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Outstanding = HashMap<u32, Instant, BuildHasherDefault<IdHasher>>;

/// A request encoded once; each send patches only its requestHandle.
#[derive(Debug, Clone)]
pub struct Template {
    message: Vec<u8>,
    handle_at: usize,
}

impl Template {
    /// Encodes `request` (encoding id + body). Its RequestHeader comes
    /// first in the body (Part 4 §7.33), so the requestHandle sits after
    /// the encoding id, the authenticationToken and the timestamp.
    pub fn new(request: &dyn DynStructure) -> Result<Template, ClientError> {
        let mut message = Vec::with_capacity(128);
        encode_message(request, &mut message);
        let limits = t::DecodeLimits::default();
        let mut r = Reader::new(&message, &limits).map_err(ClientError::decode)?;
        NodeId::decode(&mut r).map_err(ClientError::decode)?;
        NodeId::decode(&mut r).map_err(ClientError::decode)?;
        DateTime::decode(&mut r).map_err(ClientError::decode)?;
        let handle_at = r.position();
        if r.remaining() < 4 {
            return Err(ClientError::Decode(
                "the request is too short to carry a RequestHeader".into(),
            ));
        }
        Ok(Template { message, handle_at })
    }

    /// The encoded request with `handle` as its requestHandle.
    pub fn with_handle(&mut self, handle: u32) -> &[u8] {
        if let Some(b) = self.message.get_mut(self.handle_at..self.handle_at + 4) {
            b.copy_from_slice(&handle.to_le_bytes());
        }
        &self.message
    }

    /// Its encoded length in bytes.
    pub fn len(&self) -> usize {
        self.message.len()
    }

    /// Never true (a request has at least its header).
    pub fn is_empty(&self) -> bool {
        self.message.is_empty()
    }
}

/// One request's end in [`Pipeline::run`].
#[derive(Debug)]
pub struct Completed {
    /// From the send to the answer (or to the failure).
    pub latency: Duration,
    /// The raw response (encoding id + body), or why there is none:
    /// [`ClientError::Timeout`], an aborted response
    /// ([`ClientError::Service`]), or the channel's end.
    pub result: Result<Vec<u8>, ClientError>,
}

/// One connection with an anonymous session, driven by its owner's task.
#[derive(Debug)]
pub struct Pipeline {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    conn: ClientConnection,
    input: Vec<u8>,
    out: Vec<u8>,
    auth: NodeId,
    next_handle: u32,
    options: ClientOptions,
    endpoint_url: String,
}

impl Pipeline {
    /// Connects and opens a secure channel (SecurityPolicy None only).
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Pipeline, ClientError> {
        if !options.security.policy.is_none()
            || options.security.mode != t::MessageSecurityMode::None
        {
            return Err(ClientError::Security {
                status: StatusCode::BadConfigurationError,
                reason: "the pipelined path supports SecurityPolicy None only".into(),
            });
        }
        if super::https::is_https(url) {
            return Err(ClientError::BadUrl(format!(
                "{url}: the pipelined path speaks opc.tcp only (use the library client)"
            )));
        }
        let (host, port) = parse_url(url)?;
        let stream = tokio::time::timeout(
            options.connect_timeout,
            open_tcp(&host, port, options.local_addr),
        )
        .await
        .map_err(|_| ClientError::Timeout)?
        .map_err(|e| ClientError::Io(format!("{host}:{port}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let mut config = options.channel.clone();
        config.endpoint_url = url.to_owned();
        config.handshake_timeout = options.connect_timeout;
        config.security = ClientSecurity::none();
        let conn = ClientConnection::new(now(), std::sync::Arc::new(config));
        let (rd, wr) = stream.into_split();
        let mut p = Pipeline {
            rd,
            wr,
            conn,
            input: Vec::with_capacity(64 * 1024),
            out: Vec::with_capacity(64 * 1024),
            auth: NodeId::NULL,
            next_handle: 1,
            options,
            endpoint_url: url.to_owned(),
        };
        let deadline = Instant::now() + p.options.connect_timeout;
        while !p.conn.is_open() {
            p.flush().await?;
            p.receive_until(deadline).await?;
            while let Some(ev) = p.conn.poll_event() {
                if let ClientEvent::Closed {
                    status,
                    reason,
                    retry_after_ms,
                } = ev
                {
                    return Err(ClientError::Channel {
                        status,
                        reason,
                        retry_after_ms,
                    });
                }
            }
        }
        Ok(p)
    }

    /// Writes whatever the connection has queued.
    async fn flush(&mut self) -> Result<(), ClientError> {
        self.out.clear();
        if self.conn.poll_transmit(&mut self.out) {
            self.wr
                .write_all(&self.out)
                .await
                .map_err(|e| ClientError::Io(e.to_string()))?;
        }
        Ok(())
    }

    /// Reads once (or runs the channel's timers when `deadline` passes
    /// first) and feeds the connection.
    async fn receive_until(&mut self, deadline: Instant) -> Result<(), ClientError> {
        let due = self
            .conn
            .poll_timeout()
            .map_or(deadline, |d| d.min(deadline));
        match tokio::time::timeout_at(due.into(), self.rd.read_buf(&mut self.input)).await {
            Err(_) => {
                self.conn.handle_timeout(now());
                if Instant::now() >= deadline {
                    return Err(ClientError::Timeout);
                }
            }
            Ok(Ok(0)) => return Err(server_closed()),
            Ok(Ok(_)) => {
                let _ = self.conn.handle_input(now(), &mut self.input);
            }
            Ok(Err(e)) => return Err(ClientError::Io(e.to_string())),
        }
        Ok(())
    }

    /// A request header with the session's token and a fresh handle.
    pub fn request_header(&mut self) -> t::RequestHeader {
        let handle = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1);
        t::RequestHeader {
            authentication_token: self.auth.clone(),
            timestamp: DateTime::from_system_time(SystemTime::now()),
            request_handle: handle,
            timeout_hint: u32::try_from(self.options.request_timeout.as_millis())
                .unwrap_or(u32::MAX),
            ..Default::default()
        }
    }

    /// Sends one request and waits for its response of type `R` (nothing
    /// else may be in flight). A Bad serviceResult is
    /// [`ClientError::Service`].
    pub async fn request<R: DynStructure>(
        &mut self,
        req: &dyn DynStructure,
    ) -> Result<R, ClientError> {
        let mut message = Vec::with_capacity(256);
        encode_message(req, &mut message);
        let id = self
            .conn
            .send_request(&message)
            .map_err(|e| ClientError::Channel {
                status: e.status_code(),
                reason: e.to_string(),
                retry_after_ms: None,
            })?;
        let deadline = Instant::now() + self.options.request_timeout;
        let body = loop {
            self.flush().await?;
            if let Some(body) = self.take_response(id)? {
                break body;
            }
            self.receive_until(deadline).await?;
        };
        super::decode_response(&body, &self.options.decode)
    }

    /// The response to `id` if it arrived; other events are dropped (only
    /// one request is in flight outside [`Pipeline::run`]).
    fn take_response(&mut self, id: u32) -> Result<Option<Vec<u8>>, ClientError> {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                ClientEvent::Response { request_id, body } if request_id == id => {
                    return Ok(Some(body));
                }
                ClientEvent::Aborted { request_id, status } if request_id == id => {
                    return Err(ClientError::Service {
                        status,
                        retry_after_ms: None,
                        retry_ticket: None,
                    });
                }
                ClientEvent::Closed {
                    status,
                    reason,
                    retry_after_ms,
                } => {
                    return Err(ClientError::Channel {
                        status,
                        reason,
                        retry_after_ms,
                    })
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Creates and activates an anonymous session.
    pub async fn create_session(
        &mut self,
        name: &str,
    ) -> Result<t::CreateSessionResponse, ClientError> {
        let header = self.request_header();
        let created: t::CreateSessionResponse = self
            .request(&t::CreateSessionRequest {
                request_header: header,
                client_description: t::ApplicationDescription {
                    application_uri: UaString::from(self.options.application_uri.as_str()),
                    product_uri: UaString::from("urn:uascale"),
                    application_name: t::LocalizedText::new("", "uascale client"),
                    application_type: t::ApplicationType::Client,
                    ..Default::default()
                },
                endpoint_url: UaString::from(self.endpoint_url.as_str()),
                session_name: UaString::from(name),
                client_nonce: t::ByteString::new(vec![0x5a; 32]),
                requested_session_timeout: self.options.session_timeout.as_millis() as f64,
                max_response_message_size: self.options.channel.max_message_size,
                ..Default::default()
            })
            .await?;
        self.auth = created.authentication_token.clone();
        let policy_id = anonymous_policy_id(&created).ok_or_else(|| ClientError::Security {
            status: StatusCode::BadIdentityTokenRejected,
            reason: "the server offers no anonymous token on a None endpoint".into(),
        })?;
        let header = self.request_header();
        let _: t::ActivateSessionResponse = self
            .request(&t::ActivateSessionRequest {
                request_header: header,
                locale_ids: Some(vec![UaString::from("en")]),
                user_identity_token: t::ExtensionObject::new(t::AnonymousIdentityToken {
                    policy_id,
                }),
                ..Default::default()
            })
            .await?;
        Ok(created)
    }

    /// Keeps up to `window` copies of `template` in flight (each with a
    /// fresh requestHandle) until `stop` is set, then waits for the
    /// outstanding ones (at most the request timeout). Every request ends
    /// in one call of `done`. Returns the channel's failure when it ended
    /// (after reporting each outstanding request with it).
    pub async fn run(
        &mut self,
        template: &mut Template,
        window: usize,
        stop: &AtomicBool,
        mut done: impl FnMut(Completed),
    ) -> Result<(), ClientError> {
        let window = window.max(1);
        let timeout = self.options.request_timeout;
        let mut pending = Outstanding::with_capacity_and_hasher(window * 2, Default::default());
        let mut written = 0usize;
        self.out.clear();
        let tick = tokio::time::sleep(SCAN_INTERVAL);
        tokio::pin!(tick);
        let mut drain_until: Option<Instant> = None;
        let failure = loop {
            // Refill the window.
            if drain_until.is_none() {
                if stop.load(Ordering::Relaxed) {
                    drain_until = Some(Instant::now() + timeout);
                } else if pending.len() < window {
                    let sent_at = Instant::now();
                    while pending.len() < window {
                        let handle = self.next_handle;
                        self.next_handle = self.next_handle.wrapping_add(1);
                        match self.conn.send_request(template.with_handle(handle)) {
                            Ok(id) => {
                                pending.insert(id, sent_at);
                            }
                            // The channel is closing; its event says why.
                            Err(_) => break,
                        }
                    }
                }
            }
            if drain_until.is_some() && pending.is_empty() {
                break None;
            }
            if written == self.out.len() {
                self.out.clear();
                written = 0;
                self.conn.poll_transmit(&mut self.out);
            }
            let writing = written < self.out.len();
            tokio::select! {
                biased;
                read = self.rd.read_buf(&mut self.input) => match read {
                    Ok(0) => break Some(server_closed()),
                    Ok(_) => {
                        let _ = self.conn.handle_input(now(), &mut self.input);
                    }
                    Err(e) => break Some(ClientError::Io(e.to_string())),
                },
                w = self.wr.write(&self.out[written..]), if writing => match w {
                    Ok(0) => break Some(ClientError::Io("write returned 0".into())),
                    Ok(n) => written += n,
                    Err(e) => break Some(ClientError::Io(e.to_string())),
                },
                () = &mut tick => {
                    let at = Instant::now();
                    tick.as_mut().reset((at + SCAN_INTERVAL).into());
                    if self.conn.poll_timeout().is_some_and(|d| d <= at) {
                        self.conn.handle_timeout(now());
                    }
                    pending.retain(|_, sent| {
                        let late = at.duration_since(*sent) >= timeout;
                        if late {
                            done(Completed { latency: at.duration_since(*sent), result: Err(ClientError::Timeout) });
                        }
                        !late
                    });
                    if drain_until.is_some_and(|d| at >= d) {
                        break None;
                    }
                }
            }
            let mut ended = None;
            let at = Instant::now();
            while let Some(ev) = self.conn.poll_event() {
                match ev {
                    ClientEvent::Response { request_id, body } => {
                        if let Some(sent) = pending.remove(&request_id) {
                            done(Completed {
                                latency: at.duration_since(sent),
                                result: Ok(body),
                            });
                        }
                    }
                    ClientEvent::Aborted { request_id, status } => {
                        if let Some(sent) = pending.remove(&request_id) {
                            done(Completed {
                                latency: at.duration_since(sent),
                                result: Err(ClientError::Service {
                                    status,
                                    retry_after_ms: None,
                                    retry_ticket: None,
                                }),
                            });
                        }
                    }
                    ClientEvent::Closed {
                        status,
                        reason,
                        retry_after_ms,
                    } => {
                        ended = Some(ClientError::Channel {
                            status,
                            reason,
                            retry_after_ms,
                        });
                    }
                    ClientEvent::Opened { .. } | ClientEvent::Renewed { .. } => {}
                }
            }
            if ended.is_some() {
                break ended;
            }
        };
        // Whatever was queued but not yet written goes out before the
        // connection is used again.
        if let Some(rest) = self.out.get(written..) {
            if !rest.is_empty() {
                let _ = self.wr.write_all(rest).await;
            }
        }
        self.out.clear();
        match failure {
            None => Ok(()),
            Some(e) => {
                let at = Instant::now();
                for (_, sent) in pending.drain() {
                    done(Completed {
                        latency: at.duration_since(sent),
                        result: Err(e.clone()),
                    });
                }
                Err(e)
            }
        }
    }

    /// Closes the session (when there is one) and the channel.
    pub async fn close(mut self) {
        if !self.auth.is_null() && self.conn.is_open() {
            let header = self.request_header();
            let _: Result<t::CloseSessionResponse, _> = self
                .request(&t::CloseSessionRequest {
                    request_header: header,
                    delete_subscriptions: true,
                })
                .await;
        }
        self.conn.close(now());
        let _ = self.flush().await;
        let _ = self.wr.shutdown().await;
    }
}

fn server_closed() -> ClientError {
    ClientError::Channel {
        status: StatusCode::BadConnectionClosed,
        reason: "server closed the connection".into(),
        retry_after_ms: None,
    }
}

/// The policyId of an anonymous token the server offers on a None
/// endpoint (any endpoint when none says None).
fn anonymous_policy_id(created: &t::CreateSessionResponse) -> Option<UaString> {
    let endpoints = created.server_endpoints.as_deref().unwrap_or_default();
    let none_uri = uascale_crypto::policy::SecurityPolicy::None.uri();
    let find = |only_none: bool| {
        endpoints
            .iter()
            .filter(|e| !only_none || e.security_policy_uri.as_str() == Some(none_uri))
            .flat_map(|e| e.user_identity_tokens.iter().flatten())
            .find(|p| p.token_type == t::UserTokenType::Anonymous)
            .map(|p| p.policy_id.clone())
    };
    find(true).or_else(|| find(false))
}

/// What a Read benchmark counts in a ReadResponse, decoded without building
/// the message: the serviceResult and the number of results; `bad` is
/// called with each Bad value status. A ServiceFault (or any Bad
/// serviceResult) is [`ClientError::Service`].
pub fn read_statuses(
    body: &[u8],
    limits: &t::DecodeLimits,
    mut bad: impl FnMut(StatusCode),
) -> Result<usize, ClientError> {
    let mut r = Reader::new(body, limits).map_err(ClientError::decode)?;
    let id = NodeId::decode(&mut r).map_err(ClientError::decode)?;
    let header = ResponseHeader::decode(&mut r).map_err(ClientError::decode)?;
    if header.service_result.is_bad() {
        return Err(ClientError::Service {
            status: header.service_result,
            retry_after_ms: retry_after_ms(&header),
            retry_ticket: retry_ticket(&header),
        });
    }
    if id != NodeId::ns0(t::ids::object::ReadResponse_Encoding_DefaultBinary) {
        return Err(ClientError::Decode(format!(
            "expected a ReadResponse, got the message {id}"
        )));
    }
    let results = r
        .read_array(|r| {
            let v = DataValue::decode(r)?;
            if let Some(s) = v.status.filter(|s| s.is_bad()) {
                bad(s);
            }
            Ok(())
        })
        .map_err(ClientError::decode)?;
    Ok(results.map_or(0, |v| v.len()))
}
