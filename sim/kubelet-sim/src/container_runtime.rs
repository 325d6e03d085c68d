//! Containers as a container runtime starts them, without images: each app container's
//! command runs as pid 1 of its own PID namespace, in its own mount namespace holding
//! exactly the mounts and device nodes the device plugin's Allocate returned, with the
//! container env plus Allocate's env. The host filesystem stands in for the image.
//!
//! How (see README.md, "Containers"): `unshare --pid --fork --mount-proc --kill-child` runs
//! `/bin/sh` with a generated script that prepares the mount namespace, then `exec`s the
//! command through `env -i` with the container's env alone:
//! - `/dev` is a fresh tmpfs holding `null`, `zero`, `full`, `random`, `urandom`, `tty`
//!   bound from the host and the Allocate device nodes (from `dev_root`), as runc builds it;
//! - a mount target that does not exist is created in a copy-on-write overlay of its
//!   nearest existing ancestor directory (the image layer a runtime would create it in;
//!   its upper directory in a tmpfs of the container's), so nothing is created on the host
//!   (`/usr/local/vgpu/…`, `/etc/ld.so.preload`);
//! - mounts are bound parents first; `/etc/ld.so.preload` last, as it changes every later
//!   `exec` of the script;
//! - read-only mounts are remounted read-only.
//!
//! Killing `unshare` kills pid 1 of the namespace (`--kill-child`), and the kernel kills
//! every other process of a PID namespace whose init dies: no orphans. `unshare` itself
//! gets `PR_SET_PDEATHSIG(SIGKILL)`, so a kubelet-sim that dies takes its containers along.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Node-wide settings of the runtime (`hami kubelet-sim` flags).
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeArgs {
    /// The host directory that is this node's `/dev`: Allocate's device host paths
    /// (`/dev/dri/renderD128`) are found under it (a simulated node's fixture tree).
    #[arg(long, default_value = "/dev")]
    pub dev_root: PathBuf,
    /// `KEY=VALUE` every container starts with, before its own env and Allocate's (what the
    /// image would set: PATH, the library path of its GPU runtime).
    #[arg(long = "container-env")]
    pub image_env: Vec<String>,
    /// Per-container scratch (overlay layers); default: a directory under the temp dir.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Which runtime (`--runtime unshare|containerd`) and containerd's settings.
    #[command(flatten)]
    pub cri: crate::cri_args::CriArgs,
}

impl Default for RuntimeArgs {
    fn default() -> Self {
        Self {
            dev_root: "/dev".into(),
            image_env: Vec::new(),
            state_dir: None,
            cri: Default::default(),
        }
    }
}

impl RuntimeArgs {
    /// The image env as pairs; `Err` names an entry without `=`.
    pub fn image_env(&self) -> Result<Vec<(String, String)>, String> {
        self.image_env
            .iter()
            .map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| format!("--container-env {kv:?}: write KEY=VALUE"))
            })
            .collect()
    }
}

/// A bind mount Allocate asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// One app container to start.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// UID of the pod the container belongs to.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name in the pod spec.
    pub container: String,
    /// Runtime-style id ([`container_id`]), also the cgroup's last component.
    pub container_id: String,
    /// Its cgroup from the cgroup root (`/kubepods/besteffort/pod<uid>/<id>`), as
    /// `/proc/<pid>/cgroup` shows it.
    pub cgroup: String,
    /// `command` + `args`.
    pub argv: Vec<String>,
    /// Final env, in order (later entries win).
    pub env: Vec<(String, String)>,
    /// Bind mounts, in the order Allocate returned them.
    pub mounts: Vec<MountSpec>,
    /// Device nodes: (container path, host path).
    pub devices: Vec<(String, String)>,
    /// stdout and stderr go here (else nowhere).
    pub log: Option<PathBuf>,
}

/// What the rest of the node may know of a running container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRecord {
    /// UID of the pod the container belongs to.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name in the pod spec.
    pub container: String,
    /// Runtime-style id ([`container_id`]), also the cgroup's last component.
    pub container_id: String,
    /// Its cgroup from the cgroup root, as `/proc/<pid>/cgroup` shows it.
    pub cgroup: String,
    /// Host pid of the container's pid 1 (None until it is seen, or after it exited).
    pub init_pid: Option<i32>,
    /// Host pid of the `unshare` holding its namespaces (known from the start: every
    /// process of the container descends from it).
    pub runtime_pid: i32,
}

impl ContainerRecord {
    /// The container's cgroup as the node's cgroup driver names it, by the pod's QoS
    /// (`/kubepods/besteffort/pod<uid>/<container id>` with cgroupfs).
    pub fn cgroup_path(&self) -> String {
        self.cgroup.clone()
    }
}

