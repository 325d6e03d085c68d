//! A node's pod cgroups as kubelet and containerd make them, in a cgroup v2 tree that is a
//! directory (a simulated node's `sys/fs/cgroup`); names from [`crate::cgroup_layout`].
//!
//! When, as on a real node (and never earlier):
//! - at start, `kubepods` and its QoS levels (kubelet's QoS manager);
//! - once a pod is admitted (Allocate done), its pod cgroup: kubelet's `SyncPod` makes it
//!   (`pcm.EnsureExists`) before the runtime's `SyncPod` calls `PrepareDynamicResources`,
//!   so a DRA driver's NodePrepareResources finds it there, and it stays while a failed
//!   prepare is retried;
//! - once the pod's claims are prepared, the sandbox's (pause: `createPodSandbox` comes
//!   right after the prepare);
//! - each app container's when that container starts (after the pod is reported Running);
//! - all of a pod's, containers first, once the pod is finished or gone and its claims are
//!   unprepared (kubelet's orphaned pod cgroup cleanup); found by scanning the tree, so a
//!   restarted kubelet-sim cleans up what an earlier one made.
//!
//! What the kernel would put in each new directory: `cgroup.controllers` (the parent's
//! `cgroup.subtree_control`), an empty `cgroup.subtree_control` and `cgroup.procs`, and
//! `dmem.max` where `dmem` is among the controllers. The root's `cgroup.controllers` says
//! what the node has; as runc's cgroup v2 manager does, every controller the parent has is
//! enabled in its `cgroup.subtree_control` before a child is made. `dmem.max` starts empty
//! (the kernel lists each region with `max`; a plain file cannot replace a line per write).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::cgroup_layout::{CgroupDriver, Layout, Qos};

/// Where and how this node's cgroups are made.
#[derive(Debug, Clone)]
pub struct CgroupConfig {
    /// The cgroup v2 root (`/sys/fs/cgroup` of the node).
    pub root: PathBuf,
    /// kubelet's `--cgroup-driver`.
    pub driver: CgroupDriver,
}

/// The node's pod cgroups (see the module doc).
#[derive(Debug, Clone)]
pub struct PodCgroups {
    root: PathBuf,
    layout: Layout,
}

fn controllers_of(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("cannot {what} {}: {e}", path.display())
}

impl PodCgroups {
    /// Makes `kubepods` and its QoS levels under `config.root` (which must exist).
    pub fn new(config: &CgroupConfig) -> Result<Self, String> {
        if !config.root.is_dir() {
            return Err(format!(
                "the cgroup root {} is not a directory",
                config.root.display()
            ));
        }
        let cgroups = PodCgroups {
            root: config.root.clone(),
            layout: Layout {
                driver: config.driver,
            },
        };
        for level in cgroups.layout.qos_levels() {
            cgroups.make(&level)?;
        }
        Ok(cgroups)
    }

    /// The names this node uses.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Makes every missing directory of `rel` (relative to the root), parents first, each
    /// as the kernel fills a new cgroup.
    fn make(&self, rel: &Path) -> Result<PathBuf, String> {
        let mut dir = self.root.clone();
        for part in rel.components() {
            let parent = dir.clone();
            dir.push(part);
            if dir.is_dir() {
                continue;
            }
            let enabled = controllers_of(&parent);
            let subtree = parent.join("cgroup.subtree_control");
            std::fs::write(&subtree, enabled.join(" ") + "\n")
                .map_err(|e| io_error("write", &subtree, e))?;
            // The kernel's new cgroup appears with its files: made aside, then renamed into
            // place, so a watcher that sees the directory (the AMD plugin's dmem writer, a
            // test) never finds it without `dmem.max` (a CI run did, right after mkdir).
            let making = parent.join(format!(
                ".{}.making-{}",
                part.as_os_str().to_string_lossy(),
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&making);
            std::fs::create_dir(&making).map_err(|e| io_error("create the cgroup", &making, e))?;
            let mut files = vec![
                ("cgroup.controllers", enabled.join(" ") + "\n"),
                ("cgroup.subtree_control", String::new()),
                ("cgroup.procs", String::new()),
            ];
            if enabled.iter().any(|c| c == "dmem") {
                files.push(("dmem.max", String::new()));
            }
            for (name, text) in files {
                let path = making.join(name);
                std::fs::write(&path, text).map_err(|e| io_error("write", &path, e))?;
            }
            if let Err(e) = std::fs::rename(&making, &dir) {
                let _ = std::fs::remove_dir_all(&making);
                // Another maker (a second kubelet-sim on this tree) was first: theirs stands.
                if !dir.is_dir() {
                    return Err(io_error("create the cgroup", &dir, e));
                }
            }
        }
        Ok(dir)
    }

    /// The pod cgroup of `uid` (made if missing; kubelet's `pcm.EnsureExists`).
    pub fn ensure_pod(&self, qos: Qos, uid: &str) -> Result<PathBuf, String> {
        self.make(&self.layout.pod(qos, uid))
    }

    /// The sandbox's (pause) cgroup of pod `uid` (made if missing; the pod's must exist).
    pub fn start_sandbox(&self, qos: Qos, uid: &str) -> Result<PathBuf, String> {
        let sandbox = crate::container_runtime::container_id(uid, crate::cgroup_layout::SANDBOX);
        self.in_pod(qos, uid, &sandbox, "the pod cgroup was never made")
    }

    /// The cgroup of container `id` of pod `uid` (made if missing; the pod's must exist).
    pub fn start_container(&self, qos: Qos, uid: &str, id: &str) -> Result<PathBuf, String> {
        self.in_pod(qos, uid, id, "its sandbox was never started")
    }

    /// Makes container `id`'s cgroup in the existing pod cgroup of `uid`.
    fn in_pod(&self, qos: Qos, uid: &str, id: &str, why: &str) -> Result<PathBuf, String> {
        let pod = self.root.join(self.layout.pod(qos, uid));
        if !pod.is_dir() {
            return Err(format!(
                "the pod cgroup {} is missing: {why}",
                pod.display()
            ));
        }
        self.make(&self.layout.container(qos, uid, id))
    }

    /// The pod cgroups in the tree, by pod uid.
    pub fn pods(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        for level in self.layout.qos_levels() {
            let dir = self.root.join(level);
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(uid) = self.layout.pod_uid(&name) {
                    out.push((uid, entry.path()));
                }
            }
        }
        out
    }

