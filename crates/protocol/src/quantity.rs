//! Reading Kubernetes quantities where only a non-negative whole number makes sense (GPU
//! counts, MiB, percentages).
//!
//! The API server stores every quantity in canonical form, so a count is not always read
//! back as it was written: `3000` comes back as `3k`, `2000000` as `2M`, and `1e3` or
//! `2000m` may be what a client wrote. Those are whole numbers and are taken as such.
//! Refused, each a user mistake worth naming: negatives, fractions (`1.5`, `500m`), binary
//! suffixes (`1Gi` is 1073741824, never "1 GiB" of anything), values beyond 64 bits.
//!
//! Hand-written: k8s-openapi's `Quantity` is an unparsed string and no workspace dependency
//! parses one; a general quantity parser would accept the forms refused here.

/// What is wrong with a quantity used as a count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountProblem {
    /// Not a Kubernetes quantity.
    #[error("is not a number")]
    Malformed,
    /// Below zero.
    #[error("is negative")]
    Negative,
    /// Has a fractional part (also after its suffix: `500m`, `15e-1`).
    #[error("is not a whole number")]
    Fractional,
    /// Carries a binary suffix (`Ki` … `Ei`); the quantity as written.
    #[error("{}", binary_note(.0))]
    HasUnit(String),
    /// Does not fit in 64 bits.
    #[error("is too large")]
    TooLarge,
}

/// Decimal multipliers as powers of ten; `n`, `u`, `m` leave a whole number only when
/// the digits before them do (`2000m` is 2).
const DECIMAL: &[(&str, i64)] = &[
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];
/// Binary multipliers as powers of two.
const BINARY: &[(&str, u32)] = &[
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

/// What a binary-suffixed quantity really is, so that `4Gi` for "4 GiB of memory" reads
/// as the mistake it is.
fn binary_note(text: &str) -> String {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let power = BINARY
        .iter()
        .find(|(s, _)| *s == suffix)
        .map_or(0, |(_, p)| *p);
    let value = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64.checked_shl(power)?));
    let is = value.map_or_else(|| format!("{number} × 2^{power}"), |v| v.to_string());
    format!(
        "uses the binary suffix {suffix}: {text} is {is} ({suffix} multiplies by 2^{power}, it does not mean {suffix}B)"
    )
}

/// Parses a quantity that must be a non-negative whole number: plain (`3000`), with a
/// decimal multiplier (`3k`, `2M`), or with an exponent (`3e3`), as the API server may
/// write it.
pub fn parse_count(text: &str) -> Result<u64, CountProblem> {
    let text = text.trim();
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let negative = text.starts_with('-');
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits_ok(whole) || !digits_ok(fraction) {
        return Err(CountProblem::Malformed);
    }
    let power = if suffix.is_empty() {
        0
    } else if let Some((_, p)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        *p
    } else if BINARY.iter().any(|(s, _)| *s == suffix) {
        // Zero is zero in any unit (the API server stores `0Gi` as `0`).
        if whole.bytes().chain(fraction.bytes()).all(|b| b == b'0') {
            return Ok(0);
        }
        return Err(if negative {
            CountProblem::Negative
        } else {
            CountProblem::HasUnit(unsigned.to_owned())
        });
    } else {
        exponent(suffix).ok_or(CountProblem::Malformed)?
    };
    // value = digits × 10^power, the digits without leading or trailing zeros.
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(CountProblem::Negative);
    }
    let power = power - fraction.len() as i64 + (digits.len() - significant.len()) as i64;
    if power < 0 {
        return Err(CountProblem::Fractional);
    }
    let scale = u32::try_from(power)
        .ok()
        .and_then(|p| 10u64.checked_pow(p))
        .ok_or(CountProblem::TooLarge)?;
    significant
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or(CountProblem::TooLarge)
}

