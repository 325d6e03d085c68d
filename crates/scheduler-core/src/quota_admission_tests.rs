use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ResourceQuota};
use serde_json::json;

use super::*;
use crate::admission::{Admission, PodReview, review_pod_with};
use crate::quota_book::ADMISSION_HOLD;

const GI: u64 = 1 << 30;
const AMD_GPU: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::Slices);
const AMD_MEM: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::MemoryMib);
const AMD_CORES: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::CoresPercent);
const NV_MEM: QuotaKey = QuotaKey::new(Vendor::Nvidia, Dimension::MemoryMib);

fn shape(product: &str, gib: u64, cus: u64) -> Shape {
    Shape {
        product_name: product.into(),
        memory_bytes: gib * GI,
        compute_units: cus,
        cu_step: 1,
        shares: 10,
        device_type: "amdgpu-slice".into(),
        devices: 1,
    }
}

/// The AMD DRA driver's MI210 (64 GiB, 104 CUs) and MI300X (192 GiB, 304 CUs).
fn shapes() -> Vec<Shape> {
    vec![
        shape("AMD Instinct MI210", 64, 104),
        shape("AMD Instinct MI300X", 192, 304),
    ]
}

fn quota(hard: Value) -> ResourceQuota {
    serde_json::from_value(
        json!({"metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": hard}}),
    )
    .unwrap()
}

/// Node `n1` with one A100 (10000 MiB) for the device-plugin NVIDIA requests.
fn nvidia_node() -> Node {
    serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
        "hami.io/node-nvidia-register": r#"[{"id":"N","count":10,"devmem":10000,"devcore":100,"type":"NVIDIA A100","health":true}]"#
    }}}))
    .unwrap()
}

/// A DRA-mode pod object with one container asking for `limits`.
fn dra_object(name: &str, limits: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "team", "annotations": {"hami.io/amd-mode": "dra"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}})
}

fn review(object: Value, dry_run: bool) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE", "namespace": "team", "dryRun": dry_run, "object": object}}),
    )
    .unwrap()
}

/// The pod as stored after the webhook's patch: uid, the charge annotation, `phase`.
fn stored(uid: &str, charge: &str, phase: &str) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": uid, "namespace": "team", "uid": uid,
        "annotations": {DRA_CHARGE_ANNOTATION: charge}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]},
        "status": {"phase": phase}}),
    )
    .unwrap()
}

fn used(state: &ClusterState, key: QuotaKey) -> u64 {
    state.quota.ledger().used("team").get(key)
}

fn ask(object: Value) -> Amounts {
    let pod: Pod = serde_json::from_value(object).unwrap();
    let requests = pod_requests(&pod, &Default::default()).unwrap();
    dra_ask(&pod, &requests, &shapes())
}

