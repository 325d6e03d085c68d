//! The victim search of the preempt verb: the fewest, lowest-priority pods holding slices
//! on the GPUs the preemptor would take whose eviction makes it fit by Filter's rule.
//!
//! Filter's fit only gets easier as usage drops (every check compares usage with a
//! capacity), so "fits with these evicted" is monotone in the set evicted: a prefix of a
//! fixed order is found by bisection, and one reprieve pass leaves a minimal set.
//!
//! A node costs a dozen or so trials and a call up to 1,000 nodes, so the search reads
//! no pod it need not and allocates nothing per node: each GPU's eviction order is kept
//! sorted by the node's list ([`super::order::GpuOrder`]), so a GPU's candidates are a
//! prefix of it and whether any eviction helps is judged from per-priority sums; a trial
//! rewrites the usage of one scratch copy of the node, reused from node to node, and is
//! judged by [`QuickFit`] (Filter's answer, not its reasons). Filter's reason is built
//! once, for a node no eviction can cure. Test: `the_fast_search_decides_exactly_as_the_reference`.

use std::borrow::Borrow;
use std::sync::Arc;

use hami_protocol::names::Vendor;

use super::order::{Freed, Slice};
use super::pods::NodePods;
use super::{PdbFacts, PodFacts, Preemptor, Veto, fits};
use crate::fit::quick::QuickFit;
use crate::snapshot::{GpuUsage, NodeSnapshot};

/// What every node's search in one call shares: prepared once per call.
pub(super) struct Fast<'p> {
    quick: QuickFit<'p>,
    /// The vendors the preemptor asks for.
    vendors: Vec<Vendor>,
    /// Some PDB allows no disruption: pods it covers are evicted only when nothing else
    /// helps.
    strict_pdbs: bool,
}

impl<'p> Fast<'p> {
    pub(super) fn new(preemptor: &'p Preemptor, pdbs: &[PdbFacts]) -> Self {
        let req = preemptor.fit_request();
        Self {
            quick: QuickFit::new(&req),
            vendors: req.vendors(),
            strict_pdbs: pdbs.iter().any(|b| b.disruptions_allowed <= 0),
        }
    }
}

/// What one thread's searches reuse from node to node.
pub(super) struct Scratch {
    /// Per id of the node's table, its GPU on the snapshot.
    on_node: Vec<Option<usize>>,
    /// Per GPU of the snapshot, its id in the table.
    id_of: Vec<Option<usize>>,
    /// Per pod, covered by a PDB that allows no disruption (empty: no such PDB).
    risky: Vec<bool>,
    /// The node with a trial's set taken away.
    trial: NodeSnapshot,
    tried: Vec<usize>,
    order: Vec<usize>,
    /// What each prefix of a GPU's order frees.
    freed_by: Vec<Freed>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            on_node: Vec::new(),
            id_of: Vec::new(),
            risky: Vec::new(),
            trial: NodeSnapshot::idle(Arc::default()),
            tried: Vec::new(),
            order: Vec::new(),
            freed_by: Vec::new(),
        }
    }
}

/// The node's pods as one search reads them: GPU ids resolved, PDB risk known.
struct View<'v, F> {
    pods: &'v NodePods<F>,
    on_node: &'v [Option<usize>],
    risky: &'v [bool],
}

impl<F: Borrow<PodFacts>> View<'_, F> {
    fn risky(&self, k: usize) -> bool {
        self.risky.get(k).copied().unwrap_or(false)
    }

    fn priority(&self, k: usize) -> i32 {
        self.pods.pods()[k].priority
    }

    /// The `k`th pod's charges on GPUs of the node, as `(gpu, slots, MiB, cores)`.
    fn charges(&self, k: usize) -> impl Iterator<Item = (usize, u32, u64, u64)> + '_ {
        self.pods
            .charges_of(k)
            .iter()
            .filter_map(|&(id, slots, mem, cores)| {
                self.on_node[id as usize].map(|g| (g, slots, mem, cores))
            })
    }

    /// May be named: not protected, below the preemptor, holding a slice on the node.
    fn eligible(&self, k: usize, bound: i32) -> bool {
        let held = &self.pods.pods()[k];
        held.protection.is_none() && held.priority < bound && self.charges(k).next().is_some()
    }
}

