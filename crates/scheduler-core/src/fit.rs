//! The fitting core: which node, and which GPUs of it, each container of a pod gets
//! (SPEC §3). Plain functions over plain data; the HTTP filter, the demo and the what-if
//! planner all call [`filter`].
//!
//! Per node: sidecars and app containers are fitted cumulatively (they run together); each
//! init container is fitted alone on top of the sidecars (init containers run one after
//! another). Per container and vendor, the node's GPUs of that vendor are ordered by the
//! GPU policy, each is checked (health, type/uuid filters, shares, mutex, memory, cores),
//! and the first eligible ones are taken, honouring NUMA and XGMI binding. The node score
//! counts the request (the reference's score silently ignores it).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use hami_protocol::device_list::{ContainerDevice, ContainerDevices};
use hami_protocol::names::Vendor;
use hami_protocol::requests::{ContainerKind, ContainerRequest};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, NodePolicy};

use crate::snapshot::{GpuUsage, NodeSnapshot};

pub use devices::demand;
use devices::{DeviceScratch, Judge, fit_devices, ratio};

/// Why a GPU was not taken. The names are the reference's, so dashboards and runbooks
/// keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Registered unhealthy.
    CardNotHealth,
    /// Excluded by the pod's `use-gputype`/`nouse-gputype`.
    CardTypeMismatch,
    /// Excluded by the pod's `use-gpu-uuid`/`nouse-gpu-uuid`.
    CardUuidMismatch,
    /// Held whole by a pod the scheduler did not place (`hami.io/<vendor>-whole-cards`,
    /// issue 26 item 1): no slice goes on it while that pod runs.
    CardHeldWhole,
    /// Every share of it is taken.
    CardTimeSlicingExhausted,
    /// Someone uses it, and the pod wants it alone (mutex policy, or all NVIDIA SMs).
    ExclusiveDeviceAllocateConflict,
    /// Not enough free memory.
    CardInsufficientMemory,
    /// Not enough free CUs (AMD) or SM percentage (NVIDIA).
    CardInsufficientCore,
    /// NVIDIA: all SMs are reserved and the request reserves none.
    CardComputeUnitsExhausted,
    /// The GPUs that fit are not on one NUMA node (`numa-bind`, or a `numa` policy).
    NumaNotFit,
    /// The GPUs that fit are not XGMI peers of each other (`link-bind`).
    XgmiLinkNotFit,
}

impl Reason {
    /// Every reason, in declaration order (the counter's label set).
    pub const ALL: [Reason; 11] = [
        Reason::CardNotHealth,
        Reason::CardTypeMismatch,
        Reason::CardUuidMismatch,
        Reason::CardHeldWhole,
        Reason::CardTimeSlicingExhausted,
        Reason::ExclusiveDeviceAllocateConflict,
        Reason::CardInsufficientMemory,
        Reason::CardInsufficientCore,
        Reason::CardComputeUnitsExhausted,
        Reason::NumaNotFit,
        Reason::XgmiLinkNotFit,
    ];

    /// The reference's spelling, shown to users and used as the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::CardNotHealth => "CardNotHealth",
            Reason::CardTypeMismatch => "CardTypeMismatch",
            Reason::CardUuidMismatch => "CardUuidMismatch",
            Reason::CardHeldWhole => "CardHeldWhole",
            Reason::CardTimeSlicingExhausted => "CardTimeSlicingExhausted",
            Reason::ExclusiveDeviceAllocateConflict => "ExclusiveDeviceAllocateConflict",
            Reason::CardInsufficientMemory => "CardInsufficientMemory",
            Reason::CardInsufficientCore => "CardInsufficientCore",
            Reason::CardComputeUnitsExhausted => "CardComputeUnitsExhausted",
            Reason::NumaNotFit => "NumaNotFit",
            Reason::XgmiLinkNotFit => "XgmiLinkNotFit",
        }
    }
}