#[test]
fn the_charge_annotation_round_trips_and_bad_text_is_refused() {
    let mut a = Amounts::default();
    a.set(AMD_GPU, 2);
    a.set(AMD_MEM, 65_536);
    a.set(AMD_CORES, 50);
    let text = format_charge(&a);
    assert_eq!(
        text,
        "amd.com/gpu=2,amd.com/gpumem=65536,amd.com/gpucores=50"
    );
    assert_eq!(parse_charge(&text), Ok(a));
    for bad in ["amd.com/gpu", "amd.com/gpu=-1", "amd.com/gpu=x", "cpu=1"] {
        assert!(parse_charge(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_dra_pods_claims_are_charged_on_the_smallest_shape_they_can_land_on() {
    // 50 % of the memory and 25 % of the CUs, 2 GPUs: on the MI210, 32 GiB and 26 of 104
    // CUs (25 %), × 2.
    let a = ask(dra_object(
        "p",
        json!({"amd.com/gpu": "2", "amd.com/gpumem-percentage": "50", "amd.com/gpucores": "25"}),
    ));
    assert_eq!(
        (a.get(AMD_GPU), a.get(AMD_MEM), a.get(AMD_CORES)),
        (2, 65_536, 50)
    );
    // 100 GiB fits only the MI300X; no gpucores: every CU (100 %).
    let a = ask(dra_object(
        "p",
        json!({"amd.com/gpu": "1", "amd.com/gpumem": "102400"}),
    ));
    assert_eq!(
        (a.get(AMD_GPU), a.get(AMD_MEM), a.get(AMD_CORES)),
        (1, 102_400, 100)
    );
    // A whole GPU of the MI300X type (use-gputype): its 192 GiB.
    let mut object = dra_object("p", json!({"amd.com/gpu": "1"}));
    object["metadata"]["annotations"]["amd.com/use-gputype"] = json!("MI300X");
    assert_eq!(ask(object).get(AMD_MEM), 196_608);
    // Init and app containers: max(sum of apps, max of inits).
    let mut object = dra_object("p", json!({"amd.com/gpu": "1", "amd.com/gpumem": "1000"}));
    object["spec"]["initContainers"] = json!([{"name": "i", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "5000"}}}]);
    object["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "d", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "1000"}}}));
    let a = ask(object);
    assert_eq!((a.get(AMD_GPU), a.get(AMD_MEM)), (2, 5000));
}

#[test]
fn the_webhook_writes_the_charge_on_a_dra_pod_and_only_the_scheduler_may_change_it() {
    let config = WebhookConfig::default();
    let object = dra_object(
        "p",
        json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "50", "amd.com/gpucores": "25"}),
    );
    let pod: Pod = serde_json::from_value(object.clone()).unwrap();
    let create = |pod: &Pod, username: &str| {
        review_pod_with(
            &PodReview {
                operation: "CREATE",
                username,
                object: Some(pod),
                old_object: None,
            },
            &config,
            &shapes(),
        )
    };
    let Admission::Allow { patch, .. } = create(&pod, "alice") else {
        panic!("not allowed")
    };
    let op = patch
        .iter()
        .find(|op| op["path"] == "/metadata/annotations/hami.io~1dra-quota-charge")
        .expect("the charge is written");
    assert_eq!(
        op["value"],
        "amd.com/gpu=1,amd.com/gpumem=32768,amd.com/gpucores=25"
    );
    // A user may not bring their own charge, nor lower it later.
    let mut forged = pod.clone();
    forged
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(DRA_CHARGE_ANNOTATION.into(), "amd.com/gpu=1".into());
    let Admission::Deny { message } = create(&forged, "alice") else {
        panic!("a forged charge was admitted")
    };
    assert!(message.contains(DRA_CHARGE_ANNOTATION), "{message}");
    let mut admitted = pod.clone();
    admitted
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(
            DRA_CHARGE_ANNOTATION.into(),
            op["value"].as_str().unwrap().into(),
        );
    let update = review_pod_with(
        &PodReview {
            operation: "UPDATE",
            username: "alice",
            object: Some(&forged),
            old_object: Some(&admitted),
        },
        &config,
        &shapes(),
    );
    assert!(
        matches!(&update, Admission::Deny { message } if message.contains(DRA_CHARGE_ANNOTATION)),
        "{update:?}"
    );
}

#[test]
fn admission_reserves_dra_claims_so_the_second_pod_for_the_last_quota_is_refused() {
    let mut state = ClusterState::new();
    let config = WebhookConfig::default();
    let now = Instant::now();
    // 32 GiB each (50 % of the MI210); 48 GiB allowed.
    state
        .quota
        .apply_quota(&quota(json!({"limits.amd.com/gpumem": "48Ki"})));
    let limits = json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "50"});
    let first = admit(
        &review(dra_object("a", limits.clone()), false),
        &config,
        &mut state,
        &shapes(),
        false,
        now,
    )
    .expect("the first fits");
    assert!(first.is_some());
    // Admitted but not yet stored or placed: counted.
    assert_eq!(used(&state, AMD_MEM), 32_768);
    let refusal = admit(
        &review(dra_object("b", limits.clone()), false),
        &config,
        &mut state,
        &shapes(),
        false,
        now,
    )
    .expect_err("the second is over the quota");
    assert_eq!(
        refusal.to_string(),
        "ResourceQuota team/q limits limits.amd.com/gpumem to 49152 MiB: 32768 used in the namespace, the pod asks for 32768; 16384 over: free some, ask for less or raise the limit"
    );
    // The first pod is stored and seen: its reservation becomes its charge, not a second.
    state.upsert_pod(&stored(
        "a",
        "amd.com/gpu=1,amd.com/gpumem=32768,amd.com/gpucores=100",
        "Pending",
    ));
    assert_eq!(used(&state, AMD_MEM), 32_768);
    assert_eq!(used(&state, AMD_GPU), 1);
    // It ends: released, and the next pod fits.
    state.upsert_pod(&stored(
        "a",
        "amd.com/gpu=1,amd.com/gpumem=32768,amd.com/gpucores=100",
        "Succeeded",
    ));
    assert!(state.quota.ledger().used("team").is_zero());
    let body = review(dra_object("b", limits), false);
    let ticket = admit(&body, &config, &mut state, &shapes(), false, now).unwrap();
    // Denied after all (its templates could not be made): given back.
    state.quota.cancel_admission(&ticket.unwrap());
    assert!(state.quota.ledger().used("team").is_zero());
    // A dry run reserves nothing.
    assert_eq!(
        admit(&body, &config, &mut state, &shapes(), true, now),
        Ok(None)
    );
    assert!(state.quota.ledger().used("team").is_zero());
    // A pod never stored: its reservation lapses after the hold.
    admit(&body, &config, &mut state, &shapes(), false, now).unwrap();
    assert_eq!(used(&state, AMD_MEM), 32_768);
    admit(
        &body,
        &config,
        &mut state,
        &shapes(),
        false,
        now + ADMISSION_HOLD + Duration::from_secs(1),
    )
    .expect("the lapsed reservation is given back");
    assert_eq!(used(&state, AMD_MEM), 32_768);
}

