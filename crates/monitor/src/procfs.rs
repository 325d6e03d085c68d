//! The thin shell over `/proc` (root overridable for tests): which host pids exist, the
//! processes of each container (by cgroup), and their DRM clients (fdinfo). Entries that
//! vanish while being read are normal (processes exit) and are skipped.

use std::path::{Path, PathBuf};

use crate::cgroup::{PodContainer, pod_container_of};
use hami_amd_discovery::device_locator::drm_minor_of_path;

use crate::fdinfo::{DrmClient, parse_fdinfo};

/// The `/proc` to read (the host's, mounted into the monitor, or a test tree).
#[derive(Debug, Clone)]
pub struct ProcRoot {
    root: PathBuf,
}

impl ProcRoot {
    /// Reads under `root` instead of `/proc`.
    pub fn new(root: impl Into<PathBuf>) -> ProcRoot {
        ProcRoot { root: root.into() }
    }

    /// The root it reads.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Whether host pid `pid` exists (the monitor runs with hostPID).
    pub fn pid_alive(&self, pid: i32) -> bool {
        pid > 0 && self.root.join(pid.to_string()).exists()
    }

    /// The `NSpid` entries of a pid (outermost first); `None` when it vanished.
    pub fn nspids(&self, pid: i32) -> Option<Vec<i32>> {
        let status =
            std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        Some(crate::host_pids::nspids(&status))
    }

    /// `/proc/<pid>/maps`; `None` when it vanished or cannot be read.
    pub fn maps(&self, pid: i32) -> Option<String> {
        std::fs::read_to_string(self.root.join(pid.to_string()).join("maps")).ok()
    }

    /// `/proc/<pid>/<name>` as bytes (`environ`, `maps`, `comm`: hook_check.rs).
    pub fn read_entry(&self, pid: i32, name: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.root.join(pid.to_string()).join(name))
    }

    /// `/proc/<pid>/environ`; when it cannot be opened (mode 0400: a monitor with only
    /// `CAP_SYS_PTRACE` and another user's process), the same bytes from the process's
    /// memory ([`crate::environ_memory`]), checked to be still the process whose `stat`
    /// gave the range (a pid reused meanwhile reads as gone).
    pub fn environ(&self, pid: i32) -> std::io::Result<Vec<u8>> {
        let denied = match self.read_entry(pid, "environ") {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => e,
            read => return read,
        };
        // A stat that cannot be read leaves the environment unreadable, unless the process
        // is gone.
        let stat = |what: &str| {
            std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).map_err(|e| {
                let kind = if self.pid_alive(pid) {
                    std::io::ErrorKind::PermissionDenied
                } else {
                    e.kind()
                };
                std::io::Error::new(kind, format!("{denied}; stat {what}: {e}"))
            })
        };
        let before = stat("before reading its memory")?;
        let range = crate::environ_memory::env_range(&before).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{denied}; /proc/{pid}/stat shows no environment range"),
            )
        })?;
        let bytes = crate::environ_memory::read_memory(pid, range).map_err(|e| {
            if e.raw_os_error() == Some(libc::ESRCH) {
                return e;
            }
            std::io::Error::new(
                e.kind(),
                format!("{denied}; reading it from the process's memory: {e}"),
            )
        })?;
        let identity = |s: &str| crate::hooked_processes::process_identity(pid, s);
        if identity(&stat("after reading its memory")?) != identity(&before) {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(bytes)
    }

    /// Link targets of a pid's descriptors (`/proc/<pid>/fd/*`); one closed while the list
    /// is read is skipped.
    pub fn fd_targets(&self, pid: i32) -> std::io::Result<Vec<PathBuf>> {
        let entries = std::fs::read_dir(self.root.join(pid.to_string()).join("fd"))?;
        Ok(entries
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .collect())
    }

    /// Every numeric entry of the proc root.
    pub fn pids(&self) -> std::io::Result<Vec<i32>> {
        Ok(std::fs::read_dir(&self.root)?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect())
    }

    /// The pod and container of a pid; `Ok(None)` outside pods, `Err` when the entry
    /// vanished or cannot be read.
    pub fn pod_container(&self, pid: i32) -> std::io::Result<Option<PodContainer>> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup"))?;
        Ok(pod_container_of(&text))
    }

    /// The DRM clients among a pid's descriptors: only descriptors whose link points into
    /// `/dev/dri/` are read (a process may hold thousands of other descriptors).
    pub fn drm_clients(&self, pid: i32) -> std::io::Result<Vec<DrmClient>> {
        let base = self.root.join(pid.to_string());
        let mut out = Vec::new();
        for entry in std::fs::read_dir(base.join("fd"))? {
            let Ok(entry) = entry else { continue };
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            if !target.starts_with("/dev/dri/") {
                continue;
            }
            // A descriptor closed between readdir and read: skip it.
            let Ok(text) = std::fs::read_to_string(base.join("fdinfo").join(entry.file_name()))
            else {
                continue;
            };
            if let Some(mut client) = parse_fdinfo(&text) {
                client.minor = target.to_str().and_then(drm_minor_of_path);
                out.push(client);
            }
        }
        Ok(out)
    }
}
