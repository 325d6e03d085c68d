//! `--runtime containerd`: a pod's containers run by a real containerd over CRI v1, as
//! kubelet's `kuberuntime` runs them (the configs are made by `cri_spec.rs`):
//!
//! 0. its hostPath volumes set up as kubelet sets them up (`host_path.rs`: types checked,
//!    the `OrCreate` ones made): one that fails leaves the pod Pending with kubelet's
//!    `MountVolume.SetUp failed` message, tried again every [`RETRY`]; then its projected
//!    volumes' files written (`projected.rs`: the `kube-api-access-*` volume's token from
//!    the TokenRequest API, `kube-root-ca.crt`, the namespace), mounted read-only;
//! 1. every image the pod needs — the sandbox (pause) image and each container's — is
//!    looked up with `ImageStatus`, never pulled: a missing one leaves the pod Pending,
//!    its containers waiting with `ErrImagePull` and a message naming the OCI archive to
//!    build and import; looked up again every [`RETRY`];
//! 2. `RunPodSandbox` with the pod cgroup as cgroup parent, the node's network unless a
//!    CNI config is given, the PID namespace shared with `shareProcessNamespace`;
//! 3. init containers one at a time, each to a clean exit; then every app container:
//!    `CreateContainer` + `StartContainer`, with what Allocate returned;
//! 4. each pass, `ContainerStatus` of each container becomes the pod's status (running,
//!    exited with its code, or the reason and message of a failed create or start — runc's
//!    error as containerd reports it) and the phase as kubelet's `getPhase` makes it; an
//!    ended container starts again as `restartPolicy` says (`Always` by default), at once
//!    the first time, then after kubelet's back-off (10 s doubling to 5 min,
//!    `CrashLoopBackOff` meanwhile); a pod that ends `Failed` or `Succeeded` has its
//!    device-plugin ids released at once (with `Never`, a container that cannot be created
//!    or started fails the pod);
//! 5. a pod that is gone or finished is torn down in the background: `StopContainer` with
//!    its grace period, `RemoveContainer`, `StopPodSandbox`, `RemovePodSandbox`, its
//!    emptyDir volumes and its pod cgroup (`rmdir`, in every mounted hierarchy).
//!
//! Containers in the sandbox: `CDI_devices` is sent (kubelet does), but containerd 1.6
//! skips the field: a plugin that answers only with CDI names gives the container nothing
//! there (containerd 1.7 with `enable_cdi` resolves them).
//!
//! Here: the pod's way from admitted to running (volumes, images, sandbox, containers,
//! restarts); `host_path.rs`: hostPath volumes; `projected.rs`: projected volumes;
//! `status.rs`: the status posted and the container records; `teardown.rs`: a gone pod's
//! removal. The configs sent are made by `cri_spec.rs`.

mod host_path;
mod projected;
mod status;
mod teardown;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hami_cri_api::Cri;
use hami_cri_api::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::{Value, json};

use crate::cgroup_layout::{CgroupDriver, Layout, Qos};
use crate::container_runtime::ContainerRecord;
use crate::cri_args::CriArgs;
use crate::cri_spec::{
    Allocated, PodRef, container_config, k8s_state, missing_image, on_dev_root, sandbox_config,
};
use crate::device_state::DeviceState;

/// How often a pod waiting for an image or a sandbox tries again.
pub const RETRY: Duration = Duration::from_secs(2);
/// How often running containers' statuses are read.
const POLL: Duration = Duration::from_millis(250);
/// How long one CRI call may take (a loaded machine's runc is slow).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a container is in its life, as far as kubelet-sim knows.
#[derive(Debug, Clone)]
enum Step {
    /// Not created yet.
    Pending,
    /// Created (and start attempted): its id.
    Created(String),
    /// Create or start failed before containerd had a status: the state to report.
    Failed(Value),
}

/// A container's restarts (kubelet's crash-loop bookkeeping).
#[derive(Debug, Clone, Default)]
struct Restarts {
    /// How many times it was started again.
    count: u32,
    /// The state it ended in last time (`lastState.terminated`).
    last: Option<Value>,
    /// When the next start may happen (set once it ended and is to restart).
    not_before: Option<Instant>,
    /// The wait before the next start after this one ends.
    backoff: Duration,
}

