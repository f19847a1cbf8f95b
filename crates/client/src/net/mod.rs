//! The tokio shell: one task per connection drives a
//! [`ClientConnection`] - it writes what the connection yields, feeds it
//! what the socket reads, runs its timers - and matches responses to the
//! requests waiting for them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use uascale_crypto::policy::SecurityPolicy;
use uascale_crypto::rsa::RsaPublicKey;
use uascale_crypto::x509::Certificate;
use uascale_proto::security::{leaf_certificate, Identity};
use uascale_proto::{ClientConfig, ClientConnection, ClientEvent, ClientSecurity, Now};
use uascale_types as t;
use uascale_types::{
    encode_message, BinaryDecode, DataValue, DateTime, DecodeLimits, DynStructure, NodeId, Reader,
    ResponseHeader, StatusCode, UaString,
};

use crate::error::ClientError;
use crate::security::{self, ServerTrust, UserIdentity};

pub mod pipeline;

fn now() -> Now {
    Now {
        instant: Instant::now(),
        utc: DateTime::from_system_time(SystemTime::now()),
    }
}

/// How a client connects and waits.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long a request may wait for its response. Default 10 s.
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
        }
    }
}

type Reply = oneshot::Sender<Result<Vec<u8>, ClientError>>;

enum Command {
    Request { message: Vec<u8>, reply: Reply },
    Close { done: oneshot::Sender<()> },
}

/// A connection to one server, with at most one session.
#[derive(Debug)]
pub struct Client {
    commands: mpsc::UnboundedSender<Command>,
    endpoint_url: String,
    auth: Mutex<NodeId>,
    next_handle: AtomicU32,
    options: ClientOptions,
    security: ClientSecurity,
}

/// Splits `opc.tcp://host:port[/path]` into host and port.
pub fn parse_url(url: &str) -> Result<(String, u16), ClientError> {
    let bad = || ClientError::BadUrl(url.to_owned());
    let rest = url.strip_prefix("opc.tcp://").ok_or_else(bad)?;
    let authority = rest.split('/').next().unwrap_or("");
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, p) = v6.split_once(']').ok_or_else(bad)?;
        (h, p.strip_prefix(':').unwrap_or("4840"))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => (authority, "4840"),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = port.parse().map_err(|_| bad())?;
    Ok((host.to_owned(), port))
}

/// The `RetryAfterMs` hint of a response header (SCALABILITY.md §2).
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

