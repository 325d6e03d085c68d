//! Each target's shortfall, and the card-emptying search shared by the card targets.
//!
//! Free whole cards, and every card free enough or full, are both reached by emptying
//! cards: a step takes one card, evicts every pod on it, and places each elsewhere by the
//! scheduler's fit (best fit: the fullest node that takes it, never a card the target
//! needs empty). A step is kept only if the shortfall strictly drops, else it is undone.
//! Cards are tried cheapest first (fewest pods, then least memory held); after each kept
//! step the order is recomputed and the pass starts again, until the target is reached, a
//! whole pass keeps no step, or the search budget is spent (a card whose pods exceed the
//! move limit is skipped). A pass that keeps no step is the fixed point: planning again
//! from the result tries the same cards on the same state and keeps no step either.

use hami_protocol::selection::DeviceSelector;
use hami_scheduler_core::snapshot::NodeSnapshot;

use crate::plan::{Constraint, Run, Target};
use crate::safety::protection;
use crate::shape::{Shape, free_percent, shape_fits};
use crate::work::{At, CardAt, Slot, Work};

/// The target's shortfall on `work`.
pub(crate) fn shortfall(target: &Target, work: &Work) -> u64 {
    match target {
        Target::FitPod { request, .. } => {
            u64::from(crate::fit_pod::fits_on(request, work).is_none())
        }
        Target::FreeWholeCards { device_type, count } => {
            let idle = cards_of_type(work, device_type)
                .filter(|c| idle(work, *c))
                .count();
            count.saturating_sub(idle) as u64
        }
        Target::MinFreeOrFull { percent } => all_cards(work)
            .filter(|&(n, g)| violates(&work.nodes[n], g, *percent))
            .count() as u64,
    }
}

/// For a pending pod that fits, the node it fits.
pub(crate) fn fits_on(target: &Target, work: &Work) -> Option<String> {
    match target {
        Target::FitPod { request, .. } => {
            crate::fit_pod::fits_on(request, work).map(|n| work.nodes[n].devices.name.clone())
        }
        _ => None,
    }
}

/// Searches moves towards `target`; for a pending pod, the node it then fits.
pub(crate) fn reach(target: &Target, work: &mut Work, run: &mut Run<'_>) -> Option<String> {
    match target {
        Target::FitPod { pod, request } => crate::fit_pod::reach(pod, request, work, run),
        Target::FreeWholeCards { device_type, count } => {
            let exist = cards_of_type(work, device_type)
                .filter(|&(n, g)| work.nodes[n].devices.gpus[g].info.health)
                .count();
            if exist < *count {
                run.block(
                    format!("cards of type {device_type}"),
                    Constraint::NotEnoughCards { exist },
                );
            }
            empty_cards(target, work, run);
            None
        }
        Target::MinFreeOrFull { .. } => {
            empty_cards(target, work, run);
            None
        }
    }
}

fn all_cards(work: &Work) -> impl Iterator<Item = CardAt> + '_ {
    work.nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| (0..node.devices.gpus.len()).map(move |g| (n, g)))
}

fn cards_of_type<'a>(work: &'a Work, device_type: &'a str) -> impl Iterator<Item = CardAt> + 'a {
    let selector = DeviceSelector {
        use_types: vec![device_type.to_owned()],
        ..DeviceSelector::default()
    };
    all_cards(work).filter(move |&(n, g)| {
        selector.type_allowed(&work.nodes[n].devices.gpus[g].info.device_type)
    })
}

/// Nothing taken on a healthy card nobody holds whole.
fn idle(work: &Work, (n, g): CardAt) -> bool {
    let node = &work.nodes[n];
    node.devices.gpus[g].info.health && !node.held_whole[g] && node.usage[g] == Default::default()
}

/// A healthy card, not held whole, where a 1/8 slice still fits but less than `percent` %
/// is free.
fn violates(node: &NodeSnapshot, g: usize, percent: u64) -> bool {
    let gpu = &node.devices.gpus[g];
    gpu.info.health
        && !node.held_whole[g]
        && free_percent(gpu, &node.usage[g]) < percent
        && shape_fits(node, g, Shape::Eighth)
}

/// Whether `target` allows a moved pod to land where `slots` put it on `node`.
fn lands_well(target: &Target, work: &Work, node: usize, slots: &[Slot]) -> bool {
    let Target::MinFreeOrFull { percent } = target else {
        return true;
    };
    // The card after the pod lands must not miss the target (unless it already did).
    let mut after = work.nodes[node].clone();
    for s in slots {
        let u = &mut after.usage[s.gpu];
        u.used += s.slots;
        u.mem_mib += s.mem;
        u.cores += s.cores;
    }
    let now = &work.nodes[node];
    slots
        .iter()
        .all(|s| !violates(&after, s.gpu, *percent) || violates(now, s.gpu, *percent))
}

