//! The shell's path: pods placed by the scheduler's own filter decision into its
//! `ClusterState`, read into a `Cluster` (`Cluster::from_state`, `PodRequest::from_pod`),
//! planned, measured, and the plan applied.

use std::collections::HashMap;

use hami_defrag_core::{Cluster, PodRequest, Policy, Target, apply, measure, plan};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::extender::{FilterConfig, decide_filter};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use crate::fixtures::movable;

fn node(name: &str) -> Node {
    let cards: Vec<serde_json::Value> = (0..2)
        .map(|i| {
            json!({"id": format!("{name}-{i}"), "count": 10, "devmem": 65536,
            "devcore": 104, "type": "AMD Instinct MI210", "health": true})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-amd-register": serde_json::to_string(&cards).unwrap()}}}))
    .unwrap()
}

fn pod(name: &str, mem: u64, cores: u32, policy: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns",
        "uid": format!("uid-{name}"),
        "annotations": {"hami.io/gpu-scheduler-policy": policy,
            "hami.io/node-scheduler-policy": "spread"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "amd.com/gpu": "1", "amd.com/gpumem": mem.to_string(),
            "amd.com/gpucores": cores.to_string()}}}]}}))
    .unwrap()
}

#[test]
fn a_plan_over_the_schedulers_own_state() {
    let mut state = ClusterState::new();
    let names: Vec<String> = ["a", "b"].map(String::from).to_vec();
    for n in &names {
        state.upsert_node(&node(n));
    }
    // Spread puts one quarter pod on each of the four cards: none takes 7/8 now.
    let mut pods = HashMap::new();
    for i in 0..4 {
        let p = pod(&format!("q{i}"), 16_384, 25, "spread");
        let decision = decide_filter(&mut state, &p, &names, &FilterConfig::default(), 0);
        assert!(decision.patch.is_some(), "{:?}", decision.result);
        pods.insert(p.metadata.uid.clone().unwrap(), p);
    }
    let cluster = Cluster::from_state(&state, |uid, _| {
        let p = pods.get(uid)?;
        let request = PodRequest::from_pod(p, &RequestDefaults::default(), GpuPolicy::default());
        Some((request.ok()?, movable()))
    });
    assert_eq!(cluster.nodes.len(), 2);
    assert_eq!(cluster.pods.len(), 4);
    assert_eq!(measure(&cluster.nodes).amd.idle_cards, 0);
    let big = pod("big", 57_344, 87, "binpack");
    let request =
        PodRequest::from_pod(&big, &RequestDefaults::default(), GpuPolicy::default()).unwrap();
    let target = Target::FitPod {
        pod: "ns/big".into(),
        request: Box::new(request),
    };
    let p = plan(&cluster, &target, &Policy::default()).unwrap();
    assert!(p.reached && p.moves.len() == 1, "{p:?}");
    let (after, skipped) = apply(&cluster, &p);
    assert!(skipped.is_empty());
    assert_eq!(measure(&after.nodes).amd.idle_cards, 1);
    // A pod the shell cannot read is refused with what to fix.
    let bad = pod("bad", 1, 1, "sideways");
    let err =
        PodRequest::from_pod(&bad, &RequestDefaults::default(), GpuPolicy::default()).unwrap_err();
    assert!(err.contains("ns/bad") && err.contains("sideways"), "{err}");
}
