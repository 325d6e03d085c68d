//! Issue 32 item 4, measured before it is proposed: which card binpack picks on a node, by
//! today's device score or by the card's scarcer dimension, and what each leaves stranded
//! on the example scenarios. Run in release:
//!
//! ```text
//! cargo run --release -p hami-defrag-core --example card_score [SCENARIO.yaml ...]
//! ```
//!
//! The placement loop is the scheduler's fit (`fit_node`) pod by pod in file order: the
//! node by the scheduler's node score and node policy (the node score does not depend on
//! the card chosen: it sums the node's usage); then, for a binpack pod asking one card in
//! one container, every card of the node that fits is scored by the rule and the best one
//! taken; any other pod is placed where `fit_node` puts it. No preemption (the planner's
//! priorities scenario preempts; here a pod that fits nowhere stays pending). Under the
//! rule "today" the loop checks that it picks the card `fit_node` picks. Each scenario is
//! placed twice: pods in file order (each workload's pods arrive together), and shuffled
//! (seeded), as arrivals interleave after churn.

// Shared with the tests; the pending pods it reads are theirs.
#[allow(dead_code)]
#[path = "../tests/it/planned.rs"]
mod planned;

use hami_defrag_core::score::{even_fill_score, scarcer_dimension_score, today_score};
use hami_defrag_core::{FleetMeasure, PodRequest, measure};
use hami_planner::engine::expand_workloads;
use hami_planner::scenario::{Scenario, node_policy_name};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::{DeviceSelector, GpuPolicy, GpuPolicyKind, NodePolicy};
use hami_scheduler_core::fit::{FitRequest, Placement, Selectors, demand, fit_node};
use hami_scheduler_core::snapshot::NodeSnapshot;
use hami_scheduler_core::state::ClusterState;
use hami_scheduler_core::usage::collapse;
use k8s_openapi::api::core::v1::Node;

use planned::{demo_scenario, load, nodes_of, scenario_files};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Today,
    Scarcer,
    EvenFill,
}

