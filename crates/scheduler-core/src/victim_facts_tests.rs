//! The per-node lists the preempt verb takes under the state's lock ([`node_pods`]):
//! reused until their node changes, and deciding as the facts copied per call did
//! ([`candidate_pods`], the shell's input before them) through any sequence of changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::{GpuPolicy, NodePolicy};
use k8s_openapi::api::core::v1::{Node, Pod};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::preemption::{
    HeldCandidate, NodeCandidate, Preemptor, decide_preemption, decide_preemption_held,
};

const NODES: [&str; 2] = ["n0", "n1"];

/// `node` with two GPUs, `n-G0` and `n-G1` (listed the other way round when `reversed`).
fn node(name: &str, reversed: bool) -> Node {
    let mut gpus: Vec<serde_json::Value> = (0..2)
        .map(|g| {
            json!({"id": format!("{name}-G{g}"), "count": 10, "devmem": 1000,
            "devcore": 100, "type": "NVIDIA-A100", "health": true})
        })
        .collect();
    if reversed {
        gpus.reverse();
    }
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-nvidia-register": serde_json::to_string(&gpus).unwrap()
    }}}))
    .unwrap()
}

/// A change the informers may bring.
#[derive(Debug, Clone)]
enum Change {
    /// Pod `k` placed (again) on node `node`, GPU `gpu`, with these facts.
    Place {
        k: usize,
        node: usize,
        gpu: usize,
        mem: u64,
        priority: i32,
        label: bool,
        deleting: bool,
    },
    /// Pod `k` deleted.
    Delete(usize),
    /// Node `node` registered again, its GPUs listed as given.
    Register { node: usize, reversed: bool },
}

fn placed(
    k: usize,
    node: &str,
    gpu: usize,
    mem: u64,
    priority: i32,
    label: bool,
    deleting: bool,
) -> Pod {
    let mut meta = json!({"name": format!("p{k}"), "namespace": "ns", "uid": format!("p{k}"),
        "labels": {"app": if label { "web" } else { "batch" }},
        "annotations": {"hami.io/vgpu-node": node,
            "hami.io/vgpu-devices-allocated": format!("{node}-G{gpu},NVIDIA,{mem},10:;")}});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    serde_json::from_value(json!({"metadata": meta,
        "spec": {"schedulerName": "hami-scheduler", "nodeName": node, "priority": priority,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    .unwrap()
}

fn apply(state: &mut ClusterState, change: &Change) {
    match change {
        Change::Place {
            k,
            node,
            gpu,
            mem,
            priority,
            label,
            deleting,
        } => state.upsert_pod(&placed(
            *k,
            NODES[*node],
            *gpu,
            *mem,
            *priority,
            *label,
            *deleting,
        )),
        Change::Delete(k) => state.remove_pod(&format!("p{k}")),
        Change::Register { node: n, reversed } => state.upsert_node(&node(NODES[*n], *reversed)),
    }
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        6 => (0usize..12, 0usize..2, 0usize..2, 1u64..5, 0i32..6, any::<bool>(), proptest::bool::weighted(0.1))
            .prop_map(|(k, node, gpu, mem, priority, label, deleting)| Change::Place {
                k, node, gpu, mem: mem * 100, priority, label, deleting,
            }),
        2 => (0usize..12).prop_map(Change::Delete),
        1 => (0usize..2, any::<bool>()).prop_map(|(node, reversed)| Change::Register { node, reversed }),
    ]
}

fn preemptor() -> Preemptor {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": "ns", "uid": "big"},
        "spec": {"priority": 4, "containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "700", "nvidia.com/gpucores": "40"}}}]}
    }))
    .unwrap();
    Preemptor::from_pod(
        &pod,
        &RequestDefaults::default(),
        GpuPolicy::default(),
        NodePolicy::Binpack,
    )
    .unwrap()
}

#[test]
fn a_node_list_is_shared_until_the_node_changes() {
    let mut state = ClusterState::new();
    state.upsert_node(&node("n0", false));
    state.upsert_pod(&placed(1, "n0", 0, 300, 1, false, false));
    state.upsert_pod(&placed(2, "n0", 1, 300, 1, false, false));
    let first = node_pods(&state, "n0").unwrap();
    assert!(Arc::ptr_eq(&first, &node_pods(&state, "n0").unwrap()));
    // The same pod seen again, unchanged: still shared.
    state.upsert_pod(&placed(1, "n0", 0, 300, 1, false, false));
    assert!(Arc::ptr_eq(&first, &node_pods(&state, "n0").unwrap()));
    // A holder's label changed: built again, with it.
    state.upsert_pod(&placed(1, "n0", 0, 300, 1, true, false));
    let second = node_pods(&state, "n0").unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(second.facts().next().unwrap().labels["app"], "web");
    // A holding gone: built again, without it.
    state.remove_pod("p2");
    let third = node_pods(&state, "n0").unwrap();
    assert_eq!(
        third.facts().map(|f| f.uid.as_str()).collect::<Vec<_>>(),
        ["p1"]
    );
    // An unknown node has none; a removed one neither.
    assert!(node_pods(&state, "n1").is_none());
    state.remove_node("n0");
    assert!(node_pods(&state, "n0").is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// After every change, each node's shared list holds the facts the per-call copy did,
    /// in the same order, and the decision on it is the decision on the copy.
    #[test]
    fn node_lists_decide_as_the_copies_did(changes in proptest::collection::vec(change(), 1..40)) {
        let mut state = ClusterState::new();
        for n in NODES {
            state.upsert_node(&node(n, false));
        }
        let pre = preemptor();
        let proposals: BTreeMap<String, Vec<String>> =
            NODES.iter().map(|n| (n.to_string(), Vec::new())).collect();
        for change in &changes {
            apply(&mut state, change);
            let copies: BTreeMap<&str, Vec<PodFacts>> =
                NODES.iter().map(|n| (*n, candidate_pods(&state, n, &[]))).collect();
            let lists: BTreeMap<&str, Arc<NodePods>> =
                NODES.iter().map(|n| (*n, node_pods(&state, n).unwrap())).collect();
            for n in NODES {
                let copied: Vec<PodFacts> = copies[n]
                    .iter()
                    .map(|p| PodFacts { charges: Vec::new(), ..p.clone() })
                    .collect();
                let listed: Vec<PodFacts> = lists[n].facts().cloned().collect();
                prop_assert_eq!(copied, listed);
            }
            let from_copies = decide_preemption(
                &pre,
                &proposals,
                |name| Some(NodeCandidate { snapshot: state.node(name)?, pods: copies.get(name)? }),
                &[],
            );
            let from_lists = decide_preemption_held(
                &pre,
                &proposals,
                |name| Some(HeldCandidate { snapshot: state.node(name)?, pods: lists.get(name)? }),
                &[],
            );
            prop_assert_eq!(from_copies, from_lists);
        }
    }
}
