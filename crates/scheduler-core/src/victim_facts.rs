//! What the preempt verb knows of the pods it may name (issue 30 item 2), kept beside the
//! cluster state so a preempt call needs no API request for the usual victims.
//!
//! Only pods that hold slices (or have a filter decision pending) are kept: they are the
//! ones the victim search chooses from, and the state already pays for each of them
//! (`ClusterState`'s rule: a pod that holds nothing costs nothing, so 50,000 plain pods
//! add no memory). A proposed victim that holds no slice (kube-scheduler's in-tree dry run
//! wanted its CPU, memory or ports) is looked up by the shell when a call names one
//! ([`with_listed`] joins what it listed).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::preemption::{NodePods, PodFacts};
use crate::state::ClusterState;
use crate::usage::DeviceCharge;

/// Facts of the pods that hold slices, by UID; charges are left empty here and joined
/// from the state's holdings in the per-node lists (they change with every re-filter).
#[derive(Debug, Clone, Default)]
pub struct VictimFacts {
    /// Shared with the per-node lists below: a call takes a list, not a copy of its facts.
    by_uid: HashMap<String, Arc<PodFacts>>,
    /// Those being deleted, whatever their protection says first (a critical pod being
    /// deleted is `Critical` there): their slices are about to free (`nominated`).
    terminating: HashSet<String>,
    /// Per node, the pods holding slices there whose facts are kept, with their charges,
    /// in UID order, as the victim search reads them ([`node_pods`]): updated in place by
    /// the state on each change of a holding or of a holder's facts
    /// ([`VictimFacts::sync_holder`]), never rebuilt, so a preempt call copies nothing
    /// per pod. A list a call still holds is copied once by the next change.
    lists: HashMap<String, Arc<NodePods>>,
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl VictimFacts {
    /// Records `pod` when `holds` (it holds slices or has a pending decision) and it has
    /// not finished; forgets it otherwise. True when what is kept of it changed: the state
    /// then updates the list of the node it holds on ([`Self::sync_holder`]).
    pub fn upsert(&mut self, pod: &Pod, holds: bool) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return false;
        };
        if holds && !is_terminal(pod) {
            if pod.metadata.deletion_timestamp.is_some() {
                self.terminating.insert(uid.to_owned());
            } else {
                self.terminating.remove(uid);
            }
            let facts = PodFacts::from_pod(pod, Vec::new());
            if self.by_uid.get(uid).is_some_and(|kept| **kept == facts) {
                return false;
            }
            self.by_uid.insert(uid.to_owned(), Arc::new(facts));
            true
        } else {
            self.remove(uid)
        }
    }

    /// Forgets the pod (deleted); true when it was kept.
    pub fn remove(&mut self, uid: &str) -> bool {
        self.terminating.remove(uid);
        self.by_uid.remove(uid).is_some()
    }

    /// Brings `node`'s list up to date for the pod `uid`: holding `charges` there (listed
    /// when its facts are kept), or `None`, nothing (no longer listed). The state calls
    /// it on every change of what a pod holds where, and of a holder's facts.
    pub fn sync_holder(&mut self, node: &str, uid: &str, charges: Option<&[DeviceCharge]>) {
        let facts = charges.and_then(|c| Some((self.by_uid.get(uid)?.clone(), c)));
        match facts {
            Some((facts, charges)) => match self.lists.get_mut(node) {
                Some(list) => Arc::make_mut(list).upsert(facts, charges),
                None => {
                    let mut list = NodePods::default();
                    list.upsert(facts, charges);
                    self.lists.insert(node.to_owned(), Arc::new(list));
                }
            },
            None => {
                let Some(list) = self.lists.get_mut(node) else {
                    return;
                };
                if list.contains(uid) {
                    Arc::make_mut(list).remove(uid);
                }
                if list.is_empty() {
                    self.lists.remove(node);
                }
            }
        }
    }

    /// Whether the pod is kept and being deleted.
    pub fn is_terminating(&self, uid: &str) -> bool {
        self.terminating.contains(uid)
    }

    /// The UIDs kept: a relist forgets those it no longer shows (a pod deleted while the
    /// watch was down leaves no facts behind, even one whose slice a re-filter released).
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.by_uid.keys()
    }

    /// The pod's facts (charges empty), if kept.
    pub fn get(&self, uid: &str) -> Option<&PodFacts> {
        self.by_uid.get(uid).map(|f| &**f)
    }

    /// How many pods are kept.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

/// The pods of `node` the preempt verb may name: each pod holding slices there whose
/// facts are kept, with its charges, in UID order (the search breaks ties by this order:
/// the same on every call). A holding whose pod's facts are unknown stays charged but
/// cannot be named. `None` for a node the state does not know.
///
/// The state's own list, shared: under the state's lock a call takes one `Arc` per node.
pub fn node_pods(state: &ClusterState, node: &str) -> Option<Arc<NodePods>> {
    state.node(node)?;
    let lists = &state.victim_facts().lists;
    Some(lists.get(node).cloned().unwrap_or_default())
}

