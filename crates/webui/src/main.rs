//! `hami-webui`: the web UI as its own binary, for the chart's Deployment (same as `hami ui`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "hami-webui", version, about = "The hami-rs web UI (read-only)")]
struct Cli {
    #[command(flatten)]
    ui: hami_webui::UiArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(hami_webui::run(cli.ui)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
