//! The victim search of the preempt verb: the fewest, lowest-priority pods holding slices
//! on the GPUs the preemptor would take whose eviction makes it fit by Filter's rule.
//!
//! Filter's fit only gets easier as usage drops (every check compares usage with a
//! capacity), so "fits with these evicted" is monotone in the set evicted: a prefix of a
//! fixed order is found by bisection, and one reprieve pass leaves a minimal set.
//!
//! A node costs a dozen or so trials and a call up to 1,000 nodes, so a trial clones
//! nothing and builds no text: one scratch copy of the node per node, its usage reset and
//! the set's charges taken away in place, judged by [`QuickFit`] (Filter's answer, not
//! its reasons). Filter's reason is built once, for a node no eviction can cure.

use std::cmp::Reverse;

use std::borrow::Borrow;

use super::pods::{Charge, NodePods};
use super::{PdbFacts, PodFacts, Preemptor, Veto, fits};
use crate::fit::quick::QuickFit;
use crate::snapshot::{GpuUsage, NodeSnapshot};

/// Trials on one node: its usage, and the scratch copy each trial rewrites.
struct Trials<'q, 'p, 's> {
    quick: &'q QuickFit<'p>,
    usage: &'s [GpuUsage],
    scratch: NodeSnapshot,
}

impl Trials<'_, '_, '_> {
    /// Whether the pod fits with `set`'s charges taken away. Subtraction saturates at 0
    /// one charge at a time, which gives the same usage whatever the order, so resetting
    /// and subtracting equals a fresh copy with the set taken away.
    fn fits_without(&mut self, pool: &Pool<'_>, set: &[usize]) -> bool {
        self.scratch.usage.copy_from_slice(self.usage);
        for i in set {
            for &(gpu, slots, mem, cores) in pool.charges_of(*i) {
                let u = &mut self.scratch.usage[gpu];
                u.used = u.used.saturating_sub(slots);
                u.mem_mib = u.mem_mib.saturating_sub(mem);
                u.cores = u.cores.saturating_sub(cores);
            }
        }
        self.quick.fits(&self.scratch)
    }
}

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
    charges: Vec<Charge>,
}

impl<'a> std::ops::Index<usize> for Pool<'a> {
    type Output = Eligible<'a>;
    fn index(&self, i: usize) -> &Eligible<'a> {
        &self.pods[i]
    }
}

