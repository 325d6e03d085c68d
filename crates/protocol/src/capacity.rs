//! Kubernetes quantities as DRA capacities use them (ResourceSlice capacities, claims'
//! `consumedCapacity`; read by the DRA driver's cores and by `hami status`): whole numbers
//! with an optional binary (`Ki`…`Ei`) or decimal (`k`…`E`) suffix. Fractions and milli-units are refused: no
//! capacity we publish or consume (bytes, CUs, shares) has them.
//!
//! Hand-written: k8s-openapi's `Quantity` is an unparsed string and no workspace dependency
//! parses one; a general parser would have to be narrowed to whole numbers anyway.

/// Why a quantity is not a whole non-negative number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a whole non-negative number with an optional suffix; the text.
    #[error(
        "quantity {0:?} is not a whole non-negative number with an optional Ki/Mi/Gi/Ti/Pi/Ei or k/M/G/T/P/E suffix"
    )]
    Malformed(String),
    /// Beyond `u64`; the text.
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
}

const BINARY: &[(&str, u32)] = &[
    ("Ki", 1),
    ("Mi", 2),
    ("Gi", 3),
    ("Ti", 4),
    ("Pi", 5),
    ("Ei", 6),
];
const DECIMAL: &[(&str, u32)] = &[("k", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5), ("E", 6)];

/// Parses `192Gi`, `304`, `1Mi`, `2k`.
pub fn parse(text: &str) -> Result<u64, QuantityError> {
    let bad = || QuantityError::Malformed(text.to_string());
    let t = text.strip_prefix('+').unwrap_or(text);
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad());
    }
    let (number, suffix) = t.split_at(digits);
    let n: u64 = number
        .parse()
        .map_err(|_| QuantityError::TooLarge(text.into()))?;
    let factor: u64 = if suffix.is_empty() {
        1
    } else if let Some((_, p)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        1u64 << (10 * p)
    } else if let Some((_, p)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        1000u64.pow(*p)
    } else {
        return Err(bad());
    };
    n.checked_mul(factor)
        .ok_or_else(|| QuantityError::TooLarge(text.into()))
}

/// Canonical text for a byte count (the largest binary suffix that divides it, as the API
/// server writes BinarySI quantities).
pub fn format_bytes(n: u64) -> String {
    if n == 0 {
        return "0".into();
    }
    for (suffix, p) in BINARY.iter().rev() {
        let unit = 1u64 << (10 * p);
        if n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// Canonical text for a plain count.
pub fn format_count(n: u64) -> String {
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_what_the_api_server_writes() {
        assert_eq!(parse("192Gi").unwrap(), 192 << 30);
        assert_eq!(parse("1Mi").unwrap(), 1 << 20);
        assert_eq!(parse("304").unwrap(), 304);
        assert_eq!(parse("2k").unwrap(), 2000);
        for bad in ["", "1.5", "-1", "500m", "1e3", "Gi", "1 Gi", "1gi"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(parse("16Ei"), Err(QuantityError::TooLarge(_))));
    }

    proptest! {
        #[test]
        fn bytes_round_trip(n in any::<u64>()) {
            prop_assert_eq!(parse(&format_bytes(n)).unwrap(), n);
        }
    }
}
