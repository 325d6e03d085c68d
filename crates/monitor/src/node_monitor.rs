//! The monitor's state and its two passes:
//! - [`NodeMonitor::refresh`] (every few seconds): scan the cache directories, map them to
//!   pods, remove those of pods that are gone, map new region files (what the scan does is
//!   decided by [`crate::scan_plan`]), read host GPUs and sample DRM fdinfo for AMD
//!   utilization (published atomically);
//! - [`NodeMonitor::snapshot`] (each scrape): read every mapped region and assemble plain
//!   data for [`crate::metrics`]. It never fails as a whole: a bad region is skipped and
//!   counted.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::cache_budget;
use crate::cache_dirs::{HookConfig, cache_files, file_names, hook_config_action, list_dirs};
use crate::errors::ErrorLog;
use crate::fdinfo::{BusySample, DeviceUtilization, add_client_on};
use crate::hami_core_region::{self, MemoryBreakdown};
use crate::hip_region;
use crate::host_gpus::{HostGpu, amd_host};
use crate::pods::PodIndex;
use crate::procfs::ProcRoot;
use crate::region_bytes::{RegionBytes, Segments};
use crate::region_file::{FileError, RegionFile};
use crate::scan_plan::{DirAction, dir_action, forgotten, region_changes};
use crate::utilization::{
    AmdDeviceUtil, ContainerKey, FdSampler, amd_container_devices, clamp_sum,
};
use hami_amd_discovery::device_locator::{self, LocateError};
use hami_amd_discovery::registration::RegisteredDevice;

/// Where the monitor looks.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// `$HOOK_PATH`; directories live in `<hook_path>/containers`.
    pub hook_path: PathBuf,
    /// Where the host's `/proc` is mounted.
    pub proc_root: PathBuf,
    /// Where the host's `/sys` is mounted.
    pub sys_root: PathBuf,
    /// The node this monitor runs on.
    pub node_name: String,
    /// Directories of unknown pods are removed once this old (informer lag).
    pub gc_grace: Duration,
    /// NVML to `dlopen` for the NVIDIA host metrics (`libnvidia-ml.so.1`); `None`: none.
    pub nvml_library: Option<String>,
}

#[derive(Debug)]
enum Region {
    Core(RegionFile),
    Hip(RegionFile),
}

#[derive(Debug)]
struct Tracked {
    pod_uid: String,
    container: String,
    /// The DRA claim whose directory this is (its devices: `PodIndex::claims`); `None`
    /// for `containers/<podUID>_<container>/`.
    claim: Option<String>,
    regions: BTreeMap<String, (PathBuf, Region)>,
}

/// Tracked keys of DRA claim directories start with this (container directory names
/// have no `/`).
const CLAIM_KEY: &str = "dra/claims/";

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
    pub whole_cards: Vec<crate::pods::WholeCard>,
    /// Host per-GPU readings.
    pub host: Arc<Vec<HostGpu>>,
    /// Errors counted since start, by kind.
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
    nvml: Mutex<NvmlState>,
}

/// NVML is loaded at the first refresh; a failure is logged once and not retried.
enum NvmlState {
    NotTried,
    Loaded(hami_nvml::Nvml),
    Unavailable,
}

fn read_lock<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read().unwrap_or_else(|p| p.into_inner()).clone()
}

fn write_lock<T>(lock: &RwLock<T>, value: T) {
    *lock.write().unwrap_or_else(|p| p.into_inner()) = value;
}

/// Why a region file was not opened or read.
enum LoadError {
    Core(hami_core_region::CoreRegionError),
    Hip(hip_region::HipRegionError),
    File(FileError),
}

impl From<FileError> for LoadError {
    fn from(e: FileError) -> LoadError {
        LoadError::File(e)
    }
}

impl LoadError {
    fn kind(&self) -> &'static str {
        match self {
            LoadError::Core(e) => e.kind(),
            LoadError::Hip(e) => e.kind(),
            LoadError::File(e) => e.kind(),
        }
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Core(e) => e.fmt(f),
            LoadError::Hip(e) => e.fmt(f),
            LoadError::File(e) => e.fmt(f),
        }
    }
}

