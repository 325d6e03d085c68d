//! When a device plugin re-publishes its node and re-checks device health (pure). Both
//! plugins' publisher loops (`plugin.rs`) sleep [`RefreshSchedule::sleep`], ask
//! [`RefreshSchedule::tick`] what is due, do it, and report a publication's outcome with
//! [`RefreshSchedule::published`]. Time is passed in.
//!
//! The rules: the first periodic publication is one interval after the start (the plugin
//! publishes once before serving); after a publication the next is one interval later, or
//! [`RefreshPolicy::retry_after_failure`] later when it failed. With a health period the
//! loop wakes every `min(health period, interval)`, re-checks health at every wake and
//! publishes at the first wake at or after the publication is due; without one it wakes
//! only to publish.

use std::time::{Duration, Instant};

/// The periods of one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefreshPolicy {
    /// Between two publications that succeeded.
    pub interval: Duration,
    /// After a publication that failed.
    pub retry_after_failure: Duration,
    /// How often device health is re-checked between publications; `None`: only by
    /// publishing.
    pub health_every: Option<Duration>,
}

/// What is due at a wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// Re-check device health.
    pub health: bool,
    /// Publish the node (then call [`RefreshSchedule::published`]).
    pub publish: bool,
}

/// The schedule of one publisher loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefreshSchedule {
    policy: RefreshPolicy,
    next_publish: Instant,
}

impl RefreshSchedule {
    /// A schedule started at `now`, just after the first publication.
    pub fn new(policy: RefreshPolicy, now: Instant) -> Self {
        RefreshSchedule {
            policy,
            next_publish: now + policy.interval,
        }
    }

    /// When the next publication is due.
    pub fn next_publish(&self) -> Instant {
        self.next_publish
    }

    /// How long to sleep from `now` before the next wake.
    pub fn sleep(&self, now: Instant) -> Duration {
        match self.policy.health_every {
            Some(health) => health.min(self.policy.interval),
            None => self.next_publish.saturating_duration_since(now),
        }
    }

    /// What is due at a wake at `now`.
    pub fn tick(&self, now: Instant) -> Due {
        Due {
            health: self.policy.health_every.is_some(),
            publish: now >= self.next_publish,
        }
    }

    /// A publication ended at `now`; `ok` whether it succeeded.
    pub fn published(&mut self, now: Instant, ok: bool) {
        let wait = if ok {
            self.policy.interval
        } else {
            self.policy.retry_after_failure
        };
        self.next_publish = now + wait;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn without_health_it_wakes_only_to_publish() {
        let t0 = Instant::now();
        let policy = RefreshPolicy {
            interval: 30 * S,
            retry_after_failure: 5 * S,
            health_every: None,
        };
        let mut s = RefreshSchedule::new(policy, t0);
        assert_eq!(s.sleep(t0), 30 * S);
        let t1 = t0 + 30 * S;
        assert_eq!(
            s.tick(t1),
            Due {
                health: false,
                publish: true
            }
        );
        s.published(t1 + S, false);
        assert_eq!(s.sleep(t1 + S), 5 * S);
        assert!(!s.tick(t1 + 3 * S).publish);
        s.published(t1 + 6 * S, true);
        assert_eq!(s.next_publish(), t1 + 36 * S);
    }

    #[test]
    fn with_health_it_checks_every_wake_and_publishes_when_due() {
        let t0 = Instant::now();
        let policy = RefreshPolicy {
            interval: 30 * S,
            retry_after_failure: 5 * S,
            health_every: Some(10 * S),
        };
        let mut s = RefreshSchedule::new(policy, t0);
        assert_eq!(s.sleep(t0), 10 * S);
        let dues: Vec<Due> = (1..=3).map(|k| s.tick(t0 + k * 10 * S)).collect();
        assert!(dues.iter().all(|d| d.health));
        assert_eq!(
            dues.iter().map(|d| d.publish).collect::<Vec<_>>(),
            [false, false, true]
        );
        s.published(t0 + 30 * S, true);
        assert!(!s.tick(t0 + 40 * S).publish);
        // A health period longer than the interval wakes once per interval.
        let slow = RefreshPolicy {
            health_every: Some(60 * S),
            ..policy
        };
        assert_eq!(RefreshSchedule::new(slow, t0).sleep(t0), 30 * S);
    }

    proptest! {
        /// Driven as the loops drive it: no wake is ever more than an interval (or the
        /// failure retry) away, a due publication happens at the wake that finds it due,
        /// and publications are never closer than the shorter period.
        #[test]
        fn publications_are_never_skipped_or_early(
            interval_s in 1u64..60, retry_s in 1u64..10, health_s in proptest::option::of(1u64..90),
            outcomes in proptest::collection::vec((any::<bool>(), 0u64..3000), 1..40),
        ) {
            let policy = RefreshPolicy {
                interval: Duration::from_secs(interval_s),
                retry_after_failure: Duration::from_secs(retry_s),
                health_every: health_s.map(Duration::from_secs),
            };
            let t0 = Instant::now();
            let mut s = RefreshSchedule::new(policy, t0);
            let mut now = t0;
            let mut last_publish = t0;
            let mut outcomes = outcomes.into_iter();
            for _ in 0..200 {
                let sleep = s.sleep(now);
                prop_assert!(sleep <= policy.interval.max(policy.retry_after_failure));
                now += sleep;
                let due = s.tick(now);
                prop_assert_eq!(due.health, policy.health_every.is_some());
                prop_assert_eq!(due.publish, now >= s.next_publish());
                if policy.health_every.is_none() {
                    prop_assert!(due.publish, "a wake without health always publishes");
                }
                if due.publish {
                    let Some((ok, work_ms)) = outcomes.next() else { break };
                    prop_assert!(now - last_publish >= policy.interval.min(policy.retry_after_failure));
                    now += Duration::from_millis(work_ms);
                    last_publish = now;
                    s.published(now, ok);
                }
            }
        }
    }
}