/// Node-level refusal labels, beside the GPU-level [`Reason`]s: the bounded `reason`
/// label set of `hami_scheduler_filter_refusals_total`.
pub mod refusal {
    /// Fewer GPUs of the vendor than the container asks for.
    pub const NODE_INSUFFICIENT_DEVICE: &str = "NodeInsufficientDevice";
    /// The node registered no GPU at all, or the scheduler does not know it.
    pub const NODE_UNREGISTERED: &str = "NodeUnregistered";
    /// The node serves AMD GPUs through the DRA driver (label `hami.io/amd-mode=dra`), as
    /// ResourceSlices, not through the device plugin this extender places pods for.
    pub const NODE_DRA_MODE: &str = "NodeDraMode";
    /// The node registered only another vendor's GPUs.
    pub const NO_VENDOR_GPU: &str = "NoVendorGpu";
    /// A register annotation that does not decode, or a malformed heartbeat.
    pub const REGISTER_INVALID: &str = "RegisterInvalid";
    /// Kubelet reports the vendor's count as 0.
    pub const PLUGIN_NOT_SERVING: &str = "PluginNotServing";
    /// The plugin's heartbeat has not changed for 3 periods.
    pub const PLUGIN_STALE: &str = "PluginStale";
}

/// Every `reason` label the refusal counter can carry.
pub fn refusal_labels() -> Vec<&'static str> {
    let mut all = vec![
        refusal::NODE_INSUFFICIENT_DEVICE,
        refusal::NODE_UNREGISTERED,
        refusal::NODE_DRA_MODE,
        refusal::NO_VENDOR_GPU,
        refusal::REGISTER_INVALID,
        refusal::PLUGIN_NOT_SERVING,
        refusal::PLUGIN_STALE,
    ];
    all.extend(Reason::ALL.iter().map(|r| r.as_str()));
    all
}

/// Why a node does not fit: the text kube-scheduler shows and the counter's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Refusal labels ([`refusal`] constants or [`Reason`] names), one per cause.
    pub labels: Vec<&'static str>,
    /// What kube-scheduler shows, e.g. `2/4 CardInsufficientMemory`.
    pub text: String,
}

/// The include/exclude rules of both vendors for one pod.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// AMD rules.
    pub amd: DeviceSelector,
    /// NVIDIA rules.
    pub nvidia: DeviceSelector,
}

impl Selectors {
    /// The rules of `vendor`.
    pub fn get(&self, vendor: Vendor) -> &DeviceSelector {
        match vendor {
            Vendor::Amd => &self.amd,
            Vendor::Nvidia => &self.nvidia,
        }
    }
}

/// Everything filter needs to know about the pod.
#[derive(Debug, Clone)]
pub struct FitRequest<'a> {
    /// Device-list order: init containers (and sidecars) first, then app containers.
    pub containers: &'a [ContainerRequest],
    /// Which GPUs the pod may use.
    pub selectors: &'a Selectors,
    /// How to choose GPUs on a node.
    pub gpu_policy: GpuPolicy,
    /// How to rank nodes.
    pub node_policy: NodePolicy,
}

impl FitRequest<'_> {
    /// Vendors any container asks for, in [`Vendor::ALL`] order.
    pub fn vendors(&self) -> Vec<Vendor> {
        Vendor::ALL
            .into_iter()
            .filter(|v| self.containers.iter().any(|c| c.get(*v).is_some()))
            .collect()
    }
}

/// Where the pod's containers go on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Per requested vendor, one run per container (D-1: full padding).
    pub runs: BTreeMap<Vendor, Vec<ContainerDevices>>,
    /// 10 × (used/count + cores/total + mem/total) over the node's GPUs, request included.
    pub score: f64,
}

