//! Memory-limit strings (SPEC §2.7): `HIP_DEVICE_MEMORY_LIMIT_<i>`, `CUDA_DEVICE_MEMORY_LIMIT[_i]`,
//! `FAKE_*_DEVICE_MEMORY`.
//!
//! Grammar: `<digits>` (bytes) or `<digits><suffix>` with suffix `k`/`m`/`g` (KiB/MiB/GiB),
//! case-insensitive, also written `Ki`/`Mi`/`Gi`. Surrounding ASCII whitespace is ignored
//! (values read from files often end in a newline). Anything else is an error: the hooks
//! log it and fail closed (D-3) instead of running unlimited.

use core::fmt;

/// Why a memory-limit string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryLimitError {
    /// The string is empty or only whitespace.
    #[error("memory limit is empty: write a number of bytes or a number with k/m/g, e.g. 4096m")]
    Empty,
    /// Not `<digits>[suffix]`; the string as given.
    #[error(
        "memory limit {0:?} is not a number with an optional k/m/g (or Ki/Mi/Gi) suffix, e.g. 4096m"
    )]
    Malformed(String),
    /// The byte count does not fit in `u64`; the string as given.
    #[error("memory limit {0:?} does not fit in 64 bits of bytes: use a smaller value")]
    Overflow(String),
}

/// Parses a memory-limit string into bytes.
pub fn parse_memory_limit(text: &str) -> Result<u64, MemoryLimitError> {
    let trimmed = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if trimmed.is_empty() {
        return Err(MemoryLimitError::Empty);
    }
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(MemoryLimitError::Malformed(text.to_owned()));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "ki" => 10,
        "m" | "mi" => 20,
        "g" | "gi" => 30,
        _ => return Err(MemoryLimitError::Malformed(text.to_owned())),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| MemoryLimitError::Overflow(text.to_owned()))?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| MemoryLimitError::Overflow(text.to_owned()))
}

/// Parses a memory-limit value read as raw bytes (an environ entry, a file): bytes that
/// are not UTF-8 are malformed, never ignored.
pub fn parse_memory_limit_bytes(bytes: &[u8]) -> Result<u64, MemoryLimitError> {
    match core::str::from_utf8(bytes) {
        Ok(text) => parse_memory_limit(text),
        Err(_) => Err(MemoryLimitError::Malformed(
            String::from_utf8_lossy(bytes).into_owned(),
        )),
    }
}

/// A memory limit in MiB as the AMD plugin writes it (`4096m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MibLimit(pub u64);

impl fmt::Display for MibLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}m", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_every_documented_form() {
        assert_eq!(parse_memory_limit("4096"), Ok(4096));
        assert_eq!(parse_memory_limit("4k"), Ok(4 << 10));
        assert_eq!(parse_memory_limit("4K"), Ok(4 << 10));
        assert_eq!(parse_memory_limit("4Ki"), Ok(4 << 10));
        assert_eq!(parse_memory_limit("4096m"), Ok(4096 << 20));
        assert_eq!(parse_memory_limit("4096Mi"), Ok(4096 << 20));
        assert_eq!(parse_memory_limit("16g"), Ok(16 << 30));
        assert_eq!(parse_memory_limit("16GI"), Ok(16 << 30));
        assert_eq!(parse_memory_limit(" 16g\n"), Ok(16 << 30));
        assert_eq!(parse_memory_limit("0"), Ok(0));
    }

    #[test]
    fn refuses_bad_input_with_a_reason() {
        assert_eq!(parse_memory_limit(""), Err(MemoryLimitError::Empty));
        assert_eq!(parse_memory_limit("  "), Err(MemoryLimitError::Empty));
        for bad in [
            "m", "4t", "4 m", "-1", "4.5g", "4mb", "0x10", "4m4", "g4", "4\u{e9}",
        ] {
            assert!(
                matches!(parse_memory_limit(bad), Err(MemoryLimitError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_memory_limit("18446744073709551616"),
            Err(MemoryLimitError::Overflow(_))
        ));
        assert!(matches!(
            parse_memory_limit("17179869184g"),
            Err(MemoryLimitError::Overflow(_))
        ));
        let message = parse_memory_limit("4t").unwrap_err().to_string();
        assert!(message.contains("4096m"), "{message}");
    }

    #[test]
    fn raw_bytes() {
        assert_eq!(parse_memory_limit_bytes(b"4096m"), Ok(4096 << 20));
        assert!(matches!(
            parse_memory_limit_bytes(b"40\xff96m"),
            Err(MemoryLimitError::Malformed(_))
        ));
        assert_eq!(parse_memory_limit_bytes(b""), Err(MemoryLimitError::Empty));
    }

    #[test]
    fn mib_limit_formats_like_the_plugin() {
        assert_eq!(MibLimit(4096).to_string(), "4096m");
        assert_eq!(
            parse_memory_limit(&MibLimit(4096).to_string()),
            Ok(4096 << 20)
        );
    }

    proptest! {
        #[test]
        fn total_on_arbitrary_text(text in ".*") {
            let _ = parse_memory_limit(&text);
        }

        #[test]
        fn mib_round_trip(mib in 0u64..(1 << 44)) {
            prop_assert_eq!(parse_memory_limit(&MibLimit(mib).to_string()), Ok(mib << 20));
        }
    }
}
