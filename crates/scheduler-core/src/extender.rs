//! kube-scheduler extender v1 JSON (`k8s.io/kube-scheduler/extender/v1`) and the filter
//! decision over the cluster state.
//!
//! Go's JSON decoder matches keys case-insensitively and kube-scheduler relies on it, so
//! the argument types are read through [`from_json_any_case`].

use std::collections::BTreeMap;

use hami_protocol::device_list::encode_pod_devices;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::requests::{RequestDefaults, pod_ref, pod_requests};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, NodePolicy, PodPolicies};
use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fit::{FitRequest, Selectors, filter, refusal};
use crate::state::{ClusterState, PodHolding, pod_name};
use crate::usage::{collapse, container_grants};

/// `ExtenderArgs`.
#[derive(Debug, Clone, Deserialize)]
pub struct ExtenderArgs {
    /// The pod to place.
    pub pod: Option<Pod>,
    /// Full node objects (when the extender is not `nodeCacheCapable`); we only need names.
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (when the extender is `nodeCacheCapable`).
    #[serde(default)]
    pub nodenames: Option<Vec<String>>,
}

/// kube-scheduler's `NodeList`; only the items' names are read.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeList {
    /// The nodes, as JSON objects.
    #[serde(default)]
    pub items: Vec<Value>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Nodes that fit, as objects (answered when asked with objects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Names of the nodes that fit (answered when asked with names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
    /// Node name → why it does not fit (preemption may help).
    #[serde(
        rename = "failedNodes",
        skip_serializing_if = "BTreeMap::is_empty",
        default
    )]
    pub failed_nodes: BTreeMap<String, String>,
    /// Node name → why it does not fit in a way preempting pods cannot fix.
    #[serde(
        rename = "failedAndUnresolvableNodes",
        skip_serializing_if = "BTreeMap::is_empty",
        default
    )]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// A failure of the whole call; empty on success.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub error: String,
}

impl PartialEq for NodeList {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

/// `ExtenderBindingArgs`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ExtenderBindingArgs {
    /// The pod's name.
    #[serde(rename(serialize = "podName", deserialize = "podname"))]
    pub pod_name: String,
    /// The pod's namespace.
    #[serde(rename(serialize = "podNamespace", deserialize = "podnamespace"))]
    pub pod_namespace: String,
    /// The pod's UID.
    #[serde(rename(serialize = "podUID", deserialize = "poduid"), default)]
    pub pod_uid: String,
    /// The node kube-scheduler chose.
    pub node: String,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Why binding failed; empty on success.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub error: String,
}

/// `ExtenderPreemptionArgs` (no JSON tags in Go: `Pod`, `NodeNameToVictims`,
/// `NodeNameToMetaVictims`), read through `preemption::decode_args`, which matches the
/// victims' keys in any case too.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExtenderPreemptionArgs {
    /// The preemptor.
    pub pod: Option<Pod>,
    /// Node → victims as full pods (an extender that is not `nodeCacheCapable`).
    #[serde(rename = "nodenametovictims", default)]
    pub node_name_to_victims: Option<BTreeMap<String, Option<Victims>>>,
    /// Node → victims by UID (a `nodeCacheCapable` extender).
    #[serde(rename = "nodenametometavictims", default)]
    pub node_name_to_meta_victims: Option<BTreeMap<String, Option<MetaVictims>>>,
}

/// `Victims`: full pods.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Victims {
    /// The pods kube-scheduler would delete.
    #[serde(default)]
    pub pods: Option<Vec<Pod>>,
    /// How many of them violate a PodDisruptionBudget.
    #[serde(rename = "numpdbviolations", default)]
    pub num_pdb_violations: i64,
}

/// `MetaVictims`: pods by UID, as kube-scheduler sends them to a `nodeCacheCapable`
/// extender and as every extender answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    /// The pods to delete.
    #[serde(rename(serialize = "Pods", deserialize = "pods"), default)]
    pub pods: Option<Vec<MetaPod>>,
    /// How many of them violate a PodDisruptionBudget.
    #[serde(
        rename(serialize = "NumPDBViolations", deserialize = "numpdbviolations"),
        default
    )]
    pub num_pdb_violations: i64,
}

/// `MetaPod`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    /// The pod's UID.
    #[serde(rename(serialize = "UID", deserialize = "uid"))]
    pub uid: String,
}

