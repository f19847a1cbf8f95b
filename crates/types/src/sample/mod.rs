//! Random but valid values of every type, for round-trip tests, fuzzing
//! seeds and benchmarks (feature `sample`).
//!
//! Values cover the encoding's corners: null and empty strings and arrays,
//! every NodeId form, every DataValue / LocalizedText / DiagnosticInfo mask,
//! multi-dimensional arrays, nested ExtensionObjects of every generated type.
//! Floats are never NaN, so that decoded values compare equal.

mod structure;

use crate::*;

/// A small deterministic generator (xorshift64*) with a nesting budget.
pub struct Gen {
    state: u64,
    depth: u32,
    max_depth: u32,
}

impl Gen {
    /// A generator from a seed; equal seeds give equal values.
    pub fn new(seed: u64) -> Self {
        Gen {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            depth: 0,
            max_depth: 3,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability 1/n.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// True while nested values may still be made.
    pub fn can_nest(&self) -> bool {
        self.depth < self.max_depth
    }

    /// Runs `f` one nesting level deeper.
    pub fn nested<T>(&mut self, f: impl FnOnce(&mut Gen) -> T) -> T {
        self.depth += 1;
        let v = f(self);
        self.depth -= 1;
        v
    }

    /// An array length: null (None), empty, or 1..=3 elements; shorter when
    /// deeply nested.
    pub fn array_len(&mut self) -> Option<usize> {
        match self.below(8) {
            0 => None,
            1 => Some(0),
            _ if !self.can_nest() => Some(0),
            k => Some(usize::try_from(k % 3 + 1).unwrap_or(1)),
        }
    }
}

/// Makes a random valid value.
pub trait Sample: Sized {
    /// A random value.
    fn sample(g: &mut Gen) -> Self;
}

impl<T: Sample> Sample for Option<Vec<T>> {
    fn sample(g: &mut Gen) -> Self {
        let n = g.array_len()?;
        Some(g.nested(|g| (0..n).map(|_| T::sample(g)).collect()))
    }
}

macro_rules! sample_int {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn sample(g: &mut Gen) -> Self {
                match g.below(4) {
                    0 => 0,
                    1 => <$t>::MAX,
                    2 => <$t>::MIN,
                    // Truncation to the type's width is the point.
                    _ => g.next_u64() as $t,
                }
            }
        }
    )*};
}

sample_int!(i8, u8, i16, u16, i32, u32, i64, u64);

impl Sample for bool {
    fn sample(g: &mut Gen) -> Self {
        g.one_in(2)
    }
}

impl Sample for f32 {
    fn sample(g: &mut Gen) -> Self {
        match g.below(4) {
            0 => 0.0,
            1 => f32::INFINITY,
            2 => -1.5e-30,
            _ => (g.next_u64() % 1_000_000) as f32 / 7.0,
        }
    }
}

impl Sample for f64 {
    fn sample(g: &mut Gen) -> Self {
        match g.below(4) {
            0 => 0.0,
            1 => f64::NEG_INFINITY,
            2 => f64::MAX,
            _ => (g.next_u64() % 1_000_000_000) as f64 / 3.0,
        }
    }
}

impl Sample for UaString {
    fn sample(g: &mut Gen) -> Self {
        match g.below(6) {
            0 => UaString::null(),
            1 => UaString::from(""),
            2 => UaString::from("Grüße, 世界; ns=1"),
            _ => UaString::new(format!("s{}", g.below(100_000))),
        }
    }
}

impl Sample for ByteString {
    fn sample(g: &mut Gen) -> Self {
        match g.below(4) {
            0 => ByteString::null(),
            1 => ByteString::new(vec![]),
            _ => {
                let n = g.below(20) as usize;
                ByteString::new((0..n).map(|_| g.next_u64() as u8).collect::<Vec<u8>>())
            }
        }
    }
}

impl Sample for XmlElement {
    fn sample(g: &mut Gen) -> Self {
        if g.one_in(3) {
            XmlElement(UaString::null())
        } else {
            XmlElement(UaString::new(format!("<a n=\"{}\"/>", g.below(10))))
        }
    }
}

impl Sample for DateTime {
    fn sample(g: &mut Gen) -> Self {
        match g.below(4) {
            0 => DateTime::MIN,
            1 => DateTime::MAX,
            _ => DateTime::from_ticks(133_590_384_000_000_000 + g.below(1 << 40) as i64),
        }
    }
}

