//! `libvgpu.so`: the CUDA hook, loaded with `LD_PRELOAD` (SPEC §6, Appendix A). See README.md.
//!
//! - `symbols`: the real functions (libcuda.so.1, libnvidia-ml.so.1) and the real `dlsym`.
//! - `exports`: the exported wrappers, `dlsym`, `cuGetProcAddress[_v2]`.
//! - `state`: per-process state (settings, region, allocations, device map), fork-aware.
//! - `hami_kernel_locks::hook_config_file`: the plugin's read-only per-container config, read first.
//! - [`config`], [`host_pid`], [`limiter`], [`sizing`]: pure cores.
//! - `sampler`: the utilization thread feeding the region and the limiter.
//! - `ffi_guard`: the panic guard every exported body runs under (and, in test builds only,
//!   the fault switch that proves it).
// The C ABI this library exports is its public surface: `pub extern "C"` functions with
// `#[no_mangle]`, reached by the dynamic linker, not by Rust paths; their ABI types are
// `pub` for the same reason. `unreachable_pub` cannot see that, so it is off here only.
#![allow(unreachable_pub)]

pub mod config;
mod cuda_abi;
mod exports;
mod ffi_guard;
pub mod host_pid;
pub mod limiter;
pub mod log;
mod sampler;
pub mod sizing;
mod state;
mod symbols;
