//! A capped doubling backoff: the wait after each failure doubles from `initial` up to
//! `cap`, and a success starts again from `initial`. Pure (no clock: the caller sleeps).
//!
//! Deterministic on purpose, unlike the node-lock client's jittered, deadline-bound
//! `hami_plugin_core::node_lock_client::Backoff`: an informer retries alone (no peer to
//! fall into lockstep with) and has no deadline, it retries until it works.

use std::time::Duration;

/// Capped doubling backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubling {
    initial: Duration,
    cap: Duration,
    next: Duration,
}

impl Doubling {
    /// Starts at `initial` (at most `cap`) and doubles up to `cap`.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        let initial = initial.min(cap);
        Doubling {
            initial,
            cap,
            next: initial,
        }
    }

    /// After a failure: how long to wait before the next attempt (the one after waits
    /// twice as long, up to the cap).
    pub fn fail(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        wait
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// The wait the next failure would get.
    pub fn peek(&self) -> Duration {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Doubling::new(ms(100), ms(500));
        let waits: Vec<Duration> = (0..5).map(|_| b.fail()).collect();
        assert_eq!(waits, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.fail(), ms(100));
        // An initial above the cap is held to the cap.
        assert_eq!(Doubling::new(ms(900), ms(500)).fail(), ms(500));
    }

    proptest! {
        /// Whatever the order of failures and successes: no wait exceeds the cap, the
        /// first failure after a success waits `initial`, and each further failure waits
        /// twice the previous one or the cap.
        #[test]
        fn capped_and_reset(initial in 1u64..2_000, cap in 1u64..20_000, ops in proptest::collection::vec(any::<bool>(), 1..80)) {
            let (initial, cap) = (Duration::from_millis(initial), Duration::from_millis(cap));
            let mut b = Doubling::new(initial, cap);
            let mut last: Option<Duration> = None;
            for failed in ops {
                if !failed {
                    b.reset();
                    last = None;
                    continue;
                }
                let wait = b.fail();
                prop_assert!(wait <= cap);
                match last {
                    None => prop_assert_eq!(wait, initial.min(cap)),
                    Some(prev) => prop_assert_eq!(wait, (prev * 2).min(cap)),
                }
                last = Some(wait);
            }
        }
    }
}
