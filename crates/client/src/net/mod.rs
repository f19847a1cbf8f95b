//! The tokio shell: one task per connection drives a
//! [`ClientConnection`] - it writes what the connection yields, feeds it
//! what the socket reads, runs its timers - and matches responses to the
//! requests waiting for them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPublicKey;
use uascale_crypto::x509::Certificate;
use uascale_proto::ecc_secret;
use uascale_proto::security::{
    activate_session_signed_data, create_session_signed_data, leaf_certificate,
    user_token_signed_data, Identity, PrivateKey, PublicKey,
};
use uascale_proto::{ClientConfig, ClientConnection, ClientEvent, ClientSecurity, Now};
use uascale_types as t;
use uascale_types::{
    encode_message, BinaryDecode, DataValue, DateTime, DecodeLimits, DynStructure, NodeId, Reader,
    ResponseHeader, StatusCode, UaString,
};

use crate::backoff::Backoff;
use crate::error::ClientError;
use crate::security::{self, ServerTrust, UserIdentity};

pub mod https;
pub mod pipeline;

mod gate;
mod reconnect;
pub(crate) mod subscription;

pub use gate::{ConnectGate, GateTurn};
pub use subscription::{MonitoredItem, Subscription};

fn now() -> Now {
    Now {
        instant: Instant::now(),
        utc: DateTime::from_system_time(SystemTime::now()),
    }
}

/// How a client connects and waits.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long a request may wait for its response. Default 10 s. It is
    /// also the dead-peer timeout: when a request's timeout passes and
    /// not a byte has come from the server since it was sent, the
    /// connection is given up (and, with [`reconnect`](Self::reconnect),
    /// opened again) rather than left hanging on a silent network.
    pub request_timeout: Duration,
    /// TCP connect plus channel opening. Default 10 s.
    pub connect_timeout: Duration,
    /// The session timeout asked for. Default 60 s.
    pub session_timeout: Duration,
    /// Buffer sizes, limits and token lifetime of the channel.
    pub channel: ClientConfig,
    /// Decode limits for responses.
    pub decode: DecodeLimits,
    /// The local address to connect from (e.g. 127.0.0.2, to spread many
    /// connections over more than one source address); `None` lets the OS
    /// choose.
    pub local_addr: Option<std::net::IpAddr>,
    /// The channel's security. Default: SecurityPolicy None.
    pub security: SecurityOptions,
    /// Who sessions are activated as. Default: anonymous.
    pub identity: UserIdentity,
    /// Our ApplicationUri (must be the one in our certificate when
    /// secured). Default `urn:uascale:client`.
    pub application_uri: String,
    /// Whether a lost connection is opened again in the background (new
    /// channel, ActivateSession of the same session, else a new session
    /// that takes the subscriptions over). Default true.
    pub reconnect: bool,
    /// The waits between reconnect attempts and between [`Client::open`]
    /// attempts (docs/scalability.md §7); each client draws its own jitter.
    pub backoff: Backoff,
    /// Attempts in all of [`Client::open`]. Default 5.
    pub connect_attempts: u32,
    /// A gate shared by many clients that limits how many connect at once
    /// (initial connects, session creation and reconnects). Default none.
    pub connect_gate: Option<ConnectGate>,
    /// Publish requests kept outstanding per client while it has
    /// subscriptions (at most one more than it has subscriptions). Default 2.
    pub publish_requests: usize,
    /// Told about every attempt of [`Client::open`] as it ends (a load
    /// generator counts busy answers, hints and stages with it). Default
    /// none.
    pub on_open_attempt: Option<OpenObserver>,
    /// A retry ticket to echo, once, in the next Hello's endpoint URL
    /// (`?RetryTicket=...`; docs/scalability.md, "Retry tickets"):
    /// [`Client::open`] sets it from the busy ERR of the attempt before.
    /// Default none.
    pub retry_ticket: Option<String>,
    /// A retry ticket to echo, once, in the next CreateSession's
    /// additionalHeader: [`Client::open`] sets it from the busy
    /// ServiceFault of the attempt before. Default none.
    pub session_retry_ticket: Option<String>,
    /// Over opc.https, after a busy answer (429 or 503), hold the link's
    /// further requests (Publish and CloseSession excepted) until its hint
    /// has passed. Default true; false makes a client that ignores hints
    /// (what `uascale bench read --ignore-hints` floods with).
    pub hold_after_busy: bool,
}

/// The secure channel a client asks for.
#[derive(Debug, Clone)]
pub struct SecurityOptions {
    /// The security policy.
    pub policy: SecurityPolicy,
    /// The message security mode (None only with SecurityPolicy None).
    pub mode: t::MessageSecurityMode,
    /// Our application instance certificate and key; required by every
    /// policy but None.
    pub certificate: Option<Arc<Identity>>,
    /// The server certificate (DER). When absent, [`Client::connect`] asks
    /// the server for its endpoints over an unsecured channel first.
    pub server_certificate: Option<Vec<u8>>,
    /// How the server certificate is judged.
    pub trust: ServerTrust,
}

impl Default for SecurityOptions {
    fn default() -> Self {
        SecurityOptions {
            policy: SecurityPolicy::None,
            mode: t::MessageSecurityMode::None,
            certificate: None,
            server_certificate: None,
            trust: ServerTrust::default(),
        }
    }
}

/// `Basic256Sha256:SignAndEncrypt` for a policy URI and a mode.
pub fn endpoint_name(policy_uri: &str, mode: t::MessageSecurityMode) -> String {
    let short = policy_uri.rsplit('#').next().unwrap_or(policy_uri);
    format!("{short}:{mode:?}")
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            session_timeout: Duration::from_secs(60),
            channel: ClientConfig::default(),
            decode: DecodeLimits::default(),
            local_addr: None,
            security: SecurityOptions::default(),
            identity: UserIdentity::Anonymous,
            application_uri: "urn:uascale:client".into(),
            reconnect: true,
            backoff: Backoff::default(),
            connect_attempts: 5,
            connect_gate: None,
            publish_requests: 2,
            hold_after_busy: true,
            on_open_attempt: None,
            retry_ticket: None,
            session_retry_ticket: None,
        }
    }
}

type Reply = oneshot::Sender<Result<Vec<u8>, ClientError>>;

/// What the client sends its connection task.
pub(crate) enum Command {
    /// A request; `deadline` is when its caller stops waiting.
    Request {
        message: Vec<u8>,
        reply: Reply,
        deadline: Instant,
    },
    Close {
        done: oneshot::Sender<()>,
    },
    /// The channel's ChannelThumbprint (empty but for policies with
    /// SecureChannelEnhancements).
    Thumbprint {
        reply: oneshot::Sender<Vec<u8>>,
    },
}

/// The sending side of one connection task.
pub(crate) type Link = mpsc::UnboundedSender<Command>;

/// Where the client's connection is.
#[derive(Debug, Clone)]
pub(crate) enum LinkState {
    /// Opening the first channel.
    Connecting,
    /// A channel is open; requests go out.
    Connected,
    /// The channel was lost; a new one is being opened (requests wait).
    Reconnecting,
    /// Closed for good, with the reason.
    Closed(ClientError),
}

/// The session as the client knows it: enough to activate it again on a
/// new channel.
#[derive(Debug, Default)]
pub(crate) struct SessionState {
    /// The authentication token; null without a session.
    pub auth: NodeId,
    /// The session's name.
    pub name: String,
    /// The last server nonce (CreateSession or ActivateSession response).
    pub server_nonce: Vec<u8>,
    /// The server's certificate as CreateSession sent it (for the
    /// identity token's encryption and signature).
    pub server_certificate: Vec<u8>,
    /// The token policies the server offered for our identity kinds.
    pub token_policies: Vec<t::UserTokenPolicy>,
    /// ECC: the CreateSession ClientNonce (channel-bound signatures).
    pub client_nonce: Vec<u8>,
    /// ECC: the server's last ECDHKey (an EccEncryptedSecret is encrypted
    /// for it).
    pub ecdh_key: Vec<u8>,
}

