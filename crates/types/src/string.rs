//! String, ByteString and XmlElement (Part 6 §5.2.2.4, §5.2.2.7, §5.2.2.8):
//! length-prefixed, with a null value (length -1) distinct from empty (0).

use std::fmt;

use crate::encoding::{write_length, BinaryDecode, BinaryEncode, DecodeError, Limit, Reader};
use crate::DecodeErrorKind;

/// An OPC UA String: UTF-8 text, or null.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UaString(Option<String>);

impl UaString {
    /// The null string (encoded with length -1).
    pub const fn null() -> Self {
        UaString(None)
    }

    /// A non-null string.
    pub fn new(s: impl Into<String>) -> Self {
        UaString(Some(s.into()))
    }

    /// True for the null string (not for the empty one).
    pub fn is_null(&self) -> bool {
        self.0.is_none()
    }

    /// True for null and for the empty string.
    pub fn is_null_or_empty(&self) -> bool {
        self.0.as_deref().is_none_or(str::is_empty)
    }

    /// The text, `None` when null.
    pub fn as_str(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The text, with null read as empty.
    pub fn as_str_or_empty(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }

    /// The inner value.
    pub fn into_inner(self) -> Option<String> {
        self.0
    }
}

impl From<&str> for UaString {
    fn from(s: &str) -> Self {
        UaString(Some(s.to_owned()))
    }
}

impl From<String> for UaString {
    fn from(s: String) -> Self {
        UaString(Some(s))
    }
}

impl From<Option<String>> for UaString {
    fn from(s: Option<String>) -> Self {
        UaString(s)
    }
}

impl PartialEq<str> for UaString {
    fn eq(&self, other: &str) -> bool {
        self.0.as_deref() == Some(other)
    }
}

impl PartialEq<&str> for UaString {
    fn eq(&self, other: &&str) -> bool {
        self.0.as_deref() == Some(*other)
    }
}

impl fmt::Debug for UaString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("null"),
            Some(s) => fmt::Debug::fmt(s, f),
        }
    }
}

impl fmt::Display for UaString {
    /// Null prints as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str_or_empty())
    }
}

pub(crate) fn encode_str(w: &mut Vec<u8>, s: Option<&str>) {
    write_length(w, s.map(str::len));
    if let Some(s) = s {
        w.extend_from_slice(s.as_bytes());
    }
}

pub(crate) fn decode_str(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    let Some(n) = r.read_length(Limit::StringLength)? else {
        return Ok(None);
    };
    let bytes = r.take(n)?;
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(Some(s.to_owned())),
        Err(_) => Err(DecodeError::new(DecodeErrorKind::InvalidUtf8)),
    }
}

impl BinaryEncode for UaString {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        encode_str(w, self.as_str());
    }
}

impl BinaryDecode for UaString {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        decode_str(r).map(UaString)
    }
}

/// An OPC UA ByteString: opaque bytes, or null.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteString(Option<Vec<u8>>);

impl ByteString {
    /// The null ByteString (length -1).
    pub const fn null() -> Self {
        ByteString(None)
    }

    /// A non-null ByteString.
    pub fn new(b: impl Into<Vec<u8>>) -> Self {
        ByteString(Some(b.into()))
    }

    /// True for null (not for empty).
    pub fn is_null(&self) -> bool {
        self.0.is_none()
    }

    /// True for null and empty.
    pub fn is_null_or_empty(&self) -> bool {
        self.0.as_deref().is_none_or(<[u8]>::is_empty)
    }

    /// The bytes, `None` when null.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        self.0.as_deref()
    }

    /// The bytes, with null read as empty.
    pub fn as_bytes_or_empty(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// The inner value.
    pub fn into_inner(self) -> Option<Vec<u8>> {
        self.0
    }
}

impl From<Vec<u8>> for ByteString {
    fn from(b: Vec<u8>) -> Self {
        ByteString(Some(b))
    }
}

impl From<&[u8]> for ByteString {
    fn from(b: &[u8]) -> Self {
        ByteString(Some(b.to_vec()))
    }
}

impl fmt::Debug for ByteString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("null"),
            Some(b) => {
                f.write_str("0x")?;
                for byte in b.iter().take(64) {
                    write!(f, "{byte:02x}")?;
                }
                if b.len() > 64 {
                    write!(f, "...({} bytes)", b.len())?;
                }
                Ok(())
            }
        }
    }
}

impl BinaryEncode for ByteString {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        write_length(w, self.0.as_ref().map(Vec::len));
        if let Some(b) = &self.0 {
            w.extend_from_slice(b);
        }
    }
}

impl BinaryDecode for ByteString {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let Some(n) = r.read_length(Limit::ByteStringLength)? else {
            return Ok(ByteString(None));
        };
        Ok(ByteString(Some(r.take(n)?.to_vec())))
    }
}

/// An XmlElement: an XML fragment carried as a UTF-8 string.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct XmlElement(pub UaString);

impl fmt::Debug for XmlElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Xml({:?})", self.0)
    }
}

impl BinaryEncode for XmlElement {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        self.0.encode(w);
    }
}

impl BinaryDecode for XmlElement {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        UaString::decode(r).map(XmlElement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    #[test]
    fn null_empty_and_text() {
        assert_eq!(UaString::null().to_bytes(), [0xff; 4]);
        assert_eq!(UaString::from("").to_bytes(), [0; 4]);
        assert_eq!(
            UaString::from("hé").to_bytes(),
            [3, 0, 0, 0, b'h', 0xc3, 0xa9]
        );
        let l = DecodeLimits::default();
        assert!(UaString::from_bytes(&[0xff; 4], &l).unwrap().is_null());
        let e = UaString::from_bytes(&[0; 4], &l).unwrap();
        assert!(!e.is_null() && e.is_null_or_empty());
    }

    #[test]
    fn invalid_utf8_and_limits() {
        let l = DecodeLimits {
            max_string_length: 2,
            ..DecodeLimits::default()
        };
        assert_eq!(
            UaString::from_bytes(&[1, 0, 0, 0, 0xff], &l)
                .unwrap_err()
                .kind(),
            &DecodeErrorKind::InvalidUtf8
        );
        assert!(matches!(
            UaString::from_bytes(&[3, 0, 0, 0, b'a', b'b', b'c'], &l)
                .unwrap_err()
                .kind(),
            DecodeErrorKind::LimitExceeded {
                limit: Limit::StringLength,
                ..
            }
        ));
    }

    #[test]
    fn byte_string_round_trip() {
        let l = DecodeLimits::default();
        for b in [
            ByteString::null(),
            ByteString::new(vec![]),
            ByteString::new(vec![1, 2, 3]),
        ] {
            assert_eq!(ByteString::from_bytes(&b.to_bytes(), &l).unwrap(), b);
        }
    }
}