/// `ExtenderPreemptionResult`, written as Go writes it (PascalCase keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExtenderPreemptionResult {
    /// The nodes kept, each with the victims to delete there.
    #[serde(rename = "NodeNameToMetaVictims")]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

/// Reads JSON whose top-level keys may be in any case (as Go's decoder allows); types
/// name their fields in lower case.
pub fn from_json_any_case<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("request body is not JSON: {e}"))?;
    let Value::Object(map) = value else {
        return Err("request body must be a JSON object".into());
    };
    let lowered: serde_json::Map<String, Value> = map
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    decode_value(Value::Object(lowered))
}

fn decode_value<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value)
        .map_err(|e| format!("request body does not match the extender API: {e}"))
}

/// Scheduler settings the filter decision uses.
#[derive(Debug, Clone)]
pub struct FilterConfig {
    /// How GPUs are chosen on a node when the pod does not say.
    pub gpu_policy: GpuPolicy,
    /// How nodes are ranked when the pod does not say.
    pub node_policy: NodePolicy,
    /// Request defaults for containers that leave fields out.
    pub defaults: RequestDefaults,
}

impl Default for FilterConfig {
    fn default() -> Self {
        Self {
            gpu_policy: GpuPolicy::default(),
            node_policy: NodePolicy::Binpack,
            defaults: RequestDefaults::default(),
        }
    }
}

/// What filter decided, for the shell to carry out.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterDecision {
    /// What kube-scheduler is answered.
    pub result: ExtenderFilterResult,
    /// Annotations (and the `hami.io/vgpu-node` label when it fits in a label) to merge
    /// into the pod; the state already holds the reservation.
    pub patch: Option<PodPatch>,
    /// An Event to record on the pod, e.g. why no node fits.
    pub event: Option<EventNote>,
    /// Refused nodes per refusal label (`fit::refusal_labels`), for the metrics.
    pub refusals: BTreeMap<&'static str, u64>,
}

/// A change to one pod's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPatch {
    /// The pod's UID: whose reservation to release if the patch fails.
    pub uid: String,
    /// Annotations to set.
    pub annotations: BTreeMap<String, String>,
    /// Labels to set.
    pub labels: BTreeMap<String, String>,
}

impl PodPatch {
    /// The JSON merge patch body.
    pub fn merge_patch(&self) -> Value {
        let mut metadata = serde_json::Map::new();
        metadata.insert(
            "annotations".into(),
            serde_json::to_value(&self.annotations).unwrap_or_default(),
        );
        if !self.labels.is_empty() {
            metadata.insert(
                "labels".into(),
                serde_json::to_value(&self.labels).unwrap_or_default(),
            );
        }
        serde_json::json!({ "metadata": metadata })
    }
}

/// An Event to record on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    /// Event reason, e.g. `FilteringFailed`.
    pub reason: &'static str,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// Event message.
    pub message: String,
}

fn error(message: String) -> FilterDecision {
    FilterDecision {
        result: ExtenderFilterResult {
            error: message,
            ..Default::default()
        },
        patch: None,
        event: None,
        refusals: BTreeMap::new(),
    }
}

