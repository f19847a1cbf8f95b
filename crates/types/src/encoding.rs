//! The OPC UA binary encoding (Part 6 §5.2): the [`BinaryEncode`] /
//! [`BinaryDecode`] traits, the bounded [`Reader`], [`DecodeLimits`] and
//! [`DecodeError`].
//!
//! Encoding is infallible and appends to a `Vec<u8>`; size limits on what we
//! send are the transport's business (negotiated message size). Decoding is
//! bounded by [`DecodeLimits`] and never panics: every length is checked
//! against the limits and against the bytes actually left before anything is
//! allocated.

use std::fmt;

use crate::status_code::StatusCode;

/// Append the binary encoding of a value to a buffer.
pub trait BinaryEncode {
    /// Appends the binary encoding of `self` to `w`.
    fn encode(&self, w: &mut Vec<u8>);

    /// Returns the encoding of `self` in a new buffer.
    fn to_bytes(&self) -> Vec<u8> {
        let mut w = Vec::new();
        self.encode(&mut w);
        w
    }
}

/// Read a value from its binary encoding.
pub trait BinaryDecode: Sized {
    /// Decodes one value from `r`, advancing it.
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError>;

    /// Decodes one value that must span all of `bytes`.
    fn from_bytes(bytes: &[u8], limits: &DecodeLimits) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes, limits)?;
        let v = Self::decode(&mut r)?;
        r.finish()?;
        Ok(v)
    }
}

/// Bounds applied while decoding untrusted input.
///
/// Every limit is a hard bound (there is no "unlimited"): the message size
/// bounds everything else anyway, and the others stop a small message from
/// asking for a huge allocation or a deep recursion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest String / XmlElement in bytes. Default 1 MiB, as the OPC
    /// Foundation .NET stack's `MaxStringLength`.
    pub max_string_length: usize,
    /// Largest ByteString in bytes. Default 16 MiB: certificate chains and
    /// file-transfer chunks stay well below it.
    pub max_byte_string_length: usize,
    /// Most elements of one array. Default 1,000,000; a Read of that many
    /// values is stopped earlier by the service's operation limits.
    pub max_array_length: usize,
    /// Deepest nesting of Variant / ExtensionObject / DiagnosticInfo /
    /// DataValue. Default 64: real messages nest a handful deep.
    pub max_nesting_depth: u16,
    /// Largest input handed to one [`Reader`]. Default 16 MiB, the usual
    /// negotiated maximum message size.
    pub max_message_size: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_string_length: 1 << 20,
            max_byte_string_length: 16 << 20,
            max_array_length: 1_000_000,
            max_nesting_depth: 64,
            max_message_size: 16 << 20,
        }
    }
}

/// Which limit of [`DecodeLimits`] was exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// [`DecodeLimits::max_string_length`]
    StringLength,
    /// [`DecodeLimits::max_byte_string_length`]
    ByteStringLength,
    /// [`DecodeLimits::max_array_length`]
    ArrayLength,
    /// [`DecodeLimits::max_nesting_depth`]
    NestingDepth,
    /// [`DecodeLimits::max_message_size`]
    MessageSize,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::StringLength => "max_string_length",
            Limit::ByteStringLength => "max_byte_string_length",
            Limit::ArrayLength => "max_array_length",
            Limit::NestingDepth => "max_nesting_depth",
            Limit::MessageSize => "max_message_size",
        })
    }
}

