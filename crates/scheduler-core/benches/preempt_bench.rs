//! The preempt verb (run: `cargo bench -p hami-scheduler-core --bench preempt_bench`).
//!
//! 1,000 nodes × 8 MI300X (64 shares each), every GPU full with 64 slices of priority 0–3
//! (one in eight labelled `hami.io/preemptible: "false"`); the preemptor (priority 1000)
//! asks for 1 GPU, 48 GiB, 25 % of its CUs, so each node needs 15 victims on one card.
//! kube-scheduler ≥ 1.38 sends every node with an empty list: the request is decoded, the
//! proposals read and every node decided, as one `/preempt` call costs the scheduler.
//! Also at 100 nodes, kube-scheduler's default candidate window. Prints p50/p99.
//!
//! First the decision alone, on each node's pods as the state keeps them for the verb
//! (`NodePods`). Then the call as served (`hami_scheduler::preempt`), on the same cluster
//! fed through `ClusterState` as the informers feed it: what the shell does under the
//! state's lock (the proposed nodes' lookups; then per node its snapshot and the state's
//! list of its pods, `victim_facts::node_pods`), then the decision outside it and the
//! answer encoded. Twice:
//! with no node changed since the previous call, and with every node changed (one
//! holder's labels, between calls: the informer update changes the node's list in place,
//! timed too, as it holds the lock as well).
use std::collections::{BTreeMap, HashMap};
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
    HeldCandidate, NodePods, PodFacts, Preemptor, Protection, decide_preemption_held, decode_args,
    proposals,
};
use hami_scheduler_core::reservations::for_filter;
use hami_scheduler_core::snapshot::{Gpu, NodeDevices, NodeSnapshot};
use hami_scheduler_core::state::ClusterState;
use hami_scheduler_core::usage::DeviceCharge;
use hami_scheduler_core::victim_facts::{node_pods, unknown_proposals};
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

/// The preemptor and the request body kube-scheduler sends for `nodes` nodes.
fn request(nodes: usize) -> Vec<u8> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": "tenant", "uid": "big"},
        "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {"limits": {
            "amd.com/gpu": "1", "amd.com/gpumem": "49152", "amd.com/gpucores": "25"}}}]}
    }))
    .unwrap();
    let empty: serde_json::Map<String, serde_json::Value> = (0..nodes)
        .map(|i| {
            (
                format!("node-{i}"),
                json!({"Pods": null, "NumPDBViolations": 0}),
            )
        })
        .collect();
    serde_json::to_vec(&json!({"Pod": pod, "NodeNameToMetaVictims": empty})).unwrap()
}

