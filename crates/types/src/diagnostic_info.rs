//! DiagnosticInfo (Part 6 §5.2.2.12): vendor diagnostics pointing into a
//! response's string table, possibly nested.

use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, DecodeErrorKind, Reader};
use crate::status_code::StatusCode;
use crate::string::UaString;

/// Diagnostics for one operation; the integers index the response header's
/// string table.
#[derive(Clone, Default, PartialEq, Debug)]
pub struct DiagnosticInfo {
    /// Symbolic id (mask 0x01).
    pub symbolic_id: Option<i32>,
    /// Namespace URI index (0x02).
    pub namespace_uri: Option<i32>,
    /// Locale index (0x08).
    pub locale: Option<i32>,
    /// Localized text index (0x04).
    pub localized_text: Option<i32>,
    /// Free text (0x10).
    pub additional_info: Option<UaString>,
    /// Status of the inner operation (0x20).
    pub inner_status_code: Option<StatusCode>,
    /// Diagnostics of the inner operation (0x40).
    pub inner_diagnostic_info: Option<Box<DiagnosticInfo>>,
}

impl DiagnosticInfo {
    /// True when no field is present (encoded as the single byte 0).
    pub fn is_empty(&self) -> bool {
        *self == DiagnosticInfo::default()
    }
}

impl BinaryEncode for DiagnosticInfo {
    fn encode(&self, w: &mut Vec<u8>) {
        let mask = u8::from(self.symbolic_id.is_some())
            | u8::from(self.namespace_uri.is_some()) << 1
            | u8::from(self.localized_text.is_some()) << 2
            | u8::from(self.locale.is_some()) << 3
            | u8::from(self.additional_info.is_some()) << 4
            | u8::from(self.inner_status_code.is_some()) << 5
            | u8::from(self.inner_diagnostic_info.is_some()) << 6;
        w.push(mask);
        if let Some(v) = self.symbolic_id {
            v.encode(w);
        }
        if let Some(v) = self.namespace_uri {
            v.encode(w);
        }
        if let Some(v) = self.locale {
            v.encode(w);
        }
        if let Some(v) = self.localized_text {
            v.encode(w);
        }
        if let Some(v) = &self.additional_info {
            v.encode(w);
        }
        if let Some(v) = self.inner_status_code {
            v.encode(w);
        }
        if let Some(v) = &self.inner_diagnostic_info {
            v.encode(w);
        }
    }
}

impl BinaryDecode for DiagnosticInfo {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mask = r.read_u8()?;
        if mask & 0x80 != 0 {
            return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "DiagnosticInfo encoding mask",
                value: mask,
            }));
        }
        let mut d = DiagnosticInfo::default();
        if mask & 0x01 != 0 {
            d.symbolic_id = Some(i32::decode(r).map_err(|e| e.in_field("symbolic_id"))?);
        }
        if mask & 0x02 != 0 {
            d.namespace_uri = Some(i32::decode(r).map_err(|e| e.in_field("namespace_uri"))?);
        }
        if mask & 0x08 != 0 {
            d.locale = Some(i32::decode(r).map_err(|e| e.in_field("locale"))?);
        }
        if mask & 0x04 != 0 {
            d.localized_text = Some(i32::decode(r).map_err(|e| e.in_field("localized_text"))?);
        }
        if mask & 0x10 != 0 {
            d.additional_info =
                Some(UaString::decode(r).map_err(|e| e.in_field("additional_info"))?);
        }
        if mask & 0x20 != 0 {
            d.inner_status_code =
                Some(StatusCode::decode(r).map_err(|e| e.in_field("inner_status_code"))?);
        }
        if mask & 0x40 != 0 {
            r.enter()?;
            let inner = DiagnosticInfo::decode(r).map_err(|e| e.in_field("inner_diagnostic_info"));
            r.leave();
            d.inner_diagnostic_info = Some(Box::new(inner?));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    #[test]
    fn nested_round_trip_and_depth_bound() {
        let d = DiagnosticInfo {
            symbolic_id: Some(1),
            locale: Some(2),
            additional_info: Some(UaString::from("x")),
            inner_status_code: Some(StatusCode::BadTimeout),
            inner_diagnostic_info: Some(Box::new(DiagnosticInfo {
                localized_text: Some(3),
                ..Default::default()
            })),
            ..Default::default()
        };
        let b = d.to_bytes();
        assert_eq!(b[0], 0x01 | 0x08 | 0x10 | 0x20 | 0x40);
        assert_eq!(
            DiagnosticInfo::from_bytes(&b, &DecodeLimits::default()).unwrap(),
            d
        );
        let deep = vec![0x40u8; 10_000];
        assert!(DiagnosticInfo::from_bytes(&deep, &DecodeLimits::default()).is_err());
    }
}
