//! The demo's GPU-busy container process (see `hami_demo::workload`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    hami_demo::workload::run(&hami_demo::workload::WorkloadArgs::parse())
}
