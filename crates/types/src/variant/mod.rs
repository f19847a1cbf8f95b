//! Variant (Part 6 §5.2.2.16): a scalar of any built-in type, or a typed
//! array with optional dimensions.
//!
//! Arrays are typed vectors (`Vec<f64>`, `Vec<UaString>`...), so an array's
//! elements share one type by construction and a 100-value Double array costs
//! 800 bytes, not 100 boxed variants.

mod data_value;

use std::fmt;

pub use data_value::DataValue;

use crate::date_time::DateTime;
use crate::diagnostic_info::DiagnosticInfo;
use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, DecodeErrorKind, Reader};
use crate::extension_object::ExtensionObject;
use crate::guid::Guid;
use crate::node_id::{ExpandedNodeId, NodeId};
use crate::qualified_name::{LocalizedText, QualifiedName};
use crate::status_code::StatusCode;
use crate::string::{ByteString, UaString, XmlElement};

/// The built-in type ids a Variant can carry (Part 6 Table 1), 1..=25.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum VariantType {
    Boolean = 1,
    SByte = 2,
    Byte = 3,
    Int16 = 4,
    UInt16 = 5,
    Int32 = 6,
    UInt32 = 7,
    Int64 = 8,
    UInt64 = 9,
    Float = 10,
    Double = 11,
    String = 12,
    DateTime = 13,
    Guid = 14,
    ByteString = 15,
    XmlElement = 16,
    NodeId = 17,
    ExpandedNodeId = 18,
    StatusCode = 19,
    QualifiedName = 20,
    LocalizedText = 21,
    ExtensionObject = 22,
    DataValue = 23,
    Variant = 24,
    DiagnosticInfo = 25,
}

impl VariantType {
    /// From the built-in type id; `None` outside 1..=25.
    pub const fn from_id(id: u8) -> Option<Self> {
        use VariantType::*;
        Some(match id {
            1 => Boolean,
            2 => SByte,
            3 => Byte,
            4 => Int16,
            5 => UInt16,
            6 => Int32,
            7 => UInt32,
            8 => Int64,
            9 => UInt64,
            10 => Float,
            11 => Double,
            12 => String,
            13 => DateTime,
            14 => Guid,
            15 => ByteString,
            16 => XmlElement,
            17 => NodeId,
            18 => ExpandedNodeId,
            19 => StatusCode,
            20 => QualifiedName,
            21 => LocalizedText,
            22 => ExtensionObject,
            23 => DataValue,
            24 => Variant,
            25 => DiagnosticInfo,
            _ => return None,
        })
    }

    /// The built-in type id, which is also the namespace-0 NodeId of the DataType.
    pub const fn id(self) -> u8 {
        self as u8
    }
}

/// A value of any built-in type, or an array.
#[derive(Clone, Default, PartialEq)]
#[allow(missing_docs)]
pub enum Variant {
    /// No value (encoding byte 0).
    #[default]
    Empty,
    Boolean(bool),
    SByte(i8),
    Byte(u8),
    Int16(i16),
    UInt16(u16),
    Int32(i32),
    UInt32(u32),
    Int64(i64),
    UInt64(u64),
    Float(f32),
    Double(f64),
    String(UaString),
    DateTime(DateTime),
    Guid(Guid),
    ByteString(ByteString),
    XmlElement(XmlElement),
    NodeId(Box<NodeId>),
    ExpandedNodeId(Box<ExpandedNodeId>),
    StatusCode(StatusCode),
    QualifiedName(Box<QualifiedName>),
    LocalizedText(Box<LocalizedText>),
    ExtensionObject(Box<ExtensionObject>),
    DataValue(Box<DataValue>),
    DiagnosticInfo(Box<DiagnosticInfo>),
    /// A one- or multi-dimensional array.
    Array(Box<Array>),
}

