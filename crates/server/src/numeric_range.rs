//! NumericRange (Part 4 §7.27): `3`, `1:4`, or per dimension `1:2,0:3`.

use std::str::FromStr;

use uascale_types::{Array, ArrayValues, ByteString, StatusCode, UaString, Variant, VariantType};

/// One dimension's inclusive bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// First index.
    pub low: u32,
    /// Last index (>= low).
    pub high: u32,
}

/// A parsed index range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumericRange(pub Vec<Bounds>);

/// Text that is not a NumericRange (`BadIndexRangeInvalid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRange;

impl FromStr for NumericRange {
    type Err = InvalidRange;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut dims = Vec::new();
        for part in s.split(',') {
            let num = |t: &str| -> Result<u32, InvalidRange> {
                if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(InvalidRange);
                }
                t.parse().map_err(|_| InvalidRange)
            };
            let b = match part.split_once(':') {
                None => {
                    let i = num(part)?;
                    Bounds { low: i, high: i }
                }
                Some((lo, hi)) => {
                    let (low, high) = (num(lo)?, num(hi)?);
                    // Part 4: "2:2" is not allowed; the high bound must be greater.
                    if high <= low {
                        return Err(InvalidRange);
                    }
                    Bounds { low, high }
                }
            };
            dims.push(b);
        }
        if dims.is_empty() {
            return Err(InvalidRange);
        }
        Ok(NumericRange(dims))
    }
}

fn slice<T: Clone>(v: &[T], b: Bounds) -> Option<Vec<T>> {
    let low = b.low as usize;
    if low >= v.len() {
        return None;
    }
    let high = (b.high as usize).min(v.len() - 1);
    Some(v[low..=high].to_vec())
}

/// The shape of an array value: its dimensions (one for a 1-D array).
fn shape(a: &Array) -> Vec<usize> {
    match a.dimensions() {
        Some(d) if d.len() > 1 => d.iter().map(|&x| x as usize).collect(),
        _ => vec![a.values().len()],
    }
}

/// The flat (row-major, last index fastest) indices of the elements `bounds`
/// select in an array of `dims`, and the selected extent per dimension.
/// `clip`: a high bound past the end is clipped (Read) rather than refused
/// (Write). `BadIndexRangeNoData` when a low bound (or, without `clip`, a
/// high bound) is outside the array.
fn select(
    dims: &[usize],
    bounds: &[Bounds],
    clip: bool,
) -> Result<(Vec<usize>, Vec<u32>), StatusCode> {
    let none = StatusCode::BadIndexRangeNoData;
    let mut ranges = Vec::with_capacity(dims.len());
    for (&d, b) in dims.iter().zip(bounds) {
        let (low, high) = (b.low as usize, b.high as usize);
        if low >= d || (!clip && high >= d) {
            return Err(none);
        }
        ranges.push((low, high.min(d - 1)));
    }
    let extent: Vec<u32> = ranges
        .iter()
        .map(|(l, h)| u32::try_from(h - l + 1).unwrap_or(u32::MAX))
        .collect();
    // Every dimension is at least one long here, so the count is bounded
    // by the array's own element count.
    let mut out = Vec::new();
    let mut idx: Vec<usize> = ranges.iter().map(|r| r.0).collect();
    loop {
        let flat = idx
            .iter()
            .zip(dims)
            .fold(0usize, |acc, (&i, &d)| acc * d + i);
        out.push(flat);
        // Odometer: advance the last dimension first.
        let mut k = idx.len();
        loop {
            if k == 0 {
                return Ok((out, extent));
            }
            k -= 1;
            if idx[k] < ranges[k].1 {
                idx[k] += 1;
                break;
            }
            idx[k] = ranges[k].0;
        }
    }
}

fn substring(v: &Variant, b: Bounds) -> Result<Variant, StatusCode> {
    let none = StatusCode::BadIndexRangeNoData;
    Ok(match v {
        Variant::String(s) => {
            let chars: Vec<char> = s.as_str().ok_or(none)?.chars().collect();
            Variant::String(UaString::new(
                slice(&chars, b)
                    .ok_or(none)?
                    .into_iter()
                    .collect::<String>(),
            ))
        }
        Variant::ByteString(bs) => Variant::ByteString(ByteString::new(
            slice(bs.as_bytes().ok_or(none)?, b).ok_or(none)?,
        )),
        _ => return Err(none),
    })
}