    /// Removes the cgroups of every pod not in `live` (its container cgroups first, as
    /// rmdir needs); returns the uids removed.
    pub fn remove_others(&self, live: &HashSet<String>) -> Vec<String> {
        let mut removed = Vec::new();
        for (uid, dir) in self.pods() {
            if live.contains(&uid) {
                continue;
            }
            for child in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if child.file_type().is_ok_and(|t| t.is_dir())
                    && let Err(e) = std::fs::remove_dir_all(child.path())
                {
                    tracing::warn!("cannot remove the cgroup {}: {e}", child.path().display());
                }
            }
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => removed.push(uid),
                Err(e) => tracing::warn!("cannot remove the pod cgroup {}: {e}", dir.display()),
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(name: &str, controllers: Option<&str>) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("kubelet-sim-cgroups-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        if let Some(c) = controllers {
            std::fs::write(root.join("cgroup.controllers"), c).unwrap();
        }
        root
    }

    #[test]
    fn controllers_flow_down_and_pods_come_and_go() {
        let root = tree("flow", Some("cpu memory dmem\n"));
        let cg = PodCgroups::new(&CgroupConfig {
            root: root.clone(),
            driver: CgroupDriver::Systemd,
        })
        .unwrap();
        let level = root.join("kubepods.slice/kubepods-burstable.slice");
        assert_eq!(controllers_of(&level), ["cpu", "memory", "dmem"]);
        // a container before its pod's sandbox is refused
        let err = cg.start_container(Qos::Burstable, "u-1", "c1").unwrap_err();
        assert!(err.contains("never started"), "{err}");
        // the sandbox before the pod cgroup is refused too
        let err = cg.start_sandbox(Qos::Burstable, "u-1").unwrap_err();
        assert!(err.contains("never made"), "{err}");
        let pod = cg.ensure_pod(Qos::Burstable, "u-1").unwrap();
        let sandbox = crate::container_runtime::container_id("u-1", "POD");
        // the pod cgroup alone (a DRA driver's prepare meets it so), then the sandbox's
        assert!(!pod.join(format!("cri-containerd-{sandbox}.scope")).exists());
        assert_eq!(
            cg.start_sandbox(Qos::Burstable, "u-1").unwrap().parent(),
            Some(&*pod)
        );
        assert_eq!(
            cg.ensure_pod(Qos::Burstable, "u-1").unwrap(),
            pod,
            "idempotent"
        );
        assert_eq!(
            pod,
            level.join("kubepods-burstable-podu_1.slice"),
            "systemd names"
        );
        assert!(pod.join("dmem.max").is_file());
        assert!(pod.join(format!("cri-containerd-{sandbox}.scope")).is_dir());
        let c = cg.start_container(Qos::Burstable, "u-1", "c1").unwrap();
        assert!(c.join("dmem.max").is_file());
        assert_eq!(
            std::fs::read_to_string(pod.join("cgroup.subtree_control")).unwrap(),
            "cpu memory dmem\n"
        );
        cg.ensure_pod(Qos::Guaranteed, "u-2").unwrap();
        cg.start_sandbox(Qos::Guaranteed, "u-2").unwrap();
        let mut uids: Vec<String> = cg.pods().into_iter().map(|(u, _)| u).collect();
        uids.sort();
        assert_eq!(uids, ["u-1", "u-2"]);
        let live: HashSet<String> = ["u-2".to_string()].into();
        assert_eq!(cg.remove_others(&live), ["u-1"]);
        assert!(!pod.exists());
        assert!(root.join("kubepods.slice/kubepods-podu_2.slice").is_dir());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn without_dmem_no_dmem_files_and_a_missing_root_is_an_error() {
        let root = tree("plain", None);
        let cg = PodCgroups::new(&CgroupConfig {
            root: root.clone(),
            driver: CgroupDriver::Cgroupfs,
        })
        .unwrap();
        let pod = cg.ensure_pod(Qos::BestEffort, "u-3").unwrap();
        cg.start_sandbox(Qos::BestEffort, "u-3").unwrap();
        assert_eq!(pod, root.join("kubepods/besteffort/podu-3"));
        assert!(!pod.join("dmem.max").exists());
        assert_eq!(controllers_of(&pod), Vec::<String>::new());
        let err = PodCgroups::new(&CgroupConfig {
            root: root.join("absent"),
            driver: CgroupDriver::Cgroupfs,
        })
        .unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