impl Sample for Guid {
    fn sample(g: &mut Gen) -> Self {
        let a = g.next_u64().to_le_bytes();
        let b = g.next_u64().to_le_bytes();
        let mut x = [0u8; 16];
        x[..8].copy_from_slice(&a);
        x[8..].copy_from_slice(&b);
        Guid::from_bytes(x)
    }
}

impl Sample for StatusCode {
    fn sample(g: &mut Gen) -> Self {
        match g.below(4) {
            0 => StatusCode::Good,
            1 => StatusCode::BadNodeIdUnknown,
            2 => StatusCode::UncertainInitialValue.with_overflow(),
            _ => StatusCode(g.next_u64() as u32),
        }
    }
}

impl Sample for NodeId {
    fn sample(g: &mut Gen) -> Self {
        let ns = match g.below(4) {
            0 => 0,
            1 => 1,
            2 => 300,
            _ => g.next_u64() as u16,
        };
        match g.below(7) {
            0 => NodeId::numeric(0, g.below(256) as u32),
            1 => NodeId::numeric(ns & 0xff, g.below(65_536) as u32),
            2 => NodeId::numeric(ns, g.next_u64() as u32),
            3 => NodeId {
                namespace: ns,
                identifier: Identifier::String(UaString::sample(g)),
            },
            4 => NodeId::guid(ns, Guid::sample(g)),
            5 => NodeId {
                namespace: ns,
                identifier: Identifier::Opaque(ByteString::sample(g)),
            },
            _ => NodeId::NULL,
        }
    }
}

impl Sample for ExpandedNodeId {
    fn sample(g: &mut Gen) -> Self {
        ExpandedNodeId {
            node_id: NodeId::sample(g),
            namespace_uri: if g.one_in(3) {
                UaString::from("urn:sample:ns")
            } else {
                UaString::null()
            },
            server_index: if g.one_in(3) {
                g.below(5) as u32 + 1
            } else {
                0
            },
        }
    }
}

impl Sample for QualifiedName {
    fn sample(g: &mut Gen) -> Self {
        QualifiedName {
            namespace_index: g.below(4) as u16,
            name: UaString::sample(g),
        }
    }
}

impl Sample for LocalizedText {
    fn sample(g: &mut Gen) -> Self {
        LocalizedText {
            locale: if g.one_in(2) {
                UaString::null()
            } else {
                UaString::sample(g)
            },
            text: UaString::sample(g),
        }
    }
}

impl Sample for DiagnosticInfo {
    fn sample(g: &mut Gen) -> Self {
        let opt_i32 = |g: &mut Gen| {
            if g.one_in(2) {
                Some(g.below(9) as i32)
            } else {
                None
            }
        };
        DiagnosticInfo {
            symbolic_id: opt_i32(g),
            namespace_uri: opt_i32(g),
            locale: opt_i32(g),
            localized_text: opt_i32(g),
            additional_info: if g.one_in(2) {
                Some(UaString::sample(g))
            } else {
                None
            },
            inner_status_code: if g.one_in(2) {
                Some(StatusCode::sample(g))
            } else {
                None
            },
            inner_diagnostic_info: if g.can_nest() && g.one_in(3) {
                Some(Box::new(g.nested(DiagnosticInfo::sample)))
            } else {
                None
            },
        }
    }
}

impl Sample for DataValue {
    fn sample(g: &mut Gen) -> Self {
        DataValue {
            value: if g.one_in(4) {
                None
            } else {
                Some(g.nested(Variant::sample))
            },
            status: if g.one_in(2) {
                Some(StatusCode::sample(g))
            } else {
                None
            },
            source_timestamp: if g.one_in(2) {
                Some(DateTime::sample(g))
            } else {
                None
            },
            source_picoseconds: if g.one_in(3) {
                Some(g.below(10_000) as u16)
            } else {
                None
            },
            server_timestamp: if g.one_in(2) {
                Some(DateTime::sample(g))
            } else {
                None
            },
            server_picoseconds: if g.one_in(3) {
                Some(g.below(10_000) as u16)
            } else {
                None
            },
        }
    }
}

