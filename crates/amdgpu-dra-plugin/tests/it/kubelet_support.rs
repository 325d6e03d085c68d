//! What the kubelet-call tests share: the claims kubelet prepares (a test-owned claim
//! source), the node's scratch directories, starting and stopping the plugin over real
//! unix sockets, a DRA client, the checkpoint as a restart reads it, a bounded file wait, and a claim
//! source whose calls hang on purpose.

pub(crate) use std::collections::BTreeMap;
pub(crate) use std::path::Path;
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::Duration;

pub(crate) use hami_amd_discovery::discovery::discover;
pub(crate) use hami_amd_discovery::registration::{RegistrationSettings, register};
pub(crate) use hami_amdgpu_dra_plugin::claims::{ClaimSource, claim_key};
pub(crate) use hami_amdgpu_dra_plugin::dra_v1::dra_plugin_client::DraPluginClient;
pub(crate) use hami_amdgpu_dra_plugin::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
pub(crate) use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
pub(crate) use hami_amdgpu_dra_plugin::pluginregistration::registration_client::RegistrationClient;
pub(crate) use hami_amdgpu_dra_plugin::pluginregistration::{InfoRequest, RegistrationStatus};
pub(crate) use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
pub(crate) use hami_deviceplugin_api::connect_unix;
pub(crate) use hami_dra_core::api::*;
pub(crate) use hami_dra_core::prepare::PrepareSettings;
pub(crate) use hami_protocol::cu_list::CuSet;

/// The API server's claims as the test sets them (deletable, to test unprepare of a gone claim).
#[derive(Clone, Default)]
pub(crate) struct Claims(pub(crate) Arc<Mutex<BTreeMap<(String, String), ResourceClaim>>>);

impl ClaimSource for Claims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.0
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| format!("resourceclaims \"{name}\" not found"))
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let (namespace, name, uid) = claim_key(seen)?;
        let mut claims = self.0.lock().unwrap();
        let c = claims
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| format!("resourceclaims \"{name}\" not found"))?;
        if c.metadata.uid.as_deref() != Some(uid) {
            return Err(format!("resourceclaims \"{name}\" has another UID"));
        }
        let status = c.status.get_or_insert_default();
        status.devices.retain(|d| d.driver != driver);
        status.devices.extend_from_slice(devices);
        Ok(())
    }
}

pub(crate) fn claim(name: &str, uid: &str, device: &str, mem: &str, cus: &str) -> ResourceClaim {
    ResourceClaim {
        api_version: API_VERSION.into(),
        kind: "ResourceClaim".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: vec![DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: hami_dra_core::DRIVER.into(),
                        pool: "node-a".into(),
                        device: device.into(),
                        share_id: Some(format!("share-{uid}")),
                        consumed_capacity: [
                            ("memory", mem),
                            ("computeUnits", cus),
                            ("shares", "1"),
                        ]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                        ..Default::default()
                    }],
                    config: vec![],
                }),
                ..Default::default()
            }),
            reserved_for: vec![ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: format!("pod-{name}"),
                uid: format!("pod-{uid}"),
            }],
            devices: vec![],
        }),
    }
}

pub(crate) fn kclaim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

pub(crate) struct Node {
    pub(crate) _tree: hami_sysfs_fixtures::FixtureTree,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) devices: BTreeMap<String, hami_amd_discovery::registration::RegisteredDevice>,
}

pub(crate) fn node() -> Node {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let devices = hami_dra_core::slice::registered_by_name(&d, &reg)
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let dir = tree.sysfs_root().parent().unwrap().join("node");
    Node {
        _tree: tree,
        dir,
        devices,
    }
}

pub(crate) fn config(n: &Node) -> DriverConfig {
    DriverConfig {
        settings: PrepareSettings {
            driver: hami_dra_core::DRIVER.into(),
            node: "node-a".into(),
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
            cache_host_root: n.dir.join("vgpu").display().to_string(),
        },
        devices: n.devices.clone(),
        cdi_dir: n.dir.join("cdi"),
        checkpoint: n.dir.join("plugin/checkpoint.json"),
        dmem: None,
    }
}

pub(crate) struct Running {
    pub(crate) sockets: Sockets,
    pub(crate) stop: tokio::sync::oneshot::Sender<()>,
    pub(crate) handle: tokio::task::JoinHandle<()>,
    pub(crate) state: hami_amdgpu_dra_plugin::registration::RegistrationState,
}

pub(crate) async fn start<C: ClaimSource>(n: &Node, claims: C) -> Running {
    let driver = Arc::new(Driver::new(config(n), claims).unwrap());
    let sockets = Sockets::new(
        &n.dir.join("plugins_registry"),
        &n.dir.join("plugin"),
        hami_dra_core::DRIVER,
    );
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let (state, handle) = serve(driver, hami_dra_core::DRIVER, &sockets, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    Running {
        sockets,
        stop,
        handle,
        state,
    }
}

pub(crate) async fn stop(r: Running) {
    let _ = r.stop.send(());
    tokio::time::timeout(Duration::from_secs(10), r.handle)
        .await
        .unwrap()
        .unwrap();
}

pub(crate) async fn dra(path: &Path) -> DraPluginClient<tonic::transport::Channel> {
    DraPluginClient::new(connect_unix(path).await.unwrap())
}

/// The driver's checkpoint as a restarted plugin reads it (snapshot + journal).
pub(crate) fn checkpoint_on_disk(n: &Node) -> hami_amdgpu_dra_plugin::checkpoint::Checkpoint {
    hami_amdgpu_dra_plugin::checkpoint::Checkpoint::load(&n.dir.join("plugin/checkpoint.json"))
        .unwrap()
}

/// Waits (bounded) until `path` holds `want`.
pub(crate) async fn wait_for_file(path: &Path, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(path).ok().as_deref() == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never became {want:?}: {:?}",
            path.display(),
            std::fs::read_to_string(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Claims whose GET of `held` (or status write of `held_status`) waits until `release`
/// gets a permit (a call the API server never answers); counts those GETs and says when
/// one such call started.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) claims: Claims,
    pub(crate) held: String,
    pub(crate) held_status: String,
    pub(crate) release: Arc<tokio::sync::Semaphore>,
    pub(crate) started: Arc<tokio::sync::Notify>,
    pub(crate) gets: Arc<std::sync::atomic::AtomicUsize>,
    /// Every `namespace/name` a GET asked for.
    pub(crate) asked: Arc<Mutex<Vec<String>>>,
}

impl ClaimSource for Held {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("{namespace}/{name}"));
        if name == self.held {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.started.notify_one();
            self.release.acquire().await.unwrap().forget();
        }
        self.claims.get(namespace, name).await
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        if seen.metadata.name.as_deref() == Some(self.held_status.as_str()) {
            self.started.notify_one();
            self.release.acquire().await.unwrap().forget();
        }
        self.claims.set_device_status(seen, driver, devices).await
    }
}
