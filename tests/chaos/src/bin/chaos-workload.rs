//! The demo's GPU-busy container process (`hami_demo::workload`), built with the chaos
//! crate so its tests can name it (`CARGO_BIN_EXE_chaos-workload`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    hami_demo::workload::run(&hami_demo::workload::WorkloadArgs::parse())
}
