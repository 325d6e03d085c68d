//! `k8s-device-plugin` entry point.

use std::process::ExitCode;

use clap::Parser;
use hami_amd_plugin::cli::{Args, Command, Output, normalize_go_flags};
use hami_amd_plugin::discover_report::build_report;
use hami_plugin_core::entry;

fn main() -> ExitCode {
    let args = Args::parse_from(normalize_go_flags(std::env::args()));
    entry::init_logging();
    let settings = match args.registration_settings() {
        Ok(s) => s,
        Err(e) => return entry::usage_error(e),
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
                Err(e) => entry::failure(e),
            }
        }
        None => entry::run_to_exit(hami_amd_plugin::plugin::run(args, settings)),
    }
}
