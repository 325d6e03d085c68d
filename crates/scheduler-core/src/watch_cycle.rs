//! What an informer does next, as pure state machines its async shell (`informer.rs`)
//! drives, after kube-runtime's `watcher` state machine: the list/watch cycle
//! ([`WatchCycle`]: when to relist and when to watch again, from which resourceVersion,
//! after which wait) and the supervisor's restarts of a task that ended ([`Restarts`]).
//! No clock and no I/O: each answer says how long to wait, the shell sleeps.
//!
//! The cycle's rules:
//! - a list that succeeds is watched from its resourceVersion at once, and resets the backoff;
//! - a list that fails is retried after the backoff (100 ms doubling to 5 s);
//! - each event or bookmark moves the resume point to its resourceVersion;
//! - a stream the server closes normally (its `timeoutSeconds`) is watched again at once
//!   from the resume point, and resets the backoff;
//! - 410 Gone (the resume point left the server's history), on the watch request or as an
//!   error event, relists at once, keeping the backoff as it was;
//! - any other watch failure (request refused or unanswered, stream broken or stalled, an
//!   error event) watches again from the resume point after the backoff.
//! - a new leadership term (the replica just took over) ends the watch and relists at once,
//!   keeping the backoff: a consistent list shows every write the last leader made, which
//!   the watch may not have delivered yet (D-23).
//!
//! Whether the view counts as live meanwhile is [`crate::watch_health`]'s decision.

use std::time::Duration;

use crate::backoff::Doubling;

/// The list/watch loop's backoff: first wait.
pub const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The list/watch loop's backoff: longest wait.
pub const RETRY_CAP: Duration = Duration::from_secs(5);
/// The supervisor's wait before the first restart of an ended task.
pub const RESTART_INITIAL: Duration = Duration::from_millis(200);
/// The supervisor's longest wait before a restart.
pub const RESTART_CAP: Duration = Duration::from_secs(10);

/// The request to make next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// List everything (page by page), replacing the state's view of the kind.
    List,
    /// Watch from this resourceVersion.
    Watch {
        /// The resume point: the list's or the last event's resourceVersion.
        from: String,
    },
}

/// What to do next, and how long to wait before doing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    /// The request.
    pub step: Step,
    /// The wait before it (zero: at once).
    pub after: Duration,
}

/// How a list or a watch request ended, as the shell saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every page was applied; the list's resourceVersion.
    Listed {
        /// `metadata.resourceVersion` of the last page.
        resource_version: String,
    },
    /// A page request failed or took too long.
    ListFailed,
    /// The server closed the stream normally.
    WatchClosed,
    /// 410 Gone: the resume point is older than the server's history.
    Gone,
    /// The watch request or its stream failed any other way.
    WatchFailed,
    /// This replica began a leadership term: list again before it decides (D-23).
    NewTerm,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Listing,
    Watching { from: String },
}

/// The list/watch cycle of one informer task.
#[derive(Debug, Clone)]
pub struct WatchCycle {
    phase: Phase,
    backoff: Doubling,
}

impl Default for WatchCycle {
    fn default() -> Self {
        Self::new()
    }
}

impl WatchCycle {
    /// A task that starts by listing.
    pub fn new() -> Self {
        WatchCycle {
            phase: Phase::Listing,
            backoff: Doubling::new(RETRY_INITIAL, RETRY_CAP),
        }
    }

    /// The first request: list, at once.
    pub fn start(&self) -> Next {
        Next {
            step: Step::List,
            after: Duration::ZERO,
        }
    }

    /// An event or a bookmark carried this resourceVersion: the next watch resumes there.
    /// Ignored while listing (a list's own version comes with [`Outcome::Listed`]).
    pub fn saw_version(&mut self, resource_version: &str) {
        if let Phase::Watching { from } = &mut self.phase {
            resource_version.clone_into(from);
        }
    }

    /// The current resume point, while watching.
    pub fn resume_point(&self) -> Option<&str> {
        match &self.phase {
            Phase::Listing => None,
            Phase::Watching { from } => Some(from),
        }
    }

    /// Takes in how the last request ended; says what to do next.
    pub fn on(&mut self, outcome: Outcome) -> Next {
        match outcome {
            Outcome::Listed { resource_version } => {
                self.backoff.reset();
                self.phase = Phase::Watching {
                    from: resource_version,
                };
                self.now()
            }
            Outcome::ListFailed => {
                self.phase = Phase::Listing;
                self.later()
            }
            Outcome::WatchClosed => {
                self.backoff.reset();
                self.now()
            }
            Outcome::Gone | Outcome::NewTerm => {
                self.phase = Phase::Listing;
                self.now()
            }
            Outcome::WatchFailed => self.later(),
        }
    }

