//! The Allocate decision as a pure function (SPEC §4, §2.6, D-5): from the pod's
//! annotations, the node's devices, the CUs other pods hold and kubelet's request, to the
//! container response and the annotation updates. No I/O: the shell reads and writes.

use hami_plugin_core::run_mapping::{RunError, take_next_run};
use hami_protocol::cu_allocated::{CuAllocatedError, CuAllocation};
use hami_protocol::cu_list::{CuListError, CuSet, HsaCuMask};
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::memory_limit::MibLimit;
use hami_protocol::names::AMD;
use hami_protocol::names::env;

use crate::cu_choice::{CuChoiceError, choose_cus};
use crate::registration::RegisteredDevice;

/// Where the hook lives inside containers (the reference's path).
pub const HOOK_CONTAINER_PATH: &str = "/usr/local/vgpu/libamvgpu.so";

/// Where a sliced container sees its own accounting directory; the hook's shared region
/// (`HIP_DEVICE_MEMORY_SHARED_CACHE`) lives in it, so the monitor finds it on the host at
/// `<cache_host_root>/<pod uid>_<container>/` (SPEC §7).
pub const CACHE_CONTAINER_DIR: &str = "/usr/local/vgpu/cache";

/// File name of the region inside that directory (`.cache`, as the monitor expects).
pub const CACHE_FILE: &str = "hipdevshr.cache";

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
}

impl Default for PlanSettings {
    fn default() -> Self {
        Self {
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: HOOK_CONTAINER_PATH.into(),
            oversubscribe: false,
            cache_host_root: "/usr/local/vgpu/containers".into(),
        }
    }
}

// The container plan is vendor-neutral (shared with the NVIDIA plugin).
pub use hami_plugin_core::container_plan::{ContainerPlan, DevicePath, MountPlan};

/// A dmem limit to apply to the container's cgroup once it exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmemLimit {
    /// `drm/<pci bdf>/vram0`.
    pub region: String,
    pub bytes: u64,
}

/// The annotations of the pod that Allocate reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAnnotations {
    pub to_allocate: Option<String>,
    /// This pod's own `hami.io/amd-cu-allocated` (earlier containers).
    pub cu_allocated: Option<String>,
    /// The pod's uid and its container names in device-list order (init first), to name
    /// each sliced container's accounting directory; without them no directory is given.
    pub pod_uid: Option<String>,
    pub containers: Vec<String>,
}

/// The full outcome of one container's Allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatePlan {
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
    /// CUs chosen per device id, in allocation order.
    pub chosen: Vec<(String, CuSet)>,
    /// True when no run is left: the pod is fully allocated (`bind-phase=success`).
    pub last: bool,
    pub dmem: Vec<DmemLimit>,
    /// True for a whole-card response (no hook, no mask).
    pub whole_cards: bool,
}

/// Why Allocate must fail; each names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No run to take (not scheduled, malformed list, nothing left, count mismatch).
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("hami.io/amd-cu-allocated of the pod is malformed: {0}")]
    CuAllocated(#[from] CuAllocatedError),
    #[error(
        "device {id} of the scheduler's decision is not offered on this node (stale decision or GPU gone)"
    )]
    UnknownDevice { id: String },
    #[error("device {id}: {source}")]
    Cus {
        id: String,
        #[source]
        source: CuChoiceError,
    },
    #[error("device {id}: {source}")]
    Mask {
        id: String,
        #[source]
        source: CuListError,
    },
    #[error("kubelet device id {0:?} is not offered by this plugin")]
    UnknownKubeletId(String),
    #[error("kubelet asked for no device")]
    EmptyRequest,
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
    let whole_cards = run
        .iter()
        .zip(&resolved)
        .all(|(entry, dev)| entry.cores >= dev.info.devcore && entry.mem_mib >= dev.info.devmem);

    let mut chosen = Vec::new();
    let mut dmem = Vec::new();
    for (entry, dev) in run.iter().zip(&resolved) {
        let id = &dev.info.id;
        // Other pods' CUs plus what this pod's earlier containers (or devices) already hold.
        let mut used = others_used.0.get(id).cloned().unwrap_or_default();
        if let Some(own) = pod_cus.0.get(id) {
            used = used.union(own);
        }
        let cus =
            choose_cus(&used, dev.info.devcore, entry.cores, dev.cu_per_wgp).map_err(|source| {
                PlanError::Cus {
                    id: id.clone(),
                    source,
                }
            })?;
        pod_cus.add(id, &cus)?;
        chosen.push((id.clone(), cus));
        if !whole_cards {
            let bytes = (entry.mem_mib << 20).min(dev.mem_bytes);
            if bytes < dev.mem_bytes {
                dmem.push(DmemLimit {
                    region: format!("drm/{}/vram0", dev.pci_bdf),
                    bytes,
                });
            }
        }
    }

    let mut cache_dir = None;
    let mut container = ContainerPlan::default();
    container.devices.push(DevicePath {
        path: "/dev/kfd".into(),
        permissions: "rw".into(),
    });
    for dev in &resolved {
        container.devices.push(DevicePath {
            path: format!("/dev/dri/card{}", dev.card),
            permissions: "rw".into(),
        });
        container.devices.push(DevicePath {
            path: format!("/dev/dri/renderD{}", dev.render),
            permissions: "rw".into(),
        });
    }
    let rocr: Vec<&str> = resolved.iter().map(|d| d.rocr_id.as_str()).collect();
    container
        .envs
        .insert(env::ROCR_VISIBLE_DEVICES.into(), rocr.join(","));
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
            container.envs.insert(
                env::HIP_DEVICE_MEMORY_SHARED_CACHE.into(),
                format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}"),
            );
            cache_dir = Some(host);
        }
    }
    Ok(AllocatePlan {
        container,
        run_index,
        to_allocate: next.remaining,
        cu_allocated: pod_cus.encode(),
        cache_dir,
        chosen,
        last: next.last,
        dmem,
        whole_cards,
    })
}

/// Whole-card hand-over for a pod HAMi did not place: the kubelet-chosen ids name the
/// devices; the container gets their nodes and `ROCR_VISIBLE_DEVICES`, no hook, no mask.
pub fn plan_whole_cards(
    devices: &[RegisteredDevice],
    kubelet_ids: &[String],
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
        if !chosen.iter().any(|c| c.device_key == dev.device_key) {
            chosen.push(dev);
        }
    }
    let mut plan = ContainerPlan::default();
    plan.devices.push(DevicePath {
        path: "/dev/kfd".into(),
        permissions: "rw".into(),
    });
    for dev in &chosen {
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
        chosen
            .iter()
            .map(|d| d.rocr_id.as_str())
            .collect::<Vec<_>>()
            .join(","),
    );
    Ok(plan)
}
