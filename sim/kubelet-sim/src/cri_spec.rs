//! What kubelet sends a CRI runtime for a pod, as plain functions over plain data (the
//! `--runtime containerd` shell is `cri_runtime/`): the sandbox config (namespaces, the
//! pod cgroup as cgroup parent), each container's config with the device plugin's
//! Allocate response applied as kubelet applies it, and the Kubernetes container status
//! read back from CRI's.
//!
//! Kubelet's rules kept here (`kuberuntime_container.go`, `kubelet_pods.go`):
//! - env: the device plugins' first, then the container's own (`GenerateRunContainerOptions`
//!   appends the pod spec's after `GetResources`'), so a pod's env overrides a plugin's
//!   variable of the same name, and the runtime lets the later entry win; `valueFrom.fieldRef`
//!   of the pod's name, namespace, uid, node and service account (downward API);
//! - mounts: Allocate's (read-only as Allocate says), then the volume mounts; devices with
//!   their permissions; CDI names as `CDI_devices`;
//! - `command` and `args` as given (the image's entrypoint and cmd when empty);
//! - securityContext: the container's fields over the pod's (runAsUser, runAsGroup),
//!   privileged, capabilities (added/dropped as written: the runtime adds `CAP_`),
//!   `allowPrivilegeEscalation: false` (no new privileges), `readOnlyRootFilesystem`;
//! - namespaces: network NODE unless the pod has its own network (a CNI config), PID POD
//!   with `shareProcessNamespace` (the sandbox's pause is pid 1) else CONTAINER, IPC POD.

use std::collections::BTreeMap;
use std::path::Path;

use hami_cri_api::v1 as cri;
use k8s_openapi::api::core::v1::{Container, PodSecurityContext, PodSpec, SecurityContext};
use serde_json::{Value, json};

use crate::container_runtime::MountSpec;

/// Label keys kubelet puts on sandboxes and containers.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// The pod's namespace label.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The pod's uid label.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// The container's name label.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Which pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// metadata.uid.
    pub uid: String,
    /// metadata.namespace.
    pub namespace: String,
    /// metadata.name.
    pub name: String,
}

/// A device node Allocate gave a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions (`rw`, `rwm`); empty: the runtime's default (`rwm`).
    pub permissions: String,
}

/// `allocated` on a node whose `/dev` is `dev_root` on the host (`--dev-root`, a
/// simulated node's stand-in device nodes): device host paths under `/dev/` move there, as
/// the stand-in runtime finds them.
pub fn on_dev_root(mut allocated: Allocated, dev_root: &std::path::Path) -> Allocated {
    if dev_root != std::path::Path::new("/dev") {
        for d in &mut allocated.devices {
            if let Some(rel) = d.host_path.strip_prefix("/dev/") {
                d.host_path = dev_root.join(rel).display().to_string();
            }
        }
    }
    allocated
}

/// What the device manager (and DRA) gave one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocated {
    /// Env, by name.
    pub envs: BTreeMap<String, String>,
    /// Bind mounts, in Allocate's order.
    pub mounts: Vec<MountSpec>,
    /// Device nodes.
    pub devices: Vec<DeviceNode>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

fn labels(pod: &PodRef) -> BTreeMap<String, String> {
    BTreeMap::from([
        (POD_NAME.to_owned(), pod.name.clone()),
        (POD_NAMESPACE.to_owned(), pod.namespace.clone()),
        (POD_UID.to_owned(), pod.uid.clone()),
    ])
}

fn ns_mode(mode: cri::NamespaceMode) -> i32 {
    mode as i32
}

/// Whether the pod uses the node's network: `hostNetwork`, or no CNI to give it its own.
fn host_network(spec: &PodSpec, own_network: bool) -> bool {
    spec.host_network.unwrap_or(false) || !own_network
}

/// The namespaces of the pod's sandbox and containers.
fn namespaces(spec: &PodSpec, own_network: bool) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: ns_mode(if host_network(spec, own_network) {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        }),
        pid: ns_mode(if spec.host_pid.unwrap_or(false) {
            cri::NamespaceMode::Node
        } else if spec.share_process_namespace.unwrap_or(false) {
            cri::NamespaceMode::Pod
        } else {
            cri::NamespaceMode::Container
        }),
        ipc: ns_mode(if spec.host_ipc.unwrap_or(false) {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        }),
        ..Default::default()
    }
}

