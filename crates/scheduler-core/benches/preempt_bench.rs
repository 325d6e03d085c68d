//! The preempt verb's decision (run: `cargo bench -p hami-scheduler-core --bench preempt_bench`).
//!
//! 1,000 nodes × 8 MI300X (64 shares each), every GPU full with 64 slices of priority 0–3
//! (one in eight labelled `hami.io/preemptible: "false"`); the preemptor (priority 1000)
//! asks for 1 GPU, 48 GiB, 25 % of its CUs, so each node needs 15 victims on one card.
//! kube-scheduler ≥ 1.38 sends every node with an empty list: the request is decoded, the
//! proposals read and every node decided, as one `/preempt` call costs the scheduler.
//! Also at 100 nodes, kube-scheduler's default candidate window. Prints p50/p99.
//!
//! Then the part the shell (`hami_scheduler::preempt`) does before deciding, under the
//! state's lock, on the same cluster fed through `ClusterState` as the informers feed it:
//! each proposed node's snapshot and its slice holders' facts (`candidate_pods`) copied
//! out, so the decision runs without the lock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_protocol::names::Vendor;
use hami_protocol::node_register::encode_node_devices;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::{GpuPolicy, NodePolicy};
use hami_scheduler_core::extender::FilterConfig;
use hami_scheduler_core::nominated::charged_snapshots;
use hami_scheduler_core::preemption::{
    NodeCandidate, PodFacts, Preemptor, Protection, decide_preemption, decode_args, proposals,
};
use hami_scheduler_core::snapshot::{Gpu, NodeDevices, NodeSnapshot};
use hami_scheduler_core::state::ClusterState;
use hami_scheduler_core::usage::DeviceCharge;
use hami_scheduler_core::victim_facts::candidate_pods;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

const GPUS: usize = 8;
const SLICES: usize = 64;

fn node(index: usize) -> (NodeSnapshot, Vec<PodFacts>) {
    let gpus: Vec<Gpu> = (0..GPUS)
        .map(|g| Gpu {
            vendor: Vendor::Amd,
            info: DeviceInfo {
                id: format!("gpu-{index}-{g}"),
                index: g as u32 + 1,
                count: SLICES as u32,
                devmem: 196_288,
                devcore: 304,
                device_type: "AMD Instinct MI300X".into(),
                numa: (g / 4) as i32,
                mode: DeviceMode::HamiCore,
                health: true,
                device_vendor: "AMD".into(),
                custom_info: CustomInfo::default(),
            },
        })
        .collect();
    let mut snapshot = NodeSnapshot::idle(Arc::new(NodeDevices {
        name: format!("node-{index}"),
        gpus,
        ..Default::default()
    }));
    let mut pods = Vec::with_capacity(GPUS * SLICES);
    for g in 0..GPUS {
        for s in 0..SLICES {
            let uid = format!("p-{index}-{g}-{s}");
            let charges = vec![DeviceCharge {
                uuid: format!("gpu-{index}-{g}"),
                slots: 1,
                mem_mib: 3_000,
                cores: 4,
            }];
            snapshot.charge(&charges);
            pods.push(PodFacts {
                namespace: "tenant".into(),
                name: uid.clone(),
                uid,
                priority: ((g + s) % 4) as i32,
                protection: (s % 8 == 7).then_some(Protection::NotPreemptible),
                labels: BTreeMap::new(),
                charges,
            });
        }
    }
    (snapshot, pods)
}

/// CPU seconds this process has used (`/proc/self/stat` utime + stime at 100 ticks/s):
/// on a loaded machine wall-clock percentiles measure the load, this the work.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn run(nodes: usize, rounds: usize, cluster: &[(NodeSnapshot, Vec<PodFacts>)]) {
    let by_name: BTreeMap<String, usize> = (0..nodes).map(|i| (format!("node-{i}"), i)).collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": "tenant", "uid": "big"},
        "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {"limits": {
            "amd.com/gpu": "1", "amd.com/gpumem": "49152", "amd.com/gpucores": "25"}}}]}
    }))
    .unwrap();
    let empty: serde_json::Map<String, serde_json::Value> = by_name
        .keys()
        .map(|n| (n.clone(), json!({"Pods": null, "NumPDBViolations": 0})))
        .collect();
    let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNameToMetaVictims": empty})).unwrap();
    let cpu_before = cpu_seconds();
    let mut times = Vec::with_capacity(rounds);
    let mut victims = 0;
    for _ in 0..rounds {
        let start = Instant::now();
        let args = decode_args(&body).unwrap();
        let preemptor = Preemptor::from_pod(
            args.pod.as_ref().unwrap(),
            &RequestDefaults::default(),
            GpuPolicy::default(),
            NodePolicy::Binpack,
        )
        .unwrap();
        let decision = decide_preemption(
            &preemptor,
            &proposals(&args),
            |name| {
                let (snapshot, pods) = &cluster[*by_name.get(name)?];
                Some(NodeCandidate { snapshot, pods })
            },
            &[],
        );
        times.push(start.elapsed());
        assert_eq!(decision.result.node_name_to_meta_victims.len(), nodes);
        victims = decision.victim_count() / nodes;
    }
    let cpu = (cpu_seconds() - cpu_before) / rounds as f64;
    times.sort();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "preempt verb, {nodes} nodes x {GPUS} GPUs x {SLICES} slices, empty proposals ({} threads): min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, CPU {:.2} ms per call, {victims} victims per node ({rounds} rounds)",
        threads.min(8),
        times[0].as_secs_f64() * 1e3,
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        cpu * 1e3,
    );
}

