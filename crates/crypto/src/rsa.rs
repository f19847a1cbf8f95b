//! RSA keys for the asymmetric messages (OpenSecureChannel) and the
//! certificate signatures: PKCS#1 v1.5 and PSS signatures with SHA-256,
//! OAEP encryption with SHA-1 or SHA-256.
//!
//! Backed by aws-lc-rs, whose RSA private-key operations are constant time
//! and blinded (the pure-Rust `rsa` crate carries the unfixed Marvin timing
//! advisory RUSTSEC-2023-0071 and is not used).
//!
//! Encryption works block-wise as Part 6 §6.7.4 does for messages longer
//! than one RSA block: the plaintext is cut into blocks of
//! [`RsaPublicKey::plaintext_block_size`] bytes and each becomes one
//! ciphertext block of [`RsaPublicKey::size`] bytes.

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{
    KeyPair, KeySize, OaepAlgorithm, OaepPrivateDecryptingKey, OaepPublicEncryptingKey,
    PrivateDecryptingKey, PublicEncryptingKey, OAEP_SHA1_MGF1SHA1, OAEP_SHA256_MGF1SHA256,
};
use aws_lc_rs::signature::{self, KeyPair as _, ParsedPublicKey, RsaParameters};
use std::sync::OnceLock;
use uascale_types::StatusCode;

use crate::CryptoError;

/// An RSA signature scheme (always over SHA-256 here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignatureScheme {
    /// RSASSA-PKCS1-v1_5 with SHA-256 (Basic256Sha256, Aes128_Sha256_RsaOaep).
    Pkcs1Sha256,
    /// RSASSA-PSS with SHA-256, MGF1-SHA-256 and a 32-byte salt
    /// (Aes256_Sha256_RsaPss).
    PssSha256,
}

/// An RSA encryption padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EncryptionPadding {
    /// RSAES-OAEP with SHA-1 and MGF1-SHA-1 (Basic256Sha256, Aes128_Sha256_RsaOaep).
    OaepSha1,
    /// RSAES-OAEP with SHA-256 and MGF1-SHA-256 (Aes256_Sha256_RsaPss).
    OaepSha256,
}

impl EncryptionPadding {
    /// Bytes of each RSA block the padding takes (Part 6 §6.7.4): 42 for
    /// OAEP-SHA-1, 66 for OAEP-SHA-256.
    pub const fn overhead(self) -> usize {
        match self {
            EncryptionPadding::OaepSha1 => 2 * 20 + 2,
            EncryptionPadding::OaepSha256 => 2 * 32 + 2,
        }
    }

    fn algorithm(self) -> &'static OaepAlgorithm {
        match self {
            EncryptionPadding::OaepSha1 => &OAEP_SHA1_MGF1SHA1,
            EncryptionPadding::OaepSha256 => &OAEP_SHA256_MGF1SHA256,
        }
    }
}

fn checks_failed(what: &'static str) -> CryptoError {
    CryptoError::Peer {
        status: StatusCode::BadSecurityChecksFailed,
        what,
    }
}

fn config(what: &'static str) -> CryptoError {
    CryptoError::Config { what }
}

/// An RSA private key (ours).
pub struct RsaPrivateKey {
    pair: KeyPair,
    decrypting: OaepPrivateDecryptingKey,
    public: RsaPublicKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for RsaPrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RsaPrivateKey({} bits)", self.bits())
    }
}

