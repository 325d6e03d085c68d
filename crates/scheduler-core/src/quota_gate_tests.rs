use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, ResourceQuota};
use serde_json::json;

use super::*;
use crate::extender::FilterConfig;
use crate::quota::{Amounts, Dimension, QuotaKey, QuotaWarning};

const AMD_MEM: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::MemoryMib);
const AMD_CORES: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::CoresPercent);
const NV_MEM: QuotaKey = QuotaKey::new(Vendor::Nvidia, Dimension::MemoryMib);

/// Node `n1` with one MI300X (304 CUs, 1000 MiB) and one A100 (10000 MiB).
fn node() -> Node {
    serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":304,"type":"AMD Instinct MI300X","health":true}]"#,
        "hami.io/node-nvidia-register": r#"[{"id":"N","count":10,"devmem":10000,"devcore":100,"type":"NVIDIA A100","health":true}]"#
    }}}))
    .unwrap()
}

fn quota(name: &str, hard: serde_json::Value) -> ResourceQuota {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "team"}, "spec": {"hard": hard}}),
    )
    .unwrap()
}

fn pod(uid: &str, limits: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": uid, "namespace": "team", "uid": uid},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": limits}}]}}))
    .unwrap()
}

/// `pod` placed on `n1` with `allocated` as its AMD device list, in `phase`.
fn placed(uid: &str, allocated: &str, phase: &str) -> Pod {
    let mut p = pod(uid, json!({"amd.com/gpu": "1"}));
    p.metadata.annotations = Some(
        [
            ("hami.io/vgpu-node".to_string(), "n1".to_string()),
            (
                "hami.io/amd-devices-allocated".to_string(),
                allocated.to_string(),
            ),
        ]
        .into(),
    );
    p.status = Some(serde_json::from_value(json!({"phase": phase})).unwrap());
    p
}

fn used(state: &ClusterState, key: QuotaKey) -> u64 {
    state.quota.ledger().used("team").get(key)
}

fn filter(state: &mut ClusterState, p: &Pod) -> FilterDecision {
    let names = vec!["n1".to_string()];
    filter_within_quota(state, p, &names, &FilterConfig::default(), 0)
}

#[test]
fn a_charge_follows_the_holding_and_an_amd_share_is_charged_again_once_the_node_is_known() {
    let mut state = ClusterState::new();
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.amd.com/gpucores": "100"})));
    // Listed before its node: the GPU's CUs are unknown, so the whole GPU is charged.
    state.upsert_pod(&placed("a", "G,AMD Instinct MI300X,100,76:;", "Running"));
    assert_eq!(used(&state, AMD_CORES), 100);
    assert_eq!(used(&state, AMD_MEM), 100);
    // The node arrives: 76 of 304 CUs is 25 % of the GPU.
    state.upsert_node(&node());
    assert_eq!(used(&state, AMD_CORES), 25);
    // Finished: released.
    state.upsert_pod(&placed("a", "G,AMD Instinct MI300X,100,76:;", "Succeeded"));
    assert_eq!(state.quota.ledger().used("team"), Amounts::default());
    // Deleted while running: released with its holding.
    state.upsert_pod(&placed("b", "G,AMD Instinct MI300X,100,76:;", "Running"));
    assert_eq!(used(&state, AMD_MEM), 100);
    state.remove_pod("b");
    assert_eq!(used(&state, AMD_MEM), 0);
}

