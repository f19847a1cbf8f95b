//! The client side of one connection: Hello, OpenSecureChannel, requests
//! and responses, token renewal - the mirror of [`crate::channel`], fed with
//! bytes and time.
//!
//! ```text
//!   new() ──(HEL)──> ExpectAcknowledge ──ACK──> (OPN Issue) ──> ExpectOpenResponse
//!                                                                   │ OPN response
//!                                                                   v
//!                  renewal at 75 % of the lifetime (OPN Renew) <─> Open ──MSG──> Event::Response
//!                                                                   │ ERR / CLO / error
//!                                                                   v
//!                                                               Closed(status)
//! ```
//!
//! Security: SecurityPolicy None; the crypto policies plug in at the OPN
//! and the chunk writer, as on the server side.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_types::{
    decode_message, encode_message, ByteString, CloseSecureChannelRequest, DecodeLimits,
    MessageSecurityMode, OpenSecureChannelRequest, OpenSecureChannelResponse, Reader,
    RequestHeader, SecurityTokenRequestType, StatusCode, UaString,
};

use crate::channel::Now;
use crate::chunk::{
    write_chunks, AsymmetricHeader, Chunk, SecurityHeader, SendLimits, SequenceNumbers,
};
use crate::error::ChannelError;
use crate::reassembly::{Assembled, Assembler, AssemblyLimits, ReassemblyBudget};
use crate::tcp::{Acknowledge, ErrorMessage, Hello, MessageHeader, MessageType, HEADER_LEN};

/// What the client asks for when it connects.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The endpoint URL sent in the Hello.
    pub endpoint_url: String,
    /// Largest chunk we receive. Default 65535.
    pub receive_buffer_size: u32,
    /// Largest chunk we send. Default 65535.
    pub send_buffer_size: u32,
    /// Largest response we accept; 0 = no limit. Default 16 MiB.
    pub max_message_size: u32,
    /// Most chunks per response; 0 = no limit. Default 4096.
    pub max_chunk_count: u32,
    /// The token lifetime asked for. Default 1 h (the server revises it).
    pub requested_lifetime: Duration,
    /// From connect to an open channel. Default 10 s.
    pub handshake_timeout: Duration,
    /// Decode limits for the OPN response.
    pub decode: DecodeLimits,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoint_url: String::new(),
            receive_buffer_size: 65535,
            send_buffer_size: 65535,
            max_message_size: 16 << 20,
            max_chunk_count: 4096,
            requested_lifetime: Duration::from_secs(3600),
            handshake_timeout: Duration::from_secs(10),
            decode: DecodeLimits::default(),
        }
    }
}

/// What the connection tells its driver.
#[derive(Debug, PartialEq)]
pub enum ClientEvent {
    /// The secure channel is open; requests can be sent.
    Opened {
        /// The channel id the server assigned.
        channel_id: u32,
    },
    /// The token was renewed.
    Renewed {
        /// The new token's id.
        token_id: u32,
    },
    /// A complete response (encoding id + body, undecoded).
    Response {
        /// The request it answers.
        request_id: u32,
        /// The message.
        body: Vec<u8>,
    },
    /// The server aborted a response (an `A` chunk); the request failed.
    Aborted {
        /// The request.
        request_id: u32,
        /// The status in the abort chunk.
        status: StatusCode,
    },
    /// The connection is over.
    Closed {
        /// Why (Good after our own CloseSecureChannel).
        status: StatusCode,
        /// The server's reason, when it sent an ERR.
        reason: String,
        /// The `RetryAfterMs=N` hint of a busy server.
        retry_after_ms: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Token {
    id: u32,
    renew_at: Instant,
}

#[derive(Debug)]
enum State {
    ExpectAcknowledge,
    ExpectOpenResponse {
        request_id: u32,
    },
    Open {
        current: Token,
        previous: Option<u32>,
        renewing: Option<u32>,
    },
    Closed(StatusCode),
}

/// The client side of one connection.
#[derive(Debug)]
pub struct ClientConnection {
    state: State,
    config: Arc<ClientConfig>,
    deadline: Option<Instant>,
    channel_id: u32,
    send_seq: SequenceNumbers,
    last_received: Option<u32>,
    next_request_id: u32,
    send_limits: SendLimits,
    assembler: Assembler,
    out: Vec<u8>,
    events: VecDeque<ClientEvent>,
}

fn peer(status: StatusCode, what: &'static str) -> ChannelError {
    ChannelError::Peer { status, what }
}

impl ClientConnection {
    /// A new connection: the Hello is queued for transmission.
    pub fn new(now: Now, config: Arc<ClientConfig>) -> Self {
        let mut out = Vec::new();
        Hello {
            protocol_version: 0,
            receive_buffer_size: config.receive_buffer_size,
            send_buffer_size: config.send_buffer_size,
            max_message_size: config.max_message_size,
            max_chunk_count: config.max_chunk_count,
            endpoint_url: UaString::from(config.endpoint_url.as_str()),
        }
        .encode_message(&mut out);
        let limits = AssemblyLimits {
            max_message_size: (config.max_message_size != 0)
                .then_some(config.max_message_size as usize),
            max_chunk_count: (config.max_chunk_count != 0).then_some(config.max_chunk_count),
            ..AssemblyLimits::default()
        };
        // A client's own budget: only its responses use it.
        let budget = ReassemblyBudget::new(config.max_message_size.max(1 << 20) as usize * 2, 100);
        ClientConnection {
            state: State::ExpectAcknowledge,
            deadline: Some(now.instant + config.handshake_timeout),
            channel_id: 0,
            send_seq: SequenceNumbers::starting_at(1),
            last_received: None,
            next_request_id: 1,
            send_limits: SendLimits {
                max_chunk_size: config.send_buffer_size as usize,
                max_message_size: 0,
                max_chunk_count: 0,
            },
            assembler: Assembler::new(limits, budget),
            config,
            out,
            events: VecDeque::new(),
        }
    }

    /// The secure channel id (0 until open).
    pub fn channel_id(&self) -> u32 {
        self.channel_id
    }

    /// True once the channel is open (and not closed).
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed(_))
    }