impl RsaPrivateKey {
    fn from_pair(pair: KeyPair) -> Result<Self, CryptoError> {
        let pkcs8 = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&pair)
            .map_err(|_| config("RSA private key cannot be re-encoded"))?;
        let decrypting = PrivateDecryptingKey::from_pkcs8(pkcs8.as_ref())
            .map_err(|_| config("RSA private key unusable for decryption"))?;
        let decrypting = OaepPrivateDecryptingKey::new(decrypting)
            .map_err(|_| config("RSA private key unusable for OAEP"))?;
        let spki = AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(pair.public_key())
            .map_err(|_| config("RSA public key cannot be encoded"))?;
        let public = RsaPublicKey::from_spki_der(spki.as_ref())
            .map_err(|_| config("RSA public key unusable"))?;
        Ok(RsaPrivateKey {
            pair,
            decrypting,
            public,
            rng: SystemRandom::new(),
        })
    }

    /// From a PKCS#8 `PrivateKeyInfo` DER.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, CryptoError> {
        let pair = KeyPair::from_pkcs8(der).map_err(|_| config("not an RSA PKCS#8 private key"))?;
        Self::from_pair(pair)
    }

    /// From a PKCS#1 `RSAPrivateKey` DER.
    pub fn from_pkcs1_der(der: &[u8]) -> Result<Self, CryptoError> {
        let pair = KeyPair::from_der(der).map_err(|_| config("not an RSA PKCS#1 private key"))?;
        Self::from_pair(pair)
    }

    /// From PKCS#8 or PKCS#1 DER, whichever it is.
    pub fn from_der(der: &[u8]) -> Result<Self, CryptoError> {
        Self::from_pkcs8_der(der).or_else(|_| {
            Self::from_pkcs1_der(der)
                .map_err(|_| config("RSA private key is neither PKCS#8 nor PKCS#1 DER"))
        })
    }

    /// Generates a new key of 2048, 3072 or 4096 bits (tests, self-signed
    /// certificates).
    pub fn generate(bits: usize) -> Result<Self, CryptoError> {
        let size = match bits {
            2048 => KeySize::Rsa2048,
            3072 => KeySize::Rsa3072,
            4096 => KeySize::Rsa4096,
            _ => return Err(config("RSA key size must be 2048, 3072 or 4096 bits")),
        };
        let pair = KeyPair::generate(size).map_err(|_| config("RSA key generation failed"))?;
        Self::from_pair(pair)
    }

    /// The key as PKCS#8 DER.
    pub fn to_pkcs8_der(&self) -> Result<Vec<u8>, CryptoError> {
        AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&self.pair)
            .map(|d| d.as_ref().to_vec())
            .map_err(|_| config("RSA private key cannot be encoded"))
    }

    /// The public half.
    pub fn public_key(&self) -> &RsaPublicKey {
        &self.public
    }

    /// Modulus length in bits.
    pub fn bits(&self) -> usize {
        self.public.bits()
    }

    /// Modulus length in bytes (= signature length = ciphertext block).
    pub fn size(&self) -> usize {
        self.public.size()
    }

    /// Signs `message`; appends the signature ([`RsaPrivateKey::size`] bytes)
    /// to `out`.
    pub fn sign(
        &self,
        scheme: SignatureScheme,
        message: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let encoding: &'static dyn signature::RsaEncoding = match scheme {
            SignatureScheme::Pkcs1Sha256 => &signature::RSA_PKCS1_SHA256,
            SignatureScheme::PssSha256 => &signature::RSA_PSS_SHA256,
        };
        let start = out.len();
        out.resize(start + self.size(), 0);
        let sig = out.get_mut(start..).unwrap_or_default();
        if self.pair.sign(encoding, &self.rng, message, sig).is_err() {
            out.truncate(start);
            return Err(config("RSA signing failed"));
        }
        Ok(())
    }

    /// The pairwise consistency check: a PKCS#1 signature made with this
    /// key verifies under its public half, and an OAEP block encrypted
    /// under the public half decrypts to what went in. A key that fails is
    /// unusable (`CryptoError::Config`).
    ///
    /// Run once when a server loads its own key, it also does the one-time
    /// work of the first private-key operations at load rather than in the
    /// first client's handshake: aws-lc seeds its random generator (tens of
    /// milliseconds of CPU-jitter sampling, once per process) and caches
    /// the key's Montgomery contexts.
    pub fn check_pair(&self) -> Result<(), CryptoError> {
        let broken = || config("RSA private key fails its pairwise consistency check");
        let message = b"uascale pairwise consistency check";
        let mut sig = Vec::with_capacity(self.size());
        self.sign(SignatureScheme::Pkcs1Sha256, message, &mut sig)?;
        self.public
            .verify(SignatureScheme::Pkcs1Sha256, message, &sig)
            .map_err(|_| broken())?;
        let mut sealed = Vec::with_capacity(self.size());
        self.public
            .encrypt(EncryptionPadding::OaepSha1, message, &mut sealed)?;
        let mut opened = Vec::with_capacity(message.len());
        self.decrypt(EncryptionPadding::OaepSha1, &sealed, &mut opened)
            .map_err(|_| broken())?;
        if opened != message {
            return Err(broken());
        }
        Ok(())
    }

    /// Decrypts `ciphertext`, a whole number of RSA blocks, appending the
    /// plaintext to `out`. Any failure (wrong key, tampered block, bad
    /// length) is `BadSecurityChecksFailed` and leaves `out` as it was.
    pub fn decrypt(
        &self,
        padding: EncryptionPadding,
        ciphertext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let block = self.size();
        if ciphertext.is_empty() || ciphertext.len() % block != 0 {
            return Err(checks_failed(
                "RSA ciphertext is not a whole number of blocks",
            ));
        }
        let start = out.len();
        let mut buf = vec![0u8; block];
        for c in ciphertext.chunks(block) {
            match self
                .decrypting
                .decrypt(padding.algorithm(), c, &mut buf, None)
            {
                Ok(p) => out.extend_from_slice(p),
                Err(_) => {
                    out.truncate(start);
                    return Err(checks_failed("RSA decryption failed"));
                }
            }
        }
        Ok(())
    }
}

