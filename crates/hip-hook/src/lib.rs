//! `libamvgpu.so`: the HIP memory hook, loaded with `LD_AUDIT` (SPEC §5). See README.md.
//!
//! - [`audit`]: the linker callbacks that hand wrappers to callers outside the HIP runtime.
//! - `wrappers`: reserve-before-allocate, frees, limit reporting, pinned `getenv`.
//! - [`config`], [`environ`], [`pinned_env`]: settings from the pod spec and the process.
//! - [`sizing`], [`tracker`]: pure accounting helpers.
//! - `ffi_guard`: the panic guard every exported body runs under (and, in test builds only,
//!   the fault switch that proves it).

// Each unsafe operation in its own block with the reason it holds (issue 19; crate-level
// until the workspace's [lints] table reaches this crate).
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

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