macro_rules! array_values {
    ($(($name:ident, $t:ty)),* $(,)?) => {
        /// The elements of an array, typed.
        #[derive(Clone, PartialEq)]
        #[allow(missing_docs)]
        pub enum ArrayValues {
            $($name(Vec<$t>),)*
        }

        impl ArrayValues {
            /// The element type.
            pub fn element_type(&self) -> VariantType {
                match self {
                    $(ArrayValues::$name(_) => VariantType::$name,)*
                }
            }

            /// The element count.
            pub fn len(&self) -> usize {
                match self {
                    $(ArrayValues::$name(v) => v.len(),)*
                }
            }

            /// True when there are no elements.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// A copy of element `i` as a Variant; `None` past the end.
            pub fn get(&self, i: usize) -> Option<Variant> {
                match self {
                    $(ArrayValues::$name(v) => v.get(i).cloned().map(Variant::from),)*
                }
            }

            /// No elements of type `t`.
            pub fn empty(t: VariantType) -> Self {
                match t {
                    $(VariantType::$name => ArrayValues::$name(Vec::new()),)*
                }
            }

            /// Elements `low..=high` (`high` clipped to the end); `None`
            /// when `low` is past the end.
            pub fn sub_range(&self, low: usize, high: usize) -> Option<ArrayValues> {
                fn take<T: Clone>(v: &[T], low: usize, high: usize) -> Option<Vec<T>> {
                    let last = v.len().checked_sub(1)?;
                    (low <= last).then(|| v[low..=high.min(last)].to_vec())
                }
                Some(match self {
                    $(ArrayValues::$name(v) => ArrayValues::$name(take(v, low, high)?),)*
                })
            }

            /// The elements at `indices`, in that order; `None` when one is
            /// past the end.
            pub fn gather(&self, indices: &[usize]) -> Option<ArrayValues> {
                fn pick<T: Clone>(v: &[T], indices: &[usize]) -> Option<Vec<T>> {
                    indices.iter().map(|&i| v.get(i).cloned()).collect()
                }
                Some(match self {
                    $(ArrayValues::$name(v) => ArrayValues::$name(pick(v, indices)?),)*
                })
            }

            /// Sets the element at `indices[k]` to `with[k]` for every k;
            /// false (unchanged) when the types differ, the counts differ or
            /// an index is past the end.
            pub fn scatter(&mut self, indices: &[usize], with: &ArrayValues) -> bool {
                match (self, with) {
                    $((ArrayValues::$name(v), ArrayValues::$name(w)) => {
                        if w.len() != indices.len() || indices.iter().any(|&i| i >= v.len()) {
                            return false;
                        }
                        for (&i, x) in indices.iter().zip(w) {
                            v[i] = x.clone();
                        }
                        true
                    })*
                    _ => false,
                }
            }

            /// Replaces the elements from `low` on with `with`, which must
            /// be of the same type and fit; false (unchanged) otherwise.
            pub fn replace_range(&mut self, low: usize, with: &ArrayValues) -> bool {
                match (self, with) {
                    $((ArrayValues::$name(v), ArrayValues::$name(w)) => {
                        match v.get_mut(low..low.saturating_add(w.len())) {
                            Some(dst) => {
                                dst.clone_from_slice(w);
                                true
                            }
                            None => false,
                        }
                    })*
                    _ => false,
                }
            }

            fn encode_elements(&self, w: &mut Vec<u8>) {
                match self {
                    $(ArrayValues::$name(v) => {
                        for x in v {
                            x.encode(w);
                        }
                    })*
                }
            }

            fn decode_elements(
                t: VariantType,
                n: usize,
                r: &mut Reader<'_>,
            ) -> Result<Self, DecodeError> {
                // Every element takes at least one byte: a forged count
                // cannot reserve more than the input holds.
                if n > r.remaining() {
                    return Err(DecodeError::new(DecodeErrorKind::UnexpectedEnd {
                        needed: n,
                        remaining: r.remaining(),
                    }));
                }
                Ok(match t {
                    $(VariantType::$name => {
                        let mut v = Vec::with_capacity(n);
                        for i in 0..n {
                            v.push(<$t>::decode(r).map_err(|e| e.at_index(i))?);
                        }
                        ArrayValues::$name(v)
                    })*
                })
            }
        }

        impl fmt::Debug for ArrayValues {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $(ArrayValues::$name(v) => write!(f, "{}{:?}", stringify!($name), v),)*
                }
            }
        }

        $(
            impl From<Vec<$t>> for Variant {
                fn from(v: Vec<$t>) -> Self {
                    Variant::Array(Box::new(Array::new(ArrayValues::$name(v))))
                }
            }
        )*
    };
}

array_values!(
    (Boolean, bool),
    (SByte, i8),
    (Byte, u8),
    (Int16, i16),
    (UInt16, u16),
    (Int32, i32),
    (UInt32, u32),
    (Int64, i64),
    (UInt64, u64),
    (Float, f32),
    (Double, f64),
    (String, UaString),
    (DateTime, DateTime),
    (Guid, Guid),
    (ByteString, ByteString),
    (XmlElement, XmlElement),
    (NodeId, NodeId),
    (ExpandedNodeId, ExpandedNodeId),
    (StatusCode, StatusCode),
    (QualifiedName, QualifiedName),
    (LocalizedText, LocalizedText),
    (ExtensionObject, ExtensionObject),
    (DataValue, DataValue),
    (Variant, Variant),
    (DiagnosticInfo, DiagnosticInfo),
);

