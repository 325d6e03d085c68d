//! RFC 3339 timestamps as unix seconds, for the node lock (SPEC §2.4); proleptic Gregorian,
//! as Kubernetes uses.
//!
//! Hand-written rather than `jiff` (already in the lock file through k8s-openapi): the
//! protocol crate is linked into the LD_AUDIT/LD_PRELOAD hooks without default features and
//! stays free of dependencies beyond `thiserror` there, and the node lock needs only UTC
//! seconds, which these two functions cover (round-trip property-tested below).

/// Why a timestamp was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an RFC 3339 timestamp such as 2026-08-21T06:20:39Z")]
pub struct TimestampError(pub String);

/// Formats unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn format_utc(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into unix seconds (fraction dropped).
pub fn parse(text: &str) -> Result<i64, TimestampError> {
    parse_inner(text.as_bytes()).ok_or_else(|| TimestampError(text.to_owned()))
}

fn parse_inner(b: &[u8]) -> Option<i64> {
    if b.len() < 20 {
        return None;
    }
    let num = |range: core::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            digits
                .iter()
                .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')),
        )
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    // 60 is a leap second; treat it as the last second of the minute.
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &b[19..];
    if let Some((b'.', frac)) = rest.split_first() {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hh = two_digits(*h1, *h2)?;
            let mm = two_digits(*m1, *m2)?;
            if hh > 23 || mm > 59 {
                return None;
            }
            let off = hh * 3600 + mm * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset)
}

fn two_digits(a: u8, b: u8) -> Option<i64> {
    (a.is_ascii_digit() && b.is_ascii_digit()).then(|| i64::from((a - b'0') * 10 + (b - b'0')))
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's days_from_civil / civil_from_days.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        assert_eq!(parse("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse("2026-08-21T06:20:39Z"), Ok(1_787_293_239));
        assert_eq!(format_utc(1_787_293_239), "2026-08-21T06:20:39Z");
        // The reference writes local time with an offset.
        assert_eq!(parse("2026-08-21T14:20:39+08:00"), Ok(1_787_293_239));
        assert_eq!(parse("2026-08-21T06:20:39.123456Z"), Ok(1_787_293_239));
        assert_eq!(parse("2024-02-29T00:00:00Z"), Ok(1_709_164_800));
    }

    #[test]
    fn bad_values() {
        for bad in [
            "",
            "2026-08-21",
            "2026-08-21T06:20:39",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-08-21T24:00:00Z",
            "2026-08-21T06:20:39+8:00",
            "2026-08-21T06:20:39.Z",
            "2026-08-21T06:20:39Zjunk",
            "２026-08-21T06:20:39Z",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn round_trip(unix in -62_135_596_800i64..253_402_300_799) {
            prop_assert_eq!(parse(&format_utc(unix)), Ok(unix));
        }

        #[test]
        fn total(text in ".{0,40}") {
            let _ = parse(&text);
        }
    }
}