/// Node names a kube-scheduler call asks about (nodeCacheCapable sends names; otherwise
/// full node objects).
pub fn candidate_names(args: &ExtenderArgs) -> Vec<String> {
    if let Some(names) = &args.nodenames {
        return names.clone();
    }
    args.nodes
        .as_ref()
        .map(|l| {
            l.items
                .iter()
                .filter_map(|n| {
                    n.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Decides filter for `pod` among `names`, reserving the chosen GPUs in `state`.
/// `now` is unix seconds (for `hami.io/vgpu-time`).
pub fn decide_filter(
    state: &mut ClusterState,
    pod: &Pod,
    names: &[String],
    config: &FilterConfig,
    now: i64,
) -> FilterDecision {
    let requests = match pod_requests(pod, &config.defaults) {
        Ok(r) => r,
        Err(e) => return error(format!("pod {}: {e}", pod_name(pod))),
    };
    if requests.iter().all(|r| r.is_empty()) {
        return FilterDecision {
            result: ExtenderFilterResult {
                nodenames: Some(names.to_vec()),
                ..Default::default()
            },
            patch: None,
            event: None,
            refusals: BTreeMap::new(),
        };
    }
    let Some(uid) = pod.metadata.uid.clone() else {
        return error(format!("pod {} has no uid", pod_name(pod)));
    };
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let selectors = match (
        DeviceSelector::from_annotations(Vendor::Amd, &annotations),
        DeviceSelector::from_annotations(Vendor::Nvidia, &annotations),
        PodPolicies::from_annotations(&annotations),
    ) {
        (Ok(amd), Ok(nvidia), Ok(policies)) => (Selectors { amd, nvidia }, policies),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return error(format!("pod {}: {e}", pod_name(pod)));
        }
    };
    let (selectors, policies) = selectors;
    let req = FitRequest {
        containers: &requests,
        selectors: &selectors,
        gpu_policy: policies.gpu.unwrap_or(config.gpu_policy),
        node_policy: policies.node.unwrap_or(config.node_policy),
    };
    // A re-filter voids the pod's previous decision.
    state.release(&uid);
    // Pods nominated after a preemption hold their slices for this run (`nominated`).
    let nominated = crate::nominated::charged_snapshots(state, pod, names, config);
    // Defrag reservations (issue 32): others' cards charged, the owner's steered to.
    let reserved = crate::reservations::for_filter(
        state,
        pod,
        names,
        |name| nominated.get(name).or_else(|| state.node(name)),
        now,
    );
    let mut failed = BTreeMap::new();
    let mut unknown = 0;
    let mut snapshots = Vec::with_capacity(names.len());
    for name in names {
        let current = reserved.charged.get(name).or_else(|| nominated.get(name));
        match current.or_else(|| state.node(name)) {
            Some(snapshot) => snapshots.push(snapshot),
            None => {
                unknown += 1;
                failed.insert(name.clone(), "node unregistered".to_owned());
            }
        }
    }
    let outcome = crate::reservations::steered(&reserved.steer, &snapshots, &req)
        .unwrap_or_else(|| filter(snapshots, &req));
    // Unknown nodes and those `filter` found no eviction could cure (others' defrag
    // reservations kept): kube-scheduler never offers them to preemption.
    let uncured = crate::reservations::uncured(
        &reserved,
        outcome
            .failed
            .keys()
            .filter(|n| !outcome.unresolvable.contains(*n)),
        &req,
    );
    let mut unresolvable: BTreeMap<String, String> = failed.clone();
    for (name, why) in outcome.failed {
        if outcome.unresolvable.contains(&name) || uncured.contains(&name) {
            unresolvable.insert(name.clone(), why.clone());
        }
        failed.insert(name, why);
    }
    let mut refusals = outcome.refusals;
    if unknown > 0 {
        *refusals.entry(refusal::NODE_UNREGISTERED).or_default() += unknown;
    }
    let Some((node, placement)) = outcome.chosen else {
        let message = format!(
            "no available node, {} nodes do not meet: {}",
            failed.len(),
            summarize(&failed)
        );
        return FilterDecision {
            result: split_failed(failed, unresolvable, None),
            patch: None,
            event: Some(EventNote {
                reason: "FilteringFailed",
                warning: true,
                message,
            }),
            refusals,
        };
    };
    let mut annotations = BTreeMap::new();
    let mut device_lists = BTreeMap::new();
    let kinds: Vec<_> = requests.iter().map(|r| r.kind).collect();
    let mut charges = Vec::new();
    let mut grants = Vec::new();
    for (vendor, runs) in &placement.runs {
        let text = match encode_pod_devices(runs) {
            Ok(text) => text,
            Err(e) => {
                return error(format!(
                    "cannot encode the decision for pod {}: {e}",
                    pod_name(pod)
                ));
            }
        };
        let names = vendor.names();
        device_lists.insert(names.devices_allocated, text.clone());
        annotations.insert(names.devices_to_allocate.to_owned(), text.clone());
        annotations.insert(names.devices_allocated.to_owned(), text);
        charges.extend(collapse(&kinds, runs));
        grants.extend(container_grants(runs));
    }
    annotations.insert(pod_keys::VGPU_NODE.to_owned(), node.clone());
    annotations.insert(pod_keys::VGPU_TIME.to_owned(), now.to_string());
    let mut labels = BTreeMap::new();
    // Label values are limited to 63 characters; the annotation always carries the name.
    if node.len() <= 63 {
        labels.insert(pod_keys::VGPU_NODE.to_owned(), node.clone());
    }
    state.reserve(
        &uid,
        {
            let owner = pod_ref(pod);
            PodHolding {
                namespace: owner.namespace,
                name: owner.name,
                node: node.clone(),
                charges,
                grants,
            }
        },
        device_lists,
    );
    state.reservations.note_placed(pod);
    let top: Vec<String> = outcome
        .top
        .iter()
        .map(|(n, s)| format!("{n}:{s:.2}"))
        .collect();
    let more = if outcome.fitting > top.len() {
        ",..."
    } else {
        ""
    };
    let message = format!(
        "find fit node({node}), {} nodes not fit, {} nodes fit({}{more})",
        failed.len(),
        outcome.fitting,
        top.join(",")
    );
    FilterDecision {
        result: split_failed(failed, unresolvable, Some(vec![node])),
        patch: Some(PodPatch {
            uid,
            annotations,
            labels,
        }),
        event: Some(EventNote {
            reason: "FilteringSucceed",
            warning: false,
            message,
        }),
        refusals,
    }
}

/// The filter result naming `nodenames`, the refused nodes split into `failedNodes` and
/// `failedAndUnresolvableNodes` (each refused node in exactly one).
fn split_failed(
    mut failed: BTreeMap<String, String>,
    unresolvable: BTreeMap<String, String>,
    nodenames: Option<Vec<String>>,
) -> ExtenderFilterResult {
    failed.retain(|name, _| !unresolvable.contains_key(name));
    ExtenderFilterResult {
        nodenames,
        failed_nodes: failed,
        failed_and_unresolvable_nodes: unresolvable,
        ..Default::default()
    }
}

/// Groups failure reasons for the event message: `"<reason> (on <n> nodes: <nodes>)"`, at
/// most a few nodes named per reason.
fn summarize(failed: &BTreeMap<String, String>) -> String {
    let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, reason) in failed {
        by_reason.entry(reason).or_default().push(node);
    }
    by_reason
        .into_iter()
        .map(|(reason, nodes)| {
            let shown: Vec<&str> = nodes.iter().take(5).copied().collect();
            let more = if nodes.len() > 5 {
                format!(" and {} more", nodes.len() - 5)
            } else {
                String::new()
            };
            let plural = if nodes.len() == 1 { "" } else { "s" };
            format!(
                "{reason} (on {} node{plural}: {}{more})",
                nodes.len(),
                shown.join(",")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
            "hami.io/node-amd-register": format!(r#"[{{"id":"{name}-gpu","count":10,"devmem":196288,"devcore":304,"type":"AMD Instinct MI300X","health":true}}]"#)
        }}})).unwrap()
    }

    fn pod(uid: &str, limits: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "c", "resources": {"limits": limits}}]}})).unwrap()
    }

    #[test]
    fn args_in_any_case() {
        let args: ExtenderArgs =
            from_json_any_case(br#"{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", "b"]}"#)
                .unwrap();
        assert_eq!(candidate_names(&args), vec!["a", "b"]);
        let args: ExtenderArgs = from_json_any_case(br#"{"pod": {"metadata": {"name": "p"}}, "nodes": {"items": [{"metadata": {"name": "x"}}]}}"#).unwrap();
        assert_eq!(candidate_names(&args), vec!["x"]);
        let bind: ExtenderBindingArgs = from_json_any_case(
            br#"{"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}"#,
        )
        .unwrap();
        assert_eq!(bind.pod_uid, "u");
        // Written as kube-scheduler writes it, read back through any-case matching.
        let text = serde_json::to_string(&bind).unwrap();
        assert_eq!(
            text,
            r#"{"podName":"p","podNamespace":"ns","podUID":"u","node":"n"}"#
        );
        assert_eq!(
            from_json_any_case::<ExtenderBindingArgs>(text.as_bytes()).unwrap(),
            bind
        );
        for bad in [
            &b"nope"[..],
            b"[]",
            br#"{"pod": 3}"#,
            br#"{"podName": "p"}"#,
        ] {
            assert!(
                from_json_any_case::<ExtenderBindingArgs>(bad).is_err()
                    || from_json_any_case::<ExtenderArgs>(bad).is_err()
            );
        }
        let result = ExtenderFilterResult {
            nodenames: Some(vec!["n".into()]),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"nodenames":["n"]}"#
        );
        let mut failed = ExtenderFilterResult::default();
        failed.failed_nodes.insert("n".into(), "r".into());
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"failedNodes":{"n":"r"}}"#
        );
    }

    #[test]
    fn two_half_pods_share_then_the_third_fails() {
        let mut state = ClusterState::new();
        state.upsert_node(&node("n1"));
        let names = vec!["n1".to_string(), "ghost".to_string()];
        let half = json!({"amd.com/gpu": "1", "amd.com/gpumem": "1024", "amd.com/gpucores": "50"});
        for uid in ["p1", "p2"] {
            let d = decide_filter(
                &mut state,
                &pod(uid, half.clone()),
                &names,
                &FilterConfig::default(),
                1_787_293_239,
            );
            assert_eq!(d.result.nodenames, Some(vec!["n1".to_string()]));
            // Unknown to the scheduler: no eviction can make room there.
            assert_eq!(
                d.result.failed_and_unresolvable_nodes["ghost"],
                "node unregistered"
            );
            assert!(!d.result.failed_nodes.contains_key("ghost"));
            let patch = d.patch.unwrap();
            assert_eq!(
                patch.annotations["hami.io/amd-devices-allocated"],
                ";n1-gpu,AMD Instinct MI300X,1024,152:;"
            );
            assert_eq!(
                patch.annotations["hami.io/amd-devices-to-allocate"],
                patch.annotations["hami.io/amd-devices-allocated"]
            );
            assert_eq!(patch.annotations["hami.io/vgpu-node"], "n1");
            assert_eq!(patch.annotations["hami.io/vgpu-time"], "1787293239");
            assert_eq!(patch.labels["hami.io/vgpu-node"], "n1");
            assert_eq!(d.event.unwrap().reason, "FilteringSucceed");
        }
        let d = decide_filter(
            &mut state,
            &pod("p3", half.clone()),
            &names,
            &FilterConfig::default(),
            0,
        );
        assert_eq!(d.result.nodenames, None);
        // Full, but it fits once the others go: offered to preemption.
        assert_eq!(
            d.result.failed_nodes["n1"],
            "container c: 1/1 CardInsufficientCore"
        );
        let unresolvable: Vec<&String> = d.result.failed_and_unresolvable_nodes.keys().collect();
        assert_eq!(unresolvable, ["ghost"]);
        let event = d.event.unwrap();
        assert!(
            event.warning
                && event
                    .message
                    .starts_with("no available node, 2 nodes do not meet"),
            "{}",
            event.message
        );
        // Re-filtering p1 frees its old reservation first, so it fits again.
        let d = decide_filter(
            &mut state,
            &pod("p1", half),
            &names,
            &FilterConfig::default(),
            0,
        );
        assert_eq!(d.result.nodenames, Some(vec!["n1".to_string()]));
        assert_eq!(state.node("n1").unwrap().usage[0].cores, 304);
    }

    #[test]
    fn pods_without_gpus_pass_through_and_bad_pods_error() {
        let mut state = ClusterState::new();
        let names = vec!["a".to_string()];
        let d = decide_filter(
            &mut state,
            &pod("p", json!({"cpu": "1"})),
            &names,
            &FilterConfig::default(),
            0,
        );
        assert_eq!(d.result.nodenames, Some(names.clone()));
        assert!(d.patch.is_none());
        let d = decide_filter(
            &mut state,
            &pod("p", json!({"amd.com/gpu": "1", "amd.com/gpucores": "150"})),
            &names,
            &FilterConfig::default(),
            0,
        );
        assert!(
            d.result.error.contains("amd.com/gpucores"),
            "{}",
            d.result.error
        );
        let mut p = pod("p", json!({"amd.com/gpu": "1"}));
        p.metadata.annotations = Some(
            [(
                "hami.io/gpu-scheduler-policy".to_string(),
                "fastest".to_string(),
            )]
            .into(),
        );
        let d = decide_filter(&mut state, &p, &names, &FilterConfig::default(), 0);
        assert!(
            d.result.error.contains("hami.io/gpu-scheduler-policy"),
            "{}",
            d.result.error
        );
    }

    #[test]
    fn long_node_names_get_no_label() {
        let long = "n".repeat(64);
        let mut state = ClusterState::new();
        state.upsert_node(&node(&long));
        let d = decide_filter(
            &mut state,
            &pod("p", json!({"amd.com/gpu": "1"})),
            std::slice::from_ref(&long),
            &FilterConfig::default(),
            0,
        );
        let patch = d.patch.unwrap();
        assert_eq!(patch.annotations["hami.io/vgpu-node"], long);
        assert!(patch.labels.is_empty());
        assert!(patch.merge_patch()["metadata"].get("labels").is_none());
    }
}
