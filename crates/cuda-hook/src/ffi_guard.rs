//! No panic crosses the FFI boundary: every exported body (`dlsym`, `cuGetProcAddress[_v2]`
//! and every wrapper) runs under [`guarded`], and a panic turns into that export's fallback:
//! out of memory for allocations, NULL from `dlsym`, an error code elsewhere (README,
//! "Internal errors"). `catch_unwind` costs nothing until something panics: no system call, no
//! allocation on the way in.
//!
//! ## Fault injection (debug builds only)
//!
//! In a build with debug assertions (`cargo test`, `cargo build`; never the `--release` build
//! the images ship), `VGPU_TEST_PANIC_IN=<name>[,<name>…]` (or `*`) makes the guard of those
//! exports panic before their body runs, so `tests/internal_errors.rs` can check every export's
//! fallback in a real process; `<name>#<n>` panics only the n-th time. A few [`fault_point`]s
//! inside the state (with its lock held) are named the same way, to poison it. A release
//! library has no such code: no variable can make a production hook panic. (Gated on
//! `debug_assertions` rather than a feature so that every debug build of the hook — its own
//! tests', and the demo's, which links it as a normal dependency — is the same artifact.)

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body`; if it panics, logs and returns `fallback`.
pub fn guarded<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(|| {
        #[cfg(debug_assertions)]
        fault::inject(what);
        body()
    })) {
        Ok(value) => value,
        Err(_) => {
            crate::log::error(format_args!("internal error in {what}; failing closed"));
            fallback
        }
    }
}

/// A place inside the state where a test build can panic (named like an export in
/// `VGPU_TEST_PANIC_IN`); nothing at all in a production build.
#[inline(always)]
pub fn fault_point(_what: &str) {
    #[cfg(debug_assertions)]
    fault::inject(_what);
}

#[cfg(debug_assertions)]
mod fault {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// The variable naming the exports whose guard panics.
    pub const VARIABLE: &str = "VGPU_TEST_PANIC_IN";

    /// Read once: the list never changes under a running process.
    static NAMES: OnceLock<Option<String>> = OnceLock::new();
    /// Times each entry of the list (by position) was reached, for `<name>#<n>`.
    static HITS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

    pub fn inject(what: &str) {
        let names = NAMES.get_or_init(|| std::env::var(VARIABLE).ok());
        let Some(names) = names else {
            return;
        };
        for (index, entry) in names.split(',').enumerate() {
            let (name, nth) = match entry.split_once('#') {
                Some((name, n)) => (name, n.parse::<u64>().ok()),
                None => (entry, None),
            };
            if name != "*" && name != what {
                continue;
            }
            let hit = HITS.get(index).map_or(1, |h| h.fetch_add(1, Relaxed) + 1);
            if nth.is_none_or(|n| n == hit) {
                panic!("{VARIABLE} injected a fault into {what}");
            }
        }
    }
}
