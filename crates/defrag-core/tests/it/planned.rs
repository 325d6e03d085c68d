//! Recorded snapshots from the what-if planner (`hami-planner`): a scenario's pods placed,
//! in file order, by the scheduler's own filter decision under one policy pair, read back
//! from the scheduler's `ClusterState` into a [`Cluster`] as the shell reads the live one.
//! Shared by the scenario tests and the stranded-capacity example.

use std::collections::HashMap;

use hami_defrag_core::{Cluster, Owner, Pdb, PodRequest, Safety};
use hami_planner::engine::{PlannedPod, PodOutcome, run_policy};
use hami_planner::fleet::{build_nodes, resolve_groups};
use hami_planner::scenario::{Scenario, parse_scenario};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::{GpuPolicy, GpuPolicyKind, NodePolicy};
use k8s_openapi::api::core::v1::{Node, Pod};

/// The repository's `examples/` directory.
pub(crate) const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");

/// The policy pairs the scenarios compare by default (GPU policy, node policy).
pub(crate) const PAIRS: [(GpuPolicy, NodePolicy); 4] = [
    (gpu(GpuPolicyKind::Binpack), NodePolicy::Binpack),
    (gpu(GpuPolicyKind::Binpack), NodePolicy::Spread),
    (gpu(GpuPolicyKind::Spread), NodePolicy::Binpack),
    (gpu(GpuPolicyKind::Spread), NodePolicy::Spread),
];

const fn gpu(kind: GpuPolicyKind) -> GpuPolicy {
    GpuPolicy { kind, numa: false }
}

/// One policy pair's cluster after every pod of the scenario was offered.
pub(crate) struct Placed {
    /// The nodes and every placed pod.
    pub(crate) cluster: Cluster,
    /// Pods that fit nowhere (or were evicted and fit nowhere again) and whose request
    /// reads: `namespace/name` and what they ask for.
    pub(crate) pending: Vec<(String, PodRequest)>,
}

/// Reads and validates a scenario file as `hami plan` does.
pub(crate) fn load(path: &str) -> Scenario {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse_scenario(&text, path).unwrap_or_else(|e| panic!("{e}"))
}

/// The scenario's files: `examples/scenarios/*.yaml`, by name, leaving out those with
/// more than `max_pods` pods (fleet-1000's 10,000 are for release builds).
pub(crate) fn scenario_files(max_pods: u32) -> Vec<String> {
    let dir = format!("{EXAMPLES}/scenarios");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .filter(|p| load(p).workloads.iter().map(|w| w.count).sum::<u32>() <= max_pods)
        .collect();
    files.sort();
    files
}

/// A pod the planner may move: the scenario says nothing of owners or budgets, so every
/// pod is taken as one replica of three under a PodDisruptionBudget allowing one.
pub(crate) fn movable() -> Safety {
    Safety {
        pdb: Some(Pdb {
            name: "default/pdb".into(),
            disruptions_allowed: 1,
        }),
        owner: Some(Owner {
            kind: "ReplicaSet".into(),
            name: "workload".into(),
            replicas: 3,
        }),
        age_seconds: 3600,
        ..Safety::default()
    }
}

/// The scenario's nodes, as the planner builds them (captures discovered and registered
/// as the AMD plugin does).
pub(crate) fn nodes_of(scenario: &Scenario) -> Vec<Node> {
    let specs = resolve_groups(&scenario.fleet).unwrap_or_else(|e| panic!("{e}"));
    build_nodes(&scenario.fleet, &specs).unwrap_or_else(|e| panic!("{e}"))
}