/// One pod's bookkeeping.
struct CriPod {
    pod: PodRef,
    /// metadata.labels and metadata.annotations (the downward API of projected volumes).
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    spec: PodSpec,
    allocated: BTreeMap<String, Allocated>,
    cgroup_parent: String,
    sandbox: Option<String>,
    /// (name, step), init containers first.
    init: Vec<(String, Step)>,
    apps: Vec<(String, Step)>,
    /// States by container name, from the last look.
    states: BTreeMap<String, Value>,
    /// Image ids by container name.
    image_refs: BTreeMap<String, String>,
    /// `restartPolicy` (`Always` when unset, as the API server defaults it).
    policy: String,
    /// Restarts by container name.
    restarts: BTreeMap<String, Restarts>,
    /// The node's cgroup names and the pod's QoS (the containers' cgroups).
    layout: Layout,
    qos: Qos,
    /// Host pid of each running container's init, by container id (from verbose
    /// `ContainerStatus`, asked once per container).
    pids: BTreeMap<String, i32>,
    /// Why the pod is not started yet (pod-level message).
    waiting: Option<(String, String)>,
    next_try: Instant,
    last_poll: Option<Instant>,
    posted: Option<Value>,
}

/// The containerd runtime of one kubelet-sim.
pub struct CriRuntime {
    cri: Cri,
    args: CriArgs,
    /// The node's `/dev` on the host (`--dev-root`): Allocate's device host paths are there.
    dev_root: PathBuf,
    client: kube::Client,
    state: Arc<Mutex<DeviceState>>,
    /// emptyDir volumes and container logs: `<dir>/<uid>/…`.
    dir: PathBuf,
    pods: BTreeMap<String, CriPod>,
    teardowns: Vec<tokio::task::JoinHandle<()>>,
    /// What the rest of the node may know of the running containers
    /// (`KubeletSim::containers`), rewritten every pass.
    records: Arc<Mutex<Vec<ContainerRecord>>>,
}

fn status_err(call: &str, e: &tonic::Status) -> String {
    format!("{call}: {}", e.message())
}

/// Runs a CRI call with [`CALL_TIMEOUT`].
async fn call<T>(
    name: &str,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(e)) => Err(status_err(name, &e)),
        Err(_) => Err(format!("{name}: no answer within {CALL_TIMEOUT:?}")),
    }
}

