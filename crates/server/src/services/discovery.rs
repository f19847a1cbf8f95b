//! Discovery service set (Part 4 §5.4): GetEndpoints and FindServers.

use uascale_types::{
    ApplicationDescription, ApplicationType, EndpointDescription, FindServersRequest,
    FindServersResponse, GetEndpointsRequest, GetEndpointsResponse, LocalizedText,
    MessageSecurityMode, UaString, UserTokenPolicy, UserTokenType,
};

use uascale_crypto::policy::SecurityPolicy;
use uascale_types::ByteString;

use crate::context::ServiceContext;

/// The transport profile of opc.tcp with UA Secure Conversation and the
/// binary encoding.
pub const TRANSPORT_PROFILE_UATCP: &str =
    "http://opcfoundation.org/UA-Profile/Transport/uatcp-uasc-uabinary";

/// The transport profile of opc.https with the binary encoding.
pub const TRANSPORT_PROFILE_HTTPS: &str =
    "http://opcfoundation.org/UA-Profile/Transport/https-uabinary";

/// The host of an `opc.tcp://host[:port][/path]` (or `opc.https://`) URL
/// (an IPv6 literal without its brackets).
fn url_host(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("opc.tcp://")
        .or_else(|| url.strip_prefix("opc.https://"))?;
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next();
    }
    authority.split(':').next()
}

/// The endpoint URL to answer a client that connected with `client_url`
/// (its Hello's, its GetEndpoints', its CreateSession's EndpointUrl): the
/// host it used when that is an IP address and the very address its
/// connection arrived on - it can reach the server there - else the
/// configured `server.host_name` (a name, or a front end's address in a
/// cluster, is kept as configured).
pub fn endpoint_url_for(ctx: &ServiceContext, client_url: &str) -> String {
    // A cluster node behind a front end names the front end.
    if let Some(url) = &ctx.state.config.cluster.endpoint_url {
        return url.clone();
    }
    let port = ctx.state.config.server.port;
    let used = url_host(client_url).and_then(|h| h.parse::<std::net::IpAddr>().ok());
    match (used, ctx.local_ip) {
        (Some(ip), Some(local)) if ip == local => match ip {
            std::net::IpAddr::V4(v4) => format!("opc.tcp://{v4}:{port}"),
            std::net::IpAddr::V6(v6) => format!("opc.tcp://[{v6}]:{port}"),
        },
        _ => ctx.state.config.endpoint_url(),
    }
}

/// The opc.https endpoint URL to answer a client that used `client_url`
/// (the host chosen as [`endpoint_url_for`] does), `None` without
/// `[https] listen`.
pub fn https_url_for(ctx: &ServiceContext, client_url: &str) -> Option<String> {
    let port = ctx.state.config.https.listen?.port();
    let used = url_host(client_url).and_then(|h| h.parse::<std::net::IpAddr>().ok());
    Some(match (used, ctx.local_ip) {
        (Some(ip), Some(local)) if ip == local => match ip {
            std::net::IpAddr::V4(v4) => format!("opc.https://{v4}:{port}/"),
            std::net::IpAddr::V6(v6) => format!("opc.https://[{v6}]:{port}/"),
        },
        _ => format!("opc.https://{}:{port}/", ctx.state.config.server.host_name),
    })
}

/// This server's ApplicationDescription, its discovery URL as
/// [`endpoint_url_for`] answers a client that used `client_url`.
pub fn application_description(ctx: &ServiceContext, client_url: &str) -> ApplicationDescription {
    let c = &ctx.state.config;
    ApplicationDescription {
        application_uri: UaString::from(c.server.application_uri.as_str()),
        product_uri: UaString::from(c.server.product_uri.as_str()),
        application_name: LocalizedText::new("en", c.server.application_name.as_str()),
        application_type: ApplicationType::Server,
        gateway_server_uri: UaString::null(),
        discovery_profile_uri: UaString::null(),
        discovery_urls: Some(vec![UaString::from(endpoint_url_for(ctx, client_url))]),
    }
}

/// SecurityLevel of an endpoint: None 0; Sign below SignAndEncrypt; within
/// a mode, the newer policies higher.
fn security_level(policy: SecurityPolicy, mode: MessageSecurityMode) -> u8 {
    let strength = match policy {
        SecurityPolicy::Basic256Sha256 => 1,
        SecurityPolicy::Aes128Sha256RsaOaep => 2,
        SecurityPolicy::Aes256Sha256RsaPss => 3,
        SecurityPolicy::EccNistP256 => 4,
        SecurityPolicy::EccNistP384 | SecurityPolicy::EccCurve25519 => 5,
        SecurityPolicy::EccNistP256AesGcm | SecurityPolicy::EccNistP256ChaChaPoly => 6,
        _ => return 0,
    };
    if mode == MessageSecurityMode::SignAndEncrypt {
        10 + strength
    } else {
        strength
    }
}

