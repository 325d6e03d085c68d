//! No panic crosses the FFI boundary: every exported body (the `la_*` callbacks and every
//! wrapper handed out) runs under [`guarded`], and a panic turns into that export's fallback:
//! out of memory for allocations, the linker's own address from `la_symbind64`, a refusal for
//! environment changes (README, "Internal errors"). The guard is
//! `hami_kernel_locks::ffi_guard::Guard`, logging under this hook's tag; in debug builds only,
//! `AMVGPU_TEST_PANIC_IN=<name>[,<name>…]` (or `*`, `<name>#<n>`) is its fault switch, for
//! `tests/it/internal_errors.rs`.

hami_kernel_locks::hook_guard!(crate::log::TAG, "AMVGPU_TEST_PANIC_IN");
