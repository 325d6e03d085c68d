//! Reading Kubernetes quantities where only a plain non-negative integer makes sense
//! (GPU counts, MiB, percentages). Kubernetes accepts `1.5`, `-1`, `1Gi`, `500m`, `1e3`
//! for any quantity; for these resources each of them is a user mistake worth naming.
//!
//! Hand-written: k8s-openapi's `Quantity` is an unparsed string and no workspace dependency
//! parses one; a general quantity parser would accept exactly the forms refused here.

/// What is wrong with a quantity used as a count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountProblem {
    /// Not a Kubernetes quantity.
    #[error("is not a number")]
    Malformed,
    /// Below zero.
    #[error("is negative")]
    Negative,
    /// Has a fractional part.
    #[error("is not a whole number")]
    Fractional,
    /// Carries a unit suffix; the suffix.
    #[error("has a unit suffix ({0}); these resources take a plain integer")]
    HasUnit(String),
    /// Does not fit in 64 bits.
    #[error("is too large")]
    TooLarge,
}

const SUFFIXES: &[&str] = &[
    "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
];

/// Parses a quantity that must be a plain, non-negative integer.
pub fn parse_count(text: &str) -> Result<u64, CountProblem> {
    let text = text.trim();
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let negative = text.starts_with('-');
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_none_or(str::is_empty))
        || !digits_ok(whole)
        || !fraction.is_none_or(digits_ok)
    {
        return Err(CountProblem::Malformed);
    }
    if !suffix.is_empty() {
        let is_exponent = suffix.starts_with(['e', 'E']) && suffix.len() > 1 && {
            let exp = &suffix[1..];
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !exp.is_empty() && digits_ok(exp)
        };
        return if SUFFIXES.contains(&suffix) || is_exponent {
            Err(CountProblem::HasUnit(suffix.to_owned()))
        } else {
            Err(CountProblem::Malformed)
        };
    }
    let zero_fraction = fraction.is_none_or(|f| f.bytes().all(|b| b == b'0'));
    let is_zero = whole.bytes().all(|b| b == b'0') && zero_fraction;
    if negative && !is_zero {
        return Err(CountProblem::Negative);
    }
    if !zero_fraction {
        return Err(CountProblem::Fractional);
    }
    if whole.is_empty() {
        return Ok(0);
    }
    whole.parse::<u64>().map_err(|_| CountProblem::TooLarge)
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
        assert_eq!(parse_count("1.5"), Err(CountProblem::Fractional));
        assert_eq!(parse_count(".5"), Err(CountProblem::Fractional));
        assert_eq!(parse_count("-1"), Err(CountProblem::Negative));
        assert_eq!(parse_count("-1.5"), Err(CountProblem::Negative));
        assert_eq!(parse_count("1Gi"), Err(CountProblem::HasUnit("Gi".into())));
        assert_eq!(parse_count("500m"), Err(CountProblem::HasUnit("m".into())));
        assert_eq!(parse_count("1e3"), Err(CountProblem::HasUnit("e3".into())));
        assert_eq!(
            parse_count("99999999999999999999"),
            Err(CountProblem::TooLarge)
        );
        for bad in [
            "", "abc", "1x", "1.2.3", ".", "-", "1 0", "0x10", "1e", "Gi",
        ] {
            assert_eq!(parse_count(bad), Err(CountProblem::Malformed), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn plain_integers_round_trip(n in any::<u64>()) {
            prop_assert_eq!(parse_count(&n.to_string()), Ok(n));
        }

        #[test]
        fn total(text in ".{0,30}") {
            let _ = parse_count(&text);
        }
    }
}
