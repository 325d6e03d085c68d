//! Making room for one pending pod: the fewest moves that let it fit some node.
//!
//! A node is a candidate when the pod fits it once every movable pod there is gone; for a
//! pod asking one GPU (the common case) each card of the node is a candidate of its own,
//! with the movable pods on it and a lower bound on how many must go (per dimension, the
//! largest first). For k = 1, 2, … the candidates whose bound allows k are tried in order
//! of the bound and of how many pods a greedy removal (largest memory first) needs, and on
//! each, every set of k movable pods: the set is taken when its removal makes the pod fit
//! and each of its pods is placed elsewhere, in order, by the scheduler's fit (never back
//! on that node). The first set found has the fewest moves among plans that make room on
//! one node and place each moved pod by best fit (other placements of the moved pods are
//! not searched), unless the search budget cut the search short (the plan then says so).

use hami_protocol::names::Vendor;
use hami_protocol::requests::DeviceRequest;
use hami_protocol::selection::NodePolicy;
use hami_scheduler_core::fit::quick::QuickFit;
use hami_scheduler_core::fit::{FitRequest, demand, fit_node};
use hami_scheduler_core::snapshot::NodeSnapshot;

use crate::input::PodRequest;
use crate::plan::{Constraint, Run};
use crate::safety::protection;
use crate::work::{At, Slot, Work};

/// Nodes whose "never fits" reason is listed: the reasons repeat across a fleet.
const NEVER_FITS_LISTED: usize = 3;

fn pending_request(request: &PodRequest) -> FitRequest<'_> {
    FitRequest {
        containers: &request.containers,
        selectors: &request.selectors,
        gpu_policy: request.gpu_policy,
        node_policy: NodePolicy::Binpack,
    }
}

/// The first node (in snapshot order) the pending pod fits now.
pub(crate) fn fits_on(request: &PodRequest, work: &Work) -> Option<usize> {
    let req = pending_request(request);
    let quick = QuickFit::new(&req);
    work.nodes.iter().position(|n| quick.fits(n))
}

fn without(node: &NodeSnapshot, slots: impl IntoIterator<Item = Slot>) -> NodeSnapshot {
    let mut n = node.clone();
    for s in slots {
        let u = &mut n.usage[s.gpu];
        u.used = u.used.saturating_sub(s.slots);
        u.mem_mib = u.mem_mib.saturating_sub(s.mem);
        u.cores = u.cores.saturating_sub(s.cores);
    }
    n
}

struct Candidate {
    node: usize,
    /// Movable pods there, largest memory first.
    movable: Vec<usize>,
    /// Pods a greedy removal needs.
    greedy: usize,
    /// No fewer pods can do (a lower bound).
    least: usize,
}

/// The one GPU the pending pod asks for, when it asks for exactly one (the common case:
/// then only pods sharing one card with it need to move, and sets are drawn per card).
fn one_gpu(request: &PodRequest) -> Option<(Vendor, &DeviceRequest)> {
    let mut asking = request.containers.iter().filter(|c| !c.is_empty());
    let (container, None) = (asking.next()?, asking.next()) else {
        return None;
    };
    match (&container.amd, &container.nvidia) {
        (Some(r), None) if r.count == 1 => Some((Vendor::Amd, r)),
        (None, Some(r)) if r.count == 1 => Some((Vendor::Nvidia, r)),
        _ => None,
    }
}

