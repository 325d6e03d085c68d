//! The demo's GPU-busy container process (`hami_demo::workload`), built with this crate so
//! its tests can name it (`CARGO_BIN_EXE_system-workload`): the real-runtime tests run it
//! in containers under the real hooks.

use clap::Parser;

fn main() -> std::process::ExitCode {
    hami_demo::workload::run(&hami_demo::workload::WorkloadArgs::parse())
}
