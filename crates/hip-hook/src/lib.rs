//! `libamvgpu.so`: the HIP memory hook, loaded with `LD_AUDIT` (SPEC §5). See README.md.
//!
//! - [`audit`]: the linker callbacks that hand wrappers to callers outside the HIP runtime.
//! - `wrappers`: reserve-before-allocate, frees, limit reporting, pinned `getenv`.
//! - [`config`], [`environ`], [`pinned_env`]: settings from the pod spec and the process.
//! - [`sizing`], [`tracker`]: pure accounting helpers.
//! - `ffi_guard`: the panic guard every exported body runs under (and, in test builds only,
//!   the fault switch that proves it).
// The C ABI this library exports is its public surface: `pub extern "C"` functions with
// `#[no_mangle]`, reached by the dynamic linker, not by Rust paths; their ABI types are
// `pub` for the same reason. `unreachable_pub` cannot see that, so it is off here only.
#![allow(unreachable_pub)]

pub mod audit;
pub mod config;
pub mod elf_symbols;
pub mod environ;
mod ffi_guard;
mod hip_abi;
pub mod hook_config_file;
pub mod log;
pub mod pinned_env;
pub mod sizing;
mod state;
pub mod symbols;
pub mod tracker;
mod wrappers;
