//! Runs the embedded API server until Ctrl-C, like `hami apiserver`:
//! `cargo run -p hami-apiserver --example serve -- --listen 127.0.0.1:6443 --kubeconfig-out /tmp/kc`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: hami_apiserver::ServeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    hami_apiserver::serve(Cli::parse().args).await
}
