//! `hami.io/node-handshake-<vendor>`: the device plugin's register heartbeat (issue 17 item 13).
//!
//! Value: `Reported <RFC 3339 UTC>;period=<seconds>s`, e.g.
//! `Reported 2026-12-01T10:00:00Z;period=30s`, written by the plugin in the same merge patch
//! as its register annotation at every refresh. The register value itself rarely changes,
//! and a merge patch that changes nothing is no event on a real API server, so the scheduler
//! could never see a refresh; the timestamp makes each refresh a change.
//!
//! The key is HAMi's documented form (`docs/develop/protocol.md`: `hami.io/node-handshake-{type}`
//! with `Reported_…` heartbeats). HAMi's own code uses the unsuffixed `hami.io/node-handshake`,
//! which its scheduler overwrites with `Requesting_<time>`; a suffixed key keeps the two apart.
//! We read HAMi's documented `Reported_<time>` (no period: HAMi's documented 30 s) and ignore
//! a `Requesting…` value (a scheduler's, not a plugin's report).
//!
//! The scheduler never compares the reported time with its clock (skew): it only notices that
//! the value changed, on its own monotonic clock.

use crate::names::Vendor;
use crate::rfc3339;

/// HAMi's documented heartbeat period, for values that do not carry one.
pub const HAMI_DOCUMENTED_PERIOD_SECS: u64 = 30;

/// The longest period a plugin may announce (a day): more is a typo, not a heartbeat.
pub const MAX_PERIOD_SECS: u64 = 86_400;

/// The annotation key for `vendor`: `hami.io/node-handshake-amd`, `hami.io/node-handshake-nvidia`.
pub fn key(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Amd => "hami.io/node-handshake-amd",
        Vendor::Nvidia => "hami.io/node-handshake-nvidia",
    }
}

/// A plugin's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The plugin's clock at the refresh (informational only: never compared with ours).
    pub reported_unix: Option<i64>,
    /// How often the plugin refreshes.
    pub period_secs: u64,
}

/// Why a handshake value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a device-plugin handshake ({problem}); expected e.g. \"Reported 2026-12-01T10:00:00Z;period=30s\""
)]
pub struct HandshakeError {
    /// The annotation value as read.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Formats a report: `Reported <RFC 3339 UTC>;period=<seconds>s`.
pub fn format(reported_unix: i64, period_secs: u64) -> String {
    format!(
        "Reported {};period={period_secs}s",
        rfc3339::format_utc(reported_unix)
    )
}

/// Parses a handshake value: `Ok(Some(report))` for a plugin's report, `Ok(None)` for a
/// scheduler's `Requesting…` value (not a plugin's heartbeat), an error otherwise.
pub fn parse(value: &str) -> Result<Option<Report>, HandshakeError> {
    let bad = |problem: &str| HandshakeError {
        value: value.to_owned(),
        problem: problem.to_owned(),
    };
    let text = value.trim();
    if text.starts_with("Requesting") {
        return Ok(None);
    }
    let Some(rest) = text.strip_prefix("Reported") else {
        return Err(bad("it does not start with \"Reported\""));
    };
    let rest = rest
        .strip_prefix(' ')
        .or_else(|| rest.strip_prefix('_'))
        .ok_or_else(|| bad("\"Reported\" is not followed by a space and a time"))?;
    let (time, period) = match rest.split_once(';') {
        Some((time, params)) => {
            let secs = params
                .trim()
                .strip_prefix("period=")
                .and_then(|p| p.strip_suffix('s'))
                .ok_or_else(|| bad("after \";\" it needs period=<seconds>s"))?;
            let secs: u64 = secs
                .parse()
                .map_err(|_| bad("the period is not a whole number of seconds"))?;
            if secs == 0 || secs > MAX_PERIOD_SECS {
                return Err(bad("the period must be 1 to 86400 seconds"));
            }
            (time.trim(), secs)
        }
        None => (rest.trim(), HAMI_DOCUMENTED_PERIOD_SECS),
    };
    if time.is_empty() {
        return Err(bad("the time is missing"));
    }
    // HAMi's documented form carries a local "2006.01.02 15:04:05" time: keep the report,
    // without a time we could read.
    Ok(Some(Report {
        reported_unix: rfc3339::parse(time).ok(),
        period_secs: period,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_are_hamis_documented_form() {
        assert_eq!(key(Vendor::Amd), "hami.io/node-handshake-amd");
        assert_eq!(key(Vendor::Nvidia), "hami.io/node-handshake-nvidia");
    }

    #[test]
    fn round_trip_and_hami_forms() {
        let v = format(1_796_119_200, 30);
        assert_eq!(v, "Reported 2026-12-01T10:00:00Z;period=30s");
        assert_eq!(
            parse(&v).unwrap(),
            Some(Report {
                reported_unix: Some(1_796_119_200),
                period_secs: 30
            })
        );
        assert_eq!(
            parse("Reported_2024.01.02 15:04:05").unwrap(),
            Some(Report {
                reported_unix: None,
                period_secs: HAMI_DOCUMENTED_PERIOD_SECS
            })
        );
        assert_eq!(parse("Requesting_2024-01-02 15:04:05").unwrap(), None);
    }

    #[test]
    fn bad_values_say_what_to_write() {
        for bad in [
            "",
            "alive",
            "Reported",
            "Reported ;period=30s",
            "Reported 2026-12-01T10:00:00Z;period=0s",
            "Reported 2026-12-01T10:00:00Z;period=30",
            "Reported 2026-12-01T10:00:00Z;period=-1s",
            "Reported 2026-12-01T10:00:00Z;period=999999s",
            "Reported 2026-12-01T10:00:00Z;every=30s",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected e.g. \"Reported"), "{bad:?}: {e}");
        }
    }

    proptest! {
        #[test]
        fn format_parses_back(unix in 0i64..4_102_444_800, period in 1u64..=MAX_PERIOD_SECS) {
            let r = parse(&format(unix, period)).unwrap().unwrap();
            prop_assert_eq!(r, Report { reported_unix: Some(unix), period_secs: period });
        }
    }
}