/// The state a [`Client`] shares with its connection, reconnect and
/// publish tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub link: Mutex<Option<(u64, Link)>>,
    pub generation: AtomicU64,
    pub state: watch::Sender<LinkState>,
    pub closing: AtomicBool,
    pub endpoint_url: String,
    pub session: Mutex<SessionState>,
    pub next_handle: AtomicU32,
    pub options: ClientOptions,
    pub security: ClientSecurity,
    pub subscriptions: Mutex<subscription::Registry>,
    /// Security tokens renewed, over every channel of the client.
    pub renewals: Arc<AtomicU64>,
    /// The retry ticket the first Hello echoes (taken by it).
    pub retry_ticket: Mutex<Option<String>>,
    /// The retry ticket the first CreateSession echoes (taken by it).
    pub session_retry_ticket: Mutex<Option<String>>,
}

/// A connection to one server, with at most one session. With
/// [`ClientOptions::reconnect`] set (the default), a lost connection is
/// opened again in the background and the session activated on it (or a
/// new session takes over the subscriptions); requests made meanwhile wait
/// for it, up to their timeout.
#[derive(Debug)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shared.shut_down(ClientError::Closed);
    }
}

/// Splits `opc.tcp://host:port[/path]` (or `opc.https://host:port[/path]`)
/// into host and port; without a port, 4840 for opc.tcp and 443 for
/// opc.https.
pub fn parse_url(url: &str) -> Result<(String, u16), ClientError> {
    let bad = || ClientError::BadUrl(url.to_owned());
    let (rest, default_port) = match url.strip_prefix("opc.tcp://") {
        Some(rest) => (rest, "4840"),
        None => (url.strip_prefix("opc.https://").ok_or_else(bad)?, "443"),
    };
    let authority = rest.split('/').next().unwrap_or("");
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, p) = v6.split_once(']').ok_or_else(bad)?;
        (h, p.strip_prefix(':').unwrap_or(default_port))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => (authority, default_port),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = port.parse().map_err(|_| bad())?;
    Ok((host.to_owned(), port))
}

/// The `RetryTicket` of a response header (docs/scalability.md, "Retry
/// tickets"): 34 hex digits at most 64 long, else none.
pub fn retry_ticket(header: &ResponseHeader) -> Option<String> {
    let params = header
        .additional_header
        .downcast_ref::<t::AdditionalParametersType>()?;
    params.parameters.as_ref()?.iter().find_map(|kv| {
        if kv.key.namespace_index != 0 || kv.key.name != "RetryTicket" {
            return None;
        }
        match &kv.value {
            t::Variant::String(s) => s
                .as_str()
                .filter(|t| !t.is_empty() && t.len() <= 64)
                .map(str::to_owned),
            _ => None,
        }
    })
}

/// The `RetryAfterMs` hint of a response header (docs/scalability.md §2).
pub fn retry_after_ms(header: &ResponseHeader) -> Option<u64> {
    let params = header
        .additional_header
        .downcast_ref::<t::AdditionalParametersType>()?;
    params.parameters.as_ref()?.iter().find_map(|kv| {
        if kv.key.namespace_index != 0 || kv.key.name != "RetryAfterMs" {
            return None;
        }
        match kv.value {
            t::Variant::Int64(ms) => u64::try_from(ms).ok(),
            t::Variant::UInt32(ms) => Some(u64::from(ms)),
            t::Variant::Int32(ms) => u64::try_from(ms).ok(),
            _ => None,
        }
    })
}

/// What [`Client::open`] went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectReport {
    /// Attempts that failed and were retried.
    pub retries: u32,
    /// Of those, the ones the server refused as busy (§7 busy signals).
    pub busy_answers: u32,
    /// Of the busy answers, those that came without a retry-after hint.
    pub busy_without_hint: u32,
}

/// Where an attempt of [`Client::open`] was when it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenStage {
    /// TCP connect, Hello/Acknowledge and OpenSecureChannel.
    Connect,
    /// CreateSession (the channel was open).
    CreateSession,
    /// ActivateSession (the server had created the session).
    ActivateSession,
}

/// One ended attempt of [`Client::open`], as [`ClientOptions::on_open_attempt`]
/// hears it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OpenAttempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// How long it waited for its turn of the connect gate.
    pub gate_wait: Duration,
    /// From its turn to its end.
    pub took: Duration,
    /// `None` when the session was activated; else the stage it failed in
    /// and why.
    pub failure: Option<(OpenStage, ClientError)>,
    /// The wait before the next attempt (at least the server's hint);
    /// `None` when none follows (success, a permanent failure, or the last
    /// attempt).
    pub retry_in: Option<Duration>,
}

/// A function [`Client::open`] calls after each attempt; clones of the
/// options share it.
#[derive(Clone)]
pub struct OpenObserver(pub Arc<dyn Fn(&OpenAttempt) + Send + Sync>);

impl std::fmt::Debug for OpenObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenObserver")
    }
}

