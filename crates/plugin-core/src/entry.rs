//! What the long-running binaries' `main`s share (both device plugins, `hami ui` and
//! `hami-webui`, the stand-in programs of `sim/demo`): logging to stderr (`RUST_LOG`,
//! default `info` or the program's own) and running on a Tokio runtime, with one exit-code
//! rule: 2 for bad flags, 1 for a failure at run time, 0 for a clean stop.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    init_logging_with("info");
}

/// Logs to stderr, filtered by `RUST_LOG` (default `default_filter`, an `EnvFilter`
/// directive such as `error,kube_client=off`). Stderr, so that tables a program prints on
/// stdout stay readable.
pub fn init_logging_with(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// A long-running server's whole `main` after flag parsing: [`init_logging_with`]
/// `default_filter`, then [`run_to_exit`].
pub fn serve<E: Display>(
    server: impl Future<Output = Result<(), E>>,
    default_filter: &str,
) -> ExitCode {
    init_logging_with(default_filter);
    run_to_exit(server)
}

/// Says `e` on stderr and returns the exit code for bad flags or settings (2).
pub fn usage_error(e: impl Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

/// Says `e` on stderr and returns the run-time failure code (1).
pub fn failure(e: impl Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(1)
}

/// Runs `plugin` to completion on a new multi-threaded runtime: 0 when it returns `Ok`,
/// else [`failure`] with the error's causes (`{:#}`).
pub fn run_to_exit<E: Display>(plugin: impl Future<Output = Result<(), E>>) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return failure(format_args!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(plugin) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failure(format_args!("{e:#}")),
    }
}
