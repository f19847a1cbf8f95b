//! In-memory scenarios of secured channels on the simulated clock: a
//! scripted client that signs and encrypts with the same primitives a real
//! client would (`crate::security`), against a [`ServerConnection`], for
//! every policy and mode - handshake, chunked messages both ways, renewal
//! with the key switch - and the abuse cases, each ending in the right ERR
//! while another secured connection on the same budget carries on.

use std::sync::OnceLock;
use std::time::UNIX_EPOCH;

use super::tests::{events, expect_error, feed, messages, read_request, take_out, Clock};
use super::*;
use crate::chunk::{write_chunks, SequenceNumbers};
use crate::security::{
    open_asymmetric, open_symmetric, CertificateValidator, Identity, Protection,
    TrustAllCertificates, SEQUENCE_HEADER_LEN,
};
use crate::tcp::ChunkType;
use uascale_crypto::policy::ChannelKeys;
use uascale_crypto::rsa::{EncryptionPadding, RsaPrivateKey, RsaPublicKey};
use uascale_crypto::x509::{create_self_signed, SelfSignedParams};
use uascale_crypto::CryptoError;
use uascale_types::RequestHeader;

const CHANNEL: u32 = 7;
const POLICIES: [SecurityPolicy; 3] = [
    SecurityPolicy::Basic256Sha256,
    SecurityPolicy::Aes128Sha256RsaOaep,
    SecurityPolicy::Aes256Sha256RsaPss,
];
const MODES: [MessageSecurityMode; 2] = [
    MessageSecurityMode::Sign,
    MessageSecurityMode::SignAndEncrypt,
];

fn make_identity(name: &str, bits: u32) -> Arc<Identity> {
    let mut p = SelfSignedParams::new(
        &format!("urn:uascale:test:{name}"),
        name,
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    );
    p.key_bits = bits;
    let made = create_self_signed(&p).unwrap();
    let key = RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).unwrap();
    Arc::new(Identity::new(made.certificate, key).unwrap())
}

macro_rules! cached_identity {
    ($name:ident, $cn:literal, $bits:literal) => {
        fn $name() -> Arc<Identity> {
            static I: OnceLock<Arc<Identity>> = OnceLock::new();
            Arc::clone(I.get_or_init(|| make_identity($cn, $bits)))
        }
    };
}
cached_identity!(server_id, "server", 2048);
cached_identity!(client_id, "client", 2048);
cached_identity!(other_id, "other", 2048);
cached_identity!(server_4096, "server4096", 4096);

/// A certificate with a 1024-bit RSA key, made once with
/// `openssl req -x509 -newkey rsa:1024 -nodes -days 36500 -subj "/CN=small key" -outform DER`.
const CERT_RSA1024: &[u8] = include_bytes!("testdata_rsa1024_cert.der");

fn all_endpoints() -> Vec<(SecurityPolicy, MessageSecurityMode)> {
    let mut e = vec![(SecurityPolicy::None, MessageSecurityMode::None)];
    for p in POLICIES {
        for m in MODES {
            e.push((p, m));
        }
    }
    e
}

fn config_with(security: ServerSecurity) -> Arc<ChannelConfig> {
    Arc::new(ChannelConfig {
        security,
        ..ChannelConfig::default()
    })
}

fn secure_config(server: &Arc<Identity>) -> Arc<ChannelConfig> {
    config_with(ServerSecurity {
        identity: Some(Arc::clone(server)),
        ecc_identities: Vec::new(),
        endpoints: all_endpoints(),
        validator: Some(Arc::new(TrustAllCertificates)),
    })
}

/// A scripted secured client.
struct SecureClient {
    policy: SecurityPolicy,
    mode: MessageSecurityMode,
    /// The certificate sent as sender certificate.
    cert_der: Vec<u8>,
    /// Whose private key signs and decrypts (normally the certificate's).
    key_owner: Arc<Identity>,
    server_cert: Certificate,
    /// The key the OPN is encrypted with (normally the server certificate's).
    server_key: RsaPublicKey,
    thumbprint: Vec<u8>,
    nonce_len: usize,
    nonce: Vec<u8>,
    seq: SequenceNumbers,
    token: u32,
    keys: Vec<(u32, ChannelKeys)>,
    chunk_size: usize,
}

