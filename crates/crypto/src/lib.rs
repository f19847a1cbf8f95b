//! `uascale-crypto`: OPC UA security policies (None, Basic256Sha256,
//! Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss), key derivation and X.509
//! handling.
//!
//! Owns: everything cryptographic. Must not: do file IO, read clocks or open
//! sockets; callers pass certificates, keys and time in.
//!
//! Status: the policies arrive with issue 4; this crate is a placeholder in the
//! workspace layout so that dependants can be wired now.