fn scalar_of(t: VariantType, g: &mut Gen) -> Variant {
    use VariantType as T;
    match t {
        T::Boolean => Variant::Boolean(Sample::sample(g)),
        T::SByte => Variant::SByte(Sample::sample(g)),
        T::Byte => Variant::Byte(Sample::sample(g)),
        T::Int16 => Variant::Int16(Sample::sample(g)),
        T::UInt16 => Variant::UInt16(Sample::sample(g)),
        T::Int32 => Variant::Int32(Sample::sample(g)),
        T::UInt32 => Variant::UInt32(Sample::sample(g)),
        T::Int64 => Variant::Int64(Sample::sample(g)),
        T::UInt64 => Variant::UInt64(Sample::sample(g)),
        T::Float => Variant::Float(Sample::sample(g)),
        T::Double => Variant::Double(Sample::sample(g)),
        T::String => Variant::String(Sample::sample(g)),
        T::DateTime => Variant::DateTime(Sample::sample(g)),
        T::Guid => Variant::Guid(Sample::sample(g)),
        T::ByteString => Variant::ByteString(Sample::sample(g)),
        T::XmlElement => Variant::XmlElement(Sample::sample(g)),
        T::NodeId => Variant::from(NodeId::sample(g)),
        T::ExpandedNodeId => Variant::from(ExpandedNodeId::sample(g)),
        T::StatusCode => Variant::StatusCode(Sample::sample(g)),
        T::QualifiedName => Variant::from(QualifiedName::sample(g)),
        T::LocalizedText => Variant::from(LocalizedText::sample(g)),
        T::ExtensionObject => Variant::from(ExtensionObject::sample(g)),
        T::DataValue => Variant::from(DataValue::sample(g)),
        T::DiagnosticInfo => Variant::from(DiagnosticInfo::sample(g)),
        // Not allowed as a scalar; an Int32 stands in.
        T::Variant => Variant::Int32(Sample::sample(g)),
    }
}

fn array_of(t: VariantType, n: usize, g: &mut Gen) -> ArrayValues {
    use VariantType as T;
    fn v<X: Sample>(n: usize, g: &mut Gen) -> Vec<X> {
        (0..n).map(|_| X::sample(g)).collect()
    }
    match t {
        T::Boolean => ArrayValues::Boolean(v(n, g)),
        T::SByte => ArrayValues::SByte(v(n, g)),
        T::Byte => ArrayValues::Byte(v(n, g)),
        T::Int16 => ArrayValues::Int16(v(n, g)),
        T::UInt16 => ArrayValues::UInt16(v(n, g)),
        T::Int32 => ArrayValues::Int32(v(n, g)),
        T::UInt32 => ArrayValues::UInt32(v(n, g)),
        T::Int64 => ArrayValues::Int64(v(n, g)),
        T::UInt64 => ArrayValues::UInt64(v(n, g)),
        T::Float => ArrayValues::Float(v(n, g)),
        T::Double => ArrayValues::Double(v(n, g)),
        T::String => ArrayValues::String(v(n, g)),
        T::DateTime => ArrayValues::DateTime(v(n, g)),
        T::Guid => ArrayValues::Guid(v(n, g)),
        T::ByteString => ArrayValues::ByteString(v(n, g)),
        T::XmlElement => ArrayValues::XmlElement(v(n, g)),
        T::NodeId => ArrayValues::NodeId(v(n, g)),
        T::ExpandedNodeId => ArrayValues::ExpandedNodeId(v(n, g)),
        T::StatusCode => ArrayValues::StatusCode(v(n, g)),
        T::QualifiedName => ArrayValues::QualifiedName(v(n, g)),
        T::LocalizedText => ArrayValues::LocalizedText(v(n, g)),
        T::ExtensionObject => ArrayValues::ExtensionObject(v(n, g)),
        T::DataValue => ArrayValues::DataValue(v(n, g)),
        T::Variant => ArrayValues::Variant(v(n, g)),
        T::DiagnosticInfo => ArrayValues::DiagnosticInfo(v(n, g)),
    }
}

impl Sample for Variant {
    fn sample(g: &mut Gen) -> Self {
        let nestable = g.can_nest();
        let max_type = if nestable { 25 } else { 21 };
        let t = VariantType::from_id(1 + g.below(max_type) as u8).unwrap_or(VariantType::Int32);
        match g.below(6) {
            0 => Variant::Empty,
            1 | 2 if nestable => {
                let n = g.below(7) as usize;
                let values = g.nested(|g| array_of(t, n, g));
                match (g.below(4), n) {
                    (0, 0) => Variant::from(Array::null(t)),
                    (1, 6) => Variant::from(
                        Array::with_dimensions(values, vec![2, 3])
                            .unwrap_or_else(|_| Array::null(t)),
                    ),
                    (2, n) => Variant::from(
                        Array::with_dimensions(values, vec![n as u32])
                            .unwrap_or_else(|_| Array::null(t)),
                    ),
                    _ => Variant::from(Array::new(values)),
                }
            }
            _ => g.nested(|g| scalar_of(t, g)),
        }
    }
}
