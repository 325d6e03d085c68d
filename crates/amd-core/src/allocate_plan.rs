//! The Allocate decision as a pure function (SPEC §4, §2.6, D-5): from the pod's
//! annotations, the node's devices, the CUs other pods hold and kubelet's request, to the
//! container response and the annotation updates. No I/O: the shell reads and writes.

use std::collections::BTreeSet;

use hami_protocol::cu_allocated::{CuAllocatedError, CuAllocation};
use hami_protocol::cu_list::{CuListError, CuSet, HsaCuMask};
use hami_protocol::device_list::{ContainerDevice, decode_pod_devices};
use hami_protocol::hook_config::{self, HookConfig};
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::memory_limit::MibLimit;
use hami_protocol::names::AMD;
use hami_protocol::names::env;
use hami_protocol::node_register::DeviceMode;
use hami_protocol::requests::ContainerKind;
use hami_protocol::run_mapping::{RunError, take_next_run};

use crate::cu_choice::{CuChoiceError, GpuSlice, choose_common_cus, choose_cus};
pub use crate::dmem_plan::{DmemLimit, container_dmem};
pub use crate::rocr_visible::rocr_visible_devices;
use hami_amd_discovery::registration::RegisteredDevice;

/// Where the hook lives inside containers (the reference's path).
pub const HOOK_CONTAINER_PATH: &str = "/usr/local/vgpu/libamvgpu.so";

/// Where a sliced container sees its own accounting directory; the hook's shared region
/// (`HIP_DEVICE_MEMORY_SHARED_CACHE`) lives in it, so the monitor finds it on the host at
/// `<cache_host_root>/<pod uid>_<container>/` (SPEC §7).
pub const CACHE_CONTAINER_DIR: &str = "/usr/local/vgpu/cache";

/// File name of the region inside that directory (`.cache`, as the monitor expects).
pub const CACHE_FILE: &str = "hipdevshr.cache";

/// Directory under the cache root holding each sliced container's hook config (the
/// protocol's, which the monitor reads too).
pub const HOOK_CONFIG_DIR: &str = hami_protocol::hook_config::HOST_DIR;

/// Settings of the planner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSettings {
    /// Host path of `libamvgpu.so` (`$HOST_HOOK_PATH/vgpu/libamvgpu.so`).
    pub hook_host_path: String,
    /// Container path of the hook (`LD_AUDIT` value and mount target).
    pub hook_container_path: String,
    /// `-device_memory_scaling` > 1: set `HIP_OVERSUBSCRIBE`.
    pub oversubscribe: bool,
    /// Host directory holding one accounting directory per sliced container
    /// (`$HOST_HOOK_PATH/vgpu/containers`), read by the monitor.
    pub cache_host_root: String,
    /// `--cdi`: answer with CDI device names instead of device nodes (`cdi.rs`).
    pub cdi: bool,
}

impl Default for PlanSettings {
    fn default() -> Self {
        Self {
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: HOOK_CONTAINER_PATH.into(),
            oversubscribe: false,
            cache_host_root: "/usr/local/vgpu/containers".into(),
            cdi: false,
        }
    }
}

// The container plan is vendor-neutral (shared with the NVIDIA plugin).
pub use hami_protocol::container_plan::{ContainerPlan, DevicePath, MountPlan};

/// The annotations of the pod that Allocate reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAnnotations {
    /// `hami.io/amd-devices-to-allocate`: the runs still to allocate.
    pub to_allocate: Option<String>,
    /// This pod's own `hami.io/amd-cu-allocated` (earlier containers).
    pub cu_allocated: Option<String>,
    /// The pod's uid and its container names in device-list order (init first), to name
    /// each sliced container's accounting directory; without them no directory is given.
    pub pod_uid: Option<String>,
    /// The pod's container names, in device-list order.
    pub containers: Vec<String>,
    /// The kinds of those containers, and the pod's whole decision
    /// (`hami.io/amd-devices-allocated`): an app container may reuse the CUs of the pod's
    /// init containers (they have finished), as the scheduler charges them at their peak.
    pub kinds: Vec<ContainerKind>,
    /// `hami.io/amd-devices-allocated`: the pod's whole decision.
    pub allocated: Option<String>,
    /// Each container's `AMD_TASK_PRIORITY` as its spec sets it ([`task_priority`]), in
    /// device-list order: pinned in its hook config (issue 26 item 2).
    pub task_priorities: Vec<Option<String>>,
}