/// What went wrong while decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The input ended before the value did.
    UnexpectedEnd {
        /// Bytes the decoder needed.
        needed: usize,
        /// Bytes that were left.
        remaining: usize,
    },
    /// A length prefix below -1.
    NegativeLength(i32),
    /// A length, depth or size over a [`DecodeLimits`] bound.
    LimitExceeded {
        /// Which limit.
        limit: Limit,
        /// The value found.
        value: usize,
        /// The bound.
        max: usize,
    },
    /// A String or XmlElement that is not UTF-8.
    InvalidUtf8,
    /// An encoding byte with bits or a value this type does not define.
    InvalidEncodingByte {
        /// Which encoding byte (e.g. "NodeId encoding").
        what: &'static str,
        /// The byte found.
        value: u8,
    },
    /// A value that the encoding forbids (e.g. array dimensions that do not
    /// match the element count).
    InvalidValue(&'static str),
    /// Bytes were left after a value that must span its whole input.
    TrailingBytes(usize),
    /// An ExtensionObject or message whose binary encoding id we cannot decode
    /// where a typed value is required.
    UnknownEncodingId(String),
}

impl fmt::Display for DecodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeErrorKind::UnexpectedEnd { needed, remaining } => write!(
                f,
                "unexpected end of input: needed {needed} bytes, {remaining} left"
            ),
            DecodeErrorKind::NegativeLength(n) => write!(f, "invalid length {n}"),
            DecodeErrorKind::LimitExceeded { limit, value, max } => {
                write!(f, "{value} exceeds {limit} ({max})")
            }
            DecodeErrorKind::InvalidUtf8 => f.write_str("string is not valid UTF-8"),
            DecodeErrorKind::InvalidEncodingByte { what, value } => {
                write!(f, "invalid {what} 0x{value:02x}")
            }
            DecodeErrorKind::InvalidValue(what) => write!(f, "invalid value: {what}"),
            DecodeErrorKind::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the value"),
            DecodeErrorKind::UnknownEncodingId(id) => write!(f, "unknown binary encoding id {id}"),
        }
    }
}

