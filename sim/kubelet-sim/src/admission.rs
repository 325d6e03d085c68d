//! Pod admission as kubelet's device manager does it: for each pod bound to the node, for
//! each container that requests a plugin resource (init containers first, in order, then
//! app containers), pick device ids, call the plugin's Allocate once for that container,
//! then mark the pod Running and record what every container got.
//!
//! In kubelet's order: Allocate at admission (`HandlePodAdditions` → `canAdmitPod` → the
//! topology manager's `allocateAlignedResources`); then, as `Kubelet.SyncPod` does, the pod
//! cgroup (`pcm.EnsureExists`); then, as the runtime's `SyncPod` does, the pod's claims
//! prepared (`PrepareDynamicResources`) and only then the sandbox (`createPodSandbox`). A
//! failed prepare (or cgroup) leaves the pod Pending with its cgroup, and the next pass
//! retries from there; a failed Allocate fails the pod, nothing prepared.
//!
//! Allocation happens once per pod (kubelet checkpoints it); reporting it — the record
//! annotation and the pod status — is retried at every pass until the API server takes it,
//! as kubelet's status manager does, so one refused patch (a 409, an outage) never leaves
//! an allocated pod Pending for ever.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hami_deviceplugin_api::connect_unix;
use hami_deviceplugin_api::v1beta1::device_plugin_client::DevicePluginClient;
use hami_deviceplugin_api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, PreferredAllocationRequest,
};
use hami_protocol::quantity::parse_count;
use hami_protocol::requests::{ContainerKind, container_slots};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::cgroup_layout::{CgroupDriver, Layout, Qos};
use crate::container_runtime::{
    ContainerRecord, ContainerSpec, MountSpec, RunningContainer, RuntimeArgs, container_id,
};
use crate::device_state::DeviceState;
use crate::dra_manager::{ContainerClaims, DraManager};
use crate::pod_cgroups::PodCgroups;
use crate::records::{RECORD_ANNOTATION, container_record};

/// Settings of the admission worker.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// This node's name: only pods bound to it are admitted.
    pub node: String,
    /// The device-plugin directory; plugins' sockets are found in it.
    pub dir: PathBuf,
    /// Also write `<ns>_<pod>.json` records here.
    pub record_dir: Option<PathBuf>,
    /// Start app containers that have a command as containers (`container_runtime.rs`)
    /// with the returned env, mounts and devices.
    pub run_containers: bool,
    /// How containers are started.
    pub runtime: RuntimeArgs,
}

/// The worker: call [`Admission::sync`] repeatedly.
pub struct Admission {
    /// The settings it was made with.
    pub config: AdmissionConfig,
    /// Client of the API server the pods are read from and reported to.
    pub client: kube::Client,
    /// Shared with the registration service: registered resources and what is allocated.
    pub state: Arc<Mutex<DeviceState>>,
    /// Pods whose containers were allocated (never allocated twice).
    admitted: HashSet<String>,
    /// Admitted pods not started yet (pod cgroup, claims, sandbox), with their allocations.
    syncing: HashMap<String, Vec<ContainerAlloc>>,
    /// Allocated pods whose record and status the API server has not taken yet.
    unreported: HashMap<String, Report>,
    /// Started containers, killed when their pod goes (or at shutdown).
    pub containers: Vec<RunningContainer>,
    /// What others may know of them (host pid of each pid 1), refreshed every pass.
    pub running: Arc<Mutex<Vec<ContainerRecord>>>,
    /// The DRA side, when this kubelet watches DRA plugins (`dra_manager.rs`).
    pub dra: Option<DraManager>,
    /// Set to make the DRA side forget its plugin registrations (a kubelet restart).
    pub forget_dra_plugins: Arc<std::sync::atomic::AtomicBool>,
    /// The last error of each pod in `syncing` (logged when it changes).
    sync_errors: HashMap<String, String>,
    /// The node's pod cgroups, when this kubelet makes them (`pod_cgroups.rs`).
    pub cgroups: Option<PodCgroups>,
    /// With `--runtime containerd`: containers run by containerd over CRI (`cri_runtime/`).
    pub cri: Option<crate::cri_runtime::CriRuntime>,
}

