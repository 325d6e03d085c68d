//! `hami demo --runtime containerd` (issue 29): the demo's pods in real containers. A
//! private containerd (`hami-containerd-host`: root, state and socket under the temp dir,
//! nothing shared with the host's) runs them through CRI and runc; every node's kubelet-sim
//! uses its containerd runtime (`--runtime containerd`) instead of its own `unshare` one.
//!
//! Nothing can be pulled, so the demo builds its images with buildah from what the
//! workspace built and the host has: a workload image (busybox for the shell and `sleep`,
//! `hami-workload`, the stand-in HIP runtime as `/opt/rocm/lib/libamdhip64.so.6`, the
//! stand-in CUDA driver and NVML under their sonames in `/usr/lib/x86_64-linux-gnu`, and the
//! host's C library, which the hooks mounted from the host need too) and a pause image.
//! Every image an example names (`rocm/pytorch`, `busybox`, `nvcr.io/nvidia/cuda:…`) is
//! that workload image under the example's name (`ctr images tag`), as a registry mirror
//! would serve it. The hooks come from the host path the plugins mount them from, as on a
//! real node; the AMD device nodes are stand-in character devices (a local-use major) that
//! runc creates in the containers as the Allocate answers name them.
//!
//! What the `unshare` runtime has and this one has not: the stand-in drivers' kernel side
//! (a container cannot reach the node's driver socket), so the monitors report the pods'
//! memory from the hooks' regions but no utilization.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hami_containerd_host::images::{
    BUSYBOX, BusyboxImage, Extras, archive_path, busybox_pause, host_libraries,
};
use hami_containerd_host::{Containerd, INSTALL, Options};
use hami_kubelet_sim::cri_args::{CriArgs, RuntimeKind};

use crate::images::Images;

/// The demo's workload image (what every example's image name is tagged to).
pub const WORKLOAD_IMAGE: &str = "localhost/hami-demo-workload:1";
/// The demo's pod sandbox image.
pub const PAUSE_IMAGE: &str = "localhost/hami-demo-pause:1";

/// Why this host cannot run the demo on containerd (`Err`: the message, which names root
/// and the packages); the demo exits 2 with it before starting anything.
pub fn check() -> Result<(), String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "--runtime containerd starts a private containerd and runc, which needs root: \
             sudo hami demo --runtime containerd (packages: sudo {INSTALL}); \
             without root, leave --runtime out (the stand-in runtime)"
        ));
    }
    hami_containerd_host::check_host().map_err(|e| format!("--runtime containerd: {e}"))?;
    for (bin, package) in [("buildah", "buildah"), ("ldd", "libc-bin")] {
        if !on_path(bin) {
            return Err(format!(
                "--runtime containerd: {bin} is not on the PATH (it builds the demo's images): sudo apt-get install {package}"
            ));
        }
    }
    if !Path::new(BUSYBOX).is_file() {
        return Err(format!(
            "--runtime containerd: no {BUSYBOX} (the images' shell and sleep): sudo apt-get install busybox-static"
        ));
    }
    Ok(())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(bin).is_file()))
}