/// Places `pods` (`expand_workloads` of a scenario, in the order given) on `nodes` under
/// `gpu` × `node` with the planner's engine (the scheduler's `decide_filter`, preemption
/// included) and reads the state back.
pub(crate) fn place_pods(
    nodes: &[Node],
    pods: &[PlannedPod],
    gpu: GpuPolicy,
    node: NodePolicy,
) -> Placed {
    let run = run_policy(nodes, pods, gpu, node);
    let defaults = RequestDefaults::default();
    let by_uid: HashMap<&str, &Pod> = pods
        .iter()
        .map(|p| (p.pod.metadata.uid.as_deref().unwrap_or_default(), &p.pod))
        .collect();
    let cluster = Cluster::from_state(&run.state, |uid, _| {
        let request = PodRequest::from_pod(by_uid.get(uid)?, &defaults, gpu).ok()?;
        Some((request, movable()))
    });
    let pending = pods
        .iter()
        .zip(&run.outcomes)
        .filter(|(_, o)| {
            matches!(
                o,
                PodOutcome::Unplaceable { .. } | PodOutcome::Evicted { .. }
            )
        })
        .filter_map(|(p, _)| {
            let request = PodRequest::from_pod(&p.pod, &defaults, gpu).ok()?;
            let meta = &p.pod.metadata;
            let name = format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or("default"),
                meta.name.as_deref().unwrap_or_default()
            );
            request.asks_gpu().then_some((name, request))
        })
        .collect();
    Placed { cluster, pending }
}

/// The demo's nodes as recorded from [`demo_scenario`]'s captures (`nodes_of`; the
/// stranded example checks the recording against the captures and rewrites it with
/// `--record-demo`): discovering the MI300X CPX capture takes ~25 s in a debug build.
pub(crate) const DEMO_NODES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo-nodes.json");

/// The recorded demo nodes.
pub(crate) fn demo_nodes() -> Vec<Node> {
    let text = std::fs::read_to_string(DEMO_NODES).unwrap_or_else(|e| panic!("{DEMO_NODES}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DEMO_NODES}: {e}"))
}

/// The demo's cluster (`hami demo`) without its processes: its AMD nodes from the same KFD
/// captures (`mi300x-node`: MI300X in CPX mode, `mi210-node`: 8 × MI210 in two XGMI hives,
/// registered as the AMD plugin does), its NVIDIA node as the stand-in driver shows it (one
/// 16 GiB GPU, the plugin's default 10 shares), and the device-plugin example pods it
/// submits (`examples/0*.yaml`, file order; the DRA examples hold no scheduler slices).
/// The pods go through the scheduler's filter as written: the demo's webhook only routes
/// them to the extender.
pub(crate) fn demo_scenario() -> Scenario {
    let mut files: Vec<_> = std::fs::read_dir(EXAMPLES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with('0') && name.ends_with(".yaml")
        })
        .collect();
    files.sort();
    let workloads: Vec<serde_json::Value> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let mut pod: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let pod = pod.as_object_mut().unwrap();
            pod.remove("apiVersion");
            pod.remove("kind");
            serde_json::json!({"count": 1, "pod": pod})
        })
        .collect();
    let text = format!(
        "name: demo\nfleet:\n\
         - {{name: mi300x-node, count: 1, capture: mi300x-cpx}}\n\
         - {{name: mi210-node, count: 1, capture: mi210-xgmi}}\n\
         - {{name: nvidia-node, count: 1, gpus: [{{vendor: nvidia, type: Stand-in NVIDIA GPU, count: 1, memory_mib: 16384, share: 10}}]}}\n\
         workloads: {}\n",
        serde_json::Value::Array(workloads)
    );
    parse_scenario(&text, "demo").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The pods in a seeded shuffled order (Fisher-Yates, fixed LCG: the same on every run):
/// workloads arriving interleaved, as after churn, rather than each workload's pods
/// together.
pub(crate) fn shuffled(mut pods: Vec<PlannedPod>) -> Vec<PlannedPod> {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..pods.len()).rev() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        pods.swap(
            i,
            usize::try_from((seed >> 33) % (i as u64 + 1)).unwrap_or(0),
        );
    }
    pods
}
