use std::sync::Arc;

use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode};
use hami_protocol::requests::{RequestDefaults, amd_cu_count, pod_requests};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::snapshot::{Gpu, NodeDevices};
use crate::usage::collapse;

fn amd(id: &str, devcore: u32, devmem: u64, numa: i32) -> Gpu {
    Gpu {
        vendor: Vendor::Amd,
        info: DeviceInfo {
            id: id.into(),
            index: 0,
            count: 10,
            devmem,
            devcore,
            device_type: "AMD Instinct MI300X".into(),
            numa,
            mode: DeviceMode::HamiCore,
            health: true,
            device_vendor: "AMD".into(),
            custom_info: CustomInfo::default(),
        },
    }
}

fn nvidia(id: &str) -> Gpu {
    Gpu {
        vendor: Vendor::Nvidia,
        info: DeviceInfo {
            id: id.into(),
            count: 10,
            devmem: 40_960,
            devcore: 100,
            device_type: "NVIDIA-A100".into(),
            health: true,
            ..Default::default()
        },
    }
}

fn node(name: &str, gpus: Vec<Gpu>) -> NodeSnapshot {
    NodeSnapshot::idle(Arc::new(NodeDevices {
        name: name.into(),
        gpus,
        register_errors: vec![],
        register_labels: vec![],
    }))
}

fn requests(containers: serde_json::Value) -> Vec<ContainerRequest> {
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": containers})).unwrap();
    pod_requests(&pod, &RequestDefaults::default()).unwrap()
}

fn app(limits: serde_json::Value) -> Vec<ContainerRequest> {
    requests(json!({"containers": [{"name": "c", "resources": {"limits": limits}}]}))
}

fn fit_with(
    node: &NodeSnapshot,
    reqs: &[ContainerRequest],
    gpu: &str,
    selectors: Selectors,
) -> Result<Placement, String> {
    let req = FitRequest {
        containers: reqs,
        selectors: &selectors,
        gpu_policy: GpuPolicy::parse(gpu).unwrap(),
        node_policy: NodePolicy::Binpack,
    };
    fit_node(node, &req)
}

fn fit(node: &NodeSnapshot, reqs: &[ContainerRequest]) -> Result<Placement, String> {
    fit_with(node, reqs, "spread", Selectors::default())
}

/// Charges a placement onto the node, as the informer will once the pod is annotated.
fn commit(node: &mut NodeSnapshot, reqs: &[ContainerRequest], placement: &Placement) {
    let kinds: Vec<_> = reqs.iter().map(|c| c.kind).collect();
    for runs in placement.runs.values() {
        assert!(node.charge(&collapse(&kinds, runs)).is_empty());
    }
}

#[test]
fn two_half_core_pods_share_one_gpu_and_a_third_does_not_fit() {
    let mut n = node("n", vec![amd("A", 304, 196_288, 0)]);
    let half = app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "8192", "amd.com/gpucores": "50"}));
    for _ in 0..2 {
        let p = fit(&n, &half).unwrap();
        let dev = &p.runs[&Vendor::Amd][0][0];
        assert_eq!(
            (dev.uuid.as_str(), dev.mem_mib, dev.cores),
            ("A", 8192, 152)
        );
        assert_eq!(dev.device_type, "AMD Instinct MI300X");
        commit(&mut n, &half, &p);
    }
    assert_eq!(
        fit(&n, &half).unwrap_err(),
        "container c: 1/1 CardInsufficientCore"
    );
}

#[test]
fn memory_only_amd_pod_takes_every_cu() {
    let mut n = node("n", vec![amd("A", 304, 196_288, 0)]);
    let mem_only = app(json!({"amd.com/gpumem": "1024"}));
    let p = fit(&n, &mem_only).unwrap();
    assert_eq!(p.runs[&Vendor::Amd][0][0].cores, 304);
    commit(&mut n, &mem_only, &p);
    let small = app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "1024", "amd.com/gpucores": "1"}));
    assert_eq!(
        fit(&n, &small).unwrap_err(),
        "container c: 1/1 CardInsufficientCore"
    );
}

fn rdna(id: &str, devcore: u32) -> Gpu {
    let mut g = amd(id, devcore, 49_152, 0);
    g.info.device_type = "AMD Radeon PRO W7800".into();
    g.info.custom_info.cu_per_wgp = Some(2);
    g.info.count = 1000;
    g
}

