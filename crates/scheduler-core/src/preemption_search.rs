//! The victim search of the preempt verb: the fewest, lowest-priority pods holding slices
//! on the GPUs the preemptor would take whose eviction makes it fit by Filter's rule.
//!
//! Filter's fit only gets easier as usage drops (every check compares usage with a
//! capacity), so "fits with these evicted" is monotone in the set evicted: a prefix of a
//! fixed order is found by bisection, and one reprieve pass leaves a minimal set.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::{NodeCandidate, PdbFacts, PodFacts, Preemptor, Veto, barred, fits};
use crate::snapshot::NodeSnapshot;

/// One eligible pod's charges resolved to GPU indices of the node.
struct Eligible<'a> {
    pod: &'a PodFacts,
    /// `(gpu index, slots, MiB, cores)`.
    charges: Vec<(usize, u32, u64, u64)>,
    /// Covered by a PDB that allows no disruption: evicted only when nothing else helps.
    risky: bool,
}

/// How good a victim set is, smaller first: PDB risks, highest priority, count, sum of
/// priorities (kube-scheduler's order of preference between nodes), then the MiB and
/// cores evicted (the least work lost).
type Cost = (usize, i32, usize, i64, u64, u64);

fn cost(set: &[usize], pool: &[Eligible<'_>]) -> Cost {
    let risky = set.iter().filter(|i| pool[**i].risky).count();
    let top = set
        .iter()
        .map(|i| pool[*i].pod.priority)
        .max()
        .unwrap_or(i32::MIN);
    let sum = set.iter().map(|i| i64::from(pool[*i].pod.priority)).sum();
    let charges = || set.iter().flat_map(|i| &pool[*i].charges);
    let mem = charges().map(|c| c.2).sum();
    let cores = charges().map(|c| c.3).sum();
    (risky, top, set.len(), sum, mem, cores)
}

/// The snapshot with `set`'s charges taken away.
fn without(snapshot: &NodeSnapshot, pool: &[Eligible<'_>], set: &[usize]) -> NodeSnapshot {
    let mut s = snapshot.clone();
    for i in set {
        for &(gpu, slots, mem, cores) in &pool[*i].charges {
            let u = &mut s.usage[gpu];
            u.used = u.used.saturating_sub(slots);
            u.mem_mib = u.mem_mib.saturating_sub(mem);
            u.cores = u.cores.saturating_sub(cores);
        }
    }
    s
}

/// The victims to evict on `node` (none when the pod fits already), or why no eviction
/// helps.
pub(super) fn choose<'a>(
    preemptor: &Preemptor,
    node: NodeCandidate<'a>,
    pdbs: &[PdbFacts],
) -> Result<Vec<&'a PodFacts>, Veto> {
    let snapshot = node.snapshot;
    if fits(preemptor, snapshot).is_ok() {
        return Ok(Vec::new());
    }
    let index: HashMap<&str, usize> = snapshot
        .devices
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (g.info.id.as_str(), i))
        .collect();
    let pool: Vec<Eligible<'a>> = node
        .pods
        .iter()
        .filter(|p| barred(preemptor, p).is_none())
        .filter_map(|pod| {
            let charges: Vec<_> = pod
                .charges
                .iter()
                .filter_map(|c| Some((*index.get(c.uuid.as_str())?, c.slots, c.mem_mib, c.cores)))
                .collect();
            (!charges.is_empty()).then(|| Eligible {
                pod,
                charges,
                risky: pdbs
                    .iter()
                    .any(|b| b.disruptions_allowed <= 0 && b.covers(pod)),
            })
        })
        .collect();
    let all: Vec<usize> = (0..pool.len()).collect();
    if let Err(why) = fits(preemptor, &without(snapshot, &pool, &all)) {
        return Err(Veto::NoEvictionFits(why));
    }
    let fits_without = |set: &[usize]| fits(preemptor, &without(snapshot, &pool, set)).is_ok();
    let vendors = preemptor.fit_request().vendors();
    // Per GPU of a requested vendor, its eligible pods in eviction order: no PDB risk
    // first, lowest priority, then the largest slice on this GPU (fewer victims).
    let per_gpu: Vec<Vec<usize>> = (0..snapshot.devices.gpus.len())
        .map(|g| {
            if !vendors.contains(&snapshot.devices.gpus[g].vendor) {
                return Vec::new();
            }
            let on = |i: usize| pool[i].charges.iter().find(|c| c.0 == g).copied();
            let mut here: Vec<usize> = all.iter().copied().filter(|i| on(*i).is_some()).collect();
            here.sort_by_key(|&i| {
                let (_, _, mem, cores) = on(i).unwrap_or_default();
                let p = &pool[i];
                (
                    p.risky,
                    p.pod.priority,
                    Reverse(mem),
                    Reverse(cores),
                    p.pod.uid.as_str(),
                )
            });
            here
        })
        .collect();
    // One GPU at a time: the shortest prefix of its order that makes room.
    let mut best: Option<(Cost, Vec<usize>)> = None;
    for order in per_gpu.iter().filter(|o| !o.is_empty()) {
        let first = &pool[order[0]];
        let bound: Cost = (
            usize::from(first.risky),
            first.pod.priority,
            1,
            i64::from(first.pod.priority),
            0,
            0,
        );
        if best.as_ref().is_some_and(|(c, _)| *c <= bound) || !fits_without(order) {
            continue;
        }
        let set = shortest_prefix(order, &fits_without);
        let c = cost(&set, &pool);
        if best.as_ref().is_none_or(|(b, _)| c < *b) {
            best = Some((c, set));
        }
    }
    let set = match best {
        Some((_, set)) => set,
        None => {
            // Room on several GPUs: GPUs by how cheaply they clear, their pods in order.
            let mut gpus: Vec<&Vec<usize>> = per_gpu.iter().filter(|o| !o.is_empty()).collect();
            gpus.sort_by_key(|o| cost(o, &pool));
            let mut order: Vec<usize> = Vec::new();
            for i in gpus.into_iter().flatten() {
                if !order.contains(i) {
                    order.push(*i);
                }
            }
            if !fits_without(&order) {
                // Only pods of other vendors' GPUs or none at all would make room.
                order = all.clone();
            }
            shortest_prefix(&order, &fits_without)
        }
    };
    let set = reprieve(set, &fits_without);
    Ok(set.into_iter().map(|i| pool[i].pod).collect())
}

/// The shortest prefix of `order` that fits (the whole of it does).
fn shortest_prefix(order: &[usize], fits_without: &impl Fn(&[usize]) -> bool) -> Vec<usize> {
    let (mut lo, mut hi) = (1, order.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits_without(&order[..mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    order[..hi.min(order.len())].to_vec()
}

/// Spares every victim the fit does not need, the last in eviction order (highest
/// priority, smallest) first; minimal because the fit is monotone.
fn reprieve(mut set: Vec<usize>, fits_without: &impl Fn(&[usize]) -> bool) -> Vec<usize> {
    let mut k = set.len();
    while k > 0 {
        k -= 1;
        let mut trial = set.clone();
        trial.remove(k);
        if fits_without(&trial) {
            set = trial;
        }
    }
    set
}
