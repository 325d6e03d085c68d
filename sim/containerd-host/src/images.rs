//! Images without a registry: a tiny OCI image from the host's static busybox
//! (`busybox-static`), built with buildah in a private store (`vfs`: no mounts, nothing
//! left in `/var/lib/containers`) and written as an OCI archive that
//! [`crate::Containerd::import`] loads. Tests use it for workload and pause images alike;
//! images built from the repository (`scripts/build-images.sh`) import the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the static busybox comes from (Debian's `busybox-static`).
pub const BUSYBOX: &str = "/bin/busybox";

/// An image holding `/bin/busybox`, a `/bin/<applet>` link for each of its applets,
/// `/etc/passwd` and `/etc/group` with root only, and a world-writable `/tmp`.
#[derive(Debug, Clone)]
pub struct BusyboxImage {
    /// Its reference (`localhost/hami-test-busybox:1`): what a pod's `image` names.
    pub name: String,
    /// The image's default command (CRI's `command` overrides it, as `entrypoint` +
    /// `cmd` do: kubelet-sim passes the pod's command and args).
    pub cmd: Vec<String>,
}

impl BusyboxImage {
    /// Builds the image and writes it to `archive` (an OCI archive whose index names it),
    /// using `work` (created, then removed) as buildah's store. Errors name the step.
    pub fn build(&self, work: &Path, archive: &Path) -> Result<(), String> {
        self.build_with(work, archive, &Extras::default())
    }

    /// [`BusyboxImage::build`] with `extras`: more files (copied from the host, mode 0755,
    /// world-readable whatever user a pod runs as) and environment.
    pub fn build_with(&self, work: &Path, archive: &Path, extras: &Extras) -> Result<(), String> {
        let stage = work.join("stage");
        let result = self.build_in(work, &stage, archive, extras);
        let _ = std::fs::remove_dir_all(work);
        result
    }

