//! The shell of [`crate::hook_presence`] (issue 29): each refresh, read in `/proc` the
//! facts of every process of a container the pods grant devices to (cgroup → container,
//! descriptors, `environ`, `maps`, `comm`), let the pure decision find the processes on a
//! GPU without their slice's hook, publish the counts for the scrape
//! (`hami_container_unhooked_processes`, `hami_container_hook_unknown_processes`) and queue
//! one `SliceNotEnforced` Event per (pod, container), which the server posts
//! ([`post_event`]).
//!
//! A process that exits while it is read is dropped silently (processes exit all the
//! time); one whose facts cannot be read is counted as unknown and said once in the log.
//! Who was told is kept in memory: a restarted monitor may tell a container once more.
//!
//! A process found hooked is not read again while it lives ([`crate::hooked_processes`]):
//! each pass reads only its `cgroup` and `stat` (neither takes the process's mmap lock,
//! which `environ` and `maps` do).

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex, RwLock};

use crate::hook_presence::{
    ContainerHook, ProcessFacts, REASON_SLICE_NOT_ENFORCED, Tally, event_message,
    is_gpu_device_node, slice_env, to_tell,
};
use crate::hooked_processes::{HookedProcesses, pass, process_identity};
use crate::pods::PodIndex;
use crate::procfs::ProcRoot;

/// The counts of the last pass, per (pod, container, hook).
pub type HookTallies = Arc<Vec<(ContainerHook, Tally)>>;

/// A Warning Event to post on a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// The pod's UID (the dedupe key, with the container).
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container the Event is about.
    pub container: String,
    /// `spec.containers{<name>}` or `spec.initContainers{<name>}` (init and sidecar).
    pub field_path: String,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's message.
    pub message: String,
}

