//! A secured server connection past its signature check: for the (policy,
//! mode) the first byte picks - every policy the proto supports (the RSA
//! ones Basic256Sha256, Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss and
//! the ECC ones ECC_nistP256, ECC_nistP384, ECC_curve25519,
//! ECC_nistP256_AesGcm, ECC_nistP256_ChaChaPoly) x Sign / SignAndEncrypt -
//! the channel is opened properly with fixed identities (ephemeral keys,
//! the ChannelThumbprint and chained renewals for ECC),
//! then the rest of the input is a program of symmetric chunks that are
//! signed (and encrypted) with the channel's real keys: chosen chunk kind
//! (F, C, A), token id (current, previous after a renewal, any), sequence
//! number (next, skipped, repeated, any), request id, size and body; the
//! same chunks corrupted after sealing (a flipped byte, a wrong size, cut
//! short, trailing bytes); raw bytes; CloseSecureChannel; one renewal; and
//! clock steps. Each is fed split at a chosen point.
//!
//! Checks: no panic; a closed connection stays closed; every response the
//! server sends to a request it accepted opens with the server's keys of
//! the channel (the client could read it).
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use uascale_crypto::ecc::{EccPrivateKey, EccPublicKey, EphemeralKey, Secret};
use uascale_crypto::policy::{derive_keys, ChannelKeys, SecurityPolicy, SymmetricKeys};
use uascale_crypto::rsa::{RsaPrivateKey, RsaPublicKey};
use uascale_crypto::x509::{create_self_signed, KeyType, SelfSignedParams};
use uascale_proto::chunk::{
    parse_security_header, write_chunks_protected, AsymmetricHeader, Chunk, SecurityHeader,
    SendLimits, SequenceNumbers,
};
use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::security::{
    ecc_token_keys, open_asymmetric, open_asymmetric_ecc, open_symmetric, PrivateKey, Protection,
};
use uascale_proto::tcp::{ChunkType, Hello, MessageHeader, MessageType, HEADER_LEN};
use uascale_proto::{
    ChannelConfig, Event, Identity, Now, PendingConnection, ServerConnection, ServerSecurity,
    TrustAllCertificates,
};
use uascale_types::{
    decode_message, encode_message, ByteString, CloseSecureChannelRequest, DateTime, DecodeLimits,
    MessageSecurityMode, OpenSecureChannelRequest, OpenSecureChannelResponse, Reader,
    RequestHeader, SecurityTokenRequestType, UaString,
};

const CHANNEL: u32 = 5;
const POLICIES: [SecurityPolicy; 8] = [
    SecurityPolicy::Basic256Sha256,
    SecurityPolicy::Aes128Sha256RsaOaep,
    SecurityPolicy::Aes256Sha256RsaPss,
    SecurityPolicy::EccNistP256,
    SecurityPolicy::EccNistP384,
    SecurityPolicy::EccCurve25519,
    SecurityPolicy::EccNistP256AesGcm,
    SecurityPolicy::EccNistP256ChaChaPoly,
];
const MODES: [MessageSecurityMode; 2] = [
    MessageSecurityMode::Sign,
    MessageSecurityMode::SignAndEncrypt,
];
const CHUNK_SIZE: usize = 8192;

fn identity(name: &str, key_type: KeyType) -> Arc<Identity> {
    let mut p = SelfSignedParams::new(
        &format!("urn:uascale:fuzz:{name}"),
        name,
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    );
    p.key_bits = 2048;
    p.key_type = key_type;
    let made = create_self_signed(&p).expect("a certificate");
    let key = match key_type {
        KeyType::Rsa => PrivateKey::Rsa(
            RsaPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).expect("its key"),
        ),
        _ => PrivateKey::Ecc(
            EccPrivateKey::from_pkcs8_der(&made.private_key_pkcs8_der).expect("its key"),
        ),
    };
    Arc::new(Identity::with_key(made.certificate, key).expect("an identity"))
}

/// The ECC certificates' key types, one per curve.
const ECC_KEYS: [KeyType; 3] = [KeyType::EcP256, KeyType::EcP384, KeyType::Ed25519];

