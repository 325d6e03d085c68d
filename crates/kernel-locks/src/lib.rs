//! What the hooks and the shared regions need from the kernel, written once: locks that
//! the kernel releases when their holder dies (so SIGKILL never leaves one behind),
//! one-`write(2)`-per-line logging for code that runs inside users' processes, the panic guard
//! every exported hook function runs under (`ffi_guard`), the page that tells a forked child
//! from its parent without a system call (`fork_mark`), and the reading of the plugins'
//! read-only per-container hook configuration; and, for both shared regions, how a lock
//! waiter backs off (`lock_backoff`) and how a region file is created (`private_file`).
//! std + libc + the dependency-free protocol crate only: both hooks (`libamvgpu.so`,
//! `libvgpu.so`) link it.

pub mod ffi_guard;
pub mod file_lock;
pub mod fork_mark;
pub mod hook_config_file;
pub mod hook_log;
pub mod lock_backoff;
pub mod private_file;
pub mod region_file;

/// Tests that fork take this, and so do tests that need a closed file to drop its locks: a
/// child forked meanwhile would hold the same open file description (and so its locks) until
/// it exits.
#[cfg(test)]
pub(crate) static FORK_IN_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
