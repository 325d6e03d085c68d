use std::sync::Arc;

use hami_protocol::node_register::{CustomInfo, DeviceInfo};
use hami_protocol::requests::{RequestDefaults, pod_requests};
use hami_protocol::selection::{GpuPolicy, NodePolicy};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::fit::{FitRequest, Selectors, fit_node};
use crate::snapshot::NodeSnapshot;

const AMD_MEM: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::MemoryMib);
const AMD_CORES: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::CoresPercent);
const AMD_GPU: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::Slices);
const NV_MEM: QuotaKey = QuotaKey::new(Vendor::Nvidia, Dimension::MemoryMib);
const NV_CORES: QuotaKey = QuotaKey::new(Vendor::Nvidia, Dimension::CoresPercent);
const NV_GPU: QuotaKey = QuotaKey::new(Vendor::Nvidia, Dimension::Slices);

fn pod(spec: Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": "p", "namespace": "team", "uid": "u"}, "spec": spec}),
    )
    .unwrap()
}

fn requests(spec: Value) -> Vec<ContainerRequest> {
    pod_requests(&pod(spec), &RequestDefaults::default()).unwrap()
}

fn gpu(vendor: Vendor, id: &str, devmem: u64, devcore: u32, cu_per_wgp: Option<u32>) -> Gpu {
    Gpu {
        vendor,
        info: DeviceInfo {
            id: id.into(),
            count: 10,
            devmem,
            devcore,
            device_type: match vendor {
                Vendor::Amd => "AMD Instinct MI300X".into(),
                Vendor::Nvidia => "NVIDIA-A100".into(),
            },
            health: true,
            custom_info: CustomInfo {
                cu_per_wgp,
                ..Default::default()
            },
            ..Default::default()
        },
    }
}

fn node(gpus: Vec<Gpu>) -> NodeDevices {
    NodeDevices {
        name: "n".into(),
        gpus,
        register_errors: vec![],
        register_labels: vec![],
    }
}

fn quota(hard: &[(&str, &str)]) -> (Quota, Vec<QuotaWarning>) {
    parse_quota("team", "gpu-quota", hard.iter().copied())
}

#[test]
fn keys_are_hamis_for_both_vendors() {
    let keys: Vec<String> = QuotaKey::ALL.iter().map(|k| k.key()).collect();
    assert_eq!(
        keys,
        [
            "limits.amd.com/gpu",
            "limits.amd.com/gpumem",
            "limits.amd.com/gpucores",
            "limits.nvidia.com/gpu",
            "limits.nvidia.com/gpumem",
            "limits.nvidia.com/gpucores",
        ]
    );
    for k in QuotaKey::ALL {
        assert_eq!(QuotaKey::from_key(&k.key()), Some(k));
    }
    // Native quota's keys and other resources are not ours.
    for other in [
        "requests.nvidia.com/gpumem",
        "nvidia.com/gpumem",
        "limits.cpu",
        "limits.nvidia.com/gpumem-percentage",
        "limits.nvidia.com/priority",
    ] {
        assert_eq!(QuotaKey::from_key(other), None, "{other}");
    }
}

