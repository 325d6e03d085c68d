//! The planner's properties over random small fleets of real card shapes, pods placed by
//! the scheduler's fit, and random targets.

use hami_defrag_core::{
    Constraint, Policy, Safety, Target, apply, measure, plan, protection, table::render_plan,
};
use hami_protocol::names::Vendor;
use proptest::prelude::*;
use serde_json::json;

use crate::fixtures::{A100, Fleet, MI210, MI300X, MI300X_CPX, Model, movable, request, slice};

const MODELS: [Model; 4] = [MI210, MI300X, A100, MI300X_CPX];

/// (node, card, eighths of the card 1..=4, memory-only, protection variant).
type PodSpec = (usize, usize, u64, bool, u8);

fn safety(variant: u8) -> Safety {
    let mut s = movable();
    match variant {
        0 => s.pdb = None,
        1 => s.age_seconds = 5,
        2 => s.gang_member = true,
        3 => s.owner.as_mut().unwrap().replicas = 1,
        _ => {}
    }
    s
}

/// Nodes of one model each; one pod on every card first (a fragmented fleet: no card
/// idle), then `pods`.
fn fleet(nodes: &[Vec<usize>], pods: &[PodSpec]) -> Fleet {
    let mut f = Fleet::new();
    for (n, cards) in nodes.iter().enumerate() {
        let models: Vec<Model> = cards.iter().map(|m| MODELS[*m]).collect();
        f.node(&format!("n{n}"), &models);
    }
    let every_card = nodes
        .iter()
        .enumerate()
        .flat_map(|(n, cards)| (0..cards.len()).map(move |c| (n, c)))
        .zip(pods.iter().cycle())
        .map(|((n, c), &(_, _, eighths, mem_only, variant))| (n, c, eighths, mem_only, variant));
    let all: Vec<PodSpec> = every_card.chain(pods.iter().copied()).collect();
    for (i, &(n, c, eighths, mem_only, variant)) in all.iter().enumerate() {
        let n = n % nodes.len();
        let c = c % nodes[n].len();
        let model = MODELS[nodes[n][c]];
        let mem = model.devmem * eighths / 8;
        let req = if mem_only && model.vendor == Vendor::Amd {
            request(json!({"amd.com/gpumem": mem.to_string()}))
        } else {
            slice(model.vendor, mem, u32::try_from(eighths * 100 / 8).unwrap())
        };
        // A pod that does not fit its card is simply not there.
        f.place(
            &format!("p{i}"),
            &format!("n{n}"),
            &format!("n{n}-{c}"),
            req,
            safety(variant),
        );
    }
    f
}

/// A target over the fleet's own card models: (kind, eighths or count or percent, node
/// whose first card's model the target names).
fn target(nodes: &[Vec<usize>], (kind, amount, node): (u8, u64, usize)) -> Target {
    let model = MODELS[nodes[node % nodes.len()][0]];
    match kind {
        0 => Target::FitPod {
            pod: "ns/pending".into(),
            request: Box::new(slice(
                model.vendor,
                model.devmem * (amount + 4) / 8,
                u32::try_from((amount + 4) * 100 / 8).unwrap(),
            )),
        },
        1 => Target::FreeWholeCards {
            device_type: model.device_type.into(),
            count: usize::try_from(amount % 3 + 1).unwrap(),
        },
        _ => Target::MinFreeOrFull {
            percent: [25, 50, 75][usize::try_from(amount % 3).unwrap()],
        },
    }
}

fn arb_target() -> impl Strategy<Value = (u8, u64, usize)> {
    (0u8..3, 1u64..=4, 0usize..5)
}

fn arb_fleet() -> impl Strategy<Value = (Vec<Vec<usize>>, Vec<PodSpec>)> {
    (
        proptest::collection::vec((0usize..4, 2usize..5).prop_map(|(m, n)| vec![m; n]), 2..5),
        proptest::collection::vec(
            (
                0usize..5,
                0usize..4,
                prop_oneof![3 => 1u64..=2, 1 => 3u64..=4],
                proptest::bool::weighted(0.1),
                prop_oneof![8 => Just(9u8), 1 => 0u8..4],
            ),
            1..10,
        ),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Applying the plan: every move applies in order (its target fits by the scheduler's
    /// fit once the previous moves are done), the shortfall strictly drops when anything
    /// moves and ends where the plan says, no protected pod moves, a target missed names
    /// its blockers, and planning again from the result finds no move.
    #[test]
    fn a_plan_applies_improves_and_is_a_fixed_point((nodes, pods) in arb_fleet(), spec in arb_target()) {
        let f = fleet(&nodes, &pods);
        let target = target(&nodes, spec);
        let policy = Policy { max_moves: 64, search_budget: 5_000, ..Policy::default() };
        let p = plan(&f.cluster, &target, &policy).unwrap();
        let shown = render_plan(&p);
        prop_assert_eq!(p.shortfall_before, target.shortfall(&f.cluster));
        let (after, skipped) = apply(&f.cluster, &p);
        prop_assert!(skipped.is_empty(), "{:?}\n{}", skipped, shown);
        let now = target.shortfall(&after);
        prop_assert_eq!(now, p.shortfall_after, "{}", shown);
        if !p.moves.is_empty() {
            prop_assert!(now < p.shortfall_before, "{}", shown);
        }
        prop_assert_eq!(p.reached, now == 0);
        prop_assert!(p.reached || !p.blocked.is_empty(), "{}", shown);
        for m in &p.moves {
            let pod = f.cluster.pods.iter().find(|q| q.uid == m.uid).unwrap();
            prop_assert_eq!(protection(&pod.safety, &policy), None);
            prop_assert!(m.from != m.to, "a move that moves nothing: {:?}", m);
        }
        let cut_short = p.blocked.iter().any(|b| matches!(b.constraint, Constraint::SearchBudget { .. }));
        if !cut_short {
            let again = plan(&after, &target, &policy).unwrap();
            prop_assert!(again.moves.is_empty(), "{}\nthen\n{}", shown, render_plan(&again));
        }
    }

    /// Measurements stay within what is free, whatever the fleet.
    #[test]
    fn measurements_are_bounded_by_what_is_free((nodes, pods) in arb_fleet()) {
        let f = fleet(&nodes, &pods);
        let fleet = measure(&f.cluster.nodes);
        for node in &fleet.nodes {
            for c in &node.cards {
                prop_assert!(c.free_mib <= c.total_mib && c.free_cores <= c.total_cores);
                prop_assert!(c.placeable_mib <= c.free_mib && c.stranded_mib <= c.free_mib);
                prop_assert!(c.stranded_cores <= c.free_cores);
                prop_assert!((0.0..=1.0).contains(&c.fragmentation));
                // A slice that fits is placeable; stranded memory is never placeable.
                prop_assert_eq!(c.largest.is_some(), c.placeable_mib > 0);
                prop_assert!(c.stranded_mib == 0 || c.placeable_mib == 0);
            }
            prop_assert!(node.totals.placeable_mib <= node.totals.free_mib);
        }
        prop_assert_eq!(fleet.amd.cards + fleet.nvidia.cards, nodes.iter().map(Vec::len).sum::<usize>());
    }
}
