//! One container's GPUs of one vendor on one node: each GPU of the vendor is judged
//! ([`check`]), the eligible ones are ordered by the GPU policy and the first are taken,
//! honouring NUMA and XGMI binding.
//!
//! Filter runs this for every GPU of every node for every pod (8 M times a 1,000-pod
//! spread run over 1,000 nodes × 8 GPUs), so the common request — one GPU, no binding — is
//! a single pass keeping the best GPU so far, with no list and no allocation; refusal
//! reasons are counted in a fixed array and spelt out only when the node is refused.
//! Every answer is the one the earlier, allocating version gave (`fit_reference.rs`, test
//! `fit_equivalence_tests`).

use std::cmp::Ordering;

use hami_protocol::names::Vendor;
use hami_protocol::requests::{DeviceRequest, amd_cu_count};
use hami_protocol::selection::{DeviceSelector, GpuPolicyKind};

use super::{FitRequest, Reason, Refusal, refusal};
use crate::snapshot::{Gpu, GpuUsage};

/// A GPU that passed [`check`], with what the request takes on it and its policy score.
#[derive(Debug, Clone, Copy)]
pub(super) struct Eligible {
    pub(super) gpu: usize,
    pub(super) mem: u64,
    pub(super) cores: u64,
    score: f64,
}

/// Buffers one thread reuses from node to node (their capacity, never their contents).
#[derive(Debug, Default)]
pub(super) struct DeviceScratch {
    eligible: Vec<Eligible>,
    /// The GPUs taken by the last successful [`fit_devices`], in device-list order.
    pub(super) chosen: Vec<Eligible>,
}

/// How many GPUs were refused for each [`Reason`], indexed by declaration order. A reason
/// is named once given, even with a count of 0 (binding with no GPU asked and none
/// eligible says `0/n NumaNotFit`, as it always did).
#[derive(Default)]
struct ReasonCounts {
    counts: [usize; Reason::ALL.len()],
    given: [bool; Reason::ALL.len()],
}

impl ReasonCounts {
    fn add(&mut self, reason: Reason, n: usize) {
        self.counts[reason as usize] += n;
        self.given[reason as usize] = true;
    }

