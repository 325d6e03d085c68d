//! Stand-in CUDA driver, `libcuda.so.1` (SPEC §8). See README.md.
//!
//! - [`fake_state`]: devices shared by all processes through a mapped file (memory in use,
//!   per-process busy time); the stand-in NVML includes the same file.
//! - `driver`: initialisation, contexts, allocations of this process.
//! - `api`: the exported `cu*` functions (real C ABI).
//! - `proc_address`: `cuGetProcAddress[_v2]` with the driver's version/flags rules.
// The C ABI this library exports is its public surface: `pub extern "C"` functions with
// `#[no_mangle]`, reached by the dynamic linker, not by Rust paths; their ABI types are
// `pub` for the same reason. `unreachable_pub` cannot see that, so it is off here only.
#![allow(unreachable_pub)]

mod api;
mod driver;
pub mod fake_state;
mod proc_address;
