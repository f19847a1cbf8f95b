//! NumericRange (Part 4 §7.27): `3`, `1:4`, or per dimension `1:2,0:3`.

use std::str::FromStr;

use uascale_types::{Array, ByteString, StatusCode, UaString, Variant};

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

impl NumericRange {
    /// The part of `v` this range selects: `BadIndexRangeNoData` when it
    /// selects nothing, `BadIndexRangeInvalid` for a shape it cannot apply
    /// to (e.g. two dimensions on a one-dimensional array).
    pub fn apply(&self, v: &Variant) -> Result<Variant, StatusCode> {
        let [b] = self.0.as_slice() else {
            return match v {
                Variant::Array(a) if a.dimensions().is_some_and(|d| d.len() == self.0.len()) => {
                    // Multi-dimensional sub-ranges are not served yet.
                    Err(StatusCode::BadIndexRangeInvalid)
                }
                _ => Err(StatusCode::BadIndexRangeNoData),
            };
        };
        let b = *b;
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
            Variant::Array(a) if a.dimensions().is_none_or(|d| d.len() <= 1) => {
                Variant::from(Array::new(
                    a.values()
                        .sub_range(b.low as usize, b.high as usize)
                        .ok_or(none)?,
                ))
            }
            Variant::Array(_) => return Err(StatusCode::BadIndexRangeInvalid),
            _ => return Err(none),
        })
    }
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

    #[test]
    fn apply() {
        let v = Variant::from(vec![10i32, 11, 12, 13]);
        let r: NumericRange = "1:2".parse().unwrap();
        assert_eq!(r.apply(&v), Ok(Variant::from(vec![11i32, 12])));
        // A high bound past the end is clipped.
        let r: NumericRange = "2:9".parse().unwrap();
        assert_eq!(r.apply(&v), Ok(Variant::from(vec![12i32, 13])));
        let r: NumericRange = "4".parse().unwrap();
        assert_eq!(r.apply(&v), Err(StatusCode::BadIndexRangeNoData));
        let r: NumericRange = "1:3".parse().unwrap();
        assert_eq!(r.apply(&Variant::from("hello")), Ok(Variant::from("ell")));
        assert_eq!(
            r.apply(&Variant::Int32(1)),
            Err(StatusCode::BadIndexRangeNoData)
        );
    }
}

impl NumericRange {
    /// `current` with the elements this range selects replaced by `new`
    /// (an array of exactly that many elements, of the same type).
    pub fn write(&self, current: &Variant, new: &Variant) -> Result<Variant, StatusCode> {
        let [b] = self.0.as_slice() else {
            return Err(StatusCode::BadIndexRangeInvalid);
        };
        let (Variant::Array(cur), Variant::Array(upd)) = (current, new) else {
            return Err(StatusCode::BadIndexRangeNoData);
        };
        let low = b.low as usize;
        let count = (b.high - b.low) as usize + 1;
        if low + count > cur.values().len() {
            return Err(StatusCode::BadIndexRangeNoData);
        }
        if upd.values().len() != count {
            return Err(StatusCode::BadIndexRangeInvalid);
        }
        let mut values = cur.values().clone();
        if !values.replace_range(low, upd.values()) {
            return Err(StatusCode::BadTypeMismatch);
        }
        Ok(Variant::from(Array::new(values)))
    }
}

#[cfg(test)]
mod write_tests {
    use super::*;

    #[test]
    fn write_a_range() {
        let cur = Variant::from(vec![1i32, 2, 3, 4]);
        let r: NumericRange = "1:2".parse().unwrap();
        assert_eq!(
            r.write(&cur, &Variant::from(vec![9i32, 8])),
            Ok(Variant::from(vec![1i32, 9, 8, 4]))
        );
        assert_eq!(
            r.write(&cur, &Variant::from(vec![9i32])),
            Err(StatusCode::BadIndexRangeInvalid)
        );
        assert_eq!(
            r.write(&cur, &Variant::from(vec![9.0f64, 8.0])),
            Err(StatusCode::BadTypeMismatch)
        );
        let r: NumericRange = "3:5".parse().unwrap();
        assert_eq!(
            r.write(&cur, &Variant::from(vec![0i32, 0, 0])),
            Err(StatusCode::BadIndexRangeNoData)
        );
    }
}
