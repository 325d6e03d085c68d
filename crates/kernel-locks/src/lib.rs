//! What the hooks and the shared regions need from the kernel, written once: locks that
//! the kernel releases when their holder dies (so SIGKILL never leaves one behind), and
//! one-`write(2)`-per-line logging for code that runs inside users' processes, and the
//! reading of the plugins' read-only per-container hook configuration.
//! std + libc + the dependency-free protocol crate only: both hooks (`libamvgpu.so`,
//! `libvgpu.so`) link it.

pub mod file_lock;
pub mod hook_config_file;
pub mod hook_log;
