//! A real containerd for tests and the demo, started as root with its root, state, socket,
//! runc state and config under one temporary directory (`config.rs` says which paths), so
//! it never meets the host's containerd or another instance:
//!
//! - [`Containerd::start`] writes the config, starts `containerd`, waits (bounded) until
//!   its socket answers; the CRI plugin is in it (Debian's containerd 1.6);
//! - [`Containerd::import`] loads an OCI image archive into the `k8s.io` namespace, where
//!   the CRI plugin sees it (`ctr images import`: import only; CRI is spoken over gRPC by
//!   `hami-cri-api`). Nothing is ever pulled: there is no registry;
//! - [`Containerd::stop`] (also on drop) kills its containers, the daemon and its shims,
//!   unmounts everything under the directory and removes it (`teardown.rs`). An instance
//!   whose process died without stopping it is removed by the next [`Containerd::start`];
//! - [`images::BusyboxImage`] builds tiny images from the host's static busybox with
//!   buildah, as OCI archives;
//! - [`shared::containerd`]: one instance per test process, with the tests' images.
//!
//! The snapshotter is `overlayfs` unless the directory is itself on overlayfs (a CI
//! container's `/tmp`), where overlay-on-overlay fails: then `native` ([`snapshotter_for`]).

pub mod config;
pub mod images;
pub mod shared;
pub mod teardown;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use config::Layout;

/// The packages a host needs (Debian names).
pub const INSTALL: &str = "apt-get install containerd runc buildah busybox-static";

/// Prefix of instance directories (`<prefix><owner pid>-<n>`).
const DIR_PREFIX: &str = "hami-containerd-";

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// The pod sandbox image (imported before the first pod; see [`Layout::sandbox_image`]).
    pub sandbox_image: String,
    /// CNI binaries and configs; `None`: host-network pods only.
    pub cni: Option<(PathBuf, PathBuf)>,
    /// Where the instance directory is made (default: the temp dir).
    pub parent: Option<PathBuf>,
    /// How long to wait for the socket (containerd takes ~0.5 s alone; much longer on a
    /// loaded 2-core machine).
    pub start_timeout: Duration,
}

impl Options {
    /// Defaults with this sandbox image.
    pub fn new(sandbox_image: &str) -> Self {
        Self {
            sandbox_image: sandbox_image.to_owned(),
            cni: None,
            parent: None,
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// Why the host cannot run a private containerd, or `Ok`: root, and `containerd`, its runc
/// shim, `runc` and `ctr` on the PATH. The error names the install step.
pub fn check_host() -> Result<(), String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "a private containerd needs root (run the tests as root, as CI does; packages: {INSTALL})"
        ));
    }
    for bin in ["containerd", "containerd-shim-runc-v2", "runc", "ctr"] {
        if which(bin).is_none() {
            return Err(format!("{bin} is not on the PATH: {INSTALL}"));
        }
    }
    Ok(())
}

fn which(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// `overlayfs`, or `native` when `dir` is on an overlayfs (whose upper layers cannot be
/// another overlay's: the CI container case).
pub fn snapshotter_for(dir: &Path) -> &'static str {
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return "native";
    };
    // SAFETY: statfs(2) writes into a zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "native";
    }
    if st.f_type as i64 == OVERLAYFS_SUPER_MAGIC {
        "native"
    } else {
        "overlayfs"
    }
}

/// The command that starts a containerd serving `socket`: the system service for the
/// default socket, else a containerd of this crate's config shape.
pub fn start_hint(socket: &Path) -> String {
    if socket == Path::new("/run/containerd/containerd.sock") {
        "sudo systemctl start containerd (or: sudo containerd)".into()
    } else {
        format!("sudo containerd --address {}", socket.display())
    }
}

/// A running containerd (see the crate doc). Stopped on drop.
pub struct Containerd {
    layout: Layout,
    child: Option<Child>,
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.layout.dir)
            .field("snapshotter", &self.layout.snapshotter)
            .finish()
    }
}

/// Removes instance directories left by processes that are gone.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if teardown::alive(pid) {
            continue;
        }
        let layout = Layout {
            dir: e.path(),
            sandbox_image: String::new(),
            snapshotter: String::new(),
            cni: None,
        };
        if let Err(err) = teardown::remove_instance(&layout) {
            eprintln!("containerd-host: a stale instance is left: {err}");
        }
    }
}

