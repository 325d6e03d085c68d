//! The Allocate decision as a pure function (SPEC §2.2, reference §5.4-§5.6): from the
//! pod's device list and containers, the node's GPUs and kubelet's request, to the
//! container response and the new device list. No I/O: the shell reads and writes.

use hami_plugin_core::container_plan::{ContainerPlan, MountPlan};
use hami_plugin_core::run_mapping::{RunError, take_next_run};
use hami_protocol::hook_config::{self, HookConfig};
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::memory_limit::MibLimit;
use hami_protocol::names::{NVIDIA, env};

use crate::registration::RegisteredGpu;

/// The GPUs the NVIDIA container runtime exposes to the container (UUIDs).
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Lets HAMi-core spill to host memory when memory is oversubscribed.
pub const CUDA_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// A container env that, when true, asks for no hook (`/etc/ld.so.preload` not mounted).
pub const CUDA_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";

/// Where the hook lives inside containers (the reference's path).
pub const HOOK_CONTAINER_PATH: &str = "/usr/local/vgpu/libvgpu.so";
/// Where a sliced container sees its own accounting directory (the hook's region lives in
/// it; the monitor finds it on the host at `<cache_host_root>/<pod uid>_<container>/`).
pub const CACHE_CONTAINER_DIR: &str = "/usr/local/vgpu/cache";
/// File name of the region in that directory (`.cache`, as the monitor expects).
pub const CACHE_FILE: &str = "cudevshr.cache";
/// The dynamic linker's preload list inside the container.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// Settings of the planner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSettings {
    /// Host path of `libvgpu.so` (`$HOOK_PATH/vgpu/libvgpu.so`).
    pub hook_host_path: String,
    /// Host file listing the hook's container path, mounted at `/etc/ld.so.preload`
    /// (`$HOOK_PATH/vgpu/ld.so.preload`, written by the plugin at start).
    pub ld_so_preload_host_path: String,
    /// Host directory holding one accounting directory per sliced container
    /// (`$HOOK_PATH/vgpu/containers`), read by the monitor.
    pub cache_host_root: String,
    /// `--device-memory-scaling` > 1: set `CUDA_OVERSUBSCRIBE=true`.
    pub oversubscribe: bool,
    /// Host directory of the per-container hook config files (`$HOOK_PATH/vgpu/configs`),
    /// each mounted read-only at `hook_config::CONTAINER_PATH`; apart from the accounting
    /// directories, which containers write.
    pub config_host_root: String,
}

impl Default for PlanSettings {
    fn default() -> Self {
        Self {
            hook_host_path: "/usr/local/vgpu/libvgpu.so".into(),
            ld_so_preload_host_path: "/usr/local/vgpu/ld.so.preload".into(),
            cache_host_root: "/usr/local/vgpu/containers".into(),
            oversubscribe: false,
            config_host_root: "/usr/local/vgpu/configs".into(),
        }
    }
}

/// A container of the pod, in device-list order (init containers first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The container's name (names its cache directory).
    pub name: String,
    /// The container's env sets `CUDA_DISABLE_CONTROL` to a true value.
    pub disable_control: bool,
    /// The container's task priority ([`task_priority`]): pinned in its hook config, where
    /// the hook writes it into the region's `priority` (issue 26 item 2).
    pub task_priority: Option<String>,
}

/// The container's task priority as its spec gives it: `CUDA_TASK_PRIORITY` with a plain
/// `value` (the webhook writes it from `nvidia.com/priority` unless the user set it), else
/// the `nvidia.com/priority` limit. `None` when neither is there, or the variable comes from
/// `valueFrom`/`envFrom` (which the plugin does not read): the hook then reads the process's
/// own environment.
pub fn task_priority(container: &k8s_openapi::api::core::v1::Container) -> Option<String> {
    let plain = |v: &String| !v.contains(['\0', '\n', '\r']);
    match container
        .env
        .iter()
        .flatten()
        .rfind(|e| e.name == env::CUDA_TASK_PRIORITY)
    {
        Some(var) => var.value.clone().filter(plain),
        None => container
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|limits| limits.get(NVIDIA.resource_priority?))
            .map(|q| q.0.clone())
            .filter(plain),
    }
}