struct Fixed {
    server: Arc<Identity>,
    client: Arc<Identity>,
    server_key: RsaPublicKey,
    /// Per curve of [`ECC_KEYS`]: the server's and the client's identity,
    /// and the server's public key.
    ecc: Vec<(Arc<Identity>, Arc<Identity>, EccPublicKey)>,
    config: Arc<ChannelConfig>,
}

impl Fixed {
    /// The ECC identities for `policy`'s curve.
    fn ecc_for(&self, policy: SecurityPolicy) -> &(Arc<Identity>, Arc<Identity>, EccPublicKey) {
        self.ecc
            .iter()
            .find(|(s, _, _)| s.suits(policy))
            .expect("an ECC identity per curve")
    }
}

/// Made once per process: the identities and the server's configuration
/// (every policy and mode offered, any client certificate trusted).
fn fixed() -> &'static Fixed {
    static F: OnceLock<Fixed> = OnceLock::new();
    F.get_or_init(|| {
        let server = identity("server", KeyType::Rsa);
        let client = identity("client", KeyType::Rsa);
        let ecc: Vec<_> = ECC_KEYS
            .iter()
            .map(|k| {
                let s = identity(&format!("server-{}", k.name()), *k);
                let c = identity(&format!("client-{}", k.name()), *k);
                let public = s.ecc_key().expect("ECC").public_key().clone();
                (s, c, public)
            })
            .collect();
        let server_key =
            RsaPublicKey::from_spki_der(server.certificate().subject_public_key_info_der())
                .expect("RSA");
        let mut endpoints = Vec::new();
        for p in POLICIES {
            for m in MODES {
                endpoints.push((p, m));
            }
        }
        let config = Arc::new(ChannelConfig {
            security: ServerSecurity {
                identity: Some(Arc::clone(&server)),
                ecc_identities: ecc.iter().map(|(s, _, _)| Arc::clone(s)).collect(),
                endpoints,
                validator: Some(Arc::new(TrustAllCertificates)),
            },
            ..ChannelConfig::default()
        });
        Fixed {
            server,
            client,
            server_key,
            ecc,
            config,
        }
    })
}

/// The fuzz input, read front to back; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The client's side of the channel.
struct Peer {
    policy: SecurityPolicy,
    mode: MessageSecurityMode,
    seq: SequenceNumbers,
    /// The last sequence number used (for repeats).
    last_seq: u32,
    nonce: Vec<u8>,
    /// (token id, keys), the newest last.
    tokens: Vec<(u32, ChannelKeys)>,
    /// ECC: the ephemeral key of the OPN in flight.
    ephemeral: Option<EphemeralKey>,
    /// ECC with enhancements: the current token's input keying material.
    ikm: Option<Secret>,
    /// ECC with enhancements: our first OPN's signature, then the
    /// ChannelThumbprint.
    request_signature: Vec<u8>,
    thumbprint: Vec<u8>,
    /// The sequence number of the server's last chunk (AEAD IV masks).
    server_last: u32,
}

impl Peer {
    fn encrypted(&self) -> bool {
        self.mode == MessageSecurityMode::SignAndEncrypt
    }

