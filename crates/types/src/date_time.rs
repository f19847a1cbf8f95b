//! DateTime (Part 6 §5.2.2.5): 100-nanosecond ticks since 1601-01-01 UTC.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, Reader};

/// Ticks between 1601-01-01 and 1970-01-01.
const UNIX_EPOCH_TICKS: i64 = 116_444_736_000_000_000;
/// Ticks at 9999-12-31T23:59:59Z: Part 6 encodes this and later as `i64::MAX`.
const MAX_DATE_TICKS: i64 = 2_650_467_743_990_000_000;

/// A point in time as OPC UA encodes it.
///
/// Part 6 rules hold by construction: a value at or before 1601-01-01 is 0
/// ([`DateTime::MIN`], also "no time"), a value at or after
/// 9999-12-31T23:59:59Z is `i64::MAX` ([`DateTime::MAX`]).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DateTime(i64);

impl DateTime {
    /// The earliest time, encoded as 0; also means "not set".
    pub const MIN: DateTime = DateTime(0);
    /// The latest time, encoded as `i64::MAX`.
    pub const MAX: DateTime = DateTime(i64::MAX);

    /// From 100 ns ticks since 1601-01-01, clamped to the Part 6 range.
    pub const fn from_ticks(ticks: i64) -> Self {
        if ticks <= 0 {
            DateTime::MIN
        } else if ticks >= MAX_DATE_TICKS {
            DateTime::MAX
        } else {
            DateTime(ticks)
        }
    }

    /// 100 ns ticks since 1601-01-01.
    pub const fn ticks(self) -> i64 {
        self.0
    }

    /// True for [`DateTime::MIN`], which OPC UA uses for "no time".
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// From microseconds since the Unix epoch.
    pub const fn from_unix_micros(us: i64) -> Self {
        Self::from_ticks(us.saturating_mul(10).saturating_add(UNIX_EPOCH_TICKS))
    }

    /// From a `SystemTime` (the caller reads the clock; this crate never does).
    pub fn from_system_time(t: SystemTime) -> Self {
        let ticks = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos() / 100)
                .unwrap_or(i64::MAX)
                .saturating_add(UNIX_EPOCH_TICKS),
            Err(e) => UNIX_EPOCH_TICKS
                .saturating_sub(i64::try_from(e.duration().as_nanos() / 100).unwrap_or(i64::MAX)),
        };
        Self::from_ticks(ticks)
    }

    /// As a `SystemTime`.
    pub fn to_system_time(self) -> SystemTime {
        let rel = self.0 - UNIX_EPOCH_TICKS;
        let d = Duration::from_nanos(rel.unsigned_abs().saturating_mul(100));
        if rel >= 0 {
            UNIX_EPOCH + d
        } else {
            UNIX_EPOCH - d
        }
    }

    /// From a UTC calendar date and time; `None` when a field is out of range.
    pub fn from_ymd_hms_nanos(
        year: i32,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
        nanos: u32,
    ) -> Option<Self> {
        if !(1..=12).contains(&month)
            || day == 0
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
            || nanos >= 1_000_000_000
        {
            return None;
        }
        let days = days_from_civil(year, month, day);
        let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
        let ticks = (secs.checked_mul(10_000_000)?)
            .checked_add(i64::from(nanos / 100))?
            .checked_add(UNIX_EPOCH_TICKS)?;
        Some(Self::from_ticks(ticks))
    }

    /// Parses an RFC 3339 UTC time such as `2024-05-01T12:00:00Z` or
    /// `2024-05-01T12:00:00.1234567Z`.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let s = s.strip_suffix('Z').or_else(|| s.strip_suffix('z'))?;
        let (date, time) = s.split_once(['T', 't', ' '])?;
        let mut d = date.splitn(3, '-');
        let year: i32 = d.next()?.parse().ok()?;
        let month: u32 = d.next()?.parse().ok()?;
        let day: u32 = d.next()?.parse().ok()?;
        let (hms, frac) = match time.split_once('.') {
            Some((a, b)) => (a, Some(b)),
            None => (time, None),
        };
        let mut t = hms.splitn(3, ':');
        let hour: u32 = t.next()?.parse().ok()?;
        let minute: u32 = t.next()?.parse().ok()?;
        let second: u32 = t.next()?.parse().ok()?;
        let nanos = match frac {
            None => 0,
            Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
                let v: u32 = f.parse().ok()?;
                v * 10u32.pow(9 - f.len() as u32)
            }
            Some(_) => return None,
        };
        Self::from_ymd_hms_nanos(year, month, day, hour, minute, second, nanos)
    }
}

fn is_leap(y: i32) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i32, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            if is_leap(y) {
                29
            } else {
                28
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// civil-from-days algorithm, in its inverse direction).
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Why a text is not an RFC 3339 UTC time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DateTimeParseError(&'static str);

impl fmt::Display for DateTimeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected RFC 3339 UTC such as 2024-05-01T12:00:00Z or 2024-05-01T12:00:00.5Z",
            self.0
        )
    }
}

impl std::error::Error for DateTimeParseError {}

impl std::str::FromStr for DateTime {
    type Err = DateTimeParseError;

