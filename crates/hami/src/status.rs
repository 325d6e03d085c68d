//! `hami status`: a kubectl-plugin-style view of a cluster (real or embedded): per node and
//! GPU, who holds which slice and what is free; pending GPU pods and why they wait, from
//! the scheduler's events. Usage is computed by the scheduler's own state code
//! (`hami_scheduler::state::ClusterState`), so it agrees with what the scheduler sees.

use std::collections::BTreeMap;
use std::path::PathBuf;

use hami_protocol::names::Vendor;
use hami_protocol::requests::{RequestDefaults, pod_ref, pod_requests};
use hami_scheduler::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::table::Table;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Also list GPUs nobody uses.
    #[arg(long)]
    pub all: bool,
    #[arg(long, short, value_enum, default_value_t = crate::Output::Table)]
    pub output: crate::Output,
}

#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub nodes: Vec<NodeStatus>,
    pub pending: Vec<PendingPod>,
}

#[derive(Debug, Serialize)]
pub struct NodeStatus {
    pub name: String,
    pub gpus: Vec<GpuStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct GpuStatus {
    pub vendor: &'static str,
    pub id: String,
    #[serde(rename = "type")]
    pub device_type: String,
    pub healthy: bool,
    pub shares_used: u32,
    pub shares: u32,
    pub memory_used_mib: u64,
    pub memory_mib: u64,
    /// AMD: CUs; NVIDIA: percent.
    pub cores_used: u64,
    pub cores: u32,
    pub holders: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct PendingPod {
    pub pod: String,
    pub reason: String,
}

/// Builds the report from listed objects (pure: the shell lists, this decides).
pub fn build(nodes: &[Node], pods: &[Pod], events: &[(String, String, String)]) -> StatusReport {
    let mut state = ClusterState::new();
    state.reset_nodes(nodes.iter());
    state.reset_pods(pods.iter());
    let mut holders: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (_, holding) in state.holdings() {
        for charge in &holding.charges {
            holders
                .entry((holding.node.clone(), charge.uuid.clone()))
                .or_default()
                .push(format!("{}/{}", holding.namespace, holding.name));
        }
    }
    let mut names: Vec<&String> = state.node_names().collect();
    names.sort();
    let nodes = names
        .into_iter()
        .filter_map(|name| state.node(name))
        .filter(|snapshot| {
            !snapshot.devices.gpus.is_empty() || !snapshot.devices.register_errors.is_empty()
        })
        .map(|snapshot| NodeStatus {
            name: snapshot.devices.name.clone(),
            problems: snapshot
                .devices
                .register_errors
                .iter()
                .map(|(_, e)| e.clone())
                .collect(),
            gpus: snapshot
                .devices
                .gpus
                .iter()
                .zip(&snapshot.usage)
                .map(|(gpu, usage)| {
                    let mut who = holders
                        .get(&(snapshot.devices.name.clone(), gpu.info.id.clone()))
                        .cloned()
                        .unwrap_or_default();
                    who.sort();
                    GpuStatus {
                        vendor: gpu.vendor.word(),
                        id: gpu.info.id.clone(),
                        device_type: gpu.info.device_type.clone(),
                        healthy: gpu.info.health,
                        shares_used: usage.used,
                        shares: gpu.info.count,
                        memory_used_mib: usage.mem_mib,
                        memory_mib: gpu.info.devmem,
                        cores_used: usage.cores,
                        cores: gpu.info.devcore,
                        holders: who,
                    }
                })
                .collect(),
        })
        .collect();
    // Pods that ask for GPUs and have no node yet, with the scheduler's latest word.
    let mut pending = Vec::new();
    for pod in pods {
        let unbound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("")
            .is_empty();
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let wants_gpu = pod_requests(pod, &RequestDefaults::default())
            .is_ok_and(|r| r.iter().any(|c| !c.is_empty()));
        if !unbound || terminal || !wants_gpu {
            continue;
        }
        let owner = pod_ref(pod);
        let (namespace, name) = (owner.namespace, owner.name);
        let reason = events
            .iter()
            .rev()
            .find(|(ns, n, _)| *ns == namespace && *n == name)
            .map(|(_, _, note)| note.clone())
            .unwrap_or_else(|| "waiting for the scheduler (no scheduling event yet)".into());
        pending.push(PendingPod {
            pod: format!("{namespace}/{name}"),
            reason,
        });
    }
    pending.sort_by(|a, b| a.pod.cmp(&b.pod));
    StatusReport { nodes, pending }
}

pub fn render(report: &StatusReport, all: bool) -> String {
    let mut out = String::new();
    if report.nodes.is_empty() {
        out.push_str("No node registers GPUs (no hami.io/node-*-register annotation).\n");
    }
    for node in &report.nodes {
        let idle = node.gpus.iter().filter(|g| g.shares_used == 0).count();
        out.push_str(&format!(
            "Node {} ({} GPUs, {idle} idle)\n",
            node.name,
            node.gpus.len()
        ));
        for problem in &node.problems {
            out.push_str(&format!("  problem: {problem}\n"));
        }
        let mut table = Table::new(&[
            "  GPU",
            "TYPE",
            "HEALTH",
            "SHARES",
            "MEMORY USED",
            "FREE",
            "CORES USED",
            "FREE",
            "HOLDERS",
        ]);
        for g in node
            .gpus
            .iter()
            .filter(|g| all || g.shares_used > 0 || !g.healthy)
        {
            let unit = if g.vendor == Vendor::Amd.word() {
                " CUs"
            } else {
                "%"
            };
            table.row(vec![
                format!("  {}", g.id),
                g.device_type.clone(),
                if g.healthy {
                    "ok".into()
                } else {
                    "UNHEALTHY".into()
                },
                format!("{}/{}", g.shares_used, g.shares),
                format!("{}/{} MiB", g.memory_used_mib, g.memory_mib),
                format!("{} MiB", g.memory_mib.saturating_sub(g.memory_used_mib)),
                format!("{}/{}{unit}", g.cores_used, g.cores),
                format!("{}{unit}", u64::from(g.cores).saturating_sub(g.cores_used)),
                if g.holders.is_empty() {
                    "-".into()
                } else {
                    g.holders.join(", ")
                },
            ]);
        }
        if node
            .gpus
            .iter()
            .any(|g| all || g.shares_used > 0 || !g.healthy)
        {
            out.push_str(&table.render());
        }
    }
    if !report.pending.is_empty() {
        out.push_str("Pending GPU pods:\n");
        for p in &report.pending {
            out.push_str(&format!("  {}: {}\n", p.pod, p.reason));
        }
    }
    out
}

/// Lists nodes, pods and scheduling events and builds the report.
pub async fn collect(args: &StatusArgs) -> anyhow::Result<StatusReport> {
    let client = hami_scheduler::server::client(args.kubeconfig.as_deref()).await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let mut events: Vec<(i64, String, String, String)> = Vec::new();
    // The scheduler records events.k8s.io/v1 Events; kube-scheduler's FailedScheduling may
    // be core/v1 on real clusters. Read both, newest last.
    let new_api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    if let Ok(list) = new_api.list(&ListParams::default()).await {
        for e in list.items {
            if !matches!(
                e.reason.as_deref(),
                Some("FilteringFailed" | "FailedScheduling" | "BindingFailed")
            ) {
                continue;
            }
            let r = e.regarding.unwrap_or_default();
            let at = e.event_time.map(|t| t.0.as_second()).unwrap_or(0);
            events.push((
                at,
                r.namespace.unwrap_or_default(),
                r.name.unwrap_or_default(),
                e.note.unwrap_or_default(),
            ));
        }
    }
    let old_api: Api<k8s_openapi::api::core::v1::Event> = Api::all(client);
    if let Ok(list) = old_api.list(&ListParams::default()).await {
        for e in list.items {
            if !matches!(
                e.reason.as_deref(),
                Some("FilteringFailed" | "FailedScheduling" | "BindingFailed")
            ) {
                continue;
            }
            let at = e.last_timestamp.map(|t| t.0.as_second()).unwrap_or(0);
            let r = e.involved_object;
            events.push((
                at,
                r.namespace.unwrap_or_default(),
                r.name.unwrap_or_default(),
                e.message.unwrap_or_default(),
            ));
        }
    }
    events.sort_by_key(|e| e.0);
    let events: Vec<(String, String, String)> = events
        .into_iter()
        .map(|(_, ns, n, note)| (ns, n, note))
        .collect();
    Ok(build(&nodes, &pods, &events))
}