/// An array in a Variant: typed elements, optional dimensions, and whether
/// it is the null array (length -1).
#[derive(Clone, PartialEq, Debug)]
pub struct Array {
    values: ArrayValues,
    dimensions: Option<Vec<u32>>,
    null: bool,
}

/// Array dimensions whose product is not the element count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DimensionMismatch;

impl fmt::Display for DimensionMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the product of the array dimensions is not the element count")
    }
}

impl std::error::Error for DimensionMismatch {}

fn dims_product(dims: &[u32]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
}

impl Array {
    /// A one-dimensional array.
    pub fn new(values: ArrayValues) -> Self {
        Array {
            values,
            dimensions: None,
            null: false,
        }
    }

    /// A multi-dimensional array; the dimensions' product must be the
    /// element count (elements in row-major order, the last index fastest).
    pub fn with_dimensions(values: ArrayValues, dims: Vec<u32>) -> Result<Self, DimensionMismatch> {
        if dims_product(&dims) != Some(values.len()) {
            return Err(DimensionMismatch);
        }
        Ok(Array {
            values,
            dimensions: Some(dims),
            null: false,
        })
    }

    /// The null array of element type `t` (encoded with length -1).
    pub fn null(t: VariantType) -> Self {
        Array {
            values: ArrayValues::empty(t),
            dimensions: None,
            null: true,
        }
    }

    /// The elements.
    pub fn values(&self) -> &ArrayValues {
        &self.values
    }

    /// The elements, by value.
    pub fn into_values(self) -> ArrayValues {
        self.values
    }

    /// The dimensions of a multi-dimensional array.
    pub fn dimensions(&self) -> Option<&[u32]> {
        self.dimensions.as_deref()
    }

    /// True for the null array.
    pub fn is_null(&self) -> bool {
        self.null
    }
}

impl Variant {
    /// The built-in type of the value (of the elements, for an array);
    /// `None` when empty.
    pub fn type_id(&self) -> Option<VariantType> {
        use VariantType as T;
        Some(match self {
            Variant::Empty => return None,
            Variant::Boolean(_) => T::Boolean,
            Variant::SByte(_) => T::SByte,
            Variant::Byte(_) => T::Byte,
            Variant::Int16(_) => T::Int16,
            Variant::UInt16(_) => T::UInt16,
            Variant::Int32(_) => T::Int32,
            Variant::UInt32(_) => T::UInt32,
            Variant::Int64(_) => T::Int64,
            Variant::UInt64(_) => T::UInt64,
            Variant::Float(_) => T::Float,
            Variant::Double(_) => T::Double,
            Variant::String(_) => T::String,
            Variant::DateTime(_) => T::DateTime,
            Variant::Guid(_) => T::Guid,
            Variant::ByteString(_) => T::ByteString,
            Variant::XmlElement(_) => T::XmlElement,
            Variant::NodeId(_) => T::NodeId,
            Variant::ExpandedNodeId(_) => T::ExpandedNodeId,
            Variant::StatusCode(_) => T::StatusCode,
            Variant::QualifiedName(_) => T::QualifiedName,
            Variant::LocalizedText(_) => T::LocalizedText,
            Variant::ExtensionObject(_) => T::ExtensionObject,
            Variant::DataValue(_) => T::DataValue,
            Variant::DiagnosticInfo(_) => T::DiagnosticInfo,
            Variant::Array(a) => a.values.element_type(),
        })
    }

    /// True for an array.
    pub fn is_array(&self) -> bool {
        matches!(self, Variant::Array(_))
    }

    /// True for [`Variant::Empty`].
    pub fn is_empty(&self) -> bool {
        matches!(self, Variant::Empty)
    }