fn take(u: &mut GpuUsage, freed: Freed) {
    u.used = u
        .used
        .saturating_sub(u32::try_from(freed.slots).unwrap_or(u32::MAX));
    u.mem_mib = u.mem_mib.saturating_sub(freed.mem);
    u.cores = u.cores.saturating_sub(freed.cores);
}

/// Trials on one node: the usage as it is, and the scratch copy each trial rewrites.
struct Trials<'t, 'v, F> {
    quick: &'t QuickFit<'t>,
    usage: &'t [GpuUsage],
    trial: &'t mut NodeSnapshot,
    view: &'t View<'v, F>,
}

impl<F: Borrow<PodFacts>> Trials<'_, '_, F> {
    /// Whether the pod fits with `set`'s charges taken away. Subtraction saturates at 0
    /// one charge at a time, which gives the same usage whatever the order, so resetting
    /// and subtracting equals a fresh copy with the set taken away.
    fn without(&mut self, set: &[usize]) -> bool {
        self.trial.usage.copy_from_slice(self.usage);
        for &k in set {
            for (g, slots, mem, cores) in self.view.charges(k) {
                let freed = Freed {
                    slots: u64::from(slots),
                    mem,
                    cores,
                };
                take(&mut self.trial.usage[g], freed);
            }
        }
        self.quick.fits(self.trial)
    }

    /// Whether the pod fits with `freed` taken from GPU `g` only.
    fn without_on(&mut self, g: usize, freed: Freed) -> bool {
        self.trial.usage.copy_from_slice(self.usage);
        take(&mut self.trial.usage[g], freed);
        self.quick.fits(self.trial)
    }
}

/// How good a victim set is, smaller first: PDB risks, highest priority, count (the
/// choice between GPUs), then the sum of priorities and the MiB and cores evicted (the
/// order in which several GPUs are cleared).
type Cost = (usize, i32, usize, i64, u64, u64);

fn cost<F: Borrow<PodFacts>>(set: &[usize], view: &View<'_, F>) -> Cost {
    let risky = set.iter().filter(|k| view.risky(**k)).count();
    let top = set
        .iter()
        .map(|k| view.priority(*k))
        .max()
        .unwrap_or(i32::MIN);
    let sum = set.iter().map(|k| i64::from(view.priority(*k))).sum();
    let charges = || set.iter().flat_map(|k| view.charges(*k));
    let mem = charges().map(|c| c.2).sum();
    let cores = charges().map(|c| c.3).sum();
    (risky, top, set.len(), sum, mem, cores)
}

/// The `id`th GPU's candidates in eviction order: no PDB risk first, lowest priority,
/// then the largest slice on this GPU (fewer victims), then the pods' order.
fn gpu_order<F: Borrow<PodFacts>>(view: &View<'_, F>, id: usize, bound: i32, out: &mut Vec<usize>) {
    out.clear();
    let slices = view.pods.order(id).below(bound);
    let pods = slices.iter().map(|s| s.pod as usize);
    if view.risky.is_empty() {
        out.extend(pods);
    } else {
        out.extend(pods.clone().filter(|k| !view.risky(*k)));
        out.extend(pods.filter(|k| view.risky(*k)));
    }
}