/// The container's `AMD_TASK_PRIORITY` when its spec gives it a plain `value` (the user's,
/// SPEC §2.6). `None` when unset, or set through `valueFrom`/`envFrom` (which the plugin
/// does not read): the hook then keeps the value the process started with.
pub fn task_priority(container: &k8s_openapi::api::core::v1::Container) -> Option<String> {
    container
        .env
        .iter()
        .flatten()
        .rfind(|e| e.name == env::AMD_TASK_PRIORITY)?
        .value
        .clone()
        // A value the hook config cannot hold (a line break) is left to the hook's fallback.
        .filter(|v| !v.contains(['\0', '\n', '\r']))
}

/// Whether the pod's CUs on `device` are all its init containers' (finished before this
/// app container starts), so this container may reuse them: the container is an app
/// container and no earlier app container or sidecar of the pod uses the device.
fn own_cus_reusable(pod: &PodAnnotations, run_index: usize, device: &str) -> bool {
    let Some(runs) = pod
        .allocated
        .as_deref()
        .and_then(|t| decode_pod_devices(t).ok())
    else {
        return false;
    };
    if runs.len() != pod.kinds.len() || pod.kinds.get(run_index) != Some(&ContainerKind::App) {
        return false;
    }
    runs.iter()
        .zip(&pod.kinds)
        .take(run_index)
        .all(|(run, kind)| *kind == ContainerKind::Init || run.iter().all(|d| d.uuid != device))
}

/// The full outcome of one container's Allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatePlan {
    /// Env, devices and mounts for kubelet.
    pub container: ContainerPlan,
    /// Which run (container in device-list order) this request was mapped to.
    pub run_index: usize,
    /// New `hami.io/amd-devices-to-allocate` (this run emptied, padding kept).
    pub to_allocate: String,
    /// New `hami.io/amd-cu-allocated` of the pod.
    pub cu_allocated: String,
    /// Host directory to create (mode 0777) before answering: the container's accounting
    /// directory, mounted read-write.
    pub cache_dir: Option<String>,
    /// Host path of the container's hook config and its contents (issue 14 item 7): the
    /// shell writes it (read-only) before answering; the hook reads it before any variable.
    pub hook_config: Option<(String, HookConfig)>,
    /// CUs chosen per device id, in allocation order.
    pub chosen: Vec<(String, CuSet)>,
    /// True when no run is left: the pod is fully allocated (`bind-phase=success`).
    pub last: bool,
    /// dmem limits of the VRAM regions the container's devices use.
    pub dmem: Vec<DmemLimit>,
    /// True for a whole-card response (no hook, no mask).
    pub whole_cards: bool,
}