impl SecureClient {
    fn new(
        policy: SecurityPolicy,
        mode: MessageSecurityMode,
        me: &Arc<Identity>,
        server: &Identity,
    ) -> Self {
        let server_cert = server.certificate().clone();
        let server_key =
            RsaPublicKey::from_spki_der(server_cert.subject_public_key_info_der()).unwrap();
        SecureClient {
            policy,
            mode,
            cert_der: me.certificate().der().to_vec(),
            key_owner: Arc::clone(me),
            thumbprint: server.thumbprint().to_vec(),
            server_cert,
            server_key,
            nonce_len: policy.nonce_length(),
            nonce: Vec::new(),
            seq: SequenceNumbers::starting_at(1),
            token: 0,
            keys: Vec::new(),
            chunk_size: 8192,
        }
    }

    fn limits(&self) -> SendLimits {
        SendLimits {
            max_chunk_size: self.chunk_size,
            max_message_size: 0,
            max_chunk_count: 0,
        }
    }

    fn hello(&self) -> Vec<u8> {
        let mut w = Vec::new();
        Hello {
            protocol_version: 0,
            receive_buffer_size: self.chunk_size as u32,
            send_buffer_size: self.chunk_size as u32,
            max_message_size: 0,
            max_chunk_count: 0,
            endpoint_url: UaString::from("opc.tcp://localhost:4840"),
        }
        .encode_message(&mut w);
        w
    }

    fn open(&mut self, request_type: SecurityTokenRequestType) -> Vec<u8> {
        let mut nonce = SecurityPolicy::Basic256Sha256.random_nonce().unwrap();
        nonce.resize(self.nonce_len, 0xa5);
        self.nonce = nonce.clone();
        let req = OpenSecureChannelRequest {
            request_header: RequestHeader {
                request_handle: 1,
                ..Default::default()
            },
            client_protocol_version: 0,
            request_type,
            security_mode: self.mode,
            client_nonce: ByteString::new(nonce),
            requested_lifetime: 60_000,
        };
        let mut body = Vec::new();
        encode_message(&req, &mut body);
        let header = AsymmetricHeader {
            policy_uri: UaString::from(self.policy.uri()),
            sender_certificate: ByteString::new(self.cert_der.clone()),
            receiver_thumbprint: ByteString::new(self.thumbprint.clone()),
        };
        let channel_id = match request_type {
            SecurityTokenRequestType::Issue => 0,
            _ => CHANNEL,
        };
        let mut out = Vec::new();
        let limits = self.limits();
        write_chunks_protected(
            &mut out,
            MessageType::OpenSecureChannel,
            channel_id,
            &SecurityHeader::Asymmetric(header),
            &Protection::Asymmetric {
                policy: self.policy,
                local: self.key_owner.rsa_key().unwrap(),
                remote: &self.server_key,
            },
            &mut self.seq,
            1,
            &body,
            &limits,
        )
        .unwrap();
        out
    }

    /// Opens the server's OPN response and derives the token's keys.
    fn accept_open(&mut self, out: &[u8]) -> OpenSecureChannelResponse {
        let msgs = messages(out);
        assert_eq!(msgs.len(), 1, "one OPN chunk");
        let (h, m) = &msgs[0];
        assert_eq!(h.message_type, MessageType::OpenSecureChannel);
        assert!(m.len() <= self.chunk_size);
        let (_, sec, head_len) = parse_security_header(h, m).unwrap();
        let SecurityHeader::Asymmetric(a) = sec else {
            panic!("asymmetric header")
        };
        assert_eq!(a.policy_uri.as_str(), Some(self.policy.uri()));
        assert_eq!(
            a.sender_certificate.as_bytes(),
            Some(self.server_cert.der())
        );
        let mine = Certificate::from_der(&self.cert_der).unwrap().thumbprint();
        assert_eq!(a.receiver_thumbprint.as_bytes(), Some(&mine[..]));
        let plain = open_asymmetric(
            self.policy,
            self.key_owner.rsa_key().unwrap(),
            &self.server_key,
            m,
            head_len,
        )
        .unwrap();
        let chunk = Chunk::parse(h, &plain).unwrap();
        let resp = decode_message(&mut Reader::new(chunk.body, &DecodeLimits::default()).unwrap())
            .unwrap();
        let resp = resp
            .as_any()
            .downcast_ref::<OpenSecureChannelResponse>()
            .unwrap()
            .clone();
        let server_nonce = resp.server_nonce.as_bytes().unwrap();
        assert_eq!(server_nonce.len(), 32);
        let keys = derive_keys(self.policy, &self.nonce, server_nonce).unwrap();
        self.token = resp.security_token.token_id;
        self.keys.push((self.token, keys));
        resp
    }

    fn keys(&self, token: u32) -> &ChannelKeys {
        &self.keys.iter().find(|(t, _)| *t == token).unwrap().1
    }

    fn encrypted(&self) -> bool {
        self.mode == MessageSecurityMode::SignAndEncrypt
    }