struct Outcome {
    placed: usize,
    pending: usize,
    measured: FleetMeasure,
    /// Under "today": cards the loop picked that `fit_node` would not have.
    disagreements: usize,
    /// Pods whose card the rule chose differently from today's score.
    differs: usize,
    /// Pods whose card the rule chose (binpack, one card, one container).
    rescored: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let files = if args.is_empty() {
        scenario_files(u32::MAX)
    } else {
        args.clone()
    };
    let mut scenarios: Vec<(String, Vec<Node>, Scenario)> = files
        .iter()
        .map(|f| {
            let scenario = load(f);
            let name = f.rsplit('/').next().unwrap_or(f).to_owned();
            (name, nodes_of(&scenario), scenario)
        })
        .collect();
    if args.is_empty() {
        let demo = demo_scenario();
        scenarios.push(("demo".into(), nodes_of(&demo), demo));
        let mixed = mixed_lean();
        scenarios.push((mixed.name.clone(), nodes_of(&mixed), mixed));
    }
    println!(
        "| scenario | node policy | card choice | cards chosen otherwise than today | placed | pending | cards stranding one dimension | stranded GiB | stranded AMD CUs | stranded NVIDIA % | fragmentation | idle cards |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((name, nodes, scenario), shuffled) in
        scenarios.iter().flat_map(|s| [(s, false), (s, true)])
    {
        let name = if shuffled {
            format!("{name}, arrival shuffled")
        } else {
            name.clone()
        };
        for node_policy in [NodePolicy::Binpack, NodePolicy::Spread] {
            for rule in [Rule::Today, Rule::Scarcer, Rule::EvenFill] {
                let started = std::time::Instant::now();
                let o = run(nodes, scenario, shuffled, rule, node_policy);
                assert_eq!(
                    o.disagreements, 0,
                    "{name}: the loop is not the scheduler's"
                );
                let (a, n) = (&o.measured.amd, &o.measured.nvidia);
                let stranding = o
                    .measured
                    .nodes
                    .iter()
                    .flat_map(|n| &n.cards)
                    .filter(|c| c.stranded_mib > 0 || c.stranded_cores > 0)
                    .count();
                let free = a.free_mib + n.free_mib;
                let placeable = a.placeable_mib + n.placeable_mib;
                let fragmentation = if free == 0 {
                    0.0
                } else {
                    1.0 - placeable as f64 / free as f64
                };
                println!(
                    "| {name} | {} | {} | {} | {} | {} | {stranding} | {:.1} | {} | {} | {fragmentation:.3} | {} of {} |",
                    node_policy_name(node_policy),
                    match rule {
                        Rule::Today => "today (sum of ratios)",
                        Rule::Scarcer =>
                            "scarcer dimension (fill of the dimension with least left)",
                        Rule::EvenFill => "even fill (fill of the dimension with most left)",
                    },
                    o.differs,
                    o.placed,
                    o.pending,
                    (a.stranded_mib + n.stranded_mib) as f64 / 1024.0,
                    a.stranded_cores,
                    n.stranded_cores,
                    a.idle_cards + n.idle_cards,
                    a.cards + n.cards,
                );
                eprintln!(
                    "{name} {node_policy:?} {rule:?}: {} pods' cards chosen by the rule, {:.1} s",
                    o.rescored,
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
}

/// Not an example scenario: slices leaning opposite ways on one card model (memory-heavy
/// 3/8 of the memory with 12 % of the CUs, compute-heavy 1/16 of the memory with 37 %),
/// the case the card choice is about; about 80 % of the compute asked.
fn mixed_lean() -> Scenario {
    let pod = |name: &str, mem: u64, cores: u32| {
        format!(
            "  - count: 650\n    pod: {{metadata: {{name: {name}}}, spec: {{containers: [{{name: c, resources: {{limits: {{amd.com/gpu: 1, amd.com/gpumem: {mem}, amd.com/gpucores: {cores}}}}}}}]}}}}\n"
        )
    };
    let text = format!(
        "name: mixed-lean\nfleet:\n  - {{name: mi300x, count: 50, gpus: [{{type: AMD Instinct MI300X, count: 8, memory_mib: 196288, cus: 304}}]}}\nworkloads:\n{}{}",
        pod("memory-heavy", 73_608, 12),
        pod("compute-heavy", 12_268, 37)
    );
    hami_planner::scenario::parse_scenario(&text, "mixed-lean").unwrap_or_else(|e| panic!("{e}"))
}

/// Places the scenario's pods (GPU policy binpack unless the pod says otherwise), in
/// file order or `shuffled` (seeded: the same order on every run).
fn run(
    nodes: &[Node],
    scenario: &Scenario,
    shuffled: bool,
    rule: Rule,
    node_policy: NodePolicy,
) -> Outcome {
    let mut state = ClusterState::new();
    for node in nodes {
        state.upsert_node(node);
    }
    let mut snapshots: Vec<NodeSnapshot> = state.nodes().cloned().collect();
    snapshots.sort_by(|a, b| a.devices.name.cmp(&b.devices.name));
    let binpack = GpuPolicy {
        kind: GpuPolicyKind::Binpack,
        numa: false,
    };
    let mut o = Outcome {
        placed: 0,
        pending: 0,
        measured: measure(&[]),
        disagreements: 0,
        differs: 0,
        rescored: 0,
    };
    let mut pods = expand_workloads(&scenario.workloads);
    if shuffled {
        // Fisher-Yates with a fixed LCG: workloads arrive interleaved, as after churn.
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
    }
    for planned in pods {
        let Ok(req) = PodRequest::from_pod(&planned.pod, &RequestDefaults::default(), binpack)
        else {
            o.pending += 1;
            continue;
        };
        if !req.asks_gpu() {
            continue;
        }
        let fit = FitRequest {
            containers: &req.containers,
            selectors: &req.selectors,
            gpu_policy: req.gpu_policy,
            node_policy,
        };
        // The node: the scheduler's node score under the node policy, first name on a tie.
        let mut best: Option<(usize, Placement)> = None;
        for (i, node) in snapshots.iter().enumerate() {
            let Ok(p) = fit_node(node, &fit) else {
                continue;
            };
            let better = best.as_ref().is_none_or(|(_, b)| match node_policy {
                NodePolicy::Binpack => p.score > b.score,
                NodePolicy::Spread => p.score < b.score,
            });
            if better {
                best = Some((i, p));
            }
        }
        let Some((n, mut placement)) = best else {
            o.pending += 1;
            continue;
        };
        if let Some(card) = rescored(&snapshots[n], &req, &fit, rule, &mut o) {
            placement = card;
        }
        let kinds: Vec<_> = req.containers.iter().map(|c| c.kind).collect();
        let charges: Vec<_> = placement
            .runs
            .values()
            .flat_map(|runs| collapse(&kinds, runs))
            .collect();
        assert!(snapshots[n].charge(&charges).is_empty());
        o.placed += 1;
    }
    o.measured = measure(&snapshots);
    o
}

/// For a binpack pod asking one card in one container: the placement on the card of
/// `node` the rule scores best (lowest index on a tie, as the scheduler's sort); `None`
/// for any other pod.
fn rescored(
    node: &NodeSnapshot,
    req: &PodRequest,
    fit: &FitRequest<'_>,
    rule: Rule,
    o: &mut Outcome,
) -> Option<Placement> {
    let [container] = req.containers.as_slice() else {
        return None;
    };
    let (vendor, ask) = match (&container.amd, &container.nvidia) {
        (Some(a), None) => (hami_protocol::names::Vendor::Amd, a),
        (None, Some(n)) => (hami_protocol::names::Vendor::Nvidia, n),
        _ => return None,
    };
    if ask.count != 1 || req.gpu_policy.kind != GpuPolicyKind::Binpack || req.gpu_policy.numa {
        return None;
    }
    let mut best: Option<(f64, usize, Placement)> = None;
    let mut today: Option<(f64, usize)> = None;
    for (g, gpu) in node.devices.gpus.iter().enumerate() {
        if gpu.vendor != vendor {
            continue;
        }
        let only = |s: &DeviceSelector| DeviceSelector {
            use_uuids: vec![gpu.info.id.clone()],
            ..s.clone()
        };
        let selectors = Selectors {
            amd: only(&req.selectors.amd),
            nvidia: only(&req.selectors.nvidia),
        };
        let one = FitRequest {
            containers: fit.containers,
            selectors: &selectors,
            gpu_policy: fit.gpu_policy,
            node_policy: fit.node_policy,
        };
        let Ok(p) = fit_node(node, &one) else {
            continue;
        };
        let usage = &node.usage[g];
        let score = match rule {
            Rule::Today => today_score(gpu, usage, demand(gpu, ask)),
            Rule::Scarcer => scarcer_dimension_score(gpu, usage, demand(gpu, ask)),
            Rule::EvenFill => even_fill_score(gpu, usage, demand(gpu, ask)),
        };
        if best.as_ref().is_none_or(|(s, ..)| score > *s) {
            best = Some((score, g, p));
        }
        let plain = today_score(gpu, usage, demand(gpu, ask));
        if today.is_none_or(|(s, _)| plain > s) {
            today = Some((plain, g));
        }
    }
    let (_, g, p) = best?;
    o.rescored += 1;
    o.differs += usize::from(today.map(|(_, t)| t) != Some(g));
    if rule == Rule::Today {
        let own = fit_node(node, fit).ok()?;
        let card = |p: &Placement| {
            p.runs
                .values()
                .flatten()
                .flat_map(|c| c.iter().map(|d| d.uuid.clone()))
                .collect::<Vec<_>>()
        };
        if card(&own) != vec![node.devices.gpus[g].info.id.clone()] {
            o.disagreements += 1;
        }
    }
    Some(p)
}
