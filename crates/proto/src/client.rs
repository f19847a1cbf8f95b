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
//! Security ([`ClientSecurity`]): SecurityPolicy None, or an RSA policy in
//! mode Sign or SignAndEncrypt. The OPN is signed with our key and encrypted
//! for the server certificate (which must be the one the endpoint named:
//! the certificate the server sends in its OPN response is compared with
//! it); each token's symmetric keys are derived from both nonces, and every
//! renewal brings new nonces and keys. Responses under the previous token
//! are still accepted after a renewal (the server answers with it until it
//! sees the new one used).
//!
//! ECC policies: the OPN is signed only; the ClientNonce is a fresh
//! ephemeral key for each Issue and Renew, and the keys come from ECDH with
//! the ServerNonce (chained with the previous token's secret under
//! SecureChannelEnhancements, where the first OPN response is also checked
//! over our request's signature and its own signature is kept as the
//! ChannelThumbprint, [`ClientConnection::channel_thumbprint`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_types::{
    decode_message, encode_message, ByteString, CloseSecureChannelRequest, DecodeLimits,
    MessageSecurityMode, OpenSecureChannelRequest, OpenSecureChannelResponse, Reader,
    RequestHeader, SecurityTokenRequestType, StatusCode, UaString,
};

use uascale_crypto::ecc::{EphemeralKey, Secret};
use uascale_crypto::policy::{derive_keys, ChannelKeys, SecurityPolicy};
use uascale_crypto::x509::Certificate;
use uascale_crypto::CryptoError;

use crate::channel::Now;
use crate::chunk::{
    parse_security_header, write_chunks_protected, AsymmetricHeader, Chunk, SecurityHeader,
    SendLimits, SequenceNumbers,
};
use crate::error::ChannelError;
use crate::reassembly::{Assembled, Assembler, AssemblyLimits, ReassemblyBudget};
use crate::security::{
    ecc_token_keys, leaf_certificate, open_asymmetric, open_asymmetric_ecc, open_symmetric,
    Identity, PrivateKey, Protection, PublicKey,
};
use crate::tcp::{
    next_message, Acknowledge, ErrorMessage, Hello, MessageHeader, MessageType, HEADER_LEN,
};

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
    /// The channel's message security. Default: SecurityPolicy None.
    pub security: ClientSecurity,
}

/// The message security of a client channel: the policy and mode, our
/// application instance certificate with its key, and the server's
/// certificate (from its EndpointDescription).
#[derive(Debug, Clone)]
pub struct ClientSecurity {
    policy: SecurityPolicy,
    mode: MessageSecurityMode,
    secured: Option<Secured>,
}

#[derive(Debug, Clone)]
struct Secured {
    identity: Arc<Identity>,
    server_certificate: Arc<Certificate>,
    server_key: PublicKey,
}

impl Default for ClientSecurity {
    fn default() -> Self {
        ClientSecurity::none()
    }
}

impl ClientSecurity {
    /// SecurityPolicy None, mode None.
    pub fn none() -> Self {
        ClientSecurity {
            policy: SecurityPolicy::None,
            mode: MessageSecurityMode::None,
            secured: None,
        }
    }

