//! The panic guard both hooks run every exported body under, so that no panic crosses the FFI
//! boundary: a panic is logged (one line, under the hook's tag) and the export returns the
//! fallback its caller gave. `catch_unwind` costs nothing until something panics: no system
//! call, no allocation on the way in.
//!
//! ## Fault injection (debug builds only)
//!
//! In a build with debug assertions (`cargo test`, `cargo build`; never the `--release` build
//! the images ship), the guard's variable (`<name>[,<name>…]`, or `*`) makes the guard of those
//! exports panic before their body runs, so each hook's `tests/it/internal_errors.rs` can check
//! every export's fallback in a real process; `<name>#<n>` panics only the n-th time. A few
//! [`Guard::fault_point`]s inside a hook's state (with its lock held) are named the same way, to
//! poison it. A release build has no such code: no variable can make a production hook panic.
//! (Gated on `debug_assertions` rather than a feature so that every debug build of a hook — its
//! own tests', and the demo's, which links it as a normal dependency — is the same artifact.)

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::hook_log::{ERROR, emit};

/// One hook's guard: its log tag and, in debug builds, its fault switch. Meant to be a
/// `static` of the hook, so the switch is read once per process.
pub struct Guard {
    tag: &'static str,
    #[cfg(debug_assertions)]
    faults: fault::Switch,
}

/// Defines a hook's `guarded` and `fault_point` functions in the module it is invoked in, over
/// one process-wide [`Guard`] logging under `tag` with the fault-switch variable `variable`:
/// `hami_kernel_locks::hook_guard!(crate::log::TAG, "VGPU_TEST_PANIC_IN");`.
#[macro_export]
macro_rules! hook_guard {
    ($tag:expr, $variable:literal) => {
        /// Read once per process (the fault switch's list, in debug builds).
        static GUARD: $crate::ffi_guard::Guard =
            $crate::ffi_guard::Guard::new($tag, $variable);

        /// Runs `body`; if it panics, logs and returns `fallback`.
        #[inline(always)]
        pub fn guarded<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
            GUARD.guarded(what, fallback, body)
        }

        #[doc = concat!(
            "A place inside the state where a test build can panic (named like an export in `",
            $variable,
            "`); nothing at all in a production build."
        )]
        #[inline(always)]
        pub fn fault_point(what: &str) {
            GUARD.fault_point(what);
        }
    };
}

impl Guard {
    /// A guard logging under `tag` whose fault switch (debug builds only) is the environment
    /// variable `variable`.
    pub const fn new(tag: &'static str, variable: &'static str) -> Self {
        #[cfg(not(debug_assertions))]
        let _ = variable;
        Self {
            tag,
            #[cfg(debug_assertions)]
            faults: fault::Switch::new(variable),
        }
    }

    /// Runs `body`; if it panics, logs and returns `fallback`.
    pub fn guarded<T>(&self, what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
        match catch_unwind(AssertUnwindSafe(|| {
            #[cfg(debug_assertions)]
            self.faults.inject(what);
            body()
        })) {
            Ok(value) => value,
            Err(_) => {
                emit(
                    self.tag,
                    ERROR,
                    format_args!("internal error in {what}; failing closed"),
                );
                fallback
            }
        }
    }

    /// A place inside the hook's state where a test build can panic (named like an export in
    /// the switch); nothing at all in a production build.
    #[inline(always)]
    pub fn fault_point(&self, _what: &str) {
        #[cfg(debug_assertions)]
        self.faults.inject(_what);
    }
}

#[cfg(debug_assertions)]
mod fault {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// The list of exports to fail, from the environment.
    pub(super) struct Switch {
        /// The variable naming the exports whose guard panics.
        variable: &'static str,
        /// Read once: the list never changes under a running process.
        names: OnceLock<Option<String>>,
        /// Times each entry of the list (by position) was reached, for `<name>#<n>`.
        hits: [AtomicU64; 8],
    }

    impl Switch {
        pub(super) const fn new(variable: &'static str) -> Self {
            Self {
                variable,
                names: OnceLock::new(),
                hits: [const { AtomicU64::new(0) }; 8],
            }
        }

        /// Panics if the list names `what` (and this is the n-th time, for `<name>#<n>`).
        pub(super) fn inject(&self, what: &str) {
            let names = self.names.get_or_init(|| std::env::var(self.variable).ok());
            if let Some(names) = names {
                self.inject_from(names, what);
            }
        }

        fn inject_from(&self, names: &str, what: &str) {
            for (index, entry) in names.split(',').enumerate() {
                let (name, nth) = match entry.split_once('#') {
                    Some((name, n)) => (name, n.parse::<u64>().ok()),
                    None => (entry, None),
                };
                if name != "*" && name != what {
                    continue;
                }
                let hit = self
                    .hits
                    .get(index)
                    .map_or(1, |h| h.fetch_add(1, Relaxed) + 1);
                if nth.is_none_or(|n| n == hit) {
                    panic!("{} injected a fault into {what}", self.variable);
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::Switch;
        use std::panic::{AssertUnwindSafe, catch_unwind};

        fn panics(switch: &Switch, names: &str, what: &str) -> bool {
            catch_unwind(AssertUnwindSafe(|| switch.inject_from(names, what))).is_err()
        }

        #[test]
        fn names_star_and_nth() {
            let switch = Switch::new("HAMI_TEST_UNSET_SWITCH");
            assert!(panics(&switch, "a,b", "b"));
            assert!(!panics(&switch, "a,b", "c"));
            assert!(panics(&switch, "*", "anything"));
            let nth = Switch::new("HAMI_TEST_UNSET_SWITCH");
            assert!(!panics(&nth, "x,y#2", "y"));
            assert!(panics(&nth, "x,y#2", "y"));
            assert!(!panics(&nth, "x,y#2", "y"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Guard;

    static GUARD: Guard = Guard::new("test", "HAMI_TEST_UNSET_SWITCH");

    #[test]
    fn a_panic_becomes_the_fallback() {
        assert_eq!(GUARD.guarded("ok", 0, || 7), 7);
        assert_eq!(GUARD.guarded("boom", -1, || panic!("inside")), -1);
        GUARD.fault_point("anything");
    }
}