/// A started container: the `unshare` process holding its namespaces.
pub struct RunningContainer {
    /// What the rest of the node may know of it.
    pub record: ContainerRecord,
    child: Child,
    exited: bool,
    /// The container's layers on the host, removed once it is killed.
    scratch: PathBuf,
}

/// A container id like a runtime's: 64 hex digits, stable for a pod uid and container name.
pub fn container_id(pod_uid: &str, container: &str) -> String {
    let mut out = String::with_capacity(64);
    for seed in 0u64..4 {
        // FNV-1a, one seed per quarter: not cryptographic, only unique enough per node.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in pod_uid.bytes().chain([b'/']).chain(container.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// Single-quotes `s` for `/bin/sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn depth(path: &str) -> usize {
    Path::new(path)
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

/// Where `/dev/<rel>` of the node is on the host.
fn device_source(dev_root: &Path, host_path: &str, host_dev: &Path) -> Result<PathBuf, String> {
    let rel = host_path
        .strip_prefix("/dev/")
        .ok_or_else(|| format!("device {host_path:?} is not under /dev: a runtime refuses it"))?;
    if rel.split('/').any(|c| c == ".." || c.is_empty()) {
        return Err(format!("device {host_path:?}: not a plain path"));
    }
    // The host's /dev is covered by the container's; its nodes are bound from a staging
    // bind of it.
    if dev_root == Path::new("/dev") {
        Ok(host_dev.join(rel))
    } else {
        Ok(dev_root.join(rel))
    }
}

/// The namespace-preparation script for `spec`, run by `/bin/sh` as pid 1 of the new
/// namespaces; `scratch` is this container's directory on the host.
pub fn setup_script(
    spec: &ContainerSpec,
    dev_root: &Path,
    scratch: &Path,
) -> Result<String, String> {
    let mut lines = vec!["set -e".to_owned()];
    let host_dev = scratch.join("host-dev");
    let q = |p: &Path| quote(&p.display().to_string());
    // /dev as runc builds it.
    lines.push(format!("mkdir -p {}", q(&host_dev)));
    lines.push(format!("mount --rbind /dev {}", q(&host_dev)));
    lines.push("mount -t tmpfs -o mode=755,nosuid tmpfs /dev".into());
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        lines.push(format!(
            "if [ -e {src} ]; then touch /dev/{node}; mount --bind {src} /dev/{node}; fi",
            src = q(&host_dev.join(node))
        ));
    }
    lines.push(
        "mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm"
            .into(),
    );
    lines.push("ln -s /proc/self/fd /dev/fd".into());
    for (container_path, host_path) in &spec.devices {
        let source = device_source(dev_root, host_path, &host_dev)?;
        if !container_path.starts_with("/dev/") {
            return Err(format!(
                "device {container_path:?} is not under /dev: a runtime refuses it"
            ));
        }
        let target = quote(container_path);
        lines.push(format!(
            "[ -e {src} ] || {{ echo 'device {host} does not exist on this node' >&2; exit 1; }}",
            src = q(&source),
            host = host_path.replace('\'', "")
        ));
        lines.push(format!(
            "mkdir -p \"$(dirname {target})\"; touch {target}; mount --bind {} {target}",
            q(&source)
        ));
    }
    lines.push(format!("umount -l {}", q(&host_dev)));

    // Mounts: parents first; /etc/ld.so.preload last (it changes every later exec here).
    let mut mounts = spec.mounts.clone();
    mounts.sort_by_key(|m| {
        (
            m.container_path == "/etc/ld.so.preload",
            depth(&m.container_path),
        )
    });
    // Paths that exist inside the namespace once the script ran so far, and directories
    // already copy-on-write (anything created under them stays in the container).
    let mut created: BTreeSet<PathBuf> = BTreeSet::new();
    let mut layered: Vec<PathBuf> = Vec::new();
    // Bound so far: (target, source); what exists under a target is the source's.
    let mut bound: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (n, m) in mounts.iter().enumerate() {
        let target = Path::new(&m.container_path);
        if !target.is_absolute() || m.container_path.split('/').any(|c| c == "..") {
            return Err(format!(
                "mount target {:?} is not an absolute plain path",
                m.container_path
            ));
        }
        let source = Path::new(&m.host_path);
        let source_dir = match std::fs::metadata(source) {
            Ok(meta) => meta.is_dir(),
            Err(e) => {
                return Err(format!(
                    "mount source {} for {}: {e}",
                    m.host_path, m.container_path
                ));
            }
        };
        let exists = |p: &Path| {
            let under_bind = bound
                .iter()
                .rev()
                .find_map(|(t, s)| p.strip_prefix(t).ok().map(|rest| s.join(rest)));
            match under_bind {
                Some(on_host) => on_host.exists(),
                None => created.contains(p) || p.exists(),
            }
        };
        if !exists(target) {
            let mut ancestor = target.parent();
            while let Some(a) = ancestor
                && !exists(a)
            {
                ancestor = a.parent();
            }
            let ancestor = ancestor.unwrap_or(Path::new("/"));
            if ancestor == Path::new("/") {
                return Err(format!(
                    "mount target {}: its parent directories do not exist and / cannot be layered",
                    m.container_path
                ));
            }
            if !layered.iter().any(|l| ancestor.starts_with(l)) {
                // The layer lives in a tmpfs of the container's own: an overlay's upper
                // directory cannot be on every filesystem (not on overlayfs, as /tmp is in
                // many CI containers), and it vanishes with the namespace.
                let layer = scratch.join(format!("layer-{n}"));
                let (upper, work) = (layer.join("upper"), layer.join("work"));
                lines.push(format!(
                    "mkdir -p {l} && mount -t tmpfs -o mode=755 tmpfs {l} && mkdir -p {} {}",
                    q(&upper),
                    q(&work),
                    l = q(&layer)
                ));
                lines.push(format!(
                    "mount -t overlay overlay -o {} {}",
                    quote(&format!(
                        "lowerdir={},upperdir={},workdir={}",
                        ancestor.display(),
                        upper.display(),
                        work.display()
                    )),
                    q(ancestor)
                ));
                layered.push(ancestor.to_path_buf());
            }
            if source_dir {
                lines.push(format!("mkdir -p {}", q(target)));
            } else {
                let parent = target.parent().unwrap_or(Path::new("/"));
                lines.push(format!("mkdir -p {}; touch {}", q(parent), q(target)));
            }
            let mut made = Vec::new();
            let mut p = Some(target);
            while let Some(a) = p
                && !exists(a)
            {
                made.push(a.to_path_buf());
                p = a.parent();
            }
            created.extend(made);
        }
        lines.push(format!("mount --bind {} {}", q(source), q(target)));
        bound.push((target.to_path_buf(), source.to_path_buf()));
        if m.read_only {
            lines.push(format!("mount -o remount,bind,ro {}", q(target)));
        }
    }
    // The command with the container's env alone.
    let mut exec = String::from("exec env -i");
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains('=') {
            return Err(format!("env name {k:?} is not valid"));
        }
        exec.push(' ');
        exec.push_str(&quote(&format!("{k}={v}")));
    }
    // GNU env takes no `--` after assignments: a command name with '=' would be read as one.
    if spec
        .argv
        .first()
        .is_none_or(|a| a.contains('=') || a.starts_with('-'))
    {
        return Err(format!(
            "command {:?} is not a program name",
            spec.argv.first()
        ));
    }
    for a in &spec.argv {
        exec.push(' ');
        exec.push_str(&quote(a));
    }
    lines.push(exec);
    Ok(lines.join("\n"))
}

