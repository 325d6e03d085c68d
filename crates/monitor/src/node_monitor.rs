//! The monitor's state and its two passes:
//! - [`NodeMonitor::refresh`] (every few seconds): scan the cache directories, map them to
//!   pods, remove those of pods that are gone, map new region files, read host GPUs and
//!   sample DRM fdinfo for AMD utilization (published atomically);
//! - [`NodeMonitor::snapshot`] (each scrape): read every mapped region and assemble plain
//!   data for [`crate::metrics`]. It never fails as a whole: a bad region is skipped and
//!   counted.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::cache_dirs::{
    Orphan, cache_files, file_names, list_dirs, orphan_decision, parse_dir_name,
};
use crate::errors::ErrorLog;
use crate::fdinfo::{BusySample, DeviceUtilization, add_client};
use crate::hami_core_region::{self, MemoryBreakdown};
use crate::hip_region;
use crate::host_gpus::{HostGpu, amd_host_gpus, uuid_by_pdev};
use crate::pods::PodIndex;
use crate::procfs::ProcRoot;
use crate::region_bytes::{MappedRegion, RegionBytes};
use crate::utilization::{
    AmdDeviceUtil, ContainerKey, FdSampler, amd_container_devices, clamp_sum,
};

/// Where the monitor looks.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// `$HOOK_PATH`; directories live in `<hook_path>/containers`.
    pub hook_path: PathBuf,
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
    pub node_name: String,
    /// Directories of unknown pods are removed once this old (informer lag).
    pub gc_grace: Duration,
}

#[derive(Debug)]
enum Region {
    Core(MappedRegion),
    Hip(MappedRegion),
}

#[derive(Debug)]
struct Tracked {
    pod_uid: String,
    container: String,
    regions: BTreeMap<String, (PathBuf, Region)>,
}

/// One device of one container, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceMetrics {
    pub vdevice_index: Option<usize>,
    pub device_uuid: String,
    pub memory_used: Option<u64>,
    pub memory_limit: Option<u64>,
    /// HAMi-core only.
    pub breakdown: Option<MemoryBreakdown>,
    pub utilization: Option<DeviceUtilization>,
}

/// One container, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerMetrics {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub devices: Vec<DeviceMetrics>,
    pub last_kernel_elapsed: Option<u64>,
}

/// A device granted to a container by the pod's annotations (reported from allocation
/// time, before any process runs).
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub vendor: &'static str,
    pub vdevice_index: usize,
    pub device_uuid: String,
    pub memory_bytes: u64,
    /// AMD: CU count; NVIDIA: percent of SMs.
    pub cores: u32,
    /// AMD: the pod's CU list on this device (`hami.io/amd-cu-allocated`).
    pub cu_mask: Option<String>,
}

/// Everything one scrape reports.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub node: String,
    pub containers: Vec<ContainerMetrics>,
    pub allocations: Vec<Allocation>,
    pub host: Arc<Vec<HostGpu>>,
    pub errors: BTreeMap<&'static str, u64>,
}

type AmdUtil = HashMap<ContainerKey, Vec<AmdDeviceUtil>>;

/// The monitor.
pub struct NodeMonitor {
    config: MonitorConfig,
    proc: ProcRoot,
    errors: ErrorLog,
    tracked: Mutex<BTreeMap<String, Tracked>>,
    pods: RwLock<Arc<PodIndex>>,
    host: RwLock<Arc<Vec<HostGpu>>>,
    amd_util: RwLock<Arc<AmdUtil>>,
    sampler: Mutex<FdSampler>,
}

fn read_lock<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read().unwrap_or_else(|p| p.into_inner()).clone()
}

fn write_lock<T>(lock: &RwLock<T>, value: T) {
    *lock.write().unwrap_or_else(|p| p.into_inner()) = value;
}

/// The first 12 bytes and the size of a file: enough to pick a layout without mapping.
struct HeaderProbe {
    head: [u8; 12],
    len: usize,
}

