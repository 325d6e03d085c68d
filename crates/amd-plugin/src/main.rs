//! `k8s-device-plugin` entry point.

use std::process::ExitCode;

use clap::Parser;
use hami_amd_plugin::cli::{Args, Command, Output, normalize_go_flags};
use hami_amd_plugin::discover_report::build_report;

fn main() -> ExitCode {
    let args = Args::parse_from(normalize_go_flags(std::env::args()));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let settings = match args.registration_settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match &args.command {
        Some(Command::Discover { output }) => {
            match build_report(&args.sysfs_root, &args.dev_root, &settings) {
                Ok(report) => {
                    match output {
                        Output::Json => println!("{:#}", report.to_json()),
                        Output::Text => print!("{}", report.to_text()),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
        None => run_plugin(args, settings),
    }
}

fn run_plugin(
    args: Args,
    settings: hami_amd_plugin::registration::RegistrationSettings,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(hami_amd_plugin::plugin::run(args, settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