/// What Allocate reads of the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodState {
    /// `hami.io/vgpu-devices-to-allocate`.
    pub to_allocate: Option<String>,
    /// The pod's UID (names its cache directories); `None` when the API server gave none.
    pub pod_uid: Option<String>,
    /// Every container of the pod, in device-list order.
    pub containers: Vec<ContainerInfo>,
}

/// The full outcome of one container's Allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatePlan {
    /// Env, devices and mounts for kubelet.
    pub container: ContainerPlan,
    /// Which run (container in device-list order) this request was mapped to.
    pub run_index: usize,
    /// New `hami.io/vgpu-devices-to-allocate` (this run emptied, padding kept).
    pub to_allocate: String,
    /// Host directory to create (mode 0777) before answering.
    pub cache_dir: Option<String>,
    /// The container's hook config: (host file to write before answering, its content, to
    /// which the shell adds the inode of the region file it creates in `cache_dir`). The
    /// hook reads it first, so the container's environment cannot widen the slice (D-9).
    pub hook_config: Option<(String, HookConfig)>,
    /// True when no run is left: the pod is fully allocated (`bind-phase=success`).
    pub last: bool,
}

/// Why Allocate must fail; each names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The pod's device list cannot be mapped to this request.
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(
        "GPU {id} of the scheduler's decision is not offered on this node (stale decision or GPU gone)"
    )]
    /// The decision names a GPU this node does not offer.
    UnknownDevice {
        /// The GPU's UUID.
        id: String,
    },
    /// The decision names a GPU that is unhealthy now.
    #[error("GPU {id} of the scheduler's decision is unhealthy")]
    Unhealthy {
        /// The GPU's UUID.
        id: String,
    },
    #[error(
        "the scheduler's decision gives the container {mem} MiB of GPU {id}, which registers only {devmem} MiB"
    )]
    /// The decision gives more memory than the GPU has.
    TooMuchMemory {
        /// The GPU's UUID.
        id: String,
        /// MiB the decision gives.
        mem: u64,
        /// MiB the GPU registers.
        devmem: u64,
    },
    /// A kubelet device id that is not `<uuid>#<share>` of an offered GPU.
    #[error("kubelet device id {0:?} is not offered by this plugin")]
    UnknownKubeletId(String),
    /// Kubelet asked for no device.
    #[error("kubelet asked for no device")]
    EmptyRequest,
    /// The hook config would not be readable by the hook.
    #[error("the container's hook config cannot be written: {0}")]
    HookConfig(hook_config::HookConfigError),
}