    fn protection<'k>(&self, keys: &'k SymmetricKeys) -> Protection<'k> {
        if self.encrypted() {
            Protection::SignAndEncrypt(keys)
        } else {
            Protection::Sign(keys)
        }
    }

    /// A signed (and encrypted) OpenSecureChannel request.
    fn open(&mut self, kind: SecurityTokenRequestType) -> Vec<u8> {
        let f = fixed();
        // A fixed nonce: the server's is random, so keys still differ per
        // run, but the plaintext is the input's. ECC: an ephemeral key.
        self.nonce = match self.policy.curve() {
            Some(curve) => {
                let key = EphemeralKey::generate(curve).expect("a key");
                let nonce = key.public_nonce().to_vec();
                self.ephemeral = Some(key);
                nonce
            }
            None => (0..self.policy.nonce_length())
                .map(|i| (i as u8).wrapping_mul(37).wrapping_add(11))
                .collect(),
        };
        let req = OpenSecureChannelRequest {
            request_header: RequestHeader {
                request_handle: 1,
                ..Default::default()
            },
            client_protocol_version: 0,
            request_type: kind,
            security_mode: self.mode,
            client_nonce: ByteString::new(self.nonce.clone()),
            requested_lifetime: 600_000,
        };
        let mut body = Vec::new();
        encode_message(&req, &mut body);
        let (server, client) = if self.policy.is_ecc() {
            let (s, c, _) = f.ecc_for(self.policy);
            (s, c)
        } else {
            (&f.server, &f.client)
        };
        let header = AsymmetricHeader {
            policy_uri: UaString::from(self.policy.uri()),
            sender_certificate: ByteString::new(client.certificate().der().to_vec()),
            receiver_thumbprint: ByteString::new(server.thumbprint().to_vec()),
        };
        let channel_id = match kind {
            SecurityTokenRequestType::Issue => 0,
            _ => CHANNEL,
        };
        let mut out = Vec::new();
        let seq = self.seq.take();
        self.last_seq = seq;
        let protection = match client.key() {
            PrivateKey::Rsa(local) => Protection::Asymmetric {
                policy: self.policy,
                local,
                remote: &f.server_key,
            },
            PrivateKey::Ecc(local) => Protection::EccAsymmetric {
                policy: self.policy,
                local,
                signed_suffix: &[],
            },
        };
        let _ = write_chunks_protected(
            &mut out,
            MessageType::OpenSecureChannel,
            channel_id,
            &SecurityHeader::Asymmetric(header),
            &protection,
            &mut SequenceNumbers::starting_at(seq),
            1,
            &body,
            &limits(),
        );
        if self.policy.secure_channel_enhancements() && self.thumbprint.is_empty() {
            let sig = client.key().signature_length();
            self.request_signature = out[out.len().saturating_sub(sig)..].to_vec();
        }
        out
    }

    /// Reads the server's OPN response (its nonce gives the keys of the
    /// new token); false when there is none.
    fn accept_open(&mut self, out: &[u8]) -> bool {
        let f = fixed();
        for (h, m) in split_messages(out) {
            if h.message_type != MessageType::OpenSecureChannel {
                continue;
            }
            let Ok((_, _, head_len)) = parse_security_header(&h, m) else {
                return false;
            };
            let plain = if self.policy.is_ecc() {
                let (_, _, server) = f.ecc_for(self.policy);
                let first =
                    self.policy.secure_channel_enhancements() && self.thumbprint.is_empty();
                let suffix = if first {
                    self.request_signature.clone()
                } else {
                    Vec::new()
                };
                let Ok(at) = open_asymmetric_ecc(self.policy, server, m, head_len, &suffix) else {
                    return false;
                };
                if first {
                    self.thumbprint = m[at..].to_vec();
                }
                m[..at].to_vec()
            } else {
                let Ok(plain) = open_asymmetric(
                    self.policy,
                    f.client.rsa_key().expect("RSA"),
                    &f.server_key,
                    m,
                    head_len,
                ) else {
                    return false;
                };
                plain
            };
            let Ok(chunk) = Chunk::parse(&h, &plain) else {
                return false;
            };
            let limits = DecodeLimits::default();
            let Ok(mut r) = Reader::new(chunk.body, &limits) else {
                return false;
            };
            let Ok(msg) = decode_message(&mut r) else {
                return false;
            };
            let Some(resp) = msg.as_any().downcast_ref::<OpenSecureChannelResponse>() else {
                return false;
            };
            let Some(server_nonce) = resp.server_nonce.as_bytes() else {
                return false;
            };
            let keys = if self.policy.is_ecc() {
                let Some(ephemeral) = self.ephemeral.take() else {
                    return false;
                };
                let Ok((keys, ikm)) = ecc_token_keys(
                    self.policy,
                    &ephemeral,
                    server_nonce,
                    &self.nonce,
                    server_nonce,
                    self.ikm.as_ref(),
                ) else {
                    return false;
                };
                self.ikm = self.policy.secure_channel_enhancements().then_some(ikm);
                keys
            } else {
                let Ok(keys) = derive_keys(self.policy, &self.nonce, server_nonce) else {
                    return false;
                };
                keys
            };
            self.server_last = chunk.sequence_number;
            self.tokens.push((resp.security_token.token_id, keys));
            return true;
        }
        false
    }

    /// One symmetric chunk of `message_type`, sealed with the keys of
    /// `keys_of` (a token we hold) but naming `token` in its header.
    #[allow(clippy::too_many_arguments)]
    fn chunk(
        &self,
        message_type: MessageType,
        chunk_type: ChunkType,
        token: u32,
        keys_of: usize,
        seq: u32,
        request_id: u32,
        body: &[u8],
    ) -> Vec<u8> {
        let Some((_, keys)) = self.tokens.get(keys_of) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        MessageHeader::write_start(&mut out, message_type, chunk_type);
        out.extend_from_slice(&CHANNEL.to_le_bytes());
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&request_id.to_le_bytes());
        out.extend_from_slice(body);
        if self
            .protection(&keys.client)
            .seal(&mut out, 0, HEADER_LEN + 8)
            .is_err()
        {
            return Vec::new();
        }
        out
    }
}

