//! DataValue (Part 6 §5.2.2.17): a value with status, timestamps and
//! picoseconds, each present or absent (the encoding mask). A part of
//! `variant`: a DataValue holds a Variant and a Variant may hold a DataValue.

use crate::date_time::DateTime;
use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, DecodeErrorKind, Reader};
use crate::status_code::StatusCode;
use crate::variant::Variant;

/// A value as read or reported: every part is optional on the wire.
#[derive(Clone, Default, PartialEq, Debug)]
pub struct DataValue {
    /// The value (mask bit 0x01). `Some(Variant::Empty)` differs from `None`.
    pub value: Option<Variant>,
    /// The status (0x02); absent means Good.
    pub status: Option<StatusCode>,
    /// Source timestamp (0x04).
    pub source_timestamp: Option<DateTime>,
    /// Source picoseconds, 0..=9999 (0x10).
    pub source_picoseconds: Option<u16>,
    /// Server timestamp (0x08).
    pub server_timestamp: Option<DateTime>,
    /// Server picoseconds (0x20).
    pub server_picoseconds: Option<u16>,
}

impl DataValue {
    /// A value with no status or timestamps.
    pub fn value(v: impl Into<Variant>) -> Self {
        DataValue {
            value: Some(v.into()),
            ..Default::default()
        }
    }

    /// Only a status, as a failed Read returns.
    pub fn status(status: StatusCode) -> Self {
        DataValue {
            status: Some(status),
            ..Default::default()
        }
    }

    /// The status, with absent read as Good.
    pub fn status_or_good(&self) -> StatusCode {
        self.status.unwrap_or(StatusCode::Good)
    }
}

impl BinaryEncode for DataValue {
    fn encode(&self, w: &mut Vec<u8>) {
        let mask = u8::from(self.value.is_some())
            | u8::from(self.status.is_some()) << 1
            | u8::from(self.source_timestamp.is_some()) << 2
            | u8::from(self.server_timestamp.is_some()) << 3
            | u8::from(self.source_picoseconds.is_some()) << 4
            | u8::from(self.server_picoseconds.is_some()) << 5;
        w.push(mask);
        if let Some(v) = &self.value {
            v.encode(w);
        }
        if let Some(v) = &self.status {
            v.encode(w);
        }
        if let Some(v) = &self.source_timestamp {
            v.encode(w);
        }
        if let Some(v) = &self.source_picoseconds {
            v.encode(w);
        }
        if let Some(v) = &self.server_timestamp {
            v.encode(w);
        }
        if let Some(v) = &self.server_picoseconds {
            v.encode(w);
        }
    }
}

fn opt<T: BinaryDecode>(
    r: &mut Reader<'_>,
    present: bool,
    field: &'static str,
) -> Result<Option<T>, DecodeError> {
    if present {
        T::decode(r).map(Some).map_err(|e| e.in_field(field))
    } else {
        Ok(None)
    }
}

impl BinaryDecode for DataValue {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mask = r.read_u8()?;
        if mask & 0xc0 != 0 {
            return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "DataValue encoding mask",
                value: mask,
            }));
        }
        r.enter()?;
        let dv = (|| {
            Ok(DataValue {
                value: opt(r, mask & 0x01 != 0, "value")?,
                status: opt(r, mask & 0x02 != 0, "status")?,
                source_timestamp: opt(r, mask & 0x04 != 0, "source_timestamp")?,
                source_picoseconds: opt(r, mask & 0x10 != 0, "source_picoseconds")?,
                server_timestamp: opt(r, mask & 0x08 != 0, "server_timestamp")?,
                server_picoseconds: opt(r, mask & 0x20 != 0, "server_picoseconds")?,
            })
        })();
        r.leave();
        dv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    #[test]
    fn every_mask_bit() {
        let dv = DataValue {
            value: Some(Variant::UInt16(7)),
            status: Some(StatusCode::UncertainInitialValue),
            source_timestamp: Some(DateTime::from_ticks(1)),
            source_picoseconds: Some(1234),
            server_timestamp: Some(DateTime::from_ticks(2)),
            server_picoseconds: Some(5678),
        };
        let b = dv.to_bytes();
        assert_eq!(b[0], 0x3f);
        assert_eq!(&b[1..4], [5, 7, 0]);
        assert_eq!(
            DataValue::from_bytes(&b, &DecodeLimits::default()).unwrap(),
            dv
        );
        assert_eq!(DataValue::default().to_bytes(), [0]);
        assert!(DataValue::from_bytes(&[0x40], &DecodeLimits::default()).is_err());
    }
}