fn cores_pod(pct: u32) -> Vec<ContainerRequest> {
    app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "1", "amd.com/gpucores": pct.to_string()}))
}

#[test]
fn a_5_percent_pod_on_a_64_cu_rdna_card_is_charged_4() {
    let mut n = node("n", vec![rdna("R", 64)]);
    // floor(5 × 64 / 100) = 3, rounded up to whole WGPs: 4 CUs = 2 WGPs, what is given.
    for _ in 0..10 {
        let p = fit(&n, &cores_pod(5)).unwrap();
        assert_eq!(p.runs[&Vendor::Amd][0][0].cores, 4);
        commit(&mut n, &cores_pod(5), &p);
    }
    // Without cuPerWGP (CDNA, or a reference plugin that does not publish it): the floor.
    let cdna = node("n", vec![amd("A", 64, 49_152, 0)]);
    assert_eq!(
        fit(&cdna, &cores_pod(5)).unwrap().runs[&Vendor::Amd][0][0].cores,
        3
    );
    // 40 of 64 CUs are charged, 24 left: 39 % (24.96 → 24) fits; 40 % (25.6 → 25) would
    // fit by the floor, but the plugin gives 26 (13 WGPs), which do not.
    assert_eq!(
        fit(&n, &cores_pod(39)).unwrap().runs[&Vendor::Amd][0][0].cores,
        24
    );
    assert_eq!(
        fit(&n, &cores_pod(40)).unwrap_err(),
        "container c: 1/1 CardInsufficientCore"
    );
    // A GPU with no whole WGP has nothing to give.
    assert_eq!(
        fit(&node("n", vec![rdna("R", 1)]), &cores_pod(50)).unwrap_err(),
        "container c: 1/1 CardInsufficientCore"
    );
}

/// What the scheduler charges is what the plugin gives (issue 26 item 5): for every
/// percentage and CU count of an RDNA GPU, the count `fit` writes into the device list is
/// a count `cu_choice` hands over unchanged, on an empty GPU and on one that earlier pods
/// (also charged by `fit`, given by `cu_choice`) fill until `fit` refuses.
#[test]
fn rdna_charged_is_given_for_every_percentage_and_cu_count() {
    use hami_amd_core::cu_choice::choose_cus;
    use hami_protocol::cu_list::CuSet;
    for devcore in 1..=130 {
        for pct in 1..=100 {
            let mut n = node("n", vec![rdna("R", devcore)]);
            let mut used = CuSet::new();
            // Fill: each pod fit charges, the plugin gives; the scheduler's refusal ends it.
            for round in 0..=100 {
                let Ok(p) = fit(&n, &cores_pod(pct)) else {
                    // Refused: the plugin would have no whole WGPs for it either.
                    let want = amd_cu_count(pct, devcore, 2);
                    assert!(
                        want == 0 || choose_cus(&used, devcore, want, 2).is_err(),
                        "{pct} % of {devcore}: refused though the plugin could give {want}"
                    );
                    break;
                };
                let charged = p.runs[&Vendor::Amd][0][0].cores;
                let given = choose_cus(&used, devcore, charged, 2).unwrap_or_else(|e| {
                    panic!("{pct} % of {devcore}, pod {round}: charged {charged}, plugin: {e}")
                });
                assert_eq!(
                    given.len(),
                    u64::from(charged),
                    "{pct} % of {devcore}, pod {round}"
                );
                used = used.union(&given);
                commit(&mut n, &cores_pod(pct), &p);
            }
        }
    }
}

#[test]
fn init_containers_count_at_their_peak() {
    let n = node("n", vec![amd("A", 100, 10_000, 0)]);
    let reqs = requests(json!({
        "initContainers": [
            {"name": "i1", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "8000", "amd.com/gpucores": "80"}}},
            {"name": "i2", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "8000", "amd.com/gpucores": "80"}}}
        ],
        "containers": [
            {"name": "a1", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4000", "amd.com/gpucores": "40"}}},
            {"name": "plain"},
            {"name": "a2", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4000", "amd.com/gpucores": "40"}}}
        ]
    }));
    let p = fit(&n, &reqs).unwrap();
    let runs = &p.runs[&Vendor::Amd];
    assert_eq!(runs.len(), 5, "one run per container (D-1)");
    assert!(runs[3].is_empty());
    let mut after = n.clone();
    commit(&mut after, &reqs, &p);
    assert_eq!(
        after.usage[0].mem_mib, 8000,
        "peak of init (8000) vs sum of apps (8000)"
    );
    assert_eq!(after.usage[0].cores, 80);
    assert_eq!(after.usage[0].used, 2);
    // A third app container would push the app sum over the card.
    let too_much = requests(json!({"containers": [
        {"name": "a", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "6000"}}},
        {"name": "b", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "6000"}}}
    ]}));
    assert!(
        fit(&n, &too_much)
            .unwrap_err()
            .contains("container b: 1/1 CardInsufficientMemory")
    );
}

