//! Security policies, symmetric keys and key derivation: owned by the sec-crypto work (issue 4).