    fn step(&self) -> Step {
        match &self.phase {
            Phase::Listing => Step::List,
            Phase::Watching { from } => Step::Watch { from: from.clone() },
        }
    }

    fn now(&self) -> Next {
        Next {
            step: self.step(),
            after: Duration::ZERO,
        }
    }

    fn later(&mut self) -> Next {
        Next {
            step: self.step(),
            after: self.backoff.fail(),
        }
    }
}

/// How a supervised task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// It returned (the watch loop never does on purpose).
    Returned,
    /// It panicked.
    Panicked,
    /// It was cancelled: the scheduler is shutting down.
    Cancelled,
}

/// What the supervisor does about an ended task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// Start the task again after this wait.
    After(Duration),
    /// Stop supervising.
    Stop,
}

/// The supervisor's restarts: each wait doubles from 200 ms to 10 s. The backoff never
/// resets: a task that keeps dying is restarted at most every 10 s, however long each
/// run lasted.
#[derive(Debug, Clone)]
pub struct Restarts {
    backoff: Doubling,
}

impl Default for Restarts {
    fn default() -> Self {
        Self::new()
    }
}

impl Restarts {
    /// No restart yet.
    pub fn new() -> Self {
        Restarts {
            backoff: Doubling::new(RESTART_INITIAL, RESTART_CAP),
        }
    }

