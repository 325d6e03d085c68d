//! The victim search as first written (tests only): Filter's `fit_node` on a fresh copy of
//! the node for every trial, every GPU's order sorted up front. Kept as the reference the
//! verb's search (`preemption_search.rs`) must match decision for decision
//! (`the_fast_search_decides_exactly_as_the_reference`); only its input changed, to the
//! pods with their charges laid out flat ([`NodePods`]).
//!
//! Filter's fit only gets easier as usage drops (every check compares usage with a
//! capacity), so "fits with these evicted" is monotone in the set evicted: a prefix of a
//! fixed order is found by bisection, and one reprieve pass leaves a minimal set.

use std::cmp::Reverse;

use std::borrow::Borrow;

use super::pods::NodePods;
use super::{PdbFacts, PodFacts, Preemptor, Veto, fits};
use crate::snapshot::NodeSnapshot;

/// One eligible pod, its charges resolved to GPU indices of the node.
struct Eligible<'a> {
    pod: &'a PodFacts,
    /// The pod's (read here without reaching for its facts).
    priority: i32,
    /// Its charges: a range of [`Pool::charges`] (one allocation per node, not per pod).
    charges: std::ops::Range<usize>,
    /// Covered by a PDB that allows no disruption: evicted only when nothing else helps.
    risky: bool,
}

/// How good a victim set is, smaller first: PDB risks, highest priority, count (the
/// choice between GPUs), then the sum of priorities and the MiB and cores evicted (the
/// order in which several GPUs are cleared).
type Cost = (usize, i32, usize, i64, u64, u64);

/// The eligible pods of a node and their charges.
struct Pool<'a> {
    pods: Vec<Eligible<'a>>,
    /// `(gpu, slots, MiB, cores)`, `gpu` an index of the node's GPUs.
    charges: Vec<(usize, u32, u64, u64)>,
}

impl<'a> std::ops::Index<usize> for Pool<'a> {
    type Output = Eligible<'a>;
    fn index(&self, i: usize) -> &Eligible<'a> {
        &self.pods[i]
    }
}

impl Pool<'_> {
    fn charges_of(&self, i: usize) -> &[(usize, u32, u64, u64)] {
        &self.charges[self.pods[i].charges.clone()]
    }
}

fn cost(set: &[usize], pool: &Pool<'_>) -> Cost {
    let risky = set.iter().filter(|i| pool[**i].risky).count();
    let top = set
        .iter()
        .map(|i| pool[*i].priority)
        .max()
        .unwrap_or(i32::MIN);
    let sum = set.iter().map(|i| i64::from(pool[*i].priority)).sum();
    let charges = || set.iter().flat_map(|i| pool.charges_of(*i));
    let mem = charges().map(|c| c.2).sum();
    let cores = charges().map(|c| c.3).sum();
    (risky, top, set.len(), sum, mem, cores)
}

