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

/// This server's ApplicationDescription.
pub fn application_description(ctx: &ServiceContext) -> ApplicationDescription {
    let c = &ctx.config;
    ApplicationDescription {
        application_uri: UaString::from(c.server.application_uri.as_str()),
        product_uri: UaString::from(c.server.product_uri.as_str()),
        application_name: LocalizedText::new("en", c.server.application_name.as_str()),
        application_type: ApplicationType::Server,
        gateway_server_uri: UaString::null(),
        discovery_profile_uri: UaString::null(),
        discovery_urls: Some(vec![UaString::from(c.endpoint_url())]),
    }
}

/// SecurityLevel of an endpoint: None 0; Sign below SignAndEncrypt; within
/// a mode, the newer policies higher.
fn security_level(policy: SecurityPolicy, mode: MessageSecurityMode) -> u8 {
    let strength = match policy {
        SecurityPolicy::Basic256Sha256 => 1,
        SecurityPolicy::Aes128Sha256RsaOaep => 2,
        SecurityPolicy::Aes256Sha256RsaPss => 3,
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
    let sec = &ctx.security;
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
/// (policy, mode) pair, each with the server certificate.
pub fn endpoints(ctx: &ServiceContext) -> Vec<EndpointDescription> {
    let certificate = ctx
        .security
        .identity
        .as_ref()
        .map_or_else(ByteString::null, |i| {
            ByteString::new(i.certificate().der().to_vec())
        });
    ctx.security
        .endpoints
        .iter()
        .map(|(policy, mode)| EndpointDescription {
            endpoint_url: UaString::from(ctx.config.endpoint_url()),
            server: application_description(ctx),
            server_certificate: certificate.clone(),
            security_mode: *mode,
            security_policy_uri: UaString::from(policy.uri()),
            user_identity_tokens: Some(user_token_policies(ctx, *policy)),
            transport_profile_uri: UaString::from(TRANSPORT_PROFILE_UATCP),
            security_level: security_level(*policy, *mode),
        })
        .collect()
}

/// GetEndpoints: every endpoint, filtered by `profileUris` when given.
pub fn get_endpoints(ctx: &ServiceContext, req: &GetEndpointsRequest) -> GetEndpointsResponse {
    let wanted = req.profile_uris.as_deref().unwrap_or(&[]);
    let endpoints = endpoints(ctx)
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
    let me = application_description(ctx);
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

    #[test]
    fn filters() {
        // The origin of the test's time.
        #[allow(clippy::disallowed_methods)]
        let t0 = std::time::Instant::now();
        let ctx = ServiceContext::for_tests(
            crate::state::ServerState::from_parts(
                crate::ServerConfig::default(),
                crate::address_space::AddressSpace::default(),
                crate::node_manager::NodeManagers::default(),
                crate::security::SecurityState::none_only(),
            ),
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