/// A jitter seed for one [`Client::open`]: different for every call (and
/// every run), so that clients refused together do not retry together.
fn open_jitter_seed() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos
        ^ CALLS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Client {
    /// Connects and opens a secure channel with `options.security`. For a
    /// secured policy without a known server certificate, the endpoints are
    /// fetched over an unsecured channel first (Part 4 allows GetEndpoints
    /// there) and the one matching policy and mode gives the certificate,
    /// which `options.security.trust` must accept. With a
    /// [`ConnectGate`] in the options, this waits for its turn first.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let _turn = match &options.connect_gate {
            Some(gate) => Some(gate.enter().await),
            None => None,
        };
        Self::connect_ungated(url, options).await
    }

    /// Connects, creates and activates a session named `name`, retrying
    /// failed attempts with the backoff of docs/scalability.md §7 (busy signals
    /// wait four times longer, the server's retry-after hint is a lower
    /// bound; each call draws its own jitter) up to
    /// `options.connect_attempts` attempts in all. Each attempt holds a turn
    /// of the options' [`ConnectGate`] (if any) from TCP connect to
    /// ActivateSession, except one that echoes a retry ticket (it comes at
    /// the slot the server gave it and does not wait for the gate); the
    /// waits between attempts hold none. `report`
    /// counts the retries and busy answers; `options.on_open_attempt` hears
    /// every attempt.
    pub async fn open(
        url: &str,
        options: ClientOptions,
        name: &str,
        report: &mut ConnectReport,
    ) -> Result<Client, ClientError> {
        let mut backoff = options.backoff.reseeded(open_jitter_seed());
        let mut number = 0u32;
        // The ticket of the last busy answer, echoed by the next attempt
        // where it came from: the Hello (an ERR) or CreateSession.
        let mut ticket: Option<String> = None;
        let mut session_ticket: Option<String> = None;
        loop {
            number += 1;
            let asked = Instant::now();
            let mut entered = asked;
            let mut stage = OpenStage::Connect;
            // An attempt that echoes a retry ticket comes at the time the
            // server gave it, which its window holds for a while only: it
            // does not queue behind the gate's fresh attempts (the server's
            // slots already space the ticket holders out).
            let holds_ticket = ticket.is_some() || session_ticket.is_some();
            let attempt = async {
                let _turn = match &options.connect_gate {
                    Some(gate) if !holds_ticket => Some(gate.enter().await),
                    _ => None,
                };
                entered = Instant::now();
                let attempt_options = ClientOptions {
                    retry_ticket: ticket.clone(),
                    session_retry_ticket: session_ticket.clone(),
                    ..options.clone()
                };
                let client = Self::connect_ungated(url, attempt_options).await?;
                stage = OpenStage::CreateSession;
                client.shared.create_session(None, name).await?;
                stage = OpenStage::ActivateSession;
                client.shared.activate(None).await?;
                Ok::<_, ClientError>(client)
            };
            let result = attempt.await;
            let mut told = OpenAttempt {
                number,
                gate_wait: entered.duration_since(asked),
                took: entered.elapsed(),
                failure: None,
                retry_in: None,
            };
            let failure = match result {
                Ok(client) => {
                    if let Some(o) = &options.on_open_attempt {
                        (o.0)(&told);
                    }
                    return Ok(client);
                }
                Err(e) => e,
            };
            // Only what may go differently next time is retried (§7).
            let permanent = matches!(
                failure,
                ClientError::BadUrl(_)
                    | ClientError::Security { .. }
                    | ClientError::EndpointNotFound { .. }
            ) || !(matches!(failure, ClientError::Io(_) | ClientError::Timeout)
                || crate::backoff::is_transient(failure.status_code()));
            let last = permanent || backoff.attempts() + 1 >= options.connect_attempts.max(1);
            if !last {
                told.retry_in =
                    Some(backoff.next_delay(failure.status_code(), failure.retry_after_ms()));
            }
            told.failure = Some((stage, failure.clone()));
            if let Some(o) = &options.on_open_attempt {
                (o.0)(&told);
            }
            let Some(wait) = told.retry_in else {
                return Err(failure);
            };
            // A new ticket replaces the old; without one, a ticket is kept
            // only while the attempt failed before the stage it is for (a
            // refusal at accept comes before the Hello's ticket is read).
            match stage {
                OpenStage::Connect => {}
                OpenStage::CreateSession => ticket = None,
                OpenStage::ActivateSession => {
                    ticket = None;
                    session_ticket = None;
                }
            }
            if let Some(fresh) = failure.retry_ticket().map(str::to_owned) {
                match failure {
                    ClientError::Service { .. } => session_ticket = Some(fresh),
                    _ => ticket = Some(fresh),
                }
            }
            report.retries += 1;
            if crate::backoff::is_busy_signal(failure.status_code()) {
                report.busy_answers += 1;
                if failure.retry_after_ms().is_none() {
                    report.busy_without_hint += 1;
                }
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn connect_ungated(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let security = Self::channel_security(url, &options).await?;
        let (state, _) = watch::channel(LinkState::Connecting);
        let shared = Arc::new(Shared {
            link: Mutex::new(None),
            generation: AtomicU64::new(0),
            state,
            closing: AtomicBool::new(false),
            endpoint_url: url.to_owned(),
            session: Mutex::new(SessionState::default()),
            next_handle: AtomicU32::new(1),
            retry_ticket: Mutex::new(options.retry_ticket.clone()),
            session_retry_ticket: Mutex::new(options.session_retry_ticket.clone()),
            options,
            security,
            subscriptions: Mutex::new(Default::default()),
            renewals: Arc::new(AtomicU64::new(0)),
        });
        let client = Client { shared };
        let (generation, link) = client.shared.open_link().await?;
        client.shared.install(generation, link);
        Ok(client)
    }

    /// The channel security of `options`, asking the server for its
    /// certificate first when it is not given.
    async fn channel_security(
        url: &str,
        options: &ClientOptions,
    ) -> Result<ClientSecurity, ClientError> {
        let sec = &options.security;
        let config_error = |what: &str| ClientError::Security {
            status: StatusCode::BadConfigurationError,
            reason: what.to_owned(),
        };
        if sec.policy.is_none() {
            if sec.mode != t::MessageSecurityMode::None {
                return Err(config_error("SecurityPolicy None goes only with mode None"));
            }
            return Ok(ClientSecurity::none());
        }
        let identity = sec
            .certificate
            .clone()
            .ok_or_else(|| config_error("a secured policy needs a client certificate and key"))?;
        let (policy, mode) = (sec.policy, sec.mode);
        let server_der = match &sec.server_certificate {
            Some(der) => der.clone(),
            None => {
                let endpoint = Self::find_endpoint(url, options).await?;
                endpoint
                    .server_certificate
                    .as_bytes()
                    .unwrap_or_default()
                    .to_vec()
            }
        };
        let cert = sec.trust.check(&server_der, policy)?;
        ClientSecurity::new(policy, mode, identity, Arc::new(cert)).map_err(|e| {
            ClientError::Security {
                status: e.status_code(),
                reason: e.to_string(),
            }
        })
    }

    /// The endpoint of `options.security`'s policy and mode, asked for over
    /// an unsecured channel (its certificate can then go into
    /// `options.security.server_certificate`, so that many connects do not
    /// each ask again).
    pub async fn find_endpoint(
        url: &str,
        options: &ClientOptions,
    ) -> Result<t::EndpointDescription, ClientError> {
        let mut plain = options.clone();
        plain.security = SecurityOptions {
            // Over opc.https the TLS certificate is judged by it.
            trust: options.security.trust.clone(),
            ..SecurityOptions::default()
        };
        plain.reconnect = false;
        let client = Box::pin(Self::connect_ungated(url, plain)).await?;
        let endpoints = client.get_endpoints().await;
        client.close().await;
        let endpoints = endpoints?;
        let (policy, mode) = (options.security.policy, options.security.mode);
        let offered = endpoints
            .iter()
            .map(|e| {
                endpoint_name(
                    e.security_policy_uri.as_str().unwrap_or(""),
                    e.security_mode,
                )
            })
            .collect();
        endpoints
            .into_iter()
            .find(|e| {
                e.security_policy_uri.as_str() == Some(policy.uri()) && e.security_mode == mode
            })
            .ok_or_else(|| ClientError::EndpointNotFound {
                wanted: endpoint_name(policy.uri(), mode),
                offered,
            })
    }

    /// The channel's security (policy, mode, certificates).
    pub fn security(&self) -> &ClientSecurity {
        &self.shared.security
    }

    /// How many security tokens were renewed so far (every channel of this
    /// client counted).
    pub fn token_renewals(&self) -> u64 {
        self.shared.renewals.load(Ordering::Relaxed)
    }

    /// The endpoint URL it connected to.
    pub fn endpoint_url(&self) -> &str {
        &self.shared.endpoint_url
    }

    /// Whether a channel is open now (false while reconnecting and after
    /// close).
    pub fn is_connected(&self) -> bool {
        matches!(*self.shared.state.borrow(), LinkState::Connected)
    }

    /// How many channels this client has opened (1 + reconnects).
    pub fn channels_opened(&self) -> u64 {
        self.shared.generation.load(Ordering::Relaxed)
    }

    /// Waits until a channel is open (for instance after a reconnect), at
    /// most `timeout`; false if it is not by then or the client is closed.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.shared.state.subscribe();
        let ready = async {
            rx.wait_for(|s| matches!(s, LinkState::Connected | LinkState::Closed(_)))
                .await
                .map(|s| matches!(*s, LinkState::Connected))
                .unwrap_or(false)
        };
        tokio::time::timeout(timeout, ready).await.unwrap_or(false)
    }

    /// A request header with the session's token and a fresh handle.
    pub fn request_header(&self) -> t::RequestHeader {
        self.shared.request_header()
    }

    /// Sends any request and waits for its response of type `R`. A
    /// ServiceFault or a Bad serviceResult is [`ClientError::Service`] with
    /// the server's retry-after hint.
    pub async fn request<R: DynStructure>(&self, req: &dyn DynStructure) -> Result<R, ClientError> {
        self.shared
            .request(req, None, self.shared.options.request_timeout)
            .await
    }

    /// GetEndpoints of the server.
    pub async fn get_endpoints(&self) -> Result<Vec<t::EndpointDescription>, ClientError> {
        let resp: t::GetEndpointsResponse = self
            .request(&t::GetEndpointsRequest {
                request_header: self.request_header(),
                endpoint_url: UaString::from(self.shared.endpoint_url.as_str()),
                ..Default::default()
            })
            .await?;
        Ok(resp.endpoints.unwrap_or_default())
    }

    /// Creates and activates a session as `options.identity`. On a secured
    /// channel it sends our certificate and a nonce, checks the server's
    /// signature over them, and proves our key with the ClientSignature.
    /// With a [`ConnectGate`] in the options, this waits for its turn first.
    pub async fn create_session(
        &self,
        name: &str,
    ) -> Result<t::CreateSessionResponse, ClientError> {
        let _turn = match &self.shared.options.connect_gate {
            Some(gate) => Some(gate.enter().await),
            None => None,
        };
        self.create_session_ungated(name).await
    }

    /// CreateSession alone, without activating it and without the connect
    /// gate: the first half of [`create_session`](Self::create_session),
    /// for tools that must see which half failed (a session created and
    /// never activated stays on the server until its activation deadline).
    pub async fn create_session_only(
        &self,
        name: &str,
    ) -> Result<t::CreateSessionResponse, ClientError> {
        self.shared.create_session(None, name).await
    }

    /// ActivateSession of the session [`create_session_only`](Self::create_session_only)
    /// created, as `options.identity`.
    pub async fn activate_session(&self) -> Result<(), ClientError> {
        self.shared.activate(None).await
    }

    async fn create_session_ungated(
        &self,
        name: &str,
    ) -> Result<t::CreateSessionResponse, ClientError> {
        let created = self.shared.create_session(None, name).await?;
        self.shared.activate(None).await?;
        Ok(created)
    }

    /// Read of any attributes.
    pub async fn read(
        &self,
        nodes: Vec<t::ReadValueId>,
        timestamps: t::TimestampsToReturn,
    ) -> Result<Vec<DataValue>, ClientError> {
        let resp: t::ReadResponse = self
            .request(&t::ReadRequest {
                request_header: self.request_header(),
                max_age: 0.0,
                timestamps_to_return: timestamps,
                nodes_to_read: Some(nodes),
            })
            .await?;
        Ok(resp.results.unwrap_or_default())
    }

    /// Reads the Value attribute of each node.
    pub async fn read_values(&self, nodes: &[NodeId]) -> Result<Vec<DataValue>, ClientError> {
        self.read(
            nodes
                .iter()
                .map(|n| t::ReadValueId {
                    node_id: n.clone(),
                    attribute_id: t::AttributeId::Value as u32,
                    ..Default::default()
                })
                .collect(),
            t::TimestampsToReturn::Both,
        )
        .await
    }

    /// Write; the status of each value.
    ///
    /// Like every request, a Write is sent at most once: when the
    /// connection is lost before its answer arrives, it fails (a channel,
    /// IO or timeout error) and is not resent by the client, even after a
    /// reconnect. The server may or may not have applied it; whether to
    /// write again is the application's decision (writing the same value
    /// twice is harmless, writing "the next value of a counter" is not).
    /// A request made while the client reconnects is only sent once a new
    /// channel is open.
    pub async fn write(&self, values: Vec<t::WriteValue>) -> Result<Vec<StatusCode>, ClientError> {
        let resp: t::WriteResponse = self
            .request(&t::WriteRequest {
                request_header: self.request_header(),
                nodes_to_write: Some(values),
            })
            .await?;
        Ok(resp.results.unwrap_or_default())
    }

    /// Browse of one node, following continuation points (BrowseNext) until
    /// every reference is in.
    pub async fn browse(
        &self,
        description: t::BrowseDescription,
    ) -> Result<Vec<t::ReferenceDescription>, ClientError> {
        let resp: t::BrowseResponse = self
            .request(&t::BrowseRequest {
                request_header: self.request_header(),
                requested_max_references_per_node: 1000,
                nodes_to_browse: Some(vec![description]),
                ..Default::default()
            })
            .await?;
        let mut result = resp
            .results
            .and_then(|r| r.into_iter().next())
            .ok_or_else(|| ClientError::Decode("Browse without a result".into()))?;
        let mut refs = Vec::new();
        loop {
            if result.status_code.is_bad() {
                return Err(ClientError::Service {
                    status: result.status_code,
                    retry_after_ms: None,
                    retry_ticket: None,
                });
            }
            refs.extend(result.references.take().unwrap_or_default());
            if result
                .continuation_point
                .as_bytes()
                .is_none_or(|b| b.is_empty())
            {
                return Ok(refs);
            }
            let next: t::BrowseNextResponse = self
                .request(&t::BrowseNextRequest {
                    request_header: self.request_header(),
                    release_continuation_points: false,
                    continuation_points: Some(vec![result.continuation_point.clone()]),
                })
                .await?;
            result = next
                .results
                .and_then(|r| r.into_iter().next())
                .ok_or_else(|| ClientError::Decode("BrowseNext without a result".into()))?;
        }
    }

    /// TranslateBrowsePathsToNodeIds.
    pub async fn translate(
        &self,
        paths: Vec<t::BrowsePath>,
    ) -> Result<Vec<t::BrowsePathResult>, ClientError> {
        let resp: t::TranslateBrowsePathsToNodeIdsResponse = self
            .request(&t::TranslateBrowsePathsToNodeIdsRequest {
                request_header: self.request_header(),
                browse_paths: Some(paths),
            })
            .await?;
        Ok(resp.results.unwrap_or_default())
    }

    /// Call of methods.
    pub async fn call(
        &self,
        methods: Vec<t::CallMethodRequest>,
    ) -> Result<Vec<t::CallMethodResult>, ClientError> {
        let resp: t::CallResponse = self
            .request(&t::CallRequest {
                request_header: self.request_header(),
                methods_to_call: Some(methods),
            })
            .await?;
        Ok(resp.results.unwrap_or_default())
    }

    /// Closes the session (if any, deleting its subscriptions) and the
    /// channel; no reconnect follows.
    pub async fn close(&self) {
        let has_session = self
            .shared
            .session
            .lock()
            .map(|s| !s.auth.is_null())
            .unwrap_or(false);
        // Closing from here on: no reconnect, and no new session when the
        // Publishes still out come back with BadSessionClosed.
        self.shared.closing.store(true, Ordering::SeqCst);
        if has_session && self.is_connected() {
            let _: Result<t::CloseSessionResponse, _> = self
                .request(&t::CloseSessionRequest {
                    request_header: self.request_header(),
                    delete_subscriptions: true,
                })
                .await;
        }
        if let Ok(mut s) = self.shared.session.lock() {
            s.auth = NodeId::NULL;
        }
        let link = self.shared.link.lock().ok().and_then(|mut l| l.take());
        if let Some((_, link)) = link {
            let (done, rx) = oneshot::channel();
            if link.send(Command::Close { done }).is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
            }
        }
        self.shared.shut_down(ClientError::Closed);
    }
}