/// An RSA public key (a peer's, from its certificate).
///
/// Parsed for PKCS#1 verification when made; the PSS and OAEP forms are
/// parsed on their first use. aws-lc keeps a separate key object (and
/// Montgomery cache) for each form, and a channel or session uses only one
/// or two of them: a Basic256Sha256 session's client key was parsed six
/// times (three forms, twice) and is now parsed three.
pub struct RsaPublicKey {
    spki: Vec<u8>,
    pkcs1: ParsedPublicKey,
    pss: OnceLock<ParsedPublicKey>,
    encrypting: OnceLock<OaepPublicEncryptingKey>,
    bits: usize,
}

impl std::fmt::Debug for RsaPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RsaPublicKey({} bits)", self.bits)
    }
}

/// The verification parameters that accept any modulus size: the policy
/// enforces its own range before a key is used.
const PKCS1_ANY: RsaParameters = signature::RSA_PKCS1_2048_8192_SHA256;
const PSS_ANY: RsaParameters = signature::RSA_PSS_2048_8192_SHA256;

impl RsaPublicKey {
    /// From a DER `SubjectPublicKeyInfo` (the public key of a certificate).
    /// Keys outside 2048..=8192 bits are rejected (aws-lc refuses shorter
    /// ones as invalid, so callers that want `BadCertificatePolicyCheckFailed`
    /// check the certificate's key size against the policy first).
    pub fn from_spki_der(der: &[u8]) -> Result<Self, CryptoError> {
        let invalid = |what| CryptoError::Certificate {
            status: StatusCode::BadCertificateInvalid,
            what,
        };
        let pkcs1 = ParsedPublicKey::new(&PKCS1_ANY, der)
            .map_err(|_| invalid("public key is not an RSA SubjectPublicKeyInfo"))?;
        let bits =
            modulus_bits(der).ok_or(invalid("public key is not an RSA SubjectPublicKeyInfo"))?;
        if !(2048..=8192).contains(&bits) {
            return Err(CryptoError::Certificate {
                status: StatusCode::BadCertificatePolicyCheckFailed,
                what: "RSA key size outside 2048..=8192 bits",
            });
        }
        Ok(RsaPublicKey {
            spki: der.to_vec(),
            pkcs1,
            pss: OnceLock::new(),
            encrypting: OnceLock::new(),
            bits,
        })
    }

    /// The key parsed for PSS verification (on first use).
    fn pss(&self) -> Result<&ParsedPublicKey, CryptoError> {
        if let Some(k) = self.pss.get() {
            return Ok(k);
        }
        let k = ParsedPublicKey::new(&PSS_ANY, &self.spki)
            .map_err(|_| checks_failed("RSA public key rejected for PSS"))?;
        Ok(self.pss.get_or_init(|| k))
    }

    /// The key parsed for OAEP encryption (on first use).
    fn encrypting(&self) -> Result<&OaepPublicEncryptingKey, CryptoError> {
        if let Some(k) = self.encrypting.get() {
            return Ok(k);
        }
        let k = PublicEncryptingKey::from_der(&self.spki)
            .ok()
            .and_then(|k| OaepPublicEncryptingKey::new(k).ok())
            .ok_or(config("RSA public key unusable for OAEP"))?;
        Ok(self.encrypting.get_or_init(|| k))
    }

    /// The DER `SubjectPublicKeyInfo`.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    /// Modulus length in bits.
    pub fn bits(&self) -> usize {
        self.bits
    }

    /// Modulus length in bytes.
    pub fn size(&self) -> usize {
        self.bits.div_ceil(8)
    }

    /// Plaintext bytes per RSA block with `padding`.
    pub fn plaintext_block_size(&self, padding: EncryptionPadding) -> usize {
        self.size().saturating_sub(padding.overhead())
    }

