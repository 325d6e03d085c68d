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
    hami_plugin_core::entry::serve(hami_webui::run(cli.ui), hami_webui::LOG_FILTER)
}