/// The reference containerd's CRI plugin stores for an image name, as Docker normalizes it:
/// `busybox` → `docker.io/library/busybox:latest`, `rocm/pytorch` →
/// `docker.io/rocm/pytorch:latest`; names with a registry host and tags kept.
pub fn normalize(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let first = name.split('/').next().unwrap_or(name);
    let has_host =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = if has_host {
        name.to_owned()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    let last = full.rsplit('/').next().unwrap_or("");
    if digest.is_none() && !last.contains(':') {
        full.push_str(":latest");
    }
    if let Some(d) = digest {
        full = format!("{full}@{d}");
    }
    full
}

/// The private containerd and the demo's images in it.
pub struct RealRuntime {
    host: Mutex<Option<Containerd>>,
    socket: PathBuf,
    archives: PathBuf,
    tagged: Mutex<BTreeSet<String>>,
}

impl RealRuntime {
    /// Builds the images into `workdir/images` and starts containerd with them imported.
    pub fn start(workdir: &Path, images: &Images, workload: &Path) -> Result<Self, String> {
        let archives = workdir.join("images");
        std::fs::create_dir_all(&archives)
            .map_err(|e| format!("cannot create {}: {e}", archives.display()))?;
        let hip = images.amd_lib.join("libamdhip64.so.6");
        let cuda = images.nvidia_lib.join("libcuda.so.1");
        let nvml = images.nvidia_lib.join("libnvidia-ml.so.1");
        let mut files = vec![
            (
                workload.to_path_buf(),
                "/usr/local/bin/hami-workload".into(),
            ),
            (hip.clone(), "/opt/rocm/lib/libamdhip64.so.6".into()),
            (hip.clone(), "/opt/rocm/lib/libamdhip64.so".into()),
            (
                cuda.clone(),
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            ),
            (
                nvml.clone(),
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into(),
            ),
        ];
        let needs = [
            workload,
            &hip,
            &cuda,
            &nvml,
            &images.amd_hook,
            &images.nvidia_hook,
        ];
        for lib in host_libraries(&needs)? {
            files.push((lib.clone(), lib));
        }
        let extras = Extras {
            files,
            path: Some("/usr/local/bin:/bin".into()),
            env: vec!["LD_LIBRARY_PATH=/opt/rocm/lib".into()],
        };
        let workload_image = BusyboxImage {
            name: WORKLOAD_IMAGE.into(),
            cmd: vec!["/bin/sh".into()],
        };
        workload_image.build_with(
            &archives.join("work"),
            &archive_path(&archives, WORKLOAD_IMAGE),
            &extras,
        )?;
        busybox_pause(PAUSE_IMAGE).build(
            &archives.join("work"),
            &archive_path(&archives, PAUSE_IMAGE),
        )?;
        let host = Containerd::start(Options::new(PAUSE_IMAGE))?;
        for image in [WORKLOAD_IMAGE, PAUSE_IMAGE] {
            host.import(&archive_path(&archives, image))?;
        }
        Ok(Self {
            socket: host.socket(),
            host: Mutex::new(Some(host)),
            archives,
            tagged: Mutex::new(BTreeSet::new()),
        })
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The kubelets' runtime flags: `--runtime containerd` on this containerd.
    pub fn cri_args(&self) -> CriArgs {
        CriArgs {
            kind: RuntimeKind::Containerd,
            containerd_socket: self.socket.clone(),
            pause_image: PAUSE_IMAGE.into(),
            image_archive_dir: Some(self.archives.clone()),
            cni_config: None,
            kubernetes_service: None,
        }
    }

    /// Makes `image` (as a pod names it) the workload image, once.
    pub fn provide(&self, image: &str) -> Result<(), String> {
        let full = normalize(image);
        let mut tagged = self.tagged.lock().unwrap_or_else(|p| p.into_inner());
        if tagged.contains(&full) || full == normalize(WORKLOAD_IMAGE) {
            return Ok(());
        }
        let host = self.host.lock().unwrap_or_else(|p| p.into_inner());
        host.as_ref()
            .ok_or("containerd is stopped")?
            .tag(WORKLOAD_IMAGE, &full)?;
        tagged.insert(full);
        Ok(())
    }

    /// Stops containerd (its containers first) and removes it and the archives.
    pub fn stop(&self) {
        let host = self.host.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(host) = host
            && let Err(e) = host.stop()
        {
            eprintln!("containerd teardown: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.archives);
    }
}

/// A node's `/dev` for runc: a stand-in character device (major 240, local use: nothing
/// serves it) for every file of the fixture's `/dev`, at the same relative path under `to`.
pub fn stand_in_dev(fixture: &Path, to: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let mut minor = 0u32;
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(fixture.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            let rel = rel.join(entry.file_name());
            if entry.path().is_dir() {
                dirs.push(rel);
                continue;
            }
            let node = to.join(&rel);
            if let Some(dir) = node.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            let path = std::ffi::CString::new(node.as_os_str().as_encoded_bytes())
                .map_err(|e| e.to_string())?;
            // SAFETY: mknod(2) on a NUL-terminated path we own; no memory is shared.
            let made = unsafe {
                libc::mknod(
                    path.as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(240, minor),
                )
            };
            if made != 0 {
                return Err(format!(
                    "mknod {}: {}",
                    node.display(),
                    std::io::Error::last_os_error()
                ));
            }
            minor += 1;
        }
    }
    Ok(to.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_normalized_as_containerd_stores_them() {
        for (given, stored) in [
            ("busybox", "docker.io/library/busybox:latest"),
            ("rocm/pytorch", "docker.io/rocm/pytorch:latest"),
            (
                "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
            ),
            ("localhost/hami-demo-workload:1", WORKLOAD_IMAGE),
            ("localhost:5000/x", "localhost:5000/x:latest"),
            ("a/b@sha256:ab", "docker.io/a/b@sha256:ab"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
        ] {
            assert_eq!(normalize(given), stored, "{given}");
        }
    }
}