/// Why Allocate must fail; each names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No run to take (not scheduled, malformed list, nothing left, count mismatch).
    /// The pod's device list cannot be mapped to this request.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The pod's own `hami.io/amd-cu-allocated` cannot be read.
    #[error("hami.io/amd-cu-allocated of the pod is malformed: {0}")]
    CuAllocated(#[from] CuAllocatedError),
    /// The decision names a device this node does not offer.
    #[error(
        "device {id} of the scheduler's decision is not offered on this node (stale decision or GPU gone)"
    )]
    UnknownDevice {
        /// The registered device id.
        id: String,
    },
    /// No CUs could be chosen on a device.
    #[error("device {id}: {source}")]
    Cus {
        /// The registered device id.
        id: String,
        /// Why not.
        #[source]
        source: CuChoiceError,
    },
    /// The CU mask of a device cannot be written.
    #[error("device {id}: {source}")]
    Mask {
        /// The registered device id.
        id: String,
        /// Why not.
        #[source]
        source: CuListError,
    },
    /// A kubelet device id that is not a share of an offered device.
    #[error("kubelet device id {0:?} is not offered by this plugin")]
    UnknownKubeletId(String),
    /// Kubelet asked for no device.
    #[error("kubelet asked for no device")]
    EmptyRequest,
    /// A pod not placed by HAMi was given a share of a card HAMi pods slice.
    #[error(
        "kubelet id {kubelet_id} is a share of {device}, which holds slices of HAMi pods: a pod not placed by HAMi gets whole cards only, and only free ones; schedule it with HAMi (amd.com/gpucores/gpumem) or free the card"
    )]
    WholeCardBusy {
        /// The kubelet id given.
        kubelet_id: String,
        /// The card it is a share of.
        device: String,
    },
    /// A pod not placed by HAMi was given two shares of one card.
    #[error(
        "kubelet chose {ids}: {asked} device(s) asked, but they are shares of only {cards} card(s); a pod not placed by HAMi gets one whole card per amd.com/gpu, so retry (kubelet's preferred allocation spreads over cards) or schedule the pod with HAMi"
    )]
    WholeCardShares {
        /// The kubelet ids given.
        ids: String,
        /// Devices asked for.
        asked: usize,
        /// Cards those ids cover.
        cards: usize,
    },
}

