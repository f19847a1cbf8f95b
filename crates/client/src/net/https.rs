//! opc.https (https-uabinary): each request is POSTed in TLS, its body
//! the request's encoding id and fields, its answer the response (or a
//! ServiceFault) in a 200, or a busy answer (429, 503).
//!
//! The TLS handshake offers HTTP/2 (ALPN `h2`) before HTTP/1.1. Over
//! HTTP/2 every request of the link, held Publishes among them, is a
//! stream of one connection. HTTP/1.1 carries one request at a time per
//! connection, so then the link keeps a pool of connections: a held
//! Publish occupies one while the other requests go over the others (at
//! most [`MAX_CONNECTIONS`]). A 429
//! or 503 is `BadServerTooBusy`, its `Retry-After` the floor of the hint;
//! after one, the link holds back further requests until the hint has
//! passed (Publish and CloseSession excepted: they are what the server
//! lets through anyway).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use uascale_crypto::policy::SecurityPolicy;
use uascale_types::StatusCode;

use super::{open_tcp, Command, Link, Shared};
use crate::error::ClientError;
use crate::security::ServerTrust;

/// The most HTTPS connections one client keeps open at once.
pub const MAX_CONNECTIONS: usize = 16;
/// The largest response head read.
const MAX_HEAD: usize = 16 * 1024;
/// The largest response body read (the decode limits judge it after).
const MAX_BODY: usize = 64 << 20;
/// Publish and CloseSession: never held back after a busy answer.
const UNHELD: [u32; 2] = [826, 473];

/// Whether `url` is an opc.https URL.
pub fn is_https(url: &str) -> bool {
    url.starts_with("opc.https://")
}

/// The path of an `opc.https://host[:port][/path]` URL (`/` without one).
fn url_path(url: &str) -> &str {
    let rest = url.strip_prefix("opc.https://").unwrap_or(url);
    rest.find('/').and_then(|i| rest.get(i..)).unwrap_or("/")
}

/// Judges the server's TLS certificate with the client's [`ServerTrust`]
/// (the PKI's trust list, or the unsafe accept-any) - not with the web's
/// CAs and host names: an OPC UA server's certificate is its application
/// instance certificate, trusted by the client's PKI.
#[derive(Debug)]
struct Verifier {
    trust: ServerTrust,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // Judged as an RSA application certificate is under
        // Basic256Sha256 (its key length too): under None a validator
        // would allow no key at all.
        self.trust
            .check(end_entity.as_ref(), SecurityPolicy::Basic256Sha256)
            .map(|_| ServerCertVerified::assertion())
            .map_err(|e| rustls::Error::General(e.to_string()))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS connector judging server certificates with `trust`.
fn connector(trust: ServerTrust) -> Result<TlsConnector, ClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| ClientError::Security {
            status: StatusCode::BadConfigurationError,
            reason: e.to_string(),
        })?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier { trust, provider }))
        .with_no_client_auth();
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Where and how the link connects.
struct Target {
    host: String,
    port: u16,
    path: String,
    local: Option<std::net::IpAddr>,
    connector: TlsConnector,
    name: ServerName<'static>,
    connect_timeout: Duration,
    /// The `OPCUA-SecurityPolicy` header's value (the policy URI), for a
    /// secured policy.
    policy: Option<&'static str>,
}

impl Target {
    async fn connect(&self) -> Result<TlsStream<tokio::net::TcpStream>, ClientError> {
        let (host, port) = (&self.host, self.port);
        let open = async {
            let tcp = open_tcp(host, port, self.local)
                .await
                .map_err(|e| ClientError::Io(format!("{host}:{port}: {e}")))?;
            let _ = tcp.set_nodelay(true);
            self.connector
                .connect(self.name.clone(), tcp)
                .await
                .map_err(|e| match e.get_ref().map(|r| r.to_string()) {
                    Some(why) if e.kind() == std::io::ErrorKind::InvalidData => {
                        ClientError::Security {
                            status: StatusCode::BadCertificateUntrusted,
                            reason: format!("TLS: {why}"),
                        }
                    }
                    _ => ClientError::Io(format!("{host}:{port}: TLS: {e}")),
                })
        };
        tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| ClientError::Timeout)?
    }
}

