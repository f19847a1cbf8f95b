//! HTTP/2 on an opc.https connection (TLS ALPN `h2`): the h2 crate does
//! the framing, header compression and flow control; each stream carries
//! one request, judged and served by [`crate::endpoint::https`] exactly as
//! an HTTP/1.1 request is, so a client's held Publishes and its other
//! requests share one connection. The streams of a connection run on its
//! one task.

use std::future::poll_fn;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

use crate::endpoint::https::{
    head_of_stream, judge, Head, HttpError, Https, HttpsConnection, Outcome, Reply, MAX_HEAD,
};
use crate::endpoint::Channel;
use crate::state::clock;

/// Requests of one connection whose bodies are being read at once; the
/// others wait. Bounds what a connection buffers to this many bodies of
/// `max_body_size`, as four HTTP/1.1 connections would.
const BODIES_AT_ONCE: usize = 4;

/// Serves an HTTP/2 connection (after its TLS handshake) until the peer
/// goes, an error ends it, or it has no stream open for `idle_timeout_ms`
/// (then a GOAWAY lets its last requests finish).
pub(super) async fn serve<T>(io: T, conn: &HttpsConnection, https: &Https)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let config = https.config();
    let handshake = https.endpoint().state().config.limits.handshake_timeout;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(config.max_streams)
        .max_header_list_size(u32::try_from(MAX_HEAD).unwrap_or(u32::MAX));
    let mut h2 = match tokio::time::timeout(handshake, builder.handshake::<_, Bytes>(io)).await {
        Ok(Ok(h2)) => h2,
        Ok(Err(e)) => {
            tracing::debug!(peer = %conn.peer, error = %e, "https: HTTP/2 handshake failed");
            return;
        }
        Err(_) => return,
    };
    let bodies = Semaphore::new(BODIES_AT_ONCE);
    let mut streams = FuturesUnordered::new();
    let mut idle_since = Some(Instant::now());
    loop {
        let idle_at = idle_since.map(|t| t + config.idle_timeout);
        tokio::select! {
            accepted = h2.accept() => match accepted {
                Some(Ok((request, respond))) => {
                    idle_since = None;
                    streams.push(stream(request, respond, conn, https, &bodies, handshake));
                }
                Some(Err(e)) => {
                    tracing::debug!(peer = %conn.peer, error = %e, "https: HTTP/2 connection failed");
                    return;
                }
                None => return,
            },
            Some(()) = streams.next(), if !streams.is_empty() => {
                if streams.is_empty() {
                    idle_since = Some(Instant::now());
                }
            }
            () = tokio::time::sleep_until(idle_at.unwrap_or_else(Instant::now).into()), if idle_at.is_some() => {
                // Idle: no new streams; accept ends once the peer has
                // seen the GOAWAY.
                h2.graceful_shutdown();
                idle_since = None;
            }
        }
    }
}

/// A request still waiting for its answer: abandoned (it leaves the
/// queue, a held Publish's answer is refused) if the stream or the
/// connection goes first.
struct Waiting<'a> {
    https: &'a Https,
    channel: &'a Channel,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.https.abandon(self.channel);
        }
    }
}

/// One stream: the request's head judged, its body read (bounded by
/// `max_body_size`, within the handshake timeout), served, answered.
async fn stream(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    conn: &HttpsConnection,
    https: &Https,
    bodies: &Semaphore,
    body_timeout: Duration,
) {
    let max_body = https.config().max_body_size;
    let (parts, mut recv) = request.into_parts();
    // An error answered before the body was read: the body is read and
    // dropped after it (within the timeout), so that the stream ends
    // cleanly rather than in a reset the client may report instead.
    let refuse = |mut respond: h2::server::SendResponse<Bytes>,
                  mut recv: h2::RecvStream,
                  e: HttpError| async move {
        send(&mut respond, e.reply());
        let _ = tokio::time::timeout(body_timeout, async {
            while let Some(Ok(chunk)) = recv.data().await {
                let _ = recv.flow_control().release_capacity(chunk.len());
            }
        })
        .await;
    };
    let mut head = match head_of(&parts) {
        Ok(head) => head,
        Err(e) => return refuse(respond, recv, e).await,
    };
    // Method, path, media type and a declared length judged before any
    // of the body is read.
    let early = Head {
        content_length: Some(head.content_length.unwrap_or(1)),
        ..head.clone()
    };
    if let Err(e) = judge(&early, max_body) {
        return refuse(respond, recv, e).await;
    }
    let read = {
        let Ok(_permit) = bodies.acquire().await else {
            return;
        };
        tokio::time::timeout(body_timeout, read_body(&mut recv, max_body)).await
    };
    // The permit is back before a refused body is drained.
    let body = match read {
        Ok(Ok(body)) => body,
        Ok(Err(Some(e))) => return refuse(respond, recv, e).await,
        Ok(Err(None)) => return,
        Err(_) => return respond.send_reset(h2::Reason::CANCEL),
    };
    head.content_length = Some(body.len());
    if let Err(e) = judge(&head, max_body) {
        return send(&mut respond, e.reply());
    }
    let reply = match https.request(conn, &head, &body, clock()) {
        Outcome::Respond(reply) => reply,
        Outcome::Wait { channel, task } => {
            drop(body);
            if let Some(task) = task {
                tokio::spawn(task);
            }
            let mut waiting = Waiting {
                https,
                channel: &channel,
                answered: false,
            };
            loop {
                tokio::select! {
                    () = poll_fn(|cx| channel.poll_ready(cx)) => {
                        if let Some(reply) = https.answered(&channel, false, clock().utc) {
                            waiting.answered = true;
                            break reply;
                        }
                    }
                    // The client reset the stream (or the connection is
                    // going): the drop abandons the request.
                    _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
                }
            }
        }
    };
    send(&mut respond, reply);
}

/// Reads a request body of at most `max_body` bytes; an error to answer
/// (413 over the bound), or `None` when the stream failed.
async fn read_body(
    recv: &mut h2::RecvStream,
    max_body: usize,
) -> Result<Vec<u8>, Option<HttpError>> {
    let mut body = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(|_| None)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        if body.len() + chunk.len() > max_body {
            return Err(Some(HttpError::new(
                413,
                "request body over https.max_body_size",
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The [`Head`] of an HTTP/2 request ([`head_of_stream`]).
fn head_of(parts: &http::request::Parts) -> Result<Head, HttpError> {
    let headers: Vec<(&str, Option<&str>)> = parts
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.to_str().ok()))
        .collect();
    head_of_stream(parts.method.as_str(), parts.uri.path(), &headers)
}

/// Sends `reply` as the stream's response (headers, then the body).
fn send(respond: &mut h2::server::SendResponse<Bytes>, reply: Reply) {
    let mut response = http::Response::builder()
        .status(reply.status)
        .header("content-type", reply.content_type())
        .header("content-length", reply.body.len());
    if let Some(secs) = reply.retry_after {
        response = response.header("retry-after", secs);
    }
    if let Some(allow) = reply.allow() {
        response = response.header("allow", allow);
    }
    let Ok(response) = response.body(()) else {
        return respond.send_reset(h2::Reason::INTERNAL_ERROR);
    };
    let empty = reply.body.is_empty();
    match respond.send_response(response, empty) {
        Ok(mut stream) if !empty => {
            let _ = stream.send_data(Bytes::from(reply.body), true);
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "https: HTTP/2 response not sent"),
    }
}