impl RegionBytes for HeaderProbe {
    fn len(&self) -> usize {
        self.len
    }
    fn byte_at(&self, offset: usize) -> u8 {
        self.head.as_slice().byte_at(offset)
    }
    fn u32_at(&self, offset: usize) -> u32 {
        self.head.as_slice().u32_at(offset)
    }
    fn u64_at(&self, offset: usize) -> u64 {
        self.head.as_slice().u64_at(offset)
    }
}

/// Why a region file was not mapped.
enum LoadError {
    Core(hami_core_region::CoreRegionError),
    Hip(hip_region::HipRegionError),
    Io(io::Error),
}

impl LoadError {
    fn kind(&self) -> &'static str {
        match self {
            LoadError::Core(e) => e.kind(),
            LoadError::Hip(e) => e.kind(),
            LoadError::Io(_) => "cache_io",
        }
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Core(e) => e.fmt(f),
            LoadError::Hip(e) => e.fmt(f),
            LoadError::Io(e) => e.fmt(f),
        }
    }
}

fn load_region(path: &Path) -> Result<Region, LoadError> {
    let file = File::open(path).map_err(LoadError::Io)?;
    let len = file.metadata().map_err(LoadError::Io)?.len() as usize;
    let mut head = [0u8; 12];
    // A short read leaves zeros, which the layout checks refuse.
    file.read_at(&mut head, 0).map_err(LoadError::Io)?;
    let probe = HeaderProbe { head, len };
    if head[..4] == hami_region::layout::MAGIC.to_le_bytes() {
        if len < hami_region::layout::REGION_SIZE {
            return Err(LoadError::Hip(hip_region::HipRegionError::Truncated {
                size: len,
            }));
        }
        let map =
            MappedRegion::open(path, hami_region::layout::REGION_SIZE).map_err(LoadError::Io)?;
        hip_region::check_header(&map).map_err(LoadError::Hip)?;
        return Ok(Region::Hip(map));
    }
    let layout = hami_core_region::detect_layout(&probe).map_err(LoadError::Core)?;
    let map = MappedRegion::open(path, layout.size).map_err(LoadError::Io)?;
    Ok(Region::Core(map))
}

/// Whether another open file description holds a record lock on byte `offset` (hami-region's
/// liveness signal for a slot). A failing probe counts as alive: never hide usage on doubt.
fn record_locked(file: &File, offset: usize) -> bool {
    hami_kernel_locks::file_lock::record_locked_elsewhere(file, offset).unwrap_or(true)
}

impl NodeMonitor {
    pub fn new(config: MonitorConfig) -> NodeMonitor {
        let proc = ProcRoot::new(&config.proc_root);
        NodeMonitor {
            config,
            proc,
            errors: ErrorLog::default(),
            tracked: Mutex::new(BTreeMap::new()),
            pods: RwLock::new(Arc::new(PodIndex::default())),
            host: RwLock::new(Arc::new(Vec::new())),
            amd_util: RwLock::new(Arc::new(HashMap::new())),
            sampler: Mutex::new(FdSampler::default()),
        }
    }

    pub fn errors(&self) -> &ErrorLog {
        &self.errors
    }

    fn containers_dir(&self) -> PathBuf {
        self.config.hook_path.join("containers")
    }

    /// One scan pass with the pods now known.
    pub fn refresh(&self, pods: PodIndex) {
        let pods = Arc::new(pods);
        for info in pods.by_uid.values() {
            for problem in &info.problems {
                self.errors.record(
                    "annotation_invalid",
                    &format!("{}/{}", info.namespace, info.name),
                    problem,
                );
            }
        }
        write_lock(&self.pods, pods.clone());
        self.scan_dirs(&pods, SystemTime::now());
        let host = match amd_host_gpus(&self.config.sys_root) {
            Ok(gpus) => gpus,
            Err(e) => {
                self.errors
                    .record("sysfs", &self.config.sys_root.display().to_string(), &e);
                Vec::new()
            }
        };
        let host = Arc::new(host);
        write_lock(&self.host, host.clone());
        self.sample_fdinfo(&pods, &host, Instant::now());
    }