/// The power of ten of an exponent suffix (`e3`, `E-2`, `e+6`); None if it is not one.
fn exponent(suffix: &str) -> Option<i64> {
    let exp = suffix.strip_prefix(['e', 'E'])?;
    let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Beyond ±10^6 the value is 0, a fraction or too large either way; the clamp keeps
    // the arithmetic in range.
    let magnitude = digits.parse::<i64>().unwrap_or(i64::MAX).min(1_000_000);
    Some(if exp.starts_with('-') {
        -magnitude
    } else {
        magnitude
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts() {
        assert_eq!(parse_count("1"), Ok(1));
        assert_eq!(parse_count("+2"), Ok(2));
        assert_eq!(parse_count("0"), Ok(0));
        assert_eq!(parse_count("-0"), Ok(0));
        assert_eq!(parse_count("2.0"), Ok(2));
        assert_eq!(parse_count("007"), Ok(7));
        assert_eq!(parse_count("1.5"), Err(CountProblem::Fractional));
        assert_eq!(parse_count(".5"), Err(CountProblem::Fractional));
        assert_eq!(parse_count("-1"), Err(CountProblem::Negative));
        assert_eq!(parse_count("-1.5"), Err(CountProblem::Negative));
        assert_eq!(parse_count("-3k"), Err(CountProblem::Negative));
        assert_eq!(
            parse_count("99999999999999999999"),
            Err(CountProblem::TooLarge)
        );
        for bad in [
            "", "abc", "1x", "1.2.3", ".", "-", "1 0", "0x10", "1e", "Gi", "1K", "1ki", "e3",
            "1e3k",
        ] {
            assert_eq!(parse_count(bad), Err(CountProblem::Malformed), "{bad}");
        }
    }

    /// What the API server hands back for counts a client wrote plainly (`3000` is stored
    /// as `3k`), and the other whole-number forms a client may write.
    #[test]
    fn decimal_multipliers_and_exponents_are_whole_numbers() {
        for (text, n) in [
            ("3k", 3000),
            ("16k", 16_000),
            ("2M", 2_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("18E", 18_000_000_000_000_000_000),
            ("1.5k", 1500),
            ("1e3", 1000),
            ("1E3", 1000),
            ("3e+3", 3000),
            ("10e-1", 1),
            ("2000m", 2),
            ("1000000u", 1),
            ("1000000000n", 1),
            ("0k", 0),
            ("0Gi", 0),
            ("0e999999999999", 0),
        ] {
            assert_eq!(parse_count(text), Ok(n), "{text}");
        }
        for fraction in ["500m", "1500m", "15e-1", "1.0001k", "1n"] {
            assert_eq!(
                parse_count(fraction),
                Err(CountProblem::Fractional),
                "{fraction}"
            );
        }
        for big in ["19E", "1e20", "1e999999999999", "18446744073709551616"] {
            assert_eq!(parse_count(big), Err(CountProblem::TooLarge), "{big}");
        }
        assert_eq!(parse_count("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn binary_suffixes_are_refused_with_what_they_mean() {
        assert_eq!(parse_count("1Gi"), Err(CountProblem::HasUnit("1Gi".into())));
        assert_eq!(parse_count("-1Gi"), Err(CountProblem::Negative));
        let text = parse_count("4Gi").unwrap_err().to_string();
        assert!(text.contains("4Gi is 4294967296"), "{text}");
        assert!(text.contains("does not mean GiB"), "{text}");
        let text = parse_count("1.5Ki").unwrap_err().to_string();
        assert!(text.contains("1.5Ki is 1.5 × 2^10"), "{text}");
        let text = parse_count("99999999999Ei").unwrap_err().to_string();
        assert!(text.contains("99999999999 × 2^60"), "{text}");
    }

    /// `n` written canonically, as the API server stores it: trailing zeros moved into a
    /// multiple-of-three exponent named by its decimal suffix (written here independently
    /// of the parser under test).
    fn canonical(n: u64) -> String {
        if n == 0 {
            return "0".into();
        }
        let (mut m, mut power) = (n, 0);
        while m % 1000 == 0 {
            m /= 1000;
            power += 1;
        }
        format!("{m}{}", ["", "k", "M", "G", "T", "P", "E"][power])
    }

    proptest! {
        #[test]
        fn plain_integers_round_trip(n in any::<u64>()) {
            prop_assert_eq!(parse_count(&n.to_string()), Ok(n));
        }

        #[test]
        fn canonical_forms_read_as_the_plain_integer(n in any::<u64>(), zeros in 0u32..20) {
            let n = n.checked_mul(10u64.pow(zeros.min(19))).unwrap_or(n);
            prop_assert_eq!(parse_count(&canonical(n)), Ok(n), "{}", canonical(n));
            let exponent = format!("{}e{}", n / 10u64.pow(zeros.min(19)), zeros.min(19));
            if n % 10u64.pow(zeros.min(19)) == 0 {
                prop_assert_eq!(parse_count(&exponent), Ok(n), "{}", exponent);
            }
        }

        #[test]
        fn total(text in ".{0,30}") {
            let _ = parse_count(&text);
        }
    }
}