impl Shared {
    /// Opens a new connection and channel (not yet the client's link).
    pub(crate) async fn open_link(self: &Arc<Self>) -> Result<(u64, Link), ClientError> {
        let url = &self.endpoint_url;
        if https::is_https(url) {
            return https::open_link(self).await;
        }
        let options = &self.options;
        let (host, port) = parse_url(url)?;
        let deadline = options.connect_timeout;
        let stream = tokio::time::timeout(deadline, open_tcp(&host, port, options.local_addr))
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|e| ClientError::Io(format!("{host}:{port}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let mut config = options.channel.clone();
        // A ticket is echoed once: a reconnect sends none.
        let ticket = self.retry_ticket.lock().ok().and_then(|mut t| t.take());
        config.endpoint_url = match ticket {
            Some(t) => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}RetryTicket={t}")
            }
            None => url.to_owned(),
        };
        config.handshake_timeout = deadline;
        config.security = self.security.clone();
        let conn = ClientConnection::new(now(), Arc::new(config));
        let (tx, rx) = mpsc::unbounded_channel();
        let (opened_tx, opened_rx) = oneshot::channel();
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let weak = Arc::downgrade(self);
        let renewals = Arc::clone(&self.renewals);
        tokio::spawn(async move {
            let (failure, waiting) = drive(stream, conn, rx, opened_tx, renewals).await;
            // Reconnecting (or closed) before the waiting requests hear of
            // the loss: a caller that sees its request fail and asks
            // `is_connected` or `wait_connected` learns about the new
            // channel, not the dead one.
            if let Some(shared) = weak.upgrade() {
                shared.link_lost(generation, failure.clone());
            }
            for reply in waiting {
                let _ = reply.send(Err(failure.clone()));
            }
        });
        match opened_rx.await {
            Ok(Ok(())) => Ok((generation, tx)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClientError::Closed),
        }
    }

