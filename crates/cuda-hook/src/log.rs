//! Logging to stderr at `LIBCUDA_LOG_LEVEL` (1 error, 2 warning, 3 info, 4 debug; default 2), through
//! `hami_kernel_locks::hook_log`, tagged `vgpu`.

pub use hami_kernel_locks::hook_log::{DEBUG, ERROR, INFO, WARN, enabled, parse_level, set_level};

hami_kernel_locks::hook_logger!("vgpu");
