//! How long this replica may lead after each attempt at the Lease, as a pure state machine
//! that the election loop (`leader::run_with_clock`) drives; which step to take on the
//! Lease (renew, take over, follow) is `leader::LeaseObserver`'s decision.
//!
//! Rules (client-go's renew deadline, measured on this replica's monotonic clock):
//! - the margin is a fifth of the lease duration; an attempt (read, then write) that has not
//!   finished within `lease duration - margin` is abandoned as failed;
//! - an attempt that wrote the Lease makes this replica leader until
//!   `attempt start + lease duration - margin`: from when the attempt *started*, so however
//!   long the request took, leadership ends a margin before any other replica (which waits a
//!   whole lease duration from when it saw the record change) may take over;
//! - an attempt that found another holder, or lost the write race (409), ends leadership now;
//! - an attempt that failed (an error, or the deadline) changes nothing: leadership lapses
//!   by time unless a later attempt renews it.

use std::time::{Duration, Instant};

/// How an attempt at the Lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// This replica wrote the Lease (created, renewed or took it over).
    Won,
    /// Another replica holds it, or wrote first.
    Lost,
    /// The API call failed or the attempt took too long.
    Failed,
}

/// What to do with this replica's leadership after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Leader until this instant.
    Until(Instant),
    /// Not leader, from now.
    End,
    /// Unchanged: lapses at the instant set before, if any.
    Keep,
}

/// A change worth a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// This replica became the leader.
    Became,
    /// This replica lost the Lease to another.
    Lost,
}

/// The answer to an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update {
    /// The leadership to record.
    pub hold: Hold,
    /// Whether leadership started or ended with this attempt.
    pub transition: Option<Transition>,
}

/// One replica's terms of leadership.
#[derive(Debug, Clone)]
pub struct Term {
    lease_duration: Duration,
    margin: Duration,
    leading: bool,
}

impl Term {
    /// Terms under a Lease of `lease_duration`; not leading yet.
    pub fn new(lease_duration: Duration) -> Self {
        Term {
            lease_duration,
            margin: lease_duration / 5,
            leading: false,
        }
    }

    /// How long one attempt may take before it is abandoned: a renewal that takes longer
    /// than the leadership it would extend is of no use.
    pub fn attempt_deadline(&self) -> Duration {
        self.lease_duration - self.margin
    }

    /// Takes in how the attempt that started at `started` ended.
    pub fn on(&mut self, attempt: Attempt, started: Instant) -> Update {
        match attempt {
            Attempt::Won => {
                let transition = (!self.leading).then_some(Transition::Became);
                self.leading = true;
                Update {
                    hold: Hold::Until(started + self.lease_duration - self.margin),
                    transition,
                }
            }
            Attempt::Lost => {
                let transition = self.leading.then_some(Transition::Lost);
                self.leading = false;
                Update {
                    hold: Hold::End,
                    transition,
                }
            }
            Attempt::Failed => Update {
                hold: Hold::Keep,
                transition: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn terms() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Term::new(s(15));
        assert_eq!(t.attempt_deadline(), s(12));
        assert_eq!(
            t.on(Attempt::Lost, t0),
            Update {
                hold: Hold::End,
                transition: None
            }
        );
        assert_eq!(
            t.on(Attempt::Won, t0 + s(1)),
            Update {
                hold: Hold::Until(t0 + s(13)),
                transition: Some(Transition::Became)
            }
        );
        // A renewal: from its own start, no new transition.
        assert_eq!(
            t.on(Attempt::Won, t0 + s(3)),
            Update {
                hold: Hold::Until(t0 + s(15)),
                transition: None
            }
        );
        // A failed renewal keeps what the last success gave (it lapses by time).
        assert_eq!(
            t.on(Attempt::Failed, t0 + s(5)),
            Update {
                hold: Hold::Keep,
                transition: None
            }
        );
        assert_eq!(
            t.on(Attempt::Lost, t0 + s(7)),
            Update {
                hold: Hold::End,
                transition: Some(Transition::Lost)
            }
        );
    }

    proptest! {
        /// Whatever the attempts: leadership never reaches past `start + lease duration -
        /// margin` of the attempt that granted it, so it always ends before another replica
        /// may take over (a lease duration after it saw the record); transitions alternate,
        /// starting with `Became`.
        #[test]
        fn leadership_ends_before_the_lease(duration_s in 1u64..120, attempts in proptest::collection::vec((0u8..3, 0u64..30_000), 1..80)) {
            let base = Instant::now();
            let lease = Duration::from_secs(duration_s);
            let mut term = Term::new(lease);
            prop_assert!(term.attempt_deadline() < lease);
            let mut at = base;
            let mut leading = false;
            for (kind, advance_ms) in attempts {
                at += Duration::from_millis(advance_ms);
                let attempt = [Attempt::Won, Attempt::Lost, Attempt::Failed][kind as usize];
                let before = leading;
                let update = term.on(attempt, at);
                if let Hold::Until(until) = update.hold {
                    prop_assert!(attempt == Attempt::Won);
                    prop_assert!(until < at + lease);
                    prop_assert!(until >= at + lease * 4 / 5);
                }
                match update.transition {
                    Some(Transition::Became) => { prop_assert!(!leading); leading = true; }
                    Some(Transition::Lost) => { prop_assert!(leading); leading = false; }
                    None => {}
                }
                let expect = match attempt {
                    Attempt::Won => true,
                    Attempt::Lost => false,
                    Attempt::Failed => before,
                };
                prop_assert_eq!(leading, expect);
                prop_assert_eq!(update.hold == Hold::Keep, attempt == Attempt::Failed);
            }
        }
    }
}