    /// Makes `link` the one requests go to.
    pub(crate) fn install(&self, generation: u64, link: Link) {
        if self.closing.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(mut l) = self.link.lock() {
            *l = Some((generation, link));
        }
        self.state.send_replace(LinkState::Connected);
    }

    /// The connection task of `generation` ended with `failure`.
    fn link_lost(self: Arc<Self>, generation: u64, failure: ClientError) {
        let current = match self.link.lock() {
            Ok(mut l) if l.as_ref().is_some_and(|(g, _)| *g == generation) => l.take(),
            _ => None,
        };
        if current.is_none() {
            return;
        }
        if !self.options.reconnect || self.closing.load(Ordering::SeqCst) {
            self.shut_down(failure);
            return;
        }
        tracing::debug!(error = %failure, "connection lost; reconnecting");
        self.state.send_replace(LinkState::Reconnecting);
        tokio::spawn(reconnect::run(self, failure));
    }

    /// The server no longer knows our session while the channel works: a
    /// new session on it takes the subscriptions over (like
    /// [`link_lost`](Self::link_lost), the recovery is the reconnect
    /// module's).
    pub(crate) async fn session_lost(self: &Arc<Self>) -> Result<(), ClientError> {
        reconnect::renew_session(self).await
    }

    /// Closed for good: requests fail with `reason`, subscription streams
    /// end.
    pub(crate) fn shut_down(&self, reason: ClientError) {
        self.closing.store(true, Ordering::SeqCst);
        if let Ok(mut l) = self.link.lock() {
            // Dropping the sender ends the connection task, which closes
            // the channel.
            l.take();
        }
        self.state.send_replace(LinkState::Closed(reason.clone()));
        subscription::end_all(self, reason.status_code());
    }

    /// The session's authentication token; `None` without a session.
    pub(crate) fn session_token(&self) -> Option<NodeId> {
        self.session
            .lock()
            .ok()
            .map(|s| s.auth.clone())
            .filter(|a| !a.is_null())
    }

    /// A request header with the session's token and a fresh handle.
    pub(crate) fn request_header(&self) -> t::RequestHeader {
        let auth = self
            .session
            .lock()
            .map(|s| s.auth.clone())
            .unwrap_or(NodeId::NULL);
        t::RequestHeader {
            authentication_token: auth,
            timestamp: DateTime::from_system_time(SystemTime::now()),
            request_handle: self.next_handle.fetch_add(1, Ordering::Relaxed),
            timeout_hint: u32::try_from(self.options.request_timeout.as_millis())
                .unwrap_or(u32::MAX),
            ..Default::default()
        }
    }

    /// Sends an encoded request on `via` (or the client's link, waiting
    /// for one while reconnecting) and waits for the response body.
    pub(crate) async fn exchange(
        &self,
        mut message: Vec<u8>,
        via: Option<&Link>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut states = self.state.subscribe();
        loop {
            let target = match via {
                Some(link) => Some(link.clone()),
                None => match states.borrow_and_update().clone() {
                    LinkState::Closed(e) => return Err(e),
                    LinkState::Connected => self
                        .link
                        .lock()
                        .ok()
                        .and_then(|l| l.as_ref().map(|(_, l)| l.clone())),
                    LinkState::Connecting | LinkState::Reconnecting => None,
                },
            };
            let (reply, rx) = oneshot::channel();
            let command = Command::Request {
                message,
                reply,
                deadline: deadline.into_std(),
            };
            let unsent = match target {
                Some(link) => match link.send(command) {
                    Ok(()) => {
                        return match tokio::time::timeout_at(deadline, rx).await {
                            Err(_) => Err(ClientError::Timeout),
                            Ok(Err(_)) => Err(ClientError::Closed),
                            Ok(Ok(result)) => result,
                        };
                    }
                    Err(mpsc::error::SendError(command)) => command,
                },
                None => command,
            };
            let Command::Request { message: m, .. } = unsent else {
                return Err(ClientError::Closed);
            };
            if via.is_some() {
                return Err(ClientError::Closed);
            }
            message = m;
            // No channel now: wait for the state to change (a reconnect, or
            // the end).
            match tokio::time::timeout_at(deadline, states.changed()).await {
                Err(_) => return Err(ClientError::Timeout),
                Ok(Err(_)) => return Err(ClientError::Closed),
                Ok(Ok(())) => {}
            }
        }
    }

    /// Sends `req` (on `via` or the client's link) and decodes the response
    /// as `R`; a Bad serviceResult is [`ClientError::Service`].
    pub(crate) async fn request<R: DynStructure>(
        &self,
        req: &dyn DynStructure,
        via: Option<&Link>,
        timeout: Duration,
    ) -> Result<R, ClientError> {
        let mut message = Vec::with_capacity(128);
        encode_message(req, &mut message);
        let body = self.exchange(message, via, timeout).await?;
        decode_response(&body, &self.options.decode)
    }

    /// CreateSession (on `via` or the client's link): checks the server's
    /// signature and keeps what activating needs.
    pub(crate) async fn create_session(
        &self,
        via: Option<&Link>,
        name: &str,
    ) -> Result<t::CreateSessionResponse, ClientError> {
        let nonce =
            SecurityPolicy::Basic256Sha256
                .random_nonce()
                .map_err(|e| ClientError::Security {
                    status: e.status_code(),
                    reason: "no random nonce".into(),
                })?;
        let own_der = self
            .security
            .identity()
            .map(|i| i.certificate().der().to_vec());
        let policy = self.security.policy();
        let mut header = self.request_header();
        header.authentication_token = NodeId::NULL;
        // ECC: the channel's thumbprint binds the signatures; asking for
        // the server's ECDHKey lets a password be encrypted later.
        let link = self.resolve_link(via);
        let via = via.or(link.as_ref());
        let thumbprint = match via {
            Some(l) if policy.secure_channel_enhancements() => link_thumbprint(l).await,
            _ => Vec::new(),
        };
        let mut params: Vec<t::KeyValuePair> = Vec::new();
        if self.wants_ecdh_key() {
            let ecdh = ecc_secret::ecdh_request(policy);
            if let Some(p) = ecdh.downcast_ref::<t::AdditionalParametersType>() {
                params.extend(p.parameters.iter().flatten().cloned());
            }
        }
        // A busy answer's ticket is echoed once (docs/scalability.md).
        let ticket = self
            .session_retry_ticket
            .lock()
            .ok()
            .and_then(|mut t| t.take());
        if let Some(ticket) = ticket {
            params.push(t::KeyValuePair {
                key: t::QualifiedName::new(0, "RetryTicket"),
                value: t::Variant::String(UaString::from(ticket.as_str())),
            });
        }
        if !params.is_empty() {
            header.additional_header = t::ExtensionObject::new(t::AdditionalParametersType {
                parameters: Some(params),
            });
        }
        let created: t::CreateSessionResponse = self
            .request(
                &t::CreateSessionRequest {
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
                    client_nonce: t::ByteString::new(nonce.clone()),
                    client_certificate: own_der
                        .clone()
                        .map_or_else(t::ByteString::null, t::ByteString::new),
                    requested_session_timeout: self.options.session_timeout.as_millis() as f64,
                    max_response_message_size: self.options.channel.max_message_size,
                    ..Default::default()
                },
                via,
                self.options.request_timeout,
            )
            .await?;
        let sent_cert = created.server_certificate.as_bytes().unwrap_or_default();
        if let (Some(server_cert), Some(server_key), Some(own)) = (
            self.security.server_certificate(),
            self.security.server_key(),
            &own_der,
        ) {
            if leaf_certificate(sent_cert).ok() != Some(server_cert.der()) {
                return Err(ClientError::Security {
                    status: StatusCode::BadCertificateInvalid,
                    reason: "CreateSession names another server certificate than the channel's"
                        .into(),
                });
            }
            match server_key {
                PublicKey::Rsa(key) => security::verify(
                    key,
                    self.security.policy(),
                    own,
                    &nonce,
                    &created.server_signature,
                )?,
                PublicKey::Ecc(_) => {
                    let data = create_session_signed_data(
                        policy,
                        &thumbprint,
                        &nonce,
                        created.server_nonce.as_bytes().unwrap_or_default(),
                        server_cert.der(),
                        own,
                    );
                    server_key
                        .verify(
                            policy,
                            &data,
                            created.server_signature.signature.as_bytes_or_empty(),
                        )
                        .map_err(|_| ClientError::Security {
                            status: StatusCode::BadApplicationSignatureInvalid,
                            reason: "the server's signature in CreateSession is invalid".into(),
                        })?;
                }
            }
        }
        let ecdh_key = self.ecdh_key_of(&created.response_header)?;
        let policies = self.token_policies(&created);
        if let Ok(mut s) = self.session.lock() {
            *s = SessionState {
                auth: created.authentication_token.clone(),
                name: name.to_owned(),
                server_nonce: created.server_nonce.as_bytes().unwrap_or_default().to_vec(),
                server_certificate: leaf_certificate(sent_cert).unwrap_or_default().to_vec(),
                token_policies: policies,
                client_nonce: nonce.clone(),
                ecdh_key: ecdh_key.unwrap_or_default(),
            };
        }
        Ok(created)
    }

