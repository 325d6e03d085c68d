use super::*;
use crate::extender::decide_filter;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

/// Node `name` with one AMD GPU `<name>-gpu`: 10 shares, 1000 MiB, 100 CUs.
fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-amd-register": format!(r#"[{{"id":"{name}-gpu","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true}}]"#)
    }}}))
    .unwrap()
}

/// An unbound pod of `priority` asking for `mem` MiB and `cores` % of one AMD GPU.
fn pod(uid: &str, priority: i32, mem: u32, cores: u32, status: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"schedulerName": "hami-scheduler", "priority": priority, "containers": [{"name": "c",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": mem.to_string(),
                "amd.com/gpucores": cores.to_string()}}}]},
        "status": status
    }))
    .unwrap()
}

fn nominated_to(node: &str) -> Value {
    json!({"phase": "Pending", "nominatedNodeName": node})
}

/// A priority-0 pod the scheduler placed on `node`, holding `mem` MiB and `cus` CUs.
fn holder(uid: &str, node: &str, mem: u32, cus: u32, deleting: bool) -> Pod {
    let mut value = json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {
            "hami.io/vgpu-node": node,
            "hami.io/amd-devices-allocated": format!("{node}-gpu,AMD X,{mem},{cus}:;")}},
        "spec": {"schedulerName": "hami-scheduler", "nodeName": node, "priority": 0,
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}
    });
    if deleting {
        value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    serde_json::from_value(value).unwrap()
}

/// The node Filter chooses for `pod` among `names` (its decision is reserved), if any.
fn filter_on(state: &mut ClusterState, pod: &Pod, names: &[&str]) -> Option<String> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let d = decide_filter(state, pod, &names, &FilterConfig::default(), 0);
    assert!(d.result.error.is_empty(), "{}", d.result.error);
    d.result.nodenames.and_then(|n| n.into_iter().next())
}

#[test]
fn a_lower_priority_pod_cannot_take_the_slice_a_nominated_pod_holds() {
    let mut state = ClusterState::new();
    state.upsert_node(&node("n"));
    // 400 MiB / 40 CUs used; the preemptor, nominated to n, will take 500 / 50 of the rest.
    state.upsert_pod(&holder("old", "n", 400, 40, false));
    let high = pod("high", 1000, 500, 50, nominated_to("n"));
    state.upsert_pod(&high);
    assert_eq!(state.nominations().len(), 1);

    // 200 / 20 fits beside "old" alone, not beside the preemptor's slice too.
    let low = pod("low", 0, 200, 20, json!({}));
    assert_eq!(filter_on(&mut state, &low, &["n"]), None);
    // As kube-scheduler's addNominatedPods: an equal priority does not pass it either...
    let equal = pod("equal", 1000, 200, 20, json!({}));
    assert_eq!(filter_on(&mut state, &equal, &["n"]), None);
    // ...a higher one does (the nomination does not hold against it).
    let higher = pod("higher", 2000, 200, 20, json!({}));
    assert_eq!(filter_on(&mut state, &higher, &["n"]).as_deref(), Some("n"));
    state.release("higher");
    // The refusals charged nothing to the state: the nomination is per call.
    assert_eq!(state.node("n").unwrap().usage[0].mem_mib, 400);

    // The nominated pod itself is not blocked by its own nomination.
    assert_eq!(filter_on(&mut state, &high, &["n"]).as_deref(), Some("n"));
    assert_eq!(state.node("n").unwrap().usage[0].mem_mib, 900);
    // Now its decision is its holding: counted once, so the last 100 / 10 is free.
    let small = pod("small", 0, 100, 10, json!({}));
    assert_eq!(filter_on(&mut state, &small, &["n"]).as_deref(), Some("n"));
}

#[test]
fn a_pod_nominated_to_another_node_does_not_hold_anything_here() {
    let mut state = ClusterState::new();
    state.upsert_node(&node("n"));
    state.upsert_node(&node("m"));
    // The whole of m's GPU is held for the preemptor.
    state.upsert_pod(&pod("high", 1000, 1000, 100, nominated_to("m")));
    let low = pod("low", 0, 200, 20, json!({}));
    // Binpack would choose m (its name sorts first on a tie): held, so n.
    let names = vec!["m".to_string(), "n".to_string()];
    let d = decide_filter(&mut state, &low, &names, &FilterConfig::default(), 0);
    assert_eq!(d.result.nodenames, Some(vec!["n".to_string()]));
    assert!(d.result.failed_nodes.contains_key("m"), "{:?}", d.result);
    state.release("low");
    assert_eq!(filter_on(&mut state, &low, &["n"]).as_deref(), Some("n"));
}

#[test]
fn the_slice_is_held_where_the_pods_being_deleted_free_room() {
    let mut state = ClusterState::new();
    state.upsert_node(&node("n"));
    // The victim (600 / 60) is still running; "keep" holds 300 / 30; 100 / 10 is free.
    state.upsert_pod(&holder("victim", "n", 600, 60, false));
    state.upsert_pod(&holder("keep", "n", 300, 30, false));
    state.upsert_pod(&pod("high", 1000, 700, 70, nominated_to("n")));
    let low = pod("low", 0, 100, 10, json!({}));
    // No room for the preemptor even later: it holds nothing, the free 100 / 10 is low's.
    assert_eq!(filter_on(&mut state, &low, &["n"]).as_deref(), Some("n"));
    state.release("low");
    // The victim is being deleted: its slice is still charged (its containers still run),
    // and the preemptor (700 / 70) will take it with the free rest of the card: low may not.
    state.upsert_pod(&holder("victim", "n", 600, 60, true));
    assert_eq!(state.node("n").unwrap().usage[0].mem_mib, 900);
    assert_eq!(filter_on(&mut state, &low, &["n"]), None);
    // Gone: still held, until the preemptor's own filter takes it.
    state.remove_pod("victim");
    assert_eq!(filter_on(&mut state, &low, &["n"]), None);
}

#[test]
fn only_nominated_unbound_live_gpu_pods_of_this_scheduler_are_kept() {
    let mut state = ClusterState::new();
    let nominated = pod("p", 10, 100, 10, nominated_to("n"));
    state.upsert_pod(&nominated);
    assert_eq!(state.nominations().get("p").map(|n| n.priority), Some(10));
    // The nomination cleared.
    state.upsert_pod(&pod("p", 10, 100, 10, json!({"phase": "Pending"})));
    assert!(state.nominations().is_empty());
    // Bound.
    state.upsert_pod(&nominated);
    let mut bound = nominated.clone();
    bound.spec.as_mut().unwrap().node_name = Some("n".into());
    state.upsert_pod(&bound);
    assert!(state.nominations().is_empty());
    // Being deleted; deleted.
    state.upsert_pod(&nominated);
    let mut deleting = serde_json::to_value(&nominated).unwrap();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    state.upsert_pod(&serde_json::from_value(deleting).unwrap());
    assert!(state.nominations().is_empty());
    state.upsert_pod(&nominated);
    state.remove_pod("p");
    assert!(state.nominations().is_empty());
    // Asking for no GPU, or another scheduler's: nothing to hold for.
    let mut plain = nominated.clone();
    plain.spec.as_mut().unwrap().containers[0].resources = None;
    state.upsert_pod(&plain);
    let mut other = nominated.clone();
    other.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    state.upsert_pod(&other);
    assert!(state.nominations().is_empty());
    // A relist that no longer shows it forgets it.
    state.upsert_pod(&nominated);
    state.reset_pods(std::iter::empty());
    assert!(state.nominations().is_empty());
}