/// The sandbox config: `cgroup_parent` is the pod cgroup as kubelet names it
/// (`/kubepods/besteffort/pod<uid>`); `own_network`: a CNI config is there, so a pod
/// without `hostNetwork` gets its own network namespace (else the node's).
pub fn sandbox_config(
    pod: &PodRef,
    spec: &PodSpec,
    cgroup_parent: &str,
    own_network: bool,
    log_directory: &Path,
) -> cri::PodSandboxConfig {
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt: 0,
        }),
        // Kubelet names the host only in the pod's own UTS namespace: with the node's
        // network the pod shares the node's, and runc refuses a hostname there.
        hostname: if host_network(spec, own_network) {
            String::new()
        } else {
            spec.hostname.clone().unwrap_or_else(|| pod.name.clone())
        },
        log_directory: log_directory.display().to_string(),
        labels: labels(pod),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_owned(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(spec, own_network)),
                privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn user_and_group(
    pod: Option<&PodSecurityContext>,
    c: Option<&SecurityContext>,
) -> (Option<i64>, Option<i64>) {
    let user = c
        .and_then(|s| s.run_as_user)
        .or(pod.and_then(|s| s.run_as_user));
    let group = c
        .and_then(|s| s.run_as_group)
        .or(pod.and_then(|s| s.run_as_group));
    (user, group)
}

/// The downward API fields an env `valueFrom.fieldRef` may name here (the chart's
/// DaemonSets take `NODE_NAME` from `spec.nodeName`).
const FIELD_REFS: &str =
    "metadata.name, metadata.namespace, metadata.uid, spec.nodeName, spec.serviceAccountName";

/// The value of a downward API field, as kubelet resolves it (`podFieldSelectorRuntimeValue`).
fn field_ref(
    pod: &PodRef,
    spec: &PodSpec,
    field: Option<&k8s_openapi::api::core::v1::ObjectFieldSelector>,
) -> Option<String> {
    Some(match field?.field_path.as_str() {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => pod.uid.clone(),
        "spec.nodeName" => spec.node_name.clone().unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.clone().unwrap_or_default(),
        _ => return None,
    })
}

/// The container config, or why it cannot be made (kubelet's `CreateContainerConfigError`).
/// `volume_dir(name)` is where an emptyDir volume of the pod lives on the host.
pub fn container_config(
    pod: &PodRef,
    spec: &PodSpec,
    c: &Container,
    allocated: &Allocated,
    own_network: bool,
    volume_dir: &dyn Fn(&str) -> std::path::PathBuf,
) -> Result<cri::ContainerConfig, String> {
    let image = c
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| format!("container {} has no image", c.name))?;
    let mut envs: Vec<cri::KeyValue> = allocated
        .envs
        .iter()
        .map(|(k, v)| cri::KeyValue {
            key: k.clone(),
            value: v.clone(),
        })
        .collect();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => field_ref(pod, spec, from.field_ref.as_ref()).ok_or_else(|| {
                format!(
                    "container {}: env {}: only valueFrom.fieldRef of {FIELD_REFS} is supported by kubelet-sim",
                    c.name, e.name
                )
            })?,
            (None, None) => String::new(),
        };
        envs.push(cri::KeyValue {
            key: e.name.clone(),
            value,
        });
    }
    let mut mounts: Vec<cri::Mount> = allocated
        .mounts
        .iter()
        .map(|m| cri::Mount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            readonly: m.read_only,
            ..Default::default()
        })
        .collect();
    for vm in c.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == vm.name)
            .ok_or_else(|| {
                format!(
                    "container {}: volume mount {} names no volume of the pod",
                    c.name, vm.name
                )
            })?;
        // A projected volume's files are written there before the sandbox
        // (`cri_runtime/projected.rs`); kubelet mounts it read-only whatever the mount says.
        let projected = volume.projected.is_some();
        let host = if let Some(h) = &volume.host_path {
            h.path.clone()
        } else if volume.empty_dir.is_some() || projected {
            volume_dir(&volume.name).display().to_string()
        } else {
            return Err(format!(
                "container {}: volume {}: only hostPath, emptyDir and projected volumes are supported by kubelet-sim",
                c.name, volume.name
            ));
        };
        let host = match vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => Path::new(&host).join(sub).display().to_string(),
            None => host,
        };
        mounts.push(cri::Mount {
            container_path: vm.mount_path.clone(),
            host_path: host,
            readonly: vm.read_only.unwrap_or(false) || projected,
            ..Default::default()
        });
    }
    let devices = allocated
        .devices
        .iter()
        .map(|d| cri::Device {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: if d.permissions.is_empty() {
                "rwm".into()
            } else {
                d.permissions.clone()
            },
        })
        .collect();
    let sc = c.security_context.as_ref();
    let (user, group) = user_and_group(spec.security_context.as_ref(), sc);
    let capabilities = sc
        .and_then(|s| s.capabilities.as_ref())
        .map(|caps| cri::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        });
    let mut container_labels = labels(pod);
    container_labels.insert(CONTAINER_NAME.to_owned(), c.name.clone());
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image,
            ..Default::default()
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        devices,
        labels: container_labels,
        log_path: format!("{}/0.log", c.name),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities,
                privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                namespace_options: Some(namespaces(spec, own_network)),
                run_as_user: user.map(|value| cri::Int64Value { value }),
                run_as_group: group.map(|value| cri::Int64Value { value }),
                no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
                readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }),
        cdi_devices: allocated
            .cdi_devices
            .iter()
            .map(|name| cri::CdiDevice { name: name.clone() })
            .collect(),
        ..Default::default()
    })
}

