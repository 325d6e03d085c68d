//! `cargo run -p hami-manifests --example render -- [hami manifests flags]` prints the
//! manifests (what `hami manifests` prints once the subcommand is wired).
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: hami_manifests::ManifestsArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    hami_manifests::args::run(&cli.args, &mut std::io::stdout().lock())
}
