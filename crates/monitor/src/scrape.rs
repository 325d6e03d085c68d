//! What one scrape reports, and the pure [`assemble`] that decides it: plain data in (the
//! pods known, the regions read for this scrape, the AMD utilization sampled), the
//! scrape's samples out. The reading itself (files, liveness of processes) is
//! `NodeMonitor::snapshot`'s gather, in `node_monitor.rs`; nothing here does I/O.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::fdinfo::DeviceUtilization;
use crate::hami_core_region::{CoreReading, MemoryBreakdown};
use crate::hip_region::HipReading;
use crate::host_gpus::HostGpu;
use crate::pods::{PodIndex, WholeCard};
use crate::utilization::{AmdDeviceUtil, ContainerKey, clamp_sum};

/// One device of one container, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceMetrics {
    /// Position in the container's granted devices; `None` when not granted through HAMi.
    pub vdevice_index: Option<usize>,
    /// Registered device id.
    pub device_uuid: String,
    /// Bytes the region accounts.
    pub memory_used: Option<u64>,
    /// Bytes allowed; `None` when unlimited.
    pub memory_limit: Option<u64>,
    /// HAMi-core only.
    pub breakdown: Option<MemoryBreakdown>,
    /// Compute utilization, when sampled.
    pub utilization: Option<DeviceUtilization>,
}

/// One container, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerMetrics {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// Its devices.
    pub devices: Vec<DeviceMetrics>,
    /// Seconds since its last kernel launch (HAMi-core v1).
    pub last_kernel_elapsed: Option<u64>,
}

/// A device granted to a container by the pod's annotations (reported from allocation
/// time, before any process runs).
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// `AMD` or `NVIDIA`.
    pub vendor: &'static str,
    /// Position in the container's granted devices.
    pub vdevice_index: usize,
    /// Registered device id.
    pub device_uuid: String,
    /// Device memory granted, bytes.
    pub memory_bytes: u64,
    /// AMD: CU count; NVIDIA: percent of SMs.
    pub cores: u32,
    /// AMD: the pod's CU list on this device (`hami.io/amd-cu-allocated`).
    pub cu_mask: Option<String>,
}

/// Everything one scrape reports.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The node.
    pub node: String,
    /// Containers with a readable region or sampled utilization.
    pub containers: Vec<ContainerMetrics>,
    /// Every device granted to a container on this node.
    pub allocations: Vec<Allocation>,
    /// Cards held whole by pods the scheduler did not place (issue 26 item 1).
    pub whole_cards: Vec<WholeCard>,
    /// Host per-GPU readings.
    pub host: Arc<Vec<HostGpu>>,
    /// Errors counted since start, by kind.
    pub errors: BTreeMap<&'static str, u64>,
    /// The memory-hook check's counts of the last refresh (issue 29).
    pub hooks: crate::hook_check::HookTallies,
}

/// AMD utilization sampled from DRM fdinfo, per container.
pub type AmdUtil = HashMap<ContainerKey, Vec<AmdDeviceUtil>>;

/// One region file's reading, as gathered for a scrape (a file that could not be read or
/// decoded is left out, and counted by the gather).
#[derive(Debug, Clone, PartialEq)]
pub enum RegionReading {
    /// A HAMi-core (CUDA) region.
    Core(CoreReading),
    /// Our HIP region.
    Hip(HipReading),
}

/// One tracked cache directory (a container's, or a DRA claim's) whose pod is known, with
/// the readings of its region files in file-name order.
#[derive(Debug, Clone, PartialEq)]
pub struct GatheredDir {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container whose directory it is (a claim's: its first container).
    pub container: String,
    /// The DRA claim UID of a claim directory; `None` for a container directory.
    pub claim: Option<String>,
    /// Its regions' readings.
    pub readings: Vec<RegionReading>,
}

/// What a scrape gathered: the plain data [`assemble`] turns into its samples.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    /// The node.
    pub node: String,
    /// The pods known at the last refresh.
    pub pods: Arc<PodIndex>,
    /// The AMD utilization published by the last refresh.
    pub amd_util: Arc<AmdUtil>,
    /// Unix seconds now (for the time since a container's last kernel).
    pub now_secs: u64,
    /// The tracked directories read, in their tracking order.
    pub dirs: Vec<GatheredDir>,
    /// Host per-GPU readings of the last refresh.
    pub host: Arc<Vec<HostGpu>>,
    /// Errors counted since start, by kind.
    pub errors: BTreeMap<&'static str, u64>,
}

