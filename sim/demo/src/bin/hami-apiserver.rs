//! `hami-apiserver` (also `hami apiserver`): the embedded Kubernetes API server as a
//! process; kubectl and kube-rs work against it.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "hami-apiserver",
    version,
    about = "Run the embedded Kubernetes API server (kubectl and kube-rs work against it)"
)]
struct Cli {
    #[command(flatten)]
    serve: hami_apiserver::ServeArgs,
}

fn main() -> std::process::ExitCode {
    hami_demo::cli::serve(hami_apiserver::serve(Cli::parse().serve), "info")
}