    /// Labels in declaration order; text `"<n>/<m> <Reason>"` sorted by name, joined by
    /// `", "` (the reference's format).
    fn refusal(&self, considered: usize) -> Refusal {
        let given: Vec<(Reason, usize)> = Reason::ALL
            .into_iter()
            .filter(|r| self.given[*r as usize])
            .map(|r| (r, self.counts[r as usize]))
            .collect();
        let mut by_name: Vec<(&str, usize)> = given.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        by_name.sort();
        Refusal {
            labels: given.iter().map(|(r, _)| r.as_str()).collect(),
            text: by_name
                .iter()
                .map(|(reason, n)| format!("{n}/{considered} {reason}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Memory (MiB) and cores (AMD: CUs, NVIDIA: percent) a request takes on `gpu`.
pub fn demand(gpu: &Gpu, request: &DeviceRequest) -> (u64, u64) {
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

/// Judges the GPUs of one vendor for one request: what is the same for every GPU is
/// worked out once (whether the pod has type or id rules at all), and what a request takes
/// on a GPU is remembered for the last GPU model seen (a node's GPUs are mostly alike).
pub(super) struct Judge<'a> {
    request: &'a DeviceRequest,
    selector: &'a DeviceSelector,
    type_rules: bool,
    uuid_rules: bool,
    mutex: bool,
    /// The last GPU model's (vendor, MiB, cores, CUs per WGP) and [`demand`] on it.
    last: Option<(DemandKey, (u64, u64))>,
}

type DemandKey = (Vendor, u64, u32, Option<u32>);

impl<'a> Judge<'a> {
    pub(super) fn new(
        request: &'a DeviceRequest,
        selector: &'a DeviceSelector,
        mutex: bool,
    ) -> Self {
        Self {
            request,
            selector,
            type_rules: !selector.use_types.is_empty() || !selector.nouse_types.is_empty(),
            uuid_rules: !selector.use_uuids.is_empty() || !selector.nouse_uuids.is_empty(),
            mutex,
            last: None,
        }
    }

    /// [`demand`] of the request on `gpu`.
    fn demand(&mut self, gpu: &Gpu) -> (u64, u64) {
        let info = &gpu.info;
        let key = (
            gpu.vendor,
            info.devmem,
            info.devcore,
            info.custom_info.cu_per_wgp,
        );
        match self.last {
            Some((last, taken)) if last == key => taken,
            _ => {
                let taken = demand(gpu, self.request);
                self.last = Some((key, taken));
                taken
            }
        }
    }

    /// Whether the request fits `gpu` with `u` taken: what it takes there, or why not (the
    /// first reason in this order).
    pub(super) fn check(
        &mut self,
        gpu: &Gpu,
        u: &GpuUsage,
        held_whole: bool,
    ) -> Result<(u64, u64), Reason> {
        let info = &gpu.info;
        if !info.health {
            return Err(Reason::CardNotHealth);
        }
        // Without rules every type and id is allowed (as the selector itself answers).
        if self.type_rules && !self.selector.type_allowed(&info.device_type) {
            return Err(Reason::CardTypeMismatch);
        }
        if self.uuid_rules && !self.selector.uuid_allowed(&info.id) {
            return Err(Reason::CardUuidMismatch);
        }
        // Before the share count: a held card is also "full", but the user needs to know why.
        if held_whole {
            return Err(Reason::CardHeldWhole);
        }
        if u.used >= info.count {
            return Err(Reason::CardTimeSlicingExhausted);
        }
        if self.mutex && u.used > 0 {
            return Err(Reason::ExclusiveDeviceAllocateConflict);
        }
        let (mem, cores) = self.demand(gpu);
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
}

pub(super) fn ratio(part: f64, total: f64) -> f64 {
    if total > 0.0 { part / total } else { 0.0 }
}

/// Ordering key of a GPU under the policy: the device score with the request included.
fn device_score(gpu: &Gpu, u: &GpuUsage, mem: u64, cores: u64) -> f64 {
    let info = &gpu.info;
    10.0 * (ratio(f64::from(u.used) + 1.0, f64::from(info.count))
        + ratio((u.cores + cores) as f64, f64::from(info.devcore))
        + ratio((u.mem_mib + mem) as f64, info.devmem as f64))
}

/// Chooses `request.count` GPUs of `vendor` for one container: on success they are in
/// `scratch.chosen`, in the order the device list gets them.
pub(super) fn fit_devices(
    gpus: &[Gpu],
    usage: &[GpuUsage],
    held_whole: &[bool],
    vendor: Vendor,
    request: &DeviceRequest,
    req: &FitRequest<'_>,
    scratch: &mut DeviceScratch,
) -> Result<(), Refusal> {
    let candidates = gpus.iter().filter(|g| g.vendor == vendor).count();
    let want = request.count as usize;
    if want > candidates {
        return Err(Refusal {
            labels: vec![refusal::NODE_INSUFFICIENT_DEVICE],
            text: refusal::NODE_INSUFFICIENT_DEVICE.to_owned(),
        });
    }
    let selector = req.selectors.get(vendor);
    let mut judge = Judge::new(
        request,
        selector,
        req.gpu_policy.kind == GpuPolicyKind::Mutex,
    );
    let binpack = req.gpu_policy.kind == GpuPolicyKind::Binpack;
    let numa = |i: usize| gpus[i].info.numa;
    let policy_order = |a: &Eligible, b: &Eligible| {
        let by_score = if binpack {
            b.score.total_cmp(&a.score)
        } else {
            a.score.total_cmp(&b.score)
        };
        by_score
            .then(numa(a.gpu).cmp(&numa(b.gpu)))
            .then(a.gpu.cmp(&b.gpu))
    };
    let link = selector.link_bind && want > 1;
    let unbound = !link && !selector.numa_bind && !req.gpu_policy.numa;
    let mut reasons = ReasonCounts::default();
    let eligible = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.vendor == vendor)
        .filter_map(|(i, gpu)| {
            let held = held_whole.get(i).copied().unwrap_or(false);
            match judge.check(gpu, &usage[i], held) {
                Ok((mem, cores)) => Some(Eligible {
                    gpu: i,
                    mem,
                    cores,
                    score: device_score(gpu, &usage[i], mem, cores),
                }),
                Err(reason) => {
                    reasons.add(reason, 1);
                    None
                }
            }
        });
    scratch.chosen.clear();
    // One GPU, no binding (the common request): the first in policy order, kept while
    // walking the GPUs (the order is total: the GPU index breaks every tie).
    if unbound && want == 1 {
        let best = eligible.reduce(|best, e| match policy_order(&e, &best) {
            Ordering::Less => e,
            _ => best,
        });
        return match best {
            Some(best) => {
                scratch.chosen.push(best);
                Ok(())
            }
            None => Err(reasons.refusal(candidates)),
        };
    }
    scratch.eligible.clear();
    scratch.eligible.extend(eligible);
    let eligible = &mut scratch.eligible;
    eligible.sort_by(policy_order);
    if unbound && eligible.len() >= want {
        // No binding: the first `want` in policy order.
        scratch.chosen.extend_from_slice(&eligible[..want]);
        return Ok(());
    }
    let order: Vec<usize> = eligible.iter().map(|e| e.gpu).collect();
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
        Some(chosen) => {
            scratch.chosen.extend(
                chosen
                    .into_iter()
                    .filter_map(|i| eligible.iter().find(|e| e.gpu == i).copied()),
            );
            Ok(())
        }
        None => {
            if order.len() >= want {
                // Enough GPUs fit on their own; the binding constraint ruled them out.
                reasons.add(binding_reason, order.len());
            }
            Err(reasons.refusal(candidates))
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
