//! A minimal blocking OPC UA client over a real socket (SecurityPolicy
//! None), written from the protocol pieces of `uascale-proto`, for tests
//! that must see exactly what the server sends - several requests in flight,
//! answers out of order, ServiceFaults.

#![allow(dead_code)] // each test binary uses part of it

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use uascale_proto::chunk::{
    write_chunks, AsymmetricHeader, Chunk, SecurityHeader, SendLimits, SequenceNumbers,
};
use uascale_proto::tcp::{Hello, MessageHeader, MessageType};
use uascale_types::{
    decode_message, encode_message, ActivateSessionRequest, AnonymousIdentityToken, AttributeId,
    CreateMonitoredItemsRequest, CreateSessionRequest, CreateSessionResponse,
    CreateSubscriptionRequest, CreateSubscriptionResponse, DecodeLimits, DynStructure,
    ExtensionObject, MessageSecurityMode, MonitoredItemCreateRequest, MonitoringMode,
    MonitoringParameters, NodeId, OpenSecureChannelRequest, OpenSecureChannelResponse,
    PublishRequest, ReadValueId, Reader, RequestHeader, SecurityTokenRequestType,
    SubscriptionAcknowledgement, TimestampsToReturn, UaString,
};

/// A connected client with an open secure channel.
pub struct RawClient {
    stream: TcpStream,
    channel_id: u32,
    token_id: u32,
    seq: SequenceNumbers,
    next_request_id: u32,
    next_handle: u32,
    /// The session's authentication token once created.
    pub auth: NodeId,
    reader: RawReader,
}

/// The reading half of a connection (a clone of its socket), for a test
/// that reads answers on one thread while another keeps sending.
pub struct RawReader {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn limits() -> SendLimits {
    SendLimits {
        max_chunk_size: 65535,
        max_message_size: 0,
        max_chunk_count: 0,
    }
}

impl RawClient {
    /// Connects, says Hello and opens a secure channel (None).
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut c = RawClient {
            reader: RawReader {
                stream: stream.try_clone().expect("clone the socket"),
                buf: Vec::new(),
            },
            stream,
            channel_id: 0,
            token_id: 0,
            seq: SequenceNumbers::starting_at(1),
            next_request_id: 1,
            next_handle: 1,
            auth: NodeId::NULL,
        };
        let mut hello = Vec::new();
        Hello {
            protocol_version: 0,
            receive_buffer_size: 65535,
            send_buffer_size: 65535,
            max_message_size: 0,
            max_chunk_count: 0,
            endpoint_url: UaString::from(format!("opc.tcp://{addr}")),
        }
        .encode_message(&mut hello);
        c.stream.write_all(&hello).unwrap();
        let (mt, _) = c.read_message();
        assert_eq!(mt, MessageType::Acknowledge);
        let mut body = Vec::new();
        encode_message(
            &OpenSecureChannelRequest {
                request_type: SecurityTokenRequestType::Issue,
                security_mode: MessageSecurityMode::None,
                requested_lifetime: 600_000,
                ..Default::default()
            },
            &mut body,
        );
        let mut out = Vec::new();
        let rid = c.take_request_id();
        write_chunks(
            &mut out,
            MessageType::OpenSecureChannel,
            0,
            &SecurityHeader::Asymmetric(AsymmetricHeader::none()),
            &mut c.seq,
            rid,
            &body,
            &limits(),
        )
        .unwrap();
        c.stream.write_all(&out).unwrap();
        let (_, msg) = c.read_response();
        let opn = msg
            .as_any()
            .downcast_ref::<OpenSecureChannelResponse>()
            .expect("an OpenSecureChannelResponse");
        c.channel_id = opn.security_token.channel_id;
        c.token_id = opn.security_token.token_id;
        c
    }

