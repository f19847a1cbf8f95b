//! Symmetric sign+encrypt (and verify+decrypt) of one message chunk per
//! policy, for a 100-byte and an 8 KiB body, and the RSA-2048 private-key
//! operations of an OpenSecureChannel.
//!
//! `cargo bench -p uascale-crypto --bench symmetric`
//!
//! The chunk work is what the channel does per chunk: padding to the AES
//! block, HMAC-SHA256 over the headers and body, AES-CBC over everything
//! after the 16 unencrypted header bytes - in place in a reused buffer.

use criterion::{black_box, criterion_main, Criterion};
use uascale_crypto::policy::{derive_keys, SecurityPolicy, SymmetricKeys, AES_BLOCK};
use uascale_crypto::rsa::{EncryptionPadding, RsaPrivateKey, SignatureScheme};

/// Unencrypted headers of a symmetric chunk (message header, channel id,
/// token id), then the sequence header.
const HEAD: usize = 16;
const SEQ: usize = 8;

/// Builds the sealed chunk for `body` into `buf` (cleared first).
fn seal(keys: &SymmetricKeys, body: &[u8], buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(b"MSGF\0\0\0\0\x01\0\0\0\x01\0\0\0\x05\0\0\0\x02\0\0\0");
    buf.extend_from_slice(body);
    let sig = keys.signature_size();
    let plain = buf.len() - HEAD;
    let pad = (AES_BLOCK - (plain + 1 + sig) % AES_BLOCK) % AES_BLOCK;
    buf.resize(buf.len() + pad + 1, pad as u8);
    let size = (buf.len() + sig) as u32;
    buf[4..8].copy_from_slice(&size.to_le_bytes());
    let at = buf.len();
    buf.resize(at + sig, 0);
    keys.sign_in_place(buf, at).unwrap();
    keys.encrypt(&mut buf[HEAD..]).unwrap();
}

/// Decrypts and verifies a sealed chunk in place; returns the body length.
fn open(keys: &SymmetricKeys, buf: &mut [u8]) -> usize {
    keys.decrypt(&mut buf[HEAD..]).unwrap();
    let at = buf.len() - keys.signature_size();
    let (signed, sig) = buf.split_at(at);
    keys.verify(signed, sig).unwrap();
    at - 1 - usize::from(signed[at - 1]) - HEAD - SEQ
}

fn symmetric(c: &mut Criterion) {
    let policies = [
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
    ];
    for policy in policies {
        let keys = derive_keys(policy, &[1; 32], &[2; 32]).unwrap();
        // The receiving side's copy of the same keys: each copy keeps the
        // one AES key schedule it runs.
        let receiver = derive_keys(policy, &[1; 32], &[2; 32]).unwrap();
        for len in [100usize, 8192] {
            let body = vec![0x42u8; len];
            let mut buf = Vec::with_capacity(len + 128);
            let name = format!("{policy:?}");
            c.bench_function(&format!("sign+encrypt/{name}/{len}"), |b| {
                b.iter(|| seal(&keys.client, black_box(&body), &mut buf))
            });
            seal(&keys.client, &body, &mut buf);
            let sealed = buf.clone();
            let mut work = sealed.clone();
            c.bench_function(&format!("verify+decrypt/{name}/{len}"), |b| {
                b.iter(|| {
                    work.copy_from_slice(&sealed);
                    assert_eq!(open(&receiver.client, black_box(&mut work)), len);
                })
            });
        }
        // A sparse channel's message: the AES key schedule is built for it
        // and dropped after (see KEY_SCHEDULE_SPARSE in uascale-proto).
        let body = vec![0x42u8; 100];
        let mut buf = Vec::with_capacity(256);
        let mut sparse = derive_keys(policy, &[1; 32], &[2; 32]).unwrap();
        c.bench_function(&format!("sign+encrypt+schedule/{policy:?}/100"), |b| {
            b.iter(|| {
                seal(&sparse.client, black_box(&body), &mut buf);
                sparse.client.release_schedules();
            })
        });
        seal(&keys.client, &body, &mut buf);
        let sealed = buf.clone();
        let mut work = sealed.clone();
        c.bench_function(&format!("verify+decrypt+schedule/{policy:?}/100"), |b| {
            b.iter(|| {
                work.copy_from_slice(&sealed);
                assert_eq!(open(&sparse.client, black_box(&mut work)), 100);
                sparse.client.release_schedules();
            })
        });
    }
    c.bench_function("derive_keys/Basic256Sha256", |b| {
        b.iter(|| {
            derive_keys(
                SecurityPolicy::Basic256Sha256,
                &[1; 32],
                black_box(&[2; 32]),
            )
        })
    });
}

fn rsa(c: &mut Criterion) {
    let key = RsaPrivateKey::generate(2048).unwrap();
    let public = key.public_key();
    let block = vec![7u8; public.plaintext_block_size(EncryptionPadding::OaepSha1)];
    let mut ciphertext = Vec::new();
    public
        .encrypt(EncryptionPadding::OaepSha1, &block, &mut ciphertext)
        .unwrap();
    let mut out = Vec::with_capacity(512);
    c.bench_function("rsa2048/decrypt_oaep_sha1_block", |b| {
        b.iter(|| {
            out.clear();
            key.decrypt(
                EncryptionPadding::OaepSha1,
                black_box(&ciphertext),
                &mut out,
            )
            .unwrap();
        })
    });
    let message = vec![9u8; 1000];
    for (name, scheme) in [
        ("pkcs1_sha256", SignatureScheme::Pkcs1Sha256),
        ("pss_sha256", SignatureScheme::PssSha256),
    ] {
        c.bench_function(&format!("rsa2048/sign_{name}"), |b| {
            b.iter(|| {
                out.clear();
                key.sign(scheme, black_box(&message), &mut out).unwrap();
            })
        });
        let mut sig = Vec::new();
        key.sign(scheme, &message, &mut sig).unwrap();
        c.bench_function(&format!("rsa2048/verify_{name}"), |b| {
            b.iter(|| public.verify(scheme, black_box(&message), &sig).unwrap())
        });
    }
    c.bench_function("rsa2048/encrypt_oaep_sha1_block", |b| {
        b.iter(|| {
            out.clear();
            public
                .encrypt(EncryptionPadding::OaepSha1, black_box(&block), &mut out)
                .unwrap();
        })
    });
}

/// What a secured OpenSecureChannel costs besides its RSA operations:
/// parsing the client's certificate and its public key.
fn certificate(c: &mut Criterion) {
    use uascale_crypto::rsa::RsaPublicKey;
    use uascale_crypto::x509::{create_self_signed, Certificate, SelfSignedParams};
    let params = SelfSignedParams::new(
        "urn:bench:client",
        "bench client",
        std::time::SystemTime::now(),
    );
    let created = create_self_signed(&params).unwrap();
    let der = created.certificate.der().to_vec();
    c.bench_function("x509/parse_rsa2048_certificate", |b| {
        b.iter(|| Certificate::from_der(black_box(&der)).unwrap())
    });
    let spki = created.certificate.subject_public_key_info_der().to_vec();
    c.bench_function("rsa2048/public_key_from_spki", |b| {
        b.iter(|| RsaPublicKey::from_spki_der(black_box(&spki)).unwrap())
    });
}

fn benches() {
    let mut c = Criterion::default().configure_from_args();
    symmetric(&mut c);
    rsa(&mut c);
    certificate(&mut c);
}

criterion_main!(benches);
