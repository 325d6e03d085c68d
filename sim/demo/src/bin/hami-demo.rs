//! `hami-demo` (also `hami demo`, which runs this program): the whole system on simulated
//! nodes in one process, or with `--scenario FILE` the what-if planner on a described fleet.

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "hami-demo",
    version,
    about = "Run the whole system on simulated nodes (no cluster, no GPU needed): API server, \
             scheduler, kube-scheduler, device plugins, kubelets and monitors in one process; \
             submits the examples and prints who got which slice"
)]
struct Cli {
    #[command(flatten)]
    demo: hami_demo::DemoArgs,
}

fn main() -> ExitCode {
    let args = Cli::parse().demo;
    if let Some(scenario) = args.scenario.clone() {
        return match hami_planner::run(&hami_planner::PlanArgs::for_scenario(scenario)) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code() as u8)
            }
        };
    }
    hami_demo::cli::serve(
        async move { hami_demo::run(args, &mut std::io::stdout()).await },
        // Watchers report the API server going away at shutdown; not news here.
        "error,kube_client=off,kube_runtime=off",
    )
}
