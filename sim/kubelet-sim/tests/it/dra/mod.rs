//! A DRA pod end to end: the embedded API server, the simulated kube-scheduler (DRA path:
//! claims from templates, allocation, reservation, binding), kubelet-sim with its DRA side
//! and the real amdgpu-dra-plugin (registration socket, NodePrepareResources, CDI specs,
//! ResourceSlices published from the MI210 capture). Two 40-CU claims land on one MI210
//! with disjoint CUs and the right env; a third that does not fit that GPU stays pending
//! with the scheduler's reason; deleting a pod unprepares its claim and frees its capacity,
//! and the pending pod then runs; a pod deleted while kubelet-sim is down is unprepared by
//! the next kubelet-sim from its checkpoint; a restarted driver registers again and keeps
//! its prepared claims' CUs. KEP-5004: a pod asking only for `amd.com/gpu` (the DeviceClass's
//! `extendedResourceName`, no claims, not through the webhook) gets the scheduler's claim and
//! whole GPUs through its `extendedResourceClaimStatus` mappings, and gives them back.
//!
//! Files: this one (the DRA node every test starts: server, kubelet-sim, plugin, scheduler),
//! `prepare_and_free.rs` (claims from templates end to end, restarts), `extended_resources.rs`
//! (KEP-5004).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegisteredDevice, RegistrationSettings, register};
use hami_amdgpu_dra_plugin::claims::KubeClaims;
use hami_amdgpu_dra_plugin::driver::{Driver, DriverConfig};
use hami_amdgpu_dra_plugin::registration::{Sockets, serve};
use hami_amdgpu_dra_plugin::slice_publisher::SlicePublisher;
use hami_dra_core::prepare::PrepareSettings;
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kube_scheduler_sim::dra::DraOptions;
use hami_kubelet_sim::dra_manager::DraConfig;
use hami_kubelet_sim::records::RECORD_ANNOTATION;
use hami_kubelet_sim::{Args, KubeletSim};
use hami_protocol::cu_list::CuSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const DRIVER: &str = hami_dra_core::DRIVER;
const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `check` until it returns `Some`, at most [`TIMEOUT`].
async fn wait<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap()
}

fn pod(name: &str, claim: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": "default-scheduler",
            "resourceClaims": [claim],
            "containers": [{"name": "main", "image": "rocm",
                "resources": {"claims": [{"name": "gpu"}]}}],
        },
    })
}

fn kubelet_args(dir: &Path) -> Args {
    Args {
        socket_dir: dir.join("device-plugins"),
        node_name: "node-a".into(),
        record_dir: None,
        run_containers: false,
        runtime: Default::default(),
        sync_interval_ms: 20,
    }
}

fn dra_config(dir: &Path) -> DraConfig {
    DraConfig {
        registry_dir: dir.join("plugins_registry"),
        state_file: dir.join("dra_manager_state"),
        cdi_dirs: vec![dir.join("cdi")],
    }
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    let pods = pods.clone();
    wait(&format!("pod {name} Running"), || {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
        }
    })
    .await
}

/// The pod's claim (from its status) once the scheduler allocated it.
async fn claim_of(claims: &Api<ResourceClaim>, pod: &Pod) -> ResourceClaim {
    let name = pod
        .status
        .as_ref()
        .unwrap()
        .resource_claim_statuses
        .as_ref()
        .unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    claims.get(&name).await.unwrap()
}

fn record(pod: &Pod) -> Value {
    serde_json::from_str(&pod.annotations()[RECORD_ANNOTATION]).unwrap()
}

fn cdi_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("cdi"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Starts the real plugin on the node's directories (resuming its checkpoint) and waits
/// until kubelet-sim registered it.
async fn start_plugin(
    client: &Client,
    dir: &Path,
    devices: &BTreeMap<String, RegisteredDevice>,
) -> (
    Arc<Driver<KubeClaims>>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let config = DriverConfig {
        settings: PrepareSettings {
            driver: DRIVER.into(),
            node: "node-a".into(),
            hook_host_path: "/usr/local/vgpu/libamvgpu.so".into(),
            hook_container_path: "/usr/local/vgpu/libamvgpu.so".into(),
            cache_host_root: dir.join("vgpu").display().to_string(),
        },
        devices: devices.clone(),
        cdi_dir: dir.join("cdi"),
        checkpoint: dir.join("plugin/checkpoint.json"),
        dmem: None,
    };
    let driver = Arc::new(
        Driver::new(
            config,
            KubeClaims {
                client: client.clone(),
            },
        )
        .unwrap(),
    );
    let sockets = Sockets::new(&dir.join("plugins_registry"), &dir.join("plugin"), DRIVER);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (mut registered, handle) = serve(driver.clone(), DRIVER, &sockets, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    tokio::time::timeout(TIMEOUT, registered.wait_for(|s| s.is_some()))
        .await
        .expect("kubelet-sim dials the registration socket")
        .unwrap();
    assert_eq!(*registered.borrow(), Some(Ok(())));
    (driver, stop, handle)
}

/// One DRA node: the embedded API server, kubelet-sim with its DRA side (it creates the
/// Node), the MI210 capture's ResourceSlice, the real plugin registered, and the simulated
/// kube-scheduler's DRA path.
struct DraNode {
    _server: hami_apiserver::RunningApiServer,
    client: Client,
    tree: hami_sysfs_fixtures::FixtureTree,
    dir: PathBuf,
    kubelet: KubeletSim,
    gpus: BTreeMap<String, RegisteredDevice>,
    driver: Arc<Driver<KubeClaims>>,
    stop_plugin: tokio::sync::oneshot::Sender<()>,
    plugin: tokio::task::JoinHandle<()>,
    scheduler: tokio::task::JoinHandle<()>,
}

async fn dra_node() -> DraNode {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let dir = tree.sysfs_root().parent().unwrap().join("node");

    // kubelet-sim (creates its Node), then the plugin: registration + slices.
    let kubelet = KubeletSim::start_with_dra(kubelet_args(&dir), client.clone(), dra_config(&dir))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    wait("the Node", || {
        let nodes = nodes.clone();
        async move { nodes.get_opt("node-a").await.ok().flatten() }
    })
    .await;
    let publisher = SlicePublisher {
        client: client.clone(),
        driver: DRIVER.into(),
        node: "node-a".into(),
        sysfs_root: tree.sysfs_root(),
        dev_root: tree.dev_root(),
        settings: RegistrationSettings::default(),
    };
    publisher.refresh().await.unwrap();
    let d = discover(&tree.sysfs_root()).unwrap();
    let reg = register(&d, &RegistrationSettings::default(), |_| true);
    let gpus: BTreeMap<String, RegisteredDevice> =
        hami_dra_core::slice::registered_by_name(&d, &reg)
            .into_iter()
            .map(|(k, v)| (k, v.clone()))
            .collect();
    let (driver, stop_plugin, plugin) = start_plugin(&client, &dir, &gpus).await;

    let scheduler = tokio::spawn(
        SimKubeScheduler::dra_only(client.clone(), "default-scheduler", DraOptions::default())
            .run(),
    );
    DraNode {
        _server: server,
        client,
        tree,
        dir,
        kubelet,
        gpus,
        driver,
        stop_plugin,
        plugin,
        scheduler,
    }
}

mod extended_resources;
mod prepare_and_free;
