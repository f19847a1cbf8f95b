//! The error type of the crypto layer.

use uascale_types::StatusCode;

/// Why a cryptographic operation failed.
///
/// "The peer sent something wrong" (`Peer*`) is kept apart from local
/// configuration problems (`Config`), which are the operator's to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CryptoError {
    /// The peer's data failed a security check (bad signature, bad padding,
    /// wrong key length...). `what` says which check.
    Peer {
        /// The StatusCode to answer with.
        status: StatusCode,
        /// Which check failed.
        what: &'static str,
    },
    /// A certificate failed validation.
    Certificate {
        /// BadCertificateUntrusted, BadCertificateTimeInvalid, ...
        status: StatusCode,
        /// Which check failed.
        what: &'static str,
    },
    /// Local keys or certificates are unusable (e.g. a key that does not
    /// parse); the operator must fix the configuration.
    Config {
        /// What is wrong.
        what: &'static str,
    },
}

impl CryptoError {
    /// The StatusCode this error maps to.
    pub fn status_code(&self) -> StatusCode {
        match self {
            CryptoError::Peer { status, .. } | CryptoError::Certificate { status, .. } => *status,
            CryptoError::Config { .. } => StatusCode::BadConfigurationError,
        }
    }
}

impl std::fmt::Display for CryptoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CryptoError::Peer { status, what } | CryptoError::Certificate { status, what } => {
                write!(f, "{what} ({status})")
            }
            CryptoError::Config { what } => write!(f, "configuration: {what}"),
        }
    }
}

impl std::error::Error for CryptoError {}