    fn encode_scalar(&self, w: &mut Vec<u8>) {
        match self {
            Variant::Empty | Variant::Array(_) => {}
            Variant::Boolean(v) => v.encode(w),
            Variant::SByte(v) => v.encode(w),
            Variant::Byte(v) => v.encode(w),
            Variant::Int16(v) => v.encode(w),
            Variant::UInt16(v) => v.encode(w),
            Variant::Int32(v) => v.encode(w),
            Variant::UInt32(v) => v.encode(w),
            Variant::Int64(v) => v.encode(w),
            Variant::UInt64(v) => v.encode(w),
            Variant::Float(v) => v.encode(w),
            Variant::Double(v) => v.encode(w),
            Variant::String(v) => v.encode(w),
            Variant::DateTime(v) => v.encode(w),
            Variant::Guid(v) => v.encode(w),
            Variant::ByteString(v) => v.encode(w),
            Variant::XmlElement(v) => v.encode(w),
            Variant::NodeId(v) => v.encode(w),
            Variant::ExpandedNodeId(v) => v.encode(w),
            Variant::StatusCode(v) => v.encode(w),
            Variant::QualifiedName(v) => v.encode(w),
            Variant::LocalizedText(v) => v.encode(w),
            Variant::ExtensionObject(v) => v.encode(w),
            Variant::DataValue(v) => v.encode(w),
            Variant::DiagnosticInfo(v) => v.encode(w),
        }
    }

    fn decode_scalar(t: VariantType, r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        use VariantType as T;
        Ok(match t {
            T::Boolean => Variant::Boolean(bool::decode(r)?),
            T::SByte => Variant::SByte(i8::decode(r)?),
            T::Byte => Variant::Byte(u8::decode(r)?),
            T::Int16 => Variant::Int16(i16::decode(r)?),
            T::UInt16 => Variant::UInt16(u16::decode(r)?),
            T::Int32 => Variant::Int32(i32::decode(r)?),
            T::UInt32 => Variant::UInt32(u32::decode(r)?),
            T::Int64 => Variant::Int64(i64::decode(r)?),
            T::UInt64 => Variant::UInt64(u64::decode(r)?),
            T::Float => Variant::Float(f32::decode(r)?),
            T::Double => Variant::Double(f64::decode(r)?),
            T::String => Variant::String(UaString::decode(r)?),
            T::DateTime => Variant::DateTime(DateTime::decode(r)?),
            T::Guid => Variant::Guid(Guid::decode(r)?),
            T::ByteString => Variant::ByteString(ByteString::decode(r)?),
            T::XmlElement => Variant::XmlElement(XmlElement::decode(r)?),
            T::NodeId => Variant::NodeId(Box::new(NodeId::decode(r)?)),
            T::ExpandedNodeId => Variant::ExpandedNodeId(Box::new(ExpandedNodeId::decode(r)?)),
            T::StatusCode => Variant::StatusCode(StatusCode::decode(r)?),
            T::QualifiedName => Variant::QualifiedName(Box::new(QualifiedName::decode(r)?)),
            T::LocalizedText => Variant::LocalizedText(Box::new(LocalizedText::decode(r)?)),
            T::ExtensionObject => Variant::ExtensionObject(Box::new(ExtensionObject::decode(r)?)),
            T::DataValue => Variant::DataValue(Box::new(DataValue::decode(r)?)),
            T::DiagnosticInfo => Variant::DiagnosticInfo(Box::new(DiagnosticInfo::decode(r)?)),
            // Part 6 §5.2.2.16: a Variant may hold Variants only in an array.
            T::Variant => {
                return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                    what: "Variant encoding mask (scalar Variant in a Variant)",
                    value: t.id(),
                }))
            }
        })
    }
}

impl BinaryEncode for Variant {
    fn encode(&self, w: &mut Vec<u8>) {
        match self {
            Variant::Empty => w.push(0),
            Variant::Array(a) => {
                let t = a.values.element_type().id();
                let dims = a.dimensions.as_ref();
                w.push(t | 0x80 | if dims.is_some() { 0x40 } else { 0 });
                if a.null {
                    (-1i32).encode(w);
                } else {
                    crate::encoding::write_length(w, Some(a.values.len()));
                    a.values.encode_elements(w);
                }
                if let Some(dims) = dims {
                    crate::encoding::write_length(w, Some(dims.len()));
                    for &d in dims {
                        // Dimensions were checked against the element count.
                        i32::try_from(d).unwrap_or(i32::MAX).encode(w);
                    }
                }
            }
            scalar => {
                // `type_id` is `Some` for every non-empty variant.
                w.push(scalar.type_id().map_or(0, VariantType::id));
                scalar.encode_scalar(w);
            }
        }
    }
}

impl BinaryDecode for Variant {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.enter()?;
        let v = decode_variant(r);
        r.leave();
        v
    }
}

