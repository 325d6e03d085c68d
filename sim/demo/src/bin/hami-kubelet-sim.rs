//! `hami-kubelet-sim` (also `hami kubelet-sim`): a simulated kubelet as a process.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "hami-kubelet-sim",
    version,
    about = "Run a simulated kubelet: serves the device-plugin Registration API and calls \
             Allocate for pods bound to its node, as kubelet does (uses $KUBECONFIG)"
)]
struct Cli {
    #[command(flatten)]
    kubelet: hami_kubelet_sim::Args,
}

fn main() -> std::process::ExitCode {
    hami_demo::cli::serve(hami_kubelet_sim::run(Cli::parse().kubelet), "info")
}
