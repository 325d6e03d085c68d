//! `hami-demo` (also `hami demo`, which runs this program): the whole system on simulated
//! nodes in one process, or with `--scenario FILE` the what-if planner on a described fleet.

use clap::Parser;
use hami_kubelet_sim::cri_args::RuntimeKind;
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
    /// Where the pods' containers run: `unshare` (the stand-in runtime: namespaces on this
    /// machine's files, when root) or `containerd` (real containers: a private containerd
    /// and runc that the demo starts, images it builds with buildah; needs root and
    /// `apt-get install containerd runc buildah busybox-static`).
    #[arg(long, value_enum, default_value_t = RuntimeKind::Unshare)]
    runtime: RuntimeKind,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (args, runtime) = (cli.demo, cli.runtime);
    if runtime == RuntimeKind::Containerd {
        // Refused before anything starts: the user's to fix (exit 2, as bad input).
        let refusal = if args.dra {
            Err(
                "--runtime containerd with --dra: not supported yet (the DRA node's pods \
                 need CDI devices, which Debian's containerd 1.6 does not take over CRI); \
                 leave one of them out"
                    .to_owned(),
            )
        } else {
            hami_demo::real_runtime::check()
        };
        if let Err(e) = refusal {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
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
        async move { hami_demo::run_on(args, runtime, &mut std::io::stdout()).await },
        // Watchers report the API server going away at shutdown; not news here.
        "error,kube_client=off,kube_runtime=off",
    )
}
