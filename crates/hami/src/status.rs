//! `hami status`: a kubectl-plugin-style view of a cluster (real or embedded): per node and
//! GPU, who holds which slice and what is free (LARGEST: the largest reference slice that
//! fits, FRAG: the fragmentation of its free memory, issue 32); pending GPU pods and why
//! they wait, from the scheduler's events. Usage is computed by the scheduler's own state code
//! (`hami_scheduler_core::state::ClusterState`, through `hami_report`, which the web UI shares),
//! so it agrees with what the scheduler sees.

use std::path::PathBuf;

use hami_protocol::names::Vendor;
use hami_report::dra_status::DraNode;
pub(crate) use hami_report::{StatusReport, status_report as build};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use crate::table::{Table, shown};

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Also list GPUs nobody uses.
    #[arg(long)]
    pub all: bool,
    #[arg(long, short, value_enum, default_value_t = crate::Output::Table)]
    pub output: crate::Output,
    /// A node monitor's metrics URL (`http://<node>:9394/metrics`; the demo prints its
    /// monitors'): adds each pod's live device memory used / limit and utilization.
    /// Repeatable.
    #[arg(long = "monitor", value_name = "URL")]
    pub monitors: Vec<String>,
}

/// One container's device as its node's monitor measures it now.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PodUsage {
    pub pod: String,
    pub container: String,
    pub vdevice_index: String,
    pub device_uuid: String,
    pub memory_used_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub utilization_percent: Option<f64>,
}

/// `StatusReport` plus the DRA nodes and the monitors' live readings (absent without
/// `--monitor`).
#[derive(Debug, serde::Serialize)]
pub(crate) struct Status {
    #[serde(flatten)]
    pub report: StatusReport,
    /// Nodes whose AMD GPUs are handed out by the DRA driver (issue 20).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dra: Vec<DraNode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<PodUsage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitor_errors: Vec<String>,
}

/// Reads each monitor (a blocking scrape each, off the async threads).
pub(crate) async fn live_usage(monitors: &[String]) -> (Vec<PodUsage>, Vec<String>) {
    let urls = monitors.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut live = hami_webui::live::Live::default();
        let mut errors = Vec::new();
        for url in &urls {
            match hami_webui::live::fetch(url) {
                Ok(l) => live.extend(l),
                Err(e) => errors.push(e),
            }
        }
        let usage = live
            .device
            .iter()
            .map(|(key, uuid)| PodUsage {
                pod: format!("{}/{}", key.0, key.1),
                container: key.2.clone(),
                vdevice_index: key.3.clone(),
                device_uuid: uuid.clone(),
                memory_used_bytes: live.memory.get(key).map(|b| *b as u64),
                memory_limit_bytes: live.limit.get(key).map(|b| *b as u64),
                utilization_percent: live.util.get(key).copied(),
            })
            .collect();
        (usage, errors)
    })
    .await
    .unwrap_or_default()
}

/// The live section: per pod, container and device.
pub(crate) fn render_usage(usage: &[PodUsage], errors: &[String]) -> String {
    let mut out = String::new();
    for e in errors {
        out.push_str(&format!("monitor unreadable: {}\n", shown(e)));
    }
    if usage.is_empty() {
        return out;
    }
    out.push_str("Pods (live, from the node monitors):\n");
    let mut table = Table::new(&["  POD", "CONTAINER", "DEVICE", "GPU", "MEMORY USED", "UTIL"]);
    let mib = |b: Option<u64>| b.map_or("-".to_owned(), |b| (b >> 20).to_string());
    for u in usage {
        table.row(vec![
            format!("  {}", u.pod),
            u.container.clone(),
            u.vdevice_index.clone(),
            u.device_uuid.clone(),
            format!(
                "{}/{} MiB",
                mib(u.memory_used_bytes),
                mib(u.memory_limit_bytes)
            ),
            u.utilization_percent
                .map_or("-".to_owned(), |p| format!("{p:.0}%")),
        ]);
    }
    out.push_str(&table.render());
    out
}