fn decode_variant(r: &mut Reader<'_>) -> Result<Variant, DecodeError> {
    let mask = r.read_u8()?;
    let id = mask & 0x3f;
    if id == 0 {
        if mask != 0 {
            return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "Variant encoding mask",
                value: mask,
            }));
        }
        return Ok(Variant::Empty);
    }
    let Some(t) = VariantType::from_id(id) else {
        return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
            what: "Variant encoding mask (unknown built-in type)",
            value: mask,
        }));
    };
    if mask & 0x80 == 0 {
        if mask & 0x40 != 0 {
            return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "Variant encoding mask (dimensions without an array)",
                value: mask,
            }));
        }
        return Variant::decode_scalar(t, r);
    }
    let array = match r.read_length(crate::encoding::Limit::ArrayLength)? {
        None => Array::null(t),
        Some(n) => Array::new(ArrayValues::decode_elements(t, n, r)?),
    };
    if mask & 0x40 == 0 {
        return Ok(Variant::Array(Box::new(array)));
    }
    let dims: Option<Vec<i32>> = Option::decode(r).map_err(|e| e.in_field("array_dimensions"))?;
    let Some(dims) = dims else {
        return Ok(Variant::Array(Box::new(array)));
    };
    let mut udims = Vec::with_capacity(dims.len());
    for d in dims {
        match u32::try_from(d) {
            Ok(d) => udims.push(d),
            Err(_) => {
                return Err(DecodeError::new(DecodeErrorKind::InvalidValue(
                    "negative array dimension",
                )))
            }
        }
    }
    if array.null {
        return Ok(Variant::Array(Box::new(array)));
    }
    match Array::with_dimensions(array.values, udims) {
        Ok(a) => Ok(Variant::Array(Box::new(a))),
        Err(_) => Err(DecodeError::new(DecodeErrorKind::InvalidValue(
            "array dimensions do not match the element count",
        ))),
    }
}

impl fmt::Debug for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variant::Empty => f.write_str("Empty"),
            Variant::Boolean(v) => write!(f, "Boolean({v})"),
            Variant::SByte(v) => write!(f, "SByte({v})"),
            Variant::Byte(v) => write!(f, "Byte({v})"),
            Variant::Int16(v) => write!(f, "Int16({v})"),
            Variant::UInt16(v) => write!(f, "UInt16({v})"),
            Variant::Int32(v) => write!(f, "Int32({v})"),
            Variant::UInt32(v) => write!(f, "UInt32({v})"),
            Variant::Int64(v) => write!(f, "Int64({v})"),
            Variant::UInt64(v) => write!(f, "UInt64({v})"),
            Variant::Float(v) => write!(f, "Float({v:?})"),
            Variant::Double(v) => write!(f, "Double({v:?})"),
            Variant::String(v) => write!(f, "String({v:?})"),
            Variant::DateTime(v) => write!(f, "DateTime({v:?})"),
            Variant::Guid(v) => write!(f, "{v:?}"),
            Variant::ByteString(v) => write!(f, "ByteString({v:?})"),
            Variant::XmlElement(v) => write!(f, "{v:?}"),
            Variant::NodeId(v) => write!(f, "{v:?}"),
            Variant::ExpandedNodeId(v) => write!(f, "{v:?}"),
            Variant::StatusCode(v) => write!(f, "StatusCode({v})"),
            Variant::QualifiedName(v) => write!(f, "{v:?}"),
            Variant::LocalizedText(v) => write!(f, "{v:?}"),
            Variant::ExtensionObject(v) => write!(f, "{v:?}"),
            Variant::DataValue(v) => write!(f, "{v:?}"),
            Variant::DiagnosticInfo(v) => write!(f, "{v:?}"),
            Variant::Array(a) => match (&a.dimensions, a.null) {
                (_, true) => write!(f, "NullArray({:?})", a.values.element_type()),
                (Some(d), _) => write!(f, "{:?} dims {d:?}", a.values),
                (None, _) => write!(f, "{:?}", a.values),
            },
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $name:ident),* $(,)?) => {$(
        impl From<$t> for Variant {
            fn from(v: $t) -> Self {
                Variant::$name(v)
            }
        }
    )*};
}

from_scalar!(
    bool => Boolean, i8 => SByte, u8 => Byte, i16 => Int16, u16 => UInt16, i32 => Int32,
    u32 => UInt32, i64 => Int64, u64 => UInt64, f32 => Float, f64 => Double,
    UaString => String, DateTime => DateTime, Guid => Guid, ByteString => ByteString,
    XmlElement => XmlElement, StatusCode => StatusCode,
);