    /// A secured channel: `policy` (not None) with mode Sign or
    /// SignAndEncrypt, our certificate and key, and the server certificate
    /// the OPN is encrypted for. The caller has decided to trust the server
    /// certificate (trust list or an explicit choice); the key sizes are
    /// checked against the policy here.
    pub fn new(
        policy: SecurityPolicy,
        mode: MessageSecurityMode,
        identity: Arc<Identity>,
        server_certificate: Arc<Certificate>,
    ) -> Result<Self, CryptoError> {
        if policy.is_none() {
            return Err(CryptoError::Config {
                what: "ClientSecurity::new needs a policy other than None",
            });
        }
        if !matches!(
            mode,
            MessageSecurityMode::Sign | MessageSecurityMode::SignAndEncrypt
        ) {
            return Err(CryptoError::Config {
                what: "a secured policy needs mode Sign or SignAndEncrypt",
            });
        }
        if !identity.suits(policy) {
            return Err(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "our certificate's key does not suit the security policy",
            });
        }
        let server_key = PublicKey::of_certificate(&server_certificate, policy)?;
        Ok(ClientSecurity {
            policy,
            mode,
            secured: Some(Secured {
                identity,
                server_certificate,
                server_key,
            }),
        })
    }

    /// The security policy.
    pub fn policy(&self) -> SecurityPolicy {
        self.policy
    }

    /// The message security mode.
    pub fn mode(&self) -> MessageSecurityMode {
        self.mode
    }

    /// Our certificate and key (None for SecurityPolicy None).
    pub fn identity(&self) -> Option<&Arc<Identity>> {
        self.secured.as_ref().map(|s| &s.identity)
    }

    /// The server certificate (None for SecurityPolicy None).
    pub fn server_certificate(&self) -> Option<&Arc<Certificate>> {
        self.secured.as_ref().map(|s| &s.server_certificate)
    }

    /// The server certificate's public key (None for SecurityPolicy None).
    pub fn server_key(&self) -> Option<&PublicKey> {
        self.secured.as_ref().map(|s| &s.server_key)
    }
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
            security: ClientSecurity::none(),
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

#[derive(Debug, Clone)]
struct Token {
    id: u32,
    renew_at: Instant,
    keys: Option<Arc<ChannelKeys>>,
}