fn is_hip(head: &Segments) -> bool {
    head.u32_at(0) == hami_region::layout::MAGIC
}

/// Opens a region file and picks its kind from the first 12 bytes; the layout is checked
/// again on every read (the file may change under us).
fn load_region(path: &Path) -> Result<Region, LoadError> {
    let file = RegionFile::open(path)?;
    let region = {
        let mut read = file.reader(file.size()?);
        let head = read.read(0..hami_core_region::HEADER_LEN)?;
        if is_hip(head) {
            let probe = read.read(hip_region::fixed_range())?;
            hip_region::check_header(probe).map_err(LoadError::Hip)?;
            true
        } else {
            hami_core_region::detect_layout(head).map_err(LoadError::Core)?;
            false
        }
    };
    Ok(if region {
        Region::Hip(file)
    } else {
        Region::Core(file)
    })
}

/// Copies what a HAMi-core reading needs: header, tail, the `proc_num` slots in use.
fn read_core_bytes(file: &RegionFile) -> Result<Segments, LoadError> {
    let mut read = file.reader(file.size()?);
    // Header through the SM limits of the larger layout in one read (v1's end, past v0's).
    let head = read.read(0..hami_core_region::V1.procs)?;
    let layout = hami_core_region::detect_layout(head).map_err(LoadError::Core)?;
    let [fixed, tail] = hami_core_region::fixed_ranges(layout);
    debug_assert!(fixed.end <= hami_core_region::V1.procs);
    read.read(tail)?;
    let proc_num = read.read(0..0)?.i32_at(layout.proc_num);
    read.read(hami_core_region::slot_range(layout, proc_num))?;
    Ok(read.finish())
}

/// Copies what a HIP reading needs: header, device accounts, slots below the high water.
fn read_hip_bytes(file: &RegionFile) -> Result<Segments, LoadError> {
    let mut read = file.reader(file.size()?);
    let fixed = read.read(hip_region::fixed_range())?;
    hip_region::check_header(fixed).map_err(LoadError::Hip)?;
    let high = fixed.u32_at(hip_region::SLOT_HIGH_WATER);
    read.read(hip_region::slot_range(high))?;
    Ok(read.finish())
}

/// Whether another open file description holds a record lock on byte `offset` (hami-region's
/// liveness signal for a slot). A failing probe counts as alive: never hide usage on doubt.
fn record_locked(file: &File, offset: usize) -> bool {
    hami_kernel_locks::file_lock::record_locked_elsewhere(file, offset).unwrap_or(true)
}

