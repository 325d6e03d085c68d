//! The programs and libraries the demo's containers use, found where the workspace built
//! them (beside this executable), and the "images" made of them: the workload program on
//! PATH, the stand-in runtimes under their real sonames, the hooks.

use std::path::{Path, PathBuf};

/// A library or program built with the workspace: beside this executable, in its `deps/`
/// (cdylibs built as dependencies) or one level up (test binaries live in `deps/`).
pub(crate) fn built(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join(name),
        dir.join("deps").join(name),
        dir.join("..").join(name),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// The stand-in NVML built with the workspace (`libnvidia_ml.so`), linked into a
/// driver-like directory as `libnvidia-ml.so.1`.
pub(crate) fn nvml_stand_in(workdir: &Path) -> Option<PathBuf> {
    let built = built("libnvidia_ml.so")?;
    let driver = workdir.join("nvidia-driver");
    std::fs::create_dir_all(&driver).ok()?;
    let link = driver.join("libnvidia-ml.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(&built, &link).ok()?;
    }
    Some(driver)
}

/// The workload program of an installed demo: `hami-workload` beside this executable (the
/// `hami-demo` package installs both). Not looked for in a build's other directories: a
/// library user (a test) that wants processes names the program ([`Cluster::start_with`]).
pub(crate) fn workload_program() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()?
        .parent()?
        .join("hami-workload");
    beside.exists().then_some(beside)
}

/// Whether containers can be made here (root, util-linux `unshare`).
pub fn namespaces_work() -> bool {
    std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The demo's "images": `bin/hami-workload` and one library directory per vendor with the
/// stand-in runtime under its real sonames. `None` (with the reason) when something was
/// not built.
pub struct Images {
    /// Holds `hami-workload` (on the containers' PATH).
    pub bin: PathBuf,
    /// The stand-in HIP runtime under its real sonames.
    pub amd_lib: PathBuf,
    /// The stand-in CUDA driver and NVML under their real sonames.
    pub nvidia_lib: PathBuf,
    /// The built AMD hook (`libamvgpu.so`).
    pub amd_hook: PathBuf,
    /// The built NVIDIA hook (`libvgpu.so`).
    pub nvidia_hook: PathBuf,
    /// The kubelets' runtime: kubelet-sim's own (default) or containerd
    /// (`real_runtime.rs`, which sets it).
    pub cri: hami_kubelet_sim::cri_args::CriArgs,
}

impl Images {
    /// Links the images under `workdir` with `workload` as `bin/hami-workload`.
    pub fn prepare(workdir: &Path, workload: &Path) -> Result<Images, String> {
        let need = |name: &str| {
            built(name).ok_or_else(|| {
                format!("{name} is not built beside this binary (build the workspace)")
            })
        };
        let (hip, cuda, nvml) = (
            need("libamdhip64.so")?,
            need("libcuda.so")?,
            need("libnvidia_ml.so")?,
        );
        let images = Images {
            bin: workdir.join("image/bin"),
            amd_lib: workdir.join("image/rocm-lib"),
            nvidia_lib: workdir.join("image/cuda-lib"),
            amd_hook: need("libamvgpu.so")?,
            nvidia_hook: need("libvgpu.so")?,
            cri: Default::default(),
        };
        let link = |target: &Path, link: PathBuf| -> Result<(), String> {
            if let Some(dir) = link.parent() {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link)
                .map_err(|e| format!("{}: {e}", link.display()))
        };
        link(workload, images.bin.join("hami-workload"))?;
        link(&hip, images.amd_lib.join("libamdhip64.so.6"))?;
        link(&hip, images.amd_lib.join("libamdhip64.so"))?;
        link(&cuda, images.nvidia_lib.join("libcuda.so.1"))?;
        link(&nvml, images.nvidia_lib.join("libnvidia-ml.so.1"))?;
        Ok(images)
    }

    /// The containers' `PATH=` entry.
    pub fn path(&self) -> String {
        format!("PATH={}:/usr/local/bin:/usr/bin:/bin", self.bin.display())
    }
}

/// Installs a hook where the plugin mounts it from (a node's init container copies it).
pub fn install_hook(hook: &Path, hook_path: &Path, name: &str) -> anyhow::Result<()> {
    let dir = hook_path.join("vgpu");
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(hook, dir.join(name))?;
    Ok(())
}