    fn take_request_id(&mut self) -> u32 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        id
    }

    /// A request header with a fresh handle and the session's token.
    pub fn header(&mut self) -> RequestHeader {
        let h = self.next_handle;
        self.next_handle += 1;
        RequestHeader {
            authentication_token: self.auth.clone(),
            request_handle: h,
            timeout_hint: 10_000,
            ..Default::default()
        }
    }

    /// Sends a request; returns its secure-channel request id.
    pub fn send(&mut self, req: &dyn DynStructure) -> u32 {
        let mut body = Vec::new();
        encode_message(req, &mut body);
        let mut out = Vec::new();
        let rid = self.take_request_id();
        write_chunks(
            &mut out,
            MessageType::Message,
            self.channel_id,
            &SecurityHeader::Symmetric(self.token_id),
            &mut self.seq,
            rid,
            &body,
            &limits(),
        )
        .unwrap();
        self.stream.write_all(&out).unwrap();
        rid
    }

    fn read_message(&mut self) -> (MessageType, Vec<u8>) {
        self.reader.read_message()
    }

    /// Reads the next response: its request id and the decoded message
    /// (single-chunk responses only, which is all these tests need).
    pub fn read_response(&mut self) -> (u32, Box<dyn DynStructure>) {
        self.reader.read_response()
    }

    /// A second reader of this connection's answers (the socket cloned);
    /// use only one of them.
    pub fn split_reader(&self) -> RawReader {
        RawReader {
            stream: self.stream.try_clone().expect("clone the socket"),
            buf: Vec::new(),
        }
    }

    /// Reads the next message, which must be an ERR; returns its status.
    #[allow(dead_code)]
    pub fn read_error(&mut self) -> uascale_types::StatusCode {
        let (mt, msg) = self.read_message();
        assert_eq!(mt, MessageType::Error, "expected ERR");
        uascale_proto::tcp::ErrorMessage::decode_body(&msg[8..])
            .expect("ERR body")
            .error
    }

    /// Reads the next message, which must be an ERR; its status and the
    /// `RetryAfterMs` hint of its reason.
    #[allow(dead_code)]
    pub fn read_error_with_hint(&mut self) -> (uascale_types::StatusCode, Option<u64>) {
        let (mt, msg) = self.read_message();
        assert_eq!(mt, MessageType::Error, "expected ERR");
        let e = uascale_proto::tcp::ErrorMessage::decode_body(&msg[8..]).expect("ERR body");
        (e.error, e.retry_after_ms())
    }

    /// Creates and activates an anonymous session.
    pub fn session(&mut self) {
        let header = self.header();
        self.send(&CreateSessionRequest {
            request_header: header,
            session_name: UaString::from("raw"),
            requested_session_timeout: 60_000.0,
            ..Default::default()
        });
        let (_, m) = self.read_response();
        let cs = m
            .as_any()
            .downcast_ref::<CreateSessionResponse>()
            .expect("a CreateSessionResponse");
        self.auth = cs.authentication_token.clone();
        let header = self.header();
        self.send(&ActivateSessionRequest {
            request_header: header,
            user_identity_token: ExtensionObject::new(AnonymousIdentityToken {
                policy_id: UaString::from("anonymous"),
            }),
            ..Default::default()
        });
        let (_, m) = self.read_response();
        assert!(
            m.as_any()
                .downcast_ref::<uascale_types::ActivateSessionResponse>()
                .is_some(),
            "activation failed: {m:?}"
        );
    }

    /// Sends a Publish (no timeout hint) acknowledging `acks`.
    pub fn publish(&mut self, acks: Vec<SubscriptionAcknowledgement>) {
        let mut h = self.header();
        h.timeout_hint = 0;
        self.send(&PublishRequest {
            request_header: h,
            subscription_acknowledgements: Some(acks),
        });
    }

    /// Sends a CreateSubscription of 100 ms (its answer is for
    /// [`RawClient::read_subscription_id`]).
    pub fn send_create_subscription(&mut self, lifetime_count: u32, keep_alive_count: u32) {
        let h = self.header();
        self.send(&CreateSubscriptionRequest {
            request_header: h,
            requested_publishing_interval: 100.0,
            requested_lifetime_count: lifetime_count,
            requested_max_keep_alive_count: keep_alive_count,
            publishing_enabled: true,
            ..Default::default()
        });
    }

    /// Reads the CreateSubscription answer; the subscription id.
    pub fn read_subscription_id(&mut self) -> u32 {
        let (_, m) = self.read_response();
        m.as_any()
            .downcast_ref::<CreateSubscriptionResponse>()
            .unwrap_or_else(|| panic!("CreateSubscription failed: {m:?}"))
            .subscription_id
    }

    /// Sends a CreateMonitoredItems of one item (client handle 1, sampled
    /// every 100 ms, queue of one) on `node`'s Value.
    pub fn send_monitor(&mut self, subscription_id: u32, node: NodeId) {
        let h = self.header();
        self.send(&CreateMonitoredItemsRequest {
            request_header: h,
            subscription_id,
            timestamps_to_return: TimestampsToReturn::Both,
            items_to_create: Some(vec![MonitoredItemCreateRequest {
                item_to_monitor: ReadValueId {
                    node_id: node,
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                },
                monitoring_mode: MonitoringMode::Reporting,
                requested_parameters: MonitoringParameters {
                    client_handle: 1,
                    sampling_interval: 100.0,
                    queue_size: 1,
                    discard_oldest: true,
                    ..Default::default()
                },
            }]),
        });
    }
}

impl RawReader {
    fn read_message(&mut self) -> (MessageType, Vec<u8>) {
        loop {
            if let Some(h) = MessageHeader::parse(&self.buf, 1 << 24).unwrap() {
                let size = h.message_size as usize;
                if self.buf.len() >= size {
                    let msg: Vec<u8> = self.buf.drain(..size).collect();
                    return (h.message_type, msg);
                }
            }
            let mut tmp = [0u8; 65536];
            let n = self.stream.read(&mut tmp).expect("read");
            assert!(n > 0, "server closed the connection");
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    /// Reads the next response: its request id and the decoded message
    /// (single-chunk responses only, which is all these tests need).
    pub fn read_response(&mut self) -> (u32, Box<dyn DynStructure>) {
        let (_, msg) = self.read_message();
        let header = MessageHeader::parse(&msg, 1 << 24).unwrap().unwrap();
        assert!(
            header.message_type != MessageType::Error,
            "server sent ERR: {msg:?}"
        );
        let chunk = Chunk::parse(&header, &msg).unwrap();
        let limits = DecodeLimits::default();
        let m = decode_message(&mut Reader::new(chunk.body, &limits).unwrap()).unwrap();
        (chunk.request_id, m)
    }
}

/// A server configuration for tests: 127.0.0.1 on a port the kernel
/// chooses, the unsecured endpoint only, every other default.
#[allow(dead_code)]
pub fn loopback_config() -> uascale_server::ServerConfig {
    uascale_server::ServerConfig {
        server: uascale_server::config::ServerSection {
            bind: [127, 0, 0, 1].into(),
            port: 0,
            ..Default::default()
        },
        security: uascale_server::config::SecurityConfig::none_only(),
        ..Default::default()
    }
}