#[test]
fn bad_values_are_ignored_with_a_warning_naming_the_key_and_zero_blocks() {
    let (q, warnings) = quota(&[
        ("limits.nvidia.com/gpumem", "40k"),
        ("limits.nvidia.com/gpucores", "abc"),
        ("limits.amd.com/gpumem", "-1"),
        ("limits.amd.com/gpucores", "12.5"),
        ("limits.amd.com/gpu", "0"),
        ("limits.nvidia.com/gpu", "4"),
        ("requests.cpu", "what"),
    ]);
    // The API server writes 40000 as 40k: read as a number, not refused as a unit.
    assert_eq!(q.limits[&NV_MEM], 40_000);
    assert_eq!(q.limits[&AMD_GPU], 0);
    assert_eq!(q.limits[&NV_GPU], 4);
    assert_eq!(q.limits.len(), 3);
    let keys: Vec<&str> = warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "limits.nvidia.com/gpucores",
            "limits.amd.com/gpumem",
            "limits.amd.com/gpucores"
        ]
    );
    let text = warnings[1].to_string();
    assert!(
        text.contains("team/gpu-quota")
            && text.contains("limits.amd.com/gpumem")
            && text.contains("negative")
            && text.contains("ignored"),
        "{text}"
    );
    assert!(warnings[0].to_string().contains("not a number"));
    assert!(warnings[2].to_string().contains("whole number"));
    // The ignored keys limit nothing; the explicit 0 blocks any AMD GPU.
    let mut ledger = QuotaLedger::new();
    ledger.set_quota(q);
    let mut ask = Amounts::default();
    ask.set(AMD_MEM, 1 << 40);
    ask.set(NV_CORES, 1000);
    assert!(ledger.check("team", &ask, None).is_ok());
    ask.set(AMD_GPU, 1);
    let refusal = ledger.check("team", &ask, None).unwrap_err();
    assert_eq!(
        (
            refusal.key.as_str(),
            refusal.used,
            refusal.asked,
            refusal.limit
        ),
        ("limits.amd.com/gpu", 0, 1, 0)
    );
}

#[test]
fn a_quota_object_is_read_from_its_spec() {
    let object: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "q", "namespace": "ml"},
        "spec": {"hard": {"limits.amd.com/gpumem": "8Gi", "pods": "10"}}
    }))
    .unwrap();
    let (q, warnings) = quota_from_object(&object);
    assert!(warnings.is_empty());
    assert_eq!((q.namespace.as_str(), q.name.as_str()), ("ml", "q"));
    assert_eq!(q.limits[&AMD_MEM], 8 << 30);
}

#[test]
fn admission_ask_is_per_gpu_times_count_with_init_at_their_peak() {
    // HAMi's arithmetic: app containers summed, init containers at their max.
    let reqs = requests(json!({
        "initContainers": [
            {"name": "i1", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "10"}}},
            {"name": "i2", "resources": {"limits": {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "20"}}}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "25"}}}]
    }));
    let ask = admission_ask(&reqs, &[]);
    assert_eq!(ask.get(NV_MEM), 30_000); // max(2×4000 + 2000, max(30000, 3000))
    assert_eq!(ask.get(NV_CORES), 85); // max(60 + 25, max(10, 60))
    assert_eq!(ask.get(NV_GPU), 3); // max(2 + 1, max(1, 3))
    assert_eq!(ask.get(AMD_MEM), 0);
}

#[test]
fn admission_charges_percentages_on_the_smallest_gpu_it_could_get() {
    let reqs = requests(
        json!({"containers": [{"name": "c", "resources": {"limits": {
        "amd.com/gpu": "2", "amd.com/gpumem-percentage": "50", "amd.com/gpucores": "5"}}}]}),
    );
    // Unknown GPUs: only the certain part counts.
    let ask = admission_ask(&reqs, &[]);
    assert_eq!(
        (ask.get(AMD_GPU), ask.get(AMD_MEM), ask.get(AMD_CORES)),
        (2, 0, 0)
    );
    let big = GpuShape::of(&gpu(Vendor::Amd, "a", 196_608, 304, None));
    // RDNA: 5 % of 64 CUs is 4 CUs (two whole WGPs) = 6.25 %, charged 7.
    let rdna = GpuShape::of(&gpu(Vendor::Amd, "b", 24_576, 64, Some(2)));
    let nv = GpuShape::of(&gpu(Vendor::Nvidia, "c", 1_000, 100, None));
    let ask = admission_ask(&reqs, &[big, rdna, nv]);
    assert_eq!(ask.get(AMD_MEM), 2 * 12_288);
    assert_eq!(ask.get(AMD_CORES), 2 * 5); // 15 of 304 CUs = 4.9 % → 5 on the MI300X
    let ask = admission_ask(&reqs, &[rdna]);
    assert_eq!(ask.get(AMD_CORES), 2 * 7);
    // A memory-only AMD request takes every CU: 100 % per GPU.
    let mem_only = requests(
        json!({"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpumem": "1024"}}}]}),
    );
    let ask = admission_ask(&mem_only, &[big]);
    assert_eq!(
        (ask.get(AMD_GPU), ask.get(AMD_MEM), ask.get(AMD_CORES)),
        (1, 1024, 100)
    );
}

