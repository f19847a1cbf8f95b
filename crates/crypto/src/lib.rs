//! `uascale-crypto`: OPC UA security policies (None, Basic256Sha256,
//! Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss, and the ECC policies
//! ECC_nistP256, ECC_nistP384, ECC_curve25519, ECC_nistP256_AesGcm,
//! ECC_nistP256_ChaChaPoly), key derivation and X.509 handling.
//!
//! Owns: everything cryptographic. Must not: do file IO, read clocks or open
//! sockets; callers pass certificates, keys and time in.
//!
//! Modules:
//! - [`error`]: [`CryptoError`], the one error type of this layer;
//! - [`ecc`]: ephemeral keys, ECDH, HKDF, ECDSA (raw `r||s`) and Ed25519;
//! - [`rsa`]: RSA keys (aws-lc-rs, constant time) - sign, verify, encrypt, decrypt;
//! - [`policy`]: the security policies, symmetric keys and key derivation;
//! - [`x509`]: certificates - parse, create, validate against trust lists;
//! - `aes_cbc` (private): AES-CBC keys holding one schedule, the crate's
//!   only `unsafe` code.

mod aes_cbc;
pub mod ecc;
pub mod error;
pub mod policy;
pub mod rsa;
pub mod x509;

pub use error::CryptoError;