fn read(body: &[u8]) -> (Pod, Preemptor, BTreeMap<String, Vec<String>>) {
    let args = decode_args(body).unwrap();
    let pod = args.pod.clone().unwrap();
    let preemptor = Preemptor::from_pod(
        &pod,
        &RequestDefaults::default(),
        GpuPolicy::default(),
        NodePolicy::Binpack,
    )
    .unwrap();
    (pod, preemptor, proposals(&args))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The decision alone: decode, read the proposals, decide every node.
fn run(nodes: usize, rounds: usize, cluster: &[(NodeSnapshot, Vec<PodFacts>)]) {
    let by_name: BTreeMap<String, usize> = (0..nodes).map(|i| (format!("node-{i}"), i)).collect();
    // Each node's pods as the state keeps them (`victim_facts::node_pods`).
    let held: Vec<NodePods> = cluster[..nodes]
        .iter()
        .map(|(_, pods)| {
            NodePods::new(
                pods.iter()
                    .map(|p| (Arc::new(p.clone()), p.charges.as_slice())),
            )
        })
        .collect();
    let body = request(nodes);
    let cpu_before = cpu_seconds();
    let mut times = Vec::with_capacity(rounds);
    let mut victims = 0;
    for _ in 0..rounds {
        let start = Instant::now();
        let (_, preemptor, proposed) = read(&body);
        let decision = decide_preemption_held(
            &preemptor,
            &proposed,
            |name| {
                let i = *by_name.get(name)?;
                Some(HeldCandidate {
                    snapshot: &cluster[i].0,
                    pods: &held[i],
                })
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
        "preempt verb, {nodes} nodes x {GPUS} GPUs x {SLICES} slices, empty proposals ({} threads): the decision: min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, CPU {:.2} ms per call, {victims} victims per node ({rounds} rounds)",
        threads.min(8),
        ms(times[0]),
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        cpu * 1e3,
    );
}

/// The pod of slice `p` on `snapshot`'s node as the informers show it, with the extra
/// label `round` (a label change is a change of the holder's facts).
fn slice_pod(snapshot: &NodeSnapshot, p: &PodFacts, round: usize) -> Pod {
    let c = &p.charges[0];
    let mut labels: BTreeMap<String, String> = [
        ("app".to_owned(), format!("app-{}", p.priority)),
        ("round".to_owned(), round.to_string()),
    ]
    .into();
    if p.protection.is_some() {
        labels.insert("hami.io/preemptible".into(), "false".into());
    }
    serde_json::from_value(json!({
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "labels": labels,
            "annotations": {"hami.io/vgpu-node": snapshot.devices.name,
                "hami.io/amd-devices-allocated":
                    format!("{},AMD Instinct MI300X,{},{}:;", c.uuid, c.mem_mib, c.cores)}},
        "spec": {"schedulerName": "hami-scheduler", "priority": p.priority,
            "nodeName": snapshot.devices.name,
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

/// The cluster of [`node`] as the informers feed the state: nodes with their register
/// annotation, and each slice a pod of this scheduler with its allocation annotations
/// (pods first: a node's usage is then counted once, when it arrives).
fn state(nodes: usize, cluster: &[(NodeSnapshot, Vec<PodFacts>)]) -> ClusterState {
    let mut state = ClusterState::new();
    for (snapshot, pods) in &cluster[..nodes] {
        for p in pods {
            state.upsert_pod(&slice_pod(snapshot, p, 0));
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

/// One call as the shell serves it (`hami_scheduler::preempt`): decode, the two sections
/// under the state's lock (nominated pods and defrag reservations charged, as in Filter;
/// the state's lists), the decision, the answer encoded. Returns (time under the lock,
/// whole call).
fn served(state: &ClusterState, body: &[u8], config: &FilterConfig) -> (Duration, Duration) {
    let start = Instant::now();
    let (pod, preemptor, proposed) = read(body);
    // Under the lock: which proposed nodes need their pods listed (none here).
    let locked = Instant::now();
    let to_list: Vec<&String> = proposed
        .iter()
        .filter(|(node, uids)| {
            state.node(node).is_some() && !unknown_proposals(state, node, uids).is_empty()
        })
        .map(|(node, _)| node)
        .collect();
    let mut held = locked.elapsed();
    assert!(to_list.is_empty());
    // Under the lock again: snapshots and the state's lists.
    let locked = Instant::now();
    let names: Vec<String> = proposed.keys().cloned().collect();
    let mut nominated = charged_snapshots(state, &pod, &names, config);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut reserved = for_filter(
        state,
        &pod,
        &names,
        |name| nominated.get(name).or_else(|| state.node(name)),
        now,
    )
    .charged;
    let nodes: HashMap<String, (NodeSnapshot, Arc<NodePods>)> = proposed
        .keys()
        .filter_map(|name| {
            let snapshot = match reserved.remove(name).or_else(|| nominated.remove(name)) {
                Some(charged) => charged,
                None => state.node(name)?.clone(),
            };
            Some((name.clone(), (snapshot, node_pods(state, name)?)))
        })
        .collect();
    held += locked.elapsed();
    let decision = decide_preemption_held(
        &preemptor,
        &proposed,
        |name| {
            let (snapshot, pods) = nodes.get(name)?;
            Some(HeldCandidate { snapshot, pods })
        },
        &[],
    );
    let answer = serde_json::to_vec(&decision.result).unwrap();
    let total = start.elapsed();
    assert!(answer.len() > proposed.len());
    assert_eq!(
        decision.result.node_name_to_meta_victims.len(),
        proposed.len()
    );
    assert!(nodes.values().all(|(_, p)| p.len() == GPUS * SLICES));
    (held, total)
}

/// The call as served, `rounds` times; `changed`: every node changed before each call.
fn as_served(
    nodes: usize,
    rounds: usize,
    changed: bool,
    cluster: &[(NodeSnapshot, Vec<PodFacts>)],
) {
    let mut state = state(nodes, cluster);
    let body = request(nodes);
    let config = FilterConfig::default();
    served(&state, &body, &config);
    let (mut held, mut total, mut updates) = (Vec::new(), Vec::new(), Vec::new());
    let mut cpu = 0.0;
    for round in 1..=rounds {
        if changed {
            for (snapshot, pods) in &cluster[..nodes] {
                let pod = slice_pod(snapshot, &pods[round % pods.len()], round);
                // An informer update holds the lock too: now it also updates the list.
                let start = Instant::now();
                state.upsert_pod(&pod);
                updates.push(start.elapsed());
            }
        }
        let cpu_before = cpu_seconds();
        let (h, t) = served(&state, &body, &config);
        cpu += cpu_seconds() - cpu_before;
        held.push(h);
        total.push(t);
    }
    held.sort();
    total.sort();
    updates.sort();
    let what = if changed {
        format!(
            "every node changed since the last call (a holder's labels; each informer update under the lock p50 {:.1} us, p99 {:.1} us)",
            percentile(&updates, 0.5).as_secs_f64() * 1e6,
            percentile(&updates, 0.99).as_secs_f64() * 1e6,
        )
    } else {
        "no node changed since the last call".to_owned()
    };
    println!(
        "preempt verb as served, {nodes} nodes x {GPUS} GPUs x {SLICES} slices, {what}: state lock held p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; whole call p50 {:.2} ms, p99 {:.2} ms, CPU {:.1} ms per call ({rounds} rounds)",
        ms(percentile(&held, 0.5)),
        ms(percentile(&held, 0.99)),
        ms(held[held.len() - 1]),
        ms(percentile(&total, 0.5)),
        ms(percentile(&total, 0.99)),
        cpu * 1e3 / rounds as f64,
    );
}

fn main() {
    let rounds: usize = std::env::var("PREEMPT_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(50);
    // `PREEMPT_BENCH_ROWS=decision-1000,served-1000` runs those rows only (for callgrind:
    // instructions per call are the difference of two round counts over the difference).
    let rows = std::env::var("PREEMPT_BENCH_ROWS").ok();
    let wanted = |row: &str| {
        rows.as_deref()
            .is_none_or(|r| r.split(',').any(|w| w == row))
    };
    let cluster: Vec<(NodeSnapshot, Vec<PodFacts>)> = (0..1_000).map(node).collect();
    for nodes in [100, 1_000] {
        if wanted(&format!("decision-{nodes}")) {
            run(nodes, rounds, &cluster);
        }
    }
    for nodes in [100, 1_000] {
        if wanted(&format!("served-{nodes}")) {
            as_served(nodes, rounds, false, &cluster);
        }
    }
    for nodes in [100, 1_000] {
        if wanted(&format!("changed-{nodes}")) {
            as_served(nodes, rounds.min(20), true, &cluster);
        }
    }
}
