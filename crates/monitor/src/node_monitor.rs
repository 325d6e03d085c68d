//! The monitor's state and its two passes:
//! - [`NodeMonitor::refresh`] (every few seconds): scan the cache directories, map them to
//!   pods, remove those of pods that are gone, map new region files (what the scan does is
//!   decided by [`crate::scan_plan`]), read host GPUs and sample DRM fdinfo for AMD
//!   utilization (published atomically);
//! - [`NodeMonitor::snapshot`] (each scrape): gather — read every mapped region under the
//!   tracking lock (`region_reading.rs`) — then, the lock released, the pure
//!   [`crate::scrape::assemble`] decides the samples for [`crate::metrics`]. It never fails
//!   as a whole: a bad region is skipped and counted.
//! - after each refresh, the memory-hook check ([`crate::hook_check`], issue 29).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::cache_budget;
use crate::cache_dirs::{HookConfig, cache_files, file_names, hook_config_action, list_dirs};
use crate::errors::ErrorLog;
use crate::fdinfo::{BusySample, add_client_on};
use crate::hami_core_region;
use crate::host_gpus::{HostGpu, amd_host};
use crate::pods::PodIndex;
use crate::procfs::ProcRoot;
use crate::region_file::{FileError, RegionFile};
use crate::region_reading::{self, LoadError, Region, load_region, read_core_bytes};
use crate::scan_plan::{DirAction, dir_action, forgotten, region_changes};
use crate::scrape::{self, AmdUtil, Gathered, GatheredDir};
use crate::utilization::{ContainerKey, FdSampler, amd_container_devices};
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

// What a scrape reports, and its pure assembly, live in `scrape.rs`; these paths stay.
pub use crate::scrape::{
    Allocation, ContainerMetrics, DeviceMetrics, Snapshot, allocations, claim_dir_tracked,
    region_device,
};

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
    hooks: crate::hook_check::HookWatch,
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
            hooks: crate::hook_check::HookWatch::default(),
        }
    }

    /// The memory-hook check (issue 29): its counts and the Events it queued.
    pub fn hooks(&self) -> &crate::hook_check::HookWatch {
        &self.hooks
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
        self.hooks.check(&self.proc, &pods);
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
        let now_secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let dirs = self.gather(&pods);
        let hooks = self.hooks.tallies();
        let mut snapshot = scrape::assemble(Gathered {
            node: self.config.node_name.clone(),
            amd_util: read_lock(&self.amd_util),
            now_secs,
            dirs,
            host: read_lock(&self.host),
            errors: self.errors.counts(),
            pods,
        });
        snapshot.hooks = hooks;
        snapshot
    }

    /// The scrape's I/O, under the tracking lock: every region of each tracked directory
    /// whose pod is known, read and decoded; a file that fails is counted, and one over its
    /// time budget dropped (the next scan opens it again).
    fn gather(&self, pods: &PodIndex) -> Vec<GatheredDir> {
        let mut tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        let mut slow: Vec<(String, String)> = Vec::new();
        let mut dirs = Vec::new();
        for (name, t) in tracked.iter() {
            // A pod deleted since the scan: nothing to label it with; not read.
            if pods.get(&t.pod_uid).is_none() {
                continue;
            }
            let mut readings = Vec::new();
            for (file_name, (path, region)) in &t.regions {
                match region_reading::read(region, &self.proc) {
                    Ok(reading) => readings.push(reading),
                    Err(e) => {
                        if matches!(e, LoadError::File(FileError::TooSlow)) {
                            slow.push((name.clone(), file_name.clone()));
                        }
                        self.errors
                            .record(e.kind(), &path.display().to_string(), &e);
                    }
                }
            }
            dirs.push(GatheredDir {
                pod_uid: t.pod_uid.clone(),
                container: t.container.clone(),
                claim: t.claim.clone(),
                readings,
            });
        }
        for (dir, file) in slow {
            if let Some(t) = tracked.get_mut(&dir) {
                t.regions.remove(&file);
            }
        }
        dirs
    }
}