/// The server's output as (header, whole message) pairs (it writes whole
/// messages only).
fn split_messages(bytes: &[u8]) -> Vec<(MessageHeader, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(Some(h)) = MessageHeader::parse(&bytes[at..], u32::MAX) {
        let end = at + h.message_size as usize;
        assert!(end <= bytes.len(), "the server writes whole messages");
        out.push((h, &bytes[at..end]));
        at = end;
    }
    assert_eq!(at, bytes.len(), "the server writes whole messages");
    out
}

fn limits() -> SendLimits {
    SendLimits {
        max_chunk_size: CHUNK_SIZE,
        max_message_size: 0,
        max_chunk_count: 0,
    }
}

/// Feeds `bytes` in two pieces split at `at`; the server's output is
/// appended to `out`.
fn feed(s: &mut ServerConnection, now: Now, bytes: &[u8], at: usize, out: &mut Vec<u8>) {
    let at = at.min(bytes.len());
    let mut input = Vec::new();
    for piece in [&bytes[..at], &bytes[at..]] {
        input.extend_from_slice(piece);
        let was_closed = s.is_closed();
        let _ = s.handle_input(now, &mut input);
        assert!(
            !was_closed || s.is_closed(),
            "a closed channel stays closed"
        );
        s.poll_transmit(out);
    }
}