    /// Checks `signature` over `message`. A mismatch is
    /// `BadSecurityChecksFailed`.
    pub fn verify(
        &self,
        scheme: SignatureScheme,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), CryptoError> {
        let key = match scheme {
            SignatureScheme::Pkcs1Sha256 => &self.pkcs1,
            SignatureScheme::PssSha256 => self.pss()?,
        };
        key.verify_sig(message, signature)
            .map_err(|_| checks_failed("RSA signature does not verify"))
    }

    /// Encrypts `plaintext` block-wise (each block at most
    /// [`RsaPublicKey::plaintext_block_size`] bytes), appending the
    /// ciphertext (`blocks * size()` bytes) to `out`.
    pub fn encrypt(
        &self,
        padding: EncryptionPadding,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let block = self.plaintext_block_size(padding);
        if block == 0 {
            return Err(config("RSA key too small for the padding"));
        }
        let size = self.size();
        let encrypting = self.encrypting()?;
        let start = out.len();
        for p in plaintext.chunks(block) {
            let at = out.len();
            out.resize(at + size, 0);
            let c = out.get_mut(at..).unwrap_or_default();
            match encrypting.encrypt(padding.algorithm(), p, c, None) {
                Ok(written) if written.len() == size => {}
                _ => {
                    out.truncate(start);
                    return Err(config("RSA encryption failed"));
                }
            }
        }
        Ok(())
    }
}