    fn send(&mut self, message_type: MessageType, request_id: u32, body: &[u8]) -> Vec<u8> {
        let keys = &self.keys.iter().find(|(t, _)| *t == self.token).unwrap().1;
        let protection = if self.encrypted() {
            Protection::SignAndEncrypt(&keys.client)
        } else {
            Protection::Sign(&keys.client)
        };
        let mut out = Vec::new();
        write_chunks_protected(
            &mut out,
            message_type,
            CHANNEL,
            &SecurityHeader::Symmetric(self.token),
            &protection,
            &mut self.seq,
            request_id,
            body,
            &SendLimits {
                max_chunk_size: self.chunk_size,
                max_message_size: 0,
                max_chunk_count: 0,
            },
        )
        .unwrap();
        out
    }

    fn request(&mut self, request_id: u32, message: &[u8]) -> Vec<u8> {
        self.send(MessageType::Message, request_id, message)
    }

    fn close(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        encode_message(&CloseSecureChannelRequest::default(), &mut body);
        self.send(MessageType::CloseSecureChannel, 99, &body)
    }

    /// Opens and reassembles the server's MSG chunks: (token, request id, body).
    fn responses(&self, out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut done = Vec::new();
        let mut body = Vec::new();
        for (h, mut m) in messages(out) {
            assert_eq!(h.message_type, MessageType::Message);
            assert!(m.len() <= self.chunk_size, "chunk fits the client's buffer");
            let (_, sec, head_len) = parse_security_header(&h, &m).unwrap();
            let SecurityHeader::Symmetric(token) = sec else {
                panic!("symmetric header")
            };
            let len = open_symmetric(
                &self.keys(token).server,
                self.encrypted(),
                &mut m,
                head_len,
                0,
            )
            .unwrap();
            let c = Chunk::parse(&h, &m[..len]).unwrap();
            body.extend_from_slice(c.body);
            if c.chunk_type == ChunkType::Final {
                done.push((token, c.request_id, std::mem::take(&mut body)));
            }
        }
        done
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// HEL/ACK and a secured OPN; returns the server and the client.
fn open_secure(
    clock: &Clock,
    budget: &Arc<ReassemblyBudget>,
    config: Arc<ChannelConfig>,
    mut c: SecureClient,
) -> (ServerConnection, SecureClient) {
    let mut s = PendingConnection::new().accept(clock.now(), CHANNEL, config, Arc::clone(budget));
    feed(&mut s, clock, &c.hello()).unwrap();
    take_out(&mut s);
    feed(&mut s, clock, &c.open(SecurityTokenRequestType::Issue)).unwrap();
    c.accept_open(&take_out(&mut s));
    assert_eq!(
        events(&mut s),
        vec![Event::Opened {
            channel_id: CHANNEL
        }]
    );
    (s, c)
}

fn client(policy: SecurityPolicy, mode: MessageSecurityMode) -> SecureClient {
    SecureClient::new(policy, mode, &client_id(), &server_id())
}

/// One request/response round trip that must work.
fn round_trip(s: &mut ServerConnection, c: &mut SecureClient, clock: &Clock, id: u32) {
    let req = read_request(3);
    feed(s, clock, &c.request(id, &req)).unwrap();
    assert_eq!(
        events(s),
        vec![Event::Request {
            request_id: id,
            body: req
        }]
    );
    s.send_response(id, b"answer").unwrap();
    let r = c.responses(&take_out(s));
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].1, &r[0].2[..]), (id, &b"answer"[..]));
}

/// A channel of `policy` and `mode` opened on a fresh clock and budget.
fn opened(
    policy: SecurityPolicy,
    mode: MessageSecurityMode,
) -> (Clock, ServerConnection, SecureClient) {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let (s, c) = open_secure(
        &clock,
        &budget,
        secure_config(&server_id()),
        client(policy, mode),
    );
    (clock, s, c)
}