/// Plans the Allocate of the pod's next container (D-5).
pub fn plan_allocate(
    pod: &PodAnnotations,
    devices: &[RegisteredDevice],
    others_used: &CuAllocation,
    requested: usize,
    settings: &PlanSettings,
) -> Result<AllocatePlan, PlanError> {
    let next = take_next_run(
        AMD.devices_to_allocate,
        pod.to_allocate.as_deref(),
        requested,
    )?;
    let (run_index, run) = (next.run_index, next.run);
    let mut pod_cus = match pod.cu_allocated.as_deref() {
        Some(t) if !t.trim().is_empty() => CuAllocation::parse(t)?,
        _ => CuAllocation::default(),
    };
    let resolved: Vec<&RegisteredDevice> = run
        .iter()
        .map(|entry| {
            devices
                .iter()
                .find(|d| d.info.id == entry.uuid)
                .ok_or_else(|| PlanError::UnknownDevice {
                    id: entry.uuid.clone(),
                })
        })
        .collect::<Result<_, _>>()?;
    // A hard partition (mode xcp) is one device of count 1: its pod owns all of it, so it
    // is handed over whole whatever share the scheduler wrote (no mask, no hook limit).
    let run: Vec<ContainerDevice> = run
        .iter()
        .zip(&resolved)
        .map(|(entry, dev)| {
            let mut e = entry.clone();
            if dev.info.mode == DeviceMode::Xcp {
                e.cores = dev.info.devcore;
                e.mem_mib = dev.info.devmem;
            }
            e
        })
        .collect();
    let whole_cards = run
        .iter()
        .zip(&resolved)
        .all(|(entry, dev)| entry.cores >= dev.info.devcore && entry.mem_mib >= dev.info.devmem);

    // Other pods' CUs plus what this pod's earlier containers (or devices) already hold;
    // the pod's own CUs on the device, and whether this container may reuse them.
    let avoid = |dev: &RegisteredDevice, pod_cus: &CuAllocation| {
        let id = &dev.info.id;
        let mut used = others_used.0.get(id).cloned().unwrap_or_default();
        let own = pod_cus.0.get(id).cloned();
        // A whole hard partition belongs to the pod: its init container and a later app
        // container may both use it (the scheduler charges init containers at their peak).
        let whole_partition = dev.info.mode == DeviceMode::Xcp;
        let reuse = whole_partition || own_cus_reusable(pod, run_index, id);
        if let Some(own) = &own
            && !reuse
        {
            used = used.union(own);
        }
        (used, own, reuse)
    };
    // Several GPUs: the same CUs on each where some set is free on all, so ROCm 5.x's one
    // global mask can express the slice (`cu_choice::choose_common_cus`).
    let distinct = resolved
        .iter()
        .map(|d| &d.info.id)
        .collect::<BTreeSet<_>>()
        .len()
        == resolved.len();
    let common = if distinct {
        let used: Vec<CuSet> = resolved.iter().map(|d| avoid(d, &pod_cus).0).collect();
        let gpus: Vec<GpuSlice<'_>> = run
            .iter()
            .zip(&resolved)
            .zip(&used)
            .map(|((entry, dev), used)| GpuSlice {
                used,
                devcore: dev.info.devcore,
                count: entry.cores,
                cu_per_wgp: dev.cu_per_wgp,
            })
            .collect();
        choose_common_cus(&gpus)
    } else {
        None
    };
    let mut chosen = Vec::new();
    for (entry, dev) in run.iter().zip(&resolved) {
        let id = &dev.info.id;
        let (used, own, reuse) = avoid(dev, &pod_cus);
        let cus = match &common {
            Some(common) => common.clone(),
            None => choose_cus(&used, dev.info.devcore, entry.cores, dev.cu_per_wgp).map_err(
                |source| PlanError::Cus {
                    id: id.clone(),
                    source,
                },
            )?,
        };
        match own {
            Some(own) if reuse => {
                pod_cus.0.insert(id.clone(), own.union(&cus));
            }
            _ => pod_cus.add(id, &cus)?,
        }
        chosen.push((id.clone(), cus));
    }
    let dmem = if whole_cards {
        Vec::new()
    } else {
        container_dmem(&run, &resolved)
    };

    let mut cache_dir = None;
    let mut hook = None;
    let mut container = cards_plan(&resolved);
    if !whole_cards {
        let visible: Vec<String> = (0..resolved.len()).map(|i| i.to_string()).collect();
        container
            .envs
            .insert(env::HIP_VISIBLE_DEVICES.into(), visible.join(","));
        let mask =
            HsaCuMask::from_sets(chosen.iter().map(|(_, s)| s.clone())).map_err(|source| {
                PlanError::Mask {
                    id: chosen.first().map(|c| c.0.clone()).unwrap_or_default(),
                    source,
                }
            })?;
        container
            .envs
            .insert(env::HSA_CU_MASK.into(), mask.to_string());
        for (i, entry) in run.iter().enumerate() {
            container.envs.insert(
                env::hip_device_memory_limit(i),
                MibLimit(entry.mem_mib).to_string(),
            );
        }
        container
            .envs
            .insert(env::LD_AUDIT.into(), settings.hook_container_path.clone());
        if settings.oversubscribe {
            container
                .envs
                .insert(env::HIP_OVERSUBSCRIBE.into(), "true".into());
        }
        container.mounts.push(MountPlan {
            container_path: settings.hook_container_path.clone(),
            host_path: settings.hook_host_path.clone(),
            read_only: true,
        });
        if let (Some(uid), Some(name)) = (&pod.pod_uid, pod.containers.get(run_index)) {
            let host = format!(
                "{}/{uid}_{name}",
                settings.cache_host_root.trim_end_matches('/')
            );
            container.mounts.push(MountPlan {
                container_path: CACHE_CONTAINER_DIR.into(),
                host_path: host.clone(),
                read_only: false,
            });
            // The region file itself too (the shell creates it): a mount point cannot be
            // unlinked or renamed from inside, so the container cannot start fresh books.
            container.mounts.push(MountPlan {
                container_path: format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}"),
                host_path: format!("{host}/{CACHE_FILE}"),
                read_only: false,
            });
            container.envs.insert(
                env::HIP_DEVICE_MEMORY_SHARED_CACHE.into(),
                format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}"),
            );
            cache_dir = Some(host);
            // The same settings as a read-only file the hook trusts over the environment.
            // ROCm 5.x enforces CUs only through ROC_GLOBAL_CU_MASK, one mask for every
            // device: expressible when all of the container's devices got the same CUs.
            let global = hook_config::shared_cu_set(chosen.iter().map(|(_, s)| s))
                .and_then(hook_config::global_cu_mask);
            if let Some(global) = &global {
                container
                    .envs
                    .insert(hook_config::ROC_GLOBAL_CU_MASK.into(), global.clone());
            }
            let mut config = HookConfig {
                shared_cache: Some(format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}")),
                hsa_cu_mask: Some(mask.to_string()),
                roc_global_cu_mask: global,
                ..HookConfig::default()
            };
            for (i, entry) in run.iter().enumerate() {
                config
                    .memory_limits
                    .insert(i as u32, entry.mem_mib.saturating_mul(1 << 20));
            }
            if settings.oversubscribe {
                config
                    .pinned
                    .insert(env::HIP_OVERSUBSCRIBE.into(), "true".into());
            }
            if let Some(priority) = pod.task_priorities.get(run_index).cloned().flatten() {
                config
                    .pinned
                    .insert(env::AMD_TASK_PRIORITY.into(), priority);
            }
            let path = format!(
                "{}/{HOOK_CONFIG_DIR}/{uid}_{name}.conf",
                settings.cache_host_root.trim_end_matches('/')
            );
            container.mounts.push(MountPlan {
                container_path: hook_config::CONTAINER_PATH.into(),
                host_path: path.clone(),
                read_only: true,
            });
            hook = Some((path, config));
        }
    }
    Ok(AllocatePlan {
        container,
        run_index,
        to_allocate: next.remaining,
        cu_allocated: pod_cus.encode(),
        cache_dir,
        hook_config: hook,
        chosen,
        last: next.last,
        dmem,
        whole_cards,
    })
}