    fn scan_dirs(&self, pods: &PodIndex, now: SystemTime) {
        let root = self.containers_dir();
        let entries = match list_dirs(&root) {
            Ok(entries) => entries,
            Err(e) => {
                self.errors
                    .record("cache_dir_unreadable", &root.display().to_string(), &e);
                return;
            }
        };
        let mut tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        let present: std::collections::HashSet<&str> =
            entries.iter().map(|e| e.name.as_str()).collect();
        tracked.retain(|name, _| present.contains(name.as_str()));
        for entry in &entries {
            let subject = entry.path.display().to_string();
            let Some((uid, container)) = parse_dir_name(&entry.name) else {
                self.errors.record(
                    "dir_bad_name",
                    &subject,
                    &"the name is not <podUID>_<container>",
                );
                continue;
            };
            match orphan_decision(
                pods.get(uid).is_some(),
                entry.mtime,
                now,
                self.config.gc_grace,
            ) {
                Orphan::Keep => {}
                Orphan::Wait => {
                    self.errors.record("dir_no_pod", &subject, &"no pod on this node has this UID (yet); removed once the grace period passed");
                    continue;
                }
                Orphan::Remove => {
                    tracked.remove(&entry.name);
                    match std::fs::remove_dir_all(&entry.path) {
                        Ok(()) => {
                            tracing::info!(dir = %subject, "removed the cache directory of a pod that no longer exists")
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => self.errors.record("dir_remove", &subject, &e),
                    }
                    continue;
                }
            }
            let names = match file_names(&entry.path) {
                Ok(names) => names,
                Err(e) => {
                    self.errors.record("cache_io", &subject, &e);
                    continue;
                }
            };
            let files = match cache_files(&names) {
                Ok(files) => files,
                Err(e) => {
                    self.errors.record("cache_too_many", &subject, &e);
                    continue;
                }
            };
            let slot = tracked
                .entry(entry.name.clone())
                .or_insert_with(|| Tracked {
                    pod_uid: uid.to_owned(),
                    container: container.to_owned(),
                    regions: BTreeMap::new(),
                });
            slot.regions.retain(|name, _| files.contains(name));
            for file in files {
                if slot.regions.contains_key(&file) {
                    continue;
                }
                let path = entry.path.join(&file);
                match load_region(&path) {
                    Ok(region) => {
                        slot.regions.insert(file, (path, region));
                    }
                    Err(e) => self
                        .errors
                        .record(e.kind(), &path.display().to_string(), &e),
                }
            }
        }
    }

    fn sample_fdinfo(&self, pods: &PodIndex, host: &[HostGpu], now: Instant) {
        let pids = match self.proc.pids() {
            Ok(pids) => pids,
            Err(e) => {
                self.errors.record(
                    "proc_unreadable",
                    &self.config.proc_root.display().to_string(),
                    &e,
                );
                return;
            }
        };
        let mut samples: HashMap<ContainerKey, BusySample> = HashMap::new();
        for pid in pids {
            let pc = match self.proc.pod_container(pid) {
                Ok(Some(pc)) => pc,
                Ok(None) => continue,
                Err(_) => {
                    self.errors.record(
                        "proc_vanished",
                        &pid.to_string(),
                        &"the process exited while being read",
                    );
                    continue;
                }
            };
            let Some((uid, name)) = pods.by_container_id.get(&pc.container_id) else {
                continue;
            };
            match self.proc.drm_clients(pid) {
                Ok(clients) if !clients.is_empty() => {
                    let sample = samples.entry((uid.clone(), name.clone())).or_default();
                    for client in &clients {
                        add_client(sample, client);
                    }
                }
                Ok(_) => {}
                Err(_) => self.errors.record(
                    "proc_vanished",
                    &pid.to_string(),
                    &"the process exited while being read",
                ),
            }
        }
        let result = self
            .sampler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .advance(now, samples);
        let Some(result) = result else { return };
        let uuids = uuid_by_pdev(host);
        let published: AmdUtil = result
            .into_iter()
            .map(|(key, by_pdev)| {
                let granted = pods
                    .get(&key.0)
                    .and_then(|p| p.container(&key.1))
                    .map(|c| c.amd.clone())
                    .unwrap_or_default();
                let devices = amd_container_devices(&by_pdev, &uuids, &granted);
                (key, devices)
            })
            .collect();
        write_lock(&self.amd_util, Arc::new(published));
    }

    /// Reads everything for one scrape. Never fails; problems are counted.
    pub fn snapshot(&self) -> Snapshot {
        let pods = read_lock(&self.pods);
        let amd_util = read_lock(&self.amd_util);
        let now_secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut containers = Vec::new();
        let mut with_region = std::collections::HashSet::new();
        {
            let tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
            for t in tracked.values() {
                // A pod deleted since the scan: nothing to label it with; skip quietly.
                let Some(pod) = pods.get(&t.pod_uid) else {
                    continue;
                };
                let info = pod.container(&t.container);
                let mut devices = Vec::new();
                let mut last_kernel_elapsed = None;
                for (path, region) in t.regions.values() {
                    match region {
                        Region::Core(map) => {
                            match hami_core_region::read_region(map, &|pid| {
                                self.proc.pid_alive(pid)
                            }) {
                                Ok(reading) => {
                                    last_kernel_elapsed = reading
                                        .last_kernel_time
                                        .map(|t| now_secs.saturating_sub(t));
                                    devices.extend(reading.devices.iter().map(|d| DeviceMetrics {
                                        vdevice_index: Some(d.index),
                                        device_uuid: d.uuid.clone(),
                                        memory_used: Some(d.memory.total),
                                        memory_limit: Some(d.limit),
                                        breakdown: Some(d.memory),
                                        utilization: Some(clamp_sum(d.sm_util_sum)),
                                    }));
                                }
                                Err(e) => {
                                    self.errors
                                        .record(e.kind(), &path.display().to_string(), &e)
                                }
                            }
                        }
                        Region::Hip(map) => {
                            let file = map.file();
                            let mut alive = |slot: usize| {
                                record_locked(file, hami_region::layout::slot_offset(slot))
                            };
                            match hip_region::read_region(map, &mut alive) {
                                Ok(reading) => {
                                    let granted = info.map(|c| c.amd.as_slice()).unwrap_or(&[]);
                                    let util =
                                        amd_util.get(&(t.pod_uid.clone(), t.container.clone()));
                                    with_region.insert((t.pod_uid.clone(), t.container.clone()));
                                    for d in &reading.devices {
                                        let uuid = granted.get(d.index).map_or_else(
                                            || format!("hip-device-{}", d.index),
                                            |g| g.uuid.clone(),
                                        );
                                        let utilization = util.and_then(|u| {
                                            u.iter().find(|x| x.uuid == uuid).map(|x| x.util)
                                        });
                                        devices.push(DeviceMetrics {
                                            vdevice_index: Some(d.index),
                                            device_uuid: uuid,
                                            memory_used: Some(d.used),
                                            memory_limit: d.limit,
                                            breakdown: None,
                                            utilization,
                                        });
                                    }
                                }
                                Err(e) => {
                                    self.errors
                                        .record(e.kind(), &path.display().to_string(), &e)
                                }
                            }
                        }
                    }
                }
                containers.push(ContainerMetrics {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: t.container.clone(),
                    devices,
                    last_kernel_elapsed,
                });
            }
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
            node: self.config.node_name.clone(),
            containers,
            allocations: allocations(&pods),
            host: read_lock(&self.host),
            errors: self.errors.counts(),
        }
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