impl NumericRange {
    /// The part of `v` this range selects (Part 4 §7.27):
    ///
    /// - on an array, one bound per dimension (`"1:2,0:1"` on a matrix); a
    ///   high bound past the end is clipped;
    /// - on a String or ByteString scalar, one bound over its characters
    ///   (bytes);
    /// - on an array of Strings or ByteStrings, one bound more than the
    ///   array has dimensions: the last one takes a substring of each
    ///   selected element (an element it misses becomes null).
    ///
    /// `BadIndexRangeNoData` when a low bound is past the end or the value
    /// is a scalar of another type; `BadIndexRangeInvalid` when the number
    /// of bounds does not fit the array's dimensions.
    pub fn apply(&self, v: &Variant) -> Result<Variant, StatusCode> {
        let a = match v {
            Variant::Array(a) => a,
            _ => {
                let [b] = self.0.as_slice() else {
                    return Err(StatusCode::BadIndexRangeNoData);
                };
                return substring(v, *b);
            }
        };
        let dims = shape(a);
        let multi = dims.len() > 1;
        let strings = matches!(
            a.values().element_type(),
            VariantType::String | VariantType::ByteString
        );
        let (array_bounds, element_bound) = if self.0.len() == dims.len() {
            (self.0.as_slice(), None)
        } else if strings && self.0.len() == dims.len() + 1 {
            let (last, rest) = self
                .0
                .split_last()
                .ok_or(StatusCode::BadIndexRangeInvalid)?;
            (rest, Some(*last))
        } else {
            return Err(StatusCode::BadIndexRangeInvalid);
        };
        let (indices, extent) = select(&dims, array_bounds, true)?;
        let mut values = a
            .values()
            .gather(&indices)
            .ok_or(StatusCode::BadIndexRangeNoData)?;
        if let Some(b) = element_bound {
            values = match values {
                ArrayValues::String(v) => ArrayValues::String(
                    v.into_iter()
                        .map(|s| match substring(&Variant::String(s), b) {
                            Ok(Variant::String(x)) => x,
                            _ => UaString::null(),
                        })
                        .collect(),
                ),
                ArrayValues::ByteString(v) => ArrayValues::ByteString(
                    v.into_iter()
                        .map(|s| match substring(&Variant::ByteString(s), b) {
                            Ok(Variant::ByteString(x)) => x,
                            _ => ByteString::null(),
                        })
                        .collect(),
                ),
                other => other,
            };
        }
        Ok(Variant::from(if multi {
            Array::with_dimensions(values, extent).map_err(|_| StatusCode::BadInternalError)?
        } else {
            Array::new(values)
        }))
    }

    /// `current` with the part this range selects replaced by `new`: an
    /// array of exactly the selected shape and the same type for an array,
    /// a String (ByteString) of exactly the selected length for a String
    /// (ByteString) scalar. The range must lie inside the current value
    /// (`BadIndexRangeNoData`); a `new` of another size is
    /// `BadIndexRangeDataMismatch`, of another type `BadTypeMismatch`.
    pub fn write(&self, current: &Variant, new: &Variant) -> Result<Variant, StatusCode> {
        let none = StatusCode::BadIndexRangeNoData;
        let mismatch = StatusCode::BadIndexRangeDataMismatch;
        match (current, new) {
            (Variant::Array(cur), Variant::Array(upd)) => {
                let dims = shape(cur);
                if self.0.len() != dims.len() {
                    return Err(StatusCode::BadIndexRangeInvalid);
                }
                let (indices, extent) = select(&dims, &self.0, false)?;
                if upd.values().element_type() != cur.values().element_type() {
                    return Err(StatusCode::BadTypeMismatch);
                }
                let shape_ok = match upd.dimensions() {
                    Some(d) if d.len() > 1 => d == extent.as_slice(),
                    _ => extent.iter().filter(|&&e| e > 1).count() <= 1,
                };
                if upd.values().len() != indices.len() || !shape_ok {
                    return Err(mismatch);
                }
                let mut values = cur.values().clone();
                if !values.scatter(&indices, upd.values()) {
                    return Err(StatusCode::BadTypeMismatch);
                }
                let out = match cur.dimensions() {
                    Some(d) if d.len() > 1 => Array::with_dimensions(values, d.to_vec())
                        .map_err(|_| StatusCode::BadInternalError)?,
                    _ => Array::new(values),
                };
                Ok(Variant::from(out))
            }
            (Variant::String(cur), Variant::String(upd)) => {
                let [b] = self.0.as_slice() else {
                    return Err(StatusCode::BadIndexRangeInvalid);
                };
                let mut chars: Vec<char> = cur.as_str().ok_or(none)?.chars().collect();
                let with: Vec<char> = upd.as_str().ok_or(mismatch)?.chars().collect();
                splice(&mut chars, *b, &with)?;
                Ok(Variant::String(UaString::new(
                    chars.into_iter().collect::<String>(),
                )))
            }
            (Variant::ByteString(cur), Variant::ByteString(upd)) => {
                let [b] = self.0.as_slice() else {
                    return Err(StatusCode::BadIndexRangeInvalid);
                };
                let mut bytes = cur.as_bytes().ok_or(none)?.to_vec();
                splice(&mut bytes, *b, upd.as_bytes().ok_or(mismatch)?)?;
                Ok(Variant::ByteString(ByteString::new(bytes)))
            }
            (Variant::Array(_), _) | (Variant::String(_), _) | (Variant::ByteString(_), _) => {
                Err(StatusCode::BadTypeMismatch)
            }
            _ => Err(none),
        }
    }
}

