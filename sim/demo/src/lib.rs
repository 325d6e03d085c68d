//! `hami demo`: the whole system in one process, on a laptop with no cluster and no GPU.
//!
//! It starts the embedded API server, the scheduler (extender + webhook over TLS with a
//! generated certificate, registered through a MutatingWebhookConfiguration), the simulated
//! kube-scheduler, two simulated AMD nodes built from the real KFD captures (an MI300X CPX
//! node and an MI210 XGMI node) each with its device plugin, simulated kubelet and
//! monitor; submits the pods in `examples/` (built in); and prints one table per node of who
//! got which slice. Every part is the real component talking the real protocol.
//!
//! With `--dra` (issue 20) a third AMD node (an MI210 XGMI capture, labelled
//! `hami.io/amd-mode=dra`) runs the real AMD DRA driver instead of the device plugin
//! (`dra_node.rs`), the chart's DeviceClass is created, the simulated kube-scheduler allocates
//! ResourceClaims, and the DRA examples (ResourceClaimTemplate + pod) are submitted; that
//! node's table comes from its ResourceSlices and the claims (`report_dra.rs`). Without it
//! the DRA examples are skipped.
//!
//! With root and util-linux, the simulated kubelets run each app container's command
//! (`hami-workload`, `workload.rs`) in its own PID and mount namespace with exactly the env,
//! mounts and device nodes Allocate returned, on the stand-in HIP or CUDA runtime under the
//! real hook; each node's stand-in driver has its kernel side here (`amdgpu_driver.rs`,
//! `cuda_driver.rs`), and the tables show the monitors' live memory used and utilization.

pub mod amdgpu_driver;
pub mod cli;
mod cluster;
pub mod cuda_driver;
pub mod dra_examples;
pub mod dra_node;
mod examples;
mod images;
mod node_start;
mod proc_tree;
pub mod real_runtime;
mod report;
mod report_dra;
/// The monitors' readings (in the web UI crate, which `hami status --monitor` also uses).
pub use hami_webui::live::{self, Live, scrape};
pub mod webhook;
pub mod workload;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use cluster::{Cluster, SimNode};
/// What the chaos harness's nodes reuse to run workload containers.
pub use cluster::{Images, install_hook, namespaces_work};

/// Flags of `hami demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Print the tables once everything settled, then exit (instead of serving until Ctrl-C).
    #[arg(long)]
    pub once: bool,
    /// Address of the embedded API server (a free port is used if this one is taken).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub api_listen: SocketAddr,
    /// Directory of pod YAML files to submit, in file-name order; `built-in`: the
    /// repository's examples/, built into this binary.
    #[arg(long, default_value = examples::BUILT_IN_NAME)]
    pub examples: PathBuf,
    /// Where to write the kubeconfig for kubectl.
    #[arg(long, default_value = "hami-demo.kubeconfig")]
    pub kubeconfig_out: PathBuf,
    /// Longest wait for the example pods to settle before printing the tables.
    #[arg(long, default_value_t = 25)]
    pub settle_seconds: u64,
    /// Plan a described fleet and workload instead (same engine, no processes; see
    /// `hami plan --help` and examples/scenarios/).
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Address of the web UI (a free port is used if this one is taken).
    #[arg(long, default_value = "127.0.0.1:8088")]
    pub ui_listen: SocketAddr,
    /// One more AMD node (an MI210 XGMI capture) runs the AMD DRA driver instead of the
    /// device plugin; the DRA examples (ResourceClaimTemplates) are submitted too.
    #[arg(long)]
    pub dra: bool,
}

/// Progress lines with the time since the start.
pub struct Progress<'a> {
    started: Instant,
    out: &'a mut dyn Write,
}

impl<'a> Progress<'a> {
    /// Progress written to `out`, timed from now.
    pub fn new(out: &'a mut dyn Write) -> Self {
        Self {
            started: Instant::now(),
            out,
        }
    }

    /// Writes `message` as one line stamped with the seconds since the start.
    pub fn step(&mut self, message: impl AsRef<str>) {
        let _ = writeln!(
            self.out,
            "[{:5.1}s] {}",
            self.started.elapsed().as_secs_f64(),
            message.as_ref()
        );
        let _ = self.out.flush();
    }

    /// Writes `text` as it is (tables, hints), unstamped.
    pub fn print(&mut self, text: impl AsRef<str>) {
        let _ = write!(self.out, "{}", text.as_ref());
        let _ = self.out.flush();
    }
}

/// Runs the demo, writing progress and tables to `out`.
pub async fn run(args: DemoArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    run_on(args, hami_kubelet_sim::cri_args::RuntimeKind::Unshare, out).await
}

/// [`run`] with the pods' containers on `runtime` (`hami demo --runtime`; containerd:
/// `real_runtime.rs`, after [`real_runtime::check`]).
pub async fn run_on(
    args: DemoArgs,
    runtime: hami_kubelet_sim::cri_args::RuntimeKind,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut progress = Progress::new(out);
    let cluster =
        Cluster::start_on(&args, images::workload_program(), runtime, &mut progress).await?;
    // The web UI watches from the start, so its last-hour trend covers the whole demo.
    let ui = start_ui(&cluster, &args).await?;
    progress.step(format!("web UI serving at {}", ui.url()));
    let submitted = cluster
        .submit_examples(&args.examples, &mut progress)
        .await?;
    cluster
        .settle(
            &submitted,
            Duration::from_secs(args.settle_seconds),
            &mut progress,
        )
        .await;
    report::wait_for_live(&cluster, Duration::from_secs(10), Duration::from_secs(2)).await;
    let tables = report::render(&cluster, &submitted).await?;
    progress.print(tables);
    progress.print(cluster.hints(&args));
    progress.print(format!(
        "Web UI: {}   (nodes, cards, CU maps, pods; read-only)\n",
        ui.url()
    ));
    if !args.once {
        progress.step("serving until Ctrl-C; the tables are printed again every 15 s with the monitors' live USED and UTIL");
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                result = &mut ctrl_c => {
                    result?;
                    break;
                }
                _ = tokio::time::sleep(Duration::from_secs(15)) => {
                    let tables = report::render(&cluster, &submitted).await?;
                    progress.step("live:");
                    progress.print(tables);
                }
            }
        }
    }
    ui.shutdown();
    cluster.shutdown().await;
    Ok(())
}

/// The per-node tables the demo prints (device-plugin nodes from the scheduler's view and the
/// pods' annotations, DRA nodes from ResourceSlices and ResourceClaims).
///
/// # Errors
/// When the API server cannot list the pods (or, with `--dra`, the slices and claims).
pub async fn render_tables(
    cluster: &Cluster,
    submitted: &[cluster::Submitted],
) -> anyhow::Result<String> {
    report::render(cluster, submitted).await
}

/// The web UI on the demo's cluster: its API server by watch, its nodes' monitors.
pub async fn start_ui(cluster: &Cluster, args: &DemoArgs) -> anyhow::Result<hami_webui::RunningUi> {
    let listener = match tokio::net::TcpListener::bind(args.ui_listen).await {
        Ok(l) => l,
        Err(_) => tokio::net::TcpListener::bind((args.ui_listen.ip(), 0)).await?,
    };
    let monitors = cluster
        .nodes
        .iter()
        .map(|n| format!("http://{}/metrics", n.monitor_addr))
        .collect();
    hami_webui::start(
        cluster.client.clone(),
        listener,
        monitors,
        Duration::from_secs(2),
    )
}