/// The cluster of [`node`] as the informers feed the state: nodes with their register
/// annotation, and each slice a pod of this scheduler with its allocation annotations
/// (pods first: a node's usage is then counted once, when it arrives).
fn state(nodes: usize, cluster: &[(NodeSnapshot, Vec<PodFacts>)]) -> ClusterState {
    let mut state = ClusterState::new();
    for (snapshot, pods) in &cluster[..nodes] {
        for p in pods {
            let c = &p.charges[0];
            let mut labels: BTreeMap<String, String> =
                [("app".to_owned(), format!("app-{}", p.priority))].into();
            if p.protection.is_some() {
                labels.insert("hami.io/preemptible".into(), "false".into());
            }
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "labels": labels,
                    "annotations": {"hami.io/vgpu-node": snapshot.devices.name,
                        "hami.io/amd-devices-allocated":
                            format!("{},AMD Instinct MI300X,{},{}:;", c.uuid, c.mem_mib, c.cores)}},
                "spec": {"schedulerName": "hami-scheduler", "priority": p.priority,
                    "nodeName": snapshot.devices.name,
                    "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}
            }))
            .unwrap();
            state.upsert_pod(&pod);
        }
        let gpus: Vec<DeviceInfo> = snapshot
            .devices
            .gpus
            .iter()
            .map(|g| g.info.clone())
            .collect();
        let node: Node = serde_json::from_value(json!({"metadata": {"name": snapshot.devices.name,
            "annotations": {"hami.io/node-amd-register": encode_node_devices(&gpus).unwrap()}}}))
        .unwrap();
        state.upsert_node(&node);
    }
    state
}

/// What the shell copies out of the state per call, under its lock.
fn assembly(nodes: usize, rounds: usize, cluster: &[(NodeSnapshot, Vec<PodFacts>)]) {
    let state = state(nodes, cluster);
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": "tenant", "uid": "big"},
        "spec": {"priority": 1000, "containers": [{"name": "c"}]}
    }))
    .unwrap();
    let config = FilterConfig::default();
    let mut times = Vec::with_capacity(rounds);
    let mut held = 0;
    for _ in 0..rounds {
        let start = Instant::now();
        let mut nominated = charged_snapshots(&state, &pod, &names, &config);
        let copied: Vec<(NodeSnapshot, Vec<PodFacts>)> = names
            .iter()
            .filter_map(|name| {
                let snapshot = match nominated.remove(name) {
                    Some(charged) => charged,
                    None => state.node(name)?.clone(),
                };
                Some((snapshot, candidate_pods(&state, name, &[])))
            })
            .collect();
        times.push(start.elapsed());
        held = copied.iter().map(|(_, pods)| pods.len()).sum::<usize>() / nodes;
        drop(copied);
    }
    assert_eq!(held, GPUS * SLICES, "every slice holder is a candidate");
    times.sort();
    println!(
        "preempt verb, {nodes} nodes x {GPUS} GPUs x {SLICES} slices: the shell's copy out of the state under its lock: p50 {:.2} ms, p99 {:.2} ms ({rounds} rounds)",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
    );
}

fn main() {
    let rounds: usize = std::env::var("PREEMPT_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(50);
    let cluster: Vec<(NodeSnapshot, Vec<PodFacts>)> = (0..1_000).map(node).collect();
    run(100, rounds, &cluster);
    run(1_000, rounds, &cluster);
    assembly(100, rounds, &cluster);
    assembly(1_000, rounds.min(10), &cluster);
}