#[test]
fn filter_charges_the_chosen_gpu_and_refuses_past_the_quota_as_unresolvable() {
    let mut state = ClusterState::new();
    state.upsert_node(&node());
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.nvidia.com/gpumem": "2500"})));
    // 10 % of the A100's 10000 MiB: charged 1000 MiB, the GPU's real memory.
    let pct = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "10", "nvidia.com/gpucores": "10"});
    let d = filter(&mut state, &pod("a", pct.clone()));
    assert_eq!(d.result.nodenames, Some(vec!["n1".to_string()]));
    assert_eq!(used(&state, NV_MEM), 1000);
    // Filtering it again replaces its own charge: not counted twice.
    let d = filter(&mut state, &pod("a", pct.clone()));
    assert!(d.result.nodenames.is_some(), "{d:?}");
    assert_eq!(used(&state, NV_MEM), 1000);
    let d = filter(&mut state, &pod("b", pct.clone()));
    assert!(d.result.nodenames.is_some(), "{d:?}");
    assert_eq!(used(&state, NV_MEM), 2000);
    // 2000 + 1000 > 2500: refused, the reservation undone, the quota named.
    let d = filter(&mut state, &pod("c", pct));
    assert!(d.patch.is_none() && d.result.nodenames.is_none(), "{d:?}");
    let why = &d.result.failed_and_unresolvable_nodes["n1"];
    assert_eq!(
        why,
        "ResourceQuota team/q limits limits.nvidia.com/gpumem to 2500 MiB: 2000 used in the namespace, the pod asks for 1000; 500 over: free some, ask for less or raise the limit"
    );
    assert!(d.result.failed_nodes.is_empty());
    let event = d.event.unwrap();
    assert_eq!((event.reason, event.warning), ("QuotaExceeded", true));
    assert!(state.holding("c").is_none());
    assert_eq!(used(&state, NV_MEM), 2000);
    // A pod without GPUs passes untouched.
    let d = filter(&mut state, &pod("cpu", json!({"cpu": "1"})));
    assert_eq!(d.result.nodenames, Some(vec!["n1".to_string()]));
}

#[test]
fn bad_values_are_reported_once_each_and_an_explicit_zero_blocks() {
    let seen: Arc<Mutex<Vec<QuotaWarning>>> = Arc::default();
    let mut state = ClusterState::new();
    state.upsert_node(&node());
    let sink = seen.clone();
    state
        .quota
        .set_sink(Box::new(move |w| sink.lock().unwrap().push(w)));
    let bad = quota(
        "q",
        json!({"limits.amd.com/gpumem": "-1", "limits.nvidia.com/gpumem": "0"}),
    );
    state.quota.apply_quota(&bad);
    // A relist shows the same quota: no second report.
    state.quota.apply_quota(&bad);
    let keys = |seen: &Mutex<Vec<QuotaWarning>>| {
        seen.lock()
            .unwrap()
            .iter()
            .map(|w| w.key.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&seen), ["limits.amd.com/gpumem"]);
    // The quota is changed to another bad value: reported again.
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.amd.com/gpumem": "lots"})));
    assert_eq!(
        keys(&seen),
        ["limits.amd.com/gpumem", "limits.amd.com/gpumem"]
    );
    assert_eq!(state.quota.quota_keys(), ["team/q"]);
    // The ignored key limits nothing; 0 blocks every ask of its key.
    state.quota.apply_quota(&bad);
    let amd = json!({"amd.com/gpu": "1", "amd.com/gpumem": "900", "amd.com/gpucores": "10"});
    assert!(
        filter(&mut state, &pod("a", amd))
            .result
            .nodenames
            .is_some()
    );
    let nv = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1"});
    let d = filter(&mut state, &pod("b", nv));
    assert!(
        d.result.failed_and_unresolvable_nodes["n1"].contains("limits.nvidia.com/gpumem to 0 MiB"),
        "{d:?}"
    );
    state.quota.remove_quota("team/q");
    assert!(!state.quota.ledger().governs("team"));
    assert!(state.quota.quota_keys().is_empty());
}

fn review(operation: &str, object: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": operation,
        "namespace": "team", "object": object}}),
    )
    .unwrap()
}

