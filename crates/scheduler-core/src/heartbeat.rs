//! Is a node's device plugin still refreshing its registration? (issue 17 item 13)
//!
//! Rule: a vendor whose `hami.io/node-handshake-<vendor>` value has not changed for
//! [`MISSED_PERIODS`] of the periods it announces is withdrawn from the node. Time is this
//! scheduler's own monotonic clock, from when it *saw* the value change: the plugin's
//! reported time is never compared with ours (clock skew). First sight counts as a change,
//! so a restarted scheduler waits the full window before judging. A node without the
//! annotation (HAMi's plugins, older plugins) is judged by kubelet's count alone
//! (`snapshot::withdrawn`); a malformed value withdraws the vendor and says why.
//!
//! Pure: plain data and an injected `Instant`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hami_protocol::handshake;
use hami_protocol::names::Vendor;

use crate::fit::refusal;

/// Missed refreshes before a vendor is withdrawn.
pub const MISSED_PERIODS: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// The value and when we saw it change (our clock), with its period.
    Report {
        value: String,
        changed_at: Instant,
        period: Duration,
    },
    Malformed(String),
}

/// The heartbeats of every node, per vendor.
#[derive(Debug, Default)]
pub struct Heartbeats {
    seen: HashMap<String, Vec<(Vendor, Seen)>>,
}

impl Heartbeats {
    /// No heartbeat seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the node's current handshake value of `vendor` (None: no annotation).
    pub fn observe(&mut self, node: &str, vendor: Vendor, value: Option<&str>, now: Instant) {
        let current = self.get(node, vendor);
        let next = match value {
            None => None,
            Some(value) => match current {
                Some(Seen::Report { value: old, .. }) if old == value => return,
                _ => match handshake::parse(value) {
                    Ok(Some(report)) => Some(Seen::Report {
                        value: value.to_owned(),
                        changed_at: now,
                        period: Duration::from_secs(report.period_secs),
                    }),
                    // A scheduler's request is no plugin report: judged by kubelet's count only.
                    Ok(None) => None,
                    Err(e) => Some(Seen::Malformed(format!(
                        "annotation {}: {e}",
                        handshake::key(vendor)
                    ))),
                },
            },
        };
        match next {
            Some(seen) => {
                let list = self.seen.entry(node.to_owned()).or_default();
                list.retain(|(v, _)| *v != vendor);
                list.push((vendor, seen));
            }
            None => {
                if let Some(list) = self.seen.get_mut(node) {
                    list.retain(|(v, _)| *v != vendor);
                    if list.is_empty() {
                        self.seen.remove(node);
                    }
                }
            }
        }
    }

    fn get(&self, node: &str, vendor: Vendor) -> Option<&Seen> {
        self.seen
            .get(node)?
            .iter()
            .find(|(v, _)| *v == vendor)
            .map(|(_, s)| s)
    }

    /// Forgets a node (deleted).
    pub fn forget(&mut self, node: &str) {
        self.seen.remove(node);
    }

    /// Keeps only the nodes `keep` says yes to (after a relist).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.seen.retain(|n, _| keep(n));
    }

    /// Why `vendor` must not be offered on `node` at `now`, if it must not, with the
    /// refusal label (`PluginStale`, or `RegisterInvalid` for a malformed value).
    pub fn verdict(
        &self,
        node: &str,
        vendor: Vendor,
        now: Instant,
    ) -> Option<(&'static str, String)> {
        match self.get(node, vendor)? {
            Seen::Malformed(why) => Some((refusal::REGISTER_INVALID, why.clone())),
            Seen::Report {
                changed_at, period, ..
            } => {
                let window = *period * MISSED_PERIODS;
                let quiet = now.saturating_duration_since(*changed_at);
                (quiet >= window).then(|| {
                    let why = format!(
                        "its {} device plugin stopped refreshing: {} unchanged for {}s ({MISSED_PERIODS} periods of {}s)",
                        vendor.word(),
                        handshake::key(vendor),
                        quiet.as_secs(),
                        period.as_secs()
                    );
                    (refusal::PLUGIN_STALE, why)
                })
            }
        }
    }

    /// The earliest moment after `now` at which a verdict on `node` may change by time alone.
    pub fn node_deadline(&self, node: &str, now: Instant) -> Option<Instant> {
        deadline(self.seen.get(node).into_iter().flatten(), now)
    }

    /// The earliest moment after `now` at which some verdict may change by time alone.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        deadline(self.seen.values().flatten(), now)
    }
}