/// Replaces `v[b.low..=b.high]` with `with`, which must be that long.
fn splice<T: Clone>(v: &mut [T], b: Bounds, with: &[T]) -> Result<(), StatusCode> {
    let (low, high) = (b.low as usize, b.high as usize);
    let dst = v
        .get_mut(low..=high)
        .ok_or(StatusCode::BadIndexRangeNoData)?;
    if dst.len() != with.len() {
        return Err(StatusCode::BadIndexRangeDataMismatch);
    }
    dst.clone_from_slice(with);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(
            "3".parse(),
            Ok(NumericRange(vec![Bounds { low: 3, high: 3 }]))
        );
        assert_eq!(
            "1:2,0:4".parse::<NumericRange>().unwrap().0,
            vec![Bounds { low: 1, high: 2 }, Bounds { low: 0, high: 4 }]
        );
        for bad in [
            "",
            "a",
            "2:2",
            "3:1",
            "-1",
            "1:",
            ":2",
            "1,,2",
            "99999999999",
        ] {
            assert_eq!(bad.parse::<NumericRange>(), Err(InvalidRange), "{bad}");
        }
    }

    fn r(s: &str) -> NumericRange {
        s.parse().unwrap()
    }

    #[test]
    fn apply_one_dimension() {
        let v = Variant::from(vec![10i32, 11, 12, 13]);
        assert_eq!(r("1:2").apply(&v), Ok(Variant::from(vec![11i32, 12])));
        // A high bound past the end is clipped.
        assert_eq!(r("2:9").apply(&v), Ok(Variant::from(vec![12i32, 13])));
        assert_eq!(r("4").apply(&v), Err(StatusCode::BadIndexRangeNoData));
        assert_eq!(r("1,1").apply(&v), Err(StatusCode::BadIndexRangeInvalid));
        assert_eq!(
            r("1:3").apply(&Variant::from("hello")),
            Ok(Variant::from("ell"))
        );
        assert_eq!(r("1:3").apply(&Variant::from("hé")), Ok(Variant::from("é")));
        assert_eq!(
            r("1:3").apply(&Variant::Int32(1)),
            Err(StatusCode::BadIndexRangeNoData)
        );
        assert_eq!(
            r("1,1").apply(&Variant::from("hello")),
            Err(StatusCode::BadIndexRangeNoData)
        );
    }

    /// 3 x 4:
    ///  0  1  2  3
    ///  4  5  6  7
    ///  8  9 10 11
    fn matrix() -> Variant {
        Variant::from(
            Array::with_dimensions(ArrayValues::Int32((0..12).collect()), vec![3, 4]).unwrap(),
        )
    }

    #[test]
    fn apply_two_dimensions() {
        let m = matrix();
        let want = |v: Vec<i32>, d: Vec<u32>| {
            Ok(Variant::from(
                Array::with_dimensions(ArrayValues::Int32(v), d).unwrap(),
            ))
        };
        assert_eq!(r("1:2,0:1").apply(&m), want(vec![4, 5, 8, 9], vec![2, 2]));
        assert_eq!(r("0,1:3").apply(&m), want(vec![1, 2, 3], vec![1, 3]));
        assert_eq!(r("2,3").apply(&m), want(vec![11], vec![1, 1]));
        // Clipped high bounds.
        assert_eq!(r("1:9,2:9").apply(&m), want(vec![6, 7, 10, 11], vec![2, 2]));
        assert_eq!(r("3,0").apply(&m), Err(StatusCode::BadIndexRangeNoData));
        assert_eq!(r("0,4").apply(&m), Err(StatusCode::BadIndexRangeNoData));
        assert_eq!(r("1").apply(&m), Err(StatusCode::BadIndexRangeInvalid));
        assert_eq!(r("1,1,1").apply(&m), Err(StatusCode::BadIndexRangeInvalid));
    }

    #[test]
    fn apply_substrings_of_string_arrays() {
        let v = Variant::from(vec![
            UaString::from("alpha"),
            UaString::from("be"),
            UaString::from("gamma"),
        ]);
        assert_eq!(
            r("0:1,2:3").apply(&v),
            Ok(Variant::from(vec![UaString::from("ph"), UaString::null()]))
        );
        assert_eq!(
            r("0:1,2:3").apply(&Variant::from(vec![1i32, 2])),
            Err(StatusCode::BadIndexRangeInvalid)
        );
    }
}