/// The scrape's samples from what was gathered: a container per directory read (labelled
/// by its pod), its devices named by the container's grants or its claim, utilization
/// joined by device, AMD containers busy without a region of their own, sorted by
/// namespace, pod and container; and every device granted by the pods' annotations.
pub fn assemble(gathered: Gathered) -> Snapshot {
    let Gathered {
        node,
        pods,
        amd_util,
        now_secs,
        dirs,
        host,
        errors,
    } = gathered;
    let mut containers = Vec::new();
    let mut with_region = HashSet::new();
    for dir in &dirs {
        // A pod deleted since the gather: nothing to label it with; skip quietly.
        let Some(pod) = pods.get(&dir.pod_uid) else {
            continue;
        };
        let key: ContainerKey = (dir.pod_uid.clone(), dir.container.clone());
        let mut devices = Vec::new();
        let mut last_kernel_elapsed = None;
        for reading in &dir.readings {
            match reading {
                RegionReading::Core(reading) => {
                    last_kernel_elapsed =
                        reading.last_kernel_time.map(|t| now_secs.saturating_sub(t));
                    devices.extend(reading.devices.iter().map(|d| DeviceMetrics {
                        vdevice_index: Some(d.index),
                        device_uuid: d.uuid.clone(),
                        memory_used: Some(d.memory.total),
                        memory_limit: Some(d.limit),
                        breakdown: Some(d.memory),
                        utilization: Some(clamp_sum(d.sm_util_sum)),
                    }));
                }
                RegionReading::Hip(reading) => {
                    let granted = pod
                        .container(&dir.container)
                        .map(|c| c.amd.as_slice())
                        .unwrap_or(&[]);
                    let util = amd_util.get(&key);
                    with_region.insert(key.clone());
                    let claim = dir.claim.as_ref().map(|c| pods.claims.get(c));
                    for d in &reading.devices {
                        let (vdevice_index, uuid) = region_device(claim, granted, d.index);
                        let utilization =
                            util.and_then(|u| u.iter().find(|x| x.uuid == uuid).map(|x| x.util));
                        devices.push(DeviceMetrics {
                            vdevice_index,
                            device_uuid: uuid,
                            memory_used: Some(d.used),
                            memory_limit: d.limit,
                            breakdown: None,
                            utilization,
                        });
                    }
                }
            }
        }
        containers.push(ContainerMetrics {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: dir.container.clone(),
            devices,
            last_kernel_elapsed,
        });
    }
    // AMD containers using GPUs without a HIP region (no hook, or not yet started).
    for (key, devices) in amd_util.iter() {
        if with_region.contains(key) {
            continue;
        }
        let Some(pod) = pods.get(&key.0) else {
            continue;
        };
        containers.push(ContainerMetrics {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: key.1.clone(),
            devices: devices
                .iter()
                .map(|d| DeviceMetrics {
                    vdevice_index: d.vdevice_index,
                    device_uuid: d.uuid.clone(),
                    memory_used: None,
                    memory_limit: None,
                    breakdown: None,
                    utilization: Some(d.util),
                })
                .collect(),
            last_kernel_elapsed: None,
        });
    }
    containers.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
    });
    Snapshot {
        node,
        containers,
        allocations: allocations(&pods),
        whole_cards: pods.whole_cards.clone(),
        host,
        errors,
        // Filled by the shell from the last refresh (not gathered per scrape).
        hooks: Default::default(),
    }
}

/// Whether the DRA claim directory `name` (a claim UID) is read: a pod of the node uses
/// the claim. Other names (claims of pods gone, or not ours) are the driver's to remove.
pub fn claim_dir_tracked(name: &str, pods: &PodIndex) -> bool {
    pods.claims.contains_key(name)
}

/// `vdevice_index` and `device_uuid` of device `index` of a HIP region: for a container
/// directory (`claim` `None`) its position in the container's `granted` devices; for a
/// DRA claim directory the claim's device at that position (`Some(None)`: the claim is no
/// longer known). A device nothing names is `hip-device-<index>`.
pub fn region_device(
    claim: Option<Option<&crate::dra_claims::ClaimRegion>>,
    granted: &[hami_protocol::device_list::ContainerDevice],
    index: usize,
) -> (Option<usize>, String) {
    let unknown = || format!("hip-device-{index}");
    match claim {
        None => (
            Some(index),
            granted.get(index).map_or_else(unknown, |g| g.uuid.clone()),
        ),
        Some(claim) => match claim.and_then(|c| c.devices.get(index)) {
            Some(d) => (d.vdevice_index, d.uuid.clone()),
            None => (None, unknown()),
        },
    }
}

/// The devices granted by the pods' annotations.
pub fn allocations(pods: &PodIndex) -> Vec<Allocation> {
    let mut out = Vec::new();
    for pod in pods.by_uid.values() {
        for c in &pod.containers {
            for (vendor, list) in [("AMD", &c.amd), ("NVIDIA", &c.nvidia)] {
                for (index, d) in list.iter().enumerate() {
                    out.push(Allocation {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                        vendor,
                        vdevice_index: index,
                        device_uuid: d.uuid.clone(),
                        memory_bytes: d.mem_mib.saturating_mul(1 << 20),
                        cores: d.cores,
                        cu_mask: (vendor == "AMD")
                            .then(|| {
                                pod.cu_allocated
                                    .iter()
                                    .find(|(id, _)| *id == d.uuid)
                                    .map(|(_, l)| l.clone())
                            })
                            .flatten(),
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container, a.vdevice_index).cmp(&(
            &b.namespace,
            &b.pod,
            &b.container,
            b.vdevice_index,
        ))
    });
    out
}

#[cfg(test)]
mod tests;
