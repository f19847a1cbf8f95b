//! StatusCode (Part 4 §7.39, Part 6 §5.2.2.11): a 32-bit wire code.
//!
//! The named constants (one per row of `StatusCode.csv`) are generated into
//! `generated/status_codes.rs`, which names this type; the names, the
//! descriptions and `Display` read that table, so they live above it, in
//! `status_code/name.rs`. The codec is in `encoding.rs`. Unknown codes are
//! kept as they are and print as hex.

mod name;

/// A status code: severity, sub-code and info bits.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatusCode(pub u32);

/// The severity in the top two bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// 00
    Good,
    /// 01
    Uncertain,
    /// 10 (and the reserved 11, which Part 4 says to treat as bad)
    Bad,
}

/// How a DataValue's value relates to its limits (info bits 8-9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitBits {
    /// Within limits.
    None,
    /// At or below the low limit.
    Low,
    /// At or above the high limit.
    High,
    /// The value cannot change.
    Constant,
}

impl StatusCode {
    const INFO_TYPE_DATA_VALUE: u32 = 0x0000_0400;

    /// From the raw 32 bits.
    pub const fn from_u32(v: u32) -> Self {
        StatusCode(v)
    }

    /// The raw 32 bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The severity.
    pub const fn severity(self) -> Severity {
        match self.0 >> 30 {
            0 => Severity::Good,
            1 => Severity::Uncertain,
            _ => Severity::Bad,
        }
    }

    /// Severity Good.
    pub const fn is_good(self) -> bool {
        self.0 >> 30 == 0
    }

    /// Severity Uncertain.
    pub const fn is_uncertain(self) -> bool {
        self.0 >> 30 == 1
    }

    /// Severity Bad.
    pub const fn is_bad(self) -> bool {
        self.0 >> 30 >= 2
    }

    /// The code without its info bits (severity + sub-code), as listed in
    /// `StatusCode.csv`.
    pub const fn code(self) -> StatusCode {
        StatusCode(self.0 & 0xffff_0000)
    }

    /// The StructureChanged bit (15).
    pub const fn structure_changed(self) -> bool {
        self.0 & 0x8000 != 0
    }

    /// The SemanticsChanged bit (14).
    pub const fn semantics_changed(self) -> bool {
        self.0 & 0x4000 != 0
    }

    /// True when the info bits hold DataValue information (InfoType 01).
    pub const fn has_data_value_info(self) -> bool {
        self.0 & 0x0c00 == Self::INFO_TYPE_DATA_VALUE
    }

    /// The limit bits, when the info type is DataValue.
    pub const fn limit_bits(self) -> LimitBits {
        if !self.has_data_value_info() {
            return LimitBits::None;
        }
        match (self.0 >> 8) & 3 {
            0 => LimitBits::None,
            1 => LimitBits::Low,
            2 => LimitBits::High,
            _ => LimitBits::Constant,
        }
    }

    /// The Overflow bit (7): a monitored item's queue dropped values.
    pub const fn overflow(self) -> bool {
        self.has_data_value_info() && self.0 & 0x80 != 0
    }

    /// The historian bits (0-4), when the info type is DataValue.
    pub const fn historian_bits(self) -> u8 {
        if self.has_data_value_info() {
            (self.0 & 0x1f) as u8
        } else {
            0
        }
    }

    /// This code with the DataValue info type and the Overflow bit set.
    pub const fn with_overflow(self) -> StatusCode {
        StatusCode(self.0 | Self::INFO_TYPE_DATA_VALUE | 0x80)
    }

    /// This code with the given limit bits (and the DataValue info type).
    pub const fn with_limit_bits(self, l: LimitBits) -> StatusCode {
        let bits = match l {
            LimitBits::None => 0,
            LimitBits::Low => 1,
            LimitBits::High => 2,
            LimitBits::Constant => 3,
        };
        StatusCode((self.0 & !0x300) | Self::INFO_TYPE_DATA_VALUE | (bits << 8))
    }
}

impl From<u32> for StatusCode {
    fn from(v: u32) -> Self {
        StatusCode(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryDecode, BinaryEncode};

    #[test]
    fn names_and_severity() {
        assert_eq!(StatusCode::BadNodeIdUnknown.0, 0x8034_0000);
        assert_eq!(StatusCode::BadNodeIdUnknown.to_string(), "BadNodeIdUnknown");
        assert!(StatusCode::BadNodeIdUnknown.is_bad());
        assert_eq!(
            StatusCode::UncertainInitialValue.severity(),
            Severity::Uncertain
        );
        assert!(StatusCode::Good.is_good());
        assert_eq!(
            StatusCode::from_name("BadTimeout"),
            Some(StatusCode::BadTimeout)
        );
        assert_eq!(StatusCode::from_name("NoSuchCode"), None);
        assert!(StatusCode::BadTimeout
            .description()
            .unwrap()
            .contains("timed out"));
    }

    #[test]
    fn unknown_codes_round_trip_and_print_hex() {
        let c = StatusCode(0x8fff_0000);
        assert_eq!(c.name(), None);
        assert_eq!(format!("{c:?}"), "0x8fff0000");
        let l = crate::DecodeLimits::default();
        assert_eq!(StatusCode::from_bytes(&c.to_bytes(), &l).unwrap(), c);
        assert!(c.is_bad());
        // Reserved severity 11 counts as bad.
        assert!(StatusCode(0xc000_0000).is_bad());
    }

    #[test]
    fn info_bits() {
        let c = StatusCode::Good.with_overflow();
        assert!(c.overflow());
        assert_eq!(c.code(), StatusCode::Good);
        assert_eq!(c.to_string(), "Good+0x0480");
        let h = StatusCode::UncertainLastUsableValue.with_limit_bits(LimitBits::High);
        assert_eq!(h.limit_bits(), LimitBits::High);
        assert!(!h.overflow());
        assert_eq!(StatusCode(0x0000_0300).limit_bits(), LimitBits::None);
        assert!(StatusCode(0x8000).structure_changed());
        assert!(StatusCode(0x4000).semantics_changed());
        assert_eq!(StatusCode(0x0000_0415).historian_bits(), 0x15);
    }
}
