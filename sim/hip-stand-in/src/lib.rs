//! A stand-in HIP runtime, `libamdhip64.so` (SONAME `libamdhip64.so.6`): `FAKE_HIP_DEVICE_COUNT`
//! devices of `FAKE_HIP_DEVICE_MEMORY` bytes that really track allocations, exported with
//! HIP's C names, signatures and error codes, so that the memory hook is tested through real
//! dynamic linking. See README.md.
// The C ABI this library exports is its public surface: `pub extern "C"` functions with
// `#[no_mangle]`, reached by the dynamic linker, not by Rust paths; their ABI types are
// `pub` for the same reason. `unreachable_pub` cannot see that, so it is off here only.
#![allow(unreachable_pub)]

pub mod abi;
pub mod allocations;
mod api;
pub mod config;
pub mod cu_mask;
mod device_memory;
pub mod drm_client;
mod runtime;
