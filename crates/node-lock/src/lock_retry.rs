//! What the node-lock client does after a failed attempt (pure): wait and try again, or
//! give up with the error the caller sees. The shell (plugin-core's `node_lock_client`)
//! drives it: one API round per attempt, then [`LockRetry::after`] with the clock and a
//! jitter passed in. A wait may end early when the shell learns the node's lock went (the
//! scheduler's node informer wakes waiting binds); the next attempt then follows the same
//! rules, so a wake-up changes when an attempt is made, never what it decides.
//!
//! The rules: a refusal retrying cannot fix ends at once; a transient error or a busy lock
//! waits as [`Backoff`] says; at the deadline the error names a busy lock only when the
//! last attempt found the lock busy (an earlier busy reading followed by API errors is a
//! deadline with the last error, since the lock may have been free by then).

use std::time::{Duration, Instant};

use crate::backoff::{Backoff, RetryPolicy};
use crate::outcome::LockError;

/// How one attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// A transient API error or a conflict: try again. The text is the error.
    Retry(String),
    /// Another pod holds the lock: wait for it.
    Busy {
        /// Who holds the lock, as the lock names it.
        owner: String,
        /// How long it had held it when read.
        age_seconds: i64,
    },
    /// A refusal retrying cannot fix.
    Fail(LockError),
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Sleep this long, then attempt again.
    Wait(Duration),
    /// Stop: the caller returns this error.
    GiveUp(LockError),
}

/// The retry state of one acquire or release.
#[derive(Debug, Clone)]
pub struct LockRetry {
    backoff: Backoff,
    node: String,
    what: &'static str,
    /// `Some(expiry seconds)` when a busy lock is waited for (acquire); a release never
    /// waits for another pod's lock.
    busy_expiry: Option<i64>,
    /// The owner and age of the lock when an attempt last found it busy.
    busy: Option<(String, i64)>,
}

/// What an acquire is doing, in its errors.
pub const ACQUIRING: &str = "taking the node lock";
/// What a release is doing, in its errors.
pub const RELEASING: &str = "releasing the node lock";

impl LockRetry {
    /// Retries of taking `node`'s lock until `deadline`, waiting for a busy lock; a lock
    /// older than `expiry_seconds` is taken over (named in the busy error).
    pub fn acquiring(
        policy: RetryPolicy,
        deadline: Instant,
        node: &str,
        expiry_seconds: i64,
    ) -> Self {
        LockRetry {
            backoff: Backoff::new(policy, deadline),
            node: node.to_owned(),
            what: ACQUIRING,
            busy_expiry: Some(expiry_seconds),
            busy: None,
        }
    }

    /// Retries of releasing `node`'s lock until `deadline`.
    pub fn releasing(policy: RetryPolicy, deadline: Instant, node: &str) -> Self {
        LockRetry {
            backoff: Backoff::new(policy, deadline),
            node: node.to_owned(),
            what: RELEASING,
            busy_expiry: None,
            busy: None,
        }
    }