    /// RFC 3339 in UTC (`Z` or `+00:00`), fractions down to 100 ns.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = DateTimeParseError;
        let s = s.trim();
        let body = s
            .strip_suffix('Z')
            .or_else(|| s.strip_suffix('z'))
            .or_else(|| s.strip_suffix("+00:00"))
            .ok_or(err("no UTC designator (Z)"))?;
        let (date, time) = body
            .split_once(['T', 't', ' '])
            .ok_or(err("no T between date and time"))?;
        let num = |t: &str, what: &'static str| t.parse::<i64>().map_err(|_| err(what));
        let mut dp = date.splitn(3, '-');
        let y = num(dp.next().unwrap_or(""), "bad year")?;
        let mo = num(dp.next().unwrap_or(""), "bad month")?;
        let d = num(dp.next().unwrap_or(""), "bad day")?;
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
            return Err(err("month or day out of range"));
        }
        let (hms, frac) = match time.split_once('.') {
            Some((a, b)) => (a, b),
            None => (time, ""),
        };
        let mut tp = hms.splitn(3, ':');
        let h = num(tp.next().unwrap_or(""), "bad hour")?;
        let mi = num(tp.next().unwrap_or(""), "bad minute")?;
        let sec = num(tp.next().unwrap_or(""), "bad second")?;
        if h > 23 || mi > 59 || sec > 60 || h < 0 || mi < 0 || sec < 0 {
            return Err(err("time out of range"));
        }
        if frac.len() > 7 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("fraction longer than 7 digits or not digits"));
        }
        let frac_ticks = if frac.is_empty() {
            0
        } else {
            num(frac, "bad fraction")? * 10i64.pow(7 - frac.len() as u32)
        };
        let y = i32::try_from(y).map_err(|_| err("year out of range"))?;
        let days = days_from_civil(y, mo as u32, d as u32);
        let secs = days
            .checked_mul(86_400)
            .and_then(|v| v.checked_add(h * 3600 + mi * 60 + sec))
            .ok_or(err("out of range"))?;
        let ticks = secs
            .checked_mul(10_000_000)
            .and_then(|v| v.checked_add(frac_ticks))
            .and_then(|v| v.checked_add(UNIX_EPOCH_TICKS))
            .ok_or(err("out of range"))?;
        Ok(DateTime::from_ticks(ticks))
    }
}

impl fmt::Display for DateTime {
    /// RFC 3339 UTC with 100 ns precision, e.g. `2024-05-01T12:00:00.0000000Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rel = self.0 - UNIX_EPOCH_TICKS;
        let secs = rel.div_euclid(10_000_000);
        let frac = rel.rem_euclid(10_000_000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:07}Z",
            sod / 3600,
            (sod / 60) % 60,
            sod % 60
        )
    }
}

impl fmt::Debug for DateTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DateTime::MIN => f.write_str("DateTime::MIN"),
            DateTime::MAX => f.write_str("DateTime::MAX"),
            _ => write!(f, "{self}"),
        }
    }
}

impl BinaryEncode for DateTime {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        self.0.encode(w)
    }
}

impl BinaryDecode for DateTime {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        i64::decode(r).map(DateTime::from_ticks)
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_through_display() {
        for text in [
            "1970-01-01T00:00:00.0000000Z",
            "2024-02-29T23:59:59.1234567Z",
            "1601-01-01T00:00:00.0000001Z",
            "2100-12-31T12:00:00.5000000Z",
        ] {
            let t: DateTime = text.parse().unwrap();
            assert_eq!(t.to_string(), text);
        }
        let short: DateTime = "2024-05-01T12:00:00Z".parse().unwrap();
        assert_eq!(short.to_string(), "2024-05-01T12:00:00.0000000Z");
        for bad in [
            "2024-05-01",
            "2024-13-01T00:00:00Z",
            "2024-05-01T25:00:00Z",
            "x",
            "2024-05-01T00:00:00+02:00",
        ] {
            assert!(bad.parse::<DateTime>().is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_epoch_and_calendar() {
        assert_eq!(DateTime::from_unix_micros(0).ticks(), UNIX_EPOCH_TICKS);
        let t = DateTime::from_ymd_hms_nanos(2024, 5, 1, 12, 0, 0, 0).unwrap();
        assert_eq!(t.ticks(), 133_590_384_000_000_000);
        assert_eq!(t.to_string(), "2024-05-01T12:00:00.0000000Z");
        assert_eq!(DateTime::parse_rfc3339("2024-05-01T12:00:00Z"), Some(t));
        assert_eq!(
            DateTime::parse_rfc3339("2024-05-01T12:00:00.1234567Z")
                .unwrap()
                .ticks(),
            t.ticks() + 1_234_567
        );
        assert_eq!(DateTime::from_ymd_hms_nanos(2023, 2, 29, 0, 0, 0, 0), None);
        assert_eq!(DateTime::parse_rfc3339("2024-13-01T00:00:00Z"), None);
    }

    #[test]
    fn part6_range_rules() {
        assert_eq!(DateTime::from_ticks(-5), DateTime::MIN);
        assert_eq!(DateTime::from_ticks(MAX_DATE_TICKS), DateTime::MAX);
        assert_eq!(
            DateTime::from_ymd_hms_nanos(9999, 12, 31, 23, 59, 59, 0),
            Some(DateTime::MAX)
        );
        assert_eq!(
            DateTime::from_ymd_hms_nanos(1601, 1, 1, 0, 0, 0, 0),
            Some(DateTime::MIN)
        );
        assert_eq!(DateTime::MAX.to_bytes(), i64::MAX.to_le_bytes());
        let l = crate::DecodeLimits::default();
        assert_eq!(
            DateTime::from_bytes(&(-1i64).to_le_bytes(), &l).unwrap(),
            DateTime::MIN
        );
    }

    #[test]
    fn system_time_round_trip() {
        let st = UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        assert_eq!(DateTime::from_system_time(st).to_system_time(), st);
    }
}
