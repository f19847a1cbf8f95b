//! The server side of one connection: UACP handshake, then the secure
//! channel (Part 6 §6.7, §7.1), as a state machine fed with bytes and time.
//!
//! ```text
//!   TCP accept ──> PendingConnection ──refuse(status)──> ERR, close
//!                        │ accept()
//!                        v
//!                  ExpectHello ──HEL──> (ACK) ──> ExpectOpenSecureChannel
//!                                                     │ OPN Issue
//!                                                     v
//!         OPN Renew (new token; old one accepted ─> Open ──MSG──> Event::Request
//!         until the new one is used or expires)       │ CLO / error / token expiry
//!                                                     v
//!                                                 Closed(status)
//! ```
//!
//! Every protocol violation ends in an ERR message with the matching status
//! and [`Event::Closed`]; other connections are untouched because nothing is
//! shared but the reassembly budget.
//!
//! Security: the policies and modes of [`ServerSecurity::endpoints`]. An OPN
//! of a secured policy is checked in this order, cheapest first: policy
//! offered, receiver thumbprint is ours, sender certificate parses and its
//! key size fits the policy, the validator trusts it (Issue) or it is the
//! channel's (Renew); then decrypted with our key, its signature verified,
//! the mode and nonce checked. Symmetric keys are derived once per token;
//! every MSG/CLO chunk is verified (and decrypted) in place before
//! reassembly, every outgoing chunk padded, signed and encrypted. After a
//! renewal the server keeps answering with the old token until the client
//! uses the new one (Part 4 §5.5.2.1), and accepts the old one until then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_crypto::ecc::{EphemeralKey, Secret};
use uascale_crypto::policy::{derive_keys, ChannelKeys, SecurityPolicy};
use uascale_crypto::x509::{Certificate, PeerCertificate};
use uascale_types::{
    decode_message, encode_message, ByteString, ChannelSecurityToken, CloseSecureChannelRequest,
    DateTime, DecodeLimits, MessageSecurityMode, OpenSecureChannelRequest,
    OpenSecureChannelResponse, Reader, ResponseHeader, SecurityTokenRequestType, StatusCode,
    UaString,
};

use crate::chunk::{
    parse_security_header, write_chunks_protected, AsymmetricHeader, Chunk, SecurityHeader,
    SendLimits, SequenceNumbers,
};
use crate::error::ChannelError;
use crate::reassembly::{Assembled, Assembler, AssemblyLimits, ReassemblyBudget};
use crate::security::{
    ecc_token_keys, leaf_certificate, open_asymmetric, open_asymmetric_ecc, open_symmetric,
    ChannelSecurity, Identity, Protection, PublicKey, ServerSecurity,
};
use crate::tcp::{
    next_message, ErrorMessage, Hello, MessageHeader, MessageType, Negotiated, TransportLimits,
    HEADER_LEN,
};

/// The time a step runs at: a monotonic instant for deadlines and the UTC
/// time for timestamps on the wire. The caller reads both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic time.
    pub instant: Instant,
    /// Wall-clock time.
    pub utc: DateTime,
}

/// Configuration of the server side of connections.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Buffer and message limits offered in the Acknowledge.
    pub transport: TransportLimits,
    /// Time from accept to Hello, and from Acknowledge to OpenSecureChannel.
    /// Default 10 s: long enough for a slow client, short enough that idle
    /// sockets do not pile up during a storm.
    pub handshake_timeout: Duration,
    /// Bounds for the revised token lifetime. Default 10 s ..= 1 h.
    pub min_token_lifetime: Duration,
    /// See `min_token_lifetime`.
    pub max_token_lifetime: Duration,
    /// Reassembly deadline and in-progress limit (sizes come from `transport`).
    pub assembly: AssemblyLimits,
    /// Decode limits for request bodies.
    pub decode: DecodeLimits,
    /// Certificate, key, offered (policy, mode) pairs and the client
    /// certificate validator.
    pub security: ServerSecurity,
    /// Whether a Hello's Acknowledge waits for the driver's word: the
    /// connection reports [`Event::Hello`] and sends nothing until
    /// [`ServerConnection::acknowledge`] (or closes on
    /// [`ServerConnection::close_with`]), so a server that is busy can
    /// refuse the Hello before the client spends any work on its
    /// OpenSecureChannel. A message that comes before the word (a client
    /// that did not wait for the Acknowledge) acknowledges it first.
    /// Default off: the Acknowledge goes out at once.
    pub hold_acknowledge: bool,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            transport: TransportLimits::default(),
            handshake_timeout: Duration::from_secs(10),
            min_token_lifetime: Duration::from_secs(10),
            max_token_lifetime: Duration::from_secs(3600),
            assembly: AssemblyLimits::default(),
            decode: DecodeLimits::default(),
            security: ServerSecurity::default(),
            hold_acknowledge: false,
        }
    }
}

/// What the connection tells its driver.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// A valid Hello whose Acknowledge waits for the driver
    /// ([`ChannelConfig::hold_acknowledge`]): acknowledge it, or close.
    Hello,
    /// The secure channel is open.
    Opened {
        /// Its id.
        channel_id: u32,
    },
    /// A token was renewed.
    Renewed {
        /// The new token's id.
        token_id: u32,
    },
    /// A complete service request: the encoding id and body, undecoded.
    Request {
        /// The request id to answer with.
        request_id: u32,
        /// The message (encoding NodeId + body).
        body: Vec<u8>,
    },
    /// The connection is over; flush the transmit buffer, then close.
    Closed {
        /// Good for a CloseSecureChannel, else why.
        status: StatusCode,
    },
}