#[test]
fn a_dra_pod_with_an_nvidia_request_is_checked_on_both_vendors() {
    let mut state = ClusterState::new();
    state.upsert_node(&nvidia_node());
    let config = WebhookConfig::default();
    state.quota.apply_quota(&quota(
        json!({"limits.nvidia.com/gpumem": "4000", "limits.amd.com/gpucores": "60"}),
    ));
    let both = |nv_mib: &str, amd_cores: &str| {
        review(
            dra_object(
                "p",
                json!({"amd.com/gpu": "2", "amd.com/gpucores": amd_cores,
                    "nvidia.com/gpu": "1", "nvidia.com/gpumem": nv_mib}),
            ),
            false,
        )
    };
    let now = Instant::now();
    let nv = admit(
        &both("5000", "25"),
        &config,
        &mut state,
        &shapes(),
        false,
        now,
    )
    .expect_err("NVIDIA over");
    assert_eq!(
        (nv.key.as_str(), nv.asked, nv.limit),
        ("limits.nvidia.com/gpumem", 5000, 4000)
    );
    // 2 × 26 of 104 CUs = 2 × 25 %: 50, then 30 more is over 60.
    admit(
        &both("1000", "25"),
        &config,
        &mut state,
        &shapes(),
        false,
        now,
    )
    .expect("fits");
    assert_eq!(used(&state, AMD_CORES), 50);
    // Only the DRA part is reserved: the NVIDIA part is Filter's to charge.
    assert_eq!(used(&state, NV_MEM), 0);
    let amd = admit(
        &both("1000", "15"),
        &config,
        &mut state,
        &shapes(),
        false,
        now,
    )
    .expect_err("AMD over");
    assert_eq!(
        (amd.key.as_str(), amd.used, amd.asked),
        ("limits.amd.com/gpucores", 50, 30)
    );
}

#[test]
fn a_restarted_scheduler_counts_dra_pods_from_their_annotation_until_they_go() {
    let mut state = ClusterState::new();
    state
        .quota
        .apply_quota(&quota(json!({"limits.amd.com/gpu": "2"})));
    let pods = [
        stored("a", "amd.com/gpu=1,amd.com/gpumem=100", "Running"),
        stored("b", "amd.com/gpu=1,amd.com/gpumem=100", "Pending"),
        stored("c", "amd.com/gpu=1", "Succeeded"),
        // Unreadable: charged nothing (only the scheduler writes it; D-4 guards it).
        stored("d", "amd.com/gpu=lots", "Running"),
    ];
    state.reset_pods(pods.iter());
    assert_eq!((used(&state, AMD_GPU), used(&state, AMD_MEM)), (2, 200));
    let config = WebhookConfig::default();
    let body = review(dra_object("e", json!({"amd.com/gpu": "1"})), false);
    let refusal = admit(&body, &config, &mut state, &shapes(), false, Instant::now())
        .expect_err("full after the restart");
    assert_eq!((refusal.used, refusal.asked, refusal.limit), (2, 1, 2));
    // Deleted, and gone from a relist: released.
    state.remove_pod("a");
    assert_eq!(used(&state, AMD_GPU), 1);
    state.reset_pods(std::iter::empty());
    assert!(state.quota.ledger().used("team").is_zero());
}

