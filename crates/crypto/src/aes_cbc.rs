//! AES-CBC with a single key schedule, through aws-lc's own AES functions.
//!
//! aws-lc-rs's CBC keys (`cipher::EncryptingKey`, `DecryptingKey`) each
//! hold both the encryption and the decryption schedule of the key, 504
//! bytes, although a key only ever runs one way. A secured channel keeps
//! one schedule per direction while it is busy, so with tens of thousands
//! of channels that second, never used schedule is a large part of a
//! session's memory. [`CbcSchedule`] holds the one schedule it runs: 244
//! bytes of `AES_KEY`, and building it expands the key once instead of
//! twice.
//!
//! Measured (5,000 Basic256Sha256 SignAndEncrypt sessions, each notified
//! every second, server RSS per session): see docs/notebook/benchmarks.md, "Memory
//! per secured session". This is the crate's only `unsafe` code: three
//! calls into aws-lc (linked already, through aws-lc-rs) with pointers to
//! memory this module owns, and lengths it checked.
#![allow(unsafe_code)]

use aws_lc_sys::{AES_cbc_encrypt, AES_set_decrypt_key, AES_set_encrypt_key, AES_KEY};

/// AES's block size in bytes.
pub const BLOCK: usize = 16;

/// Which way a [`CbcSchedule`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Plaintext to ciphertext.
    Encrypt,
    /// Ciphertext to plaintext.
    Decrypt,
}

/// One expanded AES-128 or AES-256 key, for CBC in one direction.
pub struct CbcSchedule {
    key: AES_KEY,
    direction: Direction,
}

impl std::fmt::Debug for CbcSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CbcSchedule")
            .field("direction", &self.direction)
            .finish_non_exhaustive()
    }
}

impl CbcSchedule {
    /// Expands `key` (16 or 32 bytes) for `direction`; None for any other
    /// length.
    pub fn new(key: &[u8], direction: Direction) -> Option<Self> {
        let bits: u32 = match key.len() {
            16 => 128,
            32 => 256,
            _ => return None,
        };
        let mut schedule = CbcSchedule {
            key: AES_KEY {
                rd_key: [0; 60],
                rounds: 0,
            },
            direction,
        };
        // SAFETY: `key` holds `bits / 8` readable bytes (checked above);
        // `schedule.key` is an AES_KEY this function owns. aws-lc writes
        // only into it and returns 0 on success.
        let rc = unsafe {
            match direction {
                Direction::Encrypt => AES_set_encrypt_key(key.as_ptr(), bits, &mut schedule.key),
                Direction::Decrypt => AES_set_decrypt_key(key.as_ptr(), bits, &mut schedule.key),
            }
        };
        (rc == 0).then_some(schedule)
    }

    /// The direction the schedule runs.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// Encrypts or decrypts (the schedule's direction) `data` in place in
    /// CBC mode from `iv`. None when `data` is not a whole number of
    /// blocks.
    pub fn apply(&self, iv: &[u8; BLOCK], data: &mut [u8]) -> Option<()> {
        if data.len() % BLOCK != 0 {
            return None;
        }
        if data.is_empty() {
            return Some(());
        }
        let mut ivec = *iv;
        let enc = match self.direction {
            Direction::Encrypt => 1,
            Direction::Decrypt => 0,
        };
        let ptr = data.as_mut_ptr();
        // SAFETY: `data` is `data.len()` bytes, a whole number of blocks,
        // read and written in place (aws-lc's CBC supports in == out);
        // `self.key` was set up by AES_set_*_key for this direction;
        // `ivec` is a 16-byte buffer this function owns, which aws-lc
        // updates to the last block.
        unsafe {
            AES_cbc_encrypt(ptr, ptr, data.len(), &self.key, ivec.as_mut_ptr(), enc);
        }
        Some(())
    }
}

impl Drop for CbcSchedule {
    /// The round keys are wiped when the schedule goes.
    fn drop(&mut self) {
        self.key.rd_key = [0; 60];
        std::hint::black_box(&self.key.rd_key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::cipher::{
        DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey,
        AES_128, AES_256,
    };
    use aws_lc_rs::iv::FixedLength;

    /// The same ciphertext as aws-lc-rs's CBC keys for both key sizes and
    /// several lengths, and back; wrong key and data lengths are refused.
    #[test]
    fn matches_aws_lc_rs_cbc() {
        for (alg, len) in [(&AES_128, 16), (&AES_256, 32)] {
            let key: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
            let iv = [0x3cu8; BLOCK];
            let enc = CbcSchedule::new(&key, Direction::Encrypt).unwrap();
            let dec = CbcSchedule::new(&key, Direction::Decrypt).unwrap();
            assert_eq!(enc.direction(), Direction::Encrypt);
            for blocks in [1usize, 2, 7, 64, 513] {
                let plain: Vec<u8> = (0..blocks * BLOCK).map(|i| (i * 7 + 3) as u8).collect();
                let mut ours = plain.clone();
                enc.apply(&iv, &mut ours).unwrap();
                let mut theirs = plain.clone();
                let k = EncryptingKey::cbc(UnboundCipherKey::new(alg, &key).unwrap()).unwrap();
                k.less_safe_encrypt(&mut theirs, EncryptionContext::Iv128(FixedLength::from(iv)))
                    .unwrap();
                assert_eq!(ours, theirs, "{len} {blocks}");
                assert_ne!(ours, plain);
                // The IV is the caller's: a second run gives the same.
                let mut again = plain.clone();
                enc.apply(&iv, &mut again).unwrap();
                assert_eq!(again, ours);
                dec.apply(&iv, &mut ours).unwrap();
                assert_eq!(ours, plain);
                let k = DecryptingKey::cbc(UnboundCipherKey::new(alg, &key).unwrap()).unwrap();
                k.decrypt(&mut theirs, DecryptionContext::Iv128(FixedLength::from(iv)))
                    .unwrap();
                assert_eq!(theirs, plain);
            }
            let mut odd = [0u8; 17];
            assert!(enc.apply(&iv, &mut odd).is_none());
            assert!(dec.apply(&iv, &mut odd[..15]).is_none());
            assert!(enc.apply(&iv, &mut []).is_some());
        }
        assert!(CbcSchedule::new(&[0u8; 24], Direction::Encrypt).is_none());
        assert!(CbcSchedule::new(&[], Direction::Decrypt).is_none());
        assert_eq!(std::mem::size_of::<CbcSchedule>(), 248);
    }
}