macro_rules! from_boxed {
    ($($t:ty => $name:ident),* $(,)?) => {$(
        impl From<$t> for Variant {
            fn from(v: $t) -> Self {
                Variant::$name(Box::new(v))
            }
        }
    )*};
}

from_boxed!(
    NodeId => NodeId, ExpandedNodeId => ExpandedNodeId, QualifiedName => QualifiedName,
    LocalizedText => LocalizedText, ExtensionObject => ExtensionObject, DataValue => DataValue,
    DiagnosticInfo => DiagnosticInfo,
);

impl From<&str> for Variant {
    fn from(s: &str) -> Self {
        Variant::String(UaString::from(s))
    }
}

impl From<Array> for Variant {
    fn from(a: Array) -> Self {
        Variant::Array(Box::new(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    fn rt(v: &Variant) -> Vec<u8> {
        let b = v.to_bytes();
        assert_eq!(
            &Variant::from_bytes(&b, &DecodeLimits::default()).unwrap(),
            v
        );
        b
    }

    #[test]
    fn scalars() {
        assert_eq!(rt(&Variant::Empty), [0]);
        assert_eq!(rt(&Variant::Int32(-1)), [6, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(rt(&Variant::from("a")), [12, 1, 0, 0, 0, b'a']);
        assert_eq!(rt(&Variant::Boolean(true)), [1, 1]);
    }

    #[test]
    fn arrays_and_dimensions() {
        assert_eq!(rt(&Variant::from(vec![1u8, 2])), [0x83, 2, 0, 0, 0, 1, 2]);
        assert_eq!(
            rt(&Variant::from(Array::null(VariantType::Double))),
            [0x8b, 0xff, 0xff, 0xff, 0xff]
        );
        let m =
            Array::with_dimensions(ArrayValues::Int32(vec![1, 2, 3, 4, 5, 6]), vec![2, 3]).unwrap();
        let b = rt(&Variant::from(m));
        assert_eq!(b[0], 0xc6);
        assert_eq!(&b[b.len() - 12..], [2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        assert!(Array::with_dimensions(ArrayValues::Int32(vec![1]), vec![2]).is_err());
        assert!(Array::with_dimensions(ArrayValues::Int32(vec![]), vec![0, 5]).is_ok());
    }

    #[test]
    fn bad_masks_and_dimensions() {
        let l = DecodeLimits::default();
        for bytes in [
            &[26u8][..],                                             // unknown type
            &[0x40],                                                 // dims flag on empty
            &[0x46, 1, 0, 0, 0],                                     // dims without array
            &[24, 0],                                                // scalar variant in variant
            &[0xc6, 1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0], // dims 2 for 1 element
            &[
                0xc6, 1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
            ], // negative dim
        ] {
            assert!(Variant::from_bytes(bytes, &l).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn deep_nesting_is_bounded() {
        // A Variant array of Variant arrays of ... 1000 deep.
        let mut b = Vec::new();
        for _ in 0..1000 {
            b.extend_from_slice(&[0x98, 1, 0, 0, 0]);
        }
        b.push(0);
        let e = Variant::from_bytes(&b, &DecodeLimits::default()).unwrap_err();
        assert!(matches!(
            e.kind(),
            DecodeErrorKind::LimitExceeded {
                limit: crate::Limit::NestingDepth,
                ..
            }
        ));
        assert!(e.path().starts_with("[0][0][0]"));
    }

    #[test]
    fn sub_and_replace_ranges() {
        let a = ArrayValues::Int32(vec![1, 2, 3, 4]);
        assert_eq!(a.sub_range(1, 2), Some(ArrayValues::Int32(vec![2, 3])));
        assert_eq!(a.sub_range(3, 9), Some(ArrayValues::Int32(vec![4])));
        assert_eq!(a.sub_range(4, 4), None);
        let mut b = a.clone();
        assert!(b.replace_range(2, &ArrayValues::Int32(vec![9, 8])));
        assert_eq!(b, ArrayValues::Int32(vec![1, 2, 9, 8]));
        assert!(!b.replace_range(3, &ArrayValues::Int32(vec![0, 0])));
        assert!(!b.replace_range(0, &ArrayValues::Double(vec![0.0])));
        assert_eq!(b, ArrayValues::Int32(vec![1, 2, 9, 8]));
    }

    #[test]
    fn variant_stays_small() {
        assert!(std::mem::size_of::<Variant>() <= 32);
    }
}
