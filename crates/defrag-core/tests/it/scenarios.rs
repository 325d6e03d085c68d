//! The planner's properties over recorded snapshots: the example scenarios and the demo's
//! cluster, their pods placed by the what-if planner (the scheduler's filter) under each
//! policy pair; every target kind planned, applied and planned again.

use std::collections::BTreeSet;

use hami_defrag_core::{Cluster, Constraint, Plan, Policy, Target, apply, measure, plan};
use hami_planner::engine::{PlannedPod, expand_workloads};

use k8s_openapi::api::core::v1::Node;

use crate::planned::{
    PAIRS, Placed, demo_nodes, demo_scenario, load, nodes_of, place_pods, scenario_files, shuffled,
};

/// Plans `target`, then checks the plan's properties: it applies move by move in order
/// (every target fits by the scheduler's fit once the earlier moves are done), each step
/// strictly lowers the shortfall to what the step says, it ends where the plan says, a
/// target missed names what blocks it, and planning again after applying finds no move
/// (unless the policy's move limit or search budget cut the plan short: then the next
/// plan goes on from there).
pub(crate) fn check(cluster: &Cluster, target: &Target, policy: &Policy, at: &str) -> Plan {
    let p = plan(cluster, target, policy).unwrap_or_else(|e| panic!("{at}: {e:?}"));
    let at = format!(
        "{at}: {}\n{}",
        target.describe(),
        hami_defrag_core::table::render_plan(&p)
    );
    assert_eq!(p.shortfall_before, target.shortfall(cluster), "{at}");
    // Step by step, each applied on what the earlier ones left.
    let (mut before, mut now_cluster) = (p.shortfall_before, cluster.clone());
    let steps: BTreeSet<usize> = p.moves.iter().map(|m| m.step).collect();
    for step in steps {
        let mut one = p.clone();
        one.moves.retain(|m| m.step == step);
        let (after, skipped) = apply(&now_cluster, &one);
        assert!(skipped.is_empty(), "{at}\nstep {step}: {skipped:?}");
        let now = target.shortfall(&after);
        assert_eq!(
            Some(now),
            one.moves.last().map(|m| m.shortfall_after),
            "{at}"
        );
        assert!(now < before, "{at}\nstep {step} does not improve");
        (before, now_cluster) = (now, after);
    }
    let (after, skipped) = apply(cluster, &p);
    assert!(skipped.is_empty(), "{at}\n{skipped:?}");
    let now = target.shortfall(&after);
    assert_eq!(now, p.shortfall_after, "{at}");
    assert_eq!(p.reached, now == 0, "{at}");
    assert!(p.reached || !p.blocked.is_empty(), "{at}");
    let cut_short = p.blocked.iter().any(|b| {
        matches!(
            b.constraint,
            Constraint::SearchBudget { .. } | Constraint::MoveLimit { .. }
        )
    });
    if !cut_short {
        let again = plan(&after, target, policy).unwrap();
        assert!(again.moves.is_empty(), "{at}\nthen\n{again:?}");
    }
    p
}

/// Every target kind over one placed cluster: each pending pod, one more idle card of
/// each card type than there is (and two more), and every card 25, 50 or 75 % free or full.
pub(crate) fn targets(placed: &Placed) -> Vec<Target> {
    let mut out: Vec<Target> = placed
        .pending
        .iter()
        .map(|(pod, request)| Target::FitPod {
            pod: pod.clone(),
            request: Box::new(request.clone()),
        })
        .collect();
    let fleet = measure(&placed.cluster.nodes);
    let mut idle: std::collections::BTreeMap<String, usize> = Default::default();
    for c in fleet.nodes.iter().flat_map(|n| &n.cards) {
        *idle.entry(c.device_type.clone()).or_default() +=
            usize::from(c.free_mib == c.total_mib && c.free_cores == c.total_cores);
    }
    for (device_type, idle) in idle {
        for more in 1..=2 {
            out.push(Target::FreeWholeCards {
                device_type: device_type.clone(),
                count: idle + more,
            });
        }
    }
    out.extend([25, 50, 75].map(|percent| Target::MinFreeOrFull { percent }));
    out
}

/// Plans every target over every policy pair of `pods` placed on `nodes`; the plans made.
fn check_pods(nodes: &[Node], pods: &[PlannedPod], name: &str) -> Vec<Plan> {
    let policy = Policy::default();
    let mut plans = Vec::new();
    for (gpu, node) in PAIRS {
        let placed = place_pods(nodes, pods, gpu, node);
        assert!(!placed.cluster.pods.is_empty(), "{name}: nothing placed");
        for target in targets(&placed) {
            let at = format!("{name} ({gpu:?}, {node:?})");
            plans.push(check(&placed.cluster, &target, &policy, &at));
        }
    }
    plans
}

#[test]
fn plans_over_the_example_scenarios_apply_improve_and_are_fixed_points() {
    let files = scenario_files(1_000);
    assert!(files.len() >= 2, "{files:?}");
    let mut moved = 0;
    for file in &files {
        let scenario = load(file);
        let nodes = nodes_of(&scenario);
        let pods = expand_workloads(&scenario.workloads);
        // In file order, and interleaved as after churn.
        for (pods, order) in [(pods.clone(), "file order"), (shuffled(pods), "shuffled")] {
            let plans = check_pods(&nodes, &pods, &format!("{file}, {order}"));
            moved += plans.iter().filter(|p| !p.moves.is_empty()).count();
        }
    }
    // Spread leaves slices on every card: some target must take moves, or the
    // properties above were checked on empty plans only.
    assert!(moved > 0);
}

#[test]
fn plans_over_the_demo_cluster_apply_improve_and_are_fixed_points() {
    let pods = expand_workloads(&demo_scenario().workloads);
    let plans = check_pods(&demo_nodes(), &pods, "demo");
    // The demo's cannot-fit pod (256 GiB on one card) is pending and no move helps it:
    // its plan says why instead.
    let cannot_fit: Vec<&Plan> = plans
        .iter()
        .filter(|p| p.target.contains("cannot-fit"))
        .collect();
    assert_eq!(cannot_fit.len(), PAIRS.len());
    assert!(
        cannot_fit
            .iter()
            .all(|p| !p.reached && p.moves.is_empty() && !p.blocked.is_empty()),
        "{cannot_fit:?}"
    );
    assert!(plans.iter().any(|p| !p.moves.is_empty()));
}