/// A channel quiet for KEY_SCHEDULE_IDLE drops its AES key schedules and
/// stays open; the next request and answer build them again and go
/// through; messages keep moving the quiet deadline, at most once per
/// KEY_SCHEDULE_SLACK. Sign-only channels have none and arm no deadline.
#[test]
fn a_quiet_channel_drops_its_key_schedules_and_builds_them_again() {
    for policy in POLICIES {
        for mode in MODES {
            let (mut clock, mut s, mut c) = opened(policy, mode);
            let token_expiry = s.poll_timeout().unwrap();
            // The first request after the handshake counts as sparse.
            round_trip(&mut s, &mut c, &clock, 2);
            assert!(!s.holds_key_schedules(), "{policy:?} {mode:?}");
            let encrypts = mode == MessageSecurityMode::SignAndEncrypt;
            if !encrypts {
                round_trip(&mut s, &mut c, &clock, 3);
                assert!(!s.holds_key_schedules());
                assert_eq!(s.poll_timeout(), Some(token_expiry));
                continue;
            }
            let quiet = clock.now().instant + KEY_SCHEDULE_IDLE;
            assert_eq!(s.poll_timeout(), Some(quiet));
            // A message within the slack leaves the deadline (and, soon
            // after the one before, keeps the schedules); a later one
            // moves it.
            clock.advance(KEY_SCHEDULE_SLACK / 2);
            round_trip(&mut s, &mut c, &clock, 3);
            assert!(s.holds_key_schedules(), "{policy:?} {mode:?}");
            assert_eq!(s.poll_timeout(), Some(quiet));
            clock.advance(KEY_SCHEDULE_SLACK);
            round_trip(&mut s, &mut c, &clock, 4);
            assert!(s.holds_key_schedules());
            let quiet = clock.now().instant + KEY_SCHEDULE_IDLE;
            assert_eq!(s.poll_timeout(), Some(quiet));
            // Not yet quiet long enough.
            clock.advance(KEY_SCHEDULE_IDLE - Duration::from_millis(1));
            s.handle_timeout(clock.now());
            assert!(s.holds_key_schedules());
            // Quiet: dropped, still open, the token's expiry next.
            clock.advance(Duration::from_millis(1));
            s.handle_timeout(clock.now());
            assert!(!s.holds_key_schedules());
            assert!(!s.is_closed());
            assert!(events(&mut s).is_empty());
            assert_eq!(s.poll_timeout(), Some(token_expiry));
            // Built again for the next request and its answer (and, after
            // the quiet spell, dropped after use); kept once requests come
            // close together again.
            round_trip(&mut s, &mut c, &clock, 5);
            assert!(!s.holds_key_schedules());
            clock.advance(Duration::from_millis(10));
            round_trip(&mut s, &mut c, &clock, 6);
            assert!(s.holds_key_schedules());
        }
    }
}

/// Requests a second apart (a subscription's Publish round trips) find the
/// channel sparse: each direction builds its AES key schedule for the
/// message and drops it after use, also for answers sent later; requests
/// 100 ms apart keep them. Every message still goes through.
#[test]
fn a_sparse_channel_drops_its_key_schedules_after_each_use() {
    for policy in POLICIES {
        let (mut clock, mut s, mut c) = opened(policy, MessageSecurityMode::SignAndEncrypt);
        let mut id = 2;
        let mut next = |s: &mut ServerConnection, c: &mut SecureClient, clock: &Clock| {
            id += 1;
            round_trip(s, c, clock, id);
        };
        next(&mut s, &mut c, &clock);
        for _ in 0..3 {
            clock.advance(Duration::from_secs(1));
            let req = read_request(3);
            feed(&mut s, &clock, &c.request(40, &req)).unwrap();
            assert_eq!(events(&mut s).len(), 1);
            assert!(
                !s.holds_key_schedules(),
                "{policy:?}: dropped after decrypting"
            );
            // The answer, later: built for it and dropped again.
            clock.advance(Duration::from_millis(700));
            s.send_response(40, b"late answer").unwrap();
            assert!(
                !s.holds_key_schedules(),
                "{policy:?}: dropped after encrypting"
            );
            let r = c.responses(&take_out(&mut s));
            assert_eq!((r[0].1, &r[0].2[..]), (40, &b"late answer"[..]));
        }
        // Sparse after KEY_SCHEDULE_SPARSE; busy at 100 ms; sparse again.
        clock.advance(KEY_SCHEDULE_SPARSE);
        next(&mut s, &mut c, &clock);
        assert!(!s.holds_key_schedules(), "{policy:?}");
        for _ in 0..5 {
            clock.advance(Duration::from_millis(100));
            next(&mut s, &mut c, &clock);
            assert!(s.holds_key_schedules(), "{policy:?}: busy keeps them");
        }
        clock.advance(Duration::from_secs(1));
        next(&mut s, &mut c, &clock);
        assert!(!s.holds_key_schedules(), "{policy:?}: sparse again");
    }
}