/// A TCP connection that admission has not decided on yet: nothing has been
/// read from it and no work has been spent.
#[derive(Debug)]
pub struct PendingConnection {
    _private: (),
}

impl PendingConnection {
    /// A new connection from the listener.
    pub fn new() -> Self {
        PendingConnection { _private: () }
    }

    /// Admits it: the connection now expects a Hello.
    pub fn accept(
        self,
        now: Now,
        channel_id: u32,
        config: Arc<ChannelConfig>,
        budget: Arc<ReassemblyBudget>,
    ) -> ServerConnection {
        ServerConnection {
            state: State::ExpectHello,
            deadline: Some(now.instant + config.handshake_timeout),
            channel_id,
            assembler: Assembler::new(config.assembly, budget),
            config,
            negotiated: None,
            out: Vec::new(),
            events: Vec::new(),
            events_taken: 0,
            activated: false,
            sparse: false,
            security: ChannelSecurity::none(),
        }
    }

    /// Refuses it with an ERR message (e.g. `BadTcpServerTooBusy` with
    /// `RetryAfterMs=N` in the reason); returns the bytes to send before
    /// closing.
    pub fn refuse(self, status: StatusCode, reason: &str) -> Vec<u8> {
        let mut out = Vec::new();
        ErrorMessage {
            error: status,
            reason: UaString::from(reason),
        }
        .encode_message(&mut out);
        out
    }
}

impl Default for PendingConnection {
    fn default() -> Self {
        Self::new()
    }
}

/// A secured OPN, opened.
struct Secured {
    /// The plain chunk (decrypted for RSA), without padding and signature.
    plain: Vec<u8>,
    cert: Arc<PeerCertificate>,
    key: PublicKey,
    /// Our certificate and key for this policy.
    identity: Arc<Identity>,
    /// The request's signature (ECC: signed into the first OPN response
    /// under SecureChannelEnhancements).
    request_signature: Vec<u8>,
}

/// An OpenSecureChannel request taken from a connection's input, opened
/// (for RSA decrypted, its signature verified) and checked, whose answer is
/// still to be built: what [`ServerConnection::receive_open`] hands to
/// [`ServerConnection::answer_open`]. Receiving does the private-key
/// decryptions of an RSA handshake, answering the signature of the
/// response (ECC: the signature check, then the key agreement and the
/// signature), so a driver can run them as two steps.
pub struct ReceivedOpen {
    policy: SecurityPolicy,
    /// `None` under SecurityPolicy None.
    secured: Option<Secured>,
    request_id: u32,
    sequence_number: u32,
    request_handle: u32,
    security_mode: MessageSecurityMode,
    client_nonce: Vec<u8>,
    lifetime: Duration,
    token_id: u32,
    first_seq: SequenceNumbers,
}

impl std::fmt::Debug for ReceivedOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceivedOpen")
            .field("policy", &self.policy)
            .field("request_id", &self.request_id)
            .field("token_id", &self.token_id)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Token {
    id: u32,
    expires: Instant,
    /// Both directions' keys; None under SecurityPolicy None.
    keys: Option<Box<ChannelKeys>>,
}

#[derive(Debug)]
struct Open {
    current: Token,
    /// The token before a renewal, until the client uses the new one or
    /// it expires (boxed: a channel has one only for moments).
    previous: Option<Box<Token>>,
    last_received: u32,
    send_seq: SequenceNumbers,
    /// ECC with SecureChannelEnhancements: the input keying material of
    /// the current token, chained into the next renewal's (boxed: most
    /// channels have none).
    ikm: Option<Box<Secret>>,
}

/// Where a connection is; each state is named after what it waits for.
#[derive(Debug)]
enum State {
    ExpectHello,
    /// A Hello came and its Acknowledge waits for the driver
    /// ([`ChannelConfig::hold_acknowledge`]); with the `RetryTicket` of
    /// its endpoint URL, if any.
    HelloHeld(Option<Box<str>>),
    /// With the `RetryTicket` of the Hello's endpoint URL, if any (what a
    /// client refused busy echoes; the server's admission reads it).
    ExpectOpenSecureChannel(Option<Box<str>>),
    Open(Open),
    Closed(StatusCode),
}

/// A channel that received no message for this long drops the AES key
/// schedules its CBC keys built (about 500 bytes for both directions); its next
/// message builds them again, which costs a fraction of a microsecond. A
/// quiet session - a subscription whose keep-alives come every few
/// seconds, a client polling now and then - is most of the time without
/// them.
pub const KEY_SCHEDULE_IDLE: Duration = Duration::from_secs(2);

/// How far the quiet deadline may lag behind the last message before it
/// is moved: the connection's timer is moved at most this often, not at
/// every message.
const KEY_SCHEDULE_SLACK: Duration = Duration::from_millis(250);

/// A request that comes this long after the quiet deadline last moved (so
/// at least `KEY_SCHEDULE_SPARSE - KEY_SCHEDULE_SLACK`, 250 ms, after the
/// previous request) marks the channel sparse: the AES key schedule each
/// direction builds is dropped right after use, for that request and for
/// the answers sent until the next request. A subscription publishing
/// every second then holds no schedule between its Publish round trips
/// (about 500 bytes less per session) for two schedule builds per round
/// trip (a fraction of a microsecond each); a channel busier than a few requests a second keeps
/// them until it goes quiet ([`KEY_SCHEDULE_IDLE`]).
pub const KEY_SCHEDULE_SPARSE: Duration = Duration::from_millis(500);

