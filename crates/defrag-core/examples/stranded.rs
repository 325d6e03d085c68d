//! Stranded capacity and fragmentation on the example scenarios (issue 32, BENCHMARKS.md):
//! each scenario's pods placed by the what-if planner (the scheduler's own filter) under
//! each GPU × node policy pair, measured; then a defragmentation plan applied and measured
//! again: "every card ≥ 50 % free or full", and "free whole cards" (per vendor, as many
//! as moves can free). Run in release (fleet-1000 places 10,000 pods per pair):
//!
//! ```text
//! cargo run --release -p hami-defrag-core --example stranded [SCENARIO.yaml ...]
//! ```
//!
//! Without arguments: every `examples/scenarios/*.yaml` and the demo's cluster, each with
//! its pods in file order and shuffled (seeded: workloads arriving interleaved). Every pod
//! is taken as movable (one replica of three under a PDB allowing one): the scenarios say
//! nothing of owners or budgets. Prints a Markdown table. `--record-demo` rewrites the demo
//! nodes the tests plan over (`tests/data/demo-nodes.json`) from the captures.

// Shared with the tests; the pending pods it reads are theirs.
#[allow(dead_code)]
#[path = "../tests/it/planned.rs"]
mod planned;

use std::collections::BTreeMap;
use std::time::Instant;

use hami_defrag_core::{Cluster, FleetMeasure, Policy, Target, apply, measure, plan};
use hami_planner::scenario::{Scenario, node_policy_name};
use hami_protocol::names::Vendor;
use k8s_openapi::api::core::v1::Node;

use hami_planner::engine::expand_workloads;
use planned::{
    DEMO_NODES, PAIRS, demo_nodes, demo_scenario, load, nodes_of, place_pods, scenario_files,
    shuffled,
};

/// Moves allowed per plan: enough that the targets, not the cap, end each plan.
const MAX_MOVES: usize = 1_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--record-demo") {
        let nodes = nodes_of(&demo_scenario());
        std::fs::write(
            DEMO_NODES,
            serde_json::to_string_pretty(&nodes).unwrap() + "\n",
        )
        .unwrap();
        eprintln!("recorded {} nodes in {DEMO_NODES}", nodes.len());
        return;
    }
    let files = if args.is_empty() {
        scenario_files(u32::MAX)
    } else {
        args.clone()
    };
    let mut scenarios: Vec<(String, Vec<Node>, Scenario)> = files
        .iter()
        .map(|f| {
            let scenario = load(f);
            (f.clone(), nodes_of(&scenario), scenario)
        })
        .collect();
    if args.is_empty() {
        let demo = demo_scenario();
        let nodes = nodes_of(&demo);
        // The tests plan over the recording: it must still be what the captures give.
        assert!(
            nodes == demo_nodes(),
            "{DEMO_NODES} differs from the captures: rerun with --record-demo"
        );
        scenarios.push(("demo".into(), nodes, demo));
    }
    let policy = Policy {
        max_moves: MAX_MOVES,
        ..Policy::default()
    };
    println!(
        "| scenario | GPU / node policy | state | moves | idle cards | free GiB | stranded GiB | stranded AMD CUs | stranded NVIDIA % | fragmentation |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for ((file, nodes, scenario), shuffle) in scenarios.iter().flat_map(|s| [(s, false), (s, true)])
    {
        let name = file.rsplit('/').next().unwrap_or(file);
        let name = if shuffle {
            format!("{name}, arrival shuffled")
        } else {
            name.to_owned()
        };
        let mut pods = expand_workloads(&scenario.workloads);
        if shuffle {
            pods = shuffled(pods);
        }
        for (gpu, node) in PAIRS {
            let started = Instant::now();
            let placed = place_pods(nodes, &pods, gpu, node);
            let pair = format!(
                "{} / {}",
                format!("{:?}", gpu.kind).to_lowercase(),
                node_policy_name(node)
            );
            let row = |state: &str, moves: String, m: &FleetMeasure| {
                println!("| {name} | {pair} | {state} | {moves} | {} |", cells(m));
            };
            row("placed", "–".into(), &measure(&placed.cluster.nodes));
            let target = Target::MinFreeOrFull { percent: 50 };
            let (after, moves) = planned_and_applied(&placed.cluster, &[target], &policy);
            row(
                "after: every card ≥ 50 % free or full",
                moves,
                &measure(&after.nodes),
            );
            let (after, moves) =
                planned_and_applied(&placed.cluster, &whole_cards(&placed.cluster), &policy);
            row("after: free whole cards", moves, &measure(&after.nodes));
            eprintln!("{name} {pair}: {:.1} s", started.elapsed().as_secs_f64());
        }
    }
}

/// One "free whole cards" target per vendor, over every card of the vendor (the part its
/// card types share, as `use-gputype` matches: a target per type would move pods onto
/// the next type's cards and the next target move them back), asking for all of them:
/// the planner frees as many as moves can, and says what blocks the rest.
fn whole_cards(cluster: &Cluster) -> Vec<Target> {
    let mut types: BTreeMap<Vendor, Vec<&str>> = BTreeMap::new();
    for gpu in cluster.nodes.iter().flat_map(|n| &n.devices.gpus) {
        types
            .entry(gpu.vendor)
            .or_default()
            .push(&gpu.info.device_type);
    }
    types
        .into_values()
        .map(|types| {
            let first = types[0];
            let shared = types.iter().fold(first.len(), |len, t| {
                first
                    .bytes()
                    .zip(t.bytes())
                    .take(len)
                    .take_while(|(a, b)| a == b)
                    .count()
            });
            Target::FreeWholeCards {
                device_type: first[..shared].to_owned(),
                count: types.len(),
            }
        })
        .collect()
}

/// Plans and applies each target in turn; the cluster after, and the moves made (with
/// "reached" when every target was).
fn planned_and_applied(
    cluster: &Cluster,
    targets: &[Target],
    policy: &Policy,
) -> (Cluster, String) {
    let mut now = cluster.clone();
    let (mut moves, mut reached) = (0, true);
    for target in targets {
        let p = plan(&now, target, policy).unwrap_or_else(|e| panic!("{e:?}"));
        let (after, skipped) = apply(&now, &p);
        assert!(skipped.is_empty(), "{skipped:?}");
        moves += p.moves.len();
        reached &= p.reached;
        now = after;
    }
    let moves = if reached {
        format!("{moves} (reached)")
    } else {
        moves.to_string()
    };
    (now, moves)
}

/// The measured columns, AMD and NVIDIA cards together (cores per vendor: CUs and percent
/// do not add up).
fn cells(m: &FleetMeasure) -> String {
    let (a, n) = (&m.amd, &m.nvidia);
    let free = a.free_mib + n.free_mib;
    let placeable = a.placeable_mib + n.placeable_mib;
    let fragmentation = if free == 0 {
        0.0
    } else {
        1.0 - placeable as f64 / free as f64
    };
    let gib = |mib: u64| format!("{:.1}", mib as f64 / 1024.0);
    format!(
        "{} of {} | {} | {} | {} | {} | {:.3}",
        a.idle_cards + n.idle_cards,
        a.cards + n.cards,
        gib(free),
        gib(a.stranded_mib + n.stranded_mib),
        a.stranded_cores,
        n.stranded_cores,
        fragmentation
    )
}
