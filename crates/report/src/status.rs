//! Per node and GPU: who holds which slice and what is free; pending GPU pods and why they
//! wait. Usage is the scheduler's own state code (`ClusterState`), so it agrees with what
//! the scheduler sees.

use std::collections::BTreeMap;

use hami_protocol::requests::{RequestDefaults, pod_ref, pod_requests};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;

/// Who holds which slice where, and what waits (`hami status`).
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// Nodes that registered GPUs (or failed to), by name.
    pub nodes: Vec<NodeStatus>,
    /// GPU pods without a node, with the scheduler's latest word.
    pub pending: Vec<PendingPod>,
}

/// One node's GPUs.
#[derive(Debug, Serialize)]
pub struct NodeStatus {
    /// The node's name.
    pub name: String,
    /// Its GPUs, in register order.
    pub gpus: Vec<GpuStatus>,
    /// Register annotations that did not decode.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// One GPU's usage.
#[derive(Debug, Serialize)]
pub struct GpuStatus {
    /// `AMD` or `NVIDIA`.
    pub vendor: &'static str,
    /// Registered device id.
    pub id: String,
    /// Registered device type.
    #[serde(rename = "type")]
    pub device_type: String,
    /// Registered healthy.
    pub healthy: bool,
    /// Shares taken.
    pub shares_used: u32,
    /// Shares registered.
    pub shares: u32,
    /// MiB reserved.
    pub memory_used_mib: u64,
    /// MiB registered.
    pub memory_mib: u64,
    /// AMD: CUs; NVIDIA: percent.
    pub cores_used: u64,
    /// AMD: CUs registered; NVIDIA: 100 × core scaling.
    pub cores: u32,
    /// The largest reference slice (`1/8`, `1/4`, `1/2`, `1/1` of the card's memory and
    /// compute) that fits it now by the scheduler's fit; none when not even 1/8 fits
    /// (`hami_defrag_core::measure`, issue 32).
    pub largest_slice: Option<&'static str>,
    /// `1 − placeable / free` memory, 0 to 1: how much of its free memory reference slices
    /// can no longer take (0 when nothing is free).
    pub fragmentation: f64,
    /// Pods holding a share, `namespace/name`, sorted; a pod HAMi did not place that holds
    /// the card whole is `namespace/name (whole card)` ([`WHOLE_CARD_MARK`]).
    pub holders: Vec<String>,
}

/// After a holder that holds the card whole without HAMi having placed it
/// (`hami.io/<vendor>-whole-cards`, written by the device plugin).
pub const WHOLE_CARD_MARK: &str = "(whole card)";

/// A GPU pod not placed yet.
#[derive(Debug, Serialize)]
pub struct PendingPod {
    /// `namespace/name`.
    pub pod: String,
    /// The latest scheduler event's message about it (or why none is known).
    pub reason: String,
}

/// Builds the report from listed objects (pure: the shell lists, this decides).
pub fn build(nodes: &[Node], pods: &[Pod], events: &[(String, String, String)]) -> StatusReport {
    let mut state = ClusterState::new();
    state.reset_nodes(nodes.iter());
    state.reset_pods(pods.iter());
    report_from_state(&state, pods, events)
}

/// The report from a state kept up to date elsewhere (the web UI's watchers); `pods` are
/// the same pods the state was fed, for the pending list.
pub fn report_from_state<'a>(
    state: &ClusterState,
    pods: impl IntoIterator<Item = &'a Pod>,
    events: &[(String, String, String)],
) -> StatusReport {
    let mut holders: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (_, holding) in state.holdings() {
        for charge in &holding.charges {
            holders
                .entry((holding.node.clone(), charge.uuid.clone()))
                .or_default()
                .push(format!("{}/{}", holding.namespace, holding.name));
        }
    }
    // Pods HAMi did not place that the device plugin handed whole cards (issue 26 item 1):
    // the scheduler's state counts each such card full.
    for (_, held) in state.whole_card_holdings() {
        for card in &held.cards {
            holders
                .entry((held.node.clone(), card.clone()))
                .or_default()
                .push(format!(
                    "{}/{} {WHOLE_CARD_MARK}",
                    held.namespace, held.name
                ));
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
        .map(|snapshot| (snapshot, hami_defrag_core::measure_node(snapshot)))
        .map(|(snapshot, measured)| NodeStatus {
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
                .zip(&measured.cards)
                .map(|((gpu, usage), card)| {
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
                        largest_slice: card.largest.map(|s| s.as_str()),
                        fragmentation: card.fragmentation,
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
        // Bound and finished pods are most pods: decide those before parsing requests.
        if !unbound
            || terminal
            || !pod_requests(pod, &RequestDefaults::default())
                .is_ok_and(|r| r.iter().any(|c| !c.is_empty()))
        {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_card_held_whole_by_a_pod_hami_did_not_place_shows_full_with_its_holder() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
            "hami.io/node-nvidia-register": r#"[{"id":"GPU-1","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true},{"id":"GPU-2","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true}]"#}}}))
        .unwrap();
        let plain: Pod = serde_json::from_value(json!({
            "metadata": {"name": "plain", "namespace": "ns", "uid": "u1",
                "labels": {"hami.io/webhook": "ignore"},
                "annotations": {"hami.io/nvidia-whole-cards": "GPU-2"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}))
        .unwrap();
        let report = build(&[node], &[plain], &[]);
        let gpus = &report.nodes[0].gpus;
        assert!(gpus[0].holders.is_empty() && gpus[0].memory_used_mib == 0);
        assert_eq!(gpus[1].holders, vec!["ns/plain (whole card)".to_owned()]);
        assert_eq!(
            (
                gpus[1].shares_used,
                gpus[1].memory_used_mib,
                gpus[1].cores_used
            ),
            (10, 1000, 100)
        );
    }
}