#[cfg(test)]
mod write_tests {
    use super::*;

    fn r(s: &str) -> NumericRange {
        s.parse().unwrap()
    }

    #[test]
    fn write_a_range() {
        let cur = Variant::from(vec![1i32, 2, 3, 4]);
        assert_eq!(
            r("1:2").write(&cur, &Variant::from(vec![9i32, 8])),
            Ok(Variant::from(vec![1i32, 9, 8, 4]))
        );
        assert_eq!(
            r("1:2").write(&cur, &Variant::from(vec![9i32])),
            Err(StatusCode::BadIndexRangeDataMismatch)
        );
        assert_eq!(
            r("1:2").write(&cur, &Variant::from(vec![9.0f64, 8.0])),
            Err(StatusCode::BadTypeMismatch)
        );
        assert_eq!(
            r("3:5").write(&cur, &Variant::from(vec![0i32, 0, 0])),
            Err(StatusCode::BadIndexRangeNoData)
        );
        assert_eq!(
            r("1").write(&cur, &Variant::Int32(5)),
            Err(StatusCode::BadTypeMismatch)
        );
    }

    #[test]
    fn write_a_block_of_a_matrix() {
        let m = Variant::from(
            Array::with_dimensions(ArrayValues::Int32((0..12).collect()), vec![3, 4]).unwrap(),
        );
        let block = Variant::from(
            Array::with_dimensions(ArrayValues::Int32(vec![-1, -2, -3, -4]), vec![2, 2]).unwrap(),
        );
        let want = Variant::from(
            Array::with_dimensions(
                ArrayValues::Int32(vec![0, 1, 2, 3, -1, -2, 6, 7, -3, -4, 10, 11]),
                vec![3, 4],
            )
            .unwrap(),
        );
        assert_eq!(r("1:2,0:1").write(&m, &block), Ok(want));
        // One row may come as a plain 1-D array.
        let row = r("2,1:3")
            .write(&m, &Variant::from(vec![7i32, 7, 7]))
            .unwrap();
        assert_eq!(
            r("2,0:3").apply(&row),
            Ok(Variant::from(
                Array::with_dimensions(ArrayValues::Int32(vec![8, 7, 7, 7]), vec![1, 4]).unwrap()
            ))
        );
        // A 4-element 1-D array is not a 2 x 2 block.
        assert_eq!(
            r("1:2,0:1").write(&m, &Variant::from(vec![1i32, 2, 3, 4])),
            Err(StatusCode::BadIndexRangeDataMismatch)
        );
        assert_eq!(
            r("2:3,0").write(&m, &Variant::from(vec![1i32, 2])),
            Err(StatusCode::BadIndexRangeNoData)
        );
        assert_eq!(
            r("1").write(&m, &Variant::from(vec![1i32])),
            Err(StatusCode::BadIndexRangeInvalid)
        );
    }

    #[test]
    fn write_into_strings() {
        assert_eq!(
            r("1:2").write(&Variant::from("hello"), &Variant::from("EL")),
            Ok(Variant::from("hELlo"))
        );
        assert_eq!(
            r("1:2").write(&Variant::from("hello"), &Variant::from("E")),
            Err(StatusCode::BadIndexRangeDataMismatch)
        );
        assert_eq!(
            r("4:5").write(&Variant::from("hello"), &Variant::from("OO")),
            Err(StatusCode::BadIndexRangeNoData)
        );
        assert_eq!(
            r("0").write(
                &Variant::ByteString(ByteString::new(vec![1, 2])),
                &Variant::ByteString(ByteString::new(vec![9]))
            ),
            Ok(Variant::ByteString(ByteString::new(vec![9, 2])))
        );
        assert_eq!(
            r("0").write(&Variant::from("x"), &Variant::Int32(1)),
            Err(StatusCode::BadTypeMismatch)
        );
    }
}
