//! The node and workload images as `scripts/build-images.sh` builds them (the Dockerfiles'
//! final stages over this workspace's dev binaries: the build `cargo test` made, never a
//! release build), once per test process, imported into the shared containerd under the
//! names `hami manifests --registry localhost --tag dev` runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use hami_containerd_host::images::archive_path;
use hami_containerd_host::shared::Shared;

/// The registry and tag of the images (`hami manifests --registry localhost --tag dev`).
pub(super) const REGISTRY: &str = "localhost";
/// See [`REGISTRY`].
pub(super) const TAG: &str = "dev";
/// The workload image's reference (not in the chart: the tests' pods run it).
pub(super) const WORKLOAD_IMAGE: &str = "localhost/hami-rs/hami-workload:dev";

/// The directory of the dev build (`target/debug`): this test binary is in its `deps/`.
pub(super) fn dev_bin_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} has no target directory", exe.display()))
}

/// A file of the dev build as `scripts/build-images.sh --bin-dir` picks it: the newer of
/// `target/debug/<name>` and `target/debug/deps/<name>` (a cdylib only tests built, as in CI's
/// `cargo test --workspace`, is only in `deps/`).
pub(super) fn dev_build_file(name: &str) -> Result<PathBuf, String> {
    let dir = dev_bin_dir()?;
    [dir.join(name), dir.join("deps").join(name)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p)
        .ok_or_else(|| {
            format!(
                "{name} is not built in {} (nor in its deps/)",
                dir.display()
            )
        })
}

static IMAGES: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The directory holding `node.oci.tar` and `workload.oci.tar`, both imported into
/// `shared`'s containerd; built on first use (the script's base is cached between runs).
pub(super) fn node_and_workload(shared: &Shared) -> Result<&'static Path, String> {
    IMAGES
        .get_or_init(|| build(shared))
        .as_deref()
        .map_err(Clone::clone)
}

fn build(shared: &Shared) -> Result<PathBuf, String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = shared.archives.join("node-agents");
    let bins = dev_bin_dir()?;
    let started = std::time::Instant::now();
    let log = shared.archives.join("node-agents-build.log");
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let status = Command::new("bash")
        .arg(repo.join("scripts/build-images.sh"))
        .args(["--profile", "debug", "--bin-dir"])
        .arg(&bins)
        .arg("--out")
        .arg(&out)
        .args(["--tag", TAG, "node", "workload"])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(|e| format!("cannot run scripts/build-images.sh: {e}"))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        return Err(format!(
            "scripts/build-images.sh node workload ({status}; the node image takes the dev \
             binaries and hooks `cargo test --workspace` builds, from {}):\n{text}",
            bins.display()
        ));
    }
    eprintln!(
        "node agents: built the node and workload images in {:?}",
        started.elapsed()
    );
    for image in ["node", "workload"] {
        let archive = archive_path(&out, &format!("{REGISTRY}/hami-rs/hami-{image}:{TAG}"));
        shared.import(&archive)?;
    }
    Ok(out)
}
