//! X.509 certificates: owned by the sec-pki work (issue 4).
