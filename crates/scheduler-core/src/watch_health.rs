//! Whether an informer's view can be trusted, as a pure state machine over what its watch
//! loop reports (no clock of its own: every input carries `now`, a monotonic instant).
//!
//! A watch is live once it has listed and, since then, keeps making progress: a list, a
//! watch (re)started, an event, a bookmark, or a normal end of the stream (the server
//! closes each watch after its `timeoutSeconds`, so a live watch shows progress at least
//! that often even on a quiet cluster). It is not live while it has not listed yet, when
//! errors have lasted longer than `error_grace` (one failed re-watch that the next attempt
//! fixes is normal), when nothing came for `stall_after`, or when its task has exited.
//! Filter refuses to decide and `/readyz` is false while either watch is not live.

use std::time::{Duration, Instant};

/// Thresholds of the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTuning {
    /// The `timeoutSeconds` each watch request asks for.
    pub watch_timeout: Duration,
    /// No progress for this long: stalled. Must exceed `watch_timeout`.
    pub stall_after: Duration,
    /// Errors without a success in between for this long: failing.
    pub error_grace: Duration,
}

impl Default for WatchTuning {
    fn default() -> Self {
        WatchTuning {
            watch_timeout: Duration::from_secs(60),
            stall_after: Duration::from_secs(90),
            error_grace: Duration::from_secs(10),
        }
    }
}

/// What the watch loop reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchReport {
    /// A full list was applied to the state.
    Listed,
    /// A watch request was answered; events will follow.
    WatchStarted,
    /// An event or a bookmark.
    Event,
    /// The server ended the stream normally (its timeout).
    StreamEnded,
    /// A list or watch failed, or the stream broke or stalled.
    Error(String),
    /// The loop's task ended (it panicked or returned); the supervisor restarts it.
    TaskExited(String),
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Listed, and making progress.
    Live,
    /// Not listed yet (or relisting after a restart).
    NotListed,
    /// Errors without a success for longer than the grace (or before the first list).
    Failing {
        /// Since the first of them.
        for_: Duration,
        /// The latest error.
        error: String,
    },
    /// No event, bookmark or new request for longer than `stall_after`.
    Stalled {
        /// Since the last progress.
        for_: Duration,
    },
    /// The watch task ended; the supervisor restarts it.
    Dead {
        /// Why it ended.
        error: String,
    },
}

impl Verdict {
    /// Whether filter may trust this watch.
    pub fn is_live(&self) -> bool {
        *self == Verdict::Live
    }
}

/// A watch's health, fed [`WatchReport`]s; a pure state machine (the clock is passed in).
#[derive(Debug, Clone)]
pub struct WatchHealth {
    listed: bool,
    last_progress: Instant,
    /// First error since the last success, and the latest error text.
    failing_since: Option<(Instant, String)>,
    dead: Option<String>,
}

impl WatchHealth {
    /// A watch that has not listed yet, last making progress at `now`.
    pub fn new(now: Instant) -> Self {
        WatchHealth {
            listed: false,
            last_progress: now,
            failing_since: None,
            dead: None,
        }
    }

    /// Takes in what the watch loop saw at `now`.
    pub fn report(&mut self, report: WatchReport, now: Instant) {
        match report {
            WatchReport::Listed => {
                self.listed = true;
                self.success(now);
            }
            WatchReport::WatchStarted | WatchReport::Event | WatchReport::StreamEnded => {
                self.success(now)
            }
            WatchReport::Error(error) => {
                let since = self.failing_since.take().map_or(now, |(t, _)| t);
                self.failing_since = Some((since, error));
            }
            WatchReport::TaskExited(error) => {
                // A restarted task lists again before its view counts.
                self.listed = false;
                self.dead = Some(error);
            }
        }
    }

    fn success(&mut self, now: Instant) {
        self.last_progress = now;
        self.failing_since = None;
        self.dead = None;
    }

    /// The verdict at `now` under `tuning`.
    pub fn verdict(&self, tuning: &WatchTuning, now: Instant) -> Verdict {
        if let Some(error) = &self.dead {
            return Verdict::Dead {
                error: error.clone(),
            };
        }
        if let Some((since, error)) = &self.failing_since {
            let for_ = now.saturating_duration_since(*since);
            if for_ > tuning.error_grace || !self.listed {
                return Verdict::Failing {
                    for_,
                    error: error.clone(),
                };
            }
        }
        if !self.listed {
            return Verdict::NotListed;
        }
        let quiet = now.saturating_duration_since(self.last_progress);
        if quiet > tuning.stall_after {
            return Verdict::Stalled { for_: quiet };
        }
        Verdict::Live
    }
}