#[derive(Debug)]
enum State {
    ExpectAcknowledge,
    ExpectOpenResponse {
        request_id: u32,
    },
    Open {
        current: Token,
        previous: Option<Token>,
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
    /// The nonce of the OPN request in flight.
    client_nonce: Vec<u8>,
    /// ECC: the ephemeral key of the OPN in flight.
    ephemeral: Option<EphemeralKey>,
    /// SecureChannelEnhancements: our first OPN request's signature, until
    /// the response has been verified over it.
    request_signature: Vec<u8>,
    /// SecureChannelEnhancements: the first OPN response's signature.
    channel_thumbprint: Vec<u8>,
    /// SecureChannelEnhancements: the current token's input keying material.
    ikm: Option<Secret>,
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
            send_seq: SequenceNumbers::for_policy(config.security.policy),
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
            client_nonce: Vec::new(),
            ephemeral: None,
            request_signature: Vec::new(),
            channel_thumbprint: Vec::new(),
            ikm: None,
        }
    }

    /// The ChannelThumbprint (SecureChannelEnhancements: the signature of
    /// the first OPN response); empty for other policies and before the
    /// channel is open.
    pub fn channel_thumbprint(&self) -> &[u8] {
        &self.channel_thumbprint
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
        let (token, keys) = (current.id, current.keys.clone());
        let request_id = self.take_request_id();
        self.write_symmetric(
            MessageType::Message,
            token,
            keys.as_deref(),
            request_id,
            message,
        )
        .map_err(|e| match e {
            ChannelError::Resource {
                status: StatusCode::BadResponseTooLarge,
                ..
            } => ChannelError::Resource {
                status: StatusCode::BadRequestTooLarge,
                what: "request exceeds the server's limits",
            },
            e => e,
        })?;
        Ok(request_id)
    }

    /// Writes a MSG or CLO message under `token`, signed (and encrypted)
    /// with its client keys when the channel is secured.
    fn write_symmetric(
        &mut self,
        message_type: MessageType,
        token: u32,
        keys: Option<&ChannelKeys>,
        request_id: u32,
        message: &[u8],
    ) -> Result<(), ChannelError> {
        let protection = match (keys, self.config.security.mode) {
            (Some(k), MessageSecurityMode::SignAndEncrypt) => Protection::SignAndEncrypt(&k.client),
            (Some(k), _) => Protection::Sign(&k.client),
            (None, _) => Protection::None,
        };
        write_chunks_protected(
            &mut self.out,
            message_type,
            self.channel_id,
            &SecurityHeader::Symmetric(token),
            &protection,
            &mut self.send_seq,
            request_id,
            message,
            &self.send_limits,
        )
    }

    /// Closes the channel with a CloseSecureChannel message.
    pub fn close(&mut self, now: Now) {
        if let State::Open { current, .. } = &self.state {
            let (token, keys) = (current.id, current.keys.clone());
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
            let _ = self.write_symmetric(
                MessageType::CloseSecureChannel,
                token,
                keys.as_deref(),
                request_id,
                &body,
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
            let rest = input.get_mut(consumed..).unwrap_or_default();
            let (header, msg) = match next_message(rest, max) {
                Ok(Some(m)) => m,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            consumed += msg.len();
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
        let security = &self.config.security;
        self.client_nonce = if security.policy.is_none() {
            Vec::new()
        } else if let Some(curve) = security.policy.curve() {
            let ephemeral = EphemeralKey::generate(curve)?;
            let nonce = ephemeral.public_nonce().to_vec();
            self.ephemeral = Some(ephemeral);
            nonce
        } else {
            security.policy.random_nonce()?
        };
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
                security_mode: security.mode,
                client_nonce: ByteString::new(self.client_nonce.clone()),
                requested_lifetime: u32::try_from(self.config.requested_lifetime.as_millis())
                    .unwrap_or(u32::MAX),
            },
            &mut body,
        );
        let request_id = self.take_request_id();
        let config = Arc::clone(&self.config);
        match &config.security.secured {
            None => write_chunks_protected(
                &mut self.out,
                MessageType::OpenSecureChannel,
                channel_id,
                &SecurityHeader::Asymmetric(AsymmetricHeader::none()),
                &Protection::None,
                &mut self.send_seq,
                request_id,
                &body,
                &self.send_limits,
            )?,
            Some(sec) => {
                let header = AsymmetricHeader {
                    policy_uri: UaString::from(config.security.policy.uri()),
                    sender_certificate: ByteString::new(sec.identity.certificate().der().to_vec()),
                    receiver_thumbprint: ByteString::new(
                        sec.server_certificate.thumbprint().to_vec(),
                    ),
                };
                let policy = config.security.policy;
                let protection = match (sec.identity.key(), &sec.server_key) {
                    (PrivateKey::Rsa(local), PublicKey::Rsa(remote)) => Protection::Asymmetric {
                        policy,
                        local,
                        remote,
                    },
                    (PrivateKey::Ecc(local), PublicKey::Ecc(_)) => Protection::EccAsymmetric {
                        policy,
                        local,
                        signed_suffix: &[],
                    },
                    _ => {
                        return Err(ChannelError::Resource {
                            status: StatusCode::BadConfigurationError,
                            what: "key kinds do not match the security policy",
                        })
                    }
                };
                let before = self.out.len();
                write_chunks_protected(
                    &mut self.out,
                    MessageType::OpenSecureChannel,
                    channel_id,
                    &SecurityHeader::Asymmetric(header),
                    &protection,
                    &mut self.send_seq,
                    request_id,
                    &body,
                    &self.send_limits,
                )?;
                if policy.secure_channel_enhancements() && self.channel_thumbprint.is_empty() {
                    let sig = sec.identity.key().signature_length();
                    let written = self.out.get(before..).unwrap_or_default();
                    self.request_signature = written
                        .get(written.len().saturating_sub(sig)..)
                        .unwrap_or_default()
                        .to_vec();
                }
            }
        }
        Ok(request_id)
    }

    /// Checks the asymmetric header of the server's OPN and, when secured,
    /// decrypts (RSA) and verifies the chunk; keeps the ChannelThumbprint
    /// of a first ECC response under SecureChannelEnhancements.
    fn open_response_chunk(
        &mut self,
        header: &MessageHeader,
        msg: &[u8],
    ) -> Result<Option<Vec<u8>>, ChannelError> {
        let (_, security, head_len) = parse_security_header(header, msg)?;
        let SecurityHeader::Asymmetric(asym) = &security else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "OPN without asymmetric header",
            ));
        };
        let ours = &self.config.security;
        if asym.policy_uri.as_str() != Some(ours.policy.uri()) {
            return Err(peer(
                StatusCode::BadSecurityPolicyRejected,
                "OpenSecureChannel response under another security policy",
            ));
        }
        let Some(sec) = &ours.secured else {
            return Ok(None);
        };
        let chain = asym.sender_certificate.as_bytes().unwrap_or_default();
        if leaf_certificate(chain)? != sec.server_certificate.der() {
            return Err(peer(
                StatusCode::BadCertificateInvalid,
                "the server's OPN certificate is not the endpoint's certificate",
            ));
        }
        if asym.receiver_thumbprint.as_bytes() != Some(&sec.identity.thumbprint()[..]) {
            return Err(peer(
                StatusCode::BadSecurityChecksFailed,
                "receiver thumbprint is not our certificate's",
            ));
        }
        match (sec.identity.key(), &sec.server_key) {
            (PrivateKey::Rsa(local), PublicKey::Rsa(remote)) => {
                let plain = open_asymmetric(ours.policy, local, remote, msg, head_len)?;
                Ok(Some(plain))
            }
            (PrivateKey::Ecc(_), PublicKey::Ecc(remote)) => {
                let first =
                    ours.policy.secure_channel_enhancements() && self.channel_thumbprint.is_empty();
                let suffix = if first {
                    self.request_signature.as_slice()
                } else {
                    &[]
                };
                let at = open_asymmetric_ecc(ours.policy, remote, msg, head_len, suffix)?;
                if first {
                    self.channel_thumbprint = msg.get(at..).unwrap_or_default().to_vec();
                    self.request_signature = Vec::new();
                }
                Ok(Some(msg.get(..at).unwrap_or_default().to_vec()))
            }
            _ => Err(peer(
                StatusCode::BadSecurityPolicyRejected,
                "key kinds do not match the security policy",
            )),
        }
    }

    fn check_sequence(&mut self, received: u32) -> Result<(), ChannelError> {
        if let Some(last) = self.last_received {
            let legacy = self.config.security.policy.legacy_sequence_numbers();
            if !SequenceNumbers::follows_in(legacy, last, received) {
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
        let plain = self.open_response_chunk(header, msg)?;
        let chunk = Chunk::parse(header, plain.as_deref().unwrap_or(msg))?;
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
        let policy = self.config.security.policy;
        let keys = if policy.is_none() {
            None
        } else if policy.is_ecc() {
            let server_nonce = resp.server_nonce.as_bytes().unwrap_or_default();
            let ephemeral = self.ephemeral.take().ok_or(peer(
                StatusCode::BadSecurityChecksFailed,
                "OpenSecureChannel response without a request",
            ))?;
            let previous = match self.state {
                State::Open { .. } => self.ikm.as_ref(),
                _ => None,
            };
            let (keys, secret) = ecc_token_keys(
                policy,
                &ephemeral,
                server_nonce,
                &self.client_nonce,
                server_nonce,
                previous,
            )?;
            self.ikm = policy.secure_channel_enhancements().then_some(secret);
            Some(Arc::new(keys))
        } else {
            let server_nonce = resp.server_nonce.as_bytes().unwrap_or_default();
            policy.check_nonce(server_nonce)?;
            Some(Arc::new(derive_keys(
                policy,
                &self.client_nonce,
                server_nonce,
            )?))
        };
        self.client_nonce.clear();
        let t = &resp.security_token;
        if let State::Open { .. } = self.state {
            if t.channel_id != self.channel_id {
                return Err(peer(
                    StatusCode::BadSecureChannelIdInvalid,
                    "renewal answered for another channel",
                ));
            }
        }
        let lifetime = Duration::from_millis(u64::from(t.revised_lifetime.max(1000)));
        let token = Token {
            id: t.token_id,
            renew_at: now.instant + lifetime * 3 / 4,
            keys,
        };
        let token_id = token.id;
        match &mut self.state {
            State::Open {
                current,
                previous,
                renewing,
            } => {
                *previous = Some(std::mem::replace(current, token));
                *renewing = None;
                self.events.push_back(ClientEvent::Renewed { token_id });
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
        let (channel_id, security, head_len) = parse_security_header(header, msg)?;
        if channel_id != self.channel_id {
            return Err(peer(
                StatusCode::BadSecureChannelIdInvalid,
                "response for another channel",
            ));
        }
        let SecurityHeader::Symmetric(token_id) = security else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "MSG without token",
            ));
        };
        let State::Open {
            current, previous, ..
        } = &self.state
        else {
            return Err(peer(
                StatusCode::BadTcpMessageTypeInvalid,
                "no open channel",
            ));
        };
        let token = if token_id == current.id {
            current
        } else {
            match previous {
                Some(p) if p.id == token_id => p,
                _ => {
                    return Err(peer(
                        StatusCode::BadSecureChannelTokenUnknown,
                        "response with an unknown token",
                    ))
                }
            }
        };
        let opened;
        let plain = match &token.keys {
            Some(keys) => {
                let mut copy = msg.to_vec();
                let encrypted = self.config.security.mode == MessageSecurityMode::SignAndEncrypt;
                let last = self.last_received.unwrap_or(0);
                let len = open_symmetric(&keys.server, encrypted, &mut copy, head_len, last)?;
                copy.truncate(len);
                opened = copy;
                opened.as_slice()
            }
            None => msg,
        };
        let chunk = Chunk::parse(header, plain)?;
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
        } = &self.state
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

#[cfg(test)]
#[path = "channel_ecc_tests.rs"]
mod ecc_tests;

#[cfg(test)]
mod secure_tests {
    use super::*;
    use crate::channel::{ChannelConfig, Event, PendingConnection, ServerConnection};
    use crate::security::{ServerSecurity, TrustAllCertificates};
    use std::sync::OnceLock;
    use std::time::UNIX_EPOCH;
    use uascale_crypto::rsa::RsaPrivateKey;
    use uascale_crypto::x509::{create_self_signed, SelfSignedParams};
    use uascale_types::DateTime;

    const POLICIES: [SecurityPolicy; 3] = [
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
    ];
    const MODES: [MessageSecurityMode; 2] = [
        MessageSecurityMode::Sign,
        MessageSecurityMode::SignAndEncrypt,
    ];

    fn make_identity(name: &str) -> Arc<Identity> {
        let p = SelfSignedParams::new(
            &format!("urn:uascale:test:{name}"),
            name,
            UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        );
        let made = create_self_signed(&p).unwrap();
        let key = RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap();
        Arc::new(Identity::new(made.certificate, key).unwrap())
    }

    fn ids() -> &'static (Arc<Identity>, Arc<Identity>) {
        static I: OnceLock<(Arc<Identity>, Arc<Identity>)> = OnceLock::new();
        I.get_or_init(|| (make_identity("server"), make_identity("client")))
    }

    fn at(t0: Instant, ms: u64) -> Now {
        Now {
            instant: t0 + Duration::from_millis(ms),
            utc: DateTime::from_ticks(1),
        }
    }

    /// Moves bytes both ways; `tamper` may change what the server sends.
    fn pump_with(
        c: &mut ClientConnection,
        s: &mut ServerConnection,
        now: Now,
        tamper: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<(), ChannelError> {
        let mut result = Ok(());
        loop {
            let mut a = Vec::new();
            let mut b = Vec::new();
            let moved = c.poll_transmit(&mut a) | s.poll_transmit(&mut b);
            if !moved {
                return result;
            }
            if !a.is_empty() {
                let _ = s.handle_input(now, &mut a);
            }
            if !b.is_empty() {
                tamper(&mut b);
                if let Err(e) = c.handle_input(now, &mut b) {
                    result = Err(e);
                }
            }
        }
    }

    fn pump(c: &mut ClientConnection, s: &mut ServerConnection, now: Now) {
        pump_with(c, s, now, &mut |_| {}).unwrap();
    }

    fn pair(
        t0: Instant,
        policy: SecurityPolicy,
        mode: MessageSecurityMode,
    ) -> (ClientConnection, ServerConnection) {
        let (server, client) = ids();
        let security = ClientSecurity::new(
            policy,
            mode,
            Arc::clone(client),
            Arc::new(server.certificate().clone()),
        )
        .unwrap();
        let c = ClientConnection::new(
            at(t0, 0),
            Arc::new(ClientConfig {
                endpoint_url: "opc.tcp://test".into(),
                requested_lifetime: Duration::from_secs(20),
                send_buffer_size: 8192,
                receive_buffer_size: 8192,
                security,
                ..Default::default()
            }),
        );
        let mut endpoints = vec![(SecurityPolicy::None, MessageSecurityMode::None)];
        for p in POLICIES {
            for m in MODES {
                endpoints.push((p, m));
            }
        }
        let config = ChannelConfig {
            security: ServerSecurity {
                identity: Some(Arc::clone(server)),
                ecc_identities: Vec::new(),
                endpoints,
                validator: Some(Arc::new(TrustAllCertificates)),
            },
            ..ChannelConfig::default()
        };
        let s = PendingConnection::new().accept(
            at(t0, 0),
            7,
            Arc::new(config),
            ReassemblyBudget::new(1 << 20, 50),
        );
        (c, s)
    }

    fn request_at_server(s: &mut ServerConnection) -> (u32, Vec<u8>) {
        std::iter::from_fn(|| s.poll_event())
            .find_map(|e| match e {
                Event::Request { request_id, body } => Some((request_id, body)),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn every_policy_and_mode_opens_exchanges_chunked_messages_and_renews() {
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        for policy in POLICIES {
            for mode in MODES {
                let what = format!("{policy:?} {mode:?}");
                let (mut c, mut s) = pair(t0, policy, mode);
                pump(&mut c, &mut s, at(t0, 0));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Opened { channel_id: 7 }),
                    "{what}"
                );
                assert_eq!(s.security().policy, policy, "{what}");
                assert_eq!(s.security().mode, mode, "{what}");
                // Many chunks each way.
                let big: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
                let id = c.send_request(&big).unwrap();
                pump(&mut c, &mut s, at(t0, 1));
                assert_eq!(request_at_server(&mut s), (id, big.clone()), "{what}");
                s.send_response(id, &big[..40_000]).unwrap();
                pump(&mut c, &mut s, at(t0, 2));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Response {
                        request_id: id,
                        body: big[..40_000].to_vec()
                    }),
                    "{what}"
                );
                // A request in flight across the renewal: the server answers
                // it with the old token, which the client still accepts.
                let early = c.send_request(b"early").unwrap();
                pump(&mut c, &mut s, at(t0, 3));
                assert_eq!(request_at_server(&mut s).0, early);
                c.handle_timeout(at(t0, 15_000));
                pump(&mut c, &mut s, at(t0, 15_000));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Renewed { token_id: 2 }),
                    "{what}"
                );
                s.send_response(early, b"old token").unwrap();
                pump(&mut c, &mut s, at(t0, 15_001));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Response {
                        request_id: early,
                        body: b"old token".to_vec()
                    }),
                    "{what}"
                );
                // New keys after the renewal, both ways.
                let id = c.send_request(&big[..20_000]).unwrap();
                pump(&mut c, &mut s, at(t0, 15_002));
                assert_eq!(request_at_server(&mut s), (id, big[..20_000].to_vec()));
                s.send_response(id, b"new token").unwrap();
                pump(&mut c, &mut s, at(t0, 15_003));
                assert_eq!(
                    c.poll_event(),
                    Some(ClientEvent::Response {
                        request_id: id,
                        body: b"new token".to_vec()
                    }),
                    "{what}"
                );
                c.close(at(t0, 15_004));
                pump(&mut c, &mut s, at(t0, 15_004));
                assert_eq!(s.close_status(), Some(StatusCode::Good), "{what}");
            }
        }
    }

    #[test]
    fn a_tampered_server_message_is_refused() {
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        for mode in MODES {
            // The OPN response: one flipped byte in the encrypted part.
            let (mut c, mut s) = pair(t0, SecurityPolicy::Basic256Sha256, mode);
            let r = pump_with(&mut c, &mut s, at(t0, 0), &mut |b| {
                if b.first() == Some(&b'O') {
                    let n = b.len();
                    b[n - 10] ^= 1;
                }
            });
            assert_eq!(
                r.unwrap_err().status_code(),
                StatusCode::BadSecurityChecksFailed
            );
            assert!(c.is_closed() && !c.is_open());
            // A response: one flipped byte of the body (or its ciphertext).
            let (mut c, mut s) = pair(t0, SecurityPolicy::Aes256Sha256RsaPss, mode);
            pump(&mut c, &mut s, at(t0, 0));
            let id = c.send_request(b"hello").unwrap();
            pump(&mut c, &mut s, at(t0, 1));
            assert_eq!(request_at_server(&mut s).0, id);
            s.send_response(id, b"the genuine answer").unwrap();
            let r = pump_with(&mut c, &mut s, at(t0, 2), &mut |b| {
                let n = b.len();
                b[n - 40] ^= 0x80;
            });
            assert_eq!(
                r.unwrap_err().status_code(),
                StatusCode::BadSecurityChecksFailed
            );
            assert!(c.is_closed());
            assert!(!std::iter::from_fn(|| c.poll_event())
                .any(|e| matches!(e, ClientEvent::Response { .. })));
        }
    }

    #[test]
    fn a_server_with_another_certificate_is_refused() {
        // The client expects the other certificate: the server cannot
        // decrypt the OPN (its thumbprint check fails) and sends an ERR.
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let (_, client) = ids();
        let security = ClientSecurity::new(
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::SignAndEncrypt,
            Arc::clone(client),
            Arc::new(client.certificate().clone()),
        )
        .unwrap();
        let (_, mut s) = pair(
            t0,
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::Sign,
        );
        let mut c = ClientConnection::new(
            at(t0, 0),
            Arc::new(ClientConfig {
                security,
                ..Default::default()
            }),
        );
        pump(&mut c, &mut s, at(t0, 0));
        assert!(c.is_closed());
        assert_eq!(c.close_status(), Some(StatusCode::BadSecurityChecksFailed));
    }

    #[test]
    fn an_opn_response_from_another_certificate_is_refused() {
        // The server's OPN response with another sender certificate in its
        // header: refused before any decryption.
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let (server, client) = ids();
        let theirs = server.certificate().der().to_vec();
        let other = client.certificate().der().to_vec();
        let (mut c, mut s) = pair(
            t0,
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::Sign,
        );
        let r = pump_with(&mut c, &mut s, at(t0, 0), &mut |b| {
            if b.first() != Some(&b'O') {
                return;
            }
            let at = b
                .windows(theirs.len())
                .position(|w| w == theirs.as_slice())
                .unwrap();
            let mut swapped = b[..at - 4].to_vec();
            swapped.extend_from_slice(&(other.len() as u32).to_le_bytes());
            swapped.extend_from_slice(&other);
            swapped.extend_from_slice(&b[at + theirs.len()..]);
            let size = swapped.len() as u32;
            swapped[4..8].copy_from_slice(&size.to_le_bytes());
            *b = swapped;
        });
        assert_eq!(
            r.unwrap_err().status_code(),
            StatusCode::BadCertificateInvalid
        );
        assert!(c.is_closed());
    }

    #[test]
    fn bad_security_settings_are_refused() {
        let (server, client) = ids();
        let cert = Arc::new(server.certificate().clone());
        assert!(ClientSecurity::new(
            SecurityPolicy::None,
            MessageSecurityMode::None,
            Arc::clone(client),
            Arc::clone(&cert)
        )
        .is_err());
        assert!(ClientSecurity::new(
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::None,
            Arc::clone(client),
            cert
        )
        .is_err());
    }
}