/// What an app container's Allocate calls returned, to start it with.
#[derive(Debug, Clone, Default)]
struct AppAlloc {
    name: String,
    envs: BTreeMap<String, String>,
    mounts: Vec<MountSpec>,
    /// (container path, host path).
    devices: Vec<(String, String)>,
    /// Device permissions by container path (the containerd runtime applies them).
    device_permissions: BTreeMap<String, String>,
    /// CDI device names.
    cdi_devices: Vec<String>,
}

/// What the device manager gave one container (in admission order).
#[derive(Debug, Clone)]
struct ContainerAlloc {
    kind: ContainerKind,
    /// Record entries, one per resource.
    records: Vec<Value>,
    app: AppAlloc,
}

/// What admission decided for one pod, to be written to the API server.
struct Report {
    namespace: String,
    name: String,
    record_text: String,
    status: Value,
    /// What to start once the pod is reported Running (admitted pods only).
    start: Option<Start>,
    /// The pod (the containerd runtime takes it whole).
    pod: Pod,
}

/// An admitted pod's containers, started once it is reported Running.
struct Start {
    uid: String,
    qos: Qos,
    spec: PodSpec,
    /// App containers' allocations.
    apps: Vec<AppAlloc>,
}

fn lock(state: &Mutex<DeviceState>) -> std::sync::MutexGuard<'_, DeviceState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The plugin resources a container asks for, with counts (limits, else requests).
pub fn container_resources(
    container: &Container,
    known: &BTreeSet<String>,
) -> Result<Vec<(String, usize)>, String> {
    let Some(res) = &container.resources else {
        return Ok(Vec::new());
    };
    let mut out = BTreeMap::new();
    for map in [&res.requests, &res.limits].into_iter().flatten() {
        for (name, q) in map {
            if known.contains(name) || name.ends_with("/gpu") {
                let n = parse_count(&q.0)
                    .map_err(|e| format!("container {}: {name} {:?}: {e}", container.name, q.0))?;
                out.insert(name.clone(), n as usize);
            }
        }
    }
    Ok(out.into_iter().filter(|(_, n)| *n > 0).collect())
}

impl Admission {
    /// A worker that has admitted nothing yet.
    pub fn new(
        config: AdmissionConfig,
        client: kube::Client,
        state: Arc<Mutex<DeviceState>>,
    ) -> Self {
        Self {
            config,
            client,
            state,
            admitted: HashSet::new(),
            syncing: HashMap::new(),
            unreported: HashMap::new(),
            containers: Vec::new(),
            running: Arc::new(Mutex::new(Vec::new())),
            dra: None,
            forget_dra_plugins: Arc::default(),
            sync_errors: HashMap::new(),
            cgroups: None,
            cri: None,
        }
    }

    /// The node's cgroup names (cgroupfs when this kubelet makes no cgroups: what the
    /// containers' `/proc/<pid>/cgroup` would say on a default kubelet).
    fn layout(&self) -> Layout {
        self.cgroups.as_ref().map_or(
            Layout {
                driver: CgroupDriver::Cgroupfs,
            },
            PodCgroups::layout,
        )
    }

    /// Kills every container (kubelet-sim stops).
    pub fn stop_containers(&mut self) {
        for mut c in self.containers.drain(..) {
            c.kill();
        }
        lock_running(&self.running).clear();
    }

    /// Kills containers of pods that are gone or finished; notes exits; publishes records.
    fn tend_containers(&mut self, live: &HashSet<String>) {
        let mut kept = Vec::new();
        for mut c in self.containers.drain(..) {
            if !live.contains(&c.record.pod_uid) {
                tracing::info!(pod = %format!("{}/{}", c.record.namespace, c.record.pod), container = %c.record.container, "pod gone: killing its container");
                c.kill();
                continue;
            }
            if let Some(status) = c.poll() {
                tracing::info!(pod = %format!("{}/{}", c.record.namespace, c.record.pod), container = %c.record.container, "container exited: {status}");
            }
            kept.push(c);
        }
        self.containers = kept;
        *lock_running(&self.running) = self.containers.iter().map(|c| c.record.clone()).collect();
    }