/// The victims to evict on `node` (none when the pod fits already), or why no eviction
/// helps.
pub(super) fn choose<'a, F: Borrow<PodFacts>>(
    preemptor: &Preemptor,
    fast: &Fast<'_>,
    snapshot: &NodeSnapshot,
    pods: &'a NodePods<F>,
    pdbs: &[PdbFacts],
    scratch: &mut Scratch,
) -> Result<Vec<&'a PodFacts>, Veto> {
    let quick = &fast.quick;
    if quick.fits(snapshot) {
        return Ok(Vec::new());
    }
    let bound = preemptor.priority;
    let gpus = &snapshot.devices.gpus;
    let Scratch {
        on_node,
        id_of,
        risky,
        trial,
        tried,
        order,
        freed_by,
    } = scratch;
    // The GPU ids the charges name, found among the node's GPUs once per node.
    pods.gpu_map_into(&snapshot.devices, on_node);
    id_of.clear();
    id_of.resize(gpus.len(), None);
    for (id, g) in on_node.iter().enumerate() {
        if let Some(g) = g {
            id_of[*g] = Some(id);
        }
    }
    risky.clear();
    if fast.strict_pdbs {
        risky.extend(pods.pods().iter().map(|held| {
            held.protection.is_none()
                && held.priority < bound
                && pdbs
                    .iter()
                    .any(|b| b.disruptions_allowed <= 0 && b.covers(held.facts.borrow()))
        }));
        if !risky.contains(&true) {
            risky.clear();
        }
    }
    let view = View {
        pods,
        on_node,
        risky,
    };
    // Every eligible slice gone, from the orders' sums: a pod eligible here is one with a
    // slice below the preemptor on a GPU of the node, and each such slice is in its GPU's
    // order once. Filter's reason is built here only.
    trial.devices = Arc::clone(&snapshot.devices);
    trial.usage.clone_from(&snapshot.usage);
    trial.held_whole.clone_from(&snapshot.held_whole);
    for (g, id) in id_of.iter().enumerate() {
        if let Some(id) = id {
            take(&mut trial.usage[g], pods.order(*id).freed_below(bound));
        }
    }
    if !quick.fits(trial)
        && let Err(why) = fits(preemptor, trial)
    {
        return Err(Veto::NoEvictionFits(why));
    }
    let usage = &snapshot.usage;
    let mut trials = Trials {
        quick,
        usage,
        trial,
        view: &view,
    };
    // One GPU at a time, the emptiest first (on a tie it costs the least work): the
    // shortest prefix of its order that makes room, tried only where it can beat the
    // best so far in PDB risks, highest priority and count (each only grows with the
    // prefix, so the prefixes that can are a prefix themselves; a set that beats one is
    // within every candidate of no more risk and priority, so where that prefix makes no
    // room, no prefix does).
    tried.clear();
    tried.extend((0..gpus.len()).filter(|g| {
        fast.vendors.contains(&gpus[*g].vendor)
            && id_of[*g].is_some_and(|id| pods.order(id).any_below(bound))
    }));
    tried.sort_by_key(|g| {
        let u = &usage[*g];
        (u.used, u.cores, u.mem_mib, *g)
    });
    let mut best: Option<(Cost, Vec<usize>)> = None;
    for &g in tried.iter() {
        let Some(id) = id_of[g] else { continue };
        let limit = best.as_ref().map(|(c, _)| (c.0, c.1, c.2));
        let slices = pods.order(id).below(bound);
        if view.risky.is_empty()
            && let Some((usable, freed)) = alone_prefix(slices, limit, freed_by)
        {
            // Pods holding this slice only: a prefix frees its sum here, nothing else.
            if usable == 0 || !trials.without_on(g, freed[usable - 1]) {
                continue;
            }
            let n = shortest_prefix(usable, &mut |n| trials.without_on(g, freed[n - 1]));
            let set = &slices[..n];
            best = Some((
                slice_cost(set),
                set.iter().map(|s| s.pod as usize).collect(),
            ));
            continue;
        }
        gpu_order(&view, id, bound, order);
        let usable = match limit {
            None => order.len(),
            Some((risks, top, count)) => {
                let (mut r, mut t, mut n) = (0, i32::MIN, 0);
                for &k in order.iter() {
                    r += usize::from(view.risky(k));
                    t = t.max(view.priority(k));
                    if (r, t, n + 1) >= (risks, top, count) {
                        break;
                    }
                    n += 1;
                }
                n
            }
        };
        if usable == 0 || !trials.without(&order[..usable]) {
            continue;
        }
        let n = shortest_prefix(usable, &mut |n| trials.without(&order[..n]));
        let set = order[..n].to_vec();
        best = Some((cost(&set, &view), set));
    }
    let set = match best {
        Some((_, set)) => set,
        None => {
            // Room on several GPUs: GPUs by how cheaply they clear, their pods in order
            // (GPU index order between equals: the sort is stable).
            let mut orders: Vec<Vec<usize>> = (0..gpus.len())
                .filter(|g| fast.vendors.contains(&gpus[*g].vendor))
                .filter_map(|g| id_of[g])
                .map(|id| {
                    let mut o = Vec::new();
                    gpu_order(&view, id, bound, &mut o);
                    o
                })
                .filter(|o| !o.is_empty())
                .collect();
            orders.sort_by_key(|o| cost(o, &view));
            let mut seen = vec![false; pods.len()];
            let mut union: Vec<usize> = Vec::new();
            for &k in orders.iter().flatten() {
                if !std::mem::replace(&mut seen[k], true) {
                    union.push(k);
                }
            }
            if !trials.without(&union) {
                // Only pods of other vendors' GPUs or none at all would make room.
                union = (0..pods.len())
                    .filter(|k| view.eligible(*k, bound))
                    .collect();
            }
            let n = shortest_prefix(union.len(), &mut |n| trials.without(&union[..n]));
            union.truncate(n);
            union
        }
    };
    let set = reprieve(set, &mut trials);
    Ok(set
        .into_iter()
        .map(|k| pods.pods()[k].facts.borrow())
        .collect())
}

