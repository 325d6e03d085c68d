//! Logging to stderr for code running inside users' processes (the hooks): levels 1 error,
//! 2 warning (default), 3 info, 4 debug, read from each hook's own variable
//! (`LIBHIP_LOG_LEVEL`, `LIBCUDA_LOG_LEVEL`). One `write(2)` per line so that lines of
//! concurrent processes do not mix; no allocation failure or write error is ever reported.

use std::fmt::{Arguments, Write as _};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

static LEVEL: AtomicU8 = AtomicU8::new(WARN);

/// Only errors.
pub const ERROR: u8 = 1;
/// Errors and warnings (the default).
pub const WARN: u8 = 2;
/// Also what the hook noticed and worked around (fallbacks taken, dead processes reclaimed).
pub const INFO: u8 = 3;
/// Also where the settings came from and other detail.
pub const DEBUG: u8 = 4;

/// Parses a log-level value; anything unreadable keeps the default.
pub fn parse_level(text: Option<&str>) -> u8 {
    text.and_then(|t| t.trim().parse::<u8>().ok())
        .map_or(WARN, |level| level.clamp(ERROR, DEBUG))
}

/// Sets the process-wide level (once, from the hook's settings).
pub fn set_level(level: u8) {
    LEVEL.store(level, Relaxed);
}

/// Whether lines at `level` are written, so callers can skip building a costly message.
pub fn enabled(level: u8) -> bool {
    level <= LEVEL.load(Relaxed)
}

/// Writes one line `[<tag> <LEVEL> pid <pid>] <message>` when `level` is enabled.
pub fn emit(tag: &str, level: u8, args: Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let name = match level {
        ERROR => "ERROR",
        WARN => "WARN",
        INFO => "INFO",
        _ => "DEBUG",
    };
    let mut line = String::with_capacity(160);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let _ = writeln!(line, "[{tag} {name} pid {pid}] {args}");
    // SAFETY: writes our own buffer to fd 2; a failed write is ignored (nowhere to report it).
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Defines a hook's logging functions (`error`, `warn`, `info`, `debug`, each taking
/// `format_args!`) and its `TAG` constant in the module it is invoked in, so both hooks' `log`
/// modules are this one expansion with their own tag: `hami_kernel_locks::hook_logger!("vgpu");`.
#[macro_export]
macro_rules! hook_logger {
    ($tag:literal) => {
        /// The tag of every line this hook logs.
        pub(crate) const TAG: &str = $tag;

        /// An error: something refused or failed.
        pub fn error(args: ::std::fmt::Arguments<'_>) {
            $crate::hook_log::emit(TAG, $crate::hook_log::ERROR, args);
        }
        /// A warning: something the operator should know.
        pub fn warn(args: ::std::fmt::Arguments<'_>) {
            $crate::hook_log::emit(TAG, $crate::hook_log::WARN, args);
        }
        /// Information (written at level 3 and above).
        pub fn info(args: ::std::fmt::Arguments<'_>) {
            $crate::hook_log::emit(TAG, $crate::hook_log::INFO, args);
        }
        /// Detail (written at level 4).
        pub fn debug(args: ::std::fmt::Arguments<'_>) {
            $crate::hook_log::emit(TAG, $crate::hook_log::DEBUG, args);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_clamp() {
        assert_eq!(parse_level(None), WARN);
        assert_eq!(parse_level(Some("4")), DEBUG);
        assert_eq!(parse_level(Some("9")), DEBUG);
        assert_eq!(parse_level(Some("0")), ERROR);
        assert_eq!(parse_level(Some("loud")), WARN);
    }
}
