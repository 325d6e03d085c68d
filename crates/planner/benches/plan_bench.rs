//! What-if planner at fleet scale: `examples/scenarios/fleet-1000.yaml` (1,000 nodes × 8
//! GPUs, 10,000 pods) under the four GPU × node policy pairs. A plain `main` (harness =
//! false): prints the time of each phase and of the whole `run`.
//!
//! `cargo bench -p hami-planner --bench plan_bench`

use std::time::Instant;

use hami_planner::engine::{expand_workloads, run_policy};
use hami_planner::fleet::{build_nodes, resolve_groups};
use hami_planner::report::{policy_report, workload_slices};
use hami_planner::scenario::{node_policy_name, parse_scenario};
use hami_planner::{PlanArgs, run};

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/scenarios/fleet-1000.yaml"
    );
    let text = std::fs::read_to_string(path).expect("benchmark scenario");
    let started = Instant::now();
    let scenario = parse_scenario(&text, path).expect("scenario parses");
    let specs = resolve_groups(&scenario.fleet).expect("fleet resolves");
    let nodes = build_nodes(&scenario.fleet, &specs).expect("nodes build");
    let pods = expand_workloads(&scenario.workloads);
    let slices = workload_slices(&scenario.workloads);
    println!(
        "setup (parse, discover the capture, {} nodes, {} pods): {:.2} s",
        nodes.len(),
        pods.len(),
        started.elapsed().as_secs_f64()
    );
    for gpu in &scenario.gpu_policies {
        for node in &scenario.node_policies {
            let t = Instant::now();
            let run = run_policy(&nodes, &pods, gpu.policy, *node);
            let placing = t.elapsed().as_secs_f64();
            let report = policy_report(&run, &gpu.name, &pods, &scenario.workloads, &slices);
            println!(
                "{}/{}: placed {} unplaceable {} in {:.2} s ({:.0} pods/s), report {:.3} s; mem util {:.1}%, CU util {:.1}%, mem frag {:.1}%, CU frag {:.1}%",
                gpu.name,
                node_policy_name(*node),
                report.placed,
                report.unplaceable,
                placing,
                pods.len() as f64 / placing,
                t.elapsed().as_secs_f64() - placing,
                report.memory.utilization_pct,
                report.amd_cus.utilization_pct,
                report.memory.fragmentation_pct,
                report.amd_cus.fragmentation_pct,
            );
        }
    }
    let t = Instant::now();
    let out = run(&PlanArgs::for_scenario(path)).expect("plan runs");
    println!(
        "whole `hami plan` (4 policy pairs, table): {:.2} s\n\n{out}",
        t.elapsed().as_secs_f64()
    );
}