/// A node candidate split per card of `vendor`: the movable pods on that card, and the
/// fewest of them that can free what the pod lacks there, dimension by dimension (the
/// largest first: a lower bound, so sets smaller than it are never tried).
fn per_card(
    c: Candidate,
    vendor: Vendor,
    one: &DeviceRequest,
    quick: &QuickFit<'_>,
    work: &Work,
) -> Vec<Candidate> {
    let node = &work.nodes[c.node];
    let mut out = Vec::new();
    for (g, gpu) in node.devices.gpus.iter().enumerate() {
        if gpu.vendor != vendor {
            continue;
        }
        let on_card: Vec<(usize, Slot)> = c
            .movable
            .iter()
            .filter_map(|p| {
                let s = work.at[*p].slots.iter().find(|s| s.gpu == g)?;
                Some((*p, *s))
            })
            .collect();
        let all_slots = |ps: &[(usize, Slot)]| -> Vec<Slot> {
            ps.iter()
                .flat_map(|(p, _)| work.at[*p].slots.clone())
                .collect()
        };
        if on_card.is_empty() || !quick.fits(&without(node, all_slots(&on_card))) {
            continue;
        }
        let (mem, cores) = demand(gpu, one);
        let u = node.usage[g];
        let fewest = |deficit: u64, amount: fn(&Slot) -> u64| -> usize {
            let mut amounts: Vec<u64> = on_card.iter().map(|(_, s)| amount(s)).collect();
            amounts.sort_unstable_by(|a, b| b.cmp(a));
            let mut freed = 0;
            let mut k = 0;
            while freed < deficit && k < amounts.len() {
                freed += amounts[k];
                k += 1;
            }
            k
        };
        let least = [
            fewest((u.mem_mib + mem).saturating_sub(gpu.info.devmem), |s| s.mem),
            fewest(
                (u.cores + cores).saturating_sub(u64::from(gpu.info.devcore)),
                |s| s.cores,
            ),
            fewest(
                u64::from((u.used + 1).saturating_sub(gpu.info.count)),
                |s| u64::from(s.slots),
            ),
        ]
        .into_iter()
        .max()
        .unwrap_or(1)
        .max(1);
        let movable: Vec<usize> = on_card.iter().map(|(p, _)| *p).collect();
        let greedy = (least..=movable.len())
            .find(|k| quick.fits(&without(node, all_slots(&on_card[..*k]))))
            .unwrap_or(movable.len());
        out.push(Candidate {
            node: c.node,
            movable,
            greedy,
            least,
        });
    }
    out
}

/// The search (module docs); the node the pod then fits.
pub(crate) fn reach(
    pod: &str,
    request: &PodRequest,
    work: &mut Work,
    run: &mut Run<'_>,
) -> Option<String> {
    if !request.asks_gpu() {
        return None;
    }
    let req = pending_request(request);
    let quick = QuickFit::new(&req);
    let mut candidates = Vec::new();
    let mut never_listed = 0;
    for n in 0..work.nodes.len() {
        let name = work.nodes[n].devices.name.clone();
        let mut movable = Vec::new();
        let mut protected = Vec::new();
        for &p in work.pods_on(n) {
            match protection(&run.cluster.pods[p].safety, run.policy) {
                None => movable.push(p),
                Some(why) => protected.push((p, why)),
            }
        }
        let mem = |p: &usize| work.at[*p].slots.iter().map(|s| s.mem).sum::<u64>();
        movable.sort_by(|a, b| mem(b).cmp(&mem(a)).then(a.cmp(b)));
        let slots = |ps: &[usize]| -> Vec<Slot> {
            ps.iter().flat_map(|p| work.at[*p].slots.clone()).collect()
        };
        if quick.fits(&without(&work.nodes[n], slots(&movable))) {
            let greedy = (1..=movable.len())
                .find(|k| quick.fits(&without(&work.nodes[n], slots(&movable[..*k]))))
                .unwrap_or(movable.len());
            candidates.push(Candidate {
                node: n,
                movable,
                greedy,
                least: 1,
            });
            continue;
        }
        let mut bare = NodeSnapshot::idle(work.nodes[n].devices.clone());
        bare.held_whole = work.nodes[n].held_whole.clone();
        match fit_node(&bare, &req) {
            Err(reason) => {
                if never_listed < NEVER_FITS_LISTED {
                    never_listed += 1;
                    run.block(name, Constraint::NeverFits { reason });
                }
            }
            Ok(_) => {
                for (p, protection) in protected {
                    let pod = run.cluster.pods[p].shown();
                    run.block(name.clone(), Constraint::Protected { pod, protection });
                }
            }
        }
    }
    if work.nodes.is_empty() {
        let reason = "the snapshot holds no node".to_owned();
        run.block("fleet".into(), Constraint::NeverFits { reason });
    }
    if let Some((vendor, one)) = one_gpu(request) {
        candidates = candidates
            .into_iter()
            .flat_map(|c| per_card(c, vendor, one, &quick, work))
            .collect();
    }
    candidates.sort_by_key(|c| (c.least, c.greedy, c.node));
    let largest = candidates
        .iter()
        .map(|c| c.movable.len())
        .max()
        .unwrap_or(0);
    for k in 1..=largest {
        if k > run.policy.max_moves {
            let max_moves = run.policy.max_moves;
            run.block("fleet".into(), Constraint::MoveLimit { max_moves });
            return None;
        }
        for c in candidates
            .iter()
            .filter(|c| c.least <= k && c.movable.len() >= k)
        {
            let mut combo: Vec<usize> = (0..k).collect();
            loop {
                if !run.spend() {
                    return None;
                }
                let set: Vec<usize> = combo.iter().map(|i| c.movable[*i]).collect();
                if let Some(node) = try_set(pod, &quick, c.node, &set, work, run) {
                    return Some(node);
                }
                if !next_combination(&mut combo, c.movable.len()) {
                    break;
                }
            }
        }
    }
    None
}