    /// The status it closed with, once closed.
    pub fn close_status(&self) -> Option<StatusCode> {
        match self.state {
            State::Closed(s) => Some(s),
            _ => None,
        }
    }

    fn take_request_id(&mut self) -> u32 {
        let id = self.next_request_id;
        self.next_request_id = self.next_request_id.wrapping_add(1).max(1);
        id
    }

    /// Sends a request message (encoding id + body); returns its request id.
    /// `BadRequestTooLarge` when it exceeds the server's limits (nothing is
    /// sent and the channel stays open).
    pub fn send_request(&mut self, message: &[u8]) -> Result<u32, ChannelError> {
        let State::Open { current, .. } = &self.state else {
            return Err(ChannelError::Resource {
                status: StatusCode::BadSecureChannelClosed,
                what: "channel is not open",
            });
        };
        let token = current.id;
        let request_id = self.take_request_id();
        write_chunks(
            &mut self.out,
            MessageType::Message,
            self.channel_id,
            &SecurityHeader::Symmetric(token),
            &mut self.send_seq,
            request_id,
            message,
            &self.send_limits,
        )
        .map_err(|_| ChannelError::Resource {
            status: StatusCode::BadRequestTooLarge,
            what: "request exceeds the server's limits",
        })?;
        Ok(request_id)
    }

    /// Closes the channel with a CloseSecureChannel message.
    pub fn close(&mut self, now: Now) {
        if let State::Open { current, .. } = self.state {
            let mut body = Vec::new();
            encode_message(
                &CloseSecureChannelRequest {
                    request_header: RequestHeader {
                        timestamp: now.utc,
                        ..Default::default()
                    },
                },
                &mut body,
            );
            let request_id = self.take_request_id();
            let _ = write_chunks(
                &mut self.out,
                MessageType::CloseSecureChannel,
                self.channel_id,
                &SecurityHeader::Symmetric(current.id),
                &mut self.send_seq,
                request_id,
                &body,
                &self.send_limits,
            );
        }
        self.closed(StatusCode::Good, String::new(), None);
    }

