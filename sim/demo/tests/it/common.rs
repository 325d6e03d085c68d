//! What the demo's tests set up the same way: a fresh scratch directory and the arguments of
//! a `--once` demo on free ports.

use std::path::{Path, PathBuf};

use hami_demo::DemoArgs;

/// A fresh, empty `<tmp>/hami-<name>-<pid>`.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hami-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `hami demo --once` with the API server and the UI on free ports, the pods of `examples`
/// (a directory, or `built-in`) settling for at most 20 s, its kubeconfig written in `dir`.
pub(crate) fn once_args(examples: PathBuf, dir: &Path) -> DemoArgs {
    DemoArgs {
        once: true,
        api_listen: "127.0.0.1:0".parse().unwrap(),
        examples,
        kubeconfig_out: dir.join("kubeconfig"),
        settle_seconds: 20,
        scenario: None,
        ui_listen: "127.0.0.1:0".parse().unwrap(),
        dra: false,
    }
}

/// The demo cluster of `args` whose app containers run this package's `hami-workload`
/// program (where the machine allows: root and util-linux), reporting to `progress`.
pub(crate) async fn start_running_workloads(
    args: &DemoArgs,
    progress: &mut hami_demo::Progress<'_>,
) -> hami_demo::Cluster {
    let workload = Some(env!("CARGO_BIN_EXE_hami-workload").into());
    hami_demo::Cluster::start_with(args, workload, progress)
        .await
        .unwrap()
}

/// One demo cluster at a time in this binary, held for a test's whole run: a cluster is the
/// whole system, and two at once on a small machine miss each other's bounded waits (each
/// test was its own binary before, and those ran one after another).
pub(crate) static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