#[test]
fn a_bad_quota_value_limits_no_dra_pod() {
    let mut state = ClusterState::new();
    state.quota.apply_quota(&quota(
        json!({"limits.amd.com/gpumem": "-5", "limits.amd.com/gpu": "x", "limits.amd.com/gpucores": "100"}),
    ));
    let config = WebhookConfig::default();
    let limits = json!({"amd.com/gpu": "1", "amd.com/gpumem": "60000"});
    let body = review(dra_object("p", limits), false);
    admit(&body, &config, &mut state, &shapes(), false, Instant::now())
        .expect("the ignored keys limit nothing");
    let refusal = admit(&body, &config, &mut state, &shapes(), false, Instant::now())
        .expect_err("the good key still does");
    assert_eq!(refusal.key, "limits.amd.com/gpucores");
}

#[test]
fn filter_counts_a_pending_dra_admission_until_its_hold_lapses() {
    use crate::extender::FilterConfig;
    use crate::quota_gate::filter_within_quota;
    let mut state = ClusterState::new();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#
    }}}))
    .unwrap();
    state.upsert_node(&node);
    state
        .quota
        .apply_quota(&quota(json!({"limits.amd.com/gpu": "1"})));
    let config = WebhookConfig::default();
    let dra_pod = review(dra_object("d", json!({"amd.com/gpu": "1"})), false);
    let device_plugin_pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p",
        "namespace": "team", "uid": "p"}, "spec": {"schedulerName": "hami-scheduler",
        "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100"}}}]}}))
    .unwrap();
    let names = vec!["n1".to_string()];
    let filter = |state: &mut ClusterState| {
        let d = filter_within_quota(
            state,
            &device_plugin_pod,
            &names,
            &FilterConfig::default(),
            0,
        );
        state.release("p");
        d.result.nodenames.is_some()
    };
    // Admitted a moment ago, not yet seen: it holds the last GPU of the quota.
    let ticket = admit(
        &dra_pod,
        &config,
        &mut state,
        &shapes(),
        false,
        Instant::now(),
    )
    .unwrap();
    assert!(!filter(&mut state));
    state.quota.cancel_admission(&ticket.unwrap());
    // Admitted longer ago than the hold and never seen: given back at the next check.
    let long_ago = Instant::now()
        .checked_sub(ADMISSION_HOLD + Duration::from_secs(1))
        .expect("the clock runs for longer than the hold");
    admit(&dra_pod, &config, &mut state, &shapes(), false, long_ago).unwrap();
    assert_eq!(used(&state, AMD_GPU), 1);
    assert!(filter(&mut state));
}

#[test]
fn a_claim_is_charged_on_its_smallest_listed_shape_and_without_shapes_as_written() {
    use hami_protocol::requests::{DeviceRequest, MemoryRequest};
    let request = |memory, cores_percent| DeviceRequest {
        count: 1,
        memory,
        cores_percent,
        priority: None,
        added_limits: Vec::new(),
    };
    let any = DeviceSelector::default();
    let half = request(MemoryRequest::Percent(50), 100);
    // The MI210 left out of the claim (more shapes than it may list): the MI300X's half.
    let mi210 = shapes()[0].clone();
    assert_eq!(
        per_device_charge(&half, &any, &shapes(), &[]),
        (32_768, 100)
    );
    assert_eq!(
        per_device_charge(&half, &any, &shapes(), &[mi210]),
        (98_304, 100)
    );
    // No slices yet: a MiB ask as written and every CU; what needs a size counts 0.
    assert_eq!(
        per_device_charge(&request(MemoryRequest::Mib(4096), 100), &any, &[], &[]),
        (4096, 100)
    );
    assert_eq!(
        per_device_charge(&request(MemoryRequest::Whole, 30), &any, &[], &[]),
        (0, 0)
    );
}
