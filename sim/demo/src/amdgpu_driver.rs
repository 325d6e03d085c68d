//! The simulated AMD node's kernel driver, as far as the monitor sees it: DRM clients
//! and their engine time in a proc-shaped tree (D-7 reads real `/proc`).
//!
//! Modelled (the stand-in HIP runtime's `drm_client.rs` is the other side): a process that
//! runs kernels on a device holds one connection to this socket per device, which stands
//! for its open `/dev/dri/renderD<minor>` file. For each, the tree under `root` (the AMD
//! monitor's proc root) holds what the kernel would show of that process:
//! - `<host pid>/cgroup`: `0::/kubepods/<qos>/pod<uid>/<container id>` of the container
//!   the process runs in (its kubelet-sim record's cgroup; the records say which container
//!   a host pid is in, by its ancestry), else the process's real `/proc/<pid>/cgroup` (a
//!   container of kubelet-sim's containerd runtime, a host process);
//! - `<host pid>/fd/<n>` → `/dev/dri/renderD<minor>` and `<host pid>/fdinfo/<n>` with the
//!   amdgpu keys (`drm-driver`, `drm-client-id`, `drm-pdev` of the card owning that minor
//!   from the node's sysfs, `drm-engine-gfx`, `drm-engine-compute` in ns);
//! - `<host pid>/maps`, `environ`, `comm`, `stat` → the process's real `/proc/<pid>/` entries (the
//!   kernel's: the monitor's hook check, issue 29, sees the libraries ld.so really mapped
//!   and the environment the container really got).
//!
//! The host pid is the peer's, from `SO_PEERCRED` (the kernel's view whatever PID
//! namespace the process is in); a client only counts for a render node its mount
//! namespace really holds (`/proc/<pid>/root/dev/dri/renderD<minor>`), as a process can
//! only open nodes it has; the connection closing (file closed, process dead) removes the
//! client, as the kernel drops a closed file's fdinfo.
//! Not modelled: gfx engine time (compute only), memory keys, `card<n>` nodes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hami_kubelet_sim::container_runtime::ContainerRecord;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::proc_tree::{cgroup_of, cgroup_text, link_kernel_entries, write_atomically};

/// Render minor → the card's PCI address, from the node's sysfs.
pub fn render_pdevs(sys_root: &Path) -> HashMap<u32, String> {
    hami_monitor::host_gpus::amd_host(sys_root)
        .map(|(_, devices)| devices.into_iter().map(|d| (d.render, d.pci_bdf)).collect())
        .unwrap_or_default()
}

/// Memory (bytes) and compute units of the node's first device (all of a node's are
/// alike here): the stand-in runtime's `FAKE_HIP_DEVICE_MEMORY` and `FAKE_HIP_CU_COUNT`.
pub fn first_device(sys_root: &Path) -> Option<(u64, u32)> {
    let (_, devices) = hami_monitor::host_gpus::amd_host(sys_root).ok()?;
    let d = devices.first()?;
    Some((d.mem_bytes, d.info.devcore))
}

struct Shared {
    root: PathBuf,
    pdevs: HashMap<u32, String>,
    containers: Arc<Mutex<Vec<ContainerRecord>>>,
    next_client: Mutex<u64>,
}

/// The driver of one node: serves `socket`, writes under `root`.
pub struct AmdgpuDriver {
    task: JoinHandle<()>,
}

impl AmdgpuDriver {
    /// Serves `socket`, writing clients under `root`; `containers` says which container a
    /// host pid is in.
    pub fn start(
        socket: &Path,
        root: &Path,
        sys_root: &Path,
        containers: Arc<Mutex<Vec<ContainerRecord>>>,
    ) -> std::io::Result<AmdgpuDriver> {
        let _ = std::fs::remove_file(socket);
        std::fs::create_dir_all(root)?;
        let listener = UnixListener::bind(socket)?;
        let shared = Arc::new(Shared {
            root: root.to_path_buf(),
            pdevs: render_pdevs(sys_root),
            containers,
            next_client: Mutex::new(1),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move { serve_client(stream, &shared).await });
            }
        });
        Ok(AmdgpuDriver { task })
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.task.abort();
    }
}

fn fdinfo(client: u64, pdev: &str, busy_ns: u64) -> String {
    format!(
        "pos:\t0\nflags:\t02100002\nmnt_id:\t0\ndrm-driver:\tamdgpu\ndrm-client-id:\t{client}\ndrm-pdev:\t{pdev}\ndrm-engine-gfx:\t0 ns\ndrm-engine-compute:\t{busy_ns} ns\n"
    )
}

async fn serve_client(stream: tokio::net::UnixStream, shared: &Shared) {
    let Some(pid) = stream.peer_cred().ok().and_then(|c| c.pid()) else {
        return;
    };
    let mut lines = BufReader::new(stream).lines();
    let Ok(Some(first)) = lines.next_line().await else {
        return;
    };
    let Some(minor) = first
        .strip_prefix("open renderD")
        .and_then(|m| m.trim().parse::<u32>().ok())
    else {
        return;
    };
    // Only a node the process's mount namespace holds, and one of this node's cards.
    let node = format!("/proc/{pid}/root/dev/dri/renderD{minor}");
    let Some(pdev) = shared.pdevs.get(&minor).cloned() else {
        return;
    };
    if !Path::new(&node).exists() {
        return;
    }
    let client = {
        let mut next = shared.next_client.lock().unwrap_or_else(|p| p.into_inner());
        *next += 1;
        *next - 1
    };
    let mut cgroup = cgroup_of(&shared.containers, pid);
    let dir = shared.root.join(pid.to_string());
    let fd = client + 2;
    let setup = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir.join("fd"))?;
        std::fs::create_dir_all(dir.join("fdinfo"))?;
        write_atomically(&dir.join("cgroup"), &cgroup_text(cgroup.as_deref(), pid))?;
        write_atomically(
            &dir.join("fdinfo").join(fd.to_string()),
            &fdinfo(client, &pdev, 0),
        )?;
        // One link per process, however many clients it holds.
        link_kernel_entries(&dir, pid, &["maps", "environ", "comm", "stat"])?;
        let link = dir.join("fd").join(fd.to_string());
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("/dev/dri/renderD{minor}"), link)
    };
    if setup().is_ok() {
        let mut busy: u64 = 0;
        while let Ok(Some(line)) = lines.next_line().await {
            let Some(ns) = line
                .strip_prefix("busy ")
                .and_then(|n| n.trim().parse::<u64>().ok())
            else {
                continue;
            };
            busy = busy.saturating_add(ns);
            // A process that connected before kubelet-sim listed its container: its
            // cgroup is known by now (the kernel knows it from the start).
            if cgroup.is_none() {
                cgroup = cgroup_of(&shared.containers, pid);
                if let Some(path) = &cgroup {
                    let _ = write_atomically(&dir.join("cgroup"), &format!("0::{path}\n"));
                }
            }
            let _ = write_atomically(
                &dir.join("fdinfo").join(fd.to_string()),
                &fdinfo(client, &pdev, busy),
            );
        }
    }
    // Closed: the client is gone; a process with no DRM file left leaves the tree.
    let _ = std::fs::remove_file(dir.join("fd").join(fd.to_string()));
    let _ = std::fs::remove_file(dir.join("fdinfo").join(fd.to_string()));
    if std::fs::read_dir(dir.join("fd")).is_ok_and(|mut d| d.next().is_none()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
