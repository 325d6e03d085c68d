//! cgroup v2 `dmem` limits (kernel ≥ 6.14), the shell: find the pod's cgroup and write the
//! pod's limits (`dmem_plan::pod_dmem`) into its `dmem.max`.
//!
//! Why the pod cgroup (see `dmem_plan`): it exists before every container of the pod and
//! outlives their restarts; the kernel applies a parent's `dmem.max` to the whole subtree.
//! Kubelet creates it after Allocate returns (device plugin), so the writer waits for it
//! (bounded, on a thread of its own); before NodePrepareResources (DRA), so the limit is
//! written at once. Which directory is the pod's — computed from the QoS class and the
//! cgroup driver, as kubelet names it, so looking is a few `stat`s and never a walk of the
//! tree — and how long to wait, is `pod_cgroup` (pure). The layouts below are what
//! kubelet + containerd / CRI-O create:
//!
//! ```text
//! systemd driver:  kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/
//!                  (Guaranteed: kubepods.slice/kubepods-pod<uid with _>.slice/)
//!                  containerd: cri-containerd-<id>.scope   CRI-O: crio-<id>.scope, crio-conmon-<id>.scope
//! cgroupfs driver: kubepods/<qos>/pod<uid>/   (Guaranteed: kubepods/pod<uid>/)
//!                  containerd: <id>                        CRI-O: crio-<id>, crio-conmon-<id>
//! ```
//!
//! Writing is idempotent (each Allocate of the pod writes the same, whole-pod values), so
//! a plugin restart or a second container changes nothing. Where the controller is absent,
//! or a level above the pod cgroups does not enable it, the plugin says so once per change
//! (log, node Event, `hami.io/amd-dmem` annotation: `dmem_delegation`, `dmem_watch`): the
//! hook still limits memory.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use crate::dmem_plan::DmemLimit;
pub use crate::pod_cgroup::{CgroupDriver, Qos, is_pod_cgroup_name};
use crate::pod_cgroup::{CgroupWait, POLL, driver_from_top, pod_cgroup_candidates};

/// The pod's limits, to apply once its cgroup appears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmemJob {
    /// The pod whose cgroup gets the limits.
    pub pod_uid: String,
    /// One limit per VRAM region.
    pub limits: Vec<DmemLimit>,
}

/// Whether the dmem controller is available: the root lists it in `cgroup.controllers`.
pub fn dmem_available(cgroup_root: &Path) -> bool {
    std::fs::read_to_string(cgroup_root.join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|w| w == "dmem"))
        .unwrap_or(false)
}

/// Whether `path` is a real directory (a symlink in the hierarchy is not a cgroup).
fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// The node's cgroup driver as its top cgroups show it (`kubepods.slice` or `kubepods`
/// directly under the root): two `stat`s, no walk; `None` while neither or both exist.
pub fn detect_driver(cgroup_root: &Path) -> Option<CgroupDriver> {
    driver_from_top(
        is_real_dir(&cgroup_root.join(CgroupDriver::Systemd.kubepods())),
        is_real_dir(&cgroup_root.join(CgroupDriver::Cgroupfs.kubepods())),
    )
}

/// The pod cgroup of `pod_uid` at the path kubelet gives it (`pod_cgroup`): with the driver
/// and QoS class known one directory is checked, otherwise each driver's and class's (at
/// most six `stat`s, never a walk of the tree).
pub fn find_pod_cgroup_at(
    cgroup_root: &Path,
    driver: Option<CgroupDriver>,
    qos: Option<Qos>,
    pod_uid: &str,
) -> Option<PathBuf> {
    pod_cgroup_candidates(driver, qos, pod_uid)
        .into_iter()
        .map(|rel| cgroup_root.join(rel))
        .find(|p| is_real_dir(p))
}

/// The pod's cgroup directory, where kubelet puts it for the node's driver (detected from
/// the top cgroups) and any QoS class. Container cgroups are never matched.
pub fn find_pod_cgroup(cgroup_root: &Path, pod_uid: &str) -> Option<PathBuf> {
    find_pod_cgroup_at(cgroup_root, detect_driver(cgroup_root), None, pod_uid)
}

