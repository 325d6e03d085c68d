//! The simulated NVIDIA node's kernel side of the stand-in CUDA driver
//! (`FAKE_CUDA_DRIVER_SOCKET`, see `sim/cuda-stand-in/README.md`): it answers each
//! connection with the caller's pid from `SO_PEERCRED`, which the kernel gives in the
//! host's PID namespace, so a pod's process is recorded (and reported by the stand-in
//! NVML) under its host pid, as with the real driver.
//!
//! Started with a tree ([`CudaDriver::start_with_tree`]), it also keeps what the kernel
//! would show the node's monitor of each process that opened the driver, in a proc-shaped
//! tree (the NVIDIA monitor's proc root, as `amdgpu_driver.rs` keeps the AMD one's):
//! - `<host pid>/cgroup`: `0::/kubepods/<qos>/pod<uid>/<container id>` of the kubelet-sim
//!   container the process runs in (by its ancestry; kubelet-sim's own runtime makes no
//!   real pod cgroup, so the host's `/proc/<pid>/cgroup` cannot say), else its real one;
//! - `maps`, `environ`, `comm`, `status`, `stat` and `fd` → the process's real
//!   `/proc/<pid>/` entries (the hook check, issue 29, sees the libraries ld.so really
//!   mapped and the environment the container really got; `status` gives the monitor the
//!   `NSpid`s that resolve HAMi-core's host pids).
//!
//! A process is in the tree from its first connection (the stand-in asks its host pid when
//! it starts using the driver) until it exits, as `/proc/<pid>` is: a sweep drops entries
//! whose process is gone or whose pid now names another process (its start time differs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hami_kubelet_sim::container_runtime::ContainerRecord;
use hami_monitor::hooked_processes::process_identity;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::proc_tree::{cgroup_of, cgroup_text, link_kernel_entries, write_atomically};

/// How often the tree drops exited processes and fills in late-known cgroups.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// The kernel's entries of a process linked into its tree directory.
const KERNEL_ENTRIES: [&str; 6] = ["maps", "environ", "comm", "status", "stat", "fd"];

/// The driver of one node: serves its socket (and sweeps its tree).
pub struct CudaDriver {
    tasks: Vec<JoinHandle<()>>,
}

/// A process in the tree.
struct Entry {
    /// `starttime` of `/proc/<pid>/stat` when it connected: the pid's identity.
    start_time: u64,
    /// Whether its container's cgroup was known when the entry was written.
    in_container: bool,
}

/// The proc-shaped tree and which container a host pid is in.
struct Tree {
    root: PathBuf,
    containers: Arc<Mutex<Vec<ContainerRecord>>>,
    entries: Mutex<HashMap<i32, Entry>>,
}

fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    process_identity(pid, &stat).map(|id| id.start_time)
}

impl Tree {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds process `pid` (a new connection); an entry of the same process is kept.
    fn add(&self, pid: i32) {
        let Some(started) = start_time(pid) else {
            return;
        };
        let mut entries = self.entries();
        if entries.get(&pid).is_some_and(|e| e.start_time == started) {
            return;
        }
        let dir = self.root.join(pid.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        let cgroup = cgroup_of(&self.containers, pid);
        // Made aside and renamed into place: the monitor never sees half an entry.
        let tmp = self.root.join(format!(".{pid}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        let made = std::fs::create_dir_all(&tmp)
            .and_then(|()| std::fs::write(tmp.join("cgroup"), cgroup_text(cgroup.as_deref(), pid)))
            .and_then(|()| link_kernel_entries(&tmp, pid, &KERNEL_ENTRIES))
            .and_then(|()| std::fs::rename(&tmp, &dir));
        match made {
            Ok(()) => {
                entries.insert(
                    pid,
                    Entry {
                        start_time: started,
                        in_container: cgroup.is_some(),
                    },
                );
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                eprintln!(
                    "the stand-in CUDA driver cannot show process {pid} in {}: {e}",
                    self.root.display()
                );
            }
        }
    }

    /// Drops the entries of exited processes; writes the cgroup of a process whose
    /// container kubelet-sim listed after it connected (the kernel knows it from the start).
    fn sweep(&self) {
        let mut entries = self.entries();
        entries.retain(|pid, entry| {
            let dir = self.root.join(pid.to_string());
            if start_time(*pid) != Some(entry.start_time) {
                let _ = std::fs::remove_dir_all(&dir);
                return false;
            }
            if !entry.in_container
                && let Some(path) = cgroup_of(&self.containers, *pid)
            {
                entry.in_container =
                    write_atomically(&dir.join("cgroup"), &cgroup_text(Some(&path), *pid)).is_ok();
            }
            true
        });
    }
}

impl CudaDriver {
    /// Serves `socket` (no proc tree).
    pub fn start(socket: &Path) -> std::io::Result<CudaDriver> {
        Self::serve(socket, None)
    }

    /// Serves `socket` and keeps the proc-shaped tree under `root`; `containers` says
    /// which container a host pid is in.
    pub fn start_with_tree(
        socket: &Path,
        root: &Path,
        containers: Arc<Mutex<Vec<ContainerRecord>>>,
    ) -> std::io::Result<CudaDriver> {
        std::fs::create_dir_all(root)?;
        Self::serve(
            socket,
            Some(Arc::new(Tree {
                root: root.to_owned(),
                containers,
                entries: Mutex::new(HashMap::new()),
            })),
        )
    }

    fn serve(socket: &Path, tree: Option<Arc<Tree>>) -> std::io::Result<CudaDriver> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let mut tasks = Vec::new();
        if let Some(tree) = &tree {
            let tree = tree.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    let tree = tree.clone();
                    let _ = tokio::task::spawn_blocking(move || tree.sweep()).await;
                }
            }));
        }
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                let tree = tree.clone();
                tokio::spawn(async move {
                    let Some(pid) = stream.peer_cred().ok().and_then(|c| c.pid()) else {
                        return;
                    };
                    if let Some(tree) = tree {
                        let _ = tokio::task::spawn_blocking(move || tree.add(pid)).await;
                    }
                    let _ = stream.write_all(pid.to_string().as_bytes()).await;
                });
            }
        }));
        Ok(CudaDriver { tasks })
    }

    /// Stops serving.
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
