//! `k8s-vgpu-monitor` (SPEC §7): see crates/monitor/README.md.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hami_monitor::metrics::LegacyMetrics;
use hami_monitor::node_monitor::MonitorConfig;
use hami_monitor::server::{ServeConfig, parse_bind_address, serve};

#[derive(Debug, Parser)]
#[command(
    name = "k8s-vgpu-monitor",
    version,
    about = "Per-container GPU memory and utilization as Prometheus metrics"
)]
struct Args {
    /// Listen address of /metrics (`:9394` = all interfaces).
    #[arg(long, default_value = ":9394")]
    metrics_bind_address: String,
    /// Pre-2026 metric names of the reference monitor emitted beside the hami_* ones:
    /// `seed` = seed 004's Device_utilization_desc_of_container, `all` = every one
    /// (a bare `--legacy-metrics` too), `none` = off.
    #[arg(long, env = "HAMI_LEGACY_METRICS", value_enum, default_value = "seed", num_args = 0..=1, default_missing_value = "all", require_equals = true)]
    legacy_metrics: LegacyMetrics,
    /// Hook path; cache directories are `<HOOK_PATH>/containers/<podUID>_<container>/`
    /// and, for DRA claims, `<HOOK_PATH>/dra/claims/<claim uid>/`.
    #[arg(long, env = "HOOK_PATH")]
    hook_path: PathBuf,
    /// This node's name (the pod informer watches `spec.nodeName=<NODE_NAME>`).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Root of the host's /proc (the monitor needs hostPID).
    #[arg(long, env = "HAMI_PROC_ROOT", default_value = "/proc")]
    proc_root: PathBuf,
    /// Root of the host's /sys.
    #[arg(long, env = "HAMI_SYS_ROOT", default_value = "/sys")]
    sys_root: PathBuf,
    /// Seconds between directory scans and fdinfo samples.
    #[arg(long, default_value_t = 5)]
    refresh_seconds: u64,
    /// Seconds a directory of an unknown pod is kept before removal (the reference's
    /// HAMI_RESYNC_INTERVAL, 5 minutes).
    #[arg(long, env = "HAMI_GC_GRACE_SECONDS", default_value_t = 300)]
    gc_grace_seconds: u64,
    /// NVML for the NVIDIA host metrics (hami_host_gpu_*), loaded with dlopen; empty = do not
    /// load. A node without the NVIDIA driver logs once and reports AMD hosts only.
    #[arg(long, env = "HAMI_NVML_LIBRARY", default_value = "libnvidia-ml.so.1")]
    nvml_library: String,
    /// The scheduler's name: allocation annotations count only on pods it placed (D-4).
    #[arg(long, env = "HAMI_SCHEDULER_NAME", default_value = hami_protocol::names::DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let bind = parse_bind_address(&args.metrics_bind_address).map_err(anyhow::Error::msg)?;
    if args.node_name.is_empty() {
        anyhow::bail!("NODE_NAME is empty: set it to this node's name (fieldRef spec.nodeName)");
    }
    // KUBECONFIG when set, else in-cluster.
    let client = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!(
            "no Kubernetes client: {e}; set KUBECONFIG or run in a pod with a service account"
        )
    })?;
    let config = ServeConfig {
        monitor: MonitorConfig {
            hook_path: args.hook_path,
            proc_root: args.proc_root,
            sys_root: args.sys_root,
            node_name: args.node_name,
            gc_grace: Duration::from_secs(args.gc_grace_seconds),
            nvml_library: (!args.nvml_library.is_empty()).then_some(args.nvml_library),
        },
        bind,
        legacy_metrics: args.legacy_metrics,
        scheduler_name: args.scheduler_name,
        refresh_interval: Duration::from_secs(args.refresh_seconds.max(1)),
    };
    // kubelet stops the pod with SIGTERM: without a handler its default action killed the
    // monitor mid-request (exit 143) and the graceful shutdown below never ran.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    serve(config, client, shutdown).await
}
