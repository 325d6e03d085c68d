//! kube-scheduler's preemption (`DefaultPreemption`'s PostFilter) as far as it meets an
//! extender with a `preemptVerb` (issue 30 item 3), so tests exercise the real dance:
//! candidates only from the extender's `FailedNodes` (never `FailedAndUnresolvableNodes`)
//! → the in-tree dry run → the preempt verb → one node picked ([`pick_one_node`]) →
//! victims marked `DisruptionTarget` and deleted → `status.nominatedNodeName` → the pod
//! retried by the normal backoff.
//!
//! The dry run is modelled, not run: this stand-in models no in-tree resources, and every
//! HAMi resource is `ignoredByScheduler`, so in-tree filters pass with every lower-priority
//! pod removed and still pass as each is reprieved: every candidate ends with no victim.
//! [`PreemptMode::Before138`] then drops every candidate before the extender is called
//! (kubernetes/kubernetes#139270: a GPU pod never preempts); [`PreemptMode::From138`]
//! sends them with empty lists for the extender to fill (kubernetes/kubernetes#135486).
//! Not modelled: the candidate window's size limits, preemptionPolicy other than `Never`,
//! nominated pods in later filters (the scheduler counts those itself).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use hami_scheduler::extender_client::ExtenderClient;

/// Which kube-scheduler's preemption this stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptMode {
    /// No PostFilter (the default: tests that never preempt stay as they were).
    #[default]
    Off,
    /// Kubernetes < 1.38: nodes the dry run leaves without victims are dropped before the
    /// extender is called.
    Before138,
    /// Kubernetes ≥ 1.38: they are sent with empty victim lists.
    From138,
}

/// One node the extender kept: its victims' priorities and start times, and its PDB
/// violations as the extender counted them.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeVictims {
    /// The node.
    pub node: String,
    /// `(priority, start time)` per victim.
    pub victims: Vec<(i32, Option<Timestamp>)>,
    /// `NumPDBViolations`.
    pub pdb_violations: i64,
}

/// kube-scheduler's `pickOneNodeForPreemption`: a node with no victims at once, else the
/// fewest PDB violations, the lowest highest victim priority, the smallest sum of
/// priorities, the fewest victims, the latest start among the highest-priority victims
/// (evict what started last), then the first.
pub fn pick_one_node(nodes: &[NodeVictims]) -> Option<usize> {
    if let Some(i) = nodes.iter().position(|n| n.victims.is_empty()) {
        return Some(i);
    }
    let highest = |n: &NodeVictims| n.victims.iter().map(|v| v.0).max().unwrap_or(i32::MIN);
    // Upstream shifts each priority by MaxInt32 + 1 so the sum never goes negative.
    let sum = |n: &NodeVictims| {
        n.victims
            .iter()
            .map(|v| i64::from(v.0) + i64::from(i32::MAX) + 1)
            .sum::<i64>()
    };
    // The earliest start among the highest-priority victims; a victim not started counts
    // as starting now (it is the latest).
    let earliest = |n: &NodeVictims| {
        let top = highest(n);
        n.victims
            .iter()
            .filter(|v| v.0 == top)
            .map(|v| v.1.unwrap_or_else(Timestamp::now))
            .min()
    };
    (0..nodes.len()).min_by(|&a, &b| {
        let (x, y) = (&nodes[a], &nodes[b]);
        x.pdb_violations
            .cmp(&y.pdb_violations)
            .then(highest(x).cmp(&highest(y)))
            .then(sum(x).cmp(&sum(y)))
            .then(x.victims.len().cmp(&y.victims.len()))
            .then(earliest(y).cmp(&earliest(x)))
            .then(a.cmp(&b))
    })
}

