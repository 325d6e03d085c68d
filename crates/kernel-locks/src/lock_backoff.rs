//! How a waiter on a shared-memory lock word waits between attempts, the same for both
//! regions: spin first (the holder is usually mid-update for nanoseconds), then yield the
//! CPU, then sleep briefly, so a holder descheduled or killed costs waiters little CPU.

use std::time::Duration;

/// Attempts after which a waiter stops yielding and sleeps.
pub const YIELD_UNTIL: u32 = 4096;
/// How long a waiter sleeps per attempt once it sleeps.
pub const SLEEP: Duration = Duration::from_micros(50);

/// One wait between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A CPU spin-loop hint.
    Spin,
    /// Give the CPU to another thread (`sched_yield`).
    Yield,
    /// Sleep [`SLEEP`].
    Sleep,
}

/// The wait after failed attempt number `attempts`: spin while under `spins`, yield while
/// under [`YIELD_UNTIL`], then sleep.
pub fn step(attempts: u32, spins: u32) -> Step {
    if attempts < spins {
        Step::Spin
    } else if attempts < YIELD_UNTIL {
        Step::Yield
    } else {
        Step::Sleep
    }
}

/// Waits as [`step`] says.
pub fn wait(attempts: u32, spins: u32) {
    match step(attempts, spins) {
        Step::Spin => std::hint::spin_loop(),
        // std's yield is sched_yield on Linux: no allocation, no panic.
        Step::Yield => std::thread::yield_now(),
        Step::Sleep => std::thread::sleep(SLEEP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_yields_then_sleeps() {
        assert_eq!(step(0, 16), Step::Spin);
        assert_eq!(step(15, 16), Step::Spin);
        assert_eq!(step(16, 16), Step::Yield);
        assert_eq!(step(63, 64), Step::Spin);
        assert_eq!(step(64, 64), Step::Yield);
        assert_eq!(step(YIELD_UNTIL - 1, 64), Step::Yield);
        assert_eq!(step(YIELD_UNTIL, 64), Step::Sleep);
        assert_eq!(step(u32::MAX, 64), Step::Sleep);
    }
}