/// The DRA section: per node and device, the shares the allocated claims hold.
pub(crate) fn render_dra(nodes: &[DraNode], all: bool) -> String {
    let mut out = String::new();
    for node in nodes {
        let idle = node.devices.iter().filter(|d| d.shares_used == 0).count();
        out.push_str(&format!(
            "DRA node {} ({} devices, {idle} idle)\n",
            shown(&node.name),
            node.devices.len()
        ));
        for problem in &node.problems {
            out.push_str(&format!("  problem: {}\n", shown(problem)));
        }
        let listed: Vec<_> = node
            .devices
            .iter()
            .filter(|d| all || d.shares_used > 0 || d.tainted)
            .collect();
        if listed.is_empty() {
            continue;
        }
        let mut table = Table::new(&[
            "  DEVICE",
            "TYPE",
            "HEALTH",
            "SHARES",
            "MEMORY USED",
            "FREE",
            "CUS USED",
            "FREE",
            "HOLDERS",
        ]);
        let mib = |b: u64| b >> 20;
        for d in listed {
            let holders: Vec<String> = d
                .holders
                .iter()
                .map(|h| {
                    let who = if h.pods.is_empty() {
                        format!("{} (no pod yet)", h.claim)
                    } else {
                        format!("{} ({})", h.pods.join(" "), h.claim)
                    };
                    if h.cu_ranges.is_empty() {
                        who
                    } else {
                        format!("{who} CUs {}", h.cu_ranges)
                    }
                })
                .collect();
            table.row(vec![
                format!("  {}", d.name),
                d.product.clone(),
                if d.tainted {
                    "TAINTED".into()
                } else {
                    "ok".into()
                },
                format!("{}/{}", d.shares_used, d.shares),
                format!("{}/{} MiB", mib(d.memory_used_bytes), mib(d.memory_bytes)),
                format!(
                    "{} MiB",
                    mib(d.memory_bytes.saturating_sub(d.memory_used_bytes))
                ),
                format!("{}/{} CUs", d.compute_units_used, d.compute_units),
                format!(
                    "{} CUs",
                    d.compute_units.saturating_sub(d.compute_units_used)
                ),
                if holders.is_empty() {
                    "-".into()
                } else {
                    holders.join(", ")
                },
            ]);
        }
        out.push_str(&table.render());
    }
    out
}

/// The device-plugin nodes' section (`dra_nodes`: how many DRA nodes the DRA section shows,
/// so a DRA-only cluster is not told that no node registers GPUs).
pub(crate) fn render(report: &StatusReport, all: bool, dra_nodes: usize) -> String {
    let mut out = String::new();
    if report.nodes.is_empty() && dra_nodes == 0 {
        out.push_str("No node registers GPUs (no hami.io/node-*-register annotation).\n");
    }
    for node in &report.nodes {
        let idle = node.gpus.iter().filter(|g| g.shares_used == 0).count();
        out.push_str(&format!(
            "Node {} ({} GPUs, {idle} idle)\n",
            shown(&node.name),
            node.gpus.len()
        ));
        for problem in &node.problems {
            out.push_str(&format!("  problem: {}\n", shown(problem)));
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
            "LARGEST",
            "FRAG",
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
                g.largest_slice.unwrap_or("-").to_owned(),
                format!("{:.0}%", g.fragmentation * 100.0),
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
            out.push_str(&format!("  {}: {}\n", shown(&p.pod), shown(&p.reason)));
        }
    }
    out
}

/// The DRA driver's ResourceSlices and all ResourceClaims, as the DRA section. A cluster
/// without `resource.k8s.io/v1` (before 1.34) has no DRA section. A user who may not list
/// them (403) gets the rest with a warning saying which rights the section needs; other
/// errors fail.
async fn collect_dra(client: &kube::Client) -> anyhow::Result<(Vec<DraNode>, Option<String>)> {
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    let refused = |what: &str, e: &kube::core::Status| {
        format!(
            "the DRA section is not shown: listing {what} was refused ({}); it needs list on resourceslices and resourceclaims (API group resource.k8s.io)",
            shown(&e.message)
        )
    };
    let slices = match Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok((Vec::new(), None)),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok((Vec::new(), Some(refused("ResourceSlices", &e))));
        }
        Err(e) => return Err(anyhow::anyhow!("listing ResourceSlices: {e}")),
    };
    let claims = match Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok((Vec::new(), Some(refused("ResourceClaims", &e))));
        }
        Err(e) => return Err(anyhow::anyhow!("listing ResourceClaims: {e}")),
    };
    Ok((
        hami_report::dra_status::build(hami_manifests::names::DRA_DRIVER, &slices, &claims),
        None,
    ))
}

/// Lists nodes, pods and scheduling events and builds the report; and the DRA section, or
/// why it is missing (a warning for stderr).
pub(crate) async fn collect(
    args: &StatusArgs,
) -> anyhow::Result<(StatusReport, Vec<DraNode>, Option<String>)> {
    let client = hami_plugin_core::kube_client::client(args.kubeconfig.as_deref()).await?;
    let (dra, dra_warning) = collect_dra(&client).await?;
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
    Ok((build(&nodes, &pods, &events), dra, dra_warning))
}