/// The snapshot with `set`'s charges taken away.
fn without(snapshot: &NodeSnapshot, pool: &Pool<'_>, set: &[usize]) -> NodeSnapshot {
    let mut s = snapshot.clone();
    for i in set {
        for &(gpu, slots, mem, cores) in pool.charges_of(*i) {
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
pub(super) fn choose<'a, F: Borrow<PodFacts>>(
    preemptor: &Preemptor,
    snapshot: &NodeSnapshot,
    pods: &'a NodePods<F>,
    pdbs: &[PdbFacts],
) -> Result<Vec<&'a PodFacts>, Veto> {
    if fits(preemptor, snapshot).is_ok() {
        return Ok(Vec::new());
    }
    let gpus = &snapshot.devices.gpus;
    // The GPU ids the charges name, found among the node's GPUs once per node.
    let on_node = pods.gpu_map(&snapshot.devices);
    let mut pool = Pool {
        pods: Vec::new(),
        charges: Vec::new(),
    };
    for (k, held) in pods.pods().iter().enumerate() {
        // `barred`, from the copies kept beside the facts.
        if held.protection.is_some() || held.priority >= preemptor.priority {
            continue;
        }
        let start = pool.charges.len();
        for &(g, slots, mem, cores) in pods.charges_of(k) {
            if let Some(g) = on_node[g as usize] {
                pool.charges.push((g, slots, mem, cores));
            }
        }
        if pool.charges.len() > start {
            let pod: &PodFacts = held.facts.borrow();
            pool.pods.push(Eligible {
                pod,
                priority: held.priority,
                charges: start..pool.charges.len(),
                risky: pdbs
                    .iter()
                    .any(|b| b.disruptions_allowed <= 0 && b.covers(pod)),
            });
        }
    }
    let all: Vec<usize> = (0..pool.pods.len()).collect();
    if let Err(why) = fits(preemptor, &without(snapshot, &pool, &all)) {
        return Err(Veto::NoEvictionFits(why));
    }
    let fits_without = |set: &[usize]| fits(preemptor, &without(snapshot, &pool, set)).is_ok();
    let vendors = preemptor.fit_request().vendors();
    // Per GPU of a requested vendor, its eligible pods in eviction order: no PDB risk
    // first, lowest priority, then the largest slice on this GPU (fewer victims), then
    // the order the shell listed the pods in.
    type Key = (bool, i32, Reverse<u64>, Reverse<u64>, usize);
    let mut per_gpu: Vec<Vec<Key>> = vec![Vec::new(); gpus.len()];
    for i in 0..pool.pods.len() {
        let p = &pool[i];
        for &(g, _, mem, cores) in pool.charges_of(i) {
            if vendors.contains(&gpus[g].vendor) {
                per_gpu[g].push((p.risky, p.priority, Reverse(mem), Reverse(cores), i));
            }
        }
    }
    let per_gpu: Vec<Vec<usize>> = per_gpu
        .into_iter()
        .map(|mut here| {
            here.sort_unstable();
            here.into_iter().map(|k| k.4).collect()
        })
        .collect();
    // One GPU at a time, the emptiest first (on a tie it costs the least work): the
    // shortest prefix of its order that makes room, tried only where it can beat the
    // best so far in PDB risks, highest priority and count (each only grows with the
    // prefix, so the prefixes that can are a prefix themselves).
    let mut tried: Vec<usize> = (0..gpus.len())
        .filter(|g| !per_gpu[*g].is_empty())
        .collect();
    tried.sort_by_key(|g| {
        let u = &snapshot.usage[*g];
        (u.used, u.cores, u.mem_mib, *g)
    });
    let mut best: Option<(Cost, Vec<usize>)> = None;
    for g in tried {
        let order = &per_gpu[g];
        let usable = match &best {
            None => order.len(),
            Some(((risks, top, count, ..), _)) => {
                let (mut r, mut t, mut n) = (0, i32::MIN, 0);
                for &i in order {
                    r += usize::from(pool[i].risky);
                    t = t.max(pool[i].priority);
                    if (r, t, n + 1) >= (*risks, *top, *count) {
                        break;
                    }
                    n += 1;
                }
                n
            }
        };
        if usable == 0 || !fits_without(&order[..usable]) {
            continue;
        }
        let set = shortest_prefix(&order[..usable], &fits_without);
        best = Some((cost(&set, &pool), set));
    }
    let set = match best {
        Some((_, set)) => set,
        None => {
            // Room on several GPUs: GPUs by how cheaply they clear, their pods in order.
            let mut gpus: Vec<&Vec<usize>> = per_gpu.iter().filter(|o| !o.is_empty()).collect();
            gpus.sort_by_key(|o| cost(o, &pool));
            let mut seen = vec![false; pool.pods.len()];
            let mut order: Vec<usize> = Vec::new();
            for &i in gpus.into_iter().flatten() {
                if !std::mem::replace(&mut seen[i], true) {
                    order.push(i);
                }
            }
            if !fits_without(&order) {
                // Only pods of other vendors' GPUs or none at all would make room.
                order = all.clone();
            }
            shortest_prefix(&order, &fits_without)
        }
    };
    let set = reprieve(set, &pool, &fits_without);
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
/// priority, smallest) first; minimal because the fit is monotone. `set` is a shortest
/// prefix, so its last victim is needed (one fewer did not fit), and so is every victim
/// that frees no less than it on each of its GPUs: sparing that one leaves less room than
/// sparing the last did. Only the others are tried.
fn reprieve(
    mut set: Vec<usize>,
    pool: &Pool<'_>,
    fits_without: &impl Fn(&[usize]) -> bool,
) -> Vec<usize> {
    let Some(&last) = set.last() else {
        return set;
    };
    let frees_no_less = |v: usize| {
        pool.charges_of(last).iter().all(|&(g, slots, mem, cores)| {
            pool.charges_of(v)
                .iter()
                .any(|c| c.0 == g && c.1 >= slots && c.2 >= mem && c.3 >= cores)
        })
    };
    let mut k = set.len() - 1;
    while k > 0 {
        k -= 1;
        if frees_no_less(set[k]) {
            continue;
        }
        let mut trial = set.clone();
        trial.remove(k);
        if fits_without(&trial) {
            set = trial;
        }
    }
    set
}
