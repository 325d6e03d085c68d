//! `hami demo`: the whole system in one process, on a laptop with no cluster and no GPU.
//!
//! It starts the embedded API server, the scheduler (extender + webhook over TLS with a
//! generated certificate, registered through a MutatingWebhookConfiguration), the simulated
//! kube-scheduler, two simulated AMD nodes built from the real KFD captures (an MI300X CPX
//! node and an MI210 XGMI node) each with its device plugin, simulated kubelet and
//! monitor; submits the pods in `examples/`; and prints one table per node of who got
//! which slice. Every part is the real component talking the real protocol.

mod cluster;
mod report;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use cluster::Cluster;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Print the tables once everything settled, then exit (instead of serving until Ctrl-C).
    #[arg(long)]
    pub once: bool,
    /// Address of the embedded API server (a free port is used if this one is taken).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub api_listen: SocketAddr,
    /// Directory of pod YAML files to submit, in file-name order.
    #[arg(long, default_value = "examples")]
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
}

/// Progress lines with the time since the start.
pub struct Progress<'a> {
    started: Instant,
    out: &'a mut dyn Write,
}

impl<'a> Progress<'a> {
    pub fn new(out: &'a mut dyn Write) -> Self {
        Self {
            started: Instant::now(),
            out,
        }
    }

    pub fn step(&mut self, message: impl AsRef<str>) {
        let _ = writeln!(
            self.out,
            "[{:5.1}s] {}",
            self.started.elapsed().as_secs_f64(),
            message.as_ref()
        );
        let _ = self.out.flush();
    }

    pub fn print(&mut self, text: impl AsRef<str>) {
        let _ = write!(self.out, "{}", text.as_ref());
        let _ = self.out.flush();
    }
}

/// Runs the demo, writing progress and tables to `out`.
pub async fn run(args: DemoArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut progress = Progress::new(out);
    let cluster = Cluster::start(&args, &mut progress).await?;
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
    let tables = report::render(&cluster, &submitted).await?;
    progress.print(tables);
    progress.print(cluster.hints(&args));
    if !args.once {
        progress.step("serving until Ctrl-C");
        tokio::signal::ctrl_c().await?;
    }
    cluster.shutdown().await;
    Ok(())
}