#[test]
fn admission_asks_on_the_smallest_gpu_and_checks_only_the_pods_it_hands_to_the_scheduler() {
    let mut state = ClusterState::new();
    state.upsert_node(&node());
    let config = WebhookConfig::default();
    let object =
        |scheduler: Option<&str>, annotations: serde_json::Value, limits: serde_json::Value| {
            let mut spec = json!({"containers": [{"name": "c", "resources": {"limits": limits}}]});
            if let Some(s) = scheduler {
                spec["schedulerName"] = json!(s);
            }
            json!({"metadata": {"name": "p", "annotations": annotations}, "spec": spec})
        };
    let big = json!({"amd.com/gpu": "2", "amd.com/gpumem-percentage": "50"});
    let body = review("CREATE", object(None, json!({}), big.clone()));
    // No quota in the namespace: nothing to check.
    assert_eq!(admission_refusal(&body, &config, &state), None);
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.amd.com/gpumem": "900"})));
    // 2 × 50 % of the smallest AMD GPU (1000 MiB) = 1000 > 900.
    let refusal = admission_refusal(&body, &config, &state).expect("refused");
    assert_eq!(
        (
            refusal.key.as_str(),
            refusal.used,
            refusal.asked,
            refusal.limit
        ),
        ("limits.amd.com/gpumem", 0, 1000, 900)
    );
    // Not this scheduler's, labelled to be ignored, not a CREATE, not JSON: not checked.
    for body in [
        review("CREATE", object(Some("other"), json!({}), big.clone())),
        review("UPDATE", object(None, json!({}), big.clone())),
        review("CREATE", {
            let mut o = object(None, json!({}), big.clone());
            o["metadata"]["labels"] = json!({"hami.io/webhook": "ignore"});
            o
        }),
        b"not json".to_vec(),
    ] {
        assert_eq!(admission_refusal(&body, &config, &state), None);
    }
    // DRA mode: the AMD request becomes claims the DRA driver serves, not charged here.
    let dra = review(
        "CREATE",
        object(None, json!({"hami.io/amd-mode": "dra"}), big),
    );
    assert_eq!(admission_refusal(&dra, &config, &state), None);
    // Within the quota: admitted.
    let small = json!({"amd.com/gpu": "1", "amd.com/gpumem": "900"});
    assert_eq!(
        admission_refusal(
            &review("CREATE", object(None, json!({}), small)),
            &config,
            &state
        ),
        None
    );
}

/// A node with one NVIDIA GPU of `devmem` MiB.
fn nvidia_node(name: &str, devmem: u64) -> Node {
    let register = format!(
        r#"[{{"id":"{name}-G","count":10,"devmem":{devmem},"devcore":100,"type":"NVIDIA A100","health":true}}]"#
    );
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-nvidia-register": register}}}))
    .unwrap()
}

/// Issue 30: what a memory percentage costs depends on the GPU, so a pod over its quota on
/// the node Filter prefers (the larger card) is placed on a node whose card keeps it within
/// the quota, and refused only where no node can.
#[test]
fn a_pod_over_its_quota_on_the_preferred_node_is_placed_on_a_node_within_it() {
    let mut state = ClusterState::new();
    // Equal scores: n1, first by name, is preferred.
    state.upsert_node(&nvidia_node("n1", 64_000));
    state.upsert_node(&nvidia_node("n2", 16_000));
    state.upsert_node(&nvidia_node("n3", 1_000));
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.nvidia.com/gpumem": "10000"})));
    let names: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    let half = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"});
    let d = filter_within_quota(
        &mut state,
        &pod("a", half.clone()),
        &names,
        &FilterConfig::default(),
        0,
    );
    // n1 would cost 32000 MiB; n2 costs 8000 (n3 would cost 500, but n2 is preferred).
    assert_eq!(d.result.nodenames, Some(vec!["n2".to_string()]), "{d:?}");
    assert_eq!(used(&state, NV_MEM), 8000);
    assert_eq!(state.holding("a").map(|h| h.node.as_str()), Some("n2"));
    let why = &d.result.failed_and_unresolvable_nodes["n1"];
    assert!(why.contains("asks for 32000"), "{why}");
    assert!(
        d.patch.is_some() && d.result.failed_nodes.is_empty(),
        "{d:?}"
    );
    assert_eq!(d.event.unwrap().reason, "FilteringSucceed");
    // 8000 used: n3's 500 still fits, n2's 8000 no longer does (its lower bound says so,
    // without asking Filter again).
    let d = filter_within_quota(
        &mut state,
        &pod("b", half.clone()),
        &names,
        &FilterConfig::default(),
        0,
    );
    assert_eq!(d.result.nodenames, Some(vec!["n3".to_string()]), "{d:?}");
    assert_eq!(used(&state, NV_MEM), 8500);
    // The limit lowered to what is used: no node can, every one refused, unresolvable, each
    // with its own numbers.
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.nvidia.com/gpumem": "8500"})));
    let d = filter_within_quota(
        &mut state,
        &pod("c", half),
        &names,
        &FilterConfig::default(),
        0,
    );
    assert!(d.patch.is_none() && d.result.nodenames.is_none(), "{d:?}");
    assert!(d.result.failed_nodes.is_empty(), "{d:?}");
    let unresolvable = &d.result.failed_and_unresolvable_nodes;
    assert!(unresolvable["n1"].contains("asks for 32000"), "{d:?}");
    assert!(unresolvable["n2"].contains("asks for 8000"), "{d:?}");
    assert!(unresolvable["n3"].contains("asks for 500"), "{d:?}");
    assert_eq!(d.event.unwrap().reason, "QuotaExceeded");
    assert!(state.holding("c").is_none());
    assert_eq!(used(&state, NV_MEM), 8500);
}

