use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, ResourceQuota};
use serde_json::json;

use super::*;
use crate::extender::{FilterConfig, decide_filter};
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
    let d = decide_filter(state, p, &names, &FilterConfig::default(), 0);
    gate_filter(state, p, &names, d)
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
