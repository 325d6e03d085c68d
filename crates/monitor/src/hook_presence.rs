//! Is the memory hook in the processes of sliced containers? (issue 29, pure)
//!
//! A slice's memory limit is enforced only by the hook the device plugin makes the dynamic
//! linker load: `libamvgpu.so` through `LD_AUDIT`, `libvgpu.so` through `/etc/ld.so.preload`.
//! When ld.so cannot load it (a wrong path in the container, an image whose glibc is older
//! than the hook's GLIBC_2.34 baseline, a noexec or missing mount) it prints a warning and
//! goes on: the workload runs with no limit and nobody is told. So the monitor looks at
//! every process of a sliced container that is on a GPU and asks whether the hook is
//! mapped. This module decides from facts the shell (`hook_check.rs`) read in `/proc`:
//! nothing here does I/O.
//!
//! - *Sliced*: the pod's grant (annotations of a pod the scheduler placed, or DRA claims)
//!   gives the container devices of the vendor, and the process's environment carries the
//!   slice's memory limit (`HIP_DEVICE_MEMORY_LIMIT_<i>`, `CUDA_DEVICE_MEMORY_LIMIT[_<i>]`):
//!   the plugins set those exactly when they inject the hook (not for whole cards, not for
//!   an NVIDIA container that set `CUDA_DISABLE_CONTROL`, which opts out of the hook).
//! - *On a GPU*: an open descriptor on a GPU device node (`/dev/kfd`, `/dev/dri/*`,
//!   `/dev/nvidia*`) or a GPU runtime mapped (`libamdhip64`, `libhsa-runtime64`, `libcuda`).
//! - *Hooked*: a mapping whose file name is the hook's (any directory: the mount path may
//!   differ from the plugin's default).
//!
//! A fact that could not be read (permission) makes the process *unknown*, never
//! *unhooked*: a false alarm on every pod of a monitor without the right capability would
//! teach operators to ignore the real one.

use std::collections::{BTreeMap, HashSet};

use hami_protocol::names::{Vendor, env};

use crate::pods::{ContainerInfo, PodIndex};

/// The Event reason posted on a pod with an unhooked process (type Warning).
pub const REASON_SLICE_NOT_ENFORCED: &str = "SliceNotEnforced";

/// The NVIDIA container env that opts out of the hook (the NVIDIA plugin then mounts no
/// `/etc/ld.so.preload`; `hami-nvidia-plugin`'s `allocate_plan::CUDA_DISABLE_CONTROL`).
const CUDA_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";

/// Libraries whose presence in a process's mappings means it drives a GPU.
const GPU_RUNTIMES: [&str; 3] = ["libamdhip64.so", "libhsa-runtime64.so", "libcuda.so"];

/// What a process's environment says about the slice's hooks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SliceEnv {
    /// `HIP_DEVICE_MEMORY_LIMIT_<i>` is set: the AMD hook is expected.
    pub amd_limit: bool,
    /// `CUDA_DEVICE_MEMORY_LIMIT` or `CUDA_DEVICE_MEMORY_LIMIT_<i>` is set.
    pub nvidia_limit: bool,
    /// `CUDA_DISABLE_CONTROL` is true (as the NVIDIA plugin reads it).
    pub nvidia_disabled: bool,
}

impl SliceEnv {
    /// Whether this environment expects `vendor`'s hook.
    pub fn expects(self, vendor: Vendor) -> bool {
        match vendor {
            Vendor::Amd => self.amd_limit,
            Vendor::Nvidia => self.nvidia_limit && !self.nvidia_disabled,
        }
    }
}

/// Reads a `/proc/<pid>/environ` block (`NAME=value` entries separated by NUL).
pub fn slice_env(environ: &[u8]) -> SliceEnv {
    let mut out = SliceEnv::default();
    for entry in environ.split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((name, value)) = entry.split_once('=') else {
            continue;
        };
        if name.starts_with(env::HIP_DEVICE_MEMORY_LIMIT_PREFIX) {
            out.amd_limit = true;
        } else if name == env::CUDA_DEVICE_MEMORY_LIMIT
            || name
                .strip_prefix(env::CUDA_DEVICE_MEMORY_LIMIT)
                .is_some_and(|rest| rest.starts_with('_'))
        {
            out.nvidia_limit = true;
        } else if name == CUDA_DISABLE_CONTROL {
            // Go's strconv.ParseBool, as the NVIDIA plugin reads it.
            out.nvidia_disabled = matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True");
        }
    }
    out
}