/// What the link's requests share: the target, the HTTP/2 connection or
/// the idle HTTP/1.1 ones and their count, and the instant a busy answer
/// said to wait until.
struct Pool {
    target: Target,
    /// The server chose HTTP/2 on the first connection.
    http2: bool,
    /// Requests wait out a busy answer's hint
    /// (`ClientOptions::hold_after_busy`).
    hold: bool,
    /// The HTTP/2 connection's request handle (a new connection when the
    /// old one is gone).
    h2: tokio::sync::Mutex<Option<h2::client::SendRequest<Bytes>>>,
    idle: Mutex<Vec<TlsStream<tokio::net::TcpStream>>>,
    permits: Semaphore,
    not_before: Mutex<Option<Instant>>,
}

/// Whether the server chose HTTP/2 on `tls`.
fn is_h2(tls: &TlsStream<tokio::net::TcpStream>) -> bool {
    tls.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// The HTTP/2 handshake on `tls`; its connection runs in a task of its
/// own until every request handle is dropped.
async fn h2_handshake(
    tls: TlsStream<tokio::net::TcpStream>,
) -> Result<h2::client::SendRequest<Bytes>, ClientError> {
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(4 << 20)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(|e| ClientError::Io(format!("HTTP/2 handshake: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "opc.https: HTTP/2 connection ended");
        }
    });
    Ok(send)
}

/// Opens the link of an opc.https client: one TLS connection first (so a
/// wrong address or an untrusted certificate fails the connect), then a
/// task serving the link's commands over the pool.
pub(crate) async fn open_link(shared: &Arc<Shared>) -> Result<(u64, Link), ClientError> {
    let url = &shared.endpoint_url;
    let (host, port) = super::parse_url(url)?;
    let policy = shared.security.policy();
    if policy.is_ecc() {
        return Err(ClientError::Security {
            status: StatusCode::BadConfigurationError,
            reason: "over opc.https the ECC policies are not served (their session signatures \
                     need a secure channel's key agreement)"
                .into(),
        });
    }
    let name = ServerName::try_from(host.clone()).map_err(|_| ClientError::BadUrl(url.clone()))?;
    let target = Target {
        // The policy of the session signatures (TLS secures the
        // transport); absent means None.
        policy: (!policy.is_none()).then(|| policy.uri()),
        connector: connector(shared.options.security.trust.clone())?,
        path: url_path(url).to_owned(),
        host,
        port,
        local: shared.options.local_addr,
        name,
        connect_timeout: shared.options.connect_timeout,
    };
    let first = target.connect().await?;
    let http2 = is_h2(&first);
    let (h2, idle) = if http2 {
        (Some(h2_handshake(first).await?), Vec::new())
    } else {
        (None, vec![first])
    };
    let pool = Arc::new(Pool {
        target,
        http2,
        hold: shared.options.hold_after_busy,
        h2: tokio::sync::Mutex::new(h2),
        idle: Mutex::new(idle),
        permits: Semaphore::new(MAX_CONNECTIONS),
        not_before: Mutex::new(None),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let generation = shared
        .generation
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        + 1;
    tokio::spawn(drive(pool, rx));
    Ok((generation, tx))
}

/// Serves the link's commands until the client drops it or closes.
async fn drive(pool: Arc<Pool>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(cmd) = commands.recv().await {
        while tasks.try_join_next().is_some() {}
        match cmd {
            Command::Request {
                message,
                reply,
                deadline,
            } => {
                let pool = Arc::clone(&pool);
                tasks.spawn(async move {
                    let result = exchange(&pool, &message, deadline).await;
                    let _ = reply.send(result);
                });
            }
            Command::Close { done } => {
                tasks.abort_all();
                let _ = done.send(());
                break;
            }
            Command::Thumbprint { reply } => {
                let _ = reply.send(Vec::new());
            }
        }
    }
    // Dropping the link ends the requests still out.
    tasks.abort_all();
}

/// The ns0 encoding id a request message starts with (0 if unreadable).
fn type_id(message: &[u8]) -> u32 {
    let limits = uascale_types::DecodeLimits::default();
    uascale_types::Reader::new(message, &limits)
        .ok()
        .and_then(|mut r| {
            <uascale_types::NodeId as uascale_types::BinaryDecode>::decode(&mut r).ok()
        })
        .and_then(|id| id.as_ns0())
        .unwrap_or(0)
}

/// One request: held back while a busy answer's hint runs (failing at
/// once with the rest of the hint when that passes `deadline`), then
/// POSTed on a pooled connection (a new one when none is idle).
async fn exchange(pool: &Pool, message: &[u8], deadline: Instant) -> Result<Vec<u8>, ClientError> {
    if pool.hold && !UNHELD.contains(&type_id(message)) {
        let until = *pool.not_before.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = until.filter(|&u| u > Instant::now()) {
            if until > deadline {
                let left = until.saturating_duration_since(Instant::now());
                return Err(busy(Some(ms(left))));
            }
            tokio::time::sleep_until(until.into()).await;
        }
    }
    let answer = if pool.http2 {
        post_h2(pool, message, deadline).await?
    } else {
        let _permit = pool
            .permits
            .acquire()
            .await
            .map_err(|_| ClientError::Closed)?;
        let idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let (mut stream, reused) = match idle {
            Some(s) => (s, true),
            None => (pool.target.connect().await?, false),
        };
        let mut result = post(&mut stream, &pool.target, message, deadline).await;
        if reused && matches!(result, Err(ClientError::Io(_))) {
            // An idle connection the server closed meanwhile: once more on
            // a new one (the request was not read by the server).
            stream = pool.target.connect().await?;
            result = post(&mut stream, &pool.target, message, deadline).await;
        }
        let (answer, keep) = result?;
        if keep {
            pool.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(stream);
        }
        answer
    };
    if let Answer::Busy(hint) = &answer {
        let until = Instant::now() + *hint;
        let mut nb = pool.not_before.lock().unwrap_or_else(|p| p.into_inner());
        *nb = Some(nb.map_or(until, |n| n.max(until)));
    }
    result_of(answer)
}

/// The request's result from its answer: the response message, or the
/// error a busy answer or another HTTP status is.
fn result_of(answer: Answer) -> Result<Vec<u8>, ClientError> {
    match answer {
        Answer::Ok(body) => Ok(body),
        Answer::Busy(hint) => Err(busy(Some(ms(hint)))),
        Answer::Http(status) => Err(ClientError::Service {
            status: match status {
                413 => StatusCode::BadRequestTooLarge,
                404 | 405 => StatusCode::BadServiceUnsupported,
                400 | 415 => StatusCode::BadDecodingError,
                _ => StatusCode::BadCommunicationError,
            },
            retry_after_ms: None,
            retry_ticket: None,
        }),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn busy(retry_after_ms: Option<u64>) -> ClientError {
    ClientError::Service {
        status: StatusCode::BadServerTooBusy,
        retry_after_ms,
        retry_ticket: None,
    }
}

/// What an HTTP answer meant.
#[derive(Debug, PartialEq)]
enum Answer {
    /// 200: the response message.
    Ok(Vec<u8>),
    /// 429 or 503: wait at least this long.
    Busy(Duration),
    /// Another status.
    Http(u16),
}

/// POSTs `message` on `stream` and reads the answer (before `deadline`);
/// true beside it when the connection may be used again.
async fn post(
    stream: &mut TlsStream<tokio::net::TcpStream>,
    target: &Target,
    message: &[u8],
    deadline: Instant,
) -> Result<(Answer, bool), ClientError> {
    let io = |e: std::io::Error| ClientError::Io(e.to_string());
    let work = async {
        let policy = target
            .policy
            .map(|uri| format!("OPCUA-SecurityPolicy: {uri}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/octet-stream\r\n{policy}Content-Length: {}\r\n\r\n",
            target.path,
            target.host,
            target.port,
            message.len()
        );
        let mut out = Vec::with_capacity(head.len() + message.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(message);
        stream.write_all(&out).await.map_err(io)?;
        stream.flush().await.map_err(io)?;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 8192];
        let (status, length, retry_after, close, head_len) = loop {
            if let Some(parsed) = parse_response_head(&buf)? {
                break parsed;
            }
            if buf.len() > MAX_HEAD {
                return Err(ClientError::Decode("HTTP response head too large".into()));
            }
            let n = stream.read(&mut chunk).await.map_err(io)?;
            if n == 0 {
                return Err(ClientError::Io("server closed the connection".into()));
            }
            buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        };
        if length > MAX_BODY {
            return Err(ClientError::Decode("HTTP response body too large".into()));
        }
        let mut body = buf.split_off(head_len.min(buf.len()));
        while body.len() < length {
            let n = stream.read(&mut chunk).await.map_err(io)?;
            if n == 0 {
                return Err(ClientError::Io("server closed the connection".into()));
            }
            body.extend_from_slice(chunk.get(..n).unwrap_or_default());
        }
        body.truncate(length);
        let answer = answer_of(status, retry_after, body);
        // An error answer closes (the server does); a busy one does not.
        let keep = !close && (status < 400 || status == 429 || status == 503);
        Ok((answer, keep))
    };
    tokio::time::timeout_at(deadline.into(), work)
        .await
        .map_err(|_| ClientError::Timeout)?
}

/// What an answer of `status` with `Retry-After` (seconds) and `body`
/// means.
fn answer_of(status: u16, retry_after: Option<u64>, body: Vec<u8>) -> Answer {
    match status {
        200 => Answer::Ok(body),
        429 | 503 => {
            // The body's hint (milliseconds) where there is one;
            // Retry-After (whole seconds) is its floor.
            let floor = Duration::from_secs(retry_after.unwrap_or(1));
            let hinted = fault_hint(&body).map_or(Duration::ZERO, Duration::from_millis);
            Answer::Busy(floor.max(hinted))
        }
        s => Answer::Http(s),
    }
}

/// The link's HTTP/2 request handle, ready for a new stream: the one it
/// has, or a new connection's when that one is gone (`fresh`: the old
/// one just failed).
async fn h2_ready(pool: &Pool, fresh: bool) -> Result<h2::client::SendRequest<Bytes>, ClientError> {
    let send = {
        let mut slot = pool.h2.lock().await;
        match slot.clone().filter(|_| !fresh) {
            Some(send) => send,
            None => {
                let send = h2_handshake(pool.target.connect().await?).await?;
                *slot = Some(send.clone());
                send
            }
        }
    };
    send.ready()
        .await
        .map_err(|e| ClientError::Io(format!("HTTP/2: {e}")))
}

/// POSTs `message` as a stream of the link's HTTP/2 connection and reads
/// the answer (before `deadline`). A connection found gone before the
/// request went out is replaced once.
async fn post_h2(pool: &Pool, message: &[u8], deadline: Instant) -> Result<Answer, ClientError> {
    let io = |e: h2::Error| ClientError::Io(format!("HTTP/2: {e}"));
    let work = async {
        let target = &pool.target;
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!(
                "https://{}:{}{}",
                target.host, target.port, target.path
            ))
            .header("content-type", "application/octet-stream")
            .header("content-length", message.len());
        if let Some(uri) = target.policy {
            request = request.header("opcua-securitypolicy", uri);
        }
        let request = request
            .body(())
            .map_err(|e| ClientError::BadUrl(format!("HTTP/2 request: {e}")))?;
        // A connection found gone before the request went out: once more
        // on a new one.
        let sent = match h2_ready(pool, false).await {
            Ok(mut send) => send.send_request(request.clone(), false).ok(),
            Err(_) => None,
        };
        let (response, mut body) = match sent {
            Some(sent) => sent,
            None => h2_ready(pool, true)
                .await?
                .send_request(request, false)
                .map_err(io)?,
        };
        body.send_data(Bytes::copy_from_slice(message), true)
            .map_err(io)?;
        let response = response.await.map_err(io)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let mut recv = response.into_body();
        let mut out = Vec::new();
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.map_err(io)?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            if out.len() + chunk.len() > MAX_BODY {
                return Err(ClientError::Decode("HTTP response body too large".into()));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(answer_of(status, retry_after, out))
    };
    tokio::time::timeout_at(deadline.into(), work)
        .await
        .map_err(|_| ClientError::Timeout)?
}

/// The `RetryAfterMs` hint of a ServiceFault body.
fn fault_hint(body: &[u8]) -> Option<u64> {
    let limits = uascale_types::DecodeLimits::default();
    let mut r = uascale_types::Reader::new(body, &limits).ok()?;
    let m = uascale_types::decode_message(&mut r).ok()?;
    let fault = m
        .into_any()
        .downcast::<uascale_types::ServiceFault>()
        .ok()?;
    super::retry_after_ms(&fault.response_header)
}

/// Parses an HTTP/1.1 response head at the start of `buf`: `None` until
/// complete; else the status, Content-Length, Retry-After (seconds), the
/// close flag and the head's length.
#[allow(clippy::type_complexity)]
fn parse_response_head(
    buf: &[u8],
) -> Result<Option<(u16, usize, Option<u64>, bool, usize)>, ClientError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let bad = |why: &str| ClientError::Decode(format!("HTTP response: {why}"));
    let text = std::str::from_utf8(buf.get(..end).unwrap_or_default())
        .map_err(|_| bad("head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut length = 0usize;
    let mut retry_after = None;
    let mut close = version == "HTTP/1.0";
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().map_err(|_| bad("Content-Length"))?,
            "retry-after" => retry_after = value.parse().ok(),
            "connection" => close = value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    Ok(Some((status, length, retry_after, close, end + 4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_heads() {
        let h =
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nContent-Length: 5\r\n\r\nabcde";
        let (status, len, after, close, head) =
            parse_response_head(h).expect("valid").expect("complete");
        assert_eq!((status, len, after, close), (429, 5, Some(3), false));
        assert_eq!(h.get(head..), Some(&b"abcde"[..]));
        assert_eq!(parse_response_head(b"HTTP/1.1 200 OK\r\n").ok(), Some(None));
        assert!(parse_response_head(b"SSH-2.0\r\n\r\n").is_err());
        assert_eq!(url_path("opc.https://h:1/a/b"), "/a/b");
        assert_eq!(url_path("opc.https://h:1"), "/");
    }

    /// A ServiceFault of `status` with the hint `hint_ms`, encoded.
    fn fault(status: StatusCode, hint_ms: i64) -> Vec<u8> {
        use uascale_types as t;
        let fault = t::ServiceFault {
            response_header: t::ResponseHeader {
                service_result: status,
                additional_header: t::ExtensionObject::new(t::AdditionalParametersType {
                    parameters: Some(vec![t::KeyValuePair {
                        key: t::QualifiedName::new(0, "RetryAfterMs"),
                        value: t::Variant::Int64(hint_ms),
                    }]),
                }),
                ..Default::default()
            },
        };
        let mut out = Vec::new();
        t::encode_message(&fault, &mut out);
        out
    }

    fn status_and_hint(r: Result<Vec<u8>, ClientError>) -> (StatusCode, Option<u64>) {
        match r {
            Err(ClientError::Service {
                status,
                retry_after_ms,
                ..
            }) => (status, retry_after_ms),
            other => panic!("not a service error: {other:?}"),
        }
    }

    /// 429 and 503 are `BadServerTooBusy` whatever the body: the fault's
    /// hint when it has one, `Retry-After` (whole seconds) as its floor,
    /// 1 s without either. Other statuses are errors of their own.
    #[test]
    fn busy_answers_are_server_too_busy_with_a_hint() {
        let too_busy = StatusCode::BadServerTooBusy;
        // The server shutting down: 503, Retry-After 1, the fault's 1 s.
        let shutdown = answer_of(503, Some(1), fault(too_busy, 1000));
        assert_eq!(shutdown, Answer::Busy(Duration::from_secs(1)));
        assert_eq!(status_and_hint(result_of(shutdown)), (too_busy, Some(1000)));
        // A 503 with a text body, or no Retry-After: still busy.
        let bare = result_of(answer_of(503, Some(4), b"busy\n".to_vec()));
        assert_eq!(status_and_hint(bare), (too_busy, Some(4000)));
        let bare = result_of(answer_of(503, None, Vec::new()));
        assert_eq!(status_and_hint(bare), (too_busy, Some(1000)));
        // A 429 whose fault says BadTooManySessions with 2.5 s: busy, the
        // fault's finer hint above the floor of Retry-After 2; a hint
        // under the floor is raised to it.
        let sessions = answer_of(429, Some(2), fault(StatusCode::BadTooManySessions, 2500));
        assert_eq!(status_and_hint(result_of(sessions)), (too_busy, Some(2500)));
        let floored = answer_of(429, Some(2), fault(too_busy, 1500));
        assert_eq!(status_and_hint(result_of(floored)), (too_busy, Some(2000)));
        // Not busy answers.
        assert_eq!(
            status_and_hint(result_of(answer_of(413, None, Vec::new()))),
            (StatusCode::BadRequestTooLarge, None)
        );
        assert_eq!(result_of(answer_of(200, None, vec![7])).ok(), Some(vec![7]));
    }
}