/// The UserTokenPolicies of an endpoint with `policy`: Anonymous if allowed;
/// UserName when users exist and X509 when a PKI exists - with
/// Basic256Sha256 as the token's policy on the None endpoint, so the
/// password is encrypted (and the token signed) for the server certificate.
pub fn user_token_policies(ctx: &ServiceContext, policy: SecurityPolicy) -> Vec<UserTokenPolicy> {
    let sec = &ctx.state.security;
    let token_policy_uri = match sec.token_policy(policy) {
        Some(p) if p != policy => UaString::from(p.uri()),
        _ => UaString::null(),
    };
    let mut out = Vec::new();
    let policy_of = |id: &str, token_type: UserTokenType, uri: UaString| UserTokenPolicy {
        policy_id: UaString::from(id),
        token_type,
        issued_token_type: UaString::null(),
        issuer_endpoint_url: UaString::null(),
        security_policy_uri: uri,
    };
    if sec.allow_anonymous {
        out.push(policy_of(
            crate::identity::POLICY_ANONYMOUS,
            UserTokenType::Anonymous,
            UaString::null(),
        ));
    }
    if sec.token_policy(policy).is_some() {
        if !sec.users.is_empty() {
            out.push(policy_of(
                crate::identity::POLICY_USERNAME,
                UserTokenType::UserName,
                token_policy_uri.clone(),
            ));
        }
        if sec.pki.is_some() {
            out.push(policy_of(
                crate::identity::POLICY_X509,
                UserTokenType::Certificate,
                token_policy_uri,
            ));
        }
    }
    out
}

/// The endpoints this server offers: opc.tcp with every published
/// (policy, mode) pair, each with the server certificate its policy uses
/// (RSA or the ECC one of its curve; None endpoints the RSA one) and the
/// whole ApplicationDescription, the URL [`endpoint_url_for`] answers a
/// client that used `client_url` (GetEndpoints).
pub fn endpoints(ctx: &ServiceContext, client_url: &str) -> Vec<EndpointDescription> {
    let certificate = |policy: SecurityPolicy| {
        ctx.state
            .security
            .identity_for(policy)
            .or(ctx.state.security.identity.as_ref())
            .map_or_else(ByteString::null, |i| {
                ByteString::new(i.certificate().der().to_vec())
            })
    };
    let server = application_description(ctx, client_url);
    described(ctx, client_url, |policy| {
        (server.clone(), certificate(policy))
    })
}

/// The endpoints as CreateSession returns them: the same list as
/// [`endpoints`], with only the fields Part 4 (CreateSession's
/// serverEndpoints) recommends a server include and a client verify -
/// server.applicationUri, endpointUrl, securityMode, securityPolicyUri,
/// userIdentityTokens, transportProfileUri, securityLevel - and the rest
/// null. Without a certificate per endpoint the response is about 2 KB
/// instead of 10 KB, and every secured session encrypts, signs and sends
/// that much less.
pub fn session_endpoints(ctx: &ServiceContext, client_url: &str) -> Vec<EndpointDescription> {
    let server = ApplicationDescription {
        application_uri: UaString::from(ctx.state.config.server.application_uri.as_str()),
        product_uri: UaString::null(),
        application_name: LocalizedText::default(),
        application_type: ApplicationType::Server,
        gateway_server_uri: UaString::null(),
        discovery_profile_uri: UaString::null(),
        discovery_urls: None,
    };
    described(ctx, client_url, |_| (server.clone(), ByteString::null()))
}

/// Every published (policy, mode) pair as an EndpointDescription, with
/// the server's description and certificate from `server_and_certificate`.
fn described(
    ctx: &ServiceContext,
    client_url: &str,
    server_and_certificate: impl Fn(SecurityPolicy) -> (ApplicationDescription, ByteString),
) -> Vec<EndpointDescription> {
    let url = endpoint_url_for(ctx, client_url);
    // HTTPS: TLS carries the transport security; the policy (named by
    // the client's OPCUA-SecurityPolicy header) only signs the session's
    // nonces, so a secured one is offered in mode Sign. Each published
    // policy once, the ECC ones left out (their session signatures need a
    // channel's key agreement).
    let https_url = https_url_for(ctx, client_url);
    let mut https_policies: Vec<SecurityPolicy> = Vec::new();
    for (policy, _) in &ctx.state.security.endpoints {
        if https_url.is_some() && !policy.is_ecc() && !https_policies.contains(policy) {
            https_policies.push(*policy);
        }
    }
    let https = https_policies.into_iter().map(|policy| {
        let (server, server_certificate) = server_and_certificate(policy);
        let mode = if policy.is_none() {
            MessageSecurityMode::None
        } else {
            MessageSecurityMode::Sign
        };
        EndpointDescription {
            endpoint_url: UaString::from(https_url.as_deref().unwrap_or_default()),
            server,
            server_certificate,
            security_mode: mode,
            security_policy_uri: UaString::from(policy.uri()),
            user_identity_tokens: Some(user_token_policies(ctx, policy)),
            transport_profile_uri: UaString::from(TRANSPORT_PROFILE_HTTPS),
            security_level: security_level(policy, mode),
        }
    });
    ctx.state
        .security
        .endpoints
        .iter()
        .map(|(policy, mode)| {
            let (server, server_certificate) = server_and_certificate(*policy);
            EndpointDescription {
                endpoint_url: UaString::from(url.as_str()),
                server,
                server_certificate,
                security_mode: *mode,
                security_policy_uri: UaString::from(policy.uri()),
                user_identity_tokens: Some(user_token_policies(ctx, *policy)),
                transport_profile_uri: UaString::from(TRANSPORT_PROFILE_UATCP),
                security_level: security_level(*policy, *mode),
            }
        })
        .chain(https)
        .collect()
}