#[test]
fn filter_charges_the_real_mib_and_share_of_the_chosen_gpu() {
    let reqs = requests(
        json!({"containers": [{"name": "c", "resources": {"limits": {
        "amd.com/gpu": "1", "amd.com/gpumem-percentage": "25", "amd.com/gpucores": "5"}}}]}),
    );
    let devices = Arc::new(node(vec![gpu(Vendor::Amd, "R", 24_576, 64, Some(2))]));
    let snapshot = NodeSnapshot::idle(devices.clone());
    let selectors = Selectors::default();
    let req = FitRequest {
        containers: &reqs,
        selectors: &selectors,
        gpu_policy: GpuPolicy::default(),
        node_policy: NodePolicy::Binpack,
    };
    let placement = fit_node(&snapshot, &req).unwrap();
    let charge = charge_of_placement(&reqs, &placement, &devices);
    assert_eq!(charge.get(AMD_MEM), 6_144);
    assert_eq!(charge.get(AMD_CORES), 7); // 4 of 64 CUs, rounded up
    assert_eq!(charge.get(AMD_GPU), 1);
    // NVIDIA: an omitted memory takes the whole card, cores as written.
    let nv = requests(
        json!({"containers": [{"name": "c", "resources": {"limits": {
        "nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}}}]}),
    );
    let devices = Arc::new(node(vec![gpu(Vendor::Nvidia, "G", 40_960, 100, None)]));
    let req = FitRequest {
        containers: &nv,
        ..req
    };
    let placement = fit_node(&NodeSnapshot::idle(devices.clone()), &req).unwrap();
    let charge = charge_of_placement(&nv, &placement, &devices);
    assert_eq!(
        (charge.get(NV_MEM), charge.get(NV_CORES), charge.get(NV_GPU)),
        (40_960, 30, 1)
    );
}

fn placed(uid: &str, ns: &str, amd: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": ns, "uid": uid, "annotations": {
            "hami.io/vgpu-node": "n", "hami.io/amd-devices-allocated": amd}},
        "spec": {"schedulerName": "hami-scheduler",
            "initContainers": [{"name": "i", "resources": {"limits": {"amd.com/gpu": "1"}}}],
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

#[test]
fn usage_is_rebuilt_from_allocation_annotations_and_released_when_pods_end() {
    let devices = node(vec![gpu(Vendor::Amd, "A", 196_608, 304, None)]);
    let running = placed(
        "p1",
        "team",
        "A,AMD X,8000,152:;A,AMD X,2000,31:;",
        "Running",
    );
    let (ns, charge) = charge_of_pod(&running, "hami-scheduler", Some(&devices))
        .unwrap()
        .unwrap();
    assert_eq!(ns, "team");
    // Init at its peak (8000 MiB, 50 %) against the app (2000 MiB, 31 CUs = 10.2 % → 11).
    assert_eq!(
        (
            charge.get(AMD_GPU),
            charge.get(AMD_MEM),
            charge.get(AMD_CORES)
        ),
        (1, 8000, 50)
    );
    // Unknown GPU: the whole share.
    let (_, unknown) = charge_of_pod(&running, "hami-scheduler", None)
        .unwrap()
        .unwrap();
    assert_eq!(unknown.get(AMD_CORES), 100);
    // Finished, another scheduler's, or a bad annotation: nothing, or an error.
    let done = placed("p2", "team", "A,AMD X,8000,152:;;", "Succeeded");
    assert_eq!(charge_of_pod(&done, "hami-scheduler", None).unwrap(), None);
    assert_eq!(charge_of_pod(&running, "volcano", None).unwrap(), None);
    let bad = placed("p3", "team", "garbage", "Running");
    assert!(
        charge_of_pod(&bad, "hami-scheduler", None)
            .unwrap_err()
            .to_string()
            .contains("hami.io/amd-devices-allocated")
    );
    // A restart: the ledger rebuilt from the pods counts what it counted before.
    let mut ledger = QuotaLedger::new();
    ledger.charge("p1", "team", charge);
    let mut rebuilt = QuotaLedger::new();
    rebuilt.rebuild([("p1".to_string(), ns, charge)]);
    assert_eq!(rebuilt.used("team"), ledger.used("team"));
    ledger.release("p1");
    assert!(ledger.used("team").is_zero());
}

#[test]
fn refusal_names_quota_key_used_asked_and_limit_and_metrics_rows_follow() {
    let mut ledger = QuotaLedger::new();
    ledger.set_quota(quota(&[("limits.nvidia.com/gpumem", "10000")]).0);
    let mut ask = Amounts::default();
    ask.set(NV_MEM, 6000);
    ledger.check_and_charge("a", "team", ask).unwrap();
    let refusal = ledger.check_and_charge("b", "team", ask).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "ResourceQuota team/gpu-quota limits limits.nvidia.com/gpumem to 10000 MiB: 6000 used in the namespace, the pod asks for 6000; 2000 over: free some, ask for less or raise the limit"
    );
    // A re-filter of the same pod replaces its own charge.
    ledger.check_and_charge("a", "team", ask).unwrap();
    // Other namespaces are not governed.
    ledger.check_and_charge("c", "other", ask).unwrap();
    assert!(!ledger.governs("other") && ledger.governs("team"));
    assert_eq!(
        ledger.rows(),
        vec![QuotaRow {
            namespace: "team".into(),
            quota: "gpu-quota".into(),
            resource: "nvidia.com/gpumem",
            used: 6000,
            limit: 10_000
        }]
    );
    ledger.remove_quota("team", "gpu-quota");
    assert!(ledger.rows().is_empty());
    ledger.check_and_charge("b", "team", ask).unwrap();
}

fn amounts() -> impl Strategy<Value = Amounts> {
    proptest::array::uniform6(0u64..5_000).prop_map(|a| {
        let mut out = Amounts::default();
        for (k, v) in QuotaKey::ALL.into_iter().zip(a) {
            out.set(k, v);
        }
        out
    })
}

proptest! {
    #[test]
    fn charge_then_release_returns_to_zero(
        charges in proptest::collection::vec((0usize..6, 0usize..3, amounts()), 0..30),
    ) {
        let mut ledger = QuotaLedger::new();
        for (uid, ns, a) in &charges {
            ledger.charge(&format!("p{uid}"), &format!("ns{ns}"), *a);
        }
        // Usage is the sum of each pod's last charge.
        for ns in 0..3 {
            let ns = format!("ns{ns}");
            let mut sum = Amounts::default();
            for uid in 0..6 {
                if let Some(a) = ledger.charged(&format!("p{uid}"))
                    && ledger.pods[&format!("p{uid}")].0 == ns {
                    sum = sum.plus(a);
                }
            }
            prop_assert_eq!(ledger.used(&ns), sum);
        }
        for uid in 0..6 {
            ledger.release(&format!("p{uid}"));
        }
        for ns in 0..3 {
            let name = format!("ns{ns}");
            prop_assert!(ledger.used(&name).is_zero());
        }
    }

    #[test]
    fn asks_that_together_exceed_a_limit_never_both_pass(
        limit in 0u64..10_000, a in amounts(), b in amounts(), key in 0usize..6,
    ) {
        let key = QuotaKey::ALL[key];
        let mut ledger = QuotaLedger::new();
        let mut q = quota(&[]).0;
        q.limits.insert(key, limit);
        ledger.set_quota(q);
        let first = ledger.check_and_charge("a", "team", a).is_ok();
        let second = ledger.check_and_charge("b", "team", b).is_ok();
        let (x, y) = (a.get(key), b.get(key));
        if x > 0 && y > 0 && x + y > limit {
            prop_assert!(!(first && second));
        }
        // What the ledger admitted never goes over the limit.
        prop_assert!(ledger.used("team").get(key) <= limit);
    }

    #[test]
    fn bad_or_any_quota_text_never_panics(text in ".{0,12}") {
        let (q, w) = quota(&[("limits.amd.com/gpumem", &text)]);
        prop_assert_eq!(q.limits.len() + w.len(), 1);
    }
}
