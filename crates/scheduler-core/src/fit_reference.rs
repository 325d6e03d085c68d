//! Filter's fit as it stood before stop 38 (fit.rs at 3a640bd), kept verbatim for tests
//! only: `fit_equivalence_tests` runs the current [`super::filter`] and [`super::fit_node`]
//! against these on random nodes and pods and asserts the same answers (node, GPUs, score,
//! refusal texts and labels, top nodes, unresolvable nodes). Do not "improve" this copy:
//! it is the yardstick the faster code is held to.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use hami_protocol::device_list::ContainerDevice;
use hami_protocol::device_list::ContainerDevices;
use hami_protocol::names::Vendor;
use hami_protocol::requests::{ContainerKind, DeviceRequest, amd_cu_count};
use hami_protocol::selection::{DeviceSelector, GpuPolicyKind, NodePolicy};

use super::{FilterOutcome, FitRequest, Placement, Reason, Refusal, refusal};
use crate::snapshot::{Gpu, GpuUsage, NodeSnapshot};

/// `"<n>/<m> <Reason>"` per reason, sorted, joined by `", "` (the reference's format).
fn format_reasons(reasons: &BTreeMap<Reason, usize>, considered: usize) -> String {
    let mut parts: Vec<(&str, usize)> = reasons.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    parts.sort();
    parts
        .iter()
        .map(|(reason, n)| format!("{n}/{considered} {reason}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One GPU given to one container.
#[derive(Debug, Clone, Copy)]
struct Pick {
    container: usize,
    vendor: Vendor,
    gpu: usize,
    mem: u64,
    cores: u64,
}

/// What is the same for every node: the vendors asked for and the fitting order of the
/// containers (sidecars, then init containers, then app containers).
struct Prepared {
    vendors: Vec<Vendor>,
    order: Vec<usize>,
}

fn prepare(req: &FitRequest<'_>) -> Prepared {
    let rank = |kind: ContainerKind| match kind {
        ContainerKind::Sidecar => 0,
        ContainerKind::Init => 1,
        ContainerKind::App => 2,
    };
    let mut order: Vec<usize> = (0..req.containers.len()).collect();
    order.sort_by_key(|i| rank(req.containers[*i].kind));
    Prepared {
        vendors: req.vendors(),
        order,
    }
}

/// Fitting nodes named in [`FilterOutcome::top`].
const TOP: usize = 5;

/// Below this many nodes one thread is faster than splitting the work.
const PARALLEL_FROM: usize = 256;

/// Fits the pod on every node and picks one by the node policy (ties: smallest name).
pub(super) fn filter<'a>(
    nodes: impl IntoIterator<Item = &'a NodeSnapshot>,
    req: &FitRequest<'_>,
) -> FilterOutcome {
    let nodes: Vec<&NodeSnapshot> = nodes.into_iter().collect();
    let prepared = prepare(req);
    // A refusal is classified where it is made, so the re-fit runs on the same threads.
    type Fitted = Result<(Vec<Pick>, f64), (Refusal, bool)>;
    let fit_all = |chunk: &[&NodeSnapshot]| -> Vec<Fitted> {
        chunk
            .iter()
            .map(|node| {
                fit_picks(node, req, &prepared).map_err(|refusal| {
                    let cured = cured_by_eviction(node, &refusal, req, &prepared);
                    (refusal, cured)
                })
            })
            .collect()
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let results: Vec<Fitted> = if nodes.len() >= PARALLEL_FROM && threads > 1 {
        let size = nodes.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = nodes
                .chunks(size)
                .map(|chunk| scope.spawn(move || fit_all(chunk)))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    } else {
        fit_all(&nodes)
    };
    let mut outcome = FilterOutcome::default();
    let mut best: Option<(usize, Vec<Pick>, f64)> = None;
    let mut scored: Vec<(usize, f64)> = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        let name = &nodes[i].devices.name;
        match result {
            Ok((picks, score)) => {
                outcome.fitting += 1;
                scored.push((i, score));
                let better = match &best {
                    None => true,
                    Some((b, _, best_score)) => {
                        let order = match req.node_policy {
                            NodePolicy::Binpack => score.total_cmp(best_score),
                            NodePolicy::Spread => best_score.total_cmp(&score),
                        };
                        order == Ordering::Greater
                            || (order == Ordering::Equal && name < &nodes[*b].devices.name)
                    }
                };
                if better {
                    best = Some((i, picks, score));
                }
            }
            Err((refusal, cured)) => {
                for label in &refusal.labels {
                    *outcome.refusals.entry(label).or_default() += 1;
                }
                if !cured {
                    outcome.unresolvable.insert(name.clone());
                }
                outcome.failed.insert(name.clone(), refusal.text);
            }
        }
    }
    // Only the best few are named: a partial selection, not a sort of every node.
    let better = |a: &(usize, f64), b: &(usize, f64)| {
        let by_score = match req.node_policy {
            NodePolicy::Binpack => b.1.total_cmp(&a.1),
            NodePolicy::Spread => a.1.total_cmp(&b.1),
        };
        by_score.then_with(|| nodes[a.0].devices.name.cmp(&nodes[b.0].devices.name))
    };
    if scored.len() > TOP {
        scored.select_nth_unstable_by(TOP - 1, better);
        scored.truncate(TOP);
    }
    scored.sort_by(better);
    outcome.top = scored
        .iter()
        .take(TOP)
        .map(|(i, s)| (nodes[*i].devices.name.clone(), *s))
        .collect();
    // Device lists are written for the chosen node only.
    outcome.chosen = best.map(|(i, picks, score)| {
        (
            nodes[i].devices.name.clone(),
            placement(nodes[i], req, &prepared, &picks, score),
        )
    });
    outcome
}

/// Whether evicting pods could make room for the pod on a node that refused it: the
/// pod fits the node with every slice the scheduler placed gone (kube-scheduler offers
/// such a node to preemption as `FailedNodes`, any other as `FailedAndUnresolvableNodes`).
/// Node-level refusals (unregistered, DRA mode, no GPU of the vendor, a bad or stale
/// registration, kubelet's count 0), unhealthy or excluded GPUs, too few GPUs and GPUs too
/// small even when empty are not cured; cards held whole by pods the scheduler did not
/// place stay held (the preempt verb never names those pods).
fn cured_by_eviction(
    node: &NodeSnapshot,
    refusal: &Refusal,
    req: &FitRequest<'_>,
    prepared: &Prepared,
) -> bool {
    let node_level = [
        refusal::NODE_UNREGISTERED,
        refusal::NODE_DRA_MODE,
        refusal::NO_VENDOR_GPU,
        refusal::REGISTER_INVALID,
        refusal::PLUGIN_NOT_SERVING,
        refusal::PLUGIN_STALE,
        refusal::NODE_INSUFFICIENT_DEVICE,
    ];
    if refusal.labels.iter().any(|l| node_level.contains(l))
        || node.usage.iter().all(|u| *u == GpuUsage::default())
    {
        return false;
    }
    let mut empty = NodeSnapshot::idle(node.devices.clone());
    empty.held_whole = node.held_whole.clone();
    fit_picks(&empty, req, prepared).is_ok()
}

/// Fits the pod on one node.
pub(super) fn fit_node(node: &NodeSnapshot, req: &FitRequest<'_>) -> Result<Placement, String> {
    let prepared = prepare(req);
    let (picks, score) = fit_picks(node, req, &prepared).map_err(|r| r.text)?;
    Ok(placement(node, req, &prepared, &picks, score))
}

fn fit_picks(
    node: &NodeSnapshot,
    req: &FitRequest<'_>,
    prepared: &Prepared,
) -> Result<(Vec<Pick>, f64), Refusal> {
    let refuse = |label: &'static str, text: String| Refusal {
        labels: vec![label],
        text,
    };
    for vendor in &prepared.vendors {
        if !node.devices.offers(*vendor) {
            return Err(match node.devices.register_error(*vendor) {
                Some(err) => refuse(node.devices.register_label(*vendor), err.to_owned()),
                // Registered for another vendor only: say which GPUs are missing.
                None if !node.devices.gpus.is_empty() => refuse(
                    refusal::NO_VENDOR_GPU,
                    format!("no {} GPU on this node", vendor.word()),
                ),
                None => refuse(refusal::NODE_UNREGISTERED, "node unregistered".to_owned()),
            });
        }
    }
    let mut picks = Vec::new();
    if let [only] = prepared.order[..] {
        // One container (the common pod): it is fitted on the node's usage as it is, so no
        // working copy per node. Its vendors' GPUs are disjoint and one request takes
        // distinct GPUs, so no pick changes what another sees.
        let container = &req.containers[only];
        for vendor in &prepared.vendors {
            let Some(request) = container.get(*vendor) else {
                continue;
            };
            let chosen =
                fit_devices(node, &node.usage, *vendor, request, req).map_err(|r| Refusal {
                    labels: r.labels,
                    text: format!("container {}: {}", container.name, r.text),
                })?;
            picks.extend(chosen.into_iter().map(|(gpu, mem, cores, _)| Pick {
                container: only,
                vendor: *vendor,
                gpu,
                mem,
                cores,
            }));
        }
        let score = placement_score(node, req, &picks);
        return Ok((picks, score));
    }
    let mut concurrent = node.usage.clone();
    let mut init_base: Option<Vec<GpuUsage>> = None;
    for &i in &prepared.order {
        let container = &req.containers[i];
        let mut working = if container.kind == ContainerKind::Init {
            // Fresh copy of what runs beside it: the node plus the sidecars.
            init_base.get_or_insert_with(|| concurrent.clone()).clone()
        } else {
            std::mem::take(&mut concurrent)
        };
        for vendor in &prepared.vendors {
            let Some(request) = container.get(*vendor) else {
                continue;
            };
            let chosen =
                fit_devices(node, &working, *vendor, request, req).map_err(|r| Refusal {
                    labels: r.labels,
                    text: format!("container {}: {}", container.name, r.text),
                })?;
            for (gpu, mem, cores, _) in chosen {
                let u = &mut working[gpu];
                u.used = u.used.saturating_add(1);
                u.mem_mib = u.mem_mib.saturating_add(mem);
                u.cores = u.cores.saturating_add(cores);
                picks.push(Pick {
                    container: i,
                    vendor: *vendor,
                    gpu,
                    mem,
                    cores,
                });
            }
        }
        if container.kind != ContainerKind::Init {
            concurrent = working;
        }
    }
    let score = placement_score(node, req, &picks);
    Ok((picks, score))
}

fn placement(
    node: &NodeSnapshot,
    req: &FitRequest<'_>,
    prepared: &Prepared,
    picks: &[Pick],
    score: f64,
) -> Placement {
    let n = req.containers.len();
    let mut runs: BTreeMap<Vendor, Vec<ContainerDevices>> = prepared
        .vendors
        .iter()
        .map(|v| (*v, vec![Vec::new(); n]))
        .collect();
    for pick in picks {
        let info = &node.devices.gpus[pick.gpu].info;
        if let Some(vendor_runs) = runs.get_mut(&pick.vendor) {
            vendor_runs[pick.container].push(ContainerDevice {
                uuid: info.id.clone(),
                device_type: match pick.vendor {
                    Vendor::Amd => info.device_type.clone(),
                    Vendor::Nvidia => Vendor::Nvidia.word().to_owned(),
                },
                mem_mib: pick.mem,
                cores: u32::try_from(pick.cores).unwrap_or(u32::MAX),
            });
        }
    }
    Placement { runs, score }
}

/// The node score with the pod's picks charged as [`crate::usage::collapse`] would charge them:
/// init
/// containers at their peak, the others summed.
fn placement_score(node: &NodeSnapshot, req: &FitRequest<'_>, picks: &[Pick]) -> f64 {
    let (mut used, mut count, mut cores, mut total_cores, mut mem, mut total_mem) =
        (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
    for (gpu, u) in node.devices.gpus.iter().zip(&node.usage) {
        used += f64::from(u.used);
        count += f64::from(gpu.info.count);
        cores += u.cores as f64;
        total_cores += f64::from(gpu.info.devcore);
        mem += u.mem_mib as f64;
        total_mem += gpu.info.devmem as f64;
    }
    let is_init = |p: &Pick| req.containers[p.container].kind == ContainerKind::Init;
    if !picks.iter().any(is_init) {
        // The common case: everything runs together, charges simply add up.
        for p in picks {
            used += 1.0;
            cores += p.cores as f64;
            mem += p.mem as f64;
        }
    } else {
        // Per GPU: init containers at their peak, the others summed; the larger counts.
        let gpus = node.devices.gpus.len();
        let mut init = vec![(0u32, 0u64, 0u64); gpus];
        let mut conc = vec![(0u32, 0u64, 0u64); gpus];
        for p in picks {
            if is_init(p) {
                let a = &mut init[p.gpu];
                *a = (1, a.1.max(p.mem), a.2.max(p.cores));
            } else {
                let a = &mut conc[p.gpu];
                *a = (
                    a.0.saturating_add(1),
                    a.1.saturating_add(p.mem),
                    a.2.saturating_add(p.cores),
                );
            }
        }
        for (i, c) in init.iter().zip(&conc) {
            used += f64::from(i.0.max(c.0));
            mem += i.1.max(c.1) as f64;
            cores += i.2.max(c.2) as f64;
        }
    }
    10.0 * (ratio(used, count) + ratio(cores, total_cores) + ratio(mem, total_mem))
}

fn ratio(part: f64, total: f64) -> f64 {
    if total > 0.0 { part / total } else { 0.0 }
}

/// Memory (MiB) and cores (AMD: CUs, NVIDIA: percent) a request takes on `gpu`.
pub(super) fn demand(gpu: &Gpu, request: &DeviceRequest) -> (u64, u64) {
    let mem = request.memory.resolve(gpu.info.devmem);
    let cores = match gpu.vendor {
        // On RDNA whole WGPs, rounded up: what the plugin's CU choice gives.
        Vendor::Amd => u64::from(amd_cu_count(
            request.cores_percent,
            gpu.info.devcore,
            gpu.info.custom_info.cu_per_wgp.unwrap_or(1),
        )),
        Vendor::Nvidia => u64::from(request.cores_percent),
    };
    (mem, cores)
}

fn check(
    gpu: &Gpu,
    u: &GpuUsage,
    held_whole: bool,
    request: &DeviceRequest,
    selector: &DeviceSelector,
    mutex: bool,
) -> Result<(u64, u64), Reason> {
    let info = &gpu.info;
    if !info.health {
        return Err(Reason::CardNotHealth);
    }
    if !selector.type_allowed(&info.device_type) {
        return Err(Reason::CardTypeMismatch);
    }
    if !selector.uuid_allowed(&info.id) {
        return Err(Reason::CardUuidMismatch);
    }
    // Before the share count: a held card is also "full", but the user needs to know why.
    if held_whole {
        return Err(Reason::CardHeldWhole);
    }
    if u.used >= info.count {
        return Err(Reason::CardTimeSlicingExhausted);
    }
    if mutex && u.used > 0 {
        return Err(Reason::ExclusiveDeviceAllocateConflict);
    }
    let (mem, cores) = demand(gpu, request);
    if info.devmem.saturating_sub(u.mem_mib) < mem || mem == 0 && info.devmem == 0 {
        return Err(Reason::CardInsufficientMemory);
    }
    match gpu.vendor {
        Vendor::Amd => {
            // 0 CUs: the GPU has none (or no whole WGP) to give.
            if cores == 0 || u64::from(info.devcore).saturating_sub(u.cores) < cores {
                return Err(Reason::CardInsufficientCore);
            }
        }
        Vendor::Nvidia => {
            let total = u64::from(info.devcore);
            if cores >= 100 && u.used > 0 {
                return Err(Reason::ExclusiveDeviceAllocateConflict);
            }
            if cores == 0 && u.cores >= total {
                return Err(Reason::CardComputeUnitsExhausted);
            }
            if total.saturating_sub(u.cores) < cores {
                return Err(Reason::CardInsufficientCore);
            }
        }
    }
    Ok((mem, cores))
}

/// Ordering key of a GPU under the policy: the device score with the request included.
fn device_score(gpu: &Gpu, u: &GpuUsage, mem: u64, cores: u64) -> f64 {
    let info = &gpu.info;
    10.0 * (ratio(f64::from(u.used) + 1.0, f64::from(info.count))
        + ratio((u.cores + cores) as f64, f64::from(info.devcore))
        + ratio((u.mem_mib + mem) as f64, info.devmem as f64))
}

/// Chooses `request.count` GPUs of `vendor` for one container.
fn fit_devices(
    node: &NodeSnapshot,
    usage: &[GpuUsage],
    vendor: Vendor,
    request: &DeviceRequest,
    req: &FitRequest<'_>,
) -> Result<Vec<(usize, u64, u64, f64)>, Refusal> {
    let gpus = &node.devices.gpus;
    let candidates = gpus.iter().filter(|g| g.vendor == vendor).count();
    let want = request.count as usize;
    if want > candidates {
        return Err(Refusal {
            labels: vec![refusal::NODE_INSUFFICIENT_DEVICE],
            text: refusal::NODE_INSUFFICIENT_DEVICE.to_owned(),
        });
    }
    let selector = req.selectors.get(vendor);
    let mutex = req.gpu_policy.kind == GpuPolicyKind::Mutex;
    let mut reasons: BTreeMap<Reason, usize> = BTreeMap::new();
    // (gpu index, mem, cores, score)
    let mut eligible: Vec<(usize, u64, u64, f64)> = Vec::with_capacity(candidates);
    for i in (0..gpus.len()).filter(|i| gpus[*i].vendor == vendor) {
        let held = node.held_whole.get(i).copied().unwrap_or(false);
        match check(&gpus[i], &usage[i], held, request, selector, mutex) {
            Ok((mem, cores)) => {
                eligible.push((i, mem, cores, device_score(&gpus[i], &usage[i], mem, cores)))
            }
            Err(reason) => *reasons.entry(reason).or_default() += 1,
        }
    }
    let numa = |i: usize| gpus[i].info.numa;
    let policy_order = |a: &(usize, u64, u64, f64), b: &(usize, u64, u64, f64)| {
        let by_score = match req.gpu_policy.kind {
            GpuPolicyKind::Binpack => b.3.total_cmp(&a.3),
            GpuPolicyKind::Spread | GpuPolicyKind::Mutex => a.3.total_cmp(&b.3),
        };
        by_score.then(numa(a.0).cmp(&numa(b.0))).then(a.0.cmp(&b.0))
    };
    let link = selector.link_bind && want > 1;
    let unbound = !link && !selector.numa_bind && !req.gpu_policy.numa;
    // One GPU, no binding (the common request): the first in policy order, unsorted (the
    // order is total: the GPU index breaks every tie).
    if unbound
        && want == 1
        && let Some(best) = eligible.iter().copied().min_by(policy_order)
    {
        return Ok(vec![best]);
    }
    eligible.sort_by(policy_order);
    if unbound && eligible.len() >= want {
        // No binding: the first `want` in policy order (no further allocation).
        eligible.truncate(want);
        return Ok(eligible);
    }
    let order: Vec<usize> = eligible.iter().map(|e| e.0).collect();
    let binding_reason = if link {
        Reason::XgmiLinkNotFit
    } else {
        Reason::NumaNotFit
    };
    let chosen = if selector.numa_bind {
        pick_in_numa_groups(gpus, &order, want, link)
    } else if req.gpu_policy.numa {
        // `numa` in the policy is a preference: fall back to any GPUs.
        pick_in_numa_groups(gpus, &order, want, link).or_else(|| pick(gpus, &order, want, link))
    } else {
        pick(gpus, &order, want, link)
    };
    match chosen {
        Some(chosen) => Ok(chosen
            .into_iter()
            .filter_map(|i| eligible.iter().find(|e| e.0 == i).copied())
            .collect()),
        None => {
            if order.len() >= want {
                // Enough GPUs fit on their own; the binding constraint ruled them out.
                *reasons.entry(binding_reason).or_default() += order.len();
            }
            Err(Refusal {
                labels: reasons.keys().map(|r| r.as_str()).collect(),
                text: format_reasons(&reasons, candidates),
            })
        }
    }
}

/// The first `want` GPUs of `order`, or with `link`, the first `want` that are pairwise
/// XGMI peers, trying each start in order.
fn pick(gpus: &[Gpu], order: &[usize], want: usize, link: bool) -> Option<Vec<usize>> {
    if order.len() < want {
        return None;
    }
    if !link {
        return Some(order[..want].to_vec());
    }
    for (s, &start) in order.iter().enumerate() {
        let mut chosen = vec![start];
        for &next in &order[s + 1..] {
            if chosen.iter().all(|&c| xgmi_peers(&gpus[c], &gpus[next])) {
                chosen.push(next);
                if chosen.len() == want {
                    return Some(chosen);
                }
            }
        }
    }
    None
}

/// All GPUs on one NUMA node: groups are tried in the order of their best GPU.
fn pick_in_numa_groups(
    gpus: &[Gpu],
    order: &[usize],
    want: usize,
    link: bool,
) -> Option<Vec<usize>> {
    let mut tried = Vec::new();
    for &first in order {
        let numa = gpus[first].info.numa;
        if tried.contains(&numa) {
            continue;
        }
        tried.push(numa);
        let group: Vec<usize> = order
            .iter()
            .copied()
            .filter(|i| gpus[*i].info.numa == numa)
            .collect();
        if let Some(chosen) = pick(gpus, &group, want, link) {
            return Some(chosen);
        }
    }
    None
}

fn xgmi_peers(a: &Gpu, b: &Gpu) -> bool {
    let listed = |x: &Gpu, y: &Gpu| match &y.info.custom_info.pci_bdf {
        Some(bdf) => x
            .info
            .custom_info
            .xgmi_peers
            .iter()
            .any(|p| p.eq_ignore_ascii_case(bdf)),
        None => false,
    };
    listed(a, b) || listed(b, a)
}