/// `containerd --config <layout's>`, its output to `log`.
fn spawn_daemon(layout: &Layout, log: std::fs::File) -> Result<Child, String> {
    let err = log.try_clone().map_err(|e| e.to_string())?;
    Command::new("containerd")
        .arg("--config")
        .arg(layout.config_file())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot run containerd ({INSTALL}): {e}"))
}

impl Containerd {
    /// Starts one (see the crate doc); the error says what failed, with containerd's last
    /// log lines when it exited or never answered.
    pub fn start(options: Options) -> Result<Self, String> {
        check_host()?;
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let parent = options.parent.clone().unwrap_or_else(std::env::temp_dir);
        remove_stale(&parent);
        let dir = parent.join(format!(
            "{DIR_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = teardown::remove_instance(&Layout {
            dir: dir.clone(),
            sandbox_image: String::new(),
            snapshotter: String::new(),
            cni: None,
        });
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let layout = Layout {
            snapshotter: snapshotter_for(&dir).to_owned(),
            dir,
            sandbox_image: options.sandbox_image,
            cni: options.cni,
        };
        for d in [
            layout.root(),
            layout.state(),
            layout.runc_root(),
            layout.dir.join("cni/bin"),
            layout.dir.join("cni/net.d"),
        ] {
            std::fs::create_dir_all(&d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        std::fs::write(layout.config_file(), config::render(&layout))
            .map_err(|e| format!("cannot write {}: {e}", layout.config_file().display()))?;
        let log = std::fs::File::create(layout.log_file())
            .map_err(|e| format!("cannot create {}: {e}", layout.log_file().display()))?;
        let child = spawn_daemon(&layout, log)?;
        let mut me = Self {
            layout,
            child: Some(child),
        };
        me.wait_ready(options.start_timeout)?;
        Ok(me)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let socket = self.layout.socket();
        loop {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "containerd exited ({status}) before serving {}:\n{}",
                    socket.display(),
                    self.log_tail(20)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "containerd did not serve {} within {timeout:?}:\n{}",
                    socket.display(),
                    self.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its gRPC socket (CRI and containerd's API).
    pub fn socket(&self) -> PathBuf {
        self.layout.socket()
    }

    /// Its paths and settings.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The snapshotter in use (`overlayfs` or `native`).
    pub fn snapshotter(&self) -> &str {
        &self.layout.snapshotter
    }

    /// The last `lines` lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(self.layout.log_file()) {
            let _ = f.read_to_string(&mut text);
        }
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Imports an OCI (or Docker) image archive into the `k8s.io` namespace, unpacked for
    /// the snapshotter in use; returns `ctr`'s output (the names it imported). The error
    /// names the archive.
    pub fn import(&self, archive: &Path) -> Result<String, String> {
        if !archive.is_file() {
            return Err(format!(
                "image archive {} does not exist",
                archive.display()
            ));
        }
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io", "images", "import", "--snapshotter"])
            .arg(&self.layout.snapshotter)
            .arg(archive)
            .output()
            .map_err(|e| format!("cannot run ctr ({INSTALL}): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot import {}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Gives the imported image `source` the further name `target` in the `k8s.io` namespace
    /// (`ctr images tag --force`), as a registry alias would: pods naming `target` run it.
    pub fn tag(&self, source: &str, target: &str) -> Result<(), String> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args([
                "--namespace",
                "k8s.io",
                "images",
                "tag",
                "--force",
                source,
                target,
            ])
            .output()
            .map_err(|e| format!("cannot run ctr ({INSTALL}): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot tag {source} as {target}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }

    /// Restarts the daemon alone, as a node's containerd upgrade or crash does: SIGTERM
    /// (SIGKILL after 10 s), then the same command on the same directory, bounded by
    /// `timeout`; the containers and their shims keep running meanwhile.
    pub fn restart(&mut self, timeout: Duration) -> Result<(), String> {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let log = std::fs::File::options()
            .append(true)
            .open(self.layout.log_file())
            .map_err(|e| format!("cannot open {}: {e}", self.layout.log_file().display()))?;
        self.child = Some(spawn_daemon(&self.layout, log)?);
        self.wait_ready(timeout)
    }

    /// Stops it and removes everything (see [`teardown::remove_instance`]): its containers
    /// first (a containerd that stops leaves them running), then the daemon (SIGTERM, then
    /// SIGKILL after 10 s), its shims, the mounts and the directory.
    pub fn stop(mut self) -> Result<(), String> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        teardown::kill_containers(&self.layout);
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        teardown::remove_instance(&self.layout)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            eprintln!("containerd-host: {e}");
        }
    }
}