/// Whole-card hand-over for a pod HAMi did not place: each kubelet id names one share of a
/// card, and the container gets one whole card per id (no hook, no mask) — exactly as many
/// cards as kubelet asked for, or an error. A card holding slices (`busy`: device ids with
/// CUs of live pods or in a pending run of a HAMi pod) is never handed out.
pub fn plan_whole_cards(
    devices: &[RegisteredDevice],
    kubelet_ids: &[String],
    busy: &BTreeSet<String>,
) -> Result<ContainerPlan, PlanError> {
    if kubelet_ids.is_empty() {
        return Err(PlanError::EmptyRequest);
    }
    let mut chosen: Vec<&RegisteredDevice> = Vec::new();
    for text in kubelet_ids {
        let id =
            KubeletDeviceId::parse(text).map_err(|_| PlanError::UnknownKubeletId(text.clone()))?;
        let dev = devices
            .iter()
            .find(|d| d.device_key == id.device_key && id.share < d.info.count)
            .ok_or_else(|| PlanError::UnknownKubeletId(text.clone()))?;
        if busy.contains(&dev.info.id) {
            return Err(PlanError::WholeCardBusy {
                kubelet_id: text.clone(),
                device: dev.info.id.clone(),
            });
        }
        if !chosen.iter().any(|c| c.device_key == dev.device_key) {
            chosen.push(dev);
        }
    }
    if chosen.len() != kubelet_ids.len() {
        return Err(PlanError::WholeCardShares {
            ids: kubelet_ids.join(","),
            asked: kubelet_ids.len(),
            cards: chosen.len(),
        });
    }
    Ok(cards_plan(&chosen))
}

/// What every container given these cards gets, sliced or whole: `/dev/kfd`, each card's
/// `card` and `renderD` nodes (read-write), and `ROCR_VISIBLE_DEVICES` naming them.
fn cards_plan(cards: &[&RegisteredDevice]) -> ContainerPlan {
    let mut plan = ContainerPlan::default();
    plan.devices.push(DevicePath {
        path: "/dev/kfd".into(),
        permissions: "rw".into(),
    });
    for dev in cards {
        plan.devices.push(DevicePath {
            path: format!("/dev/dri/card{}", dev.card),
            permissions: "rw".into(),
        });
        plan.devices.push(DevicePath {
            path: format!("/dev/dri/renderD{}", dev.render),
            permissions: "rw".into(),
        });
    }
    plan.envs.insert(
        env::ROCR_VISIBLE_DEVICES.into(),
        rocr_visible_devices(cards),
    );
    plan
}
