//! The scheduler's view of the cluster, fed by the node and pod informers and by its own
//! filter decisions. Usage is kept incrementally per node (a pod's annotations are decoded
//! once per change, never per filter request), so filter cost depends on the candidate
//! nodes only.
//!
//! A decision made by filter is *pending* until the pod's annotations, as seen by the
//! informer, carry exactly that decision; until then informer updates of the pod do not
//! override it. That closes the window where a second filter could book the same GPU
//! before the first pod's patch comes back through the watch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::requests::{container_slots, pod_ref};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::snapshot::{NodeDevices, NodeSnapshot};
use crate::usage::{DeviceCharge, collapse};

/// What a pod holds, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHolding {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub charges: Vec<DeviceCharge>,
}

/// Why a pod's holding could not be read (the pod is then not counted; the caller logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {key}: {problem}")]
pub struct HoldingError {
    pub pod: String,
    pub key: &'static str,
    pub problem: String,
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The devices a live pod holds according to its annotations; `None` when it holds none
/// (not placed by us, or finished).
pub fn pod_holding(pod: &Pod) -> Result<Option<PodHolding>, HoldingError> {
    if is_terminal(pod) {
        return Ok(None);
    }
    let annotations = match &pod.metadata.annotations {
        Some(a) => a,
        None => return Ok(None),
    };
    let Some(node) = annotations.get(pod_keys::VGPU_NODE) else {
        return Ok(None);
    };
    let kinds: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| container_slots(s).iter().map(|c| c.kind).collect())
        .unwrap_or_default();
    let mut charges = Vec::new();
    for vendor in Vendor::ALL {
        let key = vendor.names().devices_allocated;
        let Some(text) = annotations.get(key) else {
            continue;
        };
        let runs = decode_pod_devices(text).map_err(|e| HoldingError {
            pod: pod_name(pod),
            key,
            problem: e.to_string(),
        })?;
        charges.extend(collapse(&kinds, &runs));
    }
    let owner = pod_ref(pod);
    Ok(Some(PodHolding {
        namespace: owner.namespace,
        name: owner.name,
        node: node.clone(),
        charges,
    }))
}

pub fn pod_name(pod: &Pod) -> String {
    pod_ref(pod).to_string()
}

#[derive(Debug, Clone)]
struct PodEntry {
    holding: PodHolding,
    /// For a filter decision not yet seen through the informer: the device-list
    /// annotations it wrote, per vendor.
    pending: Option<BTreeMap<&'static str, String>>,
}

#[derive(Debug, Clone)]
struct NodeEntry {
    /// Raw register annotations, to decode again only when they change.
    raw: Vec<Option<String>>,
    snapshot: NodeSnapshot,
}

/// Nodes, their GPUs and usage; pods and what they hold.
#[derive(Debug, Default)]
pub struct ClusterState {
    nodes: HashMap<String, NodeEntry>,
    pods: HashMap<String, PodEntry>,
    pods_by_node: HashMap<String, HashSet<String>>,
    /// Problems seen while reading pods (bad annotations), by pod uid.
    pub pod_problems: HashMap<String, String>,
}

