//! Priority preemption in a plan (issue 30 item 4), pure: when a pod fits nowhere and
//! lower-priority pods hold slices, which of them the cluster would evict for it and where.
//!
//! The victims per node are the preempt verb's own decision
//! (`hami_scheduler_core::preemption::decide_preemption`, D-24) asked as Kubernetes ≥ 1.38
//! asks it: every node the pod failed on (not those Filter called unresolvable) with an
//! empty victim list to fill. Between the nodes kept, the node is picked as kube-scheduler's
//! `pickOneNodeForPreemption` picks: fewest PDB violations (a scenario has no PDBs), lowest
//! highest-victim priority, smallest priority sum, fewest victims, then the latest start of
//! the earliest-started highest-priority victim (start = placement order in the plan), then
//! the node name, so a plan is the same on every run.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use hami_scheduler_core::extender::FilterConfig;
use hami_scheduler_core::preemption::{
    NodeCandidate, PodFacts, Preemptor, barred, decide_preemption, priority,
};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::engine::PlannedPod;

/// One preemption: `pod` evicted `victims` on `node` and was placed there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preemption {
    /// The preemptor, `namespace/name`.
    pub pod: String,
    /// The node it took.
    pub node: String,
    /// Its priority.
    pub priority: i32,
    /// The pods evicted, in the order they were asked to re-place.
    pub victims: Vec<Eviction>,
}

/// A pod evicted by a preemption and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Eviction {
    /// `namespace/name`.
    pub pod: String,
    /// Its priority.
    pub priority: i32,
    /// The node it was placed on again, if any fitted; `None`: unplaceable after preemption.
    pub replaced_on: Option<String>,
}

/// What the plan knows of the pods holding slices: when each was placed (kube-scheduler's
/// last tie-break between nodes is the victims' start time) and how many hold each
/// priority (so a plan without priorities never looks for victims).
#[derive(Debug, Default)]
pub struct Ledger {
    /// uid → (index into the planned pods, placement sequence number).
    placed: HashMap<String, (usize, u64)>,
    /// priority → pods placed with it.
    priorities: BTreeMap<i32, usize>,
    next: u64,
}

impl Ledger {
    /// Records pod `index` (uid `uid`, priority `priority`) as placed now.
    pub fn place(&mut self, uid: &str, index: usize, priority: i32) {
        if self.placed.contains_key(uid) {
            return;
        }
        self.placed.insert(uid.to_owned(), (index, self.next));
        self.next += 1;
        *self.priorities.entry(priority).or_default() += 1;
    }

    /// Records the pod as no longer placed.
    pub fn evict(&mut self, uid: &str, priority: i32) {
        if self.placed.remove(uid).is_some()
            && let Some(n) = self.priorities.get_mut(&priority)
        {
            *n -= 1;
            if *n == 0 {
                self.priorities.remove(&priority);
            }
        }
    }

    /// Whether any placed pod has a priority below `priority` (else preemption cannot help).
    pub fn any_below(&self, priority: i32) -> bool {
        self.priorities
            .keys()
            .next()
            .is_some_and(|lowest| *lowest < priority)
    }

    /// Index into the planned pods and placement sequence of a placed pod.
    pub fn get(&self, uid: &str) -> Option<(usize, u64)> {
        self.placed.get(uid).copied()
    }
}

/// The node and victims (uids) that make room for `pod`, which failed Filter on
/// `candidates`; `None` when no eviction of lower-priority slices makes it fit.
pub fn choose(
    state: &ClusterState,
    pods: &[PlannedPod],
    ledger: &Ledger,
    pod: &Pod,
    candidates: &[String],
    config: &FilterConfig,
) -> Option<(String, Vec<String>)> {
    // Asked first: a plan without priorities pays nothing for preemption.
    if !ledger.any_below(priority(pod)) {
        return None;
    }
    let preemptor =
        Preemptor::from_pod(pod, &config.defaults, config.gpu_policy, config.node_policy).ok()?;
    // Per candidate node, its slices' pods in placement order (the state keeps them in a
    // hash set; the victim search breaks ties by this order). Nodes where nothing may be
    // evicted are left out: the verb would only veto them.
    let mut facts: BTreeMap<&str, Vec<PodFacts>> = BTreeMap::new();
    for node in candidates {
        let mut here: Vec<(u64, PodFacts)> = state
            .holdings_on(node)
            .filter_map(|(uid, holding)| {
                let (index, seq) = ledger.get(uid)?;
                Some((
                    seq,
                    PodFacts::from_pod(&pods[index].pod, holding.charges.clone()),
                ))
            })
            .collect();
        if here.iter().all(|(_, f)| barred(&preemptor, f).is_some()) {
            continue;
        }
        here.sort_by_key(|(seq, _)| *seq);
        facts.insert(node, here.into_iter().map(|(_, f)| f).collect());
    }
    let proposals: BTreeMap<String, Vec<String>> = facts
        .keys()
        .map(|n| ((*n).to_owned(), Vec::new()))
        .collect();
    let decision = decide_preemption(
        &preemptor,
        &proposals,
        |name| {
            Some(NodeCandidate {
                snapshot: state.node(name)?,
                pods: facts.get(name)?,
            })
        },
        &[],
    );
    // kube-scheduler's order between nodes; the smallest key wins.
    type Key = (i64, i32, i64, usize, Reverse<u64>);
    let mut best: Option<(Key, &String, Vec<String>)> = None;
    for (node, victims) in &decision.result.node_name_to_meta_victims {
        let uids: Vec<String> = victims
            .pods
            .iter()
            .flatten()
            .map(|p| p.uid.clone())
            .collect();
        let of = |uid: &String| {
            let (index, seq) = ledger.get(uid)?;
            Some((priority(&pods[index].pod), seq))
        };
        let Some(known) = uids.iter().map(of).collect::<Option<Vec<_>>>() else {
            continue;
        };
        let top = known.iter().map(|k| k.0).max().unwrap_or(i32::MIN);
        let sum = known.iter().map(|k| i64::from(k.0)).sum();
        let earliest_top = known
            .iter()
            .filter(|k| k.0 == top)
            .map(|k| k.1)
            .min()
            .unwrap_or(0);
        let key = (
            victims.num_pdb_violations,
            top,
            sum,
            uids.len(),
            Reverse(earliest_top),
        );
        // Nodes come in name order, so a tie keeps the first name.
        if best.as_ref().is_none_or(|(k, ..)| key < *k) {
            best = Some((key, node, uids));
        }
    }
    best.map(|(_, node, uids)| (node.clone(), uids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_counts_priorities_and_placement_order() {
        let mut l = Ledger::default();
        assert!(!l.any_below(i32::MAX), "nothing placed: nothing to preempt");
        l.place("a", 0, 5);
        l.place("b", 1, 5);
        l.place("a", 0, 5); // placed twice without an eviction: counted once
        assert!(l.any_below(6) && !l.any_below(5));
        assert_eq!((l.get("a"), l.get("b")), (Some((0, 0)), Some((1, 1))));
        l.evict("a", 5);
        l.evict("a", 5); // evicted twice: the count does not go below what is placed
        assert!(l.any_below(6));
        l.evict("b", 5);
        assert!(!l.any_below(i32::MAX) && l.get("b").is_none());
        // Placed again: a new start, later than any before.
        l.place("a", 0, 5);
        assert_eq!(l.get("a"), Some((0, 2)));
    }
}
