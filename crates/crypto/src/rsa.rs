//! RSA keys: owned by the sec-crypto work (issue 4).