impl RunningContainer {
    /// Starts `spec`; `scratch` is created for its layers.
    pub fn start(spec: &ContainerSpec, dev_root: &Path, scratch: &Path) -> Result<Self, String> {
        if spec.argv.is_empty() {
            return Err("no command".into());
        }
        std::fs::create_dir_all(scratch)
            .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
        let script = setup_script(spec, dev_root, scratch)?;
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"])
            .args(["/bin/sh", "-c", &script, "container-init"])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            // No workingDir: an image's default, /.
            .current_dir("/")
            .stdin(Stdio::null());
        match &spec.log {
            Some(path) => {
                let log = std::fs::File::create(path)
                    .map_err(|e| format!("cannot create the log {}: {e}", path.display()))?;
                let err = log.try_clone().map_err(|e| e.to_string())?;
                cmd.stdout(log).stderr(err);
            }
            None => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run unshare (util-linux): {e}"))?;
        Ok(Self {
            record: ContainerRecord {
                pod_uid: spec.pod_uid.clone(),
                namespace: spec.namespace.clone(),
                pod: spec.pod.clone(),
                container: spec.container.clone(),
                container_id: spec.container_id.clone(),
                cgroup: spec.cgroup.clone(),
                init_pid: None,
                runtime_pid: child.id() as i32,
            },
            child,
            exited: false,
            scratch: scratch.to_path_buf(),
        })
    }

    /// Host pid of the `unshare` process.
    pub fn runtime_pid(&self) -> u32 {
        self.child.id()
    }

    /// Finds the container's pid 1 (unshare's child) once; forgets it when the container
    /// exited. Returns the exit status the first time it is seen.
    pub fn poll(&mut self) -> Option<std::process::ExitStatus> {
        if self.exited {
            return None;
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            self.exited = true;
            self.record.init_pid = None;
            return Some(status);
        }
        if self.record.init_pid.is_none() {
            self.record.init_pid = children_of(self.child.id() as i32).into_iter().next();
        }
        None
    }

    /// Kills the container (all of its PID namespace) and reaps `unshare`; returns once
    /// the container's pid 1 is gone (bounded), so "killed" means dead to the caller.
    pub fn kill(&mut self) {
        let init = self
            .record
            .init_pid
            .or_else(|| children_of(self.child.id() as i32).into_iter().next());
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = init {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while running(pid) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        self.exited = true;
        self.record.init_pid = None;
        // Its mount namespace is gone with it: the layers are plain directories now.
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

impl Drop for RunningContainer {
    fn drop(&mut self) {
        if !self.exited {
            self.kill();
        }
    }
}

/// Host pids whose parent is `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| parent_of(*p) == Some(pid))
        .collect()
}

/// Whether a host pid exists and is not a zombie.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// `PPid` of a host pid.
pub fn parent_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The container (of `containers`) a host pid runs in: the nearest ancestor (or itself)
/// that is a container's pid 1 or the `unshare` that made it, as cgroup membership is
/// inherited by children.
pub fn container_of_pid(containers: &[ContainerRecord], pid: i32) -> Option<&ContainerRecord> {
    let mut at = pid;
    for _ in 0..64 {
        if let Some(c) = containers
            .iter()
            .find(|c| c.init_pid == Some(at) || c.runtime_pid == at)
        {
            return Some(c);
        }
        at = parent_of(at)?;
        if at <= 1 {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mounts: Vec<MountSpec>) -> ContainerSpec {
        ContainerSpec {
            pod_uid: "u".into(),
            namespace: "default".into(),
            pod: "p".into(),
            container: "c".into(),
            container_id: container_id("u", "c"),
            cgroup: format!("/kubepods/besteffort/podu/{}", container_id("u", "c")),
            argv: vec!["prog".into(), "it's".into()],
            env: vec![("A".into(), "1 2".into())],
            mounts,
            devices: Vec::new(),
            log: None,
        }
    }

    #[test]
    fn ids_are_64_hex_and_differ_per_container() {
        let a = container_id("uid-1", "main");
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, container_id("uid-1", "side"));
        assert_eq!(a, container_id("uid-1", "main"));
    }

    #[test]
    fn missing_targets_are_made_in_a_layer_and_preload_is_bound_last() {
        let dir = std::env::temp_dir().join(format!("ks-script-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("cache")).unwrap();
        std::fs::write(dir.join("hook.so"), "").unwrap();
        std::fs::write(dir.join("preload"), "").unwrap();
        let script = setup_script(
            &spec(vec![
                MountSpec {
                    container_path: "/etc/ld.so.preload".into(),
                    host_path: dir.join("preload").display().to_string(),
                    read_only: true,
                },
                MountSpec {
                    container_path: "/usr/local/vgpu-test-x/cache".into(),
                    host_path: dir.join("cache").display().to_string(),
                    read_only: false,
                },
                MountSpec {
                    container_path: "/usr/local/vgpu-test-x/hook.so".into(),
                    host_path: dir.join("hook.so").display().to_string(),
                    read_only: true,
                },
            ]),
            Path::new("/dev"),
            &dir.join("scratch"),
        )
        .unwrap();
        // One layer over /usr/local serves both vgpu mounts.
        assert_eq!(
            script.matches("lowerdir=/usr/local,").count(),
            1,
            "{script}"
        );
        let preload = script
            .find("'/etc/ld.so.preload'\nmount -o remount")
            .unwrap();
        let hook = script.find("mount --bind").unwrap();
        assert!(hook < preload, "{script}");
        assert!(
            script.ends_with("exec env -i 'A=1 2' 'prog' 'it'\\''s'"),
            "{script}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_source_or_odd_device_is_refused() {
        let err = setup_script(
            &spec(vec![MountSpec {
                container_path: "/x".into(),
                host_path: "/nonexistent/hami".into(),
                read_only: true,
            }]),
            Path::new("/dev"),
            Path::new("/tmp"),
        )
        .unwrap_err();
        assert!(err.contains("/nonexistent/hami"), "{err}");
        let mut s = spec(Vec::new());
        s.devices.push(("/dev/x".into(), "/etc/passwd".into()));
        assert!(setup_script(&s, Path::new("/dev"), Path::new("/tmp")).is_err());
    }
}