/// The server side of one connection.
#[derive(Debug)]
pub struct ServerConnection {
    state: State,
    /// Before the channel opens, the handshake's deadline; once it is
    /// open, when its AES key schedules are dropped if no message came
    /// (see [`KEY_SCHEDULE_IDLE`]).
    deadline: Option<Instant>,
    channel_id: u32,
    config: Arc<ChannelConfig>,
    negotiated: Option<Negotiated>,
    assembler: Assembler,
    out: Vec<u8>,
    /// Events in order; those before `events_taken` were taken already.
    /// (A `Vec` and an index rather than a `VecDeque`: 8 bytes less in
    /// every connection.)
    events: Vec<Option<Event>>,
    events_taken: u32,
    activated: bool,
    /// The last request came long after the one before it
    /// ([`KEY_SCHEDULE_SPARSE`]): key schedules are dropped after use.
    sparse: bool,
    security: ChannelSecurity,
}

fn peer(status: StatusCode, what: &'static str) -> ChannelError {
    ChannelError::Peer { status, what }
}

/// Replayed, skipped or reordered sequence numbers end the channel.
fn check_sequence(legacy: bool, last: u32, received: u32) -> Result<(), ChannelError> {
    if SequenceNumbers::follows_in(legacy, last, received) {
        Ok(())
    } else {
        Err(peer(
            StatusCode::BadSequenceNumberInvalid,
            "sequence number out of order",
        ))
    }
}

/// The value of `RetryTicket=` in the query of the Hello's endpoint URL
/// (at most 64 bytes; anything longer is no ticket).
fn retry_ticket(hello: &Hello) -> Option<Box<str>> {
    let url = hello.endpoint_url.as_str()?;
    let (_, query) = url.split_once('?')?;
    let t = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("RetryTicket="))?;
    (!t.is_empty() && t.len() <= 64).then(|| t.into())
}

impl ServerConnection {
    /// The `RetryTicket` the client put in its Hello's endpoint URL query,
    /// while the channel waits for its first OpenSecureChannel.
    pub fn hello_retry_ticket(&self) -> Option<&str> {
        match &self.state {
            State::HelloHeld(t) | State::ExpectOpenSecureChannel(t) => t.as_deref(),
            _ => None,
        }
    }

    /// Whether a Hello's Acknowledge waits for [`Self::acknowledge`]
    /// ([`ChannelConfig::hold_acknowledge`]).
    pub fn is_hello_held(&self) -> bool {
        matches!(self.state, State::HelloHeld(_))
    }

    /// Sends the Acknowledge of a held Hello (nothing otherwise): the
    /// connection now expects its OpenSecureChannel.
    pub fn acknowledge(&mut self) {
        let State::HelloHeld(ticket) = &mut self.state else {
            return;
        };
        let ticket = ticket.take();
        if let Some(n) = self.negotiated {
            crate::tcp::Acknowledge {
                protocol_version: crate::tcp::PROTOCOL_VERSION,
                receive_buffer_size: n.receive_buffer_size,
                send_buffer_size: n.send_buffer_size,
                max_message_size: n.recv_max_message_size,
                max_chunk_count: n.recv_max_chunk_count,
            }
            .encode_message(&mut self.out);
        }
        self.state = State::ExpectOpenSecureChannel(ticket);
    }

    /// The secure channel id.
    pub fn channel_id(&self) -> u32 {
        self.channel_id
    }

    /// What the channel is secured with: policy, mode and the client's
    /// certificate (SecurityPolicy None until an OPN succeeded).
    pub fn security(&self) -> &ChannelSecurity {
        &self.security
    }