#[test]
fn secured_channel_every_policy_and_mode() {
    for policy in POLICIES {
        for mode in MODES {
            let (mut clock, mut s, mut c) = opened(policy, mode);
            let sec = s.security();
            assert_eq!((sec.policy, sec.mode), (policy, mode));
            // RSA: the channel knows the client's certificate without
            // keeping its DER.
            let peer = sec.remote_certificate.as_ref().unwrap();
            assert_eq!(peer.der(), None);
            assert!(peer.is(client_id().certificate().der()));
            assert!(!peer.is(server_id().certificate().der()));
            assert_eq!(sec.remote_key().unwrap().unwrap().bits(), 2048);

            // A request over several chunks.
            let req = read_request(1000);
            let wire = c.request(2, &req);
            let chunks = messages(&wire);
            assert!(chunks.len() >= 3, "{policy:?} {mode:?}: {}", chunks.len());
            assert!(chunks.iter().all(|(_, m)| m.len() <= 8192));
            // Full chunks use the whole buffer up to one cipher block.
            let block = policy.symmetric_block_size();
            assert!(chunks[0].1.len() > 8192 - block, "{}", chunks[0].1.len());
            assert_eq!(
                contains(&wire, b"Demo.Node999"),
                mode == MessageSecurityMode::Sign,
                "plaintext visible only when not encrypted"
            );
            feed(&mut s, &clock, &wire).unwrap();
            assert_eq!(
                events(&mut s),
                vec![Event::Request {
                    request_id: 2,
                    body: req
                }]
            );

            // A response over several chunks, with every body length class.
            for len in [0usize, 1, 15, 16, 17, 8100, 20_000] {
                let body: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                s.send_response(2, &body).unwrap();
                let r = c.responses(&take_out(&mut s));
                assert_eq!(r, vec![(1, 2, body)], "{policy:?} {mode:?} {len}");
            }

            // Renewal: new keys; the server answers on the old token until
            // the client uses the new one.
            clock.advance(Duration::from_secs(40));
            feed(&mut s, &clock, &c.open(SecurityTokenRequestType::Renew)).unwrap();
            let resp = c.accept_open(&take_out(&mut s));
            assert_eq!(resp.security_token.token_id, 2);
            assert_eq!(events(&mut s), vec![Event::Renewed { token_id: 2 }]);
            assert_ne!(
                c.keys(1).client.policy(),
                SecurityPolicy::None,
                "keys of both tokens kept by the client"
            );
            s.send_response(3, b"old keys").unwrap();
            assert_eq!(
                c.responses(&take_out(&mut s)),
                vec![(1, 3, b"old keys".to_vec())]
            );
            // The old token is still accepted...
            c.token = 1;
            feed(&mut s, &clock, &c.request(4, b"x")).unwrap();
            // ...and the new one switches both directions.
            c.token = 2;
            feed(&mut s, &clock, &c.request(5, b"y")).unwrap();
            assert_eq!(events(&mut s).len(), 2);
            s.send_response(5, b"new keys").unwrap();
            assert_eq!(
                c.responses(&take_out(&mut s)),
                vec![(2, 5, b"new keys".to_vec())]
            );
            // Messages under the old token would now be refused; a CLO
            // under the new one closes cleanly.
            feed(&mut s, &clock, &c.close()).unwrap();
            assert_eq!(
                events(&mut s),
                vec![Event::Closed {
                    status: StatusCode::Good
                }]
            );
        }
    }
}

#[test]
fn keys_longer_than_2048_bits_use_the_extra_padding_byte() {
    for policy in POLICIES {
        let clock = Clock::new();
        let budget = ReassemblyBudget::new(1 << 20, 50);
        let c = SecureClient::new(
            policy,
            MessageSecurityMode::SignAndEncrypt,
            &client_id(),
            &server_4096(),
        );
        let (mut s, mut c) = open_secure(&clock, &budget, secure_config(&server_4096()), c);
        round_trip(&mut s, &mut c, &clock, 2);
    }

    // The padding bytes themselves: a 4096-bit receiver, OAEP-SHA1 blocks of
    // 470 bytes, bodies that make the padding 0, 204, 469 and 256 bytes.
    let receiver = server_4096();
    let receiver_key =
        RsaPublicKey::from_spki_der(receiver.certificate().subject_public_key_info_der()).unwrap();
    let sender = client_id();
    let policy = SecurityPolicy::Basic256Sha256;
    for (len, pad) in [(204usize, 0usize), (0, 204), (205, 469), (418, 256)] {
        let body = vec![0x5a; len];
        let mut out = Vec::new();
        let mut seq = SequenceNumbers::starting_at(1);
        write_chunks_protected(
            &mut out,
            MessageType::OpenSecureChannel,
            0,
            &SecurityHeader::Asymmetric(AsymmetricHeader::none()),
            &Protection::Asymmetric {
                policy,
                local: sender.rsa_key().unwrap(),
                remote: &receiver_key,
            },
            &mut seq,
            1,
            &body,
            &SendLimits {
                max_chunk_size: 8192,
                max_message_size: 0,
                max_chunk_count: 0,
            },
        )
        .unwrap();
        let (h, m) = &messages(&out)[0];
        let (_, _, head_len) = parse_security_header(h, m).unwrap();
        let mut raw = Vec::new();
        receiver
            .rsa_key()
            .unwrap()
            .decrypt(EncryptionPadding::OaepSha1, &m[head_len..], &mut raw)
            .unwrap();
        assert_eq!(raw.len() % 470, 0);
        let sig = sender.rsa_key().unwrap().size();
        let before_sig = &raw[..raw.len() - sig];
        let n = before_sig.len();
        assert_eq!(before_sig[n - 1] as usize, pad >> 8, "extra padding byte");
        assert_eq!(before_sig[n - 2] as usize, pad & 0xff, "padding size byte");
        assert!(before_sig[n - 2 - pad..n - 1]
            .iter()
            .all(|b| *b as usize == pad & 0xff));
        assert_eq!(n, SEQUENCE_HEADER_LEN + len + pad + 2);
        let plain = open_asymmetric(
            policy,
            receiver.rsa_key().unwrap(),
            sender.rsa_key().unwrap().public_key(),
            m,
            head_len,
        )
        .unwrap();
        assert_eq!(Chunk::parse(h, &plain).unwrap().body, &body[..]);
    }
}