/// Whether a descriptor's link target is a GPU device node: `/dev/kfd`, `/dev/dri/*`,
/// `/dev/nvidiactl`, `/dev/nvidia-uvm*`, `/dev/nvidia<N>`.
pub fn is_gpu_device_node(target: &str) -> bool {
    if target == "/dev/kfd" || target.starts_with("/dev/dri/") {
        return true;
    }
    let Some(rest) = target.strip_prefix("/dev/nvidia") else {
        return false;
    };
    rest == "ctl"
        || rest.starts_with("-uvm")
        || (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
}

/// File names (the part after the last `/`) of the files a `/proc/<pid>/maps` text maps;
/// the kernel's ` (deleted)` suffix is dropped (a hook replaced on the host while mapped
/// is still the hook).
pub fn mapped_file_names(maps: &str) -> impl Iterator<Item = &str> {
    maps.lines().filter_map(|line| {
        // `address perms offset dev inode pathname`; the pathname may contain spaces.
        let mut rest = line.trim_start();
        for _ in 0..5 {
            let (_, tail) = rest.split_once(char::is_whitespace)?;
            rest = tail.trim_start();
        }
        let path = rest.strip_suffix(" (deleted)").unwrap_or(rest);
        if !path.starts_with('/') {
            return None;
        }
        path.rsplit('/').next().filter(|n| !n.is_empty())
    })
}

/// Whether `maps` maps a file named `library`, wherever it is mounted.
pub fn maps_library(maps: &str, library: &str) -> bool {
    mapped_file_names(maps).any(|name| name == library)
}

/// Whether `maps` maps a GPU runtime (`libamdhip64.so*`, `libhsa-runtime64.so*`,
/// `libcuda.so*`).
pub fn maps_gpu_runtime(maps: &str) -> bool {
    mapped_file_names(maps).any(|name| {
        GPU_RUNTIMES.iter().any(|lib| {
            name.strip_prefix(lib)
                .is_some_and(|v| v.is_empty() || v.starts_with('.'))
        })
    })
}

/// What the shell read of one process of a pod's container. A process that vanished while
/// it was read is left out by the shell, not given here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFacts {
    /// Host pid.
    pub pid: i32,
    /// `/proc/<pid>/comm` (empty when unreadable).
    pub command: String,
    /// The pod's UID (from the process's cgroup).
    pub pod_uid: String,
    /// The container's name (its runtime id looked up in the pod index).
    pub container: String,
    /// Whether a descriptor is open on a GPU device node; `Err`: why the list is unreadable.
    pub gpu_fds: Result<bool, String>,
    /// The environment's slice variables; `Err`: why `environ` is unreadable.
    pub env: Result<SliceEnv, String>,
    /// `/proc/<pid>/maps`; `Err`: why it is unreadable.
    pub maps: Result<String, String>,
}

/// One (pod, container, hook) that has GPU processes the slice expects the hook in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContainerHook {
    /// The pod's UID.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// Whose hook.
    pub vendor: Vendor,
}

/// How many of a container's GPU processes were seen without the hook, or could not be
/// checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Processes on a GPU without the hook mapped.
    pub unhooked: u32,
    /// Processes whose facts could not be read (not counted as unhooked).
    pub unknown: u32,
    /// Processes with the hook mapped.
    pub hooked: u32,
}

/// A process on a GPU without its slice's hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhooked {
    /// Its container.
    pub at: ContainerHook,
    /// Host pid.
    pub pid: i32,
    /// Its command name.
    pub command: String,
}

/// A process that could not be checked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// Its container.
    pub at: ContainerHook,
    /// Host pid.
    pub pid: i32,
    /// What could not be read.
    pub reason: String,
}

/// What one pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Every container with a GPU process the slice expects a hook in, and its counts.
    pub tallies: BTreeMap<ContainerHook, Tally>,
    /// The unhooked processes, in input order.
    pub unhooked: Vec<Unhooked>,
    /// The processes that could not be checked, in input order.
    pub unknown: Vec<Unknown>,
}

/// What one process is, for one hook its slice expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The hook is mapped.
    Hooked,
    /// On a GPU, readable, without the hook mapped.
    Unhooked,
    /// A fact could not be read: what, and why.
    Unknown(String),
}

/// Whether the pod grants `container` devices of `vendor`.
pub fn grants(container: &ContainerInfo, vendor: Vendor) -> bool {
    match vendor {
        Vendor::Amd => !container.amd.is_empty(),
        Vendor::Nvidia => !container.nvidia.is_empty(),
    }
}