fn uid(pod: &Pod) -> Option<String> {
    pod.metadata.uid.clone()
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or updates a node from the informer.
    pub fn upsert_node(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let raw: Vec<Option<String>> = Vendor::ALL
            .iter()
            .map(|v| annotations.get(v.names().node_register).cloned())
            .collect();
        if self.nodes.get(&name).is_some_and(|e| e.raw == raw) {
            return;
        }
        let devices = Arc::new(NodeDevices::from_annotations(&name, &annotations));
        self.nodes.insert(
            name.clone(),
            NodeEntry {
                raw,
                snapshot: NodeSnapshot::idle(devices),
            },
        );
        self.recount(&name);
    }

    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Replaces every node (after an informer relist).
    pub fn reset_nodes<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Node>) {
        let mut seen = HashSet::new();
        for node in nodes {
            if let Some(name) = &node.metadata.name {
                seen.insert(name.clone());
            }
            self.upsert_node(node);
        }
        self.nodes.retain(|name, _| seen.contains(name));
    }

    /// Adds or updates a pod from the informer.
    pub fn upsert_pod(&mut self, pod: &Pod) {
        let Some(uid) = uid(pod) else { return };
        let holding = match pod_holding(pod) {
            Ok(h) => {
                self.pod_problems.remove(&uid);
                h
            }
            Err(e) => {
                self.pod_problems.insert(uid.clone(), e.to_string());
                None
            }
        };
        if let Some(entry) = self.pods.get(&uid)
            && let Some(expected) = &entry.pending
        {
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            let caught_up = expected
                .iter()
                .all(|(key, value)| annotations.get(*key) == Some(value));
            if !caught_up && !is_terminal(pod) {
                return;
            }
        }
        match holding {
            Some(holding) => self.set_pod(
                uid,
                PodEntry {
                    holding,
                    pending: None,
                },
            ),
            None => self.drop_holding(&uid),
        }
    }

    /// The pod was deleted.
    pub fn remove_pod(&mut self, uid: &str) {
        self.pod_problems.remove(uid);
        self.drop_holding(uid);
    }

    fn drop_holding(&mut self, uid: &str) {
        if let Some(entry) = self.pods.remove(uid) {
            if let Some(set) = self.pods_by_node.get_mut(&entry.holding.node) {
                set.remove(uid);
            }
            self.recount(&entry.holding.node);
        }
    }

    /// Replaces every pod (after an informer relist); pending decisions of pods still
    /// present are kept.
    pub fn reset_pods<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) {
        let mut seen = HashSet::new();
        for pod in pods {
            if let Some(uid) = uid(pod) {
                seen.insert(uid);
            }
            self.upsert_pod(pod);
        }
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            self.remove_pod(&uid);
        }
    }

    /// Records a filter decision before its patch is sent.
    pub fn reserve(
        &mut self,
        uid: &str,
        holding: PodHolding,
        annotations: BTreeMap<&'static str, String>,
    ) {
        self.set_pod(
            uid.to_owned(),
            PodEntry {
                holding,
                pending: Some(annotations),
            },
        );
    }

    /// Drops whatever the pod holds (a re-filter, or a patch that failed).
    pub fn release(&mut self, uid: &str) {
        self.drop_holding(uid);
    }

    fn set_pod(&mut self, uid: String, entry: PodEntry) {
        let node = entry.holding.node.clone();
        if let Some(old) = self.pods.insert(uid.clone(), entry)
            && old.holding.node != node
        {
            if let Some(set) = self.pods_by_node.get_mut(&old.holding.node) {
                set.remove(&uid);
            }
            self.recount(&old.holding.node);
        }
        self.pods_by_node
            .entry(node.clone())
            .or_default()
            .insert(uid);
        self.recount(&node);
    }

    /// Recomputes a node's usage from its pods (cheap: a node holds few pods).
    fn recount(&mut self, node: &str) {
        let Some(entry) = self.nodes.get_mut(node) else {
            return;
        };
        let mut snapshot = NodeSnapshot::idle(entry.snapshot.devices.clone());
        if let Some(uids) = self.pods_by_node.get(node) {
            for uid in uids {
                if let Some(pod) = self.pods.get(uid) {
                    snapshot.charge(&pod.holding.charges);
                }
            }
        }
        entry.snapshot = snapshot;
    }

    pub fn node(&self, name: &str) -> Option<&NodeSnapshot> {
        self.nodes.get(name).map(|e| &e.snapshot)
    }

    pub fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeSnapshot> {
        self.nodes.values().map(|e| &e.snapshot)
    }

    pub fn holding(&self, uid: &str) -> Option<&PodHolding> {
        self.pods.get(uid).map(|e| &e.holding)
    }

    pub fn is_pending(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|e| e.pending.is_some())
    }

    /// Every pod holding GPUs, with its uid.
    pub fn holdings(&self) -> impl Iterator<Item = (&String, &PodHolding)> {
        self.pods.iter().map(|(uid, e)| (uid, &e.holding))
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, devmem: u64) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
            "hami.io/node-amd-register": format!(r#"[{{"id":"{name}-gpu","count":10,"devmem":{devmem},"devcore":100,"type":"AMD X","health":true}}]"#)
        }}})).unwrap()
    }

    fn pod(uid: &str, node: &str, allocated: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {
                "hami.io/vgpu-node": node, "hami.io/amd-devices-allocated": allocated}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn usage_follows_pods() {
        let mut s = ClusterState::new();
        s.upsert_node(&node("n1", 1000));
        s.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,100,10:;", "Running"));
        s.upsert_pod(&pod("p2", "n1", "n1-gpu,AMD X,200,20:;", "Pending"));
        assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 300);
        s.upsert_pod(&pod("p2", "n1", "n1-gpu,AMD X,200,20:;", "Succeeded"));
        assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 100);
        s.remove_pod("p1");
        assert_eq!(s.node("n1").unwrap().usage[0].used, 0);
        // A pod seen before its node still counts once the node arrives.
        s.upsert_pod(&pod("p3", "n2", "n2-gpu,AMD X,50,5:;", "Running"));
        s.upsert_node(&node("n2", 1000));
        assert_eq!(s.node("n2").unwrap().usage[0].mem_mib, 50);
        // Re-registration with new devices keeps the pods' usage.
        s.upsert_node(&node("n2", 2000));
        assert_eq!(s.node("n2").unwrap().usage[0].mem_mib, 50);
        assert_eq!(s.node("n2").unwrap().devices.gpus[0].info.devmem, 2000);
    }

    #[test]
    fn bad_pod_annotation_is_a_problem_not_a_crash() {
        let mut s = ClusterState::new();
        s.upsert_node(&node("n1", 1000));
        s.upsert_pod(&pod("p1", "n1", "garbage", "Running"));
        assert!(s.pod_problems["p1"].contains("hami.io/amd-devices-allocated"));
        assert_eq!(s.pod_count(), 0);
    }

    #[test]
    fn pending_decision_survives_stale_informer_events() {
        let mut s = ClusterState::new();
        s.upsert_node(&node("n1", 1000));
        let charges = vec![DeviceCharge {
            uuid: "n1-gpu".into(),
            slots: 1,
            mem_mib: 400,
            cores: 40,
        }];
        let mut expected = BTreeMap::new();
        expected.insert(
            "hami.io/amd-devices-allocated",
            "n1-gpu,AMD X,400,40:;".to_string(),
        );
        s.reserve(
            "p1",
            PodHolding {
                namespace: "ns".into(),
                name: "p1".into(),
                node: "n1".into(),
                charges,
            },
            expected,
        );
        assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 400);
        // The informer still shows the pod without our annotations: keep the reservation.
        let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "p1", "uid": "p1"}, "spec": {"containers": [{"name": "c"}]}})).unwrap();
        s.upsert_pod(&bare);
        assert!(s.is_pending("p1"));
        assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 400);
        // Now the patch came back.
        s.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,400,40:;", "Pending"));
        assert!(!s.is_pending("p1"));
        assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 400);
        // Relist without the pod: it is gone.
        s.reset_pods(std::iter::empty());
        assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 0);
    }
}
