//! Each target's shortfall, and the card-emptying search shared by the card targets.
//!
//! Free whole cards, and every card free enough or full, are both reached by emptying
//! cards: a step takes one card, evicts every pod on it, and places each elsewhere by the
//! scheduler's fit (best fit: the fullest node that takes it, never a card the target
//! needs empty). A step is kept only if the shortfall strictly drops, else it is undone.
//! Cards are tried cheapest first (fewest pods, then least memory held), pass after pass
//! (a card an earlier step of the pass changed waits for the next pass, re-ordered), until
//! the target is reached, a whole pass keeps no step, or the search budget is spent (a
//! card whose pods exceed the move limit is skipped). A pass that keeps no step is the
//! fixed point: planning again from the result tries the same cards on the same state and
//! keeps no step either.

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

/// The cards a card target counts, and which of them count now (idle ones for whole
/// cards, ones missing the percentage for the other), kept up to date after each step
/// over the cards the step touched only: a fleet has thousands of cards, a step a few.
struct Scope {
    cards: Vec<CardAt>,
    /// Same order: counts now.
    flag: Vec<bool>,
    /// Per node, the index in `cards` of its first GPU, if its cards are in scope.
    at: Vec<Vec<Option<usize>>>,
    /// Cards flagged.
    total: u64,
}

impl Scope {
    fn new(target: &Target, work: &Work) -> Self {
        let cards: Vec<CardAt> = match target {
            Target::FreeWholeCards { device_type, .. } => {
                cards_of_type(work, device_type).collect()
            }
            _ => all_cards(work).collect(),
        };
        let mut at: Vec<Vec<Option<usize>>> = work
            .nodes
            .iter()
            .map(|n| vec![None; n.devices.gpus.len()])
            .collect();
        for (i, &(n, g)) in cards.iter().enumerate() {
            at[n][g] = Some(i);
        }
        let flag: Vec<bool> = cards.iter().map(|c| counts(target, work, *c)).collect();
        let total = flag.iter().filter(|f| **f).count() as u64;
        Self {
            cards,
            flag,
            at,
            total,
        }
    }

    fn shortfall(&self, target: &Target) -> u64 {
        match target {
            Target::FreeWholeCards { count, .. } => (*count as u64).saturating_sub(self.total),
            _ => self.total,
        }
    }

    /// Re-reads `touched` after a change.
    fn update(&mut self, target: &Target, work: &Work, touched: &[CardAt]) {
        for &(n, g) in touched {
            if let Some(i) = self.at[n][g] {
                let now = counts(target, work, (n, g));
                if now != self.flag[i] {
                    self.flag[i] = now;
                    if now {
                        self.total += 1;
                    } else {
                        self.total -= 1;
                    }
                }
            }
        }
    }