/// A node the pod does not fit keeps its own reason, unresolvable once no node holds the
/// pod within the quota (evicting there would free nothing the quota counts on).
#[test]
fn nodes_the_pod_does_not_fit_keep_their_reason_when_the_quota_refuses_the_rest() {
    let mut state = ClusterState::new();
    state.upsert_node(&nvidia_node("big", 64_000));
    state.upsert_node(&nvidia_node("tiny", 100));
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.nvidia.com/gpumem": "1000"})));
    let names: Vec<String> = ["big", "tiny"].map(String::from).to_vec();
    let ask = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"});
    let d = filter_within_quota(
        &mut state,
        &pod("a", ask),
        &names,
        &FilterConfig::default(),
        0,
    );
    let unresolvable = &d.result.failed_and_unresolvable_nodes;
    assert!(
        unresolvable["big"].contains("limits.nvidia.com/gpumem to 1000 MiB"),
        "{d:?}"
    );
    assert!(!unresolvable["tiny"].contains("ResourceQuota"), "{d:?}");
    assert!(d.result.failed_nodes.is_empty(), "{d:?}");
}

/// Issue 30: Filter charges the real MiB of the chosen GPU for a memory percentage and an
/// omitted memory, and the real share of its CUs for AMD cores; a restarted scheduler,
/// rebuilding from the allocation annotations that decision wrote (pod listed before or
/// after its node), counts exactly the same on every key.
#[test]
fn the_usage_rebuilt_from_annotations_equals_what_filter_charged() {
    let mut state = ClusterState::new();
    state.upsert_node(&node());
    state.quota.apply_quota(&quota(
        "q",
        json!({"limits.amd.com/gpumem": "100000", "limits.nvidia.com/gpumem": "100000"}),
    ));
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "a", "namespace": "team", "uid": "a"},
        "spec": {"schedulerName": "hami-scheduler",
            "initContainers": [{"name": "i", "resources": {"limits": {
                "amd.com/gpu": "1", "amd.com/gpumem-percentage": "60"}}}],
            "containers": [
                {"name": "c", "resources": {"limits": {"amd.com/gpu": "1",
                    "amd.com/gpumem-percentage": "25", "amd.com/gpucores": "10"}}},
                {"name": "d", "resources": {"limits": {"nvidia.com/gpu": "1",
                    "nvidia.com/gpucores": "30"}}}]}}))
    .unwrap();
    let d = filter(&mut state, &p);
    let patch = d.patch.expect("placed");
    let charged = state.quota.ledger().used("team");
    // Init at its peak: 60 % of 1000 MiB; the app container's 10 % of 304 CUs is 31 CUs
    // (10.2 %, charged 11), the init container's every CU (100); the A100 whole.
    assert_eq!(charged.get(AMD_MEM), 600, "{charged:?}");
    assert_eq!(charged.get(AMD_CORES), 100, "{charged:?}");
    assert_eq!(charged.get(NV_MEM), 10_000, "{charged:?}");
    p.metadata.annotations = Some(patch.annotations.into_iter().collect());
    p.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    for node_first in [true, false] {
        let mut restarted = ClusterState::new();
        restarted
            .quota
            .apply_quota(&quota("q", json!({"limits.amd.com/gpumem": "1"})));
        if node_first {
            restarted.upsert_node(&node());
        }
        restarted.upsert_pod(&p);
        if !node_first {
            restarted.upsert_node(&node());
        }
        assert_eq!(
            restarted.quota.ledger().used("team"),
            charged,
            "node first: {node_first}"
        );
    }
}