/// The outcome of one PostFilter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to preempt (no candidate left, or the extender kept none): why.
    Nothing(String),
    /// Victims deleted on the node, now the pod's `nominatedNodeName`.
    Nominated {
        /// The node.
        node: String,
        /// `namespace/name` of each victim deleted.
        victims: Vec<String>,
    },
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// PostFilter for `pod`, which the extender refused on every node: `candidates` are its
/// `FailedNodes`; `pods` the informer's pods (the victims the extender names by UID).
pub async fn post_filter(
    client: &Client,
    extender: &ExtenderClient,
    mode: PreemptMode,
    pod: &Pod,
    candidates: Vec<String>,
    pods: &Store<Pod>,
) -> Result<Outcome, String> {
    let never = pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never");
    if mode == PreemptMode::Off || never {
        return Ok(Outcome::Nothing("preemption is off for this pod".into()));
    }
    // The modelled dry run: every candidate ends with no victim (module doc).
    let dry_run: BTreeMap<String, Vec<String>> =
        candidates.into_iter().map(|n| (n, Vec::new())).collect();
    let sent: BTreeMap<&String, Value> = dry_run
        .iter()
        .filter(|(_, victims)| mode == PreemptMode::From138 || !victims.is_empty())
        .map(|(node, _)| (node, json!({"Pods": [], "NumPDBViolations": 0})))
        .collect();
    if sent.is_empty() {
        return Ok(Outcome::Nothing(
            "0/0 nodes are available for preemption: the dry run left no victim on any node".into(),
        ));
    }
    let args = json!({"Pod": pod, "NodeNameToMetaVictims": sent});
    let answer: Value = extender.call("preempt", &args).await?;
    let by_uid: BTreeMap<String, std::sync::Arc<Pod>> = pods
        .state()
        .into_iter()
        .filter_map(|p| p.uid().map(|u| (u, p)))
        .collect();
    let mut kept: Vec<(NodeVictims, Vec<std::sync::Arc<Pod>>)> = Vec::new();
    let nodes = answer["NodeNameToMetaVictims"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    'nodes: for (node, victims) in nodes {
        let mut found = Vec::new();
        for meta in victims["Pods"].as_array().into_iter().flatten() {
            // Upstream refuses a victim not on the node (`convertToVictims`): drop the node.
            let Some(p) = meta["UID"].as_str().and_then(|u| by_uid.get(u)) else {
                continue 'nodes;
            };
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.as_str()) {
                continue 'nodes;
            }
            found.push(p.clone());
        }
        let facts = NodeVictims {
            node: node.clone(),
            victims: found
                .iter()
                .map(|p| {
                    let start = p.status.as_ref().and_then(|s| s.start_time.clone());
                    (priority(p), start.map(|t| t.0))
                })
                .collect(),
            pdb_violations: victims["NumPDBViolations"].as_i64().unwrap_or(0),
        };
        kept.push((facts, found));
    }
    let facts: Vec<NodeVictims> = kept.iter().map(|(f, _)| f.clone()).collect();
    let Some(chosen) = pick_one_node(&facts) else {
        return Ok(Outcome::Nothing(
            "the extender kept no node for preemption".into(),
        ));
    };
    let (facts, victims) = &kept[chosen];
    let mut names = Vec::new();
    for victim in victims {
        let ns = victim.namespace().unwrap_or_else(|| "default".into());
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        // Upstream marks the victim first, so controllers see why it goes.
        let condition = json!({"status": {"conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": format!("{}: preempting to accommodate a higher priority pod", pod.name_any()),
            "lastTransitionTime": Timestamp::now().round(k8s_openapi::jiff::Unit::Second)
                .map(|t| t.to_string()).unwrap_or_default(),
        }]}});
        let _ = api
            .patch_status(
                &victim.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(condition),
            )
            .await;
        match api
            .delete(&victim.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            // Gone already: what preemption wanted.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(format!(
                    "cannot delete victim {ns}/{}: {e}",
                    victim.name_any()
                ));
            }
        }
        names.push(format!("{ns}/{}", victim.name_any()));
    }
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        &pod.namespace().unwrap_or_else(|| "default".into()),
    );
    api.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nominatedNodeName": facts.node}})),
    )
    .await
    .map_err(|e| format!("cannot nominate {} for {}: {e}", facts.node, pod.name_any()))?;
    Ok(Outcome::Nominated {
        node: facts.node.clone(),
        victims: names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, victims: &[(i32, i64)], pdb: i64) -> NodeVictims {
        NodeVictims {
            node: name.into(),
            victims: victims
                .iter()
                .map(|(p, t)| (*p, Some(Timestamp::from_second(*t).unwrap())))
                .collect(),
            pdb_violations: pdb,
        }
    }

    #[test]
    fn the_node_is_picked_in_kube_schedulers_order() {
        // Fewest PDB violations beats everything after it.
        let nodes = [node("a", &[(0, 1)], 1), node("b", &[(500, 1), (500, 2)], 0)];
        assert_eq!(pick_one_node(&nodes), Some(1));
        // Then the lowest highest priority.
        let nodes = [node("a", &[(100, 1)], 0), node("b", &[(0, 1), (0, 2)], 0)];
        assert_eq!(pick_one_node(&nodes), Some(1));
        // Then the smallest sum (shifted, so more victims of priority 0 sum higher).
        let nodes = [node("a", &[(0, 1), (0, 2)], 0), node("b", &[(0, 1)], 0)];
        assert_eq!(pick_one_node(&nodes), Some(1));
        // Then the latest start of the highest-priority victims.
        let nodes = [node("a", &[(0, 10)], 0), node("b", &[(0, 20)], 0)];
        assert_eq!(pick_one_node(&nodes), Some(1));
        // Then the first; a node with no victims at once; none from nothing.
        let nodes = [node("a", &[(0, 10)], 0), node("b", &[(0, 10)], 0)];
        assert_eq!(pick_one_node(&nodes), Some(0));
        let nodes = [node("a", &[(0, 10)], 0), node("b", &[], 3)];
        assert_eq!(pick_one_node(&nodes), Some(1));
        assert_eq!(pick_one_node(&[]), None);
    }
}