    /// The status it closed with, once closed.
    pub fn close_status(&self) -> Option<StatusCode> {
        match self.state {
            State::Closed(s) => Some(s),
            _ => None,
        }
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed(_))
    }

    /// Marks that the channel now carries an activated session (it may then
    /// use the whole reassembly budget).
    pub fn set_session_activated(&mut self, activated: bool) {
        self.activated = activated;
    }

    /// Whether handling `input` would do asymmetric (RSA) work: it holds a
    /// complete OpenSecureChannel message of a secured policy. Cheap (the
    /// message headers only), so the driver can ask admission for a
    /// handshake place (and move that work off its event loop, if it
    /// wants) before anything is decrypted or verified.
    pub fn has_asymmetric_work(&self, input: &[u8]) -> bool {
        if matches!(self.state, State::Closed(_)) {
            return false;
        }
        let max = self
            .negotiated
            .map_or(self.config.transport.receive_buffer_size, |n| {
                n.receive_buffer_size
            });
        let mut at = 0;
        while let Some(rest) = input.get(at..) {
            let Ok(Some(header)) = MessageHeader::parse(rest, max) else {
                return false;
            };
            let size = header.message_size as usize;
            let Some(msg) = rest.get(..size) else {
                return false;
            };
            if header.message_type == MessageType::OpenSecureChannel {
                return match parse_security_header(&header, msg) {
                    Ok((_, SecurityHeader::Asymmetric(a), _)) => a
                        .policy_uri
                        .as_str()
                        .and_then(SecurityPolicy::from_uri)
                        .is_some_and(|p| !p.is_none()),
                    _ => false,
                };
            }
            at += size.max(1);
        }
        false
    }

    /// Feeds received bytes. Complete messages are consumed from the front
    /// of `input`; a partial message stays there for the next call.
    ///
    /// On a protocol error the connection queues an ERR, moves to Closed,
    /// emits [`Event::Closed`] and returns the error (for logging).
    pub fn handle_input(&mut self, now: Now, input: &mut Vec<u8>) -> Result<(), ChannelError> {
        self.take_input(now, input, false).map(|_| ())
    }

    /// As [`Self::handle_input`], but stops at the first secured
    /// OpenSecureChannel request in `input`: it is taken from `input`,
    /// opened and checked, and returned without its answer, which
    /// [`Self::answer_open`] builds and queues. `None`: `input` held none
    /// (everything was handled as by `handle_input`). In between, the
    /// connection must get no other input. On an error the connection is
    /// closed as by `handle_input`.
    pub fn receive_open(
        &mut self,
        now: Now,
        input: &mut Vec<u8>,
    ) -> Result<Option<ReceivedOpen>, ChannelError> {
        self.take_input(now, input, true)
    }

    /// Answers an OpenSecureChannel request [`Self::receive_open`] returned:
    /// derives the token's keys, signs (and encrypts) the response and
    /// opens or renews the channel. On an error the connection is closed
    /// as by [`Self::handle_input`].
    pub fn answer_open(&mut self, now: Now, received: ReceivedOpen) -> Result<(), ChannelError> {
        let result = if self.is_closed() {
            Ok(())
        } else {
            self.open_answer(now, received)
        };
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    /// Handles the messages in `input`; with `split`, stops after
    /// receiving a secured OPN and returns it unanswered.
    fn take_input(
        &mut self,
        now: Now,
        input: &mut Vec<u8>,
        split: bool,
    ) -> Result<Option<ReceivedOpen>, ChannelError> {
        let mut consumed = 0;
        let result = loop {
            if self.is_closed() {
                break Ok(None);
            }
            let max = self
                .negotiated
                .map_or(self.config.transport.receive_buffer_size, |n| {
                    n.receive_buffer_size
                });
            let rest = input.get_mut(consumed..).unwrap_or_default();
            let (header, msg) = match next_message(rest, max) {
                Ok(Some(m)) => m,
                Ok(None) => break Ok(None),
                Err(e) => break Err(e),
            };
            consumed += msg.len();
            match self.handle_message(now, &header, msg, split) {
                Ok(None) => {}
                Ok(Some(received)) => break Ok(Some(received)),
                Err(e) => break Err(e),
            }
        };
        input.drain(..consumed.min(input.len()));
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    fn fail(&mut self, e: &ChannelError) {
        self.close_with(e.status_code(), &e.to_string());
    }

    fn close(&mut self, status: StatusCode) {
        self.state = State::Closed(status);
        self.deadline = None;
        self.events.push(Some(Event::Closed { status }));
    }

    /// Handles one message; with `split`, a secured OPN is only received
    /// and returned.
    fn handle_message(
        &mut self,
        now: Now,
        header: &MessageHeader,
        msg: &mut [u8],
        split: bool,
    ) -> Result<Option<ReceivedOpen>, ChannelError> {
        // A client that did not wait for a held Acknowledge gets it now,
        // before the answer to what it sent.
        self.acknowledge();
        match (&self.state, header.message_type) {
            (State::ExpectHello, MessageType::Hello) => {
                let hello = Hello::decode_body(msg.get(HEADER_LEN..).unwrap_or(&[]))?;
                let (ack, negotiated) = self.config.transport.negotiate(&hello)?;
                if !self.config.hold_acknowledge {
                    ack.encode_message(&mut self.out);
                }
                let mut limits = self.config.assembly;
                limits.max_message_size = (negotiated.recv_max_message_size != 0)
                    .then_some(negotiated.recv_max_message_size as usize);
                limits.max_chunk_count = (negotiated.recv_max_chunk_count != 0)
                    .then_some(negotiated.recv_max_chunk_count);
                self.assembler.set_limits(limits);
                self.negotiated = Some(negotiated);
                self.state = if self.config.hold_acknowledge {
                    self.events.push(Some(Event::Hello));
                    State::HelloHeld(retry_ticket(&hello))
                } else {
                    State::ExpectOpenSecureChannel(retry_ticket(&hello))
                };
                self.deadline = Some(now.instant + self.config.handshake_timeout);
                Ok(None)
            }
            (State::ExpectHello, _) => {
                Err(peer(StatusCode::BadTcpMessageTypeInvalid, "expected Hello"))
            }
            (_, MessageType::Hello) => {
                Err(peer(StatusCode::BadTcpMessageTypeInvalid, "second Hello"))
            }
            (_, MessageType::Acknowledge | MessageType::ReverseHello | MessageType::Error) => {
                Err(peer(
                    StatusCode::BadTcpMessageTypeInvalid,
                    "client sent a server message",
                ))
            }
            (_, MessageType::OpenSecureChannel) => {
                let received = self.open_receive(header, msg)?;
                if split && received.secured.is_some() {
                    return Ok(Some(received));
                }
                self.open_answer(now, received).map(|()| None)
            }
            (State::HelloHeld(_) | State::ExpectOpenSecureChannel(_), _) => Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "expected OpenSecureChannel",
            )),
            (State::Open(_), MessageType::Message | MessageType::CloseSecureChannel) => {
                self.handle_symmetric(now, header, msg).map(|()| None)
            }
            (State::Closed(_), _) => Ok(None),
        }
    }

    /// Checks the asymmetric header of a secured OPN and opens the chunk:
    /// returns the decrypted (RSA) or verified (ECC) chunk and the
    /// sender's certificate and key.
    fn open_secured(
        &self,
        policy: SecurityPolicy,
        asym: &AsymmetricHeader,
        msg: &[u8],
        head_len: usize,
    ) -> Result<Secured, ChannelError> {
        let config = &self.config.security;
        let Some(identity) = config.identity_for(policy) else {
            return Err(ChannelError::Resource {
                status: StatusCode::BadSecurityPolicyRejected,
                what: "no server certificate configured for a secured policy",
            });
        };
        if asym.receiver_thumbprint.as_bytes() != Some(&identity.thumbprint()[..]) {
            return Err(peer(
                StatusCode::BadSecurityChecksFailed,
                "receiver thumbprint is not the server certificate's",
            ));
        }
        let chain = asym.sender_certificate.as_bytes().unwrap_or_default();
        let leaf = leaf_certificate(chain)?;
        let (cert, key) = match (&self.state, &self.security.remote_certificate) {
            (State::Open(_), Some(known)) => {
                if !known.is(leaf) {
                    return Err(peer(
                        StatusCode::BadSecurityChecksFailed,
                        "renewal with another certificate",
                    ));
                }
                let key = self.security.remote_public_key()?.ok_or(peer(
                    StatusCode::BadSecurityChecksFailed,
                    "renewal on a channel without a key",
                ))?;
                (Arc::clone(known), key)
            }
            (State::Open(_), None) => {
                return Err(peer(
                    StatusCode::BadSecurityPolicyRejected,
                    "renewal with another security policy",
                ))
            }
            _ => {
                let cert = Certificate::from_der(leaf)?;
                let key = PublicKey::of_certificate(&cert, policy)?;
                let Some(validator) = &config.validator else {
                    return Err(peer(
                        StatusCode::BadCertificateUntrusted,
                        "no client certificates are trusted",
                    ));
                };
                validator.validate(&cert, chain, policy)?;
                // The parsed certificate is dropped here; the channel keeps
                // what it needs later (ECC policies sign over the DER).
                let curve = key.ecc().map(|k| k.curve());
                (Arc::new(PeerCertificate::new(&cert, curve)), key)
            }
        };
        let (plain, request_signature) = match (&key, identity.rsa_key()) {
            (PublicKey::Rsa(k), Some(local)) => (
                open_asymmetric(policy, local, k, msg, head_len)?,
                Vec::new(),
            ),
            (PublicKey::Ecc(k), None) => {
                let at = open_asymmetric_ecc(policy, k, msg, head_len, &[])?;
                (
                    msg.get(..at).unwrap_or_default().to_vec(),
                    msg.get(at..).unwrap_or_default().to_vec(),
                )
            }
            _ => {
                return Err(peer(
                    StatusCode::BadSecurityPolicyRejected,
                    "certificate kinds do not match the security policy",
                ))
            }
        };
        Ok(Secured {
            plain,
            cert,
            key,
            identity: Arc::clone(identity),
            request_signature,
        })
    }

    /// Receives an OPN: its security header checked, the chunk opened
    /// (decrypted, its signature verified), the request decoded and
    /// checked against the channel's state. Changes nothing.
    fn open_receive(
        &self,
        header: &MessageHeader,
        msg: &[u8],
    ) -> Result<ReceivedOpen, ChannelError> {
        let (_, security, head_len) = parse_security_header(header, msg)?;
        let SecurityHeader::Asymmetric(asym) = &security else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "OPN without asymmetric header",
            ));
        };
        let policy = asym
            .policy_uri
            .as_str()
            .and_then(SecurityPolicy::from_uri)
            // None is always accepted for a channel: a client must be able
            // to discover the endpoints of a server that offers no None
            // endpoint. The server serves only discovery on such a channel
            // (its dispatcher refuses the rest).
            .filter(|p| p.is_none() || self.config.security.offers_policy(*p))
            .ok_or(peer(
                StatusCode::BadSecurityPolicyRejected,
                "security policy not supported by this endpoint",
            ))?;
        if let State::Open(_) = self.state {
            if policy != self.security.policy {
                return Err(peer(
                    StatusCode::BadSecurityPolicyRejected,
                    "renewal with another security policy",
                ));
            }
        }
        let secured = if policy.is_none() {
            None
        } else {
            Some(self.open_secured(policy, asym, msg, head_len)?)
        };
        let plain = secured.as_ref().map_or(msg, |sec| sec.plain.as_slice());
        let chunk = Chunk::parse(header, plain)?;
        let limits = &self.config.decode;
        let mut r = Reader::new(chunk.body, limits).map_err(ChannelError::decode)?;
        let decoded = decode_message(&mut r).map_err(ChannelError::decode)?;
        let Some(req) = decoded.as_any().downcast_ref::<OpenSecureChannelRequest>() else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "OPN body is not an OpenSecureChannelRequest",
            ));
        };
        let lifetime = Duration::from_millis(u64::from(req.requested_lifetime)).clamp(
            self.config.min_token_lifetime,
            self.config.max_token_lifetime,
        );
        let (token_id, first_seq) = match (&self.state, req.request_type) {
            (State::ExpectOpenSecureChannel(_), SecurityTokenRequestType::Issue) => {
                if chunk.channel_id != 0 && chunk.channel_id != self.channel_id {
                    return Err(peer(
                        StatusCode::BadSecureChannelIdInvalid,
                        "unknown secure channel id",
                    ));
                }
                // None/None always opens (discovery; see the policy check).
                let discovery = policy.is_none() && req.security_mode == MessageSecurityMode::None;
                if !discovery && !self.config.security.offers(policy, req.security_mode) {
                    return Err(peer(
                        StatusCode::BadSecurityModeRejected,
                        "security mode not offered with this policy",
                    ));
                }
                (1, SequenceNumbers::for_policy(policy))
            }
            (State::Open(open), SecurityTokenRequestType::Renew) => {
                if chunk.channel_id != self.channel_id {
                    return Err(peer(
                        StatusCode::BadSecureChannelIdInvalid,
                        "renew for another channel",
                    ));
                }
                if req.security_mode != self.security.mode {
                    return Err(peer(
                        StatusCode::BadSecurityModeRejected,
                        "renewal with another security mode",
                    ));
                }
                check_sequence(
                    policy.legacy_sequence_numbers(),
                    open.last_received,
                    chunk.sequence_number,
                )?;
                (open.current.id.wrapping_add(1).max(1), open.send_seq)
            }
            (State::Open(_), _) => {
                return Err(peer(
                    StatusCode::BadSecurityChecksFailed,
                    "Issue on an open channel",
                ))
            }
            (_, _) => {
                return Err(peer(
                    StatusCode::BadSecurityChecksFailed,
                    "Renew before Issue",
                ))
            }
        };
        Ok(ReceivedOpen {
            policy,
            request_id: chunk.request_id,
            sequence_number: chunk.sequence_number,
            request_handle: req.request_header.request_handle,
            security_mode: req.security_mode,
            client_nonce: req.client_nonce.as_bytes().unwrap_or_default().to_vec(),
            lifetime,
            token_id,
            first_seq,
            secured,
        })
    }

    /// Answers an OPN [`Self::open_receive`] took: the token's keys, the
    /// response signed (and encrypted) into the output, the channel opened
    /// or renewed.
    fn open_answer(&mut self, now: Now, received: ReceivedOpen) -> Result<(), ChannelError> {
        let ReceivedOpen {
            policy,
            secured,
            request_id,
            sequence_number,
            request_handle,
            security_mode,
            client_nonce,
            lifetime,
            token_id,
            first_seq,
        } = received;
        let client_nonce = client_nonce.as_slice();
        let mut ikm = None;
        let (server_nonce, keys) = if policy.is_none() {
            (Vec::new(), None)
        } else if let Some(curve) = policy.curve() {
            let ephemeral = EphemeralKey::generate(curve)?;
            let previous = match &self.state {
                State::Open(open) => open.ikm.as_deref(),
                _ => None,
            };
            let server_nonce = ephemeral.public_nonce().to_vec();
            let (keys, secret) = ecc_token_keys(
                policy,
                &ephemeral,
                client_nonce,
                client_nonce,
                &server_nonce,
                previous,
            )?;
            ikm = policy
                .secure_channel_enhancements()
                .then(|| Box::new(secret));
            (server_nonce, Some(Box::new(keys)))
        } else {
            policy.check_nonce(client_nonce)?;
            let server_nonce = policy.random_nonce()?;
            let keys = derive_keys(policy, client_nonce, &server_nonce)?;
            (server_nonce, Some(Box::new(keys)))
        };
        let resp = OpenSecureChannelResponse {
            response_header: ResponseHeader {
                timestamp: now.utc,
                request_handle,
                service_result: StatusCode::Good,
                ..Default::default()
            },
            server_protocol_version: 0,
            security_token: ChannelSecurityToken {
                channel_id: self.channel_id,
                token_id,
                created_at: now.utc,
                revised_lifetime: u32::try_from(lifetime.as_millis()).unwrap_or(u32::MAX),
            },
            server_nonce: ByteString::new(server_nonce),
        };
        let mut body = Vec::new();
        encode_message(&resp, &mut body);
        let mut seq = first_seq;
        let send_limits = self.send_limits();
        let issue = !matches!(self.state, State::Open(_));
        let mut thumbprint = Vec::new();
        match &secured {
            Some(sec) => {
                let header = AsymmetricHeader {
                    policy_uri: UaString::from(policy.uri()),
                    sender_certificate: ByteString::new(sec.identity.certificate().der().to_vec()),
                    receiver_thumbprint: ByteString::new(sec.cert.thumbprint().to_vec()),
                };
                let bound = issue && policy.secure_channel_enhancements();
                let protection = match (&sec.key, sec.identity.key()) {
                    (PublicKey::Rsa(remote), crate::security::PrivateKey::Rsa(local)) => {
                        Protection::Asymmetric {
                            policy,
                            local,
                            remote,
                        }
                    }
                    (PublicKey::Ecc(_), crate::security::PrivateKey::Ecc(local)) => {
                        Protection::EccAsymmetric {
                            policy,
                            local,
                            signed_suffix: if bound { &sec.request_signature } else { &[] },
                        }
                    }
                    _ => {
                        return Err(ChannelError::Resource {
                            status: StatusCode::BadInternalError,
                            what: "key kinds do not match",
                        })
                    }
                };
                let before = self.out.len();
                write_chunks_protected(
                    &mut self.out,
                    MessageType::OpenSecureChannel,
                    self.channel_id,
                    &SecurityHeader::Asymmetric(header),
                    &protection,
                    &mut seq,
                    request_id,
                    &body,
                    &send_limits,
                )?;
                if bound {
                    let sig = sec.identity.key().signature_length();
                    let written = self.out.get(before..).unwrap_or_default();
                    thumbprint = written
                        .get(written.len().saturating_sub(sig)..)
                        .unwrap_or_default()
                        .to_vec();
                }
            }
            None => write_chunks_protected(
                &mut self.out,
                MessageType::OpenSecureChannel,
                self.channel_id,
                &SecurityHeader::Asymmetric(AsymmetricHeader::none()),
                &Protection::None,
                &mut seq,
                request_id,
                &body,
                &send_limits,
            )?,
        }
        // Part 6 §6.7.4: allow 25 % beyond the lifetime before the token dies.
        let token = Token {
            id: token_id,
            expires: now.instant + lifetime + lifetime / 4,
            keys,
        };
        let last_received = sequence_number;
        match &mut self.state {
            State::Open(open) => {
                let old = std::mem::replace(&mut open.current, token);
                // A token the client never switched to is dropped for good.
                if open.previous.is_none() {
                    open.previous = Some(Box::new(old));
                }
                open.last_received = last_received;
                open.send_seq = seq;
                open.ikm = ikm;
                self.events.push(Some(Event::Renewed { token_id }));
            }
            _ => {
                self.security = ChannelSecurity {
                    policy,
                    mode: security_mode,
                    remote_certificate: secured.as_ref().map(|sec| Arc::clone(&sec.cert)),
                    channel_thumbprint: (!thumbprint.is_empty()).then(|| Arc::new(thumbprint)),
                };
                self.state = State::Open(Open {
                    current: token,
                    previous: None,
                    last_received,
                    send_seq: seq,
                    ikm,
                });
                self.events.push(Some(Event::Opened {
                    channel_id: self.channel_id,
                }));
            }
        }
        self.deadline = None;
        Ok(())
    }

    fn handle_symmetric(
        &mut self,
        now: Now,
        header: &MessageHeader,
        msg: &mut [u8],
    ) -> Result<(), ChannelError> {
        let (channel_id, security, head_len) = parse_security_header(header, msg)?;
        let State::Open(open) = &mut self.state else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "no open channel",
            ));
        };
        if channel_id != self.channel_id {
            return Err(peer(
                StatusCode::BadSecureChannelIdInvalid,
                "message for another channel",
            ));
        }
        let SecurityHeader::Symmetric(token_id) = security else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "MSG without token id",
            ));
        };
        let is_current = token_id == open.current.id;
        let token = if is_current {
            &open.current
        } else {
            match open.previous.as_deref() {
                Some(p) if p.id == token_id && p.expires > now.instant => p,
                _ => {
                    return Err(peer(
                        StatusCode::BadSecureChannelTokenUnknown,
                        "unknown or expired token",
                    ))
                }
            }
        };
        let plain_len = match &token.keys {
            Some(keys) => open_symmetric(
                &keys.client,
                self.security.mode == MessageSecurityMode::SignAndEncrypt,
                msg,
                head_len,
                open.last_received,
            )?,
            None => msg.len(),
        };
        let quiet_release = token
            .keys
            .as_ref()
            .is_some_and(|k| k.client.releases_schedules())
            && self.security.mode == MessageSecurityMode::SignAndEncrypt;
        if is_current {
            // The client switched to the new token: the old one is gone.
            open.previous = None;
        }
        if quiet_release {
            let release = now.instant + KEY_SCHEDULE_IDLE;
            // The deadline moved last at most KEY_SCHEDULE_SLACK before the
            // previous request: see KEY_SCHEDULE_SPARSE.
            self.sparse = self
                .deadline
                .is_none_or(|d| d + KEY_SCHEDULE_SPARSE <= release);
            if self
                .deadline
                .is_none_or(|d| d + KEY_SCHEDULE_SLACK < release)
            {
                self.deadline = Some(release);
            }
            if self.sparse {
                for t in std::iter::once(&mut open.current).chain(open.previous.as_deref_mut()) {
                    if let Some(keys) = t.keys.as_mut() {
                        keys.client.release_schedules();
                    }
                }
            }
        }
        let chunk = Chunk::parse(header, msg.get(..plain_len).unwrap_or_default())?;
        check_sequence(
            self.security.policy.legacy_sequence_numbers(),
            open.last_received,
            chunk.sequence_number,
        )?;
        open.last_received = chunk.sequence_number;
        if header.message_type == MessageType::CloseSecureChannel {
            let limits = &self.config.decode;
            let mut r = Reader::new(chunk.body, limits).map_err(ChannelError::decode)?;
            let m = decode_message(&mut r).map_err(ChannelError::decode)?;
            if m.as_any()
                .downcast_ref::<CloseSecureChannelRequest>()
                .is_none()
            {
                return Err(peer(
                    StatusCode::BadTcpMessageTypeInvalid,
                    "CLO body is not a CloseSecureChannelRequest",
                ));
            }
            self.close(StatusCode::Good);
            return Ok(());
        }
        match self.assembler.push(
            now.instant,
            chunk.request_id,
            chunk.chunk_type,
            chunk.body,
            self.activated,
        )? {
            Assembled::Incomplete | Assembled::Aborted { .. } => {}
            Assembled::Complete { request_id, body } => {
                self.events.push(Some(Event::Request { request_id, body }));
            }
        }
        Ok(())
    }

    fn send_limits(&self) -> SendLimits {
        let n = self.negotiated;
        SendLimits {
            max_chunk_size: n.map_or(8192, |n| n.send_buffer_size as usize),
            max_message_size: n.map_or(0, |n| n.send_max_message_size as usize),
            max_chunk_count: n.map_or(0, |n| n.send_max_chunk_count as usize),
        }
    }

    /// Sends a response to `request_id` (the message: encoding id + body).
    ///
    /// `BadResponseTooLarge` means nothing was sent and the channel is still
    /// open: answer with a ServiceFault instead.
    pub fn send_response(&mut self, request_id: u32, message: &[u8]) -> Result<(), ChannelError> {
        let limits = self.send_limits();
        let channel_id = self.channel_id;
        let State::Open(open) = &mut self.state else {
            return Err(ChannelError::Resource {
                status: StatusCode::BadSecureChannelClosed,
                what: "channel is not open",
            });
        };
        // Until the client uses the new token, answer with the old one.
        let token = open.previous.as_deref().unwrap_or(&open.current);
        let protection = match (&token.keys, self.security.mode) {
            (Some(k), MessageSecurityMode::SignAndEncrypt) => Protection::SignAndEncrypt(&k.server),
            (Some(k), _) => Protection::Sign(&k.server),
            (None, _) => Protection::None,
        };
        let sent = write_chunks_protected(
            &mut self.out,
            MessageType::Message,
            channel_id,
            &SecurityHeader::Symmetric(token.id),
            &protection,
            &mut open.send_seq,
            request_id,
            message,
            &limits,
        );
        if self.sparse {
            let token = match open.previous.as_deref_mut() {
                Some(p) => p,
                None => &mut open.current,
            };
            if let Some(keys) = token.keys.as_mut() {
                keys.server.release_schedules();
            }
        }
        sent
    }

    /// Closes from the server side (shutdown, eviction) with an ERR message.
    pub fn close_with(&mut self, status: StatusCode, reason: &str) {
        if self.is_closed() {
            return;
        }
        ErrorMessage {
            error: status,
            reason: UaString::from(reason),
        }
        .encode_message(&mut self.out);
        self.close(status);
    }

    /// Appends the bytes to send to `buf`; false when there are none.
    ///
    /// When `buf` is empty the connection's send buffer is handed over
    /// whole, even with nothing in it: nothing is copied and the connection
    /// keeps no allocation, so a caller that drops or reuses `buf` leaves
    /// no send buffer with an idle connection.
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> bool {
        if buf.is_empty() {
            *buf = std::mem::take(&mut self.out);
            return !buf.is_empty();
        }
        if self.out.is_empty() {
            return false;
        }
        buf.append(&mut self.out);
        true
    }

    /// Gives the connection an empty buffer to write what it sends into
    /// (one with capacity saves growing a fresh one per batch of answers;
    /// the caller gets it back through
    /// [`ServerConnection::poll_transmit`]). Ignored when bytes are already
    /// waiting to be sent.
    pub fn lend_send_buffer(&mut self, mut buf: Vec<u8>) {
        if self.out.is_empty() && buf.capacity() > self.out.capacity() {
            buf.clear();
            self.out = buf;
        }
    }

    /// The next event. Once the last one is taken the queue lets its
    /// buffer go: an idle connection holds none.
    pub fn poll_event(&mut self) -> Option<Event> {
        let event = self
            .events
            .get_mut(self.events_taken as usize)
            .and_then(Option::take);
        self.events_taken = self.events_taken.saturating_add(1);
        if self.events_taken as usize >= self.events.len() {
            // All taken: the buffer goes.
            self.events = Vec::new();
            self.events_taken = 0;
        }
        event
    }

    /// True while the channel holds built AES key schedules (CBC keys, in
    /// SignAndEncrypt); a quiet channel drops them ([`KEY_SCHEDULE_IDLE`]).
    pub fn holds_key_schedules(&self) -> bool {
        let State::Open(o) = &self.state else {
            return false;
        };
        std::iter::once(&o.current)
            .chain(o.previous.as_deref())
            .filter_map(|t| t.keys.as_ref())
            .any(|k| k.client.holds_schedules() || k.server.holds_schedules())
    }

    /// When [`ServerConnection::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let token = match &self.state {
            State::Open(o) => Some(o.current.expires),
            _ => None,
        };
        [self.deadline, token, self.assembler.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Now) {
        if self.deadline.is_some_and(|d| d <= now.instant) {
            let State::Open(o) = &mut self.state else {
                self.close_with(StatusCode::BadTimeout, "handshake not completed in time");
                return;
            };
            // Quiet since KEY_SCHEDULE_IDLE: the key schedules go.
            self.deadline = None;
            for token in std::iter::once(&mut o.current).chain(o.previous.as_deref_mut()) {
                if let Some(keys) = token.keys.as_mut() {
                    keys.release_schedules();
                }
            }
        }
        if let State::Open(o) = &mut self.state {
            if o.current.expires <= now.instant {
                self.close_with(
                    StatusCode::BadSecureChannelTokenUnknown,
                    "security token expired without renewal",
                );
                return;
            }
            if o.previous
                .as_ref()
                .is_some_and(|p| p.expires <= now.instant)
            {
                o.previous = None;
            }
        }
        // A chunked request whose next chunk did not come in time ends the
        // channel: its later chunks must never be read as a request.
        if !self.assembler.handle_timeout(now.instant).is_empty() {
            self.close_with(
                StatusCode::BadTimeout,
                "a chunked request stalled past the assembly deadline",
            );
        }
    }
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "channel_secure_tests.rs"]
mod secure_tests;