fn deadline<'a>(seen: impl Iterator<Item = &'a (Vendor, Seen)>, now: Instant) -> Option<Instant> {
    seen.filter_map(|(_, s)| match s {
        Seen::Report {
            changed_at, period, ..
        } => Some(*changed_at + *period * MISSED_PERIODS),
        Seen::Malformed(_) => None,
    })
    .filter(|t| *t > now)
    .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(t: i64) -> String {
        handshake::format(t, 10)
    }

    #[test]
    fn withdrawn_after_three_quiet_periods_back_on_change() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = Heartbeats::new();
        h.observe("n", Vendor::Amd, Some(&v(100)), t0);
        assert_eq!(h.verdict("n", Vendor::Amd, t0 + s(29)), None);
        // The same value again is no refresh.
        h.observe("n", Vendor::Amd, Some(&v(100)), t0 + s(20));
        let (label, why) = h.verdict("n", Vendor::Amd, t0 + s(30)).unwrap();
        assert_eq!(label, "PluginStale");
        assert!(
            why.contains("hami.io/node-handshake-amd unchanged for 30s"),
            "{why}"
        );
        assert_eq!(h.verdict("n", Vendor::Nvidia, t0 + s(30)), None);
        // A new value, even with an older reported time (the plugin's clock went back): a change.
        h.observe("n", Vendor::Amd, Some(&v(50)), t0 + s(31));
        assert_eq!(h.verdict("n", Vendor::Amd, t0 + s(60)), None);
        assert_eq!(h.next_deadline(t0 + s(31)), Some(t0 + s(61)));
        // The annotation removed: no heartbeat verdict.
        h.observe("n", Vendor::Amd, None, t0 + s(100));
        assert_eq!(h.verdict("n", Vendor::Amd, t0 + s(500)), None);
    }

    #[test]
    fn first_sight_counts_as_a_change_whatever_the_reported_time() {
        // A value reported a year ago (or by a skewed clock) seen now: fresh for 3 periods.
        let t0 = Instant::now();
        let mut h = Heartbeats::new();
        h.observe("n", Vendor::Nvidia, Some(&handshake::format(0, 30)), t0);
        assert_eq!(
            h.verdict("n", Vendor::Nvidia, t0 + Duration::from_secs(89)),
            None
        );
        assert!(
            h.verdict("n", Vendor::Nvidia, t0 + Duration::from_secs(90))
                .is_some()
        );
    }

    #[test]
    fn malformed_withdraws_and_requesting_is_ignored() {
        let t0 = Instant::now();
        let mut h = Heartbeats::new();
        h.observe("n", Vendor::Amd, Some("alive"), t0);
        let (label, why) = h.verdict("n", Vendor::Amd, t0).unwrap();
        assert_eq!(label, "RegisterInvalid");
        assert!(
            why.contains("hami.io/node-handshake-amd") && why.contains("Reported"),
            "{why}"
        );
        h.observe("n", Vendor::Amd, Some("Requesting_2024-01-02 15:04:05"), t0);
        assert_eq!(
            h.verdict("n", Vendor::Amd, t0 + Duration::from_secs(999)),
            None
        );
        h.observe("m", Vendor::Amd, Some(&v(1)), t0);
        h.forget("m");
        assert_eq!(
            h.verdict("m", Vendor::Amd, t0 + Duration::from_secs(999)),
            None
        );
    }

    proptest! {
        /// Whatever the sequence of observations, a vendor is withdrawn at `now` exactly when
        /// the last change we saw is at least 3 periods old.
        #[test]
        fn verdict_follows_the_last_change(steps in proptest::collection::vec((0u64..15, 0i64..4), 1..30)) {
            let t0 = Instant::now();
            let mut h = Heartbeats::new();
            let mut at = t0;
            let mut last: Option<(i64, Instant)> = None;
            for (advance, value) in steps {
                at += Duration::from_secs(advance);
                h.observe("n", Vendor::Amd, Some(&v(value)), at);
                if last.is_none_or(|(old, _)| old != value) {
                    last = Some((value, at));
                }
                let changed = last.unwrap().1;
                let expect = at.duration_since(changed) >= Duration::from_secs(30);
                prop_assert_eq!(h.verdict("n", Vendor::Amd, at).is_some(), expect);
            }
        }
    }
}
