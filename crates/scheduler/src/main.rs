//! `hami-scheduler`: the kube-scheduler extender and mutating webhook of hami-rs.

use clap::Parser;
use hami_scheduler::config::SchedulerArgs;

#[derive(Parser)]
#[command(
    name = "hami-scheduler",
    version,
    about = "GPU-slice scheduler extender and webhook (HAMi-compatible)"
)]
struct Cli {
    #[command(flatten)]
    args: SchedulerArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    match hami_scheduler::server::run(cli.args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
