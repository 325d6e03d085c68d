//! `hami-kubelet-sim` (also `hami kubelet-sim`): a simulated kubelet as a process.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "hami-kubelet-sim",
    version,
    about = "Run a simulated kubelet: serves the device-plugin Registration API and calls \
             Allocate for pods bound to its node, as kubelet does (uses $KUBECONFIG); with \
             --cgroup-root, also makes the pods' cgroups in that tree as kubelet and \
             containerd do"
)]
struct Cli {
    #[command(flatten)]
    kubelet: hami_kubelet_sim::Args,
    #[command(flatten)]
    cgroups: hami_kubelet_sim::cgroup_args::CgroupArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Checked before anything starts: a bad tree is the user's to fix (exit 2), not a
    // failure of the running kubelet.
    let cgroups = match cli.cgroups.config() {
        Ok(c) => c,
        Err(e) => return hami_plugin_core::entry::usage_error(e),
    };
    // A containerd that is not there is the user's to start (exit 2, naming how).
    if let Err(e) = cli.kubelet.runtime.cri.check(cli.kubelet.run_containers) {
        return hami_plugin_core::entry::usage_error(e);
    }
    let cgroups = cgroups.map(|(config, warnings)| {
        for w in warnings {
            eprintln!("warning: {w}");
        }
        config
    });
    let mut args = cli.kubelet;
    hami_demo::cli::serve(
        async move {
            // The pods' KUBERNETES_SERVICE_HOST/PORT: the server of the kubeconfig in use.
            if args.runtime.cri.kubernetes_service.is_none()
                && let Ok(config) = kube::Config::infer().await
            {
                args.runtime.cri.kubernetes_service = Some(config.cluster_url.to_string());
            }
            hami_kubelet_sim::run(args, cgroups).await
        },
        "info",
    )
}