    /// ActivateSession of the session we have (on `via` or the client's
    /// link): a new channel's signature over the server certificate and
    /// the last server nonce, and our identity token.
    pub(crate) async fn activate(&self, via: Option<&Link>) -> Result<(), ClientError> {
        let (server_nonce, server_cert, policies, client_nonce, ecdh_key) = {
            let s = self.session.lock().map_err(|_| ClientError::Closed)?;
            (
                s.server_nonce.clone(),
                s.server_certificate.clone(),
                s.token_policies.clone(),
                s.client_nonce.clone(),
                s.ecdh_key.clone(),
            )
        };
        let policy = self.security.policy();
        let link = self.resolve_link(via);
        let via = via.or(link.as_ref());
        let thumbprint = match via {
            Some(l) if policy.secure_channel_enhancements() => link_thumbprint(l).await,
            _ => Vec::new(),
        };
        let mut client_signature = t::SignatureData::default();
        if let (Some(identity), Some(channel_cert)) =
            (self.security.identity(), self.security.server_certificate())
        {
            client_signature = match identity.key() {
                PrivateKey::Rsa(key) => {
                    security::sign(key, policy, channel_cert.der(), &server_nonce)?
                }
                PrivateKey::Ecc(_) => {
                    let server_app_cert = if server_cert.is_empty() {
                        channel_cert.der()
                    } else {
                        &server_cert
                    };
                    let data = activate_session_signed_data(
                        policy,
                        &thumbprint,
                        &server_nonce,
                        &client_nonce,
                        server_app_cert,
                        channel_cert.der(),
                        identity.certificate().der(),
                    );
                    let mut sig = Vec::new();
                    identity.key().sign(policy, &data, &mut sig).map_err(|e| {
                        ClientError::Security {
                            status: e.status_code(),
                            reason: "signing failed".into(),
                        }
                    })?;
                    t::SignatureData {
                        algorithm: UaString::null(),
                        signature: t::ByteString::new(sig),
                    }
                }
            };
        }
        let bound = BoundTo {
            thumbprint: &thumbprint,
            client_nonce: &client_nonce,
            ecdh_key: &ecdh_key,
        };
        let (token, user_token_signature) =
            self.identity_token(&policies, &server_nonce, &server_cert, &bound)?;
        let mut request_header = self.request_header();
        if self.wants_ecdh_key() {
            request_header.additional_header = ecc_secret::ecdh_request(policy);
        }
        let activated: t::ActivateSessionResponse = self
            .request(
                &t::ActivateSessionRequest {
                    request_header,
                    client_signature,
                    locale_ids: Some(vec![UaString::from("en")]),
                    user_identity_token: token,
                    user_token_signature,
                    ..Default::default()
                },
                via,
                self.options.request_timeout,
            )
            .await?;
        let next_key = self.ecdh_key_of(&activated.response_header)?;
        if let Ok(mut s) = self.session.lock() {
            if let Some(n) = activated.server_nonce.as_bytes() {
                s.server_nonce = n.to_vec();
            }
            if let Some(k) = next_key {
                s.ecdh_key = k;
            }
        }
        Ok(())
    }

    /// The UserTokenPolicies the server offers for our policy and mode
    /// (falling back to any endpoint of our policy, then any endpoint), one
    /// per token type.
    fn token_policies(&self, created: &t::CreateSessionResponse) -> Vec<t::UserTokenPolicy> {
        let endpoints = created.server_endpoints.as_deref().unwrap_or_default();
        let uri = self.security.policy().uri();
        let mode = self.security.mode();
        let exact = |e: &&t::EndpointDescription| {
            e.security_policy_uri.as_str() == Some(uri) && e.security_mode == mode
        };
        let same_policy = |e: &&t::EndpointDescription| e.security_policy_uri.as_str() == Some(uri);
        let find = |kind: t::UserTokenType, filter: &dyn Fn(&&t::EndpointDescription) -> bool| {
            endpoints
                .iter()
                .filter(filter)
                .flat_map(|e| e.user_identity_tokens.iter().flatten())
                .find(|p| p.token_type == kind)
                .cloned()
        };
        [
            t::UserTokenType::Anonymous,
            t::UserTokenType::UserName,
            t::UserTokenType::Certificate,
        ]
        .into_iter()
        .filter_map(|kind| {
            find(kind, &exact)
                .or_else(|| find(kind, &same_policy))
                .or_else(|| find(kind, &|_| true))
        })
        .collect()
    }

    /// The link `via` names, else the current one.
    fn resolve_link(&self, via: Option<&Link>) -> Option<Link> {
        match via {
            Some(l) => Some(l.clone()),
            None => self
                .link
                .lock()
                .ok()
                .and_then(|l| l.as_ref().map(|(_, l)| l.clone())),
        }
    }

    /// The server's ECDHKey in a response header, its signature checked
    /// with the channel's server certificate (ECC policies only).
    fn ecdh_key_of(&self, header: &t::ResponseHeader) -> Result<Option<Vec<u8>>, ClientError> {
        let Some(PublicKey::Ecc(key)) = self.security.server_key() else {
            return Ok(None);
        };
        ecc_secret::ecdh_key_of_response(self.security.policy(), &header.additional_header, key)
            .map_err(|e| ClientError::Security {
                status: e.status_code(),
                reason: "the server's ECDHKey does not verify".into(),
            })
    }

    /// Whether CreateSession and ActivateSession ask for the server's
    /// ECDHKey: on an ECC channel, and only for an identity whose secret
    /// is encrypted with it (a password, as an EccEncryptedSecret). An
    /// anonymous or certificate identity needs none, and each key costs
    /// the server a key generation and a signature.
    fn wants_ecdh_key(&self) -> bool {
        self.security.policy().is_ecc()
            && matches!(self.options.identity, UserIdentity::UserName { .. })
    }