/// The hook check's state: what the last pass counted, who was told, what is to post.
#[derive(Debug, Default)]
pub struct HookWatch {
    tallies: RwLock<HookTallies>,
    /// (pod UID, container) told by an Event (queued or posted).
    told: Mutex<HashSet<(String, String)>>,
    /// (pod UID, container) whose unknown processes were logged.
    logged_unknown: Mutex<HashSet<(String, String)>>,
    pending: Mutex<Vec<PodEvent>>,
    /// The processes found hooked, whose reads later passes skip.
    hooked: Mutex<HookedProcesses>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process is gone (`ESRCH` when it died between open and read).
fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// The facts of one process; `None` when it exited while being read.
fn read_facts(proc: &ProcRoot, pid: i32, pod_uid: &str, container: &str) -> Option<ProcessFacts> {
    let fds = proc.fd_targets(pid);
    let environ = proc.environ(pid);
    let maps = proc.read_entry(pid, "maps");
    let gone = |e: Option<&io::Error>| e.is_some_and(vanished);
    if gone(fds.as_ref().err()) || gone(environ.as_ref().err()) || gone(maps.as_ref().err()) {
        return None;
    }
    // A live process always maps something: empty maps is a process that exited (a zombie)
    // while being read, not one without the hook.
    if maps.as_ref().is_ok_and(|m| m.is_empty()) || !proc.pid_alive(pid) {
        return None;
    }
    let command = proc
        .read_entry(pid, "comm")
        .map(|c| String::from_utf8_lossy(&c).trim_end().to_owned())
        .unwrap_or_default();
    Some(ProcessFacts {
        pid,
        command,
        pod_uid: pod_uid.to_owned(),
        container: container.to_owned(),
        gpu_fds: fds
            .map(|targets| {
                targets
                    .iter()
                    .any(|t| t.to_str().is_some_and(is_gpu_device_node))
            })
            .map_err(|e| e.to_string()),
        env: environ.map(|e| slice_env(&e)).map_err(|e| e.to_string()),
        maps: maps
            .map(|m| String::from_utf8_lossy(&m).into_owned())
            .map_err(|e| e.to_string()),
    })
}

/// The Event's `involvedObject.fieldPath` of a container.
fn field_path(pods: &PodIndex, uid: &str, container: &str) -> String {
    let app = pods
        .get(uid)
        .and_then(|p| p.container(container))
        .is_none_or(|c| c.kind == "app");
    let list = if app { "containers" } else { "initContainers" };
    format!("spec.{list}{{{container}}}")
}

impl HookWatch {
    /// One pass over `proc` with the pods now known.
    pub fn check(&self, proc: &ProcRoot, pods: &PodIndex) {
        // An unreadable proc root is counted by the fdinfo pass (`proc_unreadable`).
        let Ok(pids) = proc.pids() else { return };
        let mut remembered = lock(&self.hooked);
        let mut read = Vec::new();
        let mut known = Vec::new();
        for pid in pids {
            // Host processes, and processes gone meanwhile, are not a container's.
            let Ok(Some(pc)) = proc.pod_container(pid) else {
                continue;
            };
            let Some((uid, name)) = pods.by_container_id.get(&pc.container_id) else {
                continue;
            };
            let granted = pods
                .get(uid)
                .and_then(|p| p.container(name))
                .is_some_and(|c| !c.amd.is_empty() || !c.nvidia.is_empty());
            if !granted {
                continue;
            }
            // Read before the other facts: if the pid is reused meanwhile, the facts read
            // are remembered under the exited process's identity, which never comes back.
            let id = proc
                .read_entry(pid, "stat")
                .ok()
                .and_then(|s| process_identity(pid, &String::from_utf8_lossy(&s)));
            if let Some(id) = id.filter(|id| remembered.knows(id, uid, name)) {
                known.push(id);
                continue;
            }
            if let Some(facts) = read_facts(proc, pid, uid, name) {
                read.push((id, facts));
            }
        }
        let (found, next) = pass(&remembered, &read, &known, pods);
        *remembered = next;
        drop(remembered);
        let alive = |(uid, _): &(String, String)| pods.get(uid).is_some();
        {
            let mut logged = lock(&self.logged_unknown);
            logged.retain(alive);
            for u in &found.unknown {
                if logged.insert((u.at.pod_uid.clone(), u.at.container.clone())) {
                    tracing::warn!(
                        pod = %format!("{}/{}", u.at.namespace, u.at.pod),
                        container = %u.at.container,
                        pid = u.pid,
                        "cannot tell whether the memory hook {} is loaded in this GPU process ({}): counted in hami_container_hook_unknown_processes, not as unhooked; the monitor needs hostPID and the right to read other users' /proc/<pid>/maps and environ (root or CAP_SYS_PTRACE). Said once per container.",
                        u.at.vendor.hook_library(),
                        u.reason
                    );
                }
            }
        }
        {
            let mut told = lock(&self.told);
            told.retain(alive);
            let tell = to_tell(&found.unhooked, &told);
            let mut pending = lock(&self.pending);
            for u in tell {
                let message = event_message(u);
                tracing::warn!(
                    pod = %format!("{}/{}", u.at.namespace, u.at.pod),
                    container = %u.at.container,
                    "{REASON_SLICE_NOT_ENFORCED}: {message}"
                );
                told.insert((u.at.pod_uid.clone(), u.at.container.clone()));
                pending.push(PodEvent {
                    pod_uid: u.at.pod_uid.clone(),
                    namespace: u.at.namespace.clone(),
                    pod: u.at.pod.clone(),
                    container: u.at.container.clone(),
                    field_path: field_path(pods, &u.at.pod_uid, &u.at.container),
                    reason: REASON_SLICE_NOT_ENFORCED,
                    message,
                });
            }
        }
        let tallies: Vec<_> = found.tallies.into_iter().collect();
        *self.tallies.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tallies);
    }

    /// The counts of the last pass.
    pub fn tallies(&self) -> HookTallies {
        self.tallies
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many processes are remembered as hooked (their reads skipped).
    pub fn remembered_hooked(&self) -> usize {
        lock(&self.hooked).len()
    }

    /// The Events queued since the last call, to post.
    pub fn take_events(&self) -> Vec<PodEvent> {
        std::mem::take(&mut *lock(&self.pending))
    }

    /// An Event could not be posted: its container is told again at the next pass that
    /// still finds it.
    pub fn not_posted(&self, event: &PodEvent) {
        lock(&self.told).remove(&(event.pod_uid.clone(), event.container.clone()));
    }
}

/// Posts `event` on its pod (core v1 Event, type Warning, from `hami-monitor`).
pub async fn post_event(client: &kube::Client, event: &PodEvent) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let ev: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": format!("{}.", event.pod)},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": event.pod,
            "namespace": event.namespace, "uid": event.pod_uid,
            "fieldPath": event.field_path},
        "reason": event.reason,
        "message": event.message,
        "type": "Warning",
        "source": {"component": "hami-monitor"},
        "count": 1,
    }))
    .map_err(kube::Error::SerdeError)?;
    let ev = Event {
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        ..ev
    };
    let api: kube::Api<Event> = kube::Api::namespaced(client.clone(), &event.namespace);
    api.create(&kube::api::PostParams::default(), &ev).await?;
    Ok(())
}