    fn closed(&mut self, status: StatusCode, reason: String, retry_after_ms: Option<u64>) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed(status);
        self.deadline = None;
        self.events.push_back(ClientEvent::Closed {
            status,
            reason,
            retry_after_ms,
        });
    }

    /// Feeds received bytes; complete messages are consumed from `input`.
    /// A protocol error closes the connection (an event says why).
    pub fn handle_input(&mut self, now: Now, input: &mut Vec<u8>) -> Result<(), ChannelError> {
        let mut consumed = 0;
        let max = self.config.receive_buffer_size.max(8192);
        let result = loop {
            if self.is_closed() {
                break Ok(());
            }
            let rest = input.get(consumed..).unwrap_or(&[]);
            let header = match MessageHeader::parse(rest, max) {
                Ok(Some(h)) => h,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let size = header.message_size as usize;
            let Some(msg) = rest.get(..size) else {
                break Ok(());
            };
            consumed += size;
            if let Err(e) = self.handle_message(now, &header, msg) {
                break Err(e);
            }
        };
        input.drain(..consumed.min(input.len()));
        if let Err(e) = &result {
            self.closed(e.status_code(), e.to_string(), None);
        }
        result
    }

    fn handle_message(
        &mut self,
        now: Now,
        header: &MessageHeader,
        msg: &[u8],
    ) -> Result<(), ChannelError> {
        let body = msg.get(HEADER_LEN..).unwrap_or(&[]);
        match (&self.state, header.message_type) {
            (_, MessageType::Error) => {
                let err = ErrorMessage::decode_body(body)?;
                let retry = err.retry_after_ms();
                let reason = err.reason.as_str().unwrap_or("").to_owned();
                self.closed(err.error, reason, retry);
                Ok(())
            }
            (State::ExpectAcknowledge, MessageType::Acknowledge) => {
                let ack = Acknowledge::decode_body(body)?;
                self.send_limits = SendLimits {
                    max_chunk_size: ack.receive_buffer_size.min(self.config.send_buffer_size)
                        as usize,
                    max_message_size: ack.max_message_size as usize,
                    max_chunk_count: ack.max_chunk_count as usize,
                };
                let request_id = self.send_open(now, SecurityTokenRequestType::Issue, 0)?;
                self.state = State::ExpectOpenResponse { request_id };
                Ok(())
            }
            (
                State::ExpectOpenResponse { .. } | State::Open { .. },
                MessageType::OpenSecureChannel,
            ) => self.handle_open_response(now, header, msg),
            (State::Open { .. }, MessageType::Message) => self.handle_response(now, header, msg),
            (State::Closed(_), _) => Ok(()),
            _ => Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "unexpected message type from the server",
            )),
        }
    }

    fn send_open(
        &mut self,
        now: Now,
        kind: SecurityTokenRequestType,
        channel_id: u32,
    ) -> Result<u32, ChannelError> {
        let mut body = Vec::new();
        encode_message(
            &OpenSecureChannelRequest {
                request_header: RequestHeader {
                    timestamp: now.utc,
                    timeout_hint: u32::try_from(self.config.handshake_timeout.as_millis())
                        .unwrap_or(u32::MAX),
                    ..Default::default()
                },
                client_protocol_version: 0,
                request_type: kind,
                security_mode: MessageSecurityMode::None,
                client_nonce: ByteString::new(vec![]),
                requested_lifetime: u32::try_from(self.config.requested_lifetime.as_millis())
                    .unwrap_or(u32::MAX),
            },
            &mut body,
        );
        let request_id = self.take_request_id();
        write_chunks(
            &mut self.out,
            MessageType::OpenSecureChannel,
            channel_id,
            &SecurityHeader::Asymmetric(AsymmetricHeader::none()),
            &mut self.send_seq,
            request_id,
            &body,
            &self.send_limits,
        )?;
        Ok(request_id)
    }

    fn check_sequence(&mut self, received: u32) -> Result<(), ChannelError> {
        if let Some(last) = self.last_received {
            if !SequenceNumbers::follows(last, received) {
                return Err(peer(
                    StatusCode::BadSequenceNumberInvalid,
                    "server sequence number out of order",
                ));
            }
        }
        self.last_received = Some(received);
        Ok(())
    }

    fn handle_open_response(
        &mut self,
        now: Now,
        header: &MessageHeader,
        msg: &[u8],
    ) -> Result<(), ChannelError> {
        let chunk = Chunk::parse(header, msg)?;
        self.check_sequence(chunk.sequence_number)?;
        let expected = match self.state {
            State::ExpectOpenResponse { request_id } => Some(request_id),
            State::Open { renewing, .. } => renewing,
            _ => None,
        };
        if expected != Some(chunk.request_id) {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "OpenSecureChannel response to no request",
            ));
        }
        let mut r = Reader::new(chunk.body, &self.config.decode).map_err(ChannelError::decode)?;
        let m = decode_message(&mut r).map_err(ChannelError::decode)?;
        let Some(resp) = m.as_any().downcast_ref::<OpenSecureChannelResponse>() else {
            let status = m
                .as_any()
                .downcast_ref::<uascale_types::ServiceFault>()
                .map_or(StatusCode::BadTcpMessageTypeInvalid, |f| {
                    f.response_header.service_result
                });
            return Err(peer(status, "OpenSecureChannel refused"));
        };
        if resp.response_header.service_result.is_bad() {
            return Err(peer(
                resp.response_header.service_result,
                "OpenSecureChannel refused",
            ));
        }
        let t = &resp.security_token;
        let lifetime = Duration::from_millis(u64::from(t.revised_lifetime.max(1000)));
        let token = Token {
            id: t.token_id,
            renew_at: now.instant + lifetime * 3 / 4,
        };
        match &mut self.state {
            State::Open {
                current,
                previous,
                renewing,
            } => {
                *previous = Some(current.id);
                *current = token;
                *renewing = None;
                self.events
                    .push_back(ClientEvent::Renewed { token_id: token.id });
            }
            _ => {
                self.channel_id = t.channel_id;
                self.state = State::Open {
                    current: token,
                    previous: None,
                    renewing: None,
                };
                self.deadline = None;
                self.events.push_back(ClientEvent::Opened {
                    channel_id: t.channel_id,
                });
            }
        }
        Ok(())
    }

    fn handle_response(
        &mut self,
        now: Now,
        header: &MessageHeader,
        msg: &[u8],
    ) -> Result<(), ChannelError> {
        let chunk = Chunk::parse(header, msg)?;
        if chunk.channel_id != self.channel_id {
            return Err(peer(
                StatusCode::BadSecureChannelIdInvalid,
                "response for another channel",
            ));
        }
        let SecurityHeader::Symmetric(token_id) = chunk.security else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "MSG without token",
            ));
        };
        if let State::Open {
            current, previous, ..
        } = &self.state
        {
            if token_id != current.id && Some(token_id) != *previous {
                return Err(peer(
                    StatusCode::BadSecureChannelTokenUnknown,
                    "response with an unknown token",
                ));
            }
        }
        self.check_sequence(chunk.sequence_number)?;
        let request_id = chunk.request_id;
        match self
            .assembler
            .push(now.instant, request_id, chunk.chunk_type, chunk.body, true)?
        {
            Assembled::Incomplete => {}
            Assembled::Complete { request_id, body } => {
                self.events
                    .push_back(ClientEvent::Response { request_id, body });
            }
            Assembled::Aborted { request_id } => {
                let status = ErrorMessage::decode_body(chunk.body)
                    .map_or(StatusCode::BadCommunicationError, |e| e.error);
                self.events
                    .push_back(ClientEvent::Aborted { request_id, status });
            }
        }
        Ok(())
    }

    /// Appends the bytes to send to `buf`; false when there are none.
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> bool {
        if self.out.is_empty() {
            return false;
        }
        buf.append(&mut self.out);
        true
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// When [`ClientConnection::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let renew = match &self.state {
            State::Open {
                current,
                renewing: None,
                ..
            } => Some(current.renew_at),
            _ => None,
        };
        [self.deadline, renew, self.assembler.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the timers due at `now`: the handshake deadline, token renewal.
    pub fn handle_timeout(&mut self, now: Now) {
        if self.deadline.is_some_and(|d| d <= now.instant) {
            self.closed(
                StatusCode::BadTimeout,
                "no open secure channel in time".into(),
                None,
            );
            return;
        }
        if let State::Open {
            current,
            renewing: None,
            ..
        } = self.state
        {
            if current.renew_at <= now.instant {
                match self.send_open(now, SecurityTokenRequestType::Renew, self.channel_id) {
                    Ok(id) => {
                        if let State::Open { renewing, .. } = &mut self.state {
                            *renewing = Some(id);
                        }
                    }
                    Err(e) => self.closed(e.status_code(), e.to_string(), None),
                }
            }
        }
        for request_id in self.assembler.handle_timeout(now.instant) {
            self.events.push_back(ClientEvent::Aborted {
                request_id,
                status: StatusCode::BadTimeout,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{ChannelConfig, Event, PendingConnection, ServerConnection};
    use uascale_types::DateTime;

    fn at(t0: Instant, ms: u64) -> Now {
        Now {
            instant: t0 + Duration::from_millis(ms),
            utc: DateTime::from_ticks(1),
        }
    }

    /// Moves bytes both ways until neither side has anything to send.
    fn pump(c: &mut ClientConnection, s: &mut ServerConnection, now: Now) {
        loop {
            let mut a = Vec::new();
            let mut b = Vec::new();
            let moved = c.poll_transmit(&mut a) | s.poll_transmit(&mut b);
            if !moved {
                break;
            }
            if !a.is_empty() {
                let _ = s.handle_input(now, &mut a);
            }
            if !b.is_empty() {
                let _ = c.handle_input(now, &mut b);
            }
        }
    }

    fn pair(t0: Instant, server: ChannelConfig) -> (ClientConnection, ServerConnection) {
        let c = ClientConnection::new(
            at(t0, 0),
            Arc::new(ClientConfig {
                endpoint_url: "opc.tcp://test".into(),
                requested_lifetime: Duration::from_secs(20),
                ..Default::default()
            }),
        );
        let s = PendingConnection::new().accept(
            at(t0, 0),
            7,
            Arc::new(server),
            ReassemblyBudget::new(1 << 20, 50),
        );
        (c, s)
    }

    #[test]
    fn opens_sends_requests_and_renews_against_the_server_side() {
        // One real instant as the origin of simulated time.
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let (mut c, mut s) = pair(t0, ChannelConfig::default());
        pump(&mut c, &mut s, at(t0, 0));
        assert_eq!(c.poll_event(), Some(ClientEvent::Opened { channel_id: 7 }));
        // A request larger than one chunk, answered with a large response.
        let big = vec![0xAB; 200_000];
        let id = c.send_request(&big).unwrap();
        pump(&mut c, &mut s, at(t0, 1));
        let got = std::iter::from_fn(|| s.poll_event())
            .find_map(|e| match e {
                Event::Request { request_id, body } => Some((request_id, body)),
                _ => None,
            })
            .unwrap();
        assert_eq!(got.0, id);
        assert_eq!(got.1, big);
        s.send_response(id, &big[..150_000]).unwrap();
        pump(&mut c, &mut s, at(t0, 2));
        assert_eq!(
            c.poll_event(),
            Some(ClientEvent::Response {
                request_id: id,
                body: big[..150_000].to_vec()
            })
        );
        // Renewal at 75 % of the 20 s lifetime; requests go on after it.
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(15)));
        c.handle_timeout(at(t0, 15_000));
        pump(&mut c, &mut s, at(t0, 15_000));
        assert_eq!(c.poll_event(), Some(ClientEvent::Renewed { token_id: 2 }));
        let id = c.send_request(b"x").unwrap();
        pump(&mut c, &mut s, at(t0, 15_001));
        assert!(std::iter::from_fn(|| s.poll_event())
            .any(|e| matches!(e, Event::Request { request_id, .. } if request_id == id)));
        assert!(!s.is_closed());
        // Close: the server sees a CloseSecureChannel.
        c.close(at(t0, 15_002));
        pump(&mut c, &mut s, at(t0, 15_002));
        assert_eq!(s.close_status(), Some(StatusCode::Good));
        assert!(matches!(
            c.poll_event(),
            Some(ClientEvent::Closed {
                status: StatusCode::Good,
                ..
            })
        ));
    }

    #[test]
    fn a_busy_refusal_reports_the_retry_hint() {
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let mut c = ClientConnection::new(at(t0, 0), Arc::new(ClientConfig::default()));
        let mut hello = Vec::new();
        c.poll_transmit(&mut hello);
        let mut refusal = PendingConnection::new()
            .refuse(StatusCode::BadTcpServerTooBusy, "busy; RetryAfterMs=1500");
        c.handle_input(at(t0, 1), &mut refusal).unwrap();
        assert_eq!(
            c.poll_event(),
            Some(ClientEvent::Closed {
                status: StatusCode::BadTcpServerTooBusy,
                reason: "busy; RetryAfterMs=1500".into(),
                retry_after_ms: Some(1500),
            })
        );
        assert!(c.send_request(b"x").is_err());
    }

    #[test]
    fn no_answer_to_the_handshake_times_out() {
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let mut c = ClientConnection::new(at(t0, 0), Arc::new(ClientConfig::default()));
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(10)));
        c.handle_timeout(at(t0, 10_000));
        assert!(matches!(
            c.poll_event(),
            Some(ClientEvent::Closed {
                status: StatusCode::BadTimeout,
                ..
            })
        ));
    }

    #[test]
    fn garbage_from_the_server_closes() {
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let mut c = ClientConnection::new(at(t0, 0), Arc::new(ClientConfig::default()));
        let mut junk = b"MSGF\x10\x00\x00\x00garbage!".to_vec();
        assert!(c.handle_input(at(t0, 1), &mut junk).is_err());
        assert!(c.is_closed());
    }
}