#[test]
fn gpu_policies_order_devices() {
    let mut n = node("n", vec![amd("A", 100, 1000, 0), amd("B", 100, 1000, 0)]);
    let small = app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}));
    let p = fit(&n, &small).unwrap();
    assert_eq!(p.runs[&Vendor::Amd][0][0].uuid, "A", "tie: lowest index");
    commit(&mut n, &small, &p);
    let spread = fit_with(&n, &small, "spread", Selectors::default()).unwrap();
    assert_eq!(spread.runs[&Vendor::Amd][0][0].uuid, "B");
    let binpack = fit_with(&n, &small, "binpack", Selectors::default()).unwrap();
    assert_eq!(binpack.runs[&Vendor::Amd][0][0].uuid, "A");
    let mutex = fit_with(&n, &small, "mutex", Selectors::default()).unwrap();
    assert_eq!(mutex.runs[&Vendor::Amd][0][0].uuid, "B");
    commit(&mut n, &small, &mutex);
    assert_eq!(
        fit_with(&n, &small, "mutex", Selectors::default()).unwrap_err(),
        "container c: 2/2 ExclusiveDeviceAllocateConflict"
    );
}

#[test]
fn node_policy_and_reasons_per_node() {
    let mut busy = node("busy", vec![amd("A", 100, 1000, 0)]);
    let idle = node("idle", vec![amd("B", 100, 1000, 0)]);
    let full = node("full", vec![amd("C", 100, 10, 0)]);
    let unregistered = node("bare", vec![]);
    let small = app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}));
    let p = fit(&busy, &small).unwrap();
    commit(&mut busy, &small, &p);
    let selectors = Selectors::default();
    let mut req = FitRequest {
        containers: &small,
        selectors: &selectors,
        gpu_policy: GpuPolicy::default(),
        node_policy: NodePolicy::Binpack,
    };
    let nodes = [busy.clone(), idle.clone(), full, unregistered];
    let out = filter(&nodes, &req);
    assert_eq!(out.chosen.as_ref().unwrap().0, "busy");
    assert_eq!(
        out.failed["full"],
        "container c: 1/1 CardInsufficientMemory"
    );
    assert_eq!(out.failed["bare"], "node unregistered");
    assert_eq!(out.fitting, 2);
    assert_eq!(out.top[0].0, "busy");
    req.node_policy = NodePolicy::Spread;
    assert_eq!(filter(&nodes, &req).chosen.unwrap().0, "idle");
    // Worked example of the reference: 5/10 used, 50/100 cores, 4000/8000 MiB → 15.
    let mut g = amd("X", 100, 8000, 0);
    g.info.count = 10;
    let mut n = node("x", vec![g]);
    n.usage[0] = GpuUsage {
        used: 4,
        mem_mib: 3000,
        cores: 40,
    };
    let p = fit(
        &n,
        &app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "1000", "amd.com/gpucores": "10"})),
    )
    .unwrap();
    assert!((p.score - 15.0).abs() < 1e-9, "{}", p.score);
}

