//! What the simulated nodes' kernel sides (`amdgpu_driver.rs`, `cuda_driver.rs`) show a
//! monitor of a process in their proc-shaped trees, the monitor's proc root: the container
//! it runs in, and the kernel's own entries of the process.
//!
//! kubelet-sim's own runtime (`unshare`) puts no process in a pod cgroup, so the host's
//! `/proc/<pid>/cgroup` does not say which container a process is in; its records do (by
//! the process's ancestry). Everything else (`maps`, `environ`, `comm`, `status`, `stat`,
//! the descriptors) is the kernel's, linked, so the monitor reads what ld.so really mapped
//! and the environment the container really got (the hook check, issue 29).

use std::path::Path;
use std::sync::{Arc, Mutex};

use hami_kubelet_sim::container_runtime::{ContainerRecord, container_of_pid};

/// The cgroup of the container `pid` runs in (None outside kubelet-sim's containers).
pub(crate) fn cgroup_of(containers: &Arc<Mutex<Vec<ContainerRecord>>>, pid: i32) -> Option<String> {
    let containers = containers.lock().unwrap_or_else(|p| p.into_inner()).clone();
    container_of_pid(&containers, pid).map(|c| c.cgroup_path())
}

/// What the kernel shows as `/proc/<pid>/cgroup`: the container's cgroup kubelet-sim
/// recorded (its own runtime), else the process's real one (a container of a real runtime,
/// containerd + runc, whose cgroup paths and hierarchy version are the host's).
pub(crate) fn cgroup_text(recorded: Option<&str>, pid: i32) -> String {
    match recorded {
        Some(path) => format!("0::{path}\n"),
        None => std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_else(|_| "0::/\n".into()),
    }
}

/// Writes `text` to `path` through a rename, so a reader never sees half of it.
pub(crate) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

/// Links `dir/<entry>` to the kernel's `/proc/<pid>/<entry>` for each of `entries`; one
/// already linked is kept (a second client of the process may race the first).
pub(crate) fn link_kernel_entries(dir: &Path, pid: i32, entries: &[&str]) -> std::io::Result<()> {
    for entry in entries {
        match std::os::unix::fs::symlink(format!("/proc/{pid}/{entry}"), dir.join(entry)) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