/// Cards the target needs to stay as they are: for whole cards, the idle ones of the type.
fn fence(target: &Target, work: &Work) -> Vec<CardAt> {
    match target {
        Target::FreeWholeCards { device_type, .. } => cards_of_type(work, device_type)
            .filter(|c| idle(work, *c))
            .collect(),
        _ => Vec::new(),
    }
}

/// The cards worth emptying, cheapest first.
fn candidates(target: &Target, work: &Work) -> Vec<CardAt> {
    let mut cards: Vec<CardAt> = match target {
        Target::FreeWholeCards { device_type, .. } => cards_of_type(work, device_type)
            .filter(|&(n, g)| {
                let node = &work.nodes[n];
                node.devices.gpus[g].info.health && !idle(work, (n, g))
            })
            .collect(),
        Target::MinFreeOrFull { percent } => all_cards(work)
            .filter(|&(n, g)| violates(&work.nodes[n], g, *percent))
            .collect(),
        Target::FitPod { .. } => Vec::new(),
    };
    let key = |c: &CardAt| {
        (
            work.pods_on_card(*c).len(),
            work.nodes[c.0].usage[c.1].mem_mib,
        )
    };
    cards.sort_by_key(|c| (key(c), *c));
    cards
}

fn card_name(work: &Work, (n, g): CardAt) -> String {
    let node = &work.nodes[n];
    format!("{}/{}", node.devices.name, node.devices.gpus[g].info.id)
}

/// The card-emptying search (module docs).
fn empty_cards(target: &Target, work: &mut Work, run: &mut Run<'_>) {
    let mut short = shortfall(target, work);
    // After each step the order is recomputed: the step changed which cards are cheapest.
    'pass: while short > 0 {
        for card in candidates(target, work) {
            if !run.spend() {
                return;
            }
            if let Some(after) = try_empty(target, work, run, card, short) {
                short = after;
                continue 'pass;
            }
        }
        return;
    }
}

/// Empties one card if that lowers the shortfall: the new shortfall, or `None` with the
/// work unchanged and the reason recorded.
fn try_empty(
    target: &Target,
    work: &mut Work,
    run: &mut Run<'_>,
    card: CardAt,
    short: u64,
) -> Option<u64> {
    let still = match target {
        Target::FreeWholeCards { .. } => !idle(work, card),
        Target::MinFreeOrFull { percent } => violates(&work.nodes[card.0], card.1, *percent),
        Target::FitPod { .. } => false,
    };
    if !still {
        return None;
    }
    let at = card_name(work, card);
    let pods = work.pods_on_card(card);
    let u = work.nodes[card.0].usage[card.1];
    let known = pods.iter().fold((0u64, 0u32), |(m, s), p| {
        let slot = work.at[*p].slots.iter().find(|s| s.gpu == card.1);
        slot.map_or((m, s), |sl| (m + sl.mem, s + sl.slots))
    });
    if pods.is_empty()
        || work.nodes[card.0].held_whole[card.1]
        || known.0 < u.mem_mib
        || known.1 < u.used
    {
        run.block(at, Constraint::UnknownHolders);
        return None;
    }
    for &p in &pods {
        if let Some(protection) = protection(&run.cluster.pods[p].safety, run.policy) {
            let pod = run.cluster.pods[p].shown();
            run.block(at, Constraint::Protected { pod, protection });
            return None;
        }
    }
    if run.moves.len() + pods.len() > run.policy.max_moves {
        let max_moves = run.policy.max_moves;
        run.block(at, Constraint::MoveLimit { max_moves });
        return None;
    }
    let mut fenced = fence(target, work);
    fenced.push(card);
    let before: Vec<At> = pods.iter().map(|p| work.at[*p].clone()).collect();
    for &p in &pods {
        work.uncharge(p);
    }
    let request_of = |p: usize| &run.cluster.pods[p].request;
    let accept = |w: &Work, n: usize, s: &[Slot]| lands_well(target, w, n, s);
    for &p in &pods {
        match work.place(request_of(p), &|_| false, &fenced, &accept, 4) {
            Some((n, slots)) => work.charge(p, n, slots),
            None => {
                undo(work, &pods, &before);
                let pod = run.cluster.pods[p].shown();
                run.block(at, Constraint::NoRoomElsewhere { pod });
                return None;
            }
        }
    }
    let after = shortfall(target, work);
    if after >= short {
        undo(work, &pods, &before);
        run.block(at, Constraint::NoImprovement);
        return None;
    }
    let why = match target {
        Target::FreeWholeCards { .. } => format!("empties card {at}"),
        _ => format!("empties card {at}, below the free target"),
    };
    for (i, &p) in pods.iter().enumerate() {
        run.record(work, p, &before[i], &why);
    }
    run.close_step(
        format!("card {at} emptied: shortfall {short} -> {after}"),
        after,
    );
    Some(after)
}

/// Puts `pods` back where `before` had them.
fn undo(work: &mut Work, pods: &[usize], before: &[At]) {
    for (i, &p) in pods.iter().enumerate() {
        if let Some(n) = before[i].node {
            work.charge(p, n, before[i].slots.clone());
        }
    }
}