/// One step of the path from the outermost value to the failing field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PathSegment {
    Type(&'static str),
    Field(&'static str),
    Index(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ErrorInner {
    kind: DecodeErrorKind,
    /// Innermost first: segments are pushed while the error unwinds.
    path: Vec<PathSegment>,
}

/// A decoding failure with the path of the field that failed, for example
/// `ReadRequest.nodes_to_read[3].node_id: unexpected end of input`.
///
/// Boxed so that `Result<T, DecodeError>` stays one word wider than `T`.
#[derive(Clone, PartialEq, Eq)]
pub struct DecodeError(Box<ErrorInner>);

impl DecodeError {
    /// A new error of the given kind with an empty path.
    #[cold]
    pub fn new(kind: DecodeErrorKind) -> Self {
        DecodeError(Box::new(ErrorInner {
            kind,
            path: Vec::new(),
        }))
    }

    /// What went wrong.
    pub fn kind(&self) -> &DecodeErrorKind {
        &self.0.kind
    }

    /// Records that the error happened inside field `name`.
    #[cold]
    pub fn in_field(mut self, name: &'static str) -> Self {
        self.0.path.push(PathSegment::Field(name));
        self
    }

    /// Records that the error happened in array element `index`.
    #[cold]
    pub fn at_index(mut self, index: usize) -> Self {
        self.0.path.push(PathSegment::Index(index));
        self
    }

    /// Records that the error happened inside a value of type `name`.
    #[cold]
    pub fn in_type(mut self, name: &'static str) -> Self {
        self.0.path.push(PathSegment::Type(name));
        self
    }

    /// The path of the failing field, outermost first, e.g.
    /// `ReadRequest.nodes_to_read[3].node_id`.
    pub fn path(&self) -> String {
        let mut s = String::new();
        for seg in self.0.path.iter().rev() {
            match seg {
                PathSegment::Type(t) => {
                    if s.is_empty() {
                        s.push_str(t);
                    } else {
                        s.push('<');
                        s.push_str(t);
                        s.push('>');
                    }
                }
                PathSegment::Field(n) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(n);
                }
                PathSegment::Index(i) => {
                    s.push('[');
                    s.push_str(&i.to_string());
                    s.push(']');
                }
            }
        }
        s
    }

    /// The StatusCode a peer gets for this error: `BadEncodingLimitsExceeded`
    /// for a limit, `BadDecodingError` for anything else.
    pub fn status_code(&self) -> StatusCode {
        match self.0.kind {
            DecodeErrorKind::LimitExceeded { .. } => StatusCode::BadEncodingLimitsExceeded,
            _ => StatusCode::BadDecodingError,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.path.is_empty() {
            write!(f, "{}", self.0.kind)
        } else {
            write!(f, "{}: {}", self.path(), self.0.kind)
        }
    }
}

impl fmt::Debug for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DecodeError({self})")
    }
}

impl std::error::Error for DecodeError {}

/// A bounded cursor over untrusted bytes.
///
/// It carries the [`DecodeLimits`] and the current nesting depth, so that
/// every decoder checks the same bounds.
#[derive(Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: &'a DecodeLimits,
    depth: u16,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`; fails if `buf` is over `limits.max_message_size`.
    pub fn new(buf: &'a [u8], limits: &'a DecodeLimits) -> Result<Self, DecodeError> {
        if buf.len() > limits.max_message_size {
            return Err(DecodeError::new(DecodeErrorKind::LimitExceeded {
                limit: Limit::MessageSize,
                value: buf.len(),
                max: limits.max_message_size,
            }));
        }
        Ok(Reader {
            buf,
            pos: 0,
            limits,
            depth: 0,
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> &'a DecodeLimits {
        self.limits
    }

    /// Bytes not read yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes read so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Fails with [`DecodeErrorKind::TrailingBytes`] unless every byte was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::new(DecodeErrorKind::TrailingBytes(n))),
        }
    }

    /// Takes the next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.buf.get(self.pos..self.pos.saturating_add(n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.end_error(n)),
        }
    }

    #[cold]
    fn end_error(&self, needed: usize) -> DecodeError {
        DecodeError::new(DecodeErrorKind::UnexpectedEnd {
            needed,
            remaining: self.remaining(),
        })
    }

    /// Takes the next `N` bytes as an array.
    #[inline]
    pub fn take_array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        match self
            .buf
            .get(self.pos..self.pos.saturating_add(N))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
        {
            Some(a) => {
                self.pos += N;
                Ok(a)
            }
            None => Err(self.end_error(N)),
        }
    }

    /// Reads one byte.
    #[inline]
    pub fn read_u8(&mut self) -> Result<u8, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.end_error(1)),
        }
    }

    /// A reader over the next `len` bytes (which this reader skips), with the
    /// same limits and depth.
    pub fn sub(&mut self, len: usize) -> Result<Reader<'a>, DecodeError> {
        let buf = self.take(len)?;
        Ok(Reader {
            buf,
            pos: 0,
            limits: self.limits,
            depth: self.depth,
        })
    }

    /// Enters one nesting level (Variant, ExtensionObject, DiagnosticInfo,
    /// DataValue); fails over `max_nesting_depth`. Pair with [`Reader::leave`].
    #[inline]
    pub fn enter(&mut self) -> Result<(), DecodeError> {
        if self.depth >= self.limits.max_nesting_depth {
            return Err(DecodeError::new(DecodeErrorKind::LimitExceeded {
                limit: Limit::NestingDepth,
                value: usize::from(self.depth) + 1,
                max: usize::from(self.limits.max_nesting_depth),
            }));
        }
        self.depth += 1;
        Ok(())
    }

    /// Leaves a nesting level entered with [`Reader::enter`].
    #[inline]
    pub fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    /// Reads an Int32 length prefix: `None` for -1 (null), an error below -1
    /// or over `max` (reported as `limit`).
    #[inline]
    pub fn read_length(&mut self, limit: Limit) -> Result<Option<usize>, DecodeError> {
        let n = i32::from_le_bytes(self.take_array()?);
        if n == -1 {
            return Ok(None);
        }
        if n < 0 {
            return Err(DecodeError::new(DecodeErrorKind::NegativeLength(n)));
        }
        let n = n as usize;
        let max = match limit {
            Limit::StringLength => self.limits.max_string_length,
            Limit::ByteStringLength => self.limits.max_byte_string_length,
            Limit::ArrayLength => self.limits.max_array_length,
            Limit::NestingDepth => usize::from(self.limits.max_nesting_depth),
            Limit::MessageSize => self.limits.max_message_size,
        };
        if n > max {
            return Err(DecodeError::new(DecodeErrorKind::LimitExceeded {
                limit,
                value: n,
                max,
            }));
        }
        Ok(Some(n))
    }

    /// Reads an array of `T`: `None` for a null array (length -1).
    ///
    /// The capacity reserved is bounded by the bytes left (every element is
    /// at least one byte), so a forged length cannot allocate more than the
    /// message carries.
    pub fn read_array<T>(
        &mut self,
        mut item: impl FnMut(&mut Reader<'a>) -> Result<T, DecodeError>,
    ) -> Result<Option<Vec<T>>, DecodeError> {
        let Some(n) = self.read_length(Limit::ArrayLength)? else {
            return Ok(None);
        };
        if n > self.remaining() {
            return Err(self.end_error(n));
        }
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            v.push(item(self).map_err(|e| e.at_index(i))?);
        }
        Ok(Some(v))
    }
}

/// Writes an Int32 length prefix.
#[inline]
pub fn write_length(w: &mut Vec<u8>, len: Option<usize>) {
    let n: i32 = match len {
        None => -1,
        // Lengths over i32::MAX cannot be encoded; such a value cannot have
        // been decoded and would exceed any negotiated message size first.
        Some(n) => i32::try_from(n).unwrap_or(i32::MAX),
    };
    w.extend_from_slice(&n.to_le_bytes());
}

/// Writes an array (null when `None`).
pub fn write_array<T: BinaryEncode>(w: &mut Vec<u8>, v: &Option<Vec<T>>) {
    match v {
        None => write_length(w, None),
        Some(items) => {
            write_length(w, Some(items.len()));
            for item in items {
                item.encode(w);
            }
        }
    }
}

/// Writes a present array (never null) from a slice.
pub fn write_slice<T: BinaryEncode>(w: &mut Vec<u8>, items: &[T]) {
    write_length(w, Some(items.len()));
    for item in items {
        item.encode(w);
    }
}

/// Decodes one field, recording its name on error (used by generated code).
#[inline]
pub fn decode_field<T: BinaryDecode>(
    r: &mut Reader<'_>,
    name: &'static str,
) -> Result<T, DecodeError> {
    T::decode(r).map_err(|e| e.in_field(name))
}

/// Decodes an array field where null and empty mean the same (optional
/// fields and union arms, where absence is said elsewhere).
#[inline]
pub fn decode_vec_field<T: BinaryDecode>(
    r: &mut Reader<'_>,
    name: &'static str,
) -> Result<Vec<T>, DecodeError> {
    r.read_array(T::decode)
        .map(Option::unwrap_or_default)
        .map_err(|e| e.in_field(name))
}

impl<T: BinaryEncode> BinaryEncode for Option<Vec<T>> {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        write_array(w, self)
    }
}

impl<T: BinaryDecode> BinaryDecode for Option<Vec<T>> {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.read_array(T::decode)
    }
}

impl BinaryEncode for bool {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        w.push(u8::from(*self));
    }
}

impl BinaryDecode for bool {
    /// Part 6 §5.2.2.1: zero is false, any other byte is true.
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(r.read_u8()? != 0)
    }
}

macro_rules! le_number {
    ($($t:ty),*) => {$(
        impl BinaryEncode for $t {
            #[inline]
            fn encode(&self, w: &mut Vec<u8>) {
                w.extend_from_slice(&self.to_le_bytes());
            }
        }
        impl BinaryDecode for $t {
            #[inline]
            fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.take_array()?))
            }
        }
    )*};
}

le_number!(i8, u8, i16, u16, i32, u32, i64, u64, f32, f64);

// StatusCode's codec sits with the codec rather than in status_code/: the
// codec names StatusCode (`DecodeError::status_code`), and status_code/
// stays below it.
impl BinaryEncode for StatusCode {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        self.0.encode(w)
    }
}

impl BinaryDecode for StatusCode {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        u32::decode(r).map(StatusCode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_little_endian() {
        assert_eq!(0x0102_0304u32.to_bytes(), [4, 3, 2, 1]);
        assert_eq!((-2i16).to_bytes(), [0xfe, 0xff]);
        assert_eq!(1.0f64.to_bytes(), [0, 0, 0, 0, 0, 0, 0xf0, 0x3f]);
        let l = DecodeLimits::default();
        assert_eq!(u32::from_bytes(&[4, 3, 2, 1], &l).unwrap(), 0x0102_0304);
    }

    #[test]
    fn truncated_number_reports_the_shortfall() {
        let l = DecodeLimits::default();
        let e = u32::from_bytes(&[1, 2], &l).unwrap_err();
        assert_eq!(
            e.kind(),
            &DecodeErrorKind::UnexpectedEnd {
                needed: 4,
                remaining: 2
            }
        );
        assert_eq!(e.status_code(), StatusCode::BadDecodingError);
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let l = DecodeLimits::default();
        let e = u8::from_bytes(&[1, 2], &l).unwrap_err();
        assert_eq!(e.kind(), &DecodeErrorKind::TrailingBytes(1));
    }

    #[test]
    fn null_and_empty_arrays_differ() {
        let null: Option<Vec<u32>> = None;
        let empty: Option<Vec<u32>> = Some(vec![]);
        assert_eq!(null.to_bytes(), [0xff; 4]);
        assert_eq!(empty.to_bytes(), [0; 4]);
        let l = DecodeLimits::default();
        assert_eq!(
            Option::<Vec<u32>>::from_bytes(&[0xff; 4], &l).unwrap(),
            None
        );
        assert_eq!(
            Option::<Vec<u32>>::from_bytes(&[0; 4], &l).unwrap(),
            Some(vec![])
        );
    }

    #[test]
    fn forged_array_length_does_not_allocate() {
        let l = DecodeLimits::default();
        // 900,000 elements claimed, 4 bytes present.
        let mut b = 900_000i32.to_le_bytes().to_vec();
        b.extend_from_slice(&[0; 4]);
        let e = Option::<Vec<u32>>::from_bytes(&b, &l).unwrap_err();
        assert!(matches!(e.kind(), DecodeErrorKind::UnexpectedEnd { .. }));
        let b = 2_000_000i32.to_le_bytes();
        let e = Option::<Vec<u32>>::from_bytes(&b, &l).unwrap_err();
        assert!(matches!(
            e.kind(),
            DecodeErrorKind::LimitExceeded {
                limit: Limit::ArrayLength,
                ..
            }
        ));
        assert_eq!(e.status_code(), StatusCode::BadEncodingLimitsExceeded);
        let e = Option::<Vec<u32>>::from_bytes(&(-2i32).to_le_bytes(), &l).unwrap_err();
        assert_eq!(e.kind(), &DecodeErrorKind::NegativeLength(-2));
    }

    #[test]
    fn error_path_is_outermost_first() {
        let e = DecodeError::new(DecodeErrorKind::InvalidUtf8)
            .in_field("node_id")
            .at_index(3)
            .in_field("nodes_to_read")
            .in_type("ReadRequest");
        assert_eq!(e.path(), "ReadRequest.nodes_to_read[3].node_id");
        assert_eq!(
            e.to_string(),
            "ReadRequest.nodes_to_read[3].node_id: string is not valid UTF-8"
        );
    }

    #[test]
    fn message_size_limit() {
        let l = DecodeLimits {
            max_message_size: 3,
            ..DecodeLimits::default()
        };
        assert!(Reader::new(&[0; 4], &l).is_err());
        assert!(Reader::new(&[0; 3], &l).is_ok());
    }
}