impl Pool<'_> {
    fn charges_of(&self, i: usize) -> &[Charge] {
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

/// The victims to evict on `node` (none when the pod fits already), or why no eviction
/// helps.
pub(super) fn choose<'a, F: Borrow<PodFacts>>(
    preemptor: &Preemptor,
    quick: &QuickFit<'_>,
    snapshot: &NodeSnapshot,
    pods: &'a NodePods<F>,
    pdbs: &[PdbFacts],
) -> Result<Vec<&'a PodFacts>, Veto> {
    if quick.fits(snapshot) {
        return Ok(Vec::new());
    }
    let gpus = &snapshot.devices.gpus;
    // The GPU ids the charges name, found among the node's GPUs once per node.
    let on_node = pods.gpu_map(&snapshot.devices);
    let mut pool = Pool {
        pods: Vec::with_capacity(pods.len()),
        charges: Vec::with_capacity(pods.len()),
    };
    for (k, held) in pods.pods().iter().enumerate() {
        // `barred`, from the copies kept beside the facts.
        if held.protection.is_some() || held.priority >= preemptor.priority {
            continue;
        }
        let start = pool.charges.len();
        for &(g, slots, mem, cores) in pods.charges_of(k) {
            if let Some(g) = on_node[g] {
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
    let mut trials = Trials {
        quick,
        usage: &snapshot.usage,
        scratch: snapshot.clone(),
    };
    // Filter's reason is built here only, on the node with every eligible slice gone.
    if !trials.fits_without(&pool, &all)
        && let Err(why) = fits(preemptor, &trials.scratch)
    {
        return Err(Veto::NoEvictionFits(why));
    }
    let mut fits_without = |set: &[usize]| trials.fits_without(&pool, set);
    let vendors = preemptor.fit_request().vendors();
    // Per GPU of a requested vendor, its eligible pods in eviction order: no PDB risk
    // first, lowest priority, then the largest slice on this GPU (fewer victims), then
    // the order the shell listed the pods in. Sorted only once the GPU is tried and may
    // beat the best set (keys are unique: the last field is the pod's index).
    type Key = (bool, i32, Reverse<u64>, Reverse<u64>, usize);
    // Sized first: growing eight lists a push at a time cost more than the count.
    let mut sizes = vec![0usize; gpus.len()];
    for c in &pool.charges {
        sizes[c.0] += 1;
    }
    let mut per_gpu: Vec<Vec<Key>> = sizes.iter().map(|n| Vec::with_capacity(*n)).collect();
    for i in 0..pool.pods.len() {
        let p = &pool[i];
        for &(g, _, mem, cores) in pool.charges_of(i) {
            if vendors.contains(&gpus[g].vendor) {
                per_gpu[g].push((p.risky, p.priority, Reverse(mem), Reverse(cores), i));
            }
        }
    }
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
    let (mut order, mut superset) = (Vec::new(), Vec::new());
    for g in tried {
        let keys = &mut per_gpu[g];
        if quick.monotone()
            && let Some(((0, top, ..), _)) = &best
        {
            // A set that beats one without PDB risks holds only pods of no risk and of
            // priority up to its highest: if evicting every such pod here makes no room,
            // no prefix of this GPU's order does (a monotone fit), and it is not sorted.
            superset.clear();
            superset.extend(keys.iter().filter(|k| !k.0 && k.1 <= *top).map(|k| k.4));
            if !fits_without(&superset) {
                continue;
            }
        }
        keys.sort_unstable();
        order.clear();
        order.extend(keys.iter().map(|k| k.4));
        let usable = match &best {
            None => order.len(),
            Some(((risks, top, count, ..), _)) => {
                let (mut r, mut t, mut n) = (0, i32::MIN, 0);
                for &i in &order {
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
        let set = shortest_prefix(&order[..usable], &mut fits_without);
        best = Some((cost(&set, &pool), set));
    }
    let set = match best {
        Some((_, set)) => set,
        None => {
            // Room on several GPUs: GPUs by how cheaply they clear, their pods in order
            // (GPU index order between equals: the sort is stable).
            let mut gpus: Vec<Vec<usize>> = per_gpu
                .into_iter()
                .filter(|keys| !keys.is_empty())
                .map(|mut keys| {
                    keys.sort_unstable();
                    keys.into_iter().map(|k| k.4).collect()
                })
                .collect();
            gpus.sort_by_key(|o| cost(o, &pool));
            let mut seen = vec![false; pool.pods.len()];
            let mut order: Vec<usize> = Vec::new();
            for &i in gpus.iter().flatten() {
                if !std::mem::replace(&mut seen[i], true) {
                    order.push(i);
                }
            }
            if !fits_without(&order) {
                // Only pods of other vendors' GPUs or none at all would make room.
                order = all.clone();
            }
            shortest_prefix(&order, &mut fits_without)
        }
    };
    let set = reprieve(set, &pool, &mut fits_without);
    Ok(set.into_iter().map(|i| pool[i].pod).collect())
}

/// The shortest prefix of `order` that fits (the whole of it does).
fn shortest_prefix(order: &[usize], fits_without: &mut impl FnMut(&[usize]) -> bool) -> Vec<usize> {
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
    fits_without: &mut impl FnMut(&[usize]) -> bool,
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
    let mut trial = Vec::with_capacity(set.len());
    let mut k = set.len() - 1;
    while k > 0 {
        k -= 1;
        if frees_no_less(set[k]) {
            continue;
        }
        trial.clear();
        trial.extend(set[..k].iter().chain(&set[k + 1..]));
        if fits_without(&trial) {
            set.remove(k);
        }
    }
    set
}
