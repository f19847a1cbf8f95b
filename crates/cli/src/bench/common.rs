//! Helpers the bench subcommands share.

use uascale_client::{Client, ClientOptions};

use super::Args;
use crate::client_security::{parse_security, user_identity, SecurityArgs};

/// Default client options, but for an opc.https URL with
/// `--trust-server`: the server's TLS certificate accepted unchecked
/// (unsafe; the benches that take `--security` judge it by `--pki` too).
pub(super) fn transport_options(a: &Args) -> ClientOptions {
    let mut options = ClientOptions::default();
    if a.last("--trust-server").is_some() {
        options.security.trust = uascale_client::ServerTrust::UnsafeAcceptAny;
    }
    options
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