    /// Cards the target needs to stay as they are: for whole cards, the idle ones.
    fn fence(&self, target: &Target) -> Vec<CardAt> {
        match target {
            Target::FreeWholeCards { .. } => self
                .cards
                .iter()
                .zip(&self.flag)
                .filter(|(_, f)| **f)
                .map(|(c, _)| *c)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether card `i` of the scope is worth emptying now: for whole cards, a healthy
    /// one not idle yet; for the percentage, one that misses it.
    fn wanted(&self, target: &Target, work: &Work, i: usize) -> bool {
        match target {
            Target::FreeWholeCards { .. } => {
                let (n, g) = self.cards[i];
                !self.flag[i] && work.nodes[n].devices.gpus[g].info.health
            }
            _ => self.flag[i],
        }
    }

    /// The cards worth emptying with their cost ([`cost`]), cheapest first.
    fn candidates(&self, target: &Target, work: &Work) -> Vec<(CardAt, (usize, u64))> {
        let mut pods_on: Vec<Vec<usize>> = work
            .nodes
            .iter()
            .map(|n| vec![0; n.devices.gpus.len()])
            .collect();
        for at in &work.at {
            if let Some(n) = at.node {
                for s in &at.slots {
                    pods_on[n][s.gpu] += 1;
                }
            }
        }
        let mut cards: Vec<(CardAt, (usize, u64))> = (0..self.cards.len())
            .filter(|i| self.wanted(target, work, *i))
            .map(|i| {
                let (n, g) = self.cards[i];
                ((n, g), (pods_on[n][g], work.nodes[n].usage[g].mem_mib))
            })
            .collect();
        cards.sort_by_key(|&(card, cost)| (cost, card));
        cards
    }
}

/// What emptying a card costs: its pods, then the memory they hold.
fn cost(work: &Work, (n, g): CardAt) -> (usize, u64) {
    (
        work.pods_on_card((n, g)).len(),
        work.nodes[n].usage[g].mem_mib,
    )
}

/// Whether card `c` counts towards a card target now.
fn counts(target: &Target, work: &Work, (n, g): CardAt) -> bool {
    match target {
        Target::MinFreeOrFull { percent } => violates(&work.nodes[n], g, *percent),
        _ => idle(work, (n, g)),
    }
}

fn card_name(work: &Work, (n, g): CardAt) -> String {
    let node = &work.nodes[n];
    format!("{}/{}", node.devices.name, node.devices.gpus[g].info.id)
}

/// The card-emptying search (module docs).
fn empty_cards(target: &Target, work: &mut Work, run: &mut Run<'_>) {
    let mut scope = Scope::new(target, work);
    while scope.shortfall(target) > 0 {
        let mut progress = false;
        for (card, was) in scope.candidates(target, work) {
            if scope.shortfall(target) == 0 {
                return;
            }
            // A card an earlier step of this pass changed waits for the next pass, in its
            // new place in the order (it may have become dearer).
            let i = scope.at[card.0][card.1].unwrap_or_default();
            if cost(work, card) != was || !scope.wanted(target, work, i) {
                continue;
            }
            if !run.spend() {
                return;
            }
            progress |= try_empty(target, work, run, card, &mut scope);
        }
        if !progress {
            return;
        }
    }
}

/// Empties one card if that lowers the shortfall (true), or leaves the work unchanged
/// and records why (false).
fn try_empty(
    target: &Target,
    work: &mut Work,
    run: &mut Run<'_>,
    card: CardAt,
    scope: &mut Scope,
) -> bool {
    let short = scope.shortfall(target);
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
        return false;
    }
    for &p in &pods {
        if let Some(protection) = protection(&run.cluster.pods[p].safety, run.policy) {
            let pod = run.cluster.pods[p].shown();
            run.block(at, Constraint::Protected { pod, protection });
            return false;
        }
    }
    if run.moves.len() + pods.len() > run.policy.max_moves {
        let max_moves = run.policy.max_moves;
        run.block(at, Constraint::MoveLimit { max_moves });
        return false;
    }
    let mut fenced = scope.fence(target);
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
                return false;
            }
        }
    }
    let mut touched: Vec<CardAt> = Vec::new();
    for (i, &p) in pods.iter().enumerate() {
        let now = &work.at[p];
        for place in [&before[i], now] {
            if let Some(n) = place.node {
                touched.extend(place.slots.iter().map(|s| (n, s.gpu)));
            }
        }
    }
    touched.sort_unstable();
    touched.dedup();
    scope.update(target, work, &touched);
    let after = scope.shortfall(target);
    if after >= short {
        undo(work, &pods, &before);
        scope.update(target, work, &touched);
        run.block(at, Constraint::NoImprovement);
        return false;
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
    true
}

/// Puts `pods` back where `before` had them.
fn undo(work: &mut Work, pods: &[usize], before: &[At]) {
    for (i, &p) in pods.iter().enumerate() {
        if let Some(n) = before[i].node {
            work.charge(p, n, before[i].slots.clone());
        }
    }
}
