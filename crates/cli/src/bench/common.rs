//! Helpers the bench subcommands share.

use uascale_client::{Client, ClientOptions};

use super::Args;
use crate::client_security::{parse_security, user_identity, SecurityArgs};

/// Default client options (SecurityPolicy None, anonymous), with the
/// trust an opc.https server's TLS certificate is judged by: the trust
/// list of `--pki DIR` (default `pki-client`), or with `--trust-server`
/// any certificate (unsafe) - as for the client commands.
pub(super) fn transport_options(a: &Args) -> Result<ClientOptions, String> {
    let security = SecurityArgs {
        policy: uascale_crypto::policy::SecurityPolicy::None,
        mode: uascale_types::MessageSecurityMode::None,
        pki: a.last("--pki").unwrap_or("pki-client").into(),
        trust_any: a.last("--trust-server").is_some(),
    }
    .options_for(&a.url)?;
    Ok(ClientOptions {
        security,
        ..Default::default()
    })
}

/// True for an `opc.https://` URL.
pub(super) fn is_https(url: &str) -> bool {
    uascale_client::net::https::is_https(url)
}

/// Refuses an opc.https URL for a bench that takes opc.tcp only,
/// saying why.
pub(super) fn tcp_only(a: &Args, why: &str) -> Result<(), String> {
    if is_https(&a.url) {
        return Err(format!(
            "bench {} takes opc.tcp URLs only, not {}: {why}",
            a.kind, a.url
        ));
    }
    Ok(())
}

/// The client options of the security and identity flags; for a secured
/// policy the server certificate is looked up once here, not per session.
pub(super) async fn client_options(a: &Args) -> Result<ClientOptions, String> {
    let (policy, mode) = parse_security(a.last("--security").unwrap_or("None"))?;
    let security = SecurityArgs {
        policy,
        mode,
        pki: a.last("--pki").unwrap_or("pki-client").into(),
        trust_any: a.last("--trust-server").is_some(),
    }
    .options_for(&a.url)?;
    let mut options = ClientOptions {
        security,
        identity: user_identity(
            a.last("--user"),
            a.last("--password"),
            a.last("--cert"),
            a.last("--key"),
        )?,
        reconnect: false,
        ..Default::default()
    };
    if !policy.is_none() {
        let endpoint = Client::find_endpoint(&a.url, &options)
            .await
            .map_err(|e| format!("the server's endpoint for --security: {e}"))?;
        options.security.server_certificate =
            endpoint.server_certificate.as_bytes().map(<[u8]>::to_vec);
    }
    Ok(options)
}