/// `pods` and the pods of `listed` (read from the API server because a proposed UID holds
/// nothing on the node) that have not finished and are not among them, holding nothing.
pub fn with_listed(pods: &NodePods, listed: &[Pod]) -> NodePods {
    pods.with_listed(
        listed
            .iter()
            .filter(|p| p.metadata.uid.is_some() && !is_terminal(p))
            .map(|p| PodFacts::from_pod(p, Vec::new())),
    )
}

/// [`node_pods`] as first written (tests only): every holder's facts copied, the listed
/// pods joined, all sorted by UID. The reference the per-node lists must decide as.
#[cfg(test)]
pub(crate) fn candidate_pods(state: &ClusterState, node: &str, listed: &[Pod]) -> Vec<PodFacts> {
    let mut out: Vec<PodFacts> = state
        .holdings_on(node)
        .filter_map(|(uid, holding)| {
            let facts = state.victim_facts().get(uid)?;
            Some(PodFacts {
                charges: holding.charges.clone(),
                ..facts.clone()
            })
        })
        .collect();
    for pod in listed {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        if is_terminal(pod) || out.iter().any(|p| p.uid == uid) {
            continue;
        }
        out.push(PodFacts::from_pod(pod, Vec::new()));
    }
    out.sort_by(|a, b| a.uid.cmp(&b.uid));
    out
}

/// The proposed UIDs of `node` that [`node_pods`] would not know without a lookup:
/// those of no pod holding slices there (the shell lists the node's pods for them).
pub fn unknown_proposals<'a>(state: &ClusterState, node: &str, uids: &'a [String]) -> Vec<&'a str> {
    uids.iter()
        .map(String::as_str)
        .filter(|uid| {
            state.holding(uid).is_none_or(|h| h.node != node)
                || state.victim_facts().get(uid).is_none()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preemption::Protection;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node() -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n", "annotations": {
            "hami.io/node-nvidia-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true}]"#
        }}}))
        .unwrap()
    }

    fn pod(uid: &str, extra: serde_json::Value) -> Pod {
        let mut value = json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid, "labels": {"app": "a"},
                "annotations": {
                    "hami.io/vgpu-node": "n",
                    "hami.io/vgpu-devices-allocated": "G,NVIDIA,100,10:;"
                }},
            "spec": {"schedulerName": "hami-scheduler", "nodeName": "n", "priority": 5,
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        });
        json_merge(&mut value, extra);
        serde_json::from_value(value).unwrap()
    }

    fn json_merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    #[test]
    fn slice_holders_are_kept_with_their_charges_and_finished_or_gone_pods_are_not() {
        let mut state = ClusterState::new();
        state.upsert_node(&node());
        state.upsert_pod(&pod("a", json!({})));
        state.upsert_pod(&pod(
            "b",
            json!({"metadata": {"labels": {"hami.io/preemptible": "false"}}}),
        ));
        // Holds nothing: not kept (costs nothing).
        let plain: Pod = serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "p"},
            "spec": {"nodeName": "n", "containers": [{"name": "c"}]}}),
        )
        .unwrap();
        state.upsert_pod(&plain);
        assert_eq!(state.victim_facts().len(), 2);
        let pods = candidate_pods(&state, "n", &[]);
        assert_eq!(
            pods.iter().map(|p| p.uid.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(pods[0].priority, 5);
        assert_eq!(pods[0].charges.len(), 1);
        assert_eq!(pods[0].charges[0].mem_mib, 100);
        assert_eq!(pods[1].protection, Some(Protection::NotPreemptible));
        assert!(candidate_pods(&state, "other", &[]).is_empty());

        // The plain pod is unknown until listed; then it is named with no charges.
        let proposed = vec!["a".to_string(), "p".to_string()];
        assert_eq!(unknown_proposals(&state, "n", &proposed), ["p"]);
        let pods = candidate_pods(&state, "n", std::slice::from_ref(&plain));
        assert_eq!(pods.len(), 3);
        assert!(pods.iter().any(|p| p.uid == "p" && p.charges.is_empty()));

        // Finished: forgotten; deleted: forgotten.
        state.upsert_pod(&pod("a", json!({"status": {"phase": "Succeeded"}})));
        state.remove_pod("b");
        assert!(state.victim_facts().is_empty());
        assert!(candidate_pods(&state, "n", &[]).is_empty());
    }

    #[test]
    fn a_terminating_victim_is_protected_once_its_deletion_is_seen() {
        let mut state = ClusterState::new();
        state.upsert_node(&node());
        state.upsert_pod(&pod("a", json!({})));
        state.upsert_pod(&pod(
            "a",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ));
        let pods = candidate_pods(&state, "n", &[]);
        assert_eq!(pods[0].protection, Some(Protection::Terminating));
        // Still charged: its slice frees when its containers are gone.
        assert_eq!(pods[0].charges.len(), 1);
    }
}

#[cfg(test)]
#[path = "victim_facts_tests.rs"]
mod node_pods_tests;