    /// The identity token of `options.identity` and its signature.
    fn identity_token(
        &self,
        policies: &[t::UserTokenPolicy],
        server_nonce: &[u8],
        server_cert_der: &[u8],
        bound: &BoundTo<'_>,
    ) -> Result<(t::ExtensionObject, t::SignatureData), ClientError> {
        let ecdh_key = bound.ecdh_key;
        let offered = |kind: t::UserTokenType| policies.iter().find(|p| p.token_type == kind);
        let not_offered = |what: &str| ClientError::Security {
            status: StatusCode::BadIdentityTokenRejected,
            reason: format!("the server offers no {what} token on this endpoint"),
        };
        // The token's policy: its own securityPolicyUri, or the channel's.
        let token_security = |p: &t::UserTokenPolicy| match p.security_policy_uri.as_str() {
            None | Some("") => Ok(self.security.policy()),
            Some(uri) => SecurityPolicy::from_uri(uri).ok_or_else(|| ClientError::Security {
                status: StatusCode::BadSecurityPolicyRejected,
                reason: format!("user token policy {uri} is not supported"),
            }),
        };
        let server_cert = || {
            if server_cert_der.is_empty() {
                Err(ClientError::Security {
                    status: StatusCode::BadCertificateInvalid,
                    reason: "the server sent no usable certificate in CreateSession".into(),
                })
            } else {
                Ok(server_cert_der)
            }
        };
        match &self.options.identity {
            UserIdentity::Anonymous => {
                let policy_id = offered(t::UserTokenType::Anonymous)
                    .map(|p| p.policy_id.clone())
                    .unwrap_or_else(|| UaString::from("anonymous"));
                Ok((
                    t::ExtensionObject::new(t::AnonymousIdentityToken { policy_id }),
                    t::SignatureData::default(),
                ))
            }
            UserIdentity::UserName { user, password } => {
                let p =
                    offered(t::UserTokenType::UserName).ok_or_else(|| not_offered("user name"))?;
                let policy = token_security(p)?;
                let (data, algorithm) = if policy.is_none() {
                    security::encrypt_secret_plain(password.as_bytes())
                } else if policy.is_ecc() {
                    // EccEncryptedSecret, EncryptionAlgorithm left empty.
                    let identity =
                        self.security
                            .identity()
                            .ok_or_else(|| ClientError::Security {
                                status: StatusCode::BadIdentityTokenRejected,
                                reason: "an ECC password needs our application key".into(),
                            })?;
                    let key = identity.ecc_key().ok_or_else(|| ClientError::Security {
                        status: StatusCode::BadIdentityTokenRejected,
                        reason: "an ECC password needs an ECC application key".into(),
                    })?;
                    if ecdh_key.is_empty() {
                        return Err(ClientError::Security {
                            status: StatusCode::BadIdentityTokenRejected,
                            reason: "the server sent no ECDHKey to encrypt the password for".into(),
                        });
                    }
                    let data = ecc_secret::encrypt(
                        policy,
                        key,
                        identity.certificate().der(),
                        ecdh_key,
                        server_nonce,
                        password.as_bytes(),
                        DateTime::from_system_time(SystemTime::now()),
                    )
                    .map_err(|e| ClientError::Security {
                        status: e.status_code(),
                        reason: "password encryption failed".into(),
                    })?;
                    (data, None)
                } else {
                    let cert = Certificate::from_der(server_cert()?).map_err(|e| {
                        ClientError::Security {
                            status: e.status_code(),
                            reason: "server certificate does not parse".into(),
                        }
                    })?;
                    let key = RsaPublicKey::from_spki_der(cert.subject_public_key_info_der())
                        .map_err(|e| ClientError::Security {
                            status: e.status_code(),
                            reason: "server certificate key is not RSA".into(),
                        })?;
                    security::encrypt_secret(&key, policy, password.as_bytes(), server_nonce)?
                };
                Ok((
                    t::ExtensionObject::new(t::UserNameIdentityToken {
                        policy_id: p.policy_id.clone(),
                        user_name: UaString::from(user.as_str()),
                        password: t::ByteString::new(data),
                        encryption_algorithm: algorithm.map_or_else(UaString::null, UaString::from),
                    }),
                    t::SignatureData::default(),
                ))
            }
            UserIdentity::X509(user) => {
                let p =
                    offered(t::UserTokenType::Certificate).ok_or_else(|| not_offered("X.509"))?;
                let policy = token_security(p)?;
                let signature = match user.key() {
                    PrivateKey::Rsa(key) => {
                        security::sign(key, policy, server_cert()?, server_nonce)?
                    }
                    PrivateKey::Ecc(_) => {
                        // The ECC forms (Part 4, X509 user token signature):
                        // channel-bound under SecureChannelEnhancements.
                        let own = self
                            .security
                            .identity()
                            .map(|i| i.certificate().der())
                            .unwrap_or_default();
                        let channel_cert = self
                            .security
                            .server_certificate()
                            .map(|c| c.der())
                            .unwrap_or_default();
                        let data = user_token_signed_data(
                            policy,
                            bound.thumbprint,
                            server_nonce,
                            bound.client_nonce,
                            server_cert()?,
                            channel_cert,
                            own,
                            own,
                        );
                        let mut sig = Vec::new();
                        user.key().sign(policy, &data, &mut sig).map_err(|e| {
                            ClientError::Security {
                                status: e.status_code(),
                                reason: "the user key does not suit the policy".into(),
                            }
                        })?;
                        t::SignatureData {
                            algorithm: UaString::null(),
                            signature: t::ByteString::new(sig),
                        }
                    }
                };
                Ok((
                    t::ExtensionObject::new(t::X509IdentityToken {
                        policy_id: p.policy_id.clone(),
                        certificate_data: t::ByteString::new(user.certificate().der().to_vec()),
                    }),
                    signature,
                ))
            }
        }
    }
}

/// A response body as `R`; a ServiceFault or a Bad serviceResult is
/// [`ClientError::Service`] with the server's retry-after hint.
pub(crate) fn decode_response<R: DynStructure>(
    body: &[u8],
    limits: &DecodeLimits,
) -> Result<R, ClientError> {
    // The ResponseHeader first: a fault is answered by its status.
    let mut r = Reader::new(body, limits).map_err(ClientError::decode)?;
    NodeId::decode(&mut r).map_err(ClientError::decode)?;
    let header = ResponseHeader::decode(&mut r).map_err(ClientError::decode)?;
    if header.service_result.is_bad() {
        return Err(ClientError::Service {
            status: header.service_result,
            retry_after_ms: retry_after_ms(&header),
            retry_ticket: retry_ticket(&header),
        });
    }
    let mut r = Reader::new(body, limits).map_err(ClientError::decode)?;
    let m = t::decode_message(&mut r).map_err(ClientError::decode)?;
    let name = m.type_name().to_owned();
    m.into_any()
        .downcast::<R>()
        .map(|b| *b)
        .map_err(|_| ClientError::Decode(format!("unexpected response {name}")))
}

/// Connects to `host:port`, from `local` when given.
async fn open_tcp(
    host: &str,
    port: u16,
    local: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let Some(local) = local else {
        return TcpStream::connect((host, port)).await;
    };
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        if addr.is_ipv4() != local.is_ipv4() {
            continue;
        }
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.bind(std::net::SocketAddr::new(local, 0))?;
        match socket.connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("no address of {host} matches the source address {local}"),
        )
    }))
}

/// What ties an ActivateSession's user token to the channel and session
/// (ECC policies).
pub(crate) struct BoundTo<'a> {
    /// The channel's ChannelThumbprint (empty without enhancements).
    pub thumbprint: &'a [u8],
    /// The CreateSession ClientNonce.
    pub client_nonce: &'a [u8],
    /// The server's last ECDHKey.
    pub ecdh_key: &'a [u8],
}