/// The verdicts of one process, one per hook its slice expects. None for a process of an
/// unknown pod or container, of a container without a grant, whose environment carries no
/// limit, or that is not on a GPU: it counts for nothing.
pub fn verdicts(p: &ProcessFacts, pods: &PodIndex) -> Vec<(ContainerHook, Verdict)> {
    let Some(pod) = pods.get(&p.pod_uid) else {
        return Vec::new();
    };
    let Some(container) = pod.container(&p.container) else {
        return Vec::new();
    };
    let granted = Vendor::ALL.into_iter().filter(|v| grants(container, *v));
    // An unreadable environment cannot say which hook: each granted vendor's, unknown.
    let expected: Vec<Vendor> = match &p.env {
        Ok(e) => granted.filter(|v| e.expects(*v)).collect(),
        Err(_) => granted.collect(),
    };
    if expected.is_empty() {
        return Vec::new();
    }
    let runtime = p.maps.as_deref().map(maps_gpu_runtime);
    let on_gpu = match (&p.gpu_fds, &runtime) {
        (Ok(true), _) | (_, Ok(true)) => Some(true),
        (Ok(false), Ok(false)) => Some(false),
        _ => None,
    };
    if on_gpu == Some(false) {
        return Vec::new();
    }
    let unreadable = [
        p.env.as_ref().err().map(|e| format!("environ: {e}")),
        p.maps.as_ref().err().map(|e| format!("maps: {e}")),
        (on_gpu.is_none())
            .then(|| p.gpu_fds.as_ref().err().map(|e| format!("fd: {e}")))
            .flatten(),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    expected
        .into_iter()
        .map(|vendor| {
            let at = ContainerHook {
                pod_uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: container.name.clone(),
                vendor,
            };
            let verdict = match &p.maps {
                Ok(maps) if unreadable.is_empty() => {
                    if maps_library(maps, vendor.hook_library()) {
                        Verdict::Hooked
                    } else {
                        Verdict::Unhooked
                    }
                }
                _ => Verdict::Unknown(unreadable.join("; ")),
            };
            (at, verdict)
        })
        .collect()
}

impl Findings {
    /// Counts one verdict of process `pid` (`command`).
    pub fn count(&mut self, at: ContainerHook, pid: i32, command: &str, verdict: Verdict) {
        let tally = self.tallies.entry(at.clone()).or_default();
        match verdict {
            Verdict::Hooked => tally.hooked += 1,
            Verdict::Unhooked => {
                tally.unhooked += 1;
                self.unhooked.push(Unhooked {
                    at,
                    pid,
                    command: command.to_owned(),
                });
            }
            Verdict::Unknown(reason) => {
                tally.unknown += 1;
                self.unknown.push(Unknown { at, pid, reason });
            }
        }
    }
}

/// Decides, for every process of a sliced container on a GPU, whether its hook is mapped
/// ([`verdicts`]).
pub fn findings(processes: &[ProcessFacts], pods: &PodIndex) -> Findings {
    let mut out = Findings::default();
    for p in processes {
        for (at, verdict) in verdicts(p, pods) {
            out.count(at, p.pid, &p.command, verdict);
        }
    }
    out
}

/// The unhooked processes to tell about: the first of each (pod UID, container) that is
/// not in `told`. One Event per container, not one per process or per pass.
pub fn to_tell<'a>(
    unhooked: &'a [Unhooked],
    told: &HashSet<(String, String)>,
) -> Vec<&'a Unhooked> {
    let mut seen = HashSet::new();
    unhooked
        .iter()
        .filter(|u| {
            let key = (u.at.pod_uid.clone(), u.at.container.clone());
            !told.contains(&key) && seen.insert(key)
        })
        .collect()
}

/// How the dynamic linker is told to load `vendor`'s hook.
pub fn loaded_through(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Amd => "LD_AUDIT",
        Vendor::Nvidia => "/etc/ld.so.preload",
    }
}

/// The message of the [`REASON_SLICE_NOT_ENFORCED`] Event: the process, the container, the
/// library expected, and what to check.
pub fn event_message(u: &Unhooked) -> String {
    let library = u.at.vendor.hook_library();
    let through = loaded_through(u.at.vendor);
    format!(
        "process {pid} ({command}) of container {container} uses the GPU without the memory \
         hook {library} mapped: the slice's memory limit is NOT enforced for it. The dynamic \
         linker ignores a hook it cannot load (it names it in {through}) and only warns on \
         the container's stderr (\"ld.so: object '...{library}' ... cannot be loaded\"). \
         Check that {library} is mounted in the container at the path {through} names (the \
         device plugin's hook mount; not a noexec mount) and that the image's glibc is 2.34 \
         or newer (the hook's baseline).",
        pid = u.pid,
        command = if u.command.is_empty() {
            "?"
        } else {
            &u.command
        },
        container = u.at.container,
    )
}

#[cfg(test)]
#[path = "hook_presence_tests.rs"]
pub(crate) mod tests;