    fn build_in(
        &self,
        work: &Path,
        stage: &Path,
        archive: &Path,
        extras: &Extras,
    ) -> Result<(), String> {
        std::fs::create_dir_all(stage.join("bin"))
            .and_then(|()| std::fs::create_dir_all(stage.join("etc")))
            .and_then(|()| std::fs::create_dir_all(stage.join("tmp")))
            .map_err(|e| format!("cannot create {}: {e}", stage.display()))?;
        std::fs::copy(BUSYBOX, stage.join("bin/busybox"))
            .map_err(|e| format!("cannot copy {BUSYBOX} (install Debian's busybox-static): {e}"))?;
        let list = Command::new(BUSYBOX)
            .arg("--list")
            .output()
            .map_err(|e| format!("cannot run {BUSYBOX} --list: {e}"))?;
        for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            if applet != "busybox" {
                std::os::unix::fs::symlink("busybox", stage.join("bin").join(applet))
                    .map_err(|e| format!("cannot link applet {applet}: {e}"))?;
            }
        }
        std::fs::write(stage.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")
            .and_then(|()| std::fs::write(stage.join("etc/group"), "root:x:0:\n"))
            .map_err(|e| format!("cannot write /etc files: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(stage.join("tmp"), std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| format!("cannot chmod tmp: {e}"))?;
        for (from, to) in &extras.files {
            let rel = to.strip_prefix("/").unwrap_or(to);
            let dest = stage.join(rel);
            if let Some(dir) = dest.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            std::fs::copy(from, &dest)
                .and_then(|_| {
                    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|e| {
                    format!(
                        "cannot copy {} into the image as {}: {e}",
                        from.display(),
                        to.display()
                    )
                })?;
        }
        let buildah = |args: &[&str]| -> Result<String, String> {
            let root = work.join("storage");
            let runroot = work.join("run");
            let out = Command::new("buildah")
                .arg("--root")
                .arg(&root)
                .arg("--runroot")
                .arg(&runroot)
                .args(["--storage-driver", "vfs"])
                .args(args)
                .output()
                .map_err(|e| format!("cannot run buildah (install Debian's buildah): {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "buildah {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        let container = buildah(&["from", "scratch"])?;
        let stage_s = stage.display().to_string();
        buildah(&["copy", &container, &stage_s, "/"])?;
        let cmd = serde_free_json_array(&self.cmd);
        let path = extras.path.as_deref().unwrap_or("/bin");
        let path = format!("PATH={path}");
        let mut config = vec!["config", "--cmd", &cmd, "--env", &path];
        for env in &extras.env {
            config.extend(["--env", env]);
        }
        config.extend(["--workingdir", "/", &container]);
        buildah(&config)?;
        buildah(&["commit", "-q", &container, &self.name])?;
        let target = format!("oci-archive:{}:{}", archive.display(), self.name);
        let _ = std::fs::remove_file(archive);
        buildah(&["push", "-q", &self.name, &target])?;
        let _ = buildah(&["rm", &container]);
        Ok(())
    }
}

/// What [`BusyboxImage::build_with`] adds to the image.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// (host file, absolute path in the image).
    pub files: Vec<(PathBuf, PathBuf)>,
    /// The image's `PATH` (default `/bin`).
    pub path: Option<String>,
    /// More `NAME=value` entries of the image's environment.
    pub env: Vec<String>,
}

/// The host's shared libraries `binaries` need (`ldd`), with the dynamic loader: what an
/// image without a C library of its own needs to run them. Each at the path `ldd` resolved
/// it to, which the loader searches in the image too.
pub fn host_libraries(binaries: &[&Path]) -> Result<Vec<PathBuf>, String> {
    let mut found = std::collections::BTreeSet::new();
    for binary in binaries {
        let out = Command::new("ldd")
            .arg(binary)
            .output()
            .map_err(|e| format!("cannot run ldd (libc-bin): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ldd {}: {}",
                binary.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux… (0x…)`.
            let path = line
                .split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from);
            if let Some(path) = path {
                // Also where the link points (`/lib64/ld-linux-x86-64.so.2` →
                // `/usr/lib/x86_64-linux-gnu/…`): libc names the loader by its soname, and an
                // `LD_AUDIT` library's namespace finds it in the search path only there.
                if let Ok(real) = std::fs::canonicalize(&path)
                    && real != path
                {
                    found.insert(real.clone());
                    if let Some(name) = path.file_name()
                        && let Some(dir) = real.parent()
                    {
                        found.insert(dir.join(name));
                    }
                }
                found.insert(path);
            } else if line.contains("not found") {
                return Err(format!("{}: {}", binary.display(), line.trim()));
            }
        }
    }
    Ok(found.into_iter().collect())
}

/// `["a","b"]` for buildah's `--cmd` (strings JSON-escaped).
fn serde_free_json_array(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| {
            let mut q = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => q.push_str("\\\""),
                    '\\' => q.push_str("\\\\"),
                    c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
                    c => q.push(c),
                }
            }
            q.push('"');
            q
        })
        .collect();
    format!("[{}]", quoted.join(","))
}

/// A pause image from busybox: its process is `sleep` for 68 years (busybox has no
/// `pause` applet). As pid 1 of a shared PID namespace it does not reap zombies the way
/// Kubernetes' pause does, which no test here needs; SIGTERM is ignored by a pid 1 without
/// a handler, and containerd stops sandboxes with SIGKILL anyway. The real pause image
/// from `scripts/build-images.sh` can be used instead: the sandbox image is a parameter.
pub fn busybox_pause(name: &str) -> BusyboxImage {
    BusyboxImage {
        name: name.to_owned(),
        cmd: vec!["/bin/sleep".into(), "2147483647".into()],
    }
}

/// The short name of an image's archive: the reference's last path component without
/// tag, digest or a `hami-` prefix (`localhost/hami-rs/hami-node:dev` → `node`), the
/// `<image>` of `scripts/build-images.sh <image>`. Characters outside `[A-Za-z0-9._-]`
/// become `_`.
pub fn archive_name(image: &str) -> String {
    let repo = image.split('@').next().unwrap_or(image);
    let last = repo.rsplit('/').next().unwrap_or(repo);
    let name = last.split(':').next().unwrap_or(last);
    let name = name.strip_prefix("hami-").unwrap_or(name);
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Where an image's OCI archive is: `<dir>/<archive_name>.oci.tar`, the layout
/// `scripts/build-images.sh` writes (`target/images/node.oci.tar`).
pub fn archive_path(dir: &Path, image: &str) -> PathBuf {
    dir.join(format!("{}.oci.tar", archive_name(image)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_libraries_include_the_loader_where_its_soname_is_searched() {
        let libs = host_libraries(&[Path::new("/bin/sh")]).unwrap();
        let names: Vec<String> = libs.iter().map(|p| p.display().to_string()).collect();
        assert!(names.iter().any(|n| n.ends_with("/libc.so.6")), "{names:?}");
        // `/lib64/ld-linux-x86-64.so.2` is a link; its target's directory is in the
        // library search path, where libc's NEEDED entry for the loader is looked up.
        let loader = Path::new("/lib64/ld-linux-x86-64.so.2");
        if loader.is_symlink() {
            let real = std::fs::canonicalize(loader).unwrap();
            assert!(libs.contains(&real), "{names:?}");
            assert!(libs.contains(&loader.to_path_buf()), "{names:?}");
        }
        let err = host_libraries(&[Path::new("/nonexistent/program")]).unwrap_err();
        assert!(err.contains("/nonexistent/program"), "{err}");
    }

    #[test]
    fn cmd_is_a_json_array() {
        assert_eq!(
            serde_free_json_array(&["/bin/sh".into(), "-c".into(), "echo \"a\\b\"".into()]),
            r#"["/bin/sh","-c","echo \"a\\b\""]"#
        );
        assert_eq!(
            archive_path(Path::new("/t"), "localhost/hami-rs/hami-node:dev"),
            Path::new("/t/node.oci.tar")
        );
        assert_eq!(archive_name("registry.k8s.io/pause:3.6"), "pause");
        assert_eq!(archive_name("x@sha256:ab"), "x");
        assert_eq!(
            archive_name("localhost/hami-test-busybox:1"),
            "test-busybox"
        );
    }
}
