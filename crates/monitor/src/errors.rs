//! Skipped inputs: one `hami_monitor_errors_total{kind}` counter per kind and a rate-limited
//! warning per (kind, subject), so that a broken file seen every scan logs once per
//! interval instead of flooding the log, while the counter still counts every occurrence.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the same (kind, subject) may warn.
pub const WARN_INTERVAL: Duration = Duration::from_secs(300);

/// Decides whether a warning may be logged now (pure: time is passed in).
#[derive(Debug, Default)]
pub struct WarnLimiter {
    last: HashMap<(String, String), Instant>,
}

impl WarnLimiter {
    /// True when `(kind, subject)` has not warned within `interval` before `now`.
    pub fn allow(&mut self, kind: &str, subject: &str, now: Instant, interval: Duration) -> bool {
        let key = (kind.to_owned(), subject.to_owned());
        match self.last.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < interval => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }

    /// Forgets subjects that have not warned for `interval` (bounded memory).
    pub fn prune(&mut self, now: Instant, interval: Duration) {
        self.last
            .retain(|_, at| now.saturating_duration_since(*at) < interval);
    }
}

/// Error counters and the warning limiter, shared by the scan and the scrape.
#[derive(Debug, Default)]
pub struct ErrorLog {
    counts: Mutex<BTreeMap<&'static str, u64>>,
    limiter: Mutex<WarnLimiter>,
}

impl ErrorLog {
    /// Counts one occurrence of `kind` and warns about `subject` unless it warned recently.
    pub fn record(&self, kind: &'static str, subject: &str, message: &dyn std::fmt::Display) {
        {
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            *counts.entry(kind).or_insert(0) += 1;
        }
        let now = Instant::now();
        let allowed = {
            let mut limiter = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
            if limiter.last.len() > 10_000 {
                limiter.prune(now, WARN_INTERVAL);
            }
            limiter.allow(kind, subject, now, WARN_INTERVAL)
        };
        if allowed {
            tracing::warn!(
                kind,
                subject,
                "skipped: {message} (further warnings about this are suppressed for {}s)",
                WARN_INTERVAL.as_secs()
            );
        }
    }

    /// Every kind seen so far and its count.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_once_per_interval_per_subject() {
        let mut limiter = WarnLimiter::default();
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        assert!(limiter.allow("k", "a", t0, minute));
        assert!(!limiter.allow("k", "a", t0 + Duration::from_secs(59), minute));
        assert!(limiter.allow("k", "b", t0, minute), "other subject");
        assert!(limiter.allow("j", "a", t0, minute), "other kind");
        assert!(limiter.allow("k", "a", t0 + minute, minute));
        limiter.prune(t0 + minute * 3, minute);
        assert!(limiter.last.is_empty());
    }

    #[test]
    fn every_occurrence_is_counted() {
        let log = ErrorLog::default();
        for _ in 0..3 {
            log.record("cache_truncated", "/x", &"short");
        }
        log.record("dir_no_pod", "/y", &"gone");
        let counts = log.counts();
        assert_eq!(counts["cache_truncated"], 3);
        assert_eq!(counts["dir_no_pod"], 1);
    }
}
