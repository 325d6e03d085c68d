//! Kubelet's DRA side: the plugin watcher's DRA half and the DRA manager.
//!
//! - Registration: every `*.sock` in the plugin-registry directory is dialled (once per
//!   socket file: a re-created socket is dialled again), `GetInfo` read; type `DRAPlugin`
//!   with `v1.DRAPlugin` among its versions is registered under its name with its endpoint,
//!   and told so with `NotifyRegistrationStatus` (anything else is told why not). A socket
//!   that disappears drops the registration.
//! - Prepare, after the pod cgroup is made and before the sandbox (kubelet's order, see
//!   `admission.rs`): each of the pod's claims is read from the
//!   API server and must be allocated and reserved for the pod (kubelet's checks); claims
//!   not prepared yet are recorded in the checkpoint first (so they get unprepared even if
//!   this process dies), then sent to their drivers' `NodePrepareResources`, one call per
//!   driver; the answered devices and CDI ids are checkpointed. A failure leaves the pod
//!   Pending with its pod cgroup and no sandbox, and the next pass retries (kubelet's pod
//!   sync retries too).
//! - Container edits: each container's `resources.claims` pick CDI ids (per request, or the
//!   whole claim), which are resolved in the CDI spec files the drivers wrote
//!   ([`crate::cdi`]).
//! - Extended resources backed by DRA (KEP-5004): the claim the scheduler made, named in
//!   `pod.status.extendedResourceClaimStatus`, is prepared with the pod's others; a container
//!   gets the CDI ids of the requests its `requestMappings` name for the extended resources
//!   it requests (not through `resources.claims`), and the device manager leaves those
//!   resources alone ([`dra_extended_resources`]).
//! - Unprepare: a claim whose pods are all gone or finished is sent to
//!   `NodeUnprepareResources` and leaves the checkpoint once every driver said yes; an
//!   unregistered driver (not back yet after a restart) is retried next pass.
//!
//! Not modelled: `v1beta1` plugins, `DRAResourceHealth`, the PodResources API's
//! `dynamic_resources`, rolling-update registrations (two sockets of one driver: the newest
//! wins), and kubelet's per-driver timeout (10 s here for every call).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hami_deviceplugin_api::connect_unix;
// The registration type and the DRA v1 service name this kubelet speaks.
use hami_deviceplugin_api::dra_v1::dra_plugin_client::DraPluginClient;
use hami_deviceplugin_api::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use hami_deviceplugin_api::pluginregistration::registration_client::RegistrationClient;
use hami_deviceplugin_api::pluginregistration::{InfoRequest, RegistrationStatus};
use hami_deviceplugin_api::{DRA_PLUGIN_TYPE, DRA_V1_SERVICE};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

