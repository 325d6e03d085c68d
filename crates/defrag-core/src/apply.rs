//! A plan applied to a cluster snapshot, move by move, each one checked first: the pod is
//! still there, on the same cards, and its target still fits it by the scheduler's fit
//! once the previous moves are done (each target reserved in order). A move that fails a
//! check is skipped with the reason; nothing else is touched. The planner's properties
//! are tested through it, and a shell replays a stored plan through it against the live
//! snapshot before executing anything.

use hami_scheduler_core::fit::{FitRequest, fit_node};
use hami_scheduler_core::usage::DeviceCharge;
use serde::{Deserialize, Serialize};

use crate::input::{Cluster, by_card};
use crate::plan::{Move, Place, Plan};
use crate::work::{Work, fit_request, only_cards, placement_slots, slot_charges};

/// A move not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The move's index in the plan.
    pub index: usize,
    /// `namespace/name`.
    pub pod: String,
    /// Why.
    pub reason: String,
}

/// The cluster after every applicable move of `plan` (moved pods: new node and charges,
/// age 0, as the recreated pod is new), and the moves skipped.
pub fn apply(cluster: &Cluster, plan: &Plan) -> (Cluster, Vec<Skipped>) {
    let mut work = Work::new(cluster);
    let mut out = cluster.clone();
    let mut skipped = Vec::new();
    for (index, m) in plan.moves.iter().enumerate() {
        match apply_one(cluster, &mut work, m) {
            Ok(p) => {
                let pod = &mut out.pods[p];
                pod.node = m.to.node.clone();
                pod.charges = charges(&m.to);
                pod.safety.age_seconds = 0;
            }
            Err(reason) => skipped.push(Skipped {
                index,
                pod: m.pod.clone(),
                reason,
            }),
        }
    }
    out.nodes = work.nodes;
    (out, skipped)
}

fn charges(place: &Place) -> Vec<DeviceCharge> {
    place
        .cards
        .iter()
        .map(|c| DeviceCharge {
            uuid: c.card.clone(),
            slots: c.slots,
            mem_mib: c.mem_mib,
            cores: c.cores,
        })
        .collect()
}

/// Applies one move to `work`: the pod's index, or why not (work unchanged).
fn apply_one(cluster: &Cluster, work: &mut Work, m: &Move) -> Result<usize, String> {
    let p = cluster
        .pods
        .iter()
        .position(|pod| pod.uid == m.uid)
        .ok_or_else(|| format!("pod {} (uid {}) is gone", m.pod, m.uid))?;
    let pod = &cluster.pods[p];
    let from_node = work.index.get(&m.from.node).copied();
    let at = &work.at[p];
    if at.node.is_none() || at.node != from_node {
        return Err(format!(
            "pod {} is no longer on node {} (planned from there)",
            m.pod, m.from.node
        ));
    }
    let now = slot_charges(&work.nodes[at.node.unwrap_or_default()], &at.slots);
    if by_card(&now) != by_card(&charges(&m.from)) {
        return Err(format!(
            "pod {} holds other cards or amounts than planned on {}",
            m.pod, m.from.node
        ));
    }
    let to = *work
        .index
        .get(&m.to.node)
        .ok_or_else(|| format!("target node {} is gone", m.to.node))?;
    let node = &work.nodes[to];
    let cards: Result<Vec<usize>, String> =
        m.to.cards
            .iter()
            .map(|c| {
                node.devices
                    .gpus
                    .iter()
                    .position(|g| g.info.id == c.card)
                    .ok_or_else(|| format!("target card {}/{} is gone", m.to.node, c.card))
            })
            .collect();
    let cards = cards?;
    let before = work.at[p].clone();
    work.uncharge(p);
    let selectors = only_cards(&pod.request, &work.nodes[to], &cards);
    let req = FitRequest {
        selectors: &selectors,
        ..fit_request(&pod.request)
    };
    let fitted = fit_node(&work.nodes[to], &req)
        .map(|placement| placement_slots(&work.nodes[to], &pod.request.containers, &placement));
    let restore = |work: &mut Work| {
        if let Some(n) = before.node {
            work.charge(p, n, before.slots.clone());
        }
    };
    match fitted {
        Ok(slots) => {
            let planned = charges(&m.to);
            let fitted = slot_charges(&work.nodes[to], &slots);
            if by_card(&fitted) != by_card(&planned) {
                restore(work);
                return Err(format!(
                    "pod {} would now take other amounts on {} than planned",
                    m.pod, m.to.node
                ));
            }
            work.charge(p, to, slots);
            Ok(p)
        }
        Err(reason) => {
            restore(work);
            Err(format!(
                "pod {} no longer fits its target on {}: {reason}",
                m.pod, m.to.node
            ))
        }
    }
}