/// Filter's answer.
#[derive(Debug, Clone, Default)]
pub struct FilterOutcome {
    /// The chosen node and its placement.
    pub chosen: Option<(String, Placement)>,
    /// Every node that does not fit, with its reasons.
    pub failed: BTreeMap<String, String>,
    /// The nodes of `failed` where no eviction can help: the pod does not fit even with
    /// every slice the scheduler placed gone (`cured_by_eviction`).
    pub unresolvable: BTreeSet<String>,
    /// Refused nodes per refusal label (a node counts once under each label it gave).
    pub refusals: BTreeMap<&'static str, u64>,
    /// How many nodes fit.
    pub fitting: usize,
    /// The best few fitting nodes in policy order, with their scores (for events).
    pub top: Vec<(String, f64)>,
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

/// Buffers one thread reuses from node to node: once they have grown, fitting a node
/// allocates nothing, except for a refusal's text, NUMA or XGMI binding, and the score of
/// a pod with init containers.
#[derive(Debug, Default)]
struct Scratch {
    devices: DeviceScratch,
    /// The picks of the last successful fit.
    picks: Vec<Pick>,
    /// Several containers: what runs together so far (the node plus sidecars and apps).
    concurrent: Vec<GpuUsage>,
    /// Several containers: what an init container runs beside (the node plus sidecars).
    init_base: Vec<GpuUsage>,
    /// Several containers: one init container's working copy of `init_base`.
    working: Vec<GpuUsage>,
    /// The node with every slice gone, for [`cured_by_eviction`].
    idle: Vec<GpuUsage>,
}

/// Fits the pod on every node and picks one by the node policy (ties: smallest name).
pub fn filter<'a>(
    nodes: impl IntoIterator<Item = &'a NodeSnapshot>,
    req: &FitRequest<'_>,
) -> FilterOutcome {
    let nodes: Vec<&NodeSnapshot> = nodes.into_iter().collect();
    let prepared = prepare(req);
    // Only the score is kept per node; the chosen node's GPUs are fitted again at the end
    // (the fit is a pure function: the same picks). A refusal is classified where it is
    // made, so the re-fit on the idle node runs on the same threads.
    type Fitted = Result<f64, (Refusal, bool)>;
    let fit_all = |chunk: &[&NodeSnapshot]| -> Vec<Fitted> {
        let mut scratch = Scratch::default();
        chunk
            .iter()
            .map(|node| {
                fit_picks(node, &node.usage, req, &prepared, &mut scratch).map_err(|refusal| {
                    let cured = cured_by_eviction(node, &refusal, req, &prepared, &mut scratch);
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
    let mut best: Option<(usize, f64)> = None;
    // Policy order of fitting nodes (ties: smaller name first).
    let before = |a: &(usize, f64), b: &(usize, f64)| {
        let by_score = match req.node_policy {
            NodePolicy::Binpack => b.1.total_cmp(&a.1),
            NodePolicy::Spread => a.1.total_cmp(&b.1),
        };
        by_score.then_with(|| nodes[a.0].devices.name.cmp(&nodes[b.0].devices.name))
    };
    // Only the best few are named: kept in order while walking the nodes (most are
    // dismissed by one comparison with the last), not a selection over every node.
    let mut top: Vec<(usize, f64)> = Vec::with_capacity(TOP + 1);
    for (i, result) in results.into_iter().enumerate() {
        let name = &nodes[i].devices.name;
        match result {
            Ok(score) => {
                outcome.fitting += 1;
                let entry = (i, score);
                if top.len() < TOP || top.last().is_some_and(|last| before(&entry, last).is_lt()) {
                    let at = top.partition_point(|t| before(t, &entry).is_le());
                    top.insert(at, entry);
                    top.truncate(TOP);
                }
                let better = match &best {
                    None => true,
                    Some((b, best_score)) => {
                        let order = match req.node_policy {
                            NodePolicy::Binpack => score.total_cmp(best_score),
                            NodePolicy::Spread => best_score.total_cmp(&score),
                        };
                        order == Ordering::Greater
                            || (order == Ordering::Equal && name < &nodes[*b].devices.name)
                    }
                };
                if better {
                    best = Some((i, score));
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
    outcome.top = top
        .iter()
        .map(|(i, s)| (nodes[*i].devices.name.clone(), *s))
        .collect();
    // Device lists are written for the chosen node only.
    outcome.chosen = best.and_then(|(i, _)| {
        let node = nodes[i];
        let mut scratch = Scratch::default();
        let score = fit_picks(node, &node.usage, req, &prepared, &mut scratch).ok()?;
        Some((
            node.devices.name.clone(),
            placement(node, req, &prepared, &scratch.picks, score),
        ))
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
    scratch: &mut Scratch,
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
    let mut idle = std::mem::take(&mut scratch.idle);
    idle.clear();
    idle.resize(node.devices.gpus.len(), GpuUsage::default());
    let cured = fit_picks(node, &idle, req, prepared, scratch).is_ok();
    scratch.idle = idle;
    cured
}

/// Fits the pod on one node.
pub fn fit_node(node: &NodeSnapshot, req: &FitRequest<'_>) -> Result<Placement, String> {
    let prepared = prepare(req);
    let mut scratch = Scratch::default();
    let score = fit_picks(node, &node.usage, req, &prepared, &mut scratch).map_err(|r| r.text)?;
    Ok(placement(node, req, &prepared, &scratch.picks, score))
}

/// Fits the pod on `node` with `usage` taken (the node's own, or none): the score, with
/// the picks in `scratch.picks`.
fn fit_picks(
    node: &NodeSnapshot,
    usage: &[GpuUsage],
    req: &FitRequest<'_>,
    prepared: &Prepared,
    scratch: &mut Scratch,
) -> Result<f64, Refusal> {
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
    let gpus = &node.devices.gpus;
    let held = &node.held_whole;
    let in_container = |container: &ContainerRequest, r: Refusal| Refusal {
        labels: r.labels,
        text: format!("container {}: {}", container.name, r.text),
    };
    let Scratch {
        devices,
        picks,
        concurrent,
        init_base,
        working,
        ..
    } = scratch;
    picks.clear();
    if let [only] = prepared.order[..] {
        // One container (the common pod): it is fitted on the node's usage as it is, so no
        // working copy per node. Its vendors' GPUs are disjoint and one request takes
        // distinct GPUs, so no pick changes what another sees.
        let container = &req.containers[only];
        for vendor in &prepared.vendors {
            let Some(request) = container.get(*vendor) else {
                continue;
            };
            fit_devices(gpus, usage, held, *vendor, request, req, devices)
                .map_err(|r| in_container(container, r))?;
            picks.extend(devices.chosen.iter().map(|e| Pick {
                container: only,
                vendor: *vendor,
                gpu: e.gpu,
                mem: e.mem,
                cores: e.cores,
            }));
        }
        return Ok(placement_score(node, usage, req, picks));
    }
    concurrent.clear();
    concurrent.extend_from_slice(usage);
    // Fresh copy of what runs beside the init containers: the node plus the sidecars
    // (fitted first), taken when the first init container comes.
    let mut init_base_taken = false;
    for &i in &prepared.order {
        let container = &req.containers[i];
        let is_init = container.kind == ContainerKind::Init;
        let working: &mut Vec<GpuUsage> = if is_init {
            if !init_base_taken {
                init_base.clear();
                init_base.extend_from_slice(concurrent);
                init_base_taken = true;
            }
            working.clear();
            working.extend_from_slice(init_base);
            working
        } else {
            concurrent
        };
        for vendor in &prepared.vendors {
            let Some(request) = container.get(*vendor) else {
                continue;
            };
            fit_devices(gpus, working, held, *vendor, request, req, devices)
                .map_err(|r| in_container(container, r))?;
            for e in &devices.chosen {
                let u = &mut working[e.gpu];
                u.used = u.used.saturating_add(1);
                u.mem_mib = u.mem_mib.saturating_add(e.mem);
                u.cores = u.cores.saturating_add(e.cores);
                picks.push(Pick {
                    container: i,
                    vendor: *vendor,
                    gpu: e.gpu,
                    mem: e.mem,
                    cores: e.cores,
                });
            }
        }
    }
    Ok(placement_score(node, usage, req, picks))
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

/// The node score with the pod's picks charged as [`crate::usage::collapse`] would charge
/// them: init containers at their peak, the others summed.
fn placement_score(
    node: &NodeSnapshot,
    usage: &[GpuUsage],
    req: &FitRequest<'_>,
    picks: &[Pick],
) -> f64 {
    let (mut used, mut count, mut cores, mut total_cores, mut mem, mut total_mem) =
        (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
    for (gpu, u) in node.devices.gpus.iter().zip(usage) {
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

#[path = "fit_devices.rs"]
mod devices;

#[path = "fit_quick.rs"]
pub mod quick;

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fit_reference.rs"]
mod reference;

#[cfg(test)]
#[path = "fit_equivalence_tests.rs"]
mod equivalence_tests;
