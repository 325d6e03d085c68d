//! When to try a node-lock operation again: exponential backoff with jitter, bounded by a
//! deadline (pure: the clock and the jitter are passed in).

use std::time::{Duration, Instant};

/// Exponential backoff with jitter, bounded by a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First backoff window.
    pub initial: Duration,
    /// Largest backoff window.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        }
    }
}

/// When to try again. Each wait is drawn from the upper half of a window that doubles
/// from `initial` up to `max` ("equal jitter": two binds contending for one node do not
/// retry in lockstep); no wait ends after the deadline.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    window: Duration,
    deadline: Instant,
    attempts: u32,
}

impl Backoff {
    /// A backoff that starts at `policy.initial` and never waits past `deadline`.
    pub fn new(policy: RetryPolicy, deadline: Instant) -> Self {
        Backoff {
            policy,
            window: policy.initial,
            deadline,
            attempts: 0,
        }
    }

    /// After a failed attempt at `now`: how long to wait before the next one, or `None`
    /// when the deadline leaves no time for it. `jitter` is uniform in [0, 1).
    pub fn next_wait(&mut self, now: Instant, jitter: f64) -> Option<Duration> {
        self.attempts += 1;
        let left = self.deadline.checked_duration_since(now)?;
        let half = self.window / 2;
        let wait = half + half.mul_f64(jitter.clamp(0.0, 1.0));
        self.window = (self.window * 2).min(self.policy.max);
        (wait < left).then_some(wait)
    }

    /// Failed attempts so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_respects_the_deadline() {
        let t0 = Instant::now();
        let policy = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        };
        let mut b = Backoff::new(policy, t0 + Duration::from_secs(10));
        // jitter 0: the lower edge of each window (half of it).
        let waits: Vec<_> = (0..5).map(|_| b.next_wait(t0, 0.0).unwrap()).collect();
        let ms = |d: Duration| d.as_millis();
        assert_eq!(
            waits.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            vec![50, 100, 200, 200, 200]
        );
        assert_eq!(b.attempts(), 5);
        // No wait may end past the deadline.
        let mut b = Backoff::new(policy, t0 + Duration::from_millis(120));
        assert_eq!(b.next_wait(t0, 0.99).map(ms), Some(99));
        assert_eq!(b.next_wait(t0 + Duration::from_millis(100), 0.0), None);
        assert_eq!(b.next_wait(t0 + Duration::from_secs(1), 0.0), None);
        assert_eq!(b.remaining(t0 + Duration::from_secs(1)), Duration::ZERO);
    }

    proptest! {
        #[test]
        fn waits_stay_in_their_window(
            initial_ms in 1u64..500, max_ms in 1u64..5000, jitters in proptest::collection::vec(0.0f64..1.0, 1..30)
        ) {
            let t0 = Instant::now();
            let policy = RetryPolicy { initial: Duration::from_millis(initial_ms), max: Duration::from_millis(max_ms.max(initial_ms)) };
            let mut b = Backoff::new(policy, t0 + Duration::from_secs(3600));
            let mut window = policy.initial;
            let mut elapsed = Duration::ZERO;
            for j in jitters {
                let w = b.next_wait(t0 + elapsed, j).unwrap();
                prop_assert!(w >= window / 2 && w <= window, "{w:?} outside {window:?}");
                prop_assert!(w <= policy.max);
                window = (window * 2).min(policy.max);
                elapsed += w;
            }
        }
    }
}