    /// The task ended so: restart it (after a wait) or stop.
    pub fn on(&mut self, end: TaskEnd) -> Restart {
        match end {
            TaskEnd::Cancelled => Restart::Stop,
            TaskEnd::Returned | TaskEnd::Panicked => Restart::After(self.backoff.fail()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn watch(from: &str, after_ms: u64) -> Next {
        Next {
            step: Step::Watch { from: from.into() },
            after: Duration::from_millis(after_ms),
        }
    }

    fn list(after_ms: u64) -> Next {
        Next {
            step: Step::List,
            after: Duration::from_millis(after_ms),
        }
    }

    #[test]
    fn lists_then_watches_from_the_latest_version() {
        let mut c = WatchCycle::new();
        assert_eq!(c.start(), list(0));
        // List failures back off, doubling; the list is redone.
        assert_eq!(c.on(Outcome::ListFailed), list(100));
        assert_eq!(c.on(Outcome::ListFailed), list(200));
        assert_eq!(
            c.on(Outcome::Listed {
                resource_version: "10".into()
            }),
            watch("10", 0)
        );
        c.saw_version("11");
        c.saw_version("12");
        assert_eq!(c.resume_point(), Some("12"));
        // The server's timeout: watch again at once from the last event.
        assert_eq!(c.on(Outcome::WatchClosed), watch("12", 0));
        // A broken stream: watch again from there, after the backoff (reset by the list).
        assert_eq!(c.on(Outcome::WatchFailed), watch("12", 100));
        c.saw_version("13");
        assert_eq!(c.on(Outcome::WatchFailed), watch("13", 200));
        // A normal close resets the backoff.
        assert_eq!(c.on(Outcome::WatchClosed), watch("13", 0));
        assert_eq!(c.on(Outcome::WatchFailed), watch("13", 100));
    }

    #[test]
    fn a_new_term_relists_at_once_and_keeps_the_backoff() {
        let mut c = WatchCycle::new();
        c.on(Outcome::Listed {
            resource_version: "5".into(),
        });
        assert_eq!(c.on(Outcome::WatchFailed), watch("5", 100));
        assert_eq!(c.on(Outcome::NewTerm), list(0));
        assert_eq!(c.resume_point(), None);
        assert_eq!(c.on(Outcome::ListFailed), list(200));
    }

    #[test]
    fn gone_relists_at_once_and_keeps_the_backoff() {
        let mut c = WatchCycle::new();
        c.on(Outcome::Listed {
            resource_version: "5".into(),
        });
        assert_eq!(c.on(Outcome::WatchFailed), watch("5", 100));
        assert_eq!(c.on(Outcome::Gone), list(0));
        assert_eq!(c.resume_point(), None);
        // Versions seen while listing are no resume point.
        c.saw_version("99");
        assert_eq!(c.resume_point(), None);
        // The backoff was not reset by the 410 (only a list or a normal close resets it).
        assert_eq!(c.on(Outcome::ListFailed), list(200));
        assert_eq!(
            c.on(Outcome::Listed {
                resource_version: "20".into()
            }),
            watch("20", 0)
        );
    }

    #[test]
    fn backoff_caps_at_five_seconds() {
        let mut c = WatchCycle::new();
        let waits: Vec<u128> = (0..8)
            .map(|_| c.on(Outcome::ListFailed).after.as_millis())
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn supervisor_restarts_with_growing_waits_and_stops_when_cancelled() {
        let mut r = Restarts::new();
        let waits: Vec<Restart> = (0..8).map(|_| r.on(TaskEnd::Panicked)).collect();
        let ms = |m| Restart::After(Duration::from_millis(m));
        assert_eq!(
            waits,
            [
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(6400),
                ms(10_000),
                ms(10_000)
            ]
        );
        assert_eq!(r.on(TaskEnd::Returned), ms(10_000));
        assert_eq!(r.on(TaskEnd::Cancelled), Restart::Stop);
    }

    #[derive(Debug, Clone)]
    enum Input {
        Outcome(Outcome),
        Version(u8),
    }

    fn input() -> impl Strategy<Value = Input> {
        prop_oneof![
            (0u8..100).prop_map(|v| Input::Outcome(Outcome::Listed {
                resource_version: format!("l{v}")
            })),
            Just(Input::Outcome(Outcome::ListFailed)),
            Just(Input::Outcome(Outcome::WatchClosed)),
            Just(Input::Outcome(Outcome::Gone)),
            Just(Input::Outcome(Outcome::WatchFailed)),
            Just(Input::Outcome(Outcome::NewTerm)),
            (0u8..100).prop_map(Input::Version),
        ]
    }

    proptest! {
        /// Against a model of the rules: every wait is at most the cap; success (a list,
        /// a normal close) is followed by no wait and resets the backoff; 410 and list
        /// failures lead to a list; every watch resumes from the latest version seen since
        /// the last list, never from before it.
        #[test]
        fn follows_the_model(inputs in proptest::collection::vec(input(), 1..120)) {
            let mut c = WatchCycle::new();
            let mut next = c.start();
            // The model: the resume point (None while listing) and the expected next wait.
            let mut resume: Option<String> = None;
            let mut wait = RETRY_INITIAL;
            for i in inputs {
                let outcome = match i {
                    Input::Version(v) => {
                        let v = format!("e{v}");
                        c.saw_version(&v);
                        if resume.is_some() {
                            resume = Some(v);
                        }
                        continue;
                    }
                    Input::Outcome(o) => o,
                };
                // The shell only reports what the step it made can end in.
                let fits = matches!(
                    (&next.step, &outcome),
                    (Step::List, Outcome::Listed { .. } | Outcome::ListFailed)
                        | (
                            Step::Watch { .. },
                            Outcome::WatchClosed
                                | Outcome::Gone
                                | Outcome::WatchFailed
                                | Outcome::NewTerm
                        )
                );
                if !fits {
                    continue;
                }
                let (expect_wait, success) = match &outcome {
                    Outcome::Listed { resource_version } => {
                        resume = Some(resource_version.clone());
                        (Duration::ZERO, true)
                    }
                    Outcome::WatchClosed => (Duration::ZERO, true),
                    Outcome::Gone | Outcome::NewTerm => {
                        resume = None;
                        (Duration::ZERO, false)
                    }
                    Outcome::ListFailed => {
                        resume = None;
                        (wait, false)
                    }
                    Outcome::WatchFailed => (wait, false),
                };
                let failed = !success && expect_wait > Duration::ZERO;
                next = c.on(outcome);
                prop_assert!(next.after <= RETRY_CAP);
                prop_assert_eq!(next.after, expect_wait);
                if success {
                    wait = RETRY_INITIAL;
                } else if failed {
                    wait = (wait * 2).min(RETRY_CAP);
                }
                match (&next.step, &resume) {
                    (Step::List, None) => {}
                    (Step::Watch { from }, Some(r)) => prop_assert_eq!(from, r),
                    (step, r) => prop_assert!(false, "step {:?} with resume point {:?}", step, r),
                }
            }
        }

        /// The supervisor never waits longer than its cap, and waits grow monotonically.
        #[test]
        fn restarts_capped(ends in proptest::collection::vec(any::<bool>(), 1..40)) {
            let mut r = Restarts::new();
            let mut prev = Duration::ZERO;
            for panicked in ends {
                let end = if panicked { TaskEnd::Panicked } else { TaskEnd::Returned };
                let Restart::After(wait) = r.on(end) else {
                    return Err(TestCaseError::fail("stopped without a cancel"));
                };
                prop_assert!(wait <= RESTART_CAP && wait >= prev);
                prev = wait;
            }
        }
    }
}
