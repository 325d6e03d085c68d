//! cgroup v2 `dmem` limits (kernel ≥ 6.14), the shell: find the pod's cgroup and write the
//! pod's limits (`dmem_plan::pod_dmem`) into its `dmem.max`.
//!
//! Why the pod cgroup (see `dmem_plan`): it exists before every container of the pod and
//! outlives their restarts; the kernel applies a parent's `dmem.max` to the whole subtree.
//! Kubelet creates it after Allocate returns (device plugin), so the writer waits for it
//! (bounded); before NodePrepareResources (DRA), so the limit is written at once. Which
//! directory is the pod's, and how long to wait, is `pod_cgroup` (pure). The layouts
//! below are what kubelet + containerd / CRI-O create:
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
use std::time::Duration;

pub use crate::dmem_plan::DmemLimit;
pub use crate::pod_cgroup::is_pod_cgroup_name;
use crate::pod_cgroup::{CgroupWait, EntryKind, SEARCH_DEPTH, entry_kind};

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

/// The pod's cgroup directory, searched a few levels below the root (kubelet's
/// `--cgroup-root` may add levels above `kubepods`). Container cgroups are never matched;
/// which directory is what is [`entry_kind`].
pub fn find_pod_cgroup(cgroup_root: &Path, pod_uid: &str) -> Option<PathBuf> {
    let mut frontier = vec![cgroup_root.to_path_buf()];
    for _ in 0..SEARCH_DEPTH {
        let mut next = Vec::new();
        for dir in frontier {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                // Only real directories: a symlink in the hierarchy is not a cgroup.
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                match entry_kind(&name, pod_uid) {
                    EntryKind::Pod => return Some(entry.path()),
                    EntryKind::Descend => next.push(entry.path()),
                    EntryKind::Skip => {}
                }
            }
        }
        frontier = next;
    }
    None
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

/// Applies one job: waits up to `timeout` for the pod cgroup, then writes its limits.
pub async fn apply_job(
    cgroup_root: &Path,
    job: DmemJob,
    timeout: Duration,
) -> Result<PathBuf, String> {
    let now = || tokio::time::Instant::now().into_std();
    let wait = CgroupWait::new(now(), timeout);
    loop {
        if let Some(dir) = find_pod_cgroup(cgroup_root, &job.pod_uid) {
            write_limits(&dir, &job.limits)?;
            return Ok(dir);
        }
        let Some(pause) = wait.after_miss(now()) else {
            return Err(format!(
                "no cgroup of pod {} appeared under {} within {timeout:?}: dmem limit not applied",
                job.pod_uid,
                cgroup_root.display()
            ));
        };
        tokio::time::sleep(pause).await;
    }
}

/// Where jobs go: [`DmemWriter::submit`] writes at once when the pod's cgroup is already
/// there, else the writer task waits for it (bounded).
#[derive(Debug, Clone)]
pub struct DmemWriter {
    cgroup_root: PathBuf,
    available: bool,
    tx: tokio::sync::mpsc::UnboundedSender<DmemJob>,
}

impl DmemWriter {
    /// Applies `job` now if its pod's cgroup exists — in DRA, kubelet makes it before
    /// NodePrepareResources (`Kubelet.SyncPod`'s `pcm.EnsureExists`), so the limit is in
    /// place before the prepare answers and any container starts — else hands it to the
    /// writer task (the device plugin's Allocate comes before the pod cgroup). Returns the
    /// cgroup written now, if any; failures are logged (the hook still limits memory).
    pub fn submit(&self, job: DmemJob) -> Option<PathBuf> {
        if !self.available {
            return None;
        }
        if let Some(dir) = find_pod_cgroup(&self.cgroup_root, &job.pod_uid) {
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
        let _ = self.tx.send(job);
        None
    }
}

/// The writer task: applies jobs as they come (only when the controller is available; the
/// caller reports its absence once).
pub fn spawn_writer(cgroup_root: PathBuf, timeout: Duration) -> DmemWriter {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<DmemJob>();
    let available = dmem_available(&cgroup_root);
    let root = cgroup_root.clone();
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            if !available {
                continue;
            }
            let root = root.clone();
            tokio::spawn(async move {
                match apply_job(&root, job, timeout).await {
                    Ok(cg) => tracing::info!(cgroup = %cg.display(), "dmem limit applied"),
                    Err(e) => tracing::warn!("{e}"),
                }
            });
        }
    });
    DmemWriter {
        cgroup_root,
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
