//! No panic crosses the FFI boundary: every exported body (`dlsym`, `cuGetProcAddress[_v2]`
//! and every wrapper) runs under [`guarded`], and a panic turns into that export's fallback:
//! out of memory for allocations, NULL from `dlsym`, an error code elsewhere (README,
//! "Internal errors"). The guard is `hami_kernel_locks::ffi_guard::Guard`, logging under this
//! hook's tag; in debug builds only, `VGPU_TEST_PANIC_IN=<name>[,<name>…]` (or `*`,
//! `<name>#<n>`) is its fault switch, for `tests/it/internal_errors.rs`.

hami_kernel_locks::hook_guard!(crate::log::TAG, "VGPU_TEST_PANIC_IN");