impl CriRuntime {
    /// The runtime a node's flags ask for: `None` unless `--run-containers --runtime
    /// containerd`; then connected (the error names the socket and how to start it).
    pub async fn for_node(
        args: &crate::Args,
        client: &kube::Client,
        state: &Arc<Mutex<DeviceState>>,
        records: &Arc<Mutex<Vec<ContainerRecord>>>,
    ) -> Result<Option<Self>, String> {
        if !args.run_containers || args.runtime.cri.kind != crate::cri_args::RuntimeKind::Containerd
        {
            return Ok(None);
        }
        let dir = args.runtime.state_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!(
                "kubelet-sim-{}-{}",
                args.node_name,
                std::process::id()
            ))
        });
        Self::connect(
            args.runtime.cri.clone(),
            client.clone(),
            state.clone(),
            dir.join("cri"),
        )
        .await
        .map(|mut cri| {
            cri.records = records.clone();
            cri.dev_root = args.runtime.dev_root.clone();
            Some(cri)
        })
    }

    /// Dials containerd (`Version` must say CRI v1); the error names the socket and how
    /// to start containerd.
    pub async fn connect(
        args: CriArgs,
        client: kube::Client,
        state: Arc<Mutex<DeviceState>>,
        dir: PathBuf,
    ) -> Result<Self, String> {
        let cri = Cri::connect(&args.containerd_socket, Duration::from_secs(10))
            .await
            .map_err(|e| args.unreachable(&e))?;
        Ok(Self {
            cri,
            args,
            dev_root: "/dev".into(),
            client,
            state,
            dir,
            pods: BTreeMap::new(),
            teardowns: Vec::new(),
            records: Arc::default(),
        })
    }

    /// Takes an admitted pod (its allocations by container name) and starts what it can
    /// now; the rest happens in [`CriRuntime::tend`].
    pub async fn start_pod(
        &mut self,
        pod: &Pod,
        qos: Qos,
        layout: Layout,
        allocated: BTreeMap<String, Allocated>,
    ) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let cgroup = layout.pod(qos, &uid);
        let cgroup_parent = match layout.driver {
            CgroupDriver::Cgroupfs => format!("/{}", cgroup.display()),
            // With the systemd driver, the slice's own name.
            CgroupDriver::Systemd => cgroup
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let entry = CriPod {
            pod: PodRef {
                uid: uid.clone(),
                namespace: pod
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                name: pod.metadata.name.clone().unwrap_or_default(),
            },
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            init: spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| (c.name.clone(), Step::Pending))
                .collect(),
            apps: spec
                .containers
                .iter()
                .map(|c| (c.name.clone(), Step::Pending))
                .collect(),
            spec,
            allocated,
            cgroup_parent,
            sandbox: None,
            states: BTreeMap::new(),
            image_refs: BTreeMap::new(),
            policy: pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.clone())
                .unwrap_or_else(|| "Always".into()),
            restarts: BTreeMap::new(),
            layout,
            qos,
            pids: BTreeMap::new(),
            waiting: None,
            next_try: Instant::now(),
            last_poll: None,
            posted: None,
        };
        self.pods.insert(uid.clone(), entry);
        self.advance(&uid).await;
        self.post(&uid).await;
    }

    /// One pass: tears down pods not in `live`, moves the others on, posts changed
    /// statuses.
    pub async fn tend(&mut self, live: &HashSet<String>) {
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !live.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(p) = self.pods.remove(&uid) {
                let grace = p.spec.termination_grace_period_seconds.unwrap_or(30);
                self.teardown(p, grace);
            }
        }
        self.teardowns.retain(|t| !t.is_finished());
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            self.advance(&uid).await;
            self.post(&uid).await;
        }
        let records = self.records();
        *self.records.lock().unwrap_or_else(|e| e.into_inner()) = records;
    }

    /// Stops and removes every pod's containers and sandbox (kubelet-sim stops), and
    /// waits for teardowns in flight.
    pub async fn shutdown(&mut self) {
        for (_, p) in std::mem::take(&mut self.pods) {
            self.teardown(p, 0);
        }
        for t in self.teardowns.drain(..) {
            let _ = t.await;
        }
    }

    /// Whether `image` is in containerd (its id), or why not.
    async fn image_id(&mut self, image: &str) -> Result<Option<String>, String> {
        let r = call(
            "ImageStatus",
            self.cri.images.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_owned(),
                    ..Default::default()
                }),
                verbose: false,
            }),
        )
        .await?;
        Ok(r.image.map(|i| i.id))
    }

    /// Moves one pod on as far as it goes now.
    async fn advance(&mut self, uid: &str) {
        let Some(p) = self.pods.get(uid) else { return };
        if p.sandbox.is_none() {
            if Instant::now() < p.next_try {
                return;
            }
            if let Err(why) = self.prepare(uid).await
                && let Some(p) = self.pods.get_mut(uid)
            {
                p.waiting = Some(why);
                p.next_try = Instant::now() + RETRY;
                return;
            }
        }
        let Some(p) = self.pods.get_mut(uid) else {
            return;
        };
        p.waiting = None;
        if p.last_poll.is_some_and(|t| t.elapsed() < POLL) {
            return;
        }
        p.last_poll = Some(Instant::now());
        self.refresh(uid).await;
        self.restart_ended(uid).await;
        // Init containers one at a time, each to a clean exit.
        let Some(p) = self.pods.get(uid) else { return };
        for i in 0..p.init.len() {
            let Some(p) = self.pods.get(uid) else { return };
            let (name, step) = p.init[i].clone();
            match step {
                Step::Pending => {
                    self.create_and_start(uid, &name, true).await;
                    return;
                }
                Step::Failed(_) => return,
                Step::Created(_) => {
                    let done = p
                        .states
                        .get(&name)
                        .and_then(|s| s.get("terminated"))
                        .map(|t| t["exitCode"] == json!(0));
                    match done {
                        Some(true) => continue,
                        _ => return,
                    }
                }
            }
        }
        let Some(p) = self.pods.get(uid) else { return };
        let pending: Vec<String> = p
            .apps
            .iter()
            .filter(|(_, s)| matches!(s, Step::Pending))
            .map(|(n, _)| n.clone())
            .collect();
        for name in &pending {
            self.create_and_start(uid, name, false).await;
        }
        if !pending.is_empty() {
            self.refresh(uid).await;
        }
    }

    /// Containers that ended and are to start again under the restart policy: after their
    /// back-off, the old one is removed and the container goes back to not created (the
    /// next steps of [`CriRuntime::advance`] create and start it, attempt + 1).
    async fn restart_ended(&mut self, uid: &str) {
        let Some(p) = self.pods.get_mut(uid) else {
            return;
        };
        let now = Instant::now();
        let mut remove = Vec::new();
        let policy = p.policy.clone();
        for (init, list) in [(true, &mut p.init), (false, &mut p.apps)] {
            for (name, step) in list.iter_mut() {
                let ended = match step {
                    Step::Failed(state) => state.get("terminated").cloned(),
                    Step::Created(_) => p
                        .states
                        .get(name)
                        .and_then(|s| s.get("terminated"))
                        .cloned(),
                    Step::Pending => None,
                };
                let Some(ended) = ended else { continue };
                let code = ended["exitCode"].as_i64().unwrap_or(0);
                if !crate::cri_spec::restarts(&policy, code, init) {
                    continue;
                }
                let r = p.restarts.entry(name.clone()).or_default();
                let due = *r.not_before.get_or_insert(now + r.backoff);
                if now < due {
                    continue;
                }
                if let Step::Created(id) = step {
                    remove.push(id.clone());
                }
                r.count += 1;
                r.last = Some(ended);
                r.backoff = crate::cri_spec::next_backoff(r.backoff);
                r.not_before = None;
                p.states.remove(name.as_str());
                *step = Step::Pending;
            }
        }
        for id in remove {
            if let Err(e) = call(
                "RemoveContainer",
                self.cri
                    .runtime
                    .remove_container(cri::RemoveContainerRequest { container_id: id }),
            )
            .await
            {
                tracing::warn!("{e}");
            }
        }
    }

    /// hostPath volumes set up, images present, then the sandbox; `Err((reason, message))`
    /// leaves the pod waiting.
    async fn prepare(&mut self, uid: &str) -> Result<(), (String, String)> {
        let (images, pod, spec, labels, annotations) = {
            let p = &self.pods[uid];
            let mut images = vec![self.args.pause_image.clone()];
            images.extend(
                p.spec
                    .init_containers
                    .iter()
                    .flatten()
                    .chain(p.spec.containers.iter())
                    .filter_map(|c| c.image.clone()),
            );
            (
                images,
                p.pod.clone(),
                p.spec.clone(),
                p.labels.clone(),
                p.annotations.clone(),
            )
        };
        // Volumes before the sandbox, as kubelet's SyncPod waits for them.
        host_path::set_up(&spec).map_err(|m| ("ContainerCreating".to_owned(), m))?;
        let volumes = self.dir.join(uid).join("volumes");
        projected::set_up(&self.client, &pod, &labels, &annotations, &spec, &volumes)
            .await
            .map_err(|m| ("ContainerCreating".to_owned(), m))?;
        for image in images {
            match self.image_id(&image).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(missing_image(
                        &image,
                        self.args.archive_of(&image).as_deref(),
                        &self.args.containerd_socket,
                    ));
                }
                Err(e) => return Err(("ErrImagePull".into(), e)),
            }
        }
        let logs = self.dir.join(uid).join("logs");
        let _ = std::fs::create_dir_all(&logs);
        let cgroup_parent = self.pods[uid].cgroup_parent.clone();
        let config = sandbox_config(
            &pod,
            &spec,
            &cgroup_parent,
            self.args.cni_config.is_some(),
            &logs,
        );
        let r = call(
            "RunPodSandbox",
            self.cri.runtime.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }),
        )
        .await
        .map_err(|e| {
            (
                "ContainerCreating".to_owned(),
                format!("cannot create the pod sandbox: {e}"),
            )
        })?;
        if let Some(p) = self.pods.get_mut(uid) {
            p.sandbox = Some(r.pod_sandbox_id);
        }
        Ok(())
    }

    /// CreateContainer + StartContainer of one container; a failure is recorded as its
    /// final state.
    async fn create_and_start(&mut self, uid: &str, name: &str, init: bool) {
        let Some(p) = self.pods.get(uid) else { return };
        let Some(sandbox) = p.sandbox.clone() else {
            return;
        };
        let container: Option<&Container> = if init {
            p.spec
                .init_containers
                .iter()
                .flatten()
                .find(|c| c.name == name)
        } else {
            p.spec.containers.iter().find(|c| c.name == name)
        };
        let Some(container) = container.cloned() else {
            return;
        };
        let volumes = self.dir.join(uid).join("volumes");
        let allocated = on_dev_root(
            p.allocated.get(name).cloned().unwrap_or_default(),
            &self.dev_root,
        );
        let own_network = self.args.cni_config.is_some();
        let config = container_config(&p.pod, &p.spec, &container, &allocated, own_network, &|v| {
            volumes.join(v)
        });
        let sandbox_config = sandbox_config(
            &p.pod,
            &p.spec,
            &p.cgroup_parent,
            own_network,
            &self.dir.join(uid).join("logs"),
        );
        let attempt = p.restarts.get(name).map_or(0, |r| r.count);
        let service_env = self.args.service_env();
        let config = config.map(|mut c| {
            if let Some(m) = c.metadata.as_mut() {
                m.attempt = attempt;
            }
            // The `kubernetes` Service's variables, unless the container sets them itself
            // (kubelet's order: service variables first, the container's env over them).
            for (key, value) in service_env {
                if !c.envs.iter().any(|e| e.key == key) {
                    c.envs.push(cri::KeyValue { key, value });
                }
            }
            c
        });
        let step = match config {
            Err(e) => Step::Failed(json!({"terminated": {"exitCode": 128,
                "reason": "CreateContainerConfigError", "message": e}})),
            Ok(config) => {
                for m in &config.mounts {
                    if m.host_path.starts_with(&volumes.display().to_string()) {
                        let _ = std::fs::create_dir_all(&m.host_path);
                    }
                }
                if !allocated.cdi_devices.is_empty() {
                    tracing::warn!(pod = %format!("{}/{}", p.pod.namespace, p.pod.name), container = %name,
                        "CDI devices {:?} sent as CDI_devices: containerd 1.6 ignores them", allocated.cdi_devices);
                }
                match call(
                    "CreateContainer",
                    self.cri
                        .runtime
                        .create_container(cri::CreateContainerRequest {
                            pod_sandbox_id: sandbox,
                            config: Some(config),
                            sandbox_config: Some(sandbox_config),
                        }),
                )
                .await
                {
                    Err(e) => Step::Failed(json!({"terminated": {"exitCode": 128,
                        "reason": "CreateContainerError", "message": e}})),
                    Ok(r) => {
                        let id = r.container_id;
                        if let Err(e) = call(
                            "StartContainer",
                            self.cri
                                .runtime
                                .start_container(cri::StartContainerRequest {
                                    container_id: id.clone(),
                                }),
                        )
                        .await
                        {
                            tracing::warn!(container = %name, "{e}");
                        }
                        Step::Created(id)
                    }
                }
            }
        };
        if let Some(p) = self.pods.get_mut(uid) {
            let list = if init { &mut p.init } else { &mut p.apps };
            if let Some(slot) = list.iter_mut().find(|(n, _)| n == name) {
                slot.1 = step;
            }
        }
    }

    /// Reads every created container's status.
    async fn refresh(&mut self, uid: &str) {
        let Some(p) = self.pods.get(uid) else { return };
        let created: Vec<(String, String)> = p
            .init
            .iter()
            .chain(p.apps.iter())
            .filter_map(|(n, s)| match s {
                Step::Created(id) => Some((n.clone(), id.clone())),
                _ => None,
            })
            .collect();
        for (name, id) in created {
            // The init's pid only in the verbose answer (a JSON "info"); asked until known.
            let verbose = self
                .pods
                .get(uid)
                .is_some_and(|p| !p.pids.contains_key(&id));
            let r = call(
                "ContainerStatus",
                self.cri
                    .runtime
                    .container_status(cri::ContainerStatusRequest {
                        container_id: id.clone(),
                        verbose,
                    }),
            )
            .await;
            let Some(p) = self.pods.get_mut(uid) else {
                return;
            };
            match r {
                Ok(r) => {
                    if let Some(pid) = r
                        .info
                        .get("info")
                        .and_then(|i| serde_json::from_str::<Value>(i).ok())
                        .and_then(|i| i["pid"].as_i64())
                        .filter(|pid| *pid > 0)
                    {
                        p.pids.insert(id.clone(), pid as i32);
                    }
                    if let Some(s) = r.status {
                        p.image_refs.insert(name.clone(), s.image_ref.clone());
                        p.states.insert(name, k8s_state(&s));
                    }
                }
                Err(e) => tracing::debug!(container = %name, "{e}"),
            }
        }
    }
}
