//! QualifiedName (Part 6 §5.2.2.13) and LocalizedText (§5.2.2.14).

use std::fmt;

use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, DecodeErrorKind, Reader};
use crate::string::UaString;

/// A name qualified by a namespace index, as in BrowseNames.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    /// Index into the NamespaceArray.
    pub namespace_index: u16,
    /// The name.
    pub name: UaString,
}

impl QualifiedName {
    /// A QualifiedName.
    pub fn new(namespace_index: u16, name: impl Into<String>) -> Self {
        QualifiedName {
            namespace_index,
            name: UaString::new(name),
        }
    }

    /// True when the name is null or empty (Part 3: a null QualifiedName).
    pub fn is_null(&self) -> bool {
        self.namespace_index == 0 && self.name.is_null_or_empty()
    }
}

impl fmt::Display for QualifiedName {
    /// `Name` in namespace 0, `2:Name` elsewhere (the BrowsePath text form).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace_index != 0 {
            write!(f, "{}:", self.namespace_index)?;
        }
        write!(f, "{}", self.name)
    }
}

impl fmt::Debug for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QualifiedName({}:{:?})", self.namespace_index, self.name)
    }
}

impl BinaryEncode for QualifiedName {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        self.namespace_index.encode(w);
        self.name.encode(w);
    }
}

impl BinaryDecode for QualifiedName {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(QualifiedName {
            namespace_index: u16::decode(r)?,
            name: UaString::decode(r)?,
        })
    }
}

/// Human-readable text with an optional locale.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalizedText {
    /// The locale, e.g. `en-US`; null when not given.
    pub locale: UaString,
    /// The text; null when not given.
    pub text: UaString,
}

impl LocalizedText {
    /// Text with a locale.
    pub fn new(locale: impl Into<String>, text: impl Into<String>) -> Self {
        LocalizedText {
            locale: UaString::new(locale),
            text: UaString::new(text),
        }
    }

    /// Text without a locale.
    pub fn text(text: impl Into<String>) -> Self {
        LocalizedText {
            locale: UaString::null(),
            text: UaString::new(text),
        }
    }
}

impl fmt::Display for LocalizedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.text)
    }
}

impl fmt::Debug for LocalizedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalizedText({:?}, {:?})", self.locale, self.text)
    }
}

impl BinaryEncode for LocalizedText {
    fn encode(&self, w: &mut Vec<u8>) {
        let mask = u8::from(!self.locale.is_null()) | (u8::from(!self.text.is_null()) << 1);
        w.push(mask);
        if !self.locale.is_null() {
            self.locale.encode(w);
        }
        if !self.text.is_null() {
            self.text.encode(w);
        }
    }
}

impl BinaryDecode for LocalizedText {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mask = r.read_u8()?;
        if mask & !0x03 != 0 {
            return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "LocalizedText encoding mask",
                value: mask,
            }));
        }
        let locale = if mask & 1 != 0 {
            UaString::decode(r).map_err(|e| e.in_field("locale"))?
        } else {
            UaString::null()
        };
        let text = if mask & 2 != 0 {
            UaString::decode(r).map_err(|e| e.in_field("text"))?
        } else {
            UaString::null()
        };
        Ok(LocalizedText { locale, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    #[test]
    fn localized_text_mask() {
        let l = DecodeLimits::default();
        assert_eq!(LocalizedText::default().to_bytes(), [0]);
        assert_eq!(LocalizedText::text("a").to_bytes(), [2, 1, 0, 0, 0, b'a']);
        let lt = LocalizedText::new("en", "");
        assert_eq!(lt.to_bytes(), [3, 2, 0, 0, 0, b'e', b'n', 0, 0, 0, 0]);
        assert_eq!(LocalizedText::from_bytes(&lt.to_bytes(), &l).unwrap(), lt);
        assert!(LocalizedText::from_bytes(&[4], &l).is_err());
    }

    #[test]
    fn qualified_name() {
        let q = QualifiedName::new(2, "Demo");
        assert_eq!(q.to_string(), "2:Demo");
        assert_eq!(q.to_bytes(), [2, 0, 4, 0, 0, 0, b'D', b'e', b'm', b'o']);
    }
}