    /// One pass over the node's pods as the pod watch shows them (`pods`: every pod bound
    /// to this node): release ids of finished or deleted pods, admit new pods.
    pub async fn sync(&mut self, pods: &[Arc<Pod>]) -> Result<(), kube::Error> {
        let live: HashSet<String> = pods
            .iter()
            .filter(|p| !matches!(phase(p), Some("Succeeded" | "Failed")))
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        lock(&self.state)
            .assigned
            .retain(|uid, _| live.contains(uid));
        let present: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.admitted.retain(|uid| present.contains(uid.as_str()));
        self.unreported.retain(|uid, _| live.contains(uid));
        self.syncing.retain(|uid, _| live.contains(uid));
        self.sync_errors.retain(|uid, _| live.contains(uid));
        self.tend_containers(&live);
        if let Some(cri) = self.cri.as_mut() {
            cri.tend(&live).await;
        }
        if let Some(dra) = self.dra.as_mut() {
            if self
                .forget_dra_plugins
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                dra.forget_plugins();
            }
            dra.watch_plugins().await;
            // Containers of gone pods are killed above; now their claims are unprepared.
            dra.release(&live.iter().cloned().collect()).await;
        }
        // Then their cgroups go (kubelet's orphaned pod cgroup cleanup).
        if let Some(cgroups) = &self.cgroups {
            for uid in cgroups.remove_others(&live) {
                tracing::debug!(pod_uid = %uid, "pod cgroup removed");
            }
        }
        let mut first_error = None;
        for pod in pods {
            let pod: &Pod = pod;
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let pending = phase(pod).is_none_or(|p| p == "Pending");
            if !self.admitted.contains(&uid) && pending {
                self.admitted.insert(uid.clone());
                match self.admit(pod, &uid).await {
                    Ok(allocated) => {
                        self.syncing.insert(uid.clone(), allocated);
                    }
                    Err((allocated, e)) => {
                        let report = self.report_of(pod, &uid, allocated, Err(e));
                        self.unreported.insert(uid.clone(), report);
                    }
                }
            }
            if pending && self.syncing.contains_key(&uid) {
                match self.sync_pod(pod, &uid).await {
                    Ok(report) => {
                        self.sync_errors.remove(&uid);
                        self.unreported.insert(uid.clone(), report);
                    }
                    // Not started yet: the pod stays pending, the next pass retries.
                    Err(e) => {
                        if self.sync_errors.get(&uid) != Some(&e) {
                            tracing::warn!(pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or("")), "{e}");
                            self.sync_errors.insert(uid.clone(), e);
                        }
                    }
                }
            }
            if let Err(e) = self.report(&uid).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Writes a pending report; it stays pending (retried next pass) when a patch fails.
    async fn report(&mut self, uid: &str) -> Result<(), kube::Error> {
        let Some(report) = self.unreported.get(uid) else {
            return Ok(());
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &report.namespace);
        api.patch(
            &report.name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {RECORD_ANNOTATION: report.record_text}}}),
            ),
        )
        .await?;
        api.patch_status(
            &report.name,
            &PatchParams::default(),
            &Patch::Merge(report.status.clone()),
        )
        .await?;
        if let Some(report) = self.unreported.remove(uid)
            && let Some(start) = report.start
        {
            let layout = self.layout();
            if let Some(cri) = self.cri.as_mut() {
                let allocated = start
                    .apps
                    .iter()
                    .map(|a| (a.name.clone(), a.cri_allocated()))
                    .collect();
                cri.start_pod(&report.pod, start.qos, layout, allocated)
                    .await;
            } else {
                self.start_containers(&start, &report.namespace, &report.name);
            }
        }
        Ok(())
    }

    /// Starts an admitted pod as kubelet's `SyncPod` does (see the module doc): the pod
    /// cgroup, the claims prepared, the sandbox's cgroup; then what to report. An error
    /// leaves the pod in `syncing` for the next pass.
    async fn sync_pod(&mut self, pod: &Pod, uid: &str) -> Result<Report, String> {
        let qos = Qos::of_pod(pod);
        if let Some(cgroups) = &self.cgroups {
            cgroups
                .ensure_pod(qos, uid)
                .map_err(|e| format!("cannot create the pod cgroup: {e}"))?;
        }
        let claims = self.prepare_claims(pod).await?;
        if let Some(cgroups) = &self.cgroups {
            cgroups
                .start_sandbox(qos, uid)
                .map_err(|e| format!("cannot start the pod sandbox: {e}"))?;
        }
        let allocated = self.syncing.remove(uid).unwrap_or_default();
        Ok(self.report_of(pod, uid, allocated, Ok(claims)))
    }

    /// Prepares the pod's ResourceClaims when it has some and this kubelet does DRA.
    async fn prepare_claims(
        &mut self,
        pod: &Pod,
    ) -> Result<BTreeMap<String, ContainerClaims>, String> {
        let has_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty())
            || crate::dra_manager::extended_claim_name(pod).is_some();
        let Some(dra) = self.dra.as_mut().filter(|_| has_claims) else {
            return Ok(BTreeMap::new());
        };
        dra.prepare_pod(pod)
            .await
            .map_err(|e| format!("cannot prepare the pod's claims: {e}"))
    }

    /// Allocates every container of the pod (once, at admission): what each got, in
    /// admission order; on failure, what the containers before the failing one got.
    async fn admit(
        &mut self,
        pod: &Pod,
        uid: &str,
    ) -> Result<Vec<ContainerAlloc>, (Vec<ContainerAlloc>, String)> {
        let default_spec = Default::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let mut done = Vec::new();
        let mut init_ids: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for slot in container_slots(spec) {
            let known: BTreeSet<String> = lock(&self.state).resources.keys().cloned().collect();
            // Extended resources DRA serves for this container (KEP-5004) are not the device
            // manager's.
            let by_dra = crate::dra_manager::dra_extended_resources(pod, slot.container);
            let wants = match container_resources(slot.container, &known) {
                Ok(w) => w
                    .into_iter()
                    .filter(|(r, _)| !by_dra.contains_key(r))
                    .collect::<Vec<_>>(),
                Err(e) => return Err((done, e)),
            };
            let mut container_record_entries = Vec::new();
            let mut app = AppAlloc {
                name: slot.container.name.clone(),
                ..AppAlloc::default()
            };
            for (resource, count) in wants {
                match self
                    .allocate_one(uid, &resource, count, slot.kind, &mut init_ids)
                    .await
                {
                    Ok((ids, response)) => {
                        app.envs.extend(response.envs.clone());
                        app.mounts.extend(response.mounts.iter().map(|m| MountSpec {
                            container_path: m.container_path.clone(),
                            host_path: m.host_path.clone(),
                            read_only: m.read_only,
                        }));
                        app.devices.extend(
                            response
                                .devices
                                .iter()
                                .map(|d| (d.container_path.clone(), d.host_path.clone())),
                        );
                        app.device_permissions.extend(
                            response
                                .devices
                                .iter()
                                .map(|d| (d.container_path.clone(), d.permissions.clone())),
                        );
                        app.cdi_devices
                            .extend(response.cdi_devices.iter().map(|c| c.name.clone()));
                        container_record_entries.push(container_record(&resource, &ids, &response));
                    }
                    Err(e) => {
                        return Err((done, format!("container {}: {e}", slot.container.name)));
                    }
                }
            }
            done.push(ContainerAlloc {
                kind: slot.kind,
                records: container_record_entries,
                app,
            });
        }
        Ok(done)
    }

    /// What to report for a pod: Running with what its containers got from its claims
    /// (first) and the device manager, or Failed with the admission error.
    fn report_of(
        &self,
        pod: &Pod,
        uid: &str,
        allocated: Vec<ContainerAlloc>,
        claims: Result<BTreeMap<String, ContainerClaims>, String>,
    ) -> Report {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let default_spec = Default::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let (mut claims, failure) = match claims {
            Ok(c) => (c, None),
            Err(e) => (BTreeMap::new(), Some(e)),
        };
        let mut records = serde_json::Map::new();
        let mut apps: Vec<AppAlloc> = Vec::new();
        for c in allocated {
            let mut entries = Vec::new();
            let mut app = AppAlloc {
                name: c.app.name.clone(),
                ..AppAlloc::default()
            };
            if let Some(got) = claims.remove(&c.app.name) {
                app.envs.extend(got.edits.env);
                app.mounts.extend(got.edits.mounts);
                app.devices.extend(got.edits.devices);
                entries.extend(got.records);
            }
            app.envs.extend(c.app.envs);
            app.mounts.extend(c.app.mounts);
            app.devices.extend(c.app.devices);
            app.device_permissions.extend(c.app.device_permissions);
            app.cdi_devices.extend(c.app.cdi_devices);
            entries.extend(c.records);
            if !entries.is_empty() {
                records.insert(app.name.clone(), Value::Array(entries));
            }
            if c.kind == ContainerKind::App {
                apps.push(app);
            }
        }
        let qos = Qos::of_pod(pod);
        let record_text = Value::Object(records).to_string();
        if let Some(dir) = &self.config.record_dir {
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(dir.join(format!("{ns}_{name}.json")), &record_text);
        }
        let status = match &failure {
            // The containerd runtime reports each container as it starts (`cri_runtime/`).
            None if self.cri.is_some() => {
                json!({"status": {"phase": "Pending", "containerStatuses": spec.containers.iter()
                    .map(|c| json!({"name": c.name, "image": c.image.clone().unwrap_or_default(),
                        "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "ContainerCreating"}}}))
                    .collect::<Vec<_>>()}})
            }
            None if self.config.run_containers => {
                json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": container_statuses(uid, spec)}})
            }
            None => {
                json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
            }
            Some(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), "admission failed: {e}");
                lock(&self.state).assigned.remove(uid);
                json!({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                    "message": format!("Allocate failed due to {e}, which is unexpected")}})
            }
        };
        let start = failure.is_none().then(|| Start {
            uid: uid.to_owned(),
            qos,
            spec: spec.clone(),
            apps,
        });
        Report {
            namespace: ns,
            name,
            record_text,
            status,
            start,
            pod: pod.clone(),
        }
    }

    async fn allocate_one(
        &self,
        uid: &str,
        resource: &str,
        count: usize,
        kind: ContainerKind,
        init_ids: &mut BTreeMap<String, Vec<String>>,
    ) -> Result<(Vec<String>, ContainerAllocateResponse), String> {
        let (endpoint, preferred, free) = {
            let s = lock(&self.state);
            let r = s
                .resources
                .get(resource)
                .ok_or_else(|| format!("no device plugin registered {resource}"))?;
            let held: BTreeSet<String> = s
                .assigned
                .get(uid)
                .and_then(|m| m.get(resource))
                .cloned()
                .unwrap_or_default();
            // Ids this pod holds for its app containers are not free for another app
            // container; init containers' ids are reusable (kubelet reuses them).
            let reusable: BTreeSet<&String> =
                init_ids.get(resource).into_iter().flatten().collect();
            let free: Vec<String> = s
                .free_ids(resource, uid)
                .into_iter()
                .filter(|id| !held.contains(id) || reusable.contains(id))
                .collect();
            (r.endpoint.clone(), r.preferred_allocation, free)
        };
        if free.len() < count {
            return Err(format!(
                "requested {count} {resource} but only {} healthy and unallocated on this node",
                free.len()
            ));
        }
        let channel = connect_unix(&self.config.dir.join(&endpoint))
            .await
            .map_err(|e| format!("cannot dial device plugin {endpoint}: {e}"))?;
        let mut client = DevicePluginClient::new(channel);
        let ids = if preferred {
            let resp = client
                .get_preferred_allocation(PreferredAllocationRequest {
                    container_requests: vec![ContainerPreferredAllocationRequest {
                        available_device_i_ds: free.clone(),
                        must_include_device_i_ds: Vec::new(),
                        allocation_size: count as i32,
                    }],
                })
                .await
                .map_err(|e| format!("GetPreferredAllocation: {}", e.message()))?
                .into_inner();
            let mut ids = resp
                .container_responses
                .into_iter()
                .next()
                .map(|c| c.device_i_ds)
                .unwrap_or_default();
            ids.retain(|id| free.contains(id));
            ids.dedup();
            if ids.len() == count {
                ids
            } else {
                free[..count].to_vec()
            }
        } else {
            free[..count].to_vec()
        };
        let resp = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                }],
            })
            .await
            .map_err(|e| e.message().to_owned())?
            .into_inner();
        let response =
            resp.container_responses.into_iter().next().ok_or_else(|| {
                "the plugin answered Allocate with no container response".to_owned()
            })?;
        let mut s = lock(&self.state);
        let held = s
            .assigned
            .entry(uid.to_owned())
            .or_default()
            .entry(resource.to_owned())
            .or_default();
        held.extend(ids.iter().cloned());
        if matches!(kind, ContainerKind::Init) {
            init_ids
                .entry(resource.to_owned())
                .or_default()
                .extend(ids.iter().cloned());
        }
        Ok((ids, response))
    }

    /// Starts the app containers: each one's cgroup appears as it starts; with
    /// `run_containers`, those with a command run as processes (the others never start).
    fn start_containers(&mut self, start: &Start, ns: &str, name: &str) {
        let layout = self.layout();
        for c in &start.spec.containers {
            let runs = c.command.as_ref().is_some_and(|c| !c.is_empty());
            if self.config.run_containers && !runs {
                continue;
            }
            if let Some(cgroups) = &self.cgroups
                && let Err(e) = cgroups.start_container(
                    start.qos,
                    &start.uid,
                    &container_id(&start.uid, &c.name),
                )
            {
                tracing::warn!(pod = %format!("{ns}/{name}"), container = %c.name, "{e}");
            }
        }
        if self.config.run_containers {
            self.start_processes(start, layout, ns, name);
        }
    }

    fn start_processes(&mut self, start: &Start, layout: Layout, ns: &str, name: &str) {
        let (uid, spec, apps) = (start.uid.as_str(), &start.spec, &start.apps);
        let image_env = match self.config.runtime.image_env() {
            Ok(env) => env,
            Err(e) => {
                tracing::warn!("cannot start containers: {e}");
                return;
            }
        };
        let state = self.config.runtime.state_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!(
                "kubelet-sim-{}-{}",
                self.config.node,
                std::process::id()
            ))
        });
        for c in &spec.containers {
            let Some(command) = c.command.as_ref().filter(|c| !c.is_empty()) else {
                continue;
            };
            let alloc = apps.iter().find(|a| a.name == c.name);
            let mut env = image_env.clone();
            env.extend(
                c.env
                    .iter()
                    .flatten()
                    .filter_map(|e| Some((e.name.clone(), e.value.clone()?))),
            );
            if let Some(a) = alloc {
                env.extend(a.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let log = self.config.record_dir.as_ref().map(|dir| {
                let _ = std::fs::create_dir_all(dir);
                dir.join(format!("{ns}_{name}_{}.log", c.name))
            });
            let container = ContainerSpec {
                pod_uid: uid.to_owned(),
                namespace: ns.to_owned(),
                pod: name.to_owned(),
                container: c.name.clone(),
                container_id: container_id(uid, &c.name),
                cgroup: format!(
                    "/{}",
                    layout
                        .container(start.qos, uid, &container_id(uid, &c.name))
                        .display()
                ),
                argv: command
                    .iter()
                    .chain(c.args.iter().flatten())
                    .cloned()
                    .collect(),
                env,
                mounts: alloc.map(|a| a.mounts.clone()).unwrap_or_default(),
                devices: alloc.map(|a| a.devices.clone()).unwrap_or_default(),
                log,
            };
            let scratch = state.join(format!("{uid}_{}", c.name));
            match RunningContainer::start(&container, &self.config.runtime.dev_root, &scratch) {
                Ok(running) => self.containers.push(running),
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), container = %c.name, "cannot start the container: {e}")
                }
            }
        }
        *lock_running(&self.running) = self.containers.iter().map(|c| c.record.clone()).collect();
    }
}

