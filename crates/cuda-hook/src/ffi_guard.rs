//! No panic crosses the FFI boundary: every exported body (`dlsym`, `cuGetProcAddress[_v2]`
//! and every wrapper) runs under [`guarded`], and a panic turns into that export's fallback:
//! out of memory for allocations, NULL from `dlsym`, an error code elsewhere (README,
//! "Internal errors"). The guard is `hami_kernel_locks::ffi_guard::Guard`, logging under this
//! hook's tag; in debug builds only, `VGPU_TEST_PANIC_IN=<name>[,<name>…]` (or `*`,
//! `<name>#<n>`) is its fault switch, for `tests/internal_errors.rs`.

use hami_kernel_locks::ffi_guard::Guard;

/// Read once per process (the fault switch's list, in debug builds).
static GUARD: Guard = Guard::new(crate::log::TAG, "VGPU_TEST_PANIC_IN");

/// Runs `body`; if it panics, logs and returns `fallback`.
#[inline(always)]
pub fn guarded<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    GUARD.guarded(what, fallback, body)
}

/// A place inside the state where a test build can panic (named like an export in
/// `VGPU_TEST_PANIC_IN`); nothing at all in a production build.
#[inline(always)]
pub fn fault_point(what: &str) {
    GUARD.fault_point(what);
}