/// A node with a 64000 MiB card first and a 16000 MiB card second.
fn mixed_node(name: &str) -> Node {
    let register = format!(
        r#"[{{"id":"{name}-B","count":10,"devmem":64000,"devcore":100,"type":"NVIDIA A100","health":true}},{{"id":"{name}-S","count":10,"devmem":16000,"devcore":100,"type":"NVIDIA A100","health":true}}]"#
    );
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-nvidia-register": register}}}))
    .unwrap()
}

/// Filter's choice of cards on a node ignores the quota: on nodes with a large and a small
/// card it prefers the large one (over the quota here). The large cards are left out of
/// the choice when Filter is asked again, so the first node's small card is used.
#[test]
fn a_card_over_the_quota_is_left_out_and_a_cheaper_card_of_the_same_node_used() {
    let mut state = ClusterState::new();
    let mixed: Vec<String> = (0..QUOTA_ATTEMPTS + 2)
        .map(|i| format!("m{i:02}"))
        .collect();
    for name in &mixed {
        state.upsert_node(&mixed_node(name));
    }
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.nvidia.com/gpumem": "10000"})));
    let half = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"});
    let d = filter_within_quota(
        &mut state,
        &pod("a", half.clone()),
        &mixed,
        &FilterConfig::default(),
        0,
    );
    assert_eq!(d.result.nodenames, Some(vec!["m00".to_string()]), "{d:?}");
    let patch = d.patch.expect("placed");
    assert!(
        patch.annotations["hami.io/vgpu-devices-allocated"].starts_with("m00-S,"),
        "{patch:?}"
    );
    assert_eq!(used(&state, NV_MEM), 8000);
    // Nothing of the copy Filter was asked with reaches the pod's patch.
    assert!(!patch.annotations.contains_key("nvidia.com/nouse-gpuuuid"));
    // 2000 left: no card of any node will do; each node answered, unresolvable.
    let d = filter_within_quota(
        &mut state,
        &pod("b", half),
        &mixed,
        &FilterConfig::default(),
        0,
    );
    assert!(d.patch.is_none(), "{d:?}");
    let unresolvable = &d.result.failed_and_unresolvable_nodes;
    assert_eq!(unresolvable.len(), mixed.len(), "{d:?}");
    assert!(d.result.failed_nodes.is_empty(), "{d:?}");
    assert_eq!(used(&state, NV_MEM), 8000);
}

/// An ask that costs the same on every card (MiB) over the quota: every node is answered
/// with the refusal at once, the ones Filter did not choose included.
#[test]
fn an_ask_over_the_quota_on_any_card_is_refused_on_every_node() {
    let mut state = ClusterState::new();
    for (name, mib) in [("n1", 64_000), ("n2", 16_000), ("n3", 1_000)] {
        state.upsert_node(&nvidia_node(name, mib));
    }
    state
        .quota
        .apply_quota(&quota("q", json!({"limits.nvidia.com/gpumem": "500"})));
    let names: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    let ask = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "900"});
    let d = filter_within_quota(
        &mut state,
        &pod("a", ask),
        &names,
        &FilterConfig::default(),
        0,
    );
    assert!(d.patch.is_none(), "{d:?}");
    let unresolvable = &d.result.failed_and_unresolvable_nodes;
    assert_eq!(unresolvable.len(), 3, "{d:?}");
    assert!(
        unresolvable
            .values()
            .all(|why| why.contains("asks for 900")),
        "{d:?}"
    );
}