impl AppAlloc {
    /// What the containerd runtime applies (`cri_spec.rs`).
    fn cri_allocated(&self) -> crate::cri_spec::Allocated {
        crate::cri_spec::Allocated {
            envs: self.envs.clone(),
            mounts: self.mounts.clone(),
            devices: self
                .devices
                .iter()
                .map(|(c, h)| crate::cri_spec::DeviceNode {
                    container_path: c.clone(),
                    host_path: h.clone(),
                    permissions: self.device_permissions.get(c).cloned().unwrap_or_default(),
                })
                .collect(),
            cdi_devices: self.cdi_devices.clone(),
        }
    }
}

fn lock_running(
    m: &Mutex<Vec<ContainerRecord>>,
) -> std::sync::MutexGuard<'_, Vec<ContainerRecord>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The app containers' statuses a kubelet posts, with the ids their processes' cgroups
/// carry (`containerd://<id>`), so node agents can map processes to containers.
fn container_statuses(uid: &str, spec: &PodSpec) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    Value::Array(
        spec.containers
            .iter()
            .map(|c| {
                let running = c.command.as_ref().is_some_and(|c| !c.is_empty());
                json!({
                    "name": c.name,
                    "image": c.image.clone().unwrap_or_default(),
                    "imageID": "",
                    "containerID": format!("containerd://{}", container_id(uid, &c.name)),
                    "ready": running,
                    "started": running,
                    "restartCount": 0,
                    "state": if running {
                        json!({"running": {"startedAt": now}})
                    } else {
                        json!({"waiting": {"reason": "NoCommand"}})
                    },
                })
            })
            .collect(),
    )
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}