/// RFC 3339 of a CRI timestamp (nanoseconds since the epoch).
fn rfc3339(nanos: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .ok()
        .and_then(|t| t.round(k8s_openapi::jiff::Unit::Second).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The Kubernetes `state` of a container from its CRI status.
pub fn k8s_state(status: &cri::ContainerStatus) -> Value {
    match cri::ContainerState::try_from(status.state) {
        Ok(cri::ContainerState::ContainerRunning) => {
            json!({"running": {"startedAt": rfc3339(status.started_at)}})
        }
        Ok(cri::ContainerState::ContainerExited) => {
            let mut t = json!({
                "exitCode": status.exit_code,
                "reason": if status.reason.is_empty() {
                    if status.exit_code == 0 { "Completed" } else { "Error" }
                } else {
                    status.reason.as_str()
                },
                "finishedAt": rfc3339(status.finished_at),
                "containerID": format!("containerd://{}", status.id),
            });
            if status.started_at > 0 {
                t["startedAt"] = json!(rfc3339(status.started_at));
            }
            if !status.message.is_empty() {
                t["message"] = json!(status.message);
            }
            json!({ "terminated": t })
        }
        Ok(cri::ContainerState::ContainerCreated) => {
            json!({"waiting": {"reason": "ContainerCreating"}})
        }
        _ => json!({"waiting": {"reason": "ContainerStatusUnknown"}}),
    }
}

/// A container's Kubernetes status (`containerStatuses[]` entry).
pub fn k8s_container_status(
    name: &str,
    image: &str,
    id: Option<&str>,
    image_ref: &str,
    state: Value,
) -> Value {
    let running = state.get("running").is_some();
    let mut s = json!({
        "name": name,
        "image": image,
        "imageID": image_ref,
        "ready": running,
        "started": running,
        "restartCount": 0,
        "state": state,
    });
    if let Some(id) = id {
        s["containerID"] = json!(format!("containerd://{id}"));
    }
    s
}

/// The pod phase as kubelet's `getPhase` computes it from the containers' statuses
/// (`containerStatuses[]` entries: `state`, `lastState`) and the restart policy: Pending
/// until every init container exited 0 (Failed when one failed and nothing restarts);
/// Pending while an app container waits for its first start; Running while one runs;
/// once none runs: Running under `Always` (they restart), Succeeded when all exited 0,
/// Failed under `Never`, else Running.
pub fn pod_phase(policy: &str, init: &[Value], apps: &[Value]) -> &'static str {
    for s in init {
        match s["state"].get("terminated") {
            Some(t) if t["exitCode"] == json!(0) => {}
            Some(_) if policy == "Never" => return "Failed",
            _ => return "Pending",
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in apps {
        let state = &s["state"];
        if state.get("running").is_some() {
            running += 1;
        } else if let Some(t) = state.get("terminated") {
            stopped += 1;
            if t["exitCode"] == json!(0) {
                succeeded += 1;
            }
        } else if s
            .get("lastState")
            .and_then(|l| l.get("terminated"))
            .is_some()
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped == 0 || policy == "Always" {
        if stopped == 0 { "Pending" } else { "Running" }
    } else if stopped == succeeded {
        "Succeeded"
    } else if policy == "Never" {
        "Failed"
    } else {
        "Running"
    }
}

/// Whether a container that ended with `exit_code` is started again under `policy`
/// (init containers: only after a failure, and never under `Never`).
pub fn restarts(policy: &str, exit_code: i64, init: bool) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => !init || exit_code != 0,
    }
}

/// Kubelet's crash-loop back-off: the first restart at once, then 10 s, doubling, at most
/// 5 min.
pub fn next_backoff(previous: std::time::Duration) -> std::time::Duration {
    use std::time::Duration;
    if previous.is_zero() {
        Duration::from_secs(10)
    } else {
        (previous * 2).min(Duration::from_secs(300))
    }
}

/// The reason and message of a pod whose image is not in the runtime: kubelet's
/// `ErrImagePull`, naming the archive to build and import (nothing is pulled).
pub fn missing_image(image: &str, archive: Option<&Path>, socket: &Path) -> (String, String) {
    let build = match archive {
        Some(a) => format!(
            "build the OCI archive {} (scripts/build-images.sh --out {} {}) and import it: ctr --address {} -n k8s.io images import {}",
            a.display(),
            a.parent().unwrap_or(Path::new(".")).display(),
            hami_containerd_host::images::archive_name(image),
            socket.display(),
            a.display()
        ),
        None => format!(
            "build it as an OCI archive (scripts/build-images.sh, or buildah push {image} oci-archive:FILE) and import it: ctr --address {} -n k8s.io images import FILE",
            socket.display()
        ),
    };
    (
        "ErrImagePull".into(),
        format!(
            "image {image:?} is not in containerd's k8s.io namespace and kubelet-sim never pulls: {build}"
        ),
    )
}

#[cfg(test)]
#[path = "cri_spec_tests.rs"]
mod tests;
