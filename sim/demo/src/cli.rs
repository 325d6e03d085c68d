//! What the stand-in programs' `main`s share (`hami-demo`, `hami-apiserver`,
//! `hami-kubelet-sim`; `hami demo` etc. run them).

use std::process::ExitCode;

/// Runs a long-lived server on a fresh runtime, logging to stderr (so the demo's tables on
/// stdout stay readable; `RUST_LOG` overrides `default_log_level`). Errors are operational
/// (exit 1), not bad input. The product binaries' rule (`hami_plugin_core::entry`).
pub fn serve(
    server: impl std::future::Future<Output = anyhow::Result<()>>,
    default_log_level: &str,
) -> ExitCode {
    hami_plugin_core::entry::serve(server, default_log_level)
}