#[derive(Debug)]
struct ExpiredCertificates;

impl CertificateValidator for ExpiredCertificates {
    fn validate(&self, _: &Certificate, _: &[u8], _: SecurityPolicy) -> Result<(), CryptoError> {
        Err(CryptoError::Certificate {
            status: StatusCode::BadCertificateTimeInvalid,
            what: "certificate expired",
        })
    }
}

/// Feeds `bytes` to a fresh handshake-done connection and expects the ERR.
/// The driver can tell, from the headers alone, which input carries a
/// secured OPN (RSA work) and which does not.
#[test]
fn asymmetric_work_is_recognised_before_it_is_done() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let config = secure_config(&server_id());
    let mut c = client(
        SecurityPolicy::Basic256Sha256,
        MessageSecurityMode::SignAndEncrypt,
    );
    let s = after_hello(&clock, &budget, Arc::clone(&config), &c);
    let opn = c.open(SecurityTokenRequestType::Issue);
    assert!(s.has_asymmetric_work(&opn));
    assert!(!s.has_asymmetric_work(&opn[..opn.len() - 1]), "incomplete");
    assert!(!s.has_asymmetric_work(&c.hello()), "a Hello");
    // Hello and OPN in one read: the OPN is still seen.
    let mut both = c.hello();
    both.extend_from_slice(&opn);
    assert!(s.has_asymmetric_work(&both));
    let (s, mut c) = open_secure(&clock, &budget, config, c);
    let msg = c.request(2, &read_request(1));
    assert!(!s.has_asymmetric_work(&msg), "a MSG");
    assert!(s.has_asymmetric_work(&c.open(SecurityTokenRequestType::Renew)));
}