#[test]
fn numa_and_link_binding() {
    let mut gpus = vec![
        amd("A", 100, 1000, 0),
        amd("B", 100, 1000, 1),
        amd("C", 100, 1000, 1),
        amd("D", 100, 1000, 0),
    ];
    let bdfs = [
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:03:00.0",
        "0000:04:00.0",
    ];
    for (g, bdf) in gpus.iter_mut().zip(bdfs) {
        g.info.custom_info.pci_bdf = Some(bdf.into());
    }
    // XGMI: A–B and C–D only.
    gpus[0].info.custom_info.xgmi_peers = vec!["0000:02:00.0".into()];
    gpus[2].info.custom_info.xgmi_peers = vec!["0000:04:00.0".into()];
    let n = node("n", gpus);
    let two = app(json!({"amd.com/gpu": "2", "amd.com/gpucores": "10", "amd.com/gpumem": "10"}));
    let uuids = |p: &Placement| {
        p.runs[&Vendor::Amd][0]
            .iter()
            .map(|d| d.uuid.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(uuids(&fit(&n, &two).unwrap()), vec!["A", "D"]);
    let numa = Selectors {
        amd: DeviceSelector {
            numa_bind: true,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        uuids(&fit_with(&n, &two, "spread", numa).unwrap()),
        vec!["A", "D"]
    );
    let link = Selectors {
        amd: DeviceSelector {
            link_bind: true,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        uuids(&fit_with(&n, &two, "spread", link.clone()).unwrap()),
        vec!["A", "B"]
    );
    let both = Selectors {
        amd: DeviceSelector {
            link_bind: true,
            numa_bind: true,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        fit_with(&n, &two, "spread", both).unwrap_err(),
        "container c: 4/4 XgmiLinkNotFit"
    );
    let three = app(json!({"amd.com/gpu": "3", "amd.com/gpucores": "10", "amd.com/gpumem": "10"}));
    let numa3 = Selectors {
        amd: DeviceSelector {
            numa_bind: true,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        fit_with(&n, &three, "spread", numa3).unwrap_err(),
        "container c: 4/4 NumaNotFit"
    );
    // `numa` in the policy is a preference, so three GPUs still fit.
    assert_eq!(
        fit_with(&n, &three, "spread,numa", Selectors::default())
            .unwrap()
            .runs[&Vendor::Amd][0]
            .len(),
        3
    );
    assert_eq!(
        fit_with(&n, &three, "spread", link).unwrap_err(),
        "container c: 4/4 XgmiLinkNotFit"
    );
}

#[test]
fn bad_devices_and_oversized_requests_give_reasons() {
    let mut zero_count = amd("Z", 100, 1000, 0);
    zero_count.info.count = 0;
    let zero_core = amd("Y", 0, 1000, 0);
    let mut sick = amd("S", 100, 1000, 0);
    sick.info.health = false;
    let n = node("n", vec![zero_count, zero_core, sick]);
    let one = app(json!({"amd.com/gpu": "1"}));
    assert_eq!(
        fit(&n, &one).unwrap_err(),
        "container c: 1/3 CardInsufficientCore, 1/3 CardNotHealth, 1/3 CardTimeSlicingExhausted"
    );
    let many = app(json!({"amd.com/gpu": "4"}));
    assert_eq!(
        fit(&n, &many).unwrap_err(),
        "container c: NodeInsufficientDevice"
    );
    let mut typed = Selectors::default();
    typed.amd.nouse_types = vec!["mi300".into()];
    typed.amd.use_uuids = vec!["S".into()];
    let n = node("n", vec![amd("A", 100, 1000, 0)]);
    assert_eq!(
        fit_with(&n, &one, "spread", typed).unwrap_err(),
        "container c: 1/1 CardTypeMismatch"
    );
    let mut by_uuid = Selectors::default();
    by_uuid.amd.use_uuids = vec!["other".into()];
    assert_eq!(
        fit_with(&n, &one, "spread", by_uuid).unwrap_err(),
        "container c: 1/1 CardUuidMismatch"
    );
    let huge = app(json!({"amd.com/gpu": "1", "amd.com/gpumem": "18446744073709551615"}));
    assert_eq!(
        fit(&n, &huge).unwrap_err(),
        "container c: 1/1 CardInsufficientMemory"
    );
    // NVIDIA request on an AMD-only node.
    assert_eq!(
        fit(&n, &app(json!({"nvidia.com/gpu": "1"}))).unwrap_err(),
        "no NVIDIA GPU on this node"
    );
}

#[test]
fn nvidia_exclusive_and_shared() {
    let mut n = node("n", vec![nvidia("GPU-1")]);
    let shared = app(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}));
    let p = fit(&n, &shared).unwrap();
    let dev = &p.runs[&Vendor::Nvidia][0][0];
    assert_eq!(
        (dev.device_type.as_str(), dev.mem_mib, dev.cores),
        ("NVIDIA", 1000, 0)
    );
    commit(&mut n, &shared, &p);
    // A count alone asks for the whole card: its memory is no longer free.
    assert_eq!(
        fit(&n, &app(json!({"nvidia.com/gpu": "1"}))).unwrap_err(),
        "container c: 1/1 CardInsufficientMemory"
    );
    let exclusive = app(
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "100"}),
    );
    assert_eq!(
        fit(&n, &exclusive).unwrap_err(),
        "container c: 1/1 ExclusiveDeviceAllocateConflict"
    );
    let pct = app(json!({"nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"}));
    let p = fit(&n, &pct).unwrap();
    assert_eq!(p.runs[&Vendor::Nvidia][0][0].mem_mib, 20_480);
}

fn arb_gpu() -> impl Strategy<Value = Gpu> {
    (
        1u32..4,
        prop_oneof![Just(0u32), 1u32..400],
        0u64..100_000,
        -1i32..2,
        any::<bool>(),
    )
        .prop_map(|(count, devcore, devmem, numa, health)| {
            let mut g = amd("", devcore, devmem, numa);
            g.info.count = count;
            g.info.health = health || devcore % 3 != 0;
            g
        })
}

fn arb_container() -> impl Strategy<Value = serde_json::Value> {
    (
        1u32..3,
        prop::option::of(1u64..50_000),
        prop::option::of(1u32..=100),
    )
        .prop_map(|(count, mem, cores)| {
            let mut limits = serde_json::Map::new();
            limits.insert("amd.com/gpu".into(), json!(count.to_string()));
            if let Some(mem) = mem {
                limits.insert("amd.com/gpumem".into(), json!(mem.to_string()));
            }
            if let Some(cores) = cores {
                limits.insert("amd.com/gpucores".into(), json!(cores.to_string()));
            }
            json!({"name": "c", "resources": {"limits": limits}})
        })
}

proptest! {
    /// Whatever the fleet and the pods, placing pods one by one never oversubscribes a GPU
    /// and every container gets exactly the GPUs it asked for, all distinct.
    #[test]
    fn placements_never_oversubscribe(
        gpus in prop::collection::vec(arb_gpu(), 1..5),
        pods in prop::collection::vec((prop::collection::vec(arb_container(), 0..2), prop::collection::vec(arb_container(), 1..3)), 1..6),
        policy in prop_oneof![Just("binpack"), Just("spread"), Just("mutex"), Just("binpack,numa")],
    ) {
        let gpus: Vec<Gpu> = gpus.into_iter().enumerate().map(|(i, mut g)| { g.info.id = format!("G{i}"); g }).collect();
        let mut n = node("n", gpus);
        for (init, apps) in pods {
            let reqs = requests(json!({"initContainers": init, "containers": apps}));
            if let Ok(p) = fit_with(&n, &reqs, policy, Selectors::default()) {
                // The score equals the node's usage ratios once the pod is charged.
                let mut after = n.clone();
                commit(&mut after, &reqs, &p);
                let (mut used, mut count, mut cores, mut tc, mut mem, mut tm) = (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
                for (g, u) in after.devices.gpus.iter().zip(&after.usage) {
                    used += f64::from(u.used);
                    count += f64::from(g.info.count);
                    cores += u.cores as f64;
                    tc += f64::from(g.info.devcore);
                    mem += u.mem_mib as f64;
                    tm += g.info.devmem as f64;
                }
                let r = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
                let expected = 10.0 * (r(used, count) + r(cores, tc) + r(mem, tm));
                prop_assert!((p.score - expected).abs() < 1e-9, "{} vs {}", p.score, expected);
                for (i, run) in p.runs[&Vendor::Amd].iter().enumerate() {
                    let want = reqs[i].amd.as_ref().map(|r| r.count as usize).unwrap_or(0);
                    prop_assert_eq!(run.len(), want);
                    let mut ids: Vec<_> = run.iter().map(|d| &d.uuid).collect();
                    ids.sort();
                    ids.dedup();
                    prop_assert_eq!(ids.len(), want);
                }
                commit(&mut n, &reqs, &p);
                for (g, u) in n.devices.gpus.iter().zip(&n.usage) {
                    prop_assert!(u.used <= g.info.count);
                    prop_assert!(u.mem_mib <= g.info.devmem);
                    prop_assert!(u.cores <= u64::from(g.info.devcore));
                    if u.used > 0 { prop_assert!(g.info.health); }
                }
            }
        }
    }
}

#[test]
fn a_card_held_whole_refuses_slices_with_its_own_reason() {
    // Issue 26 item 1: a card a plain pod holds whole is full, and kubectl describe says
    // why (not "every share is taken").
    let mut n = node("n", vec![amd("A", 100, 1000, 0), amd("B", 100, 1000, 0)]);
    assert!(n.hold_whole(&["A".into()]).is_empty());
    let slice = app(json!({"amd.com/gpu": "1", "amd.com/gpucores": "20"}));
    let mut pinned = Selectors::default();
    pinned.amd.use_uuids = vec!["A".into()];
    assert_eq!(
        fit_with(&n, &slice, "spread", pinned).unwrap_err(),
        "container c: 1/2 CardHeldWhole, 1/2 CardUuidMismatch"
    );
    // The other card takes the slice; with both held, both say so.
    let p = fit(&n, &slice).unwrap();
    assert_eq!(p.runs[&Vendor::Amd][0][0].uuid, "B");
    assert!(n.hold_whole(&["B".into()]).is_empty());
    assert_eq!(
        fit(&n, &slice).unwrap_err(),
        "container c: 2/2 CardHeldWhole"
    );
    // A card whose shares are all taken by slices still reads as such.
    let mut full = node("n", vec![amd("A", 100, 1000, 0)]);
    full.usage[0].used = 10;
    assert_eq!(
        fit(&full, &slice).unwrap_err(),
        "container c: 1/1 CardTimeSlicingExhausted"
    );
    assert!(refusal_labels().contains(&"CardHeldWhole"));
}

/// Issue 30: kube-scheduler offers only `FailedNodes` to preemption, so a refusal goes
/// there only when evicting slices could cure it.
#[test]
fn refusals_no_eviction_can_cure_are_unresolvable() {
    let reqs = app(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}));
    let selectors = Selectors {
        amd: DeviceSelector::default(),
        nvidia: DeviceSelector::default(),
    };
    let req = FitRequest {
        containers: &reqs,
        selectors: &selectors,
        gpu_policy: GpuPolicy::default(),
        node_policy: NodePolicy::Binpack,
    };
    // Full of slices: cured once they go.
    let mut full = node("full", vec![nvidia("f")]);
    full.usage[0].mem_mib = 30_000;
    full.usage[0].used = 3;
    // Too small even when empty.
    let mut small_gpu = nvidia("s");
    small_gpu.info.devmem = 10_000;
    let mut small = node("small", vec![small_gpu]);
    small.usage[0].used = 1;
    small.usage[0].mem_mib = 5_000;
    // Unhealthy, with a slice on it.
    let mut sick_gpu = nvidia("u");
    sick_gpu.info.health = false;
    let mut sick = node("sick", vec![sick_gpu]);
    sick.usage[0].used = 1;
    // Only AMD GPUs; and nothing registered.
    let amd_only = node("amd", vec![amd("a", 304, 196_288, 0)]);
    let bare = node("bare", vec![]);
    // Held whole by a pod the scheduler did not place: the preempt verb cannot name it.
    let mut held = node("held", vec![nvidia("h")]);
    held.hold_whole(&["h".to_owned()]);
    held.usage[0].used = 1;
    let outcome = filter([&full, &small, &sick, &amd_only, &bare, &held], &req);
    assert!(outcome.chosen.is_none());
    assert_eq!(outcome.failed.len(), 6, "{:?}", outcome.failed);
    let unresolvable: Vec<&str> = outcome.unresolvable.iter().map(String::as_str).collect();
    assert_eq!(unresolvable, ["amd", "bare", "held", "sick", "small"]);

    // A type the pod excludes is never cured either, busy or not.
    let mut typed = node("typed", vec![nvidia("t")]);
    typed.usage[0].used = 1;
    let excluding = Selectors {
        amd: DeviceSelector::default(),
        nvidia: DeviceSelector::from_annotations(
            Vendor::Nvidia,
            &[("nvidia.com/nouse-gputype".to_owned(), "A100".to_owned())].into(),
        )
        .unwrap(),
    };
    let outcome = filter(
        [&typed],
        &FitRequest {
            selectors: &excluding,
            ..req
        },
    );
    assert!(
        outcome.unresolvable.contains("typed"),
        "{:?}",
        outcome.failed
    );
}
