//! Logging to stderr at `LIBCUDA_LOG_LEVEL` (1 error, 2 warning, 3 info, 4 debug; default 2), through
//! `hami_kernel_locks::hook_log`, tagged `vgpu`.

use std::fmt::Arguments;

use hami_kernel_locks::hook_log::emit;
pub use hami_kernel_locks::hook_log::{DEBUG, ERROR, INFO, WARN, enabled, parse_level, set_level};

/// The tag of every line this hook logs.
pub(crate) const TAG: &str = "vgpu";

/// An error: something refused or failed.
pub fn error(args: Arguments<'_>) {
    emit(TAG, ERROR, args);
}
/// A warning: something the operator should know.
pub fn warn(args: Arguments<'_>) {
    emit(TAG, WARN, args);
}
/// Information (written at level 3 and above).
pub fn info(args: Arguments<'_>) {
    emit(TAG, INFO, args);
}
/// Detail (written at level 4).
pub fn debug(args: Arguments<'_>) {
    emit(TAG, DEBUG, args);
}