/// A secured OPN received and answered in two steps opens and renews the
/// channel as one step does: receiving takes it from the input and sends
/// nothing; a Hello before it in the same input is answered; errors of
/// either step end in the ERR that one step gives.
#[test]
fn an_open_received_then_answered_is_the_same_handshake() {
    let clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let cfg = || secure_config(&server_id());
    for policy in POLICIES {
        for mode in MODES {
            let mut c = client(policy, mode);
            let mut s =
                PendingConnection::new().accept(clock.now(), CHANNEL, cfg(), Arc::clone(&budget));
            let mut input = c.hello();
            input.extend_from_slice(&c.open(SecurityTokenRequestType::Issue));
            let received = s.receive_open(clock.now(), &mut input).unwrap().unwrap();
            assert!(input.is_empty(), "the OPN is taken from the input");
            let out = take_out(&mut s);
            let kinds: Vec<_> = messages(&out).iter().map(|(h, _)| h.message_type).collect();
            assert_eq!(kinds, vec![MessageType::Acknowledge], "no answer yet");
            assert_eq!(events(&mut s), vec![]);
            s.answer_open(clock.now(), received).unwrap();
            c.accept_open(&take_out(&mut s));
            assert_eq!(
                events(&mut s),
                vec![Event::Opened {
                    channel_id: CHANNEL
                }]
            );
            round_trip(&mut s, &mut c, &clock, 2);
            // Renewal, in two steps too; the new token carries the next
            // request.
            let mut input = c.open(SecurityTokenRequestType::Renew);
            let received = s.receive_open(clock.now(), &mut input).unwrap().unwrap();
            assert!(take_out(&mut s).is_empty());
            s.answer_open(clock.now(), received).unwrap();
            let resp = c.accept_open(&take_out(&mut s));
            assert_eq!(resp.security_token.token_id, 2);
            assert_eq!(events(&mut s), vec![Event::Renewed { token_id: 2 }]);
            round_trip(&mut s, &mut c, &clock, 3);
            // Input without an OPN is handled as by handle_input.
            let req = read_request(1);
            let mut input = c.request(4, &req);
            assert!(s.receive_open(clock.now(), &mut input).unwrap().is_none());
            assert_eq!(
                events(&mut s),
                vec![Event::Request {
                    request_id: 4,
                    body: req
                }]
            );
        }
    }
    let p = SecurityPolicy::Basic256Sha256;
    let sae = MessageSecurityMode::SignAndEncrypt;
    // Refused while receiving: the receiver thumbprint is not ours.
    let mut c = client(p, sae);
    c.thumbprint = other_id().thumbprint().to_vec();
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let mut input = c.open(SecurityTokenRequestType::Issue);
    let e = s.receive_open(clock.now(), &mut input).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
    expect_error(&take_out(&mut s), StatusCode::BadSecurityChecksFailed);
    assert!(s.is_closed());
    // Refused while answering: a nonce of the wrong length.
    let mut c = client(p, sae);
    c.nonce_len = 16;
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let mut input = c.open(SecurityTokenRequestType::Issue);
    let received = s.receive_open(clock.now(), &mut input).unwrap().unwrap();
    let e = s.answer_open(clock.now(), received).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadNonceInvalid);
    expect_error(&take_out(&mut s), StatusCode::BadNonceInvalid);
    assert_eq!(
        events(&mut s),
        vec![Event::Closed {
            status: StatusCode::BadNonceInvalid
        }]
    );
    // Answering on a connection closed in between sends nothing more.
    let c = client(p, sae);
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let mut c = c;
    let mut input = c.open(SecurityTokenRequestType::Issue);
    let received = s.receive_open(clock.now(), &mut input).unwrap().unwrap();
    s.close_with(StatusCode::BadServerHalted, "halting");
    take_out(&mut s);
    s.answer_open(clock.now(), received).unwrap();
    assert!(take_out(&mut s).is_empty());
    assert!(s.is_closed());
}

fn expect_refused(s: &mut ServerConnection, clock: &Clock, bytes: &[u8], status: StatusCode) {
    let e = feed(s, clock, bytes).unwrap_err();
    assert_eq!(e.status_code(), status, "{e}");
    expect_error(&take_out(s), status);
    assert!(s.is_closed());
    assert_eq!(events(s).last(), Some(&Event::Closed { status }));
}

/// A connection after HEL/ACK, before OPN.
fn after_hello(
    clock: &Clock,
    budget: &Arc<ReassemblyBudget>,
    config: Arc<ChannelConfig>,
    c: &SecureClient,
) -> ServerConnection {
    let mut s = PendingConnection::new().accept(clock.now(), CHANNEL, config, Arc::clone(budget));
    feed(&mut s, clock, &c.hello()).unwrap();
    take_out(&mut s);
    s
}

