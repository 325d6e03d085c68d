//! Stand-in CUDA driver, `libcuda.so.1` (SPEC §8). See README.md.
//!
//! - [`fake_state`]: devices shared by all processes through a mapped file (memory in use,
//!   per-process busy time); the stand-in NVML includes the same file.
//! - `driver`: initialisation, contexts, allocations of this process.
//! - `api`: the exported `cu*` functions (real C ABI).
//! - `proc_address`: `cuGetProcAddress[_v2]` with the driver's version/flags rules.

mod api;
mod driver;
pub mod fake_state;
mod proc_address;
