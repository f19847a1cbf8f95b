//! The TLS configuration of the opc.https binding (`[https]`): the
//! certificate and key it serves, read and checked at start, each error
//! naming its configuration key. rustls does the TLS itself; the shell
//! runs it on the sockets.

use std::io;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::state::ServerState;

/// The opc.https listener's TLS configuration (TLS 1.3 and 1.2): the
/// certificate and key of
/// `[https] certificate`/`private_key`, else the application instance
/// certificate (the PKI's own, created on first start if need be).
pub fn server_config(state: &ServerState) -> io::Result<Arc<rustls::ServerConfig>> {
    let (chain, key) = certificate(state)?;
    // The ring provider: the one the NATS client's TLS already builds.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| invalid("https", &e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| invalid("https.certificate", &e.to_string()))?;
    tls.alpn_protocols = alpn(state.config.https.http2);
    Ok(Arc::new(tls))
}

/// The ALPN protocols offered, in the server's order of preference: `h2`
/// first when HTTP/2 is on (`[https] http2`), then `http/1.1`. A client
/// that offers no ALPN gets HTTP/1.1.
pub fn alpn(http2: bool) -> Vec<Vec<u8>> {
    let mut protocols = Vec::with_capacity(2);
    if http2 {
        protocols.push(H2.to_vec());
    }
    protocols.push(b"http/1.1".to_vec());
    protocols
}

/// The ALPN id of HTTP/2 over TLS.
pub const H2: &[u8] = b"h2";

fn invalid(key: &str, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{key}: {why}"))
}

/// The TLS certificate chain and key (see [`server_config`]).
fn certificate(
    state: &ServerState,
) -> io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let h = &state.config.https;
    if let (Some(cert), Some(key)) = (&h.certificate, &h.private_key) {
        let read = |path: &std::path::Path, key: &str| {
            std::fs::read(path).map_err(|e| invalid(key, &format!("{}: {e}", path.display())))
        };
        let cert_bytes = read(cert, "https.certificate")?;
        let key_bytes = read(key, "https.private_key")?;
        let chain: Vec<CertificateDer<'static>> = if cert_bytes.starts_with(b"-----") {
            CertificateDer::pem_slice_iter(&cert_bytes)
                .collect::<Result<_, _>>()
                .map_err(|e| invalid("https.certificate", &e.to_string()))?
        } else {
            vec![CertificateDer::from(cert_bytes)]
        };
        let key = if key_bytes.starts_with(b"-----") {
            PrivateKeyDer::from_pem_slice(&key_bytes)
                .map_err(|e| invalid("https.private_key", &e.to_string()))?
        } else {
            PrivateKeyDer::try_from(key_bytes).map_err(|e| invalid("https.private_key", e))?
        };
        return Ok((chain, key));
    }
    let (cert, key) = match &state.security.identity {
        Some(identity) => {
            let key = identity
                .rsa_key()
                .ok_or_else(|| invalid("https.certificate", "the application key is not RSA"))?
                .to_pkcs8_der()
                .map_err(|e| invalid("https.certificate", &e.to_string()))?;
            (identity.certificate().der().to_vec(), key)
        }
        None => {
            // Only SecurityPolicy None is published: the PKI is opened
            // here for its own certificate.
            let sec = &state.config.security;
            let (pki, key) = crate::pki::Pki::open(
                &sec.pki_dir,
                &crate::pki::OwnIdentity::for_config(&state.config),
                sec.pki_options(),
                SystemTime::now(),
            )
            .map_err(|e| invalid("security.pki_dir", &e.to_string()))?;
            let key = key
                .to_pkcs8_der()
                .map_err(|e| invalid("https.certificate", &e.to_string()))?;
            (pki.own_certificate().der().to_vec(), key)
        }
    };
    let key = PrivateKeyDer::try_from(key).map_err(|e| invalid("https.certificate", e))?;
    Ok((vec![CertificateDer::from(cert)], key))
}

#[cfg(test)]
mod alpn_tests {
    #[test]
    fn h2_is_offered_first_unless_off() {
        assert_eq!(
            super::alpn(true),
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert_eq!(super::alpn(false), vec![b"http/1.1".to_vec()]);
    }
}