/// Asks a link for its channel's ChannelThumbprint (empty when it has
/// none or is gone).
async fn link_thumbprint(link: &Link) -> Vec<u8> {
    let (reply, rx) = oneshot::channel();
    if link.send(Command::Thumbprint { reply }).is_err() {
        return Vec::new();
    }
    rx.await.unwrap_or_default()
}

/// The connection task: runs until the connection ends; returns why, and
/// the replies of the requests still waiting (to be failed once the
/// client knows the link is gone).
async fn drive(
    stream: TcpStream,
    mut conn: ClientConnection,
    mut commands: mpsc::UnboundedReceiver<Command>,
    opened: oneshot::Sender<Result<(), ClientError>>,
    renewals: Arc<AtomicU64>,
) -> (ClientError, Vec<Reply>) {
    let (mut rd, mut wr) = stream.into_split();
    let mut opened = Some(opened);
    let mut pending: HashMap<u32, Reply> = HashMap::new();
    let mut input = Vec::with_capacity(8192);
    let mut out = Vec::new();
    let mut closing: Option<oneshot::Sender<()>> = None;
    // Dead-peer detection: the earliest deadline among the requests sent
    // since the last byte arrived. If it passes with still nothing read,
    // the connection is given up (a black hole, a peer that hangs), so
    // that a reconnect can follow; any byte from the server clears it.
    let mut silent_until: Option<Instant> = None;
    let failure = loop {
        out.clear();
        if conn.poll_transmit(&mut out) && wr.write_all(&out).await.is_err() {
            break ClientError::Io("write failed".into());
        }
        let mut ended = None;
        while let Some(ev) = conn.poll_event() {
            match ev {
                ClientEvent::Opened { .. } => {
                    if let Some(o) = opened.take() {
                        let _ = o.send(Ok(()));
                    }
                }
                ClientEvent::Renewed { token_id } => {
                    renewals.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(token_id, "security token renewed");
                }
                ClientEvent::Response { request_id, body } => {
                    if let Some(reply) = pending.remove(&request_id) {
                        let _ = reply.send(Ok(body));
                    }
                }
                ClientEvent::Aborted { request_id, status } => {
                    if let Some(reply) = pending.remove(&request_id) {
                        let _ = reply.send(Err(ClientError::Service {
                            status,
                            retry_after_ms: None,
                            retry_ticket: None,
                        }));
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
            }
        }
        if let Some(e) = ended {
            break e;
        }
        let due = conn.poll_timeout();
        tokio::select! {
            read = rd.read_buf(&mut input) => match read {
                Ok(0) => break ClientError::Channel {
                    status: StatusCode::BadConnectionClosed,
                    reason: "server closed the connection".into(),
                    retry_after_ms: None,
                },
                Ok(_) => {
                    silent_until = None;
                    let _ = conn.handle_input(now(), &mut input);
                }
                Err(e) => break ClientError::Io(e.to_string()),
            },
            cmd = commands.recv() => {
                let Some(cmd) = cmd else {
                    conn.close(now());
                    continue;
                };
                // Everything queued goes out in one write.
                let mut next = Some(cmd);
                while let Some(cmd) = next.take() {
                    match cmd {
                        Command::Request { message, reply, deadline } => match conn.send_request(&message) {
                            Ok(id) => {
                                pending.insert(id, reply);
                                silent_until = Some(silent_until.map_or(deadline, |d| d.min(deadline)));
                            }
                            Err(e) => {
                                let _ = reply.send(Err(ClientError::Channel {
                                    status: e.status_code(),
                                    reason: e.to_string(),
                                    retry_after_ms: None,
                                }));
                            }
                        },
                        Command::Close { done } => {
                            conn.close(now());
                            closing = Some(done);
                            break;
                        }
                        Command::Thumbprint { reply } => {
                            let _ = reply.send(conn.channel_thumbprint().to_vec());
                        }
                    }
                    next = commands.try_recv().ok();
                }
            }
            () = sleep_until(due) => conn.handle_timeout(now()),
            () = sleep_until(silent_until) => break ClientError::Channel {
                status: StatusCode::BadConnectionClosed,
                reason: "no byte from the server within a request's timeout".into(),
                retry_after_ms: None,
            },
        }
    };
    out.clear();
    if conn.poll_transmit(&mut out) {
        let _ = wr.write_all(&out).await;
    }
    let _ = wr.shutdown().await;
    if let Some(o) = opened.take() {
        let _ = o.send(Err(failure.clone()));
    }
    // The requests that were sent, and those still queued (never sent).
    let mut waiting: Vec<Reply> = pending.into_values().collect();
    commands.close();
    while let Ok(cmd) = commands.try_recv() {
        match cmd {
            Command::Request { reply, .. } => waiting.push(reply),
            Command::Close { done } => {
                let _ = done.send(());
            }
            Command::Thumbprint { reply } => {
                let _ = reply.send(Vec::new());
            }
        }
    }
    if let Some(done) = closing {
        let _ = done.send(());
    }
    tracing::debug!(error = %failure, "client connection ended");
    (failure, waiting)
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("opc.tcp://localhost:4840").unwrap(),
            ("localhost".into(), 4840)
        );
        assert_eq!(
            parse_url("opc.tcp://10.1.2.3:48010/UA/Server").unwrap(),
            ("10.1.2.3".into(), 48010)
        );
        assert_eq!(parse_url("opc.tcp://plc").unwrap(), ("plc".into(), 4840));
        assert_eq!(
            parse_url("opc.tcp://[::1]:4841/x").unwrap(),
            ("::1".into(), 4841)
        );
        for bad in [
            "http://x:1",
            "opc.tcp://:4840",
            "opc.tcp://h:port",
            "opc.tcp://h:99999",
        ] {
            assert!(
                matches!(parse_url(bad), Err(ClientError::BadUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn retry_hint_from_the_additional_header() {
        let header = ResponseHeader {
            additional_header: t::ExtensionObject::new(t::AdditionalParametersType {
                parameters: Some(vec![t::KeyValuePair {
                    key: t::QualifiedName::new(0, "RetryAfterMs"),
                    value: t::Variant::Int64(2500),
                }]),
            }),
            ..Default::default()
        };
        assert_eq!(retry_after_ms(&header), Some(2500));
        assert_eq!(retry_after_ms(&ResponseHeader::default()), None);
        assert_eq!(retry_ticket(&header), None);
    }

    #[test]
    fn retry_tickets_from_the_header_and_the_err_reason() {
        let t = "0123456789abcdef0123456789abcdef01";
        let header = ResponseHeader {
            additional_header: t::ExtensionObject::new(t::AdditionalParametersType {
                parameters: Some(vec![
                    t::KeyValuePair {
                        key: t::QualifiedName::new(0, "RetryAfterMs"),
                        value: t::Variant::Int64(300),
                    },
                    t::KeyValuePair {
                        key: t::QualifiedName::new(0, "RetryTicket"),
                        value: t::Variant::String(UaString::from(t)),
                    },
                ]),
            }),
            ..Default::default()
        };
        assert_eq!(retry_ticket(&header).as_deref(), Some(t));
        let e = ClientError::Service {
            status: StatusCode::BadServerTooBusy,
            retry_after_ms: Some(300),
            retry_ticket: retry_ticket(&header),
        };
        assert_eq!(e.retry_ticket(), Some(t));
        let e = ClientError::Channel {
            status: StatusCode::BadTcpServerTooBusy,
            reason: format!("server too busy; RetryAfterMs=300 RetryTicket={t}"),
            retry_after_ms: Some(300),
        };
        assert_eq!(e.retry_ticket(), Some(t));
        // Not hex: no ticket.
        let e = ClientError::Channel {
            status: StatusCode::BadTcpServerTooBusy,
            reason: "server too busy; RetryTicket=<script>".into(),
            retry_after_ms: None,
        };
        assert_eq!(e.retry_ticket(), None);
    }
}
