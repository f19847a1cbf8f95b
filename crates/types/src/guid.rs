//! Guid (Part 6 §5.2.2.6): Data1 (UInt32), Data2, Data3 (UInt16) little
//! endian, then Data4 as 8 bytes.

use std::fmt;
use std::str::FromStr;

use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, Reader};

/// A 128-bit GUID, held in its text (big-endian) byte order.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Guid([u8; 16]);

impl Guid {
    /// The all-zero GUID.
    pub const NULL: Guid = Guid([0; 16]);

    /// From the 16 bytes in text order (as printed, left to right).
    pub const fn from_bytes(b: [u8; 16]) -> Self {
        Guid(b)
    }

    /// The 16 bytes in text order.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// From the four fields.
    pub fn from_fields(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> Self {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&d1.to_be_bytes());
        b[4..6].copy_from_slice(&d2.to_be_bytes());
        b[6..8].copy_from_slice(&d3.to_be_bytes());
        b[8..].copy_from_slice(&d4);
        Guid(b)
    }
}

/// A GUID text that is not `XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuidParseError;

impl fmt::Display for GuidParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("expected a GUID of the form XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX (hex digits)")
    }
}

impl std::error::Error for GuidParseError {}

impl FromStr for Guid {
    type Err = GuidParseError;

    /// Parses `72962B91-FA75-4AE6-8D28-B404DC7DAF63`, optionally in braces,
    /// in either case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s
            .strip_prefix('{')
            .and_then(|x| x.strip_suffix('}'))
            .unwrap_or(s);
        let bytes = s.as_bytes();
        if bytes.len() != 36 {
            return Err(GuidParseError);
        }
        let mut out = [0u8; 16];
        let mut n = 0;
        let mut hi: Option<u8> = None;
        for (i, &c) in bytes.iter().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(GuidParseError);
                }
                continue;
            }
            let v = (c as char).to_digit(16).ok_or(GuidParseError)? as u8;
            match hi.take() {
                None => hi = Some(v),
                Some(h) => {
                    out[n] = (h << 4) | v;
                    n += 1;
                }
            }
        }
        Ok(Guid(out))
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

impl BinaryEncode for Guid {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        let b = &self.0;
        w.extend_from_slice(&[b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6]]);
        w.extend_from_slice(&b[8..]);
    }
}

impl BinaryDecode for Guid {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let w: [u8; 16] = r.take_array()?;
        Ok(Guid([
            w[3], w[2], w[1], w[0], w[5], w[4], w[7], w[6], w[8], w[9], w[10], w[11], w[12], w[13],
            w[14], w[15],
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part6_example() {
        // Part 6 §5.2.2.6 example: C496578A-0DFE-4B8F-870A-745238C6AEAE
        let g: Guid = "C496578A-0DFE-4B8F-870A-745238C6AEAE".parse().unwrap();
        assert_eq!(
            g.to_bytes(),
            [
                0x8a, 0x57, 0x96, 0xc4, 0xfe, 0x0d, 0x8f, 0x4b, 0x87, 0x0a, 0x74, 0x52, 0x38, 0xc6,
                0xae, 0xae
            ]
        );
        assert_eq!(g.to_string(), "C496578A-0DFE-4B8F-870A-745238C6AEAE");
        assert_eq!(
            g,
            Guid::from_fields(
                0xC496578A,
                0x0DFE,
                0x4B8F,
                [0x87, 0x0A, 0x74, 0x52, 0x38, 0xC6, 0xAE, 0xAE]
            )
        );
        assert_eq!(
            "{c496578a-0dfe-4b8f-870a-745238c6aeae}".parse::<Guid>(),
            Ok(g)
        );
    }

    #[test]
    fn bad_text() {
        for s in [
            "",
            "C496578A0DFE4B8F870A745238C6AEAE",
            "C496578A-0DFE-4B8F-870A-745238C6AEAG",
            "ü96578A-0DFE-4B8F-870A-745238C6AEA",
        ] {
            assert_eq!(s.parse::<Guid>(), Err(GuidParseError), "{s}");
        }
    }
}
