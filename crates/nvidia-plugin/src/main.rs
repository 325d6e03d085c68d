//! `nvidia-device-plugin` entry point.

use std::process::ExitCode;

use clap::Parser;
use hami_nvidia_plugin::cli::{Args, Command};
use hami_plugin_core::entry;

fn main() -> ExitCode {
    let args = Args::parse();
    entry::init_logging();
    let settings = match args.settings() {
        Ok(s) => s,
        Err(e) => return entry::usage_error(e),
    };
    match &args.command {
        Some(Command::Discover) => {
            match hami_nvidia_plugin::discover_report::discover_text(&args.nvml_library, &settings)
            {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => entry::failure(e),
            }
        }
        None => entry::run_to_exit(hami_nvidia_plugin::plugin::run(args, settings)),
    }
}
