//! `k8s-node-labeller` entry point.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hami_node_labeller::{label_patch, labels};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

/// Labels the node with amd.com/gpu.* from sysfs, and keeps the labels current.
#[derive(Debug, Parser)]
#[command(name = "k8s-node-labeller", version)]
struct Args {
    /// Node to label.
    #[arg(long, env = "DS_NODE_NAME")]
    node_name: String,
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 60)]
    interval: u64,
    /// Label once and exit.
    #[arg(long)]
    once: bool,
}

async fn refresh(nodes: &Api<Node>, args: &Args) -> anyhow::Result<()> {
    let discovery = hami_amd_discovery::discovery::discover(&args.sysfs_root)?;
    for w in &discovery.warnings {
        tracing::warn!("{w}");
    }
    let node = nodes.get(&args.node_name).await?;
    let current = node.metadata.labels.unwrap_or_default();
    let patch = label_patch(&current, &labels(&discovery));
    if !patch.is_empty() {
        nodes
            .patch(
                &args.node_name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": patch}})),
            )
            .await?;
        tracing::info!(changed = patch.len(), "node labels updated");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let nodes: Api<Node> = Api::all(client);
    // kubelet stops the pod with SIGTERM, and pid 1 of a container has no default action
    // for it: without a handler the labeller ran until SIGKILL ended the grace period.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = label(&nodes, &args) => r,
        r = tokio::signal::ctrl_c() => Ok(r?),
        _ = term.recv() => Ok(()),
    }
}

/// Labels the node every `--interval` (once with `--once`).
async fn label(nodes: &Api<Node>, args: &Args) -> anyhow::Result<()> {
    loop {
        if let Err(e) = refresh(nodes, args).await {
            if args.once {
                return Err(e);
            }
            tracing::warn!("{e:#}");
        }
        if args.once {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(args.interval.max(1))).await;
    }
}