#[test]
fn abuse_of_secured_channels_ends_in_the_right_error() {
    let mut clock = Clock::new();
    let budget = ReassemblyBudget::new(1 << 20, 50);
    let p = SecurityPolicy::Basic256Sha256;
    let sae = MessageSecurityMode::SignAndEncrypt;
    let (mut bystander, mut bc) =
        open_secure(&clock, &budget, secure_config(&server_id()), client(p, sae));
    let cfg = || secure_config(&server_id());

    for policy in POLICIES {
        for mode in MODES {
            // Tampered symmetric chunk: any flipped bit fails the HMAC.
            for at in [20, 100, 200] {
                let (mut s, mut c) = open_secure(&clock, &budget, cfg(), client(policy, mode));
                let mut wire = c.request(2, &read_request(10));
                wire[at] ^= 0x01;
                expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);
            }
            // Tampered OPN.
            let mut c = client(policy, mode);
            let mut s = after_hello(&clock, &budget, cfg(), &c);
            let mut wire = c.open(SecurityTokenRequestType::Issue);
            let n = wire.len();
            wire[n - 10] ^= 0x40;
            expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);
            // Replayed chunk: authentic, but its sequence number is used.
            let (mut s, mut c) = open_secure(&clock, &budget, cfg(), client(policy, mode));
            let wire = c.request(2, &read_request(1));
            feed(&mut s, &clock, &wire).unwrap();
            expect_refused(&mut s, &clock, &wire, StatusCode::BadSequenceNumberInvalid);
            // Nonce of the wrong length.
            let mut c = client(policy, mode);
            c.nonce_len = 16;
            let mut s = after_hello(&clock, &budget, cfg(), &c);
            let wire = c.open(SecurityTokenRequestType::Issue);
            expect_refused(&mut s, &clock, &wire, StatusCode::BadNonceInvalid);
        }
    }

    // Receiver thumbprint that is not the server's.
    let mut c = client(p, sae);
    c.thumbprint = other_id().thumbprint().to_vec();
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);

    // Encrypted for another key (right thumbprint): decryption fails.
    let mut c = client(p, sae);
    c.server_key =
        RsaPublicKey::from_spki_der(other_id().certificate().subject_public_key_info_der())
            .unwrap();
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);

    // Signed with a key that is not the sender certificate's.
    let mut c = client(p, sae);
    c.key_owner = other_id();
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);

    // A 1024-bit certificate is below every policy's minimum.
    let mut c = client(p, sae);
    c.cert_der = CERT_RSA1024.to_vec();
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(
        &mut s,
        &clock,
        &wire,
        StatusCode::BadCertificatePolicyCheckFailed,
    );

    // Garbage as sender certificate.
    let mut c = client(p, sae);
    c.cert_der = b"\x30\x03\x02\x01\x00".to_vec();
    let mut s = after_hello(&clock, &budget, cfg(), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadCertificateInvalid);

    // No validator: nobody is trusted. A validator's own code is passed on.
    let untrusted = config_with(ServerSecurity {
        validator: None,
        ..cfg().security.clone()
    });
    let mut c = client(p, sae);
    let mut s = after_hello(&clock, &budget, untrusted, &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadCertificateUntrusted);
    let expired = config_with(ServerSecurity {
        validator: Some(Arc::new(ExpiredCertificates)),
        ..cfg().security.clone()
    });
    let mut c = client(p, sae);
    let mut s = after_hello(&clock, &budget, expired, &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadCertificateTimeInvalid);

    // Mode and policy the endpoints do not offer.
    let encrypt_only = config_with(ServerSecurity {
        endpoints: vec![(p, sae)],
        ..cfg().security.clone()
    });
    let mut c = client(p, MessageSecurityMode::Sign);
    let mut s = after_hello(&clock, &budget, Arc::clone(&encrypt_only), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityModeRejected);
    let mut c = client(SecurityPolicy::Aes256Sha256RsaPss, sae);
    let mut s = after_hello(&clock, &budget, encrypt_only, &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityPolicyRejected);
    // The default configuration offers None only.
    let mut c = client(p, sae);
    let mut s = after_hello(&clock, &budget, Arc::new(ChannelConfig::default()), &c);
    let wire = c.open(SecurityTokenRequestType::Issue);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityPolicyRejected);

    // An unsigned chunk on a secured channel.
    let (mut s, mut c) = open_secure(&clock, &budget, cfg(), client(p, sae));
    let mut wire = Vec::new();
    let limits = c.limits();
    write_chunks(
        &mut wire,
        MessageType::Message,
        CHANNEL,
        &SecurityHeader::Symmetric(c.token),
        &mut c.seq,
        2,
        &read_request(2),
        &limits,
    )
    .unwrap();
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);

    // Renewal with another certificate.
    let (mut s, mut c) = open_secure(&clock, &budget, cfg(), client(p, sae));
    c.cert_der = other_id().certificate().der().to_vec();
    c.key_owner = other_id();
    let wire = c.open(SecurityTokenRequestType::Renew);
    expect_refused(&mut s, &clock, &wire, StatusCode::BadSecurityChecksFailed);

    // The bystander saw none of it.
    round_trip(&mut bystander, &mut bc, &clock, 2);

    // An expired token: renewed, then the old token used after its end
    // (the bystander renews too and carries on).
    let (mut s, mut c) = open_secure(&clock, &budget, cfg(), client(p, sae));
    clock.advance(Duration::from_secs(40));
    for (s, c) in [(&mut s, &mut c), (&mut bystander, &mut bc)] {
        feed(s, &clock, &c.open(SecurityTokenRequestType::Renew)).unwrap();
        c.accept_open(&take_out(s));
        events(s);
    }
    clock.advance(Duration::from_secs(40));
    c.token = 1;
    let wire = c.request(2, b"late");
    expect_refused(
        &mut s,
        &clock,
        &wire,
        StatusCode::BadSecureChannelTokenUnknown,
    );
    bystander.handle_timeout(clock.now());
    round_trip(&mut bystander, &mut bc, &clock, 3);
    assert!(!bystander.is_closed());
}