/// GetEndpoints: every endpoint, filtered by `profileUris` when given.
pub fn get_endpoints(ctx: &ServiceContext, req: &GetEndpointsRequest) -> GetEndpointsResponse {
    let wanted = req.profile_uris.as_deref().unwrap_or(&[]);
    let endpoints = endpoints(ctx, req.endpoint_url.as_str_or_empty())
        .into_iter()
        .filter(|e| wanted.is_empty() || wanted.contains(&e.transport_profile_uri))
        .collect();
    GetEndpointsResponse {
        response_header: ctx.response_header(&req.request_header),
        endpoints: Some(endpoints),
    }
}

/// FindServers: this server, unless `serverUris` names only others.
pub fn find_servers(ctx: &ServiceContext, req: &FindServersRequest) -> FindServersResponse {
    let wanted = req.server_uris.as_deref().unwrap_or(&[]);
    let me = application_description(ctx, req.endpoint_url.as_str_or_empty());
    let servers = if wanted.is_empty() || wanted.contains(&me.application_uri) {
        vec![me]
    } else {
        vec![]
    };
    FindServersResponse {
        response_header: ctx.response_header(&req.request_header),
        servers: Some(servers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::RequestHeader;

    /// A hostile-input finding: a client that connected to 127.0.0.1 gets
    /// endpoint URLs naming 127.0.0.1 (where it can reach the server), not
    /// `localhost`; a name, or an address the connection did not arrive
    /// on, gets the configured host_name.
    #[test]
    fn endpoint_urls_name_the_host_the_client_used() {
        #[allow(clippy::disallowed_methods)]
        let t0 = std::time::Instant::now();
        let mut config = crate::ServerConfig::default();
        config.server.port = 4840;
        let mut ctx = ServiceContext::for_tests(crate::state::ServerState::empty(config), t0);
        ctx.local_ip = Some("127.0.0.1".parse().unwrap());
        let urls = |ctx: &ServiceContext, client_url: &str| {
            let r = get_endpoints(
                ctx,
                &GetEndpointsRequest {
                    endpoint_url: client_url.into(),
                    ..Default::default()
                },
            );
            let mut u: Vec<String> = r
                .endpoints
                .unwrap()
                .iter()
                .map(|e| e.endpoint_url.as_str_or_empty().to_owned())
                .collect();
            u.dedup();
            u
        };
        assert_eq!(
            urls(&ctx, "opc.tcp://127.0.0.1:4840"),
            ["opc.tcp://127.0.0.1:4840"]
        );
        assert_eq!(
            urls(&ctx, "opc.tcp://localhost:4840"),
            ["opc.tcp://localhost:4840"]
        );
        assert_eq!(
            urls(&ctx, "opc.tcp://10.1.2.3:4840/x"),
            ["opc.tcp://localhost:4840"]
        );
        assert_eq!(urls(&ctx, ""), ["opc.tcp://localhost:4840"]);
        ctx.local_ip = Some("::1".parse().unwrap());
        assert_eq!(urls(&ctx, "opc.tcp://[::1]:4840"), ["opc.tcp://[::1]:4840"]);
    }

    #[test]
    fn filters() {
        // The origin of the test's time.
        #[allow(clippy::disallowed_methods)]
        let t0 = std::time::Instant::now();
        let ctx = ServiceContext::for_tests(
            crate::state::ServerState::empty(crate::ServerConfig::default()),
            t0,
        );
        let mut req = GetEndpointsRequest {
            request_header: RequestHeader {
                request_handle: 3,
                ..Default::default()
            },
            ..Default::default()
        };
        let r = get_endpoints(&ctx, &req);
        assert_eq!(r.response_header.request_handle, 3);
        assert_eq!(r.endpoints.as_ref().unwrap().len(), 1);
        assert_eq!(
            r.endpoints.unwrap()[0].endpoint_url,
            "opc.tcp://localhost:4840"
        );
        req.profile_uris = Some(vec![UaString::from(
            "http://opcfoundation.org/UA-Profile/Transport/https-uabinary",
        )]);
        assert_eq!(get_endpoints(&ctx, &req).endpoints, Some(vec![]));
        let mut fs = FindServersRequest::default();
        assert_eq!(find_servers(&ctx, &fs).servers.unwrap().len(), 1);
        fs.server_uris = Some(vec![UaString::from("urn:other")]);
        assert_eq!(find_servers(&ctx, &fs).servers, Some(vec![]));
    }
}