/// The sentence filter and `/readyz` give for a verdict about the `kind` watch.
pub fn explain(kind: &str, verdict: &Verdict) -> Option<String> {
    match verdict {
        Verdict::Live => None,
        Verdict::NotListed => Some(format!(
            "the scheduler has not finished listing {kind} yet; retry"
        )),
        Verdict::Failing { for_, error } => Some(format!(
            "the {kind} watch has been failing for {}s ({error}); the scheduler's view of {kind} may be stale, so it does not decide until the watch recovers",
            for_.as_secs()
        )),
        Verdict::Stalled { for_ } => Some(format!(
            "the {kind} watch delivered nothing for {}s; the scheduler's view of {kind} may be frozen, so it does not decide until the watch recovers",
            for_.as_secs()
        )),
        Verdict::Dead { error } => Some(format!(
            "the {kind} watch task ended ({error}); it is being restarted, and the scheduler does not decide until it has listed again"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tuning() -> WatchTuning {
        WatchTuning {
            watch_timeout: Duration::from_secs(10),
            stall_after: Duration::from_secs(15),
            error_grace: Duration::from_secs(3),
        }
    }

    #[test]
    fn lifecycle() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let t = tuning();
        let mut h = WatchHealth::new(t0);
        assert_eq!(h.verdict(&t, t0), Verdict::NotListed);
        // Errors before the first list are reported at once (nothing to fall back on).
        h.report(WatchReport::Error("connection refused".into()), at(1));
        assert!(matches!(h.verdict(&t, at(1)), Verdict::Failing { .. }));
        h.report(WatchReport::Listed, at(2));
        h.report(WatchReport::WatchStarted, at(2));
        assert_eq!(h.verdict(&t, at(2)), Verdict::Live);
        // A quiet cluster: the server ends the stream every 10 s, which is progress.
        h.report(WatchReport::StreamEnded, at(12));
        h.report(WatchReport::WatchStarted, at(12));
        assert_eq!(h.verdict(&t, at(26)), Verdict::Live);
        // A broken stream that the next attempt fixes stays live.
        h.report(WatchReport::Error("reset by peer".into()), at(20));
        assert_eq!(h.verdict(&t, at(22)), Verdict::Live);
        h.report(WatchReport::WatchStarted, at(22));
        // Errors that last: failing, with the error, until a success.
        h.report(WatchReport::Error("503".into()), at(30));
        h.report(WatchReport::Error("503 again".into()), at(33));
        assert_eq!(
            h.verdict(&t, at(34)),
            Verdict::Failing {
                for_: Duration::from_secs(4),
                error: "503 again".into()
            }
        );
        h.report(WatchReport::WatchStarted, at(35));
        assert_eq!(h.verdict(&t, at(35)), Verdict::Live);
        // Nothing at all: stalled.
        assert_eq!(
            h.verdict(&t, at(51)),
            Verdict::Stalled {
                for_: Duration::from_secs(16)
            }
        );
        h.report(WatchReport::Event, at(52));
        assert_eq!(h.verdict(&t, at(52)), Verdict::Live);
        // The task died: dead until the restarted task has listed.
        h.report(WatchReport::TaskExited("panicked".into()), at(53));
        assert!(matches!(h.verdict(&t, at(53)), Verdict::Dead { .. }));
        h.report(WatchReport::WatchStarted, at(54));
        assert_eq!(h.verdict(&t, at(54)), Verdict::NotListed);
        h.report(WatchReport::Listed, at(55));
        assert_eq!(h.verdict(&t, at(55)), Verdict::Live);
        assert!(
            explain("pods", &h.verdict(&t, at(80)))
                .unwrap()
                .contains("pods watch delivered nothing for 25s")
        );
    }

    proptest! {
        /// Live implies: listed since the last task exit, progress within stall_after,
        /// and no error streak longer than error_grace.
        #[test]
        fn live_means_fresh(reports in proptest::collection::vec((0u8..6, 0u64..8), 1..60)) {
            let t = tuning();
            let t0 = Instant::now();
            let mut h = WatchHealth::new(t0);
            let mut now = t0;
            let (mut listed, mut last_ok, mut streak): (bool, Instant, Option<Instant>) = (false, t0, None);
            for (kind, dt) in reports {
                now += Duration::from_secs(dt);
                let r = match kind {
                    0 => WatchReport::Listed,
                    1 => WatchReport::WatchStarted,
                    2 => WatchReport::Event,
                    3 => WatchReport::StreamEnded,
                    4 => WatchReport::Error("e".into()),
                    _ => WatchReport::TaskExited("x".into()),
                };
                match &r {
                    WatchReport::Listed => { listed = true; last_ok = now; streak = None; }
                    WatchReport::Error(_) => { streak.get_or_insert(now); }
                    WatchReport::TaskExited(_) => { listed = false; streak = None; last_ok = t0; }
                    _ => { last_ok = now; streak = None; }
                }
                h.report(r, now);
                if h.verdict(&t, now).is_live() {
                    prop_assert!(listed);
                    prop_assert!(now.duration_since(last_ok) <= t.stall_after);
                    prop_assert!(streak.is_none_or(|s| now.duration_since(s) <= t.error_grace));
                }
            }
        }
    }
}
