//! What the stand-in programs' `main`s share (`hami-demo`, `hami-apiserver`,
//! `hami-kubelet-sim`; `hami demo` etc. run them).

use std::process::ExitCode;

/// Runs a long-lived server on a fresh runtime, logging to stderr (so the demo's tables on
/// stdout stay readable; `RUST_LOG` overrides `default_log_level`). Errors are operational
/// (exit 1), not bad input.
pub fn serve(
    server: impl std::future::Future<Output = anyhow::Result<()>>,
    default_log_level: &str,
) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_log_level.into()),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(server) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