impl Client {
    /// Connects and opens a secure channel with `options.security`. For a
    /// secured policy without a known server certificate, the endpoints are
    /// fetched over an unsecured channel first (Part 4 allows GetEndpoints
    /// there) and the one matching policy and mode gives the certificate,
    /// which `options.security.trust` must accept.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let sec = &options.security;
        let config_error = |what: &str| ClientError::Security {
            status: StatusCode::BadConfigurationError,
            reason: what.to_owned(),
        };
        if sec.policy.is_none() {
            if sec.mode != t::MessageSecurityMode::None {
                return Err(config_error("SecurityPolicy None goes only with mode None"));
            }
            return Self::connect_with(url, options, ClientSecurity::none()).await;
        }
        let identity = sec
            .certificate
            .clone()
            .ok_or_else(|| config_error("a secured policy needs a client certificate and key"))?;
        let (policy, mode) = (sec.policy, sec.mode);
        let server_der = match &sec.server_certificate {
            Some(der) => der.clone(),
            None => {
                let endpoint = Self::find_endpoint(url, &options).await?;
                endpoint
                    .server_certificate
                    .as_bytes()
                    .unwrap_or_default()
                    .to_vec()
            }
        };
        let cert = sec.trust.check(&server_der, policy)?;
        let security =
            ClientSecurity::new(policy, mode, identity, Arc::new(cert)).map_err(|e| {
                ClientError::Security {
                    status: e.status_code(),
                    reason: e.to_string(),
                }
            })?;
        Self::connect_with(url, options, security).await
    }

    /// The endpoint of `options.security`'s policy and mode, asked for over
    /// an unsecured channel.
    async fn find_endpoint(
        url: &str,
        options: &ClientOptions,
    ) -> Result<t::EndpointDescription, ClientError> {
        let mut plain = options.clone();
        plain.security = SecurityOptions::default();
        let client = Self::connect_with(url, plain, ClientSecurity::none()).await?;
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

    async fn connect_with(
        url: &str,
        options: ClientOptions,
        security: ClientSecurity,
    ) -> Result<Client, ClientError> {
        let (host, port) = parse_url(url)?;
        let deadline = options.connect_timeout;
        let stream = tokio::time::timeout(deadline, open_tcp(&host, port, options.local_addr))
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|e| ClientError::Io(format!("{host}:{port}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let mut config = options.channel.clone();
        config.endpoint_url = url.to_owned();
        config.handshake_timeout = deadline;
        config.security = security.clone();
        let conn = ClientConnection::new(now(), Arc::new(config));
        let (tx, rx) = mpsc::unbounded_channel();
        let (opened_tx, opened_rx) = oneshot::channel();
        tokio::spawn(drive(stream, conn, rx, opened_tx));
        match opened_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ClientError::Closed),
        }
        Ok(Client {
            commands: tx,
            endpoint_url: url.to_owned(),
            auth: Mutex::new(NodeId::NULL),
            next_handle: AtomicU32::new(1),
            options,
            security,
        })
    }

    /// The channel's security (policy, mode, certificates).
    pub fn security(&self) -> &ClientSecurity {
        &self.security
    }

    /// The endpoint URL it connected to.
    pub fn endpoint_url(&self) -> &str {
        &self.endpoint_url
    }

    /// A request header with the session's token and a fresh handle.
    pub fn request_header(&self) -> t::RequestHeader {
        let auth = self.auth.lock().map(|a| a.clone()).unwrap_or(NodeId::NULL);
        t::RequestHeader {
            authentication_token: auth,
            timestamp: DateTime::from_system_time(SystemTime::now()),
            request_handle: self.next_handle.fetch_add(1, Ordering::Relaxed),
            timeout_hint: u32::try_from(self.options.request_timeout.as_millis())
                .unwrap_or(u32::MAX),
            ..Default::default()
        }
    }

    /// Sends any request and waits for its response of type `R`. A
    /// ServiceFault or a Bad serviceResult is [`ClientError::Service`] with
    /// the server's retry-after hint.
    pub async fn request<R: DynStructure>(&self, req: &dyn DynStructure) -> Result<R, ClientError> {
        let mut message = Vec::with_capacity(128);
        encode_message(req, &mut message);
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Request { message, reply })
            .map_err(|_| ClientError::Closed)?;
        let body = tokio::time::timeout(self.options.request_timeout, rx)
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|_| ClientError::Closed)??;
        let limits = &self.options.decode;
        // The ResponseHeader first: a fault is answered by its status.
        let mut r = Reader::new(&body, limits).map_err(ClientError::decode)?;
        NodeId::decode(&mut r).map_err(ClientError::decode)?;
        let header = ResponseHeader::decode(&mut r).map_err(ClientError::decode)?;
        if header.service_result.is_bad() {
            return Err(ClientError::Service {
                status: header.service_result,
                retry_after_ms: retry_after_ms(&header),
            });
        }
        let mut r = Reader::new(&body, limits).map_err(ClientError::decode)?;
        let m = t::decode_message(&mut r).map_err(ClientError::decode)?;
        let name = m.type_name().to_owned();
        m.into_any()
            .downcast::<R>()
            .map(|b| *b)
            .map_err(|_| ClientError::Decode(format!("unexpected response {name}")))
    }

    /// GetEndpoints of the server.
    pub async fn get_endpoints(&self) -> Result<Vec<t::EndpointDescription>, ClientError> {
        let resp: t::GetEndpointsResponse = self
            .request(&t::GetEndpointsRequest {
                request_header: self.request_header(),
                endpoint_url: UaString::from(self.endpoint_url.as_str()),
                ..Default::default()
            })
            .await?;
        Ok(resp.endpoints.unwrap_or_default())
    }

    /// Creates and activates a session as `options.identity`. On a secured
    /// channel it sends our certificate and a nonce, checks the server's
    /// signature over them, and proves our key with the ClientSignature.
    pub async fn create_session(
        &self,
        name: &str,
    ) -> Result<t::CreateSessionResponse, ClientError> {
        let policy = self.security.policy();
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
        let created: t::CreateSessionResponse = self
            .request(&t::CreateSessionRequest {
                request_header: self.request_header(),
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
            })
            .await?;
        let mut client_signature = t::SignatureData::default();
        if let (Some(identity), Some(server_cert), Some(server_key), Some(own)) = (
            self.security.identity(),
            self.security.server_certificate(),
            self.security.server_key(),
            &own_der,
        ) {
            let sent = created.server_certificate.as_bytes().unwrap_or_default();
            if leaf_certificate(sent).ok() != Some(server_cert.der()) {
                return Err(ClientError::Security {
                    status: StatusCode::BadCertificateInvalid,
                    reason: "CreateSession names another server certificate than the channel's"
                        .into(),
                });
            }
            security::verify(server_key, policy, own, &nonce, &created.server_signature)?;
            client_signature = security::sign(
                identity.private_key(),
                policy,
                server_cert.der(),
                created.server_nonce.as_bytes().unwrap_or_default(),
            )?;
        }
        if let Ok(mut a) = self.auth.lock() {
            *a = created.authentication_token.clone();
        }
        let (token, user_token_signature) = self.identity_token(&created)?;
        let _: t::ActivateSessionResponse = self
            .request(&t::ActivateSessionRequest {
                request_header: self.request_header(),
                client_signature,
                locale_ids: Some(vec![UaString::from("en")]),
                user_identity_token: token,
                user_token_signature,
                ..Default::default()
            })
            .await?;
        Ok(created)
    }

    /// The UserTokenPolicy of `kind` the server offers on our endpoint
    /// (falling back to any endpoint of our policy, then any endpoint).
    fn token_policy(
        &self,
        created: &t::CreateSessionResponse,
        kind: t::UserTokenType,
    ) -> Option<t::UserTokenPolicy> {
        let endpoints = created.server_endpoints.as_deref().unwrap_or_default();
        let uri = self.security.policy().uri();
        let mode = self.security.mode();
        let exact = |e: &&t::EndpointDescription| {
            e.security_policy_uri.as_str() == Some(uri) && e.security_mode == mode
        };
        let same_policy = |e: &&t::EndpointDescription| e.security_policy_uri.as_str() == Some(uri);
        let find = |filter: &dyn Fn(&&t::EndpointDescription) -> bool| {
            endpoints
                .iter()
                .filter(filter)
                .flat_map(|e| e.user_identity_tokens.iter().flatten())
                .find(|p| p.token_type == kind)
                .cloned()
        };
        find(&exact)
            .or_else(|| find(&same_policy))
            .or_else(|| find(&|_| true))
    }

    /// The identity token of `options.identity` and its signature.
    fn identity_token(
        &self,
        created: &t::CreateSessionResponse,
    ) -> Result<(t::ExtensionObject, t::SignatureData), ClientError> {
        let server_nonce = created.server_nonce.as_bytes().unwrap_or_default();
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
        let server_cert_der = || {
            let sent = created.server_certificate.as_bytes().unwrap_or_default();
            leaf_certificate(sent).map_err(|_| ClientError::Security {
                status: StatusCode::BadCertificateInvalid,
                reason: "the server sent no usable certificate in CreateSession".into(),
            })
        };
        match &self.options.identity {
            UserIdentity::Anonymous => {
                let policy_id = self
                    .token_policy(created, t::UserTokenType::Anonymous)
                    .map(|p| p.policy_id)
                    .unwrap_or_else(|| UaString::from("anonymous"));
                Ok((
                    t::ExtensionObject::new(t::AnonymousIdentityToken { policy_id }),
                    t::SignatureData::default(),
                ))
            }
            UserIdentity::UserName { user, password } => {
                let p = self
                    .token_policy(created, t::UserTokenType::UserName)
                    .ok_or_else(|| not_offered("user name"))?;
                let policy = token_security(&p)?;
                let (data, algorithm) = if policy.is_none() {
                    security::encrypt_secret_plain(password.as_bytes())
                } else {
                    let cert = Certificate::from_der(server_cert_der()?).map_err(|e| {
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
                        policy_id: p.policy_id,
                        user_name: UaString::from(user.as_str()),
                        password: t::ByteString::new(data),
                        encryption_algorithm: algorithm.map_or_else(UaString::null, UaString::from),
                    }),
                    t::SignatureData::default(),
                ))
            }
            UserIdentity::X509(user) => {
                let p = self
                    .token_policy(created, t::UserTokenType::Certificate)
                    .ok_or_else(|| not_offered("X.509"))?;
                let policy = token_security(&p)?;
                let signature =
                    security::sign(user.private_key(), policy, server_cert_der()?, server_nonce)?;
                Ok((
                    t::ExtensionObject::new(t::X509IdentityToken {
                        policy_id: p.policy_id,
                        certificate_data: t::ByteString::new(user.certificate().der().to_vec()),
                    }),
                    signature,
                ))
            }
        }
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

    /// Closes the session (if any) and the channel.
    pub async fn close(&self) {
        let has_session = self.auth.lock().map(|a| !a.is_null()).unwrap_or(false);
        if has_session {
            let _: Result<t::CloseSessionResponse, _> = self
                .request(&t::CloseSessionRequest {
                    request_header: self.request_header(),
                    delete_subscriptions: true,
                })
                .await;
            if let Ok(mut a) = self.auth.lock() {
                *a = NodeId::NULL;
            }
        }
        let (done, rx) = oneshot::channel();
        if self.commands.send(Command::Close { done }).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
        }
    }
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

/// The connection task.
async fn drive(
    stream: TcpStream,
    mut conn: ClientConnection,
    mut commands: mpsc::UnboundedReceiver<Command>,
    opened: oneshot::Sender<Result<(), ClientError>>,
) {
    let (mut rd, mut wr) = stream.into_split();
    let mut opened = Some(opened);
    let mut pending: HashMap<u32, Reply> = HashMap::new();
    let mut input = Vec::with_capacity(8192);
    let mut out = Vec::new();
    let mut closing: Option<oneshot::Sender<()>> = None;
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
                Ok(_) => { let _ = conn.handle_input(now(), &mut input); }
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
                        Command::Request { message, reply } => match conn.send_request(&message) {
                            Ok(id) => {
                                pending.insert(id, reply);
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
                    }
                    next = commands.try_recv().ok();
                }
            }
            () = sleep_until(due) => conn.handle_timeout(now()),
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
    for (_, reply) in pending.drain() {
        let _ = reply.send(Err(failure.clone()));
    }
    if let Some(done) = closing {
        let _ = done.send(());
    }
    tracing::debug!(error = %failure, "client connection ended");
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
    }
}