/// The exact bit length of the modulus in an RSA `SubjectPublicKeyInfo`
/// (aws-lc's count: leading zero bits left out).
fn modulus_bits(spki: &[u8]) -> Option<usize> {
    use x509_parser::prelude::FromDer;
    use x509_parser::public_key::PublicKey;
    let (_, info) = x509_parser::x509::SubjectPublicKeyInfo::from_der(spki).ok()?;
    let PublicKey::RSA(rsa) = info.parsed().ok()? else {
        return None;
    };
    let n = rsa.modulus;
    let at = n.iter().position(|b| *b != 0)?;
    let top = n.get(at)?;
    Some((n.len() - at - 1) * 8 + (8 - top.leading_zeros() as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    pub(crate) fn key2048() -> &'static RsaPrivateKey {
        static K: OnceLock<RsaPrivateKey> = OnceLock::new();
        K.get_or_init(|| RsaPrivateKey::generate(2048).unwrap())
    }

    #[test]
    fn signatures_round_trip_and_detect_tampering() {
        let k = key2048();
        for scheme in [SignatureScheme::Pkcs1Sha256, SignatureScheme::PssSha256] {
            let mut sig = Vec::new();
            k.sign(scheme, b"message", &mut sig).unwrap();
            assert_eq!(sig.len(), 256);
            k.public_key().verify(scheme, b"message", &sig).unwrap();
            let e = k.public_key().verify(scheme, b"messagf", &sig).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
            sig[10] ^= 1;
            assert!(k.public_key().verify(scheme, b"message", &sig).is_err());
        }
        // The schemes are not interchangeable.
        let mut sig = Vec::new();
        k.sign(SignatureScheme::PssSha256, b"m", &mut sig).unwrap();
        assert!(k
            .public_key()
            .verify(SignatureScheme::Pkcs1Sha256, b"m", &sig)
            .is_err());
    }

    #[test]
    fn a_loaded_key_passes_its_pairwise_check() {
        let k = key2048();
        k.check_pair().unwrap();
        let again = RsaPrivateKey::from_der(&k.to_pkcs8_der().unwrap()).unwrap();
        again.check_pair().unwrap();
        // The check decrypts what its public half encrypted: a key whose
        // halves differ would not pass it.
        let other = RsaPrivateKey::generate(2048).unwrap();
        let mut sealed = Vec::new();
        other
            .public_key()
            .encrypt(EncryptionPadding::OaepSha1, b"m", &mut sealed)
            .unwrap();
        assert!(k
            .decrypt(EncryptionPadding::OaepSha1, &sealed, &mut Vec::new())
            .is_err());
    }

    #[test]
    fn oaep_round_trips_over_several_blocks() {
        let k = key2048();
        for padding in [EncryptionPadding::OaepSha1, EncryptionPadding::OaepSha256] {
            let block = k.public_key().plaintext_block_size(padding);
            assert_eq!(block, 256 - padding.overhead());
            let plain: Vec<u8> = (0..block * 2 + 7).map(|i| i as u8).collect();
            let mut c = Vec::new();
            k.public_key().encrypt(padding, &plain, &mut c).unwrap();
            assert_eq!(c.len(), 3 * 256);
            let mut p = vec![1, 2];
            k.decrypt(padding, &c, &mut p).unwrap();
            assert_eq!(&p[2..], &plain[..]);
            // Tampered block, wrong padding and partial block are refused.
            let other = match padding {
                EncryptionPadding::OaepSha1 => EncryptionPadding::OaepSha256,
                EncryptionPadding::OaepSha256 => EncryptionPadding::OaepSha1,
            };
            let mut p = Vec::new();
            assert!(k.decrypt(other, &c, &mut p).is_err());
            assert!(p.is_empty());
            c[300] ^= 0x80;
            let e = k.decrypt(padding, &c, &mut p).unwrap_err();
            assert_eq!(e.status_code(), StatusCode::BadSecurityChecksFailed);
            assert!(k.decrypt(padding, &c[..255], &mut p).is_err());
        }
    }

    #[test]
    fn keys_load_from_pkcs8_and_pkcs1() {
        let k = key2048();
        let pkcs8 = k.to_pkcs8_der().unwrap();
        let k2 = RsaPrivateKey::from_der(&pkcs8).unwrap();
        assert_eq!(k2.public_key().spki_der(), k.public_key().spki_der());
        assert_eq!(k2.bits(), 2048);
        let pkcs1 = pkcs1_inside_pkcs8(&pkcs8);
        let k3 = RsaPrivateKey::from_pkcs1_der(pkcs1).unwrap();
        assert_eq!(k3.public_key().spki_der(), k.public_key().spki_der());
        assert!(RsaPrivateKey::from_pkcs8_der(pkcs1).is_err());
        assert!(RsaPrivateKey::from_der(b"\x30\x03\x02\x01\x00").is_err());
        let e = RsaPublicKey::from_spki_der(b"junk").unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadCertificateInvalid);
    }

    /// A peer key is parsed for PKCS#1 when made; PSS and OAEP forms follow
    /// on first use, and the size comes from the modulus itself.
    #[test]
    fn a_public_key_parses_its_other_forms_on_first_use() {
        let k = key2048();
        let public = RsaPublicKey::from_spki_der(k.public_key().spki_der()).unwrap();
        assert_eq!(public.bits(), 2048);
        assert!(public.pss.get().is_none() && public.encrypting.get().is_none());
        let mut sig = Vec::new();
        k.sign(SignatureScheme::Pkcs1Sha256, b"m", &mut sig)
            .unwrap();
        public
            .verify(SignatureScheme::Pkcs1Sha256, b"m", &sig)
            .unwrap();
        assert!(public.pss.get().is_none() && public.encrypting.get().is_none());
        sig.clear();
        k.sign(SignatureScheme::PssSha256, b"m", &mut sig).unwrap();
        public
            .verify(SignatureScheme::PssSha256, b"m", &sig)
            .unwrap();
        assert!(public.pss.get().is_some() && public.encrypting.get().is_none());
        let mut sealed = Vec::new();
        public
            .encrypt(EncryptionPadding::OaepSha256, b"secret", &mut sealed)
            .unwrap();
        assert!(public.encrypting.get().is_some());
        let mut plain = Vec::new();
        k.decrypt(EncryptionPadding::OaepSha256, &sealed, &mut plain)
            .unwrap();
        assert_eq!(plain, b"secret");

        // The modulus length of another size; not an RSA key: none.
        let k3 = RsaPrivateKey::generate(3072).unwrap();
        assert_eq!(modulus_bits(k3.public_key().spki_der()), Some(3072));
        assert_eq!(modulus_bits(b"junk"), None);
    }

    /// DER TLV at the front of `d`: (tag, content, rest).
    fn tlv(d: &[u8]) -> (u8, &[u8], &[u8]) {
        let (len, at) = match d[1] {
            n if n < 0x80 => (n as usize, 2),
            0x81 => (d[2] as usize, 3),
            0x82 => (((d[2] as usize) << 8) | d[3] as usize, 4),
            _ => panic!("long DER length"),
        };
        (d[0], &d[at..at + len], &d[at + len..])
    }

    /// PKCS#8 PrivateKeyInfo = SEQ { INTEGER version, SEQ algorithm,
    /// OCTET STRING RSAPrivateKey (PKCS#1) }.
    fn pkcs1_inside_pkcs8(pkcs8: &[u8]) -> &[u8] {
        let (_, seq, _) = tlv(pkcs8);
        let (_, _, rest) = tlv(seq);
        let (_, _, rest) = tlv(rest);
        let (tag, key, _) = tlv(rest);
        assert_eq!(tag, 0x04);
        key
    }
}