/// Every MSG chunk in `out` opens with the server keys of the token it
/// names.
fn check_responses(peer: &mut Peer, out: &[u8]) {
    for (h, m) in split_messages(out) {
        if h.message_type != MessageType::Message {
            continue;
        }
        let mut m = m.to_vec();
        let (_, sec, head_len) = parse_security_header(&h, &m).expect("a response header");
        let SecurityHeader::Symmetric(token) = sec else {
            panic!("a MSG with an asymmetric header");
        };
        let (_, keys) = peer
            .tokens
            .iter()
            .find(|(t, _)| *t == token)
            .expect("a response on a token the client holds");
        let len = open_symmetric(
            &keys.server,
            peer.encrypted(),
            &mut m,
            head_len,
            peer.server_last,
        )
        .expect("the response opens with the channel's keys");
        let chunk = Chunk::parse(&h, &m[..len]).expect("the response parses");
        peer.server_last = chunk.sequence_number;
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let combo = usize::from(input.byte()) % (POLICIES.len() * MODES.len());
    let (policy, mode) = (POLICIES[combo / MODES.len()], MODES[combo % MODES.len()]);
    let f = fixed();
    let mut now = Now {
        instant: Instant::now(),
        utc: DateTime::from_ticks(133_590_384_000_000_000),
    };
    let budget = ReassemblyBudget::new(256 * 1024, 50);
    let mut s = PendingConnection::new().accept(now, CHANNEL, Arc::clone(&f.config), budget);
    let mut out = Vec::new();
    let mut hello = Vec::new();
    Hello {
        protocol_version: 0,
        receive_buffer_size: CHUNK_SIZE as u32,
        send_buffer_size: CHUNK_SIZE as u32,
        max_message_size: 0,
        max_chunk_count: 0,
        endpoint_url: UaString::from("opc.tcp://localhost:4840"),
    }
    .encode_message(&mut hello);
    feed(&mut s, now, &hello, hello.len(), &mut out);
    out.clear();
    let mut peer = Peer {
        policy,
        mode,
        seq: SequenceNumbers::for_policy(policy),
        last_seq: 0,
        nonce: Vec::new(),
        tokens: Vec::new(),
        ephemeral: None,
        ikm: None,
        request_signature: Vec::new(),
        thumbprint: Vec::new(),
        server_last: 0,
    };
    let opn = peer.open(SecurityTokenRequestType::Issue);
    feed(&mut s, now, &opn, opn.len(), &mut out);
    assert!(peer.accept_open(&out), "the channel opens");
    assert!(matches!(s.poll_event(), Some(Event::Opened { .. })));
    assert_eq!(
        s.security().thumbprint(),
        peer.thumbprint.as_slice(),
        "both sides hold the same ChannelThumbprint"
    );
    out.clear();

    let mut renewed = false;
    let mut next_request = 1u32;
    while !input.is_empty() && !s.is_closed() {
        let op = input.byte();
        let split = usize::from(input.u16());
        let mut wire = match op % 8 {
            // A sealed MSG chunk, or the same corrupted after sealing.
            0..=4 => {
                let chunk_type = match input.byte() % 4 {
                    0 | 1 => ChunkType::Final,
                    2 => ChunkType::Intermediate,
                    _ => ChunkType::Abort,
                };
                let newest = peer.tokens.len() - 1;
                let (token, keys_of) = match input.byte() % 8 {
                    0 => (input.u32(), newest),
                    1 => (peer.tokens[0].0, 0),
                    _ => (peer.tokens[newest].0, newest),
                };
                let seq = match input.byte() % 8 {
                    0 => peer.last_seq,
                    1 => peer.last_seq.wrapping_add(u32::from(input.byte()) + 2),
                    2 => input.u32(),
                    _ => peer.seq.take(),
                };
                peer.last_seq = seq;
                let request_id = match input.byte() % 4 {
                    0 => input.u32(),
                    _ => next_request,
                };
                if chunk_type == ChunkType::Final {
                    next_request = next_request.wrapping_add(1);
                }
                let len = usize::from(input.u16()) % (CHUNK_SIZE + 64);
                let body = input.bytes(len).to_vec();
                let mut chunk = peer.chunk(
                    MessageType::Message,
                    chunk_type,
                    token,
                    keys_of,
                    seq,
                    request_id,
                    &body,
                );
                if op % 8 == 4 && !chunk.is_empty() {
                    let at = usize::from(input.u16()) % chunk.len();
                    match input.byte() % 4 {
                        0 => chunk[at] ^= input.byte() | 1,
                        1 => chunk.truncate(at.max(HEADER_LEN)),
                        2 => {
                            let size = input.u32();
                            chunk[4..8].copy_from_slice(&size.to_le_bytes());
                        }
                        _ => {
                            let extra = usize::from(input.byte());
                            chunk.extend_from_slice(input.bytes(extra));
                        }
                    }
                }
                chunk
            }
            // Raw bytes.
            5 => {
                let len = usize::from(input.u16()) % 512;
                input.bytes(len).to_vec()
            }
            // CloseSecureChannel, sealed.
            6 => {
                let mut body = Vec::new();
                encode_message(&CloseSecureChannelRequest::default(), &mut body);
                let newest = peer.tokens.len() - 1;
                let seq = peer.seq.take();
                peer.last_seq = seq;
                peer.chunk(
                    MessageType::CloseSecureChannel,
                    ChunkType::Final,
                    peer.tokens[newest].0,
                    newest,
                    seq,
                    next_request,
                    &body,
                )
            }
            // A renewal (once: it costs RSA or ECDH), else a clock step.
            _ => {
                if !renewed && input.byte() % 2 == 0 {
                    renewed = true;
                    let opn = peer.open(SecurityTokenRequestType::Renew);
                    feed(&mut s, now, &opn, split, &mut out);
                    peer.accept_open(&out);
                    out.clear();
                    Vec::new()
                } else {
                    now.instant += Duration::from_millis(u64::from(input.u16()) * 50);
                    if s.poll_timeout().is_some_and(|t| t <= now.instant) {
                        s.handle_timeout(now);
                    }
                    s.poll_transmit(&mut out);
                    Vec::new()
                }
            }
        };
        if !wire.is_empty() {
            feed(&mut s, now, &wire, split, &mut out);
            wire.clear();
        }
        // Answer what came through, as the server's dispatcher would.
        while let Some(ev) = s.poll_event() {
            if let Event::Request { request_id, body } = ev {
                let _ = s.send_response(request_id, &body[..body.len().min(64)]);
                s.poll_transmit(&mut out);
            }
        }
        check_responses(&mut peer, &out);
        out.clear();
    }
});