impl NodeMonitor {
    /// A monitor over `config`'s directories; nothing read yet.
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
            nvml: Mutex::new(NvmlState::NotTried),
        }
    }

    /// The errors counted so far.
    pub fn errors(&self) -> &ErrorLog {
        &self.errors
    }

    fn containers_dir(&self) -> PathBuf {
        self.config.hook_path.join("containers")
    }

    /// One scan pass with the pods now known.
    pub fn refresh(&self, pods: PodIndex) {
        let pods = Arc::new(pods);
        for problem in &pods.dra_problems {
            self.errors.record("dra_claim", "ResourceClaims", problem);
        }
        for claim in &pods.dra_unreadable {
            self.errors.record("dra_claim_unreadable", claim, claim);
        }
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
        self.scan_claim_dirs(&pods);
        self.resolve_host_pids();
        let (mut host, devices) = match amd_host(&self.config.sys_root) {
            Ok(found) => found,
            Err(e) => {
                self.errors
                    .record("sysfs", &self.config.sys_root.display().to_string(), &e);
                (Vec::new(), Vec::new())
            }
        };
        host.extend(self.nvidia_host_gpus());
        write_lock(&self.host, Arc::new(host));
        self.sample_fdinfo(&pods, &devices, Instant::now());
    }

    /// Writes the host pid into HAMi-core slots whose process runs in a private PID
    /// namespace (`hostpid == 0`), found by mapping and innermost pid (`host_pids`).
    fn resolve_host_pids(&self) {
        // (path, layout, id, unresolved (slot, pid)); the lock is not held while /proc is
        // read, so scrapes are not delayed by the scan.
        let mut wanted = Vec::new();
        let tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        for t in tracked.values() {
            for (path, region) in t.regions.values() {
                let Region::Core(file) = region else { continue };
                let Ok(bytes) = read_core_bytes(file) else {
                    continue;
                };
                let Ok(layout) = hami_core_region::detect_layout(&bytes) else {
                    continue;
                };
                let unresolved = hami_core_region::unresolved_slots(&bytes, layout);
                if unresolved.is_empty() {
                    continue;
                }
                if let Ok(id) = file.id() {
                    wanted.push((path.clone(), layout, id, unresolved));
                }
            }
        }
        drop(tracked);
        if wanted.is_empty() {
            return;
        }
        let Ok(pids) = self.proc.pids() else { return };
        let mut mappers: Vec<Vec<(i32, i32)>> = vec![Vec::new(); wanted.len()];
        for pid in pids {
            let Some(ns) = self.proc.nspids(pid) else {
                continue;
            };
            // Only processes in a child PID namespace; the hook resolves host ones itself.
            let (Some(&host), Some(&inner), true) = (ns.first(), ns.last(), ns.len() > 1) else {
                continue;
            };
            let Some(maps) = self.proc.maps(pid) else {
                continue;
            };
            for (i, w) in wanted.iter().enumerate() {
                if crate::host_pids::maps_file(&maps, w.2) {
                    mappers[i].push((host, inner));
                }
            }
        }
        for ((path, layout, id, unresolved), mappers) in wanted.iter().zip(&mappers) {
            for (slot, hostpid) in crate::host_pids::resolve(unresolved, mappers) {
                let base = layout.procs + slot * layout.slot.size;
                let Some(&(_, pid)) = unresolved.iter().find(|(s, _)| *s == slot) else {
                    continue;
                };
                let guard = (base + layout.slot.pid, pid);
                let at = base + layout.slot.hostpid;
                if let Err(e) = RegionFile::write_i32_at(path, *id, guard, at, hostpid) {
                    self.errors
                        .record("hostpid_write", &path.display().to_string(), &e);
                }
            }
        }
    }

    /// NVIDIA GPUs through NVML (memory in use, utilization); none without NVML.
    fn nvidia_host_gpus(&self) -> Vec<HostGpu> {
        let mut state = self.nvml.lock().unwrap_or_else(|p| p.into_inner());
        if let NvmlState::NotTried = *state {
            *state = match &self.config.nvml_library {
                None => NvmlState::Unavailable,
                Some(library) => match hami_nvml::Nvml::load(library) {
                    Ok(nvml) => {
                        tracing::info!(%library, "NVML loaded: NVIDIA host metrics (hami_host_gpu_*) are emitted");
                        NvmlState::Loaded(nvml)
                    }
                    Err(e) => {
                        tracing::info!("NVIDIA host metrics are not emitted: {e}");
                        NvmlState::Unavailable
                    }
                },
            };
        }
        let NvmlState::Loaded(nvml) = &*state else {
            return Vec::new();
        };
        let count = match nvml.count() {
            Ok(count) => count,
            Err(e) => {
                self.errors.record("nvml", "nvmlDeviceGetCount_v2", &e);
                return Vec::new();
            }
        };
        (0..count)
            .filter_map(|index| match nvml.usage(index) {
                Ok(u) => Some(HostGpu {
                    index,
                    device_type: hami_protocol::names::Vendor::Nvidia.device_type(&u.name),
                    uuid: u.uuid,
                    pci_bdf: String::new(),
                    memory_used: Some(u.memory_used),
                    busy_percent: u.gpu_percent.map(f64::from),
                }),
                Err(e) => {
                    self.errors.record("nvml", &format!("GPU {index}"), &e);
                    None
                }
            })
            .collect()
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
        let containers = tracked
            .keys()
            .map(String::as_str)
            .filter(|k| !k.starts_with(CLAIM_KEY));
        let gone: Vec<String> = forgotten(containers, &present)
            .into_iter()
            .map(str::to_owned)
            .collect();
        for name in gone {
            tracked.remove(&name);
        }
        for entry in &entries {
            let subject = entry.path.display().to_string();
            let known = |uid: &str| pods.get(uid).is_some();
            let (uid, container) = match dir_action(
                &entry.name,
                entry.mtime,
                known,
                now,
                self.config.gc_grace,
            ) {
                DirAction::Track { pod_uid, container } => (pod_uid, container),
                DirAction::HookConfigs => {
                    self.prune_hook_configs(&entry.path, pods, now);
                    continue;
                }
                DirAction::BadName => {
                    self.errors.record(
                        "dir_bad_name",
                        &subject,
                        &"the name is not <podUID>_<container>",
                    );
                    continue;
                }
                DirAction::WaitForPod => {
                    self.errors.record("dir_no_pod", &subject, &"no pod on this node has this UID (yet); removed once the grace period passed");
                    continue;
                }
                DirAction::Remove => {
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
            };
            self.keep_within_budget(&entry.path, &subject);
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
                    claim: None,
                    regions: BTreeMap::new(),
                });
            self.follow_regions(slot, &entry.path, &files);
        }
    }

    /// Removes the AMD plugin's hook configs (and temporary files) in `dir` whose pod is
    /// gone, by the rule of the containers' directories
    /// ([`crate::cache_dirs::hook_config_action`]). The plugin rewrites a container's
    /// config at its next Allocate, so a removal can never cost a running container one.
    fn prune_hook_configs(&self, dir: &Path, pods: &PodIndex, now: SystemTime) {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                self.errors
                    .record("cache_dir_unreadable", &dir.display().to_string(), &e);
                return;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let subject = path.display().to_string();
            // `DirEntry::metadata` does not follow a link.
            let Ok(meta) = entry.metadata() else { continue };
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                self.errors.record(
                    "hook_config_bad_name",
                    &subject,
                    &"the name is not UTF-8 <podUID>_<container>.conf",
                );
                continue;
            };
            let action = if meta.is_dir() {
                HookConfig::BadName
            } else {
                hook_config_action(
                    &name,
                    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    |uid| pods.get(uid).is_some(),
                    now,
                    self.config.gc_grace,
                )
            };
            match action {
                HookConfig::Keep => {}
                HookConfig::BadName => self.errors.record(
                    "hook_config_bad_name",
                    &subject,
                    &"not a <podUID>_<container>.conf file the device plugin writes; left alone",
                ),
                HookConfig::Remove => match std::fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(file = %subject, "removed the hook config of a pod that no longer exists")
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => self.errors.record("hook_config_remove", &subject, &e),
                },
            }
        }
    }

    /// Holds a tracked cache directory to [`cache_budget::CACHE_DIR_BUDGET`] besides its
    /// region files: past it, what the tenant wrote there is removed and counted
    /// (`cache_over_budget`).
    fn keep_within_budget(&self, dir: &Path, subject: &str) {
        let measured = match cache_budget::measure(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                self.errors.record("cache_io", subject, &e);
                return;
            }
        };
        let plan = cache_budget::budget_plan(&measured, cache_budget::CACHE_DIR_BUDGET);
        if !plan.exceeded {
            return;
        }
        let shown: Vec<_> = plan.remove.iter().take(5).collect();
        let what = format!(
            "{}{} entries, {} bytes besides the region files, over the budget ({} bytes, {} entries): removed {} ({shown:?}{}){}",
            measured.count,
            if measured.incomplete { "+" } else { "" },
            plan.over,
            cache_budget::CACHE_DIR_BUDGET,
            cache_budget::MAX_ENTRIES,
            plan.remove.len(),
            if plan.remove.len() > shown.len() {
                " …"
            } else {
                ""
            },
            if plan.shrink.is_empty() {
                String::new()
            } else {
                format!(
                    ", region files cut back to {} bytes: {:?}",
                    cache_budget::REGION_ALLOWANCE,
                    plan.shrink
                )
            },
        );
        self.errors.record("cache_over_budget", subject, &what);
        if let Err(e) = cache_budget::reclaim(dir, &plan) {
            self.errors.record("cache_remove", subject, &e);
        }
    }

    /// Opens and closes `slot`'s regions as `dir` now lists `files`.
    fn follow_regions(&self, slot: &mut Tracked, dir: &Path, files: &[String]) {
        let changes = region_changes(slot.regions.keys().map(String::as_str), files);
        for file in &changes.close {
            slot.regions.remove(file);
        }
        for file in changes.open {
            let path = dir.join(&file);
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

    /// DRA claims' cache directories, `<HOOK_PATH>/dra/claims/<claim uid>/` (the driver's
    /// `--cache-root=<HOOK_PATH>/dra`, `hami_dra_core::prepare`): tracked while a pod of
    /// the node uses the claim ([`claim_dir_tracked`]), for the container
    /// `PodIndex::claims` names. Never removed here: the driver removes them at
    /// unprepare, also after a restart.
    fn scan_claim_dirs(&self, pods: &PodIndex) {
        let root = self.config.hook_path.join("dra").join("claims");
        let entries = match list_dirs(&root) {
            Ok(entries) => entries,
            // Not a DRA node (or nothing prepared yet).
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                self.errors
                    .record("cache_dir_unreadable", &root.display().to_string(), &e);
                Vec::new()
            }
        };
        let mut tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        let keep: std::collections::HashSet<String> = entries
            .iter()
            .filter(|e| claim_dir_tracked(&e.name, pods))
            .map(|e| format!("{CLAIM_KEY}{}", e.name))
            .collect();
        tracked.retain(|k, _| !k.starts_with(CLAIM_KEY) || keep.contains(k));
        for entry in entries {
            let Some(region) = pods.claims.get(&entry.name) else {
                continue;
            };
            let subject = entry.path.display().to_string();
            self.keep_within_budget(&entry.path, &subject);
            let files = match file_names(&entry.path) {
                Ok(names) => match cache_files(&names) {
                    Ok(files) => files,
                    Err(e) => {
                        self.errors.record("cache_too_many", &subject, &e);
                        continue;
                    }
                },
                Err(e) => {
                    self.errors.record("cache_io", &subject, &e);
                    continue;
                }
            };
            let slot = tracked
                .entry(format!("{CLAIM_KEY}{}", entry.name))
                .or_insert_with(|| Tracked {
                    pod_uid: region.pod_uid.clone(),
                    container: region.container.clone(),
                    claim: Some(entry.name.clone()),
                    regions: BTreeMap::new(),
                });
            // The claim's owner may change (its first container's pod was replaced).
            slot.pod_uid.clone_from(&region.pod_uid);
            slot.container.clone_from(&region.container);
            self.follow_regions(slot, &entry.path, &files);
        }
    }

    fn sample_fdinfo(&self, pods: &PodIndex, devices: &[RegisteredDevice], now: Instant) {
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
                        let found = device_locator::locate(
                            devices,
                            device_locator::DrmClient {
                                pdev: Some(&client.pdev),
                                minor: client.minor,
                            },
                        );
                        match found {
                            Ok(device) => add_client_on(sample, &device.info.id, client),
                            // Not a registered GPU (another plugin's, or not AMD): kept
                            // under its PCI address, without a vdevice_index.
                            Err(LocateError::UnknownPdev(_) | LocateError::UnknownMinor(_))
                                if !devices
                                    .iter()
                                    .any(|d| d.pci_bdf.eq_ignore_ascii_case(&client.pdev)) =>
                            {
                                add_client_on(sample, &client.pdev, client)
                            }
                            Err(e) => self.errors.record(
                                "fdinfo_unattributed",
                                &format!("pid {pid}"),
                                &format!("a DRM client of this process: {e}"),
                            ),
                        }
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
        let published: AmdUtil = result
            .into_iter()
            .map(|(key, by_device)| {
                let granted = pods
                    .get(&key.0)
                    .and_then(|p| p.container(&key.1))
                    .map(|c| c.amd.clone())
                    .unwrap_or_default();
                let devices = amd_container_devices(&by_device, &granted);
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
            let mut tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
            // Files over their time budget: dropped, re-opened by the next scan.
            let mut slow: Vec<(String, String)> = Vec::new();
            for (name, t) in tracked.iter() {
                // A pod deleted since the scan: nothing to label it with; skip quietly.
                let Some(pod) = pods.get(&t.pod_uid) else {
                    continue;
                };
                let info = pod.container(&t.container);
                let mut devices = Vec::new();
                let mut last_kernel_elapsed = None;
                for (file_name, (path, region)) in &t.regions {
                    match region {
                        Region::Core(file) => {
                            let bytes = match read_core_bytes(file) {
                                Ok(bytes) => bytes,
                                Err(e) => {
                                    if matches!(e, LoadError::File(FileError::TooSlow)) {
                                        slow.push((name.clone(), file_name.clone()));
                                    }
                                    self.errors
                                        .record(e.kind(), &path.display().to_string(), &e);
                                    continue;
                                }
                            };
                            match hami_core_region::read_region(&bytes, &|pid| {
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
                        Region::Hip(region_file) => {
                            let bytes = match read_hip_bytes(region_file) {
                                Ok(bytes) => bytes,
                                Err(e) => {
                                    if matches!(e, LoadError::File(FileError::TooSlow)) {
                                        slow.push((name.clone(), file_name.clone()));
                                    }
                                    self.errors
                                        .record(e.kind(), &path.display().to_string(), &e);
                                    continue;
                                }
                            };
                            let file = region_file.file();
                            let mut alive = |slot: usize| {
                                record_locked(file, hami_region::layout::slot_offset(slot))
                            };
                            match hip_region::read_region(&bytes, &mut alive) {
                                Ok(reading) => {
                                    let granted = info.map(|c| c.amd.as_slice()).unwrap_or(&[]);
                                    let util =
                                        amd_util.get(&(t.pod_uid.clone(), t.container.clone()));
                                    with_region.insert((t.pod_uid.clone(), t.container.clone()));
                                    let claim = t.claim.as_ref().map(|c| pods.claims.get(c));
                                    for d in &reading.devices {
                                        let (vdevice_index, uuid) =
                                            region_device(claim, granted, d.index);
                                        let utilization = util.and_then(|u| {
                                            u.iter().find(|x| x.uuid == uuid).map(|x| x.util)
                                        });
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
            for (dir, file) in slow {
                if let Some(t) = tracked.get_mut(&dir) {
                    t.regions.remove(&file);
                }
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
            whole_cards: pods.whole_cards.clone(),
            host: read_lock(&self.host),
            errors: self.errors.counts(),
        }
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
mod tests {
    use super::*;
    use crate::dra_claims::{ClaimRegion, RegionDevice};
    use hami_protocol::device_list::ContainerDevice;

    #[test]
    fn region_devices_by_container_list_or_by_claim() {
        let granted = vec![ContainerDevice {
            uuid: "G0".into(),
            device_type: "AMD Instinct MI210".into(),
            mem_mib: 1024,
            cores: 10,
        }];
        // A container directory: the position in the granted list.
        assert_eq!(region_device(None, &granted, 0), (Some(0), "G0".into()));
        assert_eq!(
            region_device(None, &granted, 1),
            (Some(1), "hip-device-1".into())
        );
        // A claim directory: the claim's device at that position, whatever the list says.
        let claim = ClaimRegion {
            pod_uid: "p".into(),
            container: "c".into(),
            devices: vec![
                RegionDevice {
                    vdevice_index: None,
                    uuid: "U0".into(),
                },
                RegionDevice {
                    vdevice_index: Some(0),
                    uuid: "U1".into(),
                },
            ],
        };
        assert_eq!(
            region_device(Some(Some(&claim)), &granted, 0),
            (None, "U0".into())
        );
        assert_eq!(
            region_device(Some(Some(&claim)), &granted, 1),
            (Some(0), "U1".into())
        );
        assert_eq!(
            region_device(Some(Some(&claim)), &granted, 2),
            (None, "hip-device-2".into())
        );
        // The claim left the index since the scan: no device name is invented.
        assert_eq!(
            region_device(Some(None), &granted, 0),
            (None, "hip-device-0".into())
        );
        let mut pods = PodIndex::default();
        pods.claims.insert("c-1".into(), claim);
        assert!(claim_dir_tracked("c-1", &pods) && !claim_dir_tracked("c-2", &pods));
    }
}