use crate::cdi::{self, Edits};
use crate::dra_state::{ClaimEntry, DraState, PreparedDevice};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the DRA side finds plugins, keeps its checkpoint and reads CDI specs.
#[derive(Debug, Clone)]
pub struct DraConfig {
    /// The plugin-registry directory (`/var/lib/kubelet/plugins_registry` on a node).
    pub registry_dir: PathBuf,
    /// The checkpoint file (kubelet: `/var/lib/kubelet/dra_manager_state`); survives restarts.
    pub state_file: PathBuf,
    /// Directories of CDI spec files (`/etc/cdi`, `/var/run/cdi`).
    pub cdi_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
struct Plugin {
    endpoint: PathBuf,
    socket: PathBuf,
}

/// What one container got from the pod's claims.
#[derive(Debug, Clone, Default)]
pub struct ContainerClaims {
    /// Record entries (`kubelet-sim.hami.io/allocations`), one per claim used.
    pub records: Vec<Value>,
    /// The CDI edits to start it with.
    pub edits: Edits,
}

/// The DRA manager of one kubelet (see the module doc).
pub struct DraManager {
    config: DraConfig,
    client: kube::Client,
    plugins: BTreeMap<String, Plugin>,
    /// Registration sockets already dialled, with their modification time.
    seen: BTreeMap<PathBuf, Option<SystemTime>>,
    state: DraState,
}

/// The pseudo entry name of the extended-resource claim among a pod's claims (not a valid
/// entry name, so it cannot clash with one).
const EXTENDED_ENTRY: &str = "<extended-resources>";

/// The claim the scheduler made for the pod's extended resources (KEP-5004), if any.
pub fn extended_claim_name(pod: &Pod) -> Option<String> {
    let st = pod
        .status
        .as_ref()?
        .extended_resource_claim_status
        .as_ref()?;
    (!st.resource_claim_name.is_empty()).then(|| st.resource_claim_name.clone())
}

/// The container's requests names with a non-zero quantity (requests, else limits: the API
/// server's defaulting copies limits into requests).
fn requested(c: &k8s_openapi::api::core::v1::Container) -> BTreeSet<String> {
    let mut all: BTreeMap<&String, &str> = BTreeMap::new();
    if let Some(r) = &c.resources {
        for map in [&r.limits, &r.requests].into_iter().flatten() {
            for (k, v) in map {
                all.insert(k, v.0.as_str());
            }
        }
    }
    all.into_iter()
        .filter(|(_, v)| !v.trim().trim_start_matches(['0', '.']).is_empty())
        .map(|(k, _)| k.clone())
        .collect()
}

/// The container's extended resources that DRA serves (a mapping in
/// `extendedResourceClaimStatus` names them for it) and their request names: the device
/// manager skips these, as kubelet's does.
pub fn dra_extended_resources(
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let Some(st) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    else {
        return out;
    };
    let wants = requested(container);
    for m in &st.request_mappings {
        if m.container_name == container.name && wants.contains(&m.resource_name) {
            out.entry(m.resource_name.clone())
                .or_default()
                .push(m.request_name.clone());
        }
    }
    out
}

/// The claim name a pod's entry refers to (`resourceClaimName`, or from the pod's status for
/// a template).
pub fn claim_name(pod: &Pod, entry: &str) -> Option<String> {
    let e = pod
        .spec
        .as_ref()?
        .resource_claims
        .iter()
        .flatten()
        .find(|c| c.name == entry)?;
    if let Some(n) = &e.resource_claim_name {
        return Some(n.clone());
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .iter()
        .flatten()
        .find(|s| s.name == entry)?
        .resource_claim_name
        .clone()
}

fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

impl DraManager {
    /// A manager resuming from the checkpoint (none yet = empty; a corrupt one is an error).
    pub fn load(config: DraConfig, client: kube::Client) -> anyhow::Result<Self> {
        let state = match std::fs::read_to_string(&config.state_file) {
            Ok(text) => DraState::decode(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", config.state_file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => DraState::default(),
            Err(e) => anyhow::bail!("cannot read {}: {e}", config.state_file.display()),
        };
        Ok(Self {
            config,
            client,
            plugins: BTreeMap::new(),
            seen: BTreeMap::new(),
            state,
        })
    }

    /// The prepared claims (the checkpoint's content).
    pub fn state(&self) -> &DraState {
        &self.state
    }

    /// Registered drivers.
    pub fn drivers(&self) -> Vec<String> {
        self.plugins.keys().cloned().collect()
    }

    /// Forgets registrations (a kubelet restart: plugins are found again from their sockets).
    pub fn forget_plugins(&mut self) {
        self.plugins.clear();
        self.seen.clear();
    }

    fn save(&self) -> Result<(), String> {
        write_atomic(&self.config.state_file, &self.state.encode())
            .map_err(|e| format!("cannot write {}: {e}", self.config.state_file.display()))
    }

    /// One pass of the plugin watcher over the registry directory.
    pub async fn watch_plugins(&mut self) {
        let Ok(dir) = std::fs::read_dir(&self.config.registry_dir) else {
            return;
        };
        let mut present = BTreeSet::new();
        for entry in dir.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("sock") {
                continue;
            }
            present.insert(path.clone());
            let mtime = entry.metadata().ok().and_then(|m| m.modified().ok());
            if self.seen.get(&path) == Some(&mtime) {
                continue;
            }
            match self.register(&path).await {
                Ok(name) => {
                    tracing::info!(driver = %name, socket = %path.display(), "DRA plugin registered");
                    self.seen.insert(path, mtime);
                }
                // Not listening yet (the plugin binds, then serves): dial again next pass.
                Err(e) => tracing::debug!(socket = %path.display(), "registration: {e}"),
            }
        }
        self.seen.retain(|p, _| present.contains(p));
        self.plugins.retain(|name, p| {
            let keep = present.contains(&p.socket);
            if !keep {
                tracing::info!(driver = %name, "DRA plugin socket gone: deregistered");
            }
            keep
        });
    }

    async fn register(&mut self, socket: &Path) -> Result<String, String> {
        let channel = connect_unix(socket).await.map_err(|e| e.to_string())?;
        let mut reg = RegistrationClient::new(channel);
        let info = tokio::time::timeout(CALL_TIMEOUT, reg.get_info(InfoRequest {}))
            .await
            .map_err(|_| "GetInfo timed out".to_owned())?
            .map_err(|e| format!("GetInfo: {}", e.message()))?
            .into_inner();
        let refusal = if info.r#type != DRA_PLUGIN_TYPE {
            // Other plugin types (CSI, device plugins via this watcher) are not this kubelet's.
            Some(format!(
                "plugin type {:?} is not handled by this kubelet",
                info.r#type
            ))
        } else if !info.supported_versions.iter().any(|v| v == DRA_V1_SERVICE) {
            Some(format!(
                "DRA plugin {:?} supports {:?}, this kubelet needs {DRA_V1_SERVICE}",
                info.name, info.supported_versions
            ))
        } else if info.name.is_empty() || info.endpoint.is_empty() {
            Some("a DRA plugin needs a name and an endpoint".to_owned())
        } else {
            None
        };
        let status = RegistrationStatus {
            plugin_registered: refusal.is_none(),
            error: refusal.clone().unwrap_or_default(),
        };
        let _ = tokio::time::timeout(CALL_TIMEOUT, reg.notify_registration_status(status)).await;
        if let Some(r) = refusal {
            // Told; not dialled again until the socket changes.
            return Ok(format!("(refused: {r})"));
        }
        self.plugins.insert(
            info.name.clone(),
            Plugin {
                endpoint: PathBuf::from(&info.endpoint),
                socket: socket.to_owned(),
            },
        );
        Ok(info.name)
    }

    async fn dial(
        &self,
        driver: &str,
    ) -> Result<DraPluginClient<tonic::transport::Channel>, String> {
        let p = self
            .plugins
            .get(driver)
            .ok_or_else(|| format!("DRA driver {driver} is not registered"))?;
        let channel = connect_unix(&p.endpoint).await.map_err(|e| {
            format!(
                "cannot dial DRA driver {driver} at {}: {e}",
                p.endpoint.display()
            )
        })?;
        Ok(DraPluginClient::new(channel))
    }

    /// Prepares the pod's claims and returns what each container gets (see the module doc).
    pub async fn prepare_pod(
        &mut self,
        pod: &Pod,
    ) -> Result<BTreeMap<String, ContainerClaims>, String> {
        let ns = pod.namespace().unwrap_or_else(|| "default".into());
        let pod_uid = pod.uid().unwrap_or_default();
        let mut entries: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        let extended = extended_claim_name(pod);
        if extended.is_some() {
            entries.push(EXTENDED_ENTRY.to_owned());
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &ns);
        // entry name → (claim name, claim uid)
        let mut claims: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut todo: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for entry in &entries {
            let name = match entry.as_str() {
                EXTENDED_ENTRY => extended.clone(),
                _ => claim_name(pod, entry),
            }
            .ok_or_else(|| format!("claim {entry:?} of the pod has no ResourceClaim yet"))?;
            let c = api
                .get(&name)
                .await
                .map_err(|e| format!("cannot read claim {ns}/{name}: {e}"))?;
            let uid = c.uid().unwrap_or_default();
            let status = c.status.as_ref();
            let allocation = status
                .and_then(|s| s.allocation.as_ref())
                .ok_or_else(|| format!("claim {ns}/{name} is not allocated"))?;
            if !status
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| r.iter().any(|r| r.uid == pod_uid))
            {
                return Err(format!("claim {ns}/{name} is not reserved for the pod"));
            }
            claims.insert(entry.clone(), (name.clone(), uid.clone()));
            if let Some(done) = self.state.claims.get_mut(&uid) {
                done.pods.insert(pod_uid.clone());
                if !done.drivers.values().any(Vec::is_empty) {
                    continue;
                }
            }
            let drivers: BTreeSet<String> = allocation
                .devices
                .as_ref()
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| r.driver.clone())
                .collect();
            let e = self
                .state
                .claims
                .entry(uid.clone())
                .or_insert_with(|| ClaimEntry {
                    namespace: ns.clone(),
                    name: name.clone(),
                    ..ClaimEntry::default()
                });
            e.pods.insert(pod_uid.clone());
            for d in drivers {
                e.drivers.entry(d.clone()).or_default();
                todo.entry(d).or_default().push(Claim {
                    namespace: ns.clone(),
                    uid: uid.clone(),
                    name: name.clone(),
                });
            }
        }
        // Recorded before the calls: whatever happens next, these get unprepared.
        self.save()?;
        for (driver, batch) in todo {
            let mut client = self.dial(&driver).await?;
            let resp = tokio::time::timeout(
                CALL_TIMEOUT,
                client.node_prepare_resources(NodePrepareResourcesRequest {
                    claims: batch.clone(),
                }),
            )
            .await
            .map_err(|_| format!("NodePrepareResources of {driver} timed out"))?
            .map_err(|e| format!("NodePrepareResources of {driver}: {}", e.message()))?
            .into_inner();
            for c in &batch {
                let r = resp.claims.get(&c.uid).ok_or_else(|| {
                    format!(
                        "driver {driver} answered nothing for claim {}/{}",
                        c.namespace, c.name
                    )
                })?;
                if !r.error.is_empty() {
                    return Err(format!(
                        "driver {driver} cannot prepare claim {}/{}: {}",
                        c.namespace, c.name, r.error
                    ));
                }
                let devices: Vec<PreparedDevice> = r
                    .devices
                    .iter()
                    .map(|d| PreparedDevice {
                        requests: d.request_names.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        cdi_ids: d.cdi_device_ids.clone(),
                    })
                    .collect();
                if let Some(e) = self.state.claims.get_mut(&c.uid) {
                    e.drivers.insert(driver.clone(), devices);
                }
            }
            self.save()?;
        }
        self.container_claims(pod, &claims)
    }

    fn container_claims(
        &self,
        pod: &Pod,
        claims: &BTreeMap<String, (String, String)>,
    ) -> Result<BTreeMap<String, ContainerClaims>, String> {
        let specs = self.cdi_specs();
        let mut out = BTreeMap::new();
        let spec = pod.spec.as_ref();
        let containers = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .chain(spec.map(|s| &s.containers).into_iter().flatten());
        for c in containers {
            let mut got = ContainerClaims::default();
            let mut ids = Vec::new();
            // Entries of `resources.claims`, then the extended-resource claim's requests the
            // pod's mappings name for this container: (pod entry, request).
            let mut uses: Vec<(String, Option<String>)> = c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .into_iter()
                .flatten()
                .map(|r| (r.name.clone(), r.request.clone()))
                .collect();
            for requests in dra_extended_resources(pod, c).into_values() {
                uses.extend(
                    requests
                        .into_iter()
                        .map(|q| (EXTENDED_ENTRY.to_owned(), Some(q))),
                );
            }
            for (entry, request) in uses {
                let (name, uid) = claims.get(&entry).ok_or_else(|| {
                    format!(
                        "container {} uses claim {entry:?}, which the pod does not have",
                        c.name
                    )
                })?;
                let mine = self.state.cdi_ids(uid, request.as_deref());
                let one = cdi::resolve(&specs, &mine)
                    .map_err(|e| format!("container {}: {e}", c.name))?;
                let entry = self.state.claims.get(uid);
                got.records.push(json!({
                    "resource": entry.map(|e| e.drivers.keys().cloned().collect::<Vec<_>>().join(",")).unwrap_or_default(),
                    "claim": name,
                    "request": request,
                    "deviceIds": entry.map(|e| e.drivers.values().flatten()
                        .filter(|d| request.as_deref().is_none_or(|q| d.requests.iter().any(|x| x == q)))
                        .map(|d| format!("{}/{}", d.pool, d.device)).collect::<Vec<_>>()).unwrap_or_default(),
                    "cdiDevices": mine,
                    "envs": one.env,
                    "devices": one.devices.iter().map(|(c, h)| json!({"containerPath": c, "hostPath": h})).collect::<Vec<_>>(),
                    "mounts": one.mounts.iter().map(|m| json!({
                        "containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only,
                    })).collect::<Vec<_>>(),
                }));
                ids.extend(mine);
            }
            if ids.is_empty() {
                continue;
            }
            got.edits =
                cdi::resolve(&specs, &ids).map_err(|e| format!("container {}: {e}", c.name))?;
            out.insert(c.name.clone(), got);
        }
        Ok(out)
    }

    /// Every CDI spec in the configured directories (unreadable files are skipped, as the
    /// runtimes' spec caches skip them).
    fn cdi_specs(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for dir in &self.config.cdi_dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths {
                if p.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                match std::fs::read_to_string(&p).map(|t| serde_json::from_str::<Value>(&t)) {
                    Ok(Ok(v)) => out.push(v),
                    _ => tracing::warn!(file = %p.display(), "unreadable CDI spec skipped"),
                }
            }
        }
        out
    }

    /// Unprepares claims whose pods are all gone (`live`: pods of this node still running or
    /// pending). Errors are logged and retried next pass.
    pub async fn release(&mut self, live: &BTreeSet<String>) {
        let free = self.state.release(live);
        if free.is_empty() {
            return;
        }
        // Recorded but never sent to a driver (an allocation without devices): nothing to undo.
        for (uid, e) in &free {
            if e.drivers.is_empty() {
                self.state.claims.remove(uid);
            }
        }
        let mut by_driver: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for (uid, e) in &free {
            for d in e.drivers.keys() {
                by_driver.entry(d.clone()).or_default().push(Claim {
                    namespace: e.namespace.clone(),
                    uid: uid.clone(),
                    name: e.name.clone(),
                });
            }
        }
        let mut done: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (driver, batch) in by_driver {
            let result = async {
                let mut client = self.dial(&driver).await?;
                let resp = tokio::time::timeout(
                    CALL_TIMEOUT,
                    client.node_unprepare_resources(NodeUnprepareResourcesRequest {
                        claims: batch.clone(),
                    }),
                )
                .await
                .map_err(|_| "timed out".to_owned())?
                .map_err(|e| e.message().to_owned())?
                .into_inner();
                Ok::<_, String>(resp)
            }
            .await;
            match result {
                Ok(resp) => {
                    for c in batch {
                        match resp.claims.get(&c.uid) {
                            Some(r) if r.error.is_empty() => {
                                done.entry(c.uid).or_default().insert(driver.clone());
                            }
                            Some(r) => {
                                tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), "NodeUnprepareResources of {driver}: {}", r.error)
                            }
                            None => {
                                tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), "driver {driver} answered nothing")
                            }
                        }
                    }
                }
                Err(e) => tracing::debug!("NodeUnprepareResources of {driver}: {e} (retried)"),
            }
        }
        for (uid, drivers) in done {
            if let Some(e) = self.state.claims.get_mut(&uid) {
                e.drivers.retain(|d, _| !drivers.contains(d));
                if e.drivers.is_empty() {
                    self.state.claims.remove(&uid);
                    tracing::info!(claim = %uid, "claim unprepared");
                }
            }
        }
        if let Err(e) = self.save() {
            tracing::warn!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resources_follow_the_mappings_of_the_container() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}},
                {"name": "b", "resources": {"requests": {"amd.com/gpu": "0"}}},
                {"name": "c"}]},
            "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-x",
                "requestMappings": [
                    {"containerName": "a", "resourceName": "amd.com/gpu", "requestName": "container-0-request-0"},
                    {"containerName": "b", "resourceName": "amd.com/gpu", "requestName": "container-1-request-0"}]}}}))
        .unwrap();
        let spec = pod.spec.clone().unwrap();
        assert_eq!(
            extended_claim_name(&pod).as_deref(),
            Some("p-extended-resources-x")
        );
        assert_eq!(
            dra_extended_resources(&pod, &spec.containers[0]),
            BTreeMap::from([(
                "amd.com/gpu".to_owned(),
                vec!["container-0-request-0".to_owned()]
            )])
        );
        // A zero request asks for nothing, whatever a mapping says; no mapping, nothing.
        assert!(dra_extended_resources(&pod, &spec.containers[1]).is_empty());
        assert!(dra_extended_resources(&pod, &spec.containers[2]).is_empty());
        let mut plain = pod.clone();
        plain.status = None;
        assert!(extended_claim_name(&plain).is_none());
        assert!(dra_extended_resources(&plain, &spec.containers[0]).is_empty());
    }
}