/// Go's `strconv.ParseBool` truth values (the reference reads `CUDA_DISABLE_CONTROL` so).
pub fn env_is_true(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// Plans the Allocate of the pod's next container (D-5).
pub fn plan_allocate(
    pod: &PodState,
    devices: &[RegisteredGpu],
    requested: usize,
    settings: &PlanSettings,
) -> Result<AllocatePlan, PlanError> {
    let next = take_next_run(
        NVIDIA.devices_to_allocate,
        pod.to_allocate.as_deref(),
        requested,
    )?;
    for entry in &next.run {
        let dev = devices
            .iter()
            .find(|d| d.info.id == entry.uuid)
            .ok_or_else(|| PlanError::UnknownDevice {
                id: entry.uuid.clone(),
            })?;
        if !dev.info.health {
            return Err(PlanError::Unhealthy {
                id: entry.uuid.clone(),
            });
        }
        if entry.mem_mib > dev.info.devmem {
            return Err(PlanError::TooMuchMemory {
                id: entry.uuid.clone(),
                mem: entry.mem_mib,
                devmem: dev.info.devmem,
            });
        }
    }
    let mut container = ContainerPlan::default();
    let uuids: Vec<&str> = next.run.iter().map(|e| e.uuid.as_str()).collect();
    container
        .envs
        .insert(NVIDIA_VISIBLE_DEVICES.into(), uuids.join(","));
    for (i, entry) in next.run.iter().enumerate() {
        container.envs.insert(
            format!("{}_{i}", env::CUDA_DEVICE_MEMORY_LIMIT),
            MibLimit(entry.mem_mib).to_string(),
        );
    }
    // HAMi-core reads one SM limit for the container: the first device's (reference).
    container.envs.insert(
        env::CUDA_DEVICE_SM_LIMIT.into(),
        next.run[0].cores.to_string(),
    );
    if settings.oversubscribe {
        container
            .envs
            .insert(CUDA_OVERSUBSCRIBE.into(), "true".into());
    }
    container.mounts.push(MountPlan {
        container_path: HOOK_CONTAINER_PATH.into(),
        host_path: settings.hook_host_path.clone(),
        read_only: true,
    });
    let info = pod.containers.get(next.run_index);
    if !info.is_some_and(|c| c.disable_control) {
        container.mounts.push(MountPlan {
            container_path: LD_SO_PRELOAD.into(),
            host_path: settings.ld_so_preload_host_path.clone(),
            read_only: true,
        });
    }
    let (mut cache_dir, mut hook_config) = (None, None);
    if let (Some(uid), Some(info)) = (&pod.pod_uid, info) {
        let host = format!(
            "{}/{uid}_{}",
            settings.cache_host_root.trim_end_matches('/'),
            info.name
        );
        container.mounts.push(MountPlan {
            container_path: CACHE_CONTAINER_DIR.into(),
            host_path: host.clone(),
            read_only: false,
        });
        container.envs.insert(
            env::CUDA_DEVICE_MEMORY_SHARED_CACHE.into(),
            format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}"),
        );
        cache_dir = Some(host);
        let mut config = HookConfig {
            memory_limits: next
                .run
                .iter()
                .enumerate()
                .map(|(i, e)| (i as u32, e.mem_mib.saturating_mul(1 << 20)))
                .collect(),
            shared_cache: Some(format!("{CACHE_CONTAINER_DIR}/{CACHE_FILE}")),
            sm_limit: Some(next.run[0].cores.min(100) as u8),
            pinned: settings
                .oversubscribe
                .then(|| (CUDA_OVERSUBSCRIBE.to_owned(), "true".to_owned()))
                .into_iter()
                .collect(),
            ..HookConfig::default()
        };
        if let Some(priority) = &info.task_priority {
            config
                .pinned
                .insert(env::CUDA_TASK_PRIORITY.into(), priority.clone());
        }
        let host_file = format!(
            "{}/{uid}_{}.conf",
            settings.config_host_root.trim_end_matches('/'),
            info.name
        );
        container.mounts.push(MountPlan {
            container_path: hook_config::CONTAINER_PATH.into(),
            host_path: host_file.clone(),
            read_only: true,
        });
        config.validate().map_err(PlanError::HookConfig)?;
        hook_config = Some((host_file, config));
    }
    Ok(AllocatePlan {
        container,
        run_index: next.run_index,
        to_allocate: next.remaining,
        cache_dir,
        hook_config,
        last: next.last,
    })
}

/// Whole-card hand-over for a pod HAMi did not place: the kubelet-chosen ids name the
/// GPUs; the container gets `NVIDIA_VISIBLE_DEVICES` only (no hook, no limits).
pub fn plan_whole_cards(
    devices: &[RegisteredGpu],
    kubelet_ids: &[String],
) -> Result<ContainerPlan, PlanError> {
    if kubelet_ids.is_empty() {
        return Err(PlanError::EmptyRequest);
    }
    let mut chosen: Vec<&str> = Vec::new();
    for text in kubelet_ids {
        let id =
            KubeletDeviceId::parse(text).map_err(|_| PlanError::UnknownKubeletId(text.clone()))?;
        let dev = devices
            .iter()
            .find(|d| d.info.id == id.device_key && id.share < d.info.count)
            .ok_or_else(|| PlanError::UnknownKubeletId(text.clone()))?;
        if !chosen.contains(&dev.info.id.as_str()) {
            chosen.push(&dev.info.id);
        }
    }
    let mut plan = ContainerPlan::default();
    plan.envs
        .insert(NVIDIA_VISIBLE_DEVICES.into(), chosen.join(","));
    Ok(plan)
}