/// Where no pod is at PDB risk: the prefix of `slices` that can beat the best set so far
/// (`limit`: its risks, highest priority and count), with what each of its prefixes
/// frees (into `freed`), if every slice in it is its pod's only one; `None` otherwise.
fn alone_prefix<'f>(
    slices: &[Slice],
    limit: Option<(usize, i32, usize)>,
    freed: &'f mut Vec<Freed>,
) -> Option<(usize, &'f [Freed])> {
    freed.clear();
    let (mut top, mut sum) = (i32::MIN, Freed::default());
    for s in slices {
        top = top.max(s.priority);
        if limit.is_some_and(|l| (0, top, freed.len() + 1) >= l) {
            break;
        }
        if !s.alone {
            return None;
        }
        sum = sum.add(s);
        freed.push(sum);
    }
    Some((freed.len(), freed))
}

/// [`cost`] of a prefix of a GPU's order whose pods hold those slices only.
fn slice_cost(set: &[Slice]) -> Cost {
    let top = set.iter().map(|s| s.priority).max().unwrap_or(i32::MIN);
    let sum = set.iter().map(|s| i64::from(s.priority)).sum();
    let mem = set.iter().map(|s| s.mem).sum();
    let cores = set.iter().map(|s| s.cores).sum();
    (0, top, set.len(), sum, mem, cores)
}

/// The length of the shortest prefix that fits (all `len` do).
fn shortest_prefix(len: usize, fits_prefix: &mut impl FnMut(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (1, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits_prefix(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// Spares every victim the fit does not need, the last in eviction order (highest
/// priority, smallest) first; minimal because the fit is monotone. `set` is a shortest
/// prefix, so its last victim is needed (one fewer did not fit), and so is every victim
/// that frees no less than it on each of its GPUs: sparing that one leaves less room than
/// sparing the last did. Only the others are tried.
fn reprieve<F: Borrow<PodFacts>>(
    mut set: Vec<usize>,
    trials: &mut Trials<'_, '_, F>,
) -> Vec<usize> {
    let Some(&last) = set.last() else {
        return set;
    };
    let view = trials.view;
    let frees_no_less = |v: usize| {
        view.charges(last).all(|(g, slots, mem, cores)| {
            view.charges(v)
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
        if trials.without(&trial) {
            set.remove(k);
        }
    }
    set
}