/// Where the writer looks: the root and the node's driver, detected once (when exactly one
/// of kubelet's top cgroups exists) and kept.
#[derive(Debug)]
struct PodCgroups {
    root: PathBuf,
    driver: OnceLock<CgroupDriver>,
}

impl PodCgroups {
    fn driver(&self) -> Option<CgroupDriver> {
        if let Some(d) = self.driver.get() {
            return Some(*d);
        }
        let detected = detect_driver(&self.root)?;
        Some(*self.driver.get_or_init(|| detected))
    }

    fn find(&self, pod_uid: &str, qos: Option<Qos>) -> Option<PathBuf> {
        find_pod_cgroup_at(&self.root, self.driver(), qos, pod_uid)
    }
}

/// Writes the limits into `<cgroup>/dmem.max`: one region per `write(2)` on one open file,
/// as the kernel parses each write on its own.
pub fn write_limits(cgroup: &Path, limits: &[DmemLimit]) -> Result<(), String> {
    let path = cgroup.join("dmem.max");
    if !path.is_file() {
        let parent = cgroup.parent().unwrap_or(cgroup);
        return Err(format!(
            "{} does not exist: the dmem controller is not enabled for this cgroup (add +dmem to cgroup.subtree_control of {} and of each cgroup above it; the node's hami.io/amd-dmem annotation names them); the hook still limits memory",
            path.display(),
            parent.display()
        ));
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    for limit in limits {
        file.write_all(format!("{} {}\n", limit.region, limit.bytes).as_bytes())
            .map_err(|e| format!("cannot write {} to {}: {e}", limit.region, path.display()))?;
    }
    Ok(())
}

/// Waits (blocking, bounded by `timeout`) for the pod's cgroup at its computed path, then
/// writes its limits. Checks every `POLL`: a few `stat`s each time, never a walk.
fn wait_and_write(
    cgroups: &PodCgroups,
    job: &DmemJob,
    qos: Option<Qos>,
    timeout: Duration,
) -> Result<PathBuf, String> {
    let wait = CgroupWait::new(Instant::now(), timeout);
    loop {
        if let Some(dir) = cgroups.find(&job.pod_uid, qos) {
            write_limits(&dir, &job.limits)?;
            return Ok(dir);
        }
        let Some(pause) = wait.after_miss(Instant::now()) else {
            return Err(not_appeared(&cgroups.root, &job.pod_uid, timeout));
        };
        std::thread::sleep(pause);
    }
}

fn not_appeared(cgroup_root: &Path, pod_uid: &str, timeout: Duration) -> String {
    format!(
        "no cgroup of pod {pod_uid} appeared under {} within {timeout:?}: dmem limit not applied",
        cgroup_root.display()
    )
}

/// Applies one job: waits up to `timeout` for the pod cgroup (any QoS class), then writes
/// its limits. The wait runs on a blocking thread, never on a tokio worker.
pub async fn apply_job(
    cgroup_root: &Path,
    job: DmemJob,
    timeout: Duration,
) -> Result<PathBuf, String> {
    let cgroups = PodCgroups {
        root: cgroup_root.to_path_buf(),
        driver: OnceLock::new(),
    };
    tokio::task::spawn_blocking(move || wait_and_write(&cgroups, &job, None, timeout))
        .await
        .map_err(|e| format!("the dmem wait ended abnormally: {e}"))?
}

/// Where jobs go: [`DmemWriter::submit`] writes at once when the pod's cgroup is already
/// there, else the writer thread waits for it (bounded).
#[derive(Debug, Clone)]
pub struct DmemWriter {
    cgroups: Arc<PodCgroups>,
    available: bool,
    tx: Sender<(DmemJob, Option<Qos>)>,
}

impl DmemWriter {
    /// Applies `job` now if its pod's cgroup exists — in DRA, kubelet makes it before
    /// NodePrepareResources (`Kubelet.SyncPod`'s `pcm.EnsureExists`), so the limit is in
    /// place before the prepare answers and any container starts — else hands it to the
    /// writer thread (the device plugin's Allocate comes before the pod cgroup). Returns the
    /// cgroup written now, if any; failures are logged (the hook still limits memory).
    /// Looking costs a few `stat`s at the paths kubelet would use (any QoS class).
    pub fn submit(&self, job: DmemJob) -> Option<PathBuf> {
        self.submit_with_qos(job, None)
    }

    /// [`submit`](Self::submit) for a pod whose QoS class is known (`Qos::of_pod`): one
    /// path is checked, now and while waiting.
    pub fn submit_with_qos(&self, job: DmemJob, qos: Option<Qos>) -> Option<PathBuf> {
        if !self.available {
            return None;
        }
        if let Some(dir) = self.cgroups.find(&job.pod_uid, qos) {
            return match write_limits(&dir, &job.limits) {
                Ok(()) => {
                    tracing::info!(cgroup = %dir.display(), "dmem limit applied");
                    Some(dir)
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    None
                }
            };
        }
        let _ = self.tx.send((job, qos));
        None
    }
}

/// A job the writer thread waits for.
struct Pending {
    job: DmemJob,
    qos: Option<Qos>,
    wait: CgroupWait,
}

/// The writer thread: keeps the jobs whose pod cgroup is not there yet and checks each one's
/// path every `POLL` until it appears (written) or its wait ends (logged). It ends when
/// every [`DmemWriter`] is gone and nothing is pending.
fn writer_thread(cgroups: &PodCgroups, rx: &Receiver<(DmemJob, Option<Qos>)>, timeout: Duration) {
    let mut pending: Vec<Pending> = Vec::new();
    let mut open = true;
    while open || !pending.is_empty() {
        let next = if pending.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else if open {
            rx.recv_timeout(POLL)
        } else {
            std::thread::sleep(POLL);
            Err(RecvTimeoutError::Timeout)
        };
        match next {
            Ok((job, qos)) => pending.push(Pending {
                job,
                qos,
                wait: CgroupWait::new(Instant::now(), timeout),
            }),
            Err(RecvTimeoutError::Disconnected) => open = false,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        pending.retain(|p| {
            if let Some(dir) = cgroups.find(&p.job.pod_uid, p.qos) {
                match write_limits(&dir, &p.job.limits) {
                    Ok(()) => tracing::info!(cgroup = %dir.display(), "dmem limit applied"),
                    Err(e) => tracing::warn!("{e}"),
                }
                return false;
            }
            if p.wait.after_miss(now).is_none() {
                tracing::warn!("{}", not_appeared(&cgroups.root, &p.job.pod_uid, timeout));
                return false;
            }
            true
        });
    }
}

/// The writer: applies jobs as they come (only when the controller is available; the caller
/// reports its absence once). Waiting jobs are checked on one thread of their own, so no
/// tokio worker ever waits on the cgroup tree.
pub fn spawn_writer(cgroup_root: PathBuf, timeout: Duration) -> DmemWriter {
    let (tx, rx) = std::sync::mpsc::channel::<(DmemJob, Option<Qos>)>();
    let available = dmem_available(&cgroup_root);
    let cgroups = Arc::new(PodCgroups {
        root: cgroup_root,
        driver: OnceLock::new(),
    });
    if available {
        let waiting = Arc::clone(&cgroups);
        let spawned = std::thread::Builder::new()
            .name("dmem-writer".into())
            .spawn(move || writer_thread(&waiting, &rx, timeout));
        if let Err(e) = spawned {
            tracing::warn!(
                "cannot start the dmem writer thread ({e}): pod cgroups made after Allocate get no dmem limit"
            );
        }
    }
    DmemWriter {
        cgroups,
        available,
        tx,
    }
}

/// The message for a node without the controller.
pub fn absent_message(cgroup_root: &Path) -> String {
    format!(
        "the dmem cgroup controller is absent on this node ({}/cgroup.controllers does not list dmem: kernel older than 6.14, or the controller is not enabled): device memory of slices is limited by the libamvgpu.so hook only",
        cgroup_root.display()
    )
}
