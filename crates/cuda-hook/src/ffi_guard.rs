//! No panic crosses the FFI boundary: every exported body runs under `catch_unwind`, and a
//! panic turns into the caller-chosen fallback (fail closed for allocations).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body`; if it panics, logs and returns `fallback`.
pub fn guarded<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            crate::log::error(format_args!("internal error in {what}; failing closed"));
            fallback
        }
    }
}