    /// The backoff (its deadline bounds each API call of the driver).
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// After `failed` at `now`: wait (for how long) or give up (with which error).
    /// `jitter` is uniform in [0, 1).
    pub fn after(&mut self, failed: Attempt, now: Instant, jitter: f64) -> Next {
        let last = match failed {
            Attempt::Fail(e) => return Next::GiveUp(e),
            Attempt::Busy { owner, age_seconds } if self.busy_expiry.is_some() => {
                self.busy = Some((owner, age_seconds));
                None
            }
            // A release is never told of a busy lock (it leaves others' locks alone).
            Attempt::Busy { .. } => Some("the lock is held by another pod".to_owned()),
            Attempt::Retry(text) => Some(text),
        };
        if let Some(wait) = self.backoff.next_wait(now, jitter) {
            return Next::Wait(wait);
        }
        let attempts = self.backoff.attempts();
        Next::GiveUp(match (self.busy.take(), last, self.busy_expiry) {
            (Some((owner, age_seconds)), None, Some(expiry_seconds)) => LockError::Busy {
                node: self.node.clone(),
                owner,
                age_seconds,
                expiry_seconds,
                attempts,
            },
            (_, last, _) => LockError::Deadline {
                node: self.node.clone(),
                what: self.what,
                attempts,
                last: last.unwrap_or_else(|| "the lock stayed busy".into()),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        }
    }

    fn busy() -> Attempt {
        Attempt::Busy {
            owner: "ns/a".into(),
            age_seconds: 7,
        }
    }

    #[test]
    fn a_refusal_ends_at_once_without_counting_an_attempt() {
        let t0 = Instant::now();
        let mut r = LockRetry::acquiring(policy(), t0 + Duration::from_secs(10), "n", 60);
        let refused = LockError::Refused {
            node: "n".into(),
            what: ACQUIRING,
            error: "403".into(),
        };
        assert_eq!(
            r.after(Attempt::Fail(refused.clone()), t0, 0.5),
            Next::GiveUp(refused)
        );
        assert_eq!(r.backoff().attempts(), 0);
    }

    #[test]
    fn busy_until_the_deadline_names_the_owner() {
        let t0 = Instant::now();
        let mut r = LockRetry::acquiring(policy(), t0 + Duration::from_millis(120), "n", 60);
        assert_eq!(
            r.after(busy(), t0, 0.0),
            Next::Wait(Duration::from_millis(50))
        );
        let t1 = t0 + Duration::from_millis(110);
        assert_eq!(
            r.after(busy(), t1, 0.0),
            Next::GiveUp(LockError::Busy {
                node: "n".into(),
                owner: "ns/a".into(),
                age_seconds: 7,
                expiry_seconds: 60,
                attempts: 2,
            })
        );
    }

    #[test]
    fn an_error_after_a_busy_reading_is_a_deadline_with_that_error() {
        let t0 = Instant::now();
        let mut r = LockRetry::acquiring(policy(), t0 + Duration::from_millis(120), "n", 60);
        assert!(matches!(r.after(busy(), t0, 0.0), Next::Wait(_)));
        let late = t0 + Duration::from_secs(1);
        assert_eq!(
            r.after(Attempt::Retry("409 Conflict".into()), late, 0.0),
            Next::GiveUp(LockError::Deadline {
                node: "n".into(),
                what: ACQUIRING,
                attempts: 2,
                last: "409 Conflict".into(),
            })
        );
    }

    #[test]
    fn a_release_treats_busy_as_an_error_and_names_itself() {
        let t0 = Instant::now();
        let mut r = LockRetry::releasing(policy(), t0, "n");
        assert_eq!(
            r.after(busy(), t0, 0.0),
            Next::GiveUp(LockError::Deadline {
                node: "n".into(),
                what: RELEASING,
                attempts: 1,
                last: "the lock is held by another pod".into(),
            })
        );
    }

    proptest! {
        /// Never waits past the deadline, never longer than the cap, and every failure
        /// but a refusal counts one attempt.
        #[test]
        fn waits_are_capped_and_end_before_the_deadline(
            deadline_ms in 0u64..3000,
            steps in proptest::collection::vec((0u8..2, 0.0f64..1.0, 0u64..300), 1..40),
        ) {
            let t0 = Instant::now();
            let deadline = t0 + Duration::from_millis(deadline_ms);
            let mut r = LockRetry::acquiring(policy(), deadline, "n", 60);
            let mut now = t0;
            for (n, (kind, jitter, work_ms)) in steps.into_iter().enumerate() {
                now += Duration::from_millis(work_ms);
                let failed = if kind == 0 { busy() } else { Attempt::Retry("e".into()) };
                match r.after(failed, now, jitter) {
                    Next::Wait(w) => {
                        prop_assert!(w <= policy().max);
                        prop_assert!(now + w < deadline);
                        now += w;
                    }
                    Next::GiveUp(e) => {
                        let attempts = match e {
                            LockError::Busy { attempts, .. } => attempts,
                            LockError::Deadline { attempts, .. } => attempts,
                            LockError::Refused { .. } => unreachable!("no refusal was fed"),
                        };
                        prop_assert_eq!(attempts as usize, n + 1);
                        break;
                    }
                }
            }
        }
    }
}