/// Moves `set` off `node` if that makes room and each finds a place elsewhere.
fn try_set(
    pod: &str,
    quick: &QuickFit<'_>,
    node: usize,
    set: &[usize],
    work: &mut Work,
    run: &mut Run<'_>,
) -> Option<String> {
    let freed = set.iter().flat_map(|p| work.at[*p].slots.clone());
    if !quick.fits(&without(&work.nodes[node], freed)) {
        return None;
    }
    let before: Vec<At> = set.iter().map(|p| work.at[*p].clone()).collect();
    for &p in set {
        work.uncharge(p);
    }
    let restore = |work: &mut Work| {
        for (i, &p) in set.iter().enumerate() {
            if let Some(n) = before[i].node {
                work.charge(p, n, before[i].slots.clone());
            }
        }
    };
    for &p in set {
        let request = &run.cluster.pods[p].request;
        match work.place(request, &|n| n == node, &[], &|_, _, _| true, 1) {
            Some((n, slots)) => work.charge(p, n, slots),
            None => {
                restore(work);
                let shown = run.cluster.pods[p].shown();
                let at = work.nodes[node].devices.name.clone();
                run.block(at, Constraint::NoRoomElsewhere { pod: shown });
                return None;
            }
        }
    }
    // Placing the set elsewhere never touches `node`; checked anyway, it costs one fit.
    if !quick.fits(&work.nodes[node]) {
        restore(work);
        return None;
    }
    let name = work.nodes[node].devices.name.clone();
    let why = format!("makes room for {pod} on {name}");
    for (i, &p) in set.iter().enumerate() {
        run.record(work, p, &before[i], &why);
    }
    run.close_step(format!("{pod} fits on {name}"), 0);
    Some(name)
}

/// The next k-subset of `0..n` in lexicographic order; false after the last.
fn next_combination(combo: &mut [usize], n: usize) -> bool {
    let k = combo.len();
    for i in (0..k).rev() {
        if combo[i] < n - k + i {
            combo[i] += 1;
            for j in i + 1..k {
                combo[j] = combo[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::next_combination;

    #[test]
    fn combinations_are_all_k_subsets_once() {
        for n in 1..7usize {
            for k in 1..=n {
                let mut combo: Vec<usize> = (0..k).collect();
                let mut seen = vec![combo.clone()];
                while next_combination(&mut combo, n) {
                    seen.push(combo.clone());
                }
                let binomial = (0..k).fold(1usize, |acc, i| acc * (n - i) / (i + 1));
                assert_eq!(seen.len(), binomial, "n={n} k={k}");
                let mut sorted = seen.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted, seen, "lexicographic and distinct");
            }
        }
    }
}
