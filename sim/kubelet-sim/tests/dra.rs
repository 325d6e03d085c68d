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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dra_pods_are_allocated_prepared_and_freed() {
    let DraNode {
        _server,
        client,
        tree: _tree,
        dir,
        kubelet,
        gpus,
        driver,
        stop_plugin,
        plugin,
        scheduler,
    } = dra_node().await;
    let class_api: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    create(&class_api, json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "amdgpu-slice"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}))
    .await;
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), "default");
    create(
        &templates,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "slice-40", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "16Gi", "computeUnits": "40"}}}}]}}}}),
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let template = json!({"name": "gpu", "resourceClaimTemplateName": "slice-40"});
    create(&pods, pod("a", template.clone())).await;
    let a = running(&pods, "a").await;
    create(&pods, pod("b", template.clone())).await;
    let b = running(&pods, "b").await;

    let mut cu_sets = Vec::new();
    let mut devices = Vec::new();
    for p in [&a, &b] {
        let c = claim_of(&claims, p).await;
        // generated from the template, owned by the pod, reserved for it, allocated on node-a
        assert!(
            c.name_any().starts_with(&format!("{}-gpu-", p.name_any())),
            "{}",
            c.name_any()
        );
        let owner = &c.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Pod", p.uid().unwrap().as_str(), Some(true))
        );
        let st = c.status.clone().unwrap();
        assert_eq!(st.reserved_for.as_ref().unwrap()[0].uid, p.uid().unwrap());
        let alloc = st.allocation.as_ref().unwrap();
        let sel = serde_json::to_value(alloc.node_selector.as_ref().unwrap()).unwrap();
        assert_eq!(
            sel["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            "node-a"
        );
        let r = &alloc.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
        assert_eq!(
            r.consumed_capacity.as_ref().unwrap()["computeUnits"].0,
            "40"
        );
        assert_eq!(r.consumed_capacity.as_ref().unwrap()["memory"].0, "16Gi");
        devices.push(r.device.clone());

        // the container got the prepared device's CDI edits
        let rec = record(p);
        let entry = &rec["main"][0];
        assert_eq!(entry["claim"], c.name_any(), "{rec}");
        let env = &entry["envs"];
        assert_eq!(env["HIP_DEVICE_MEMORY_LIMIT_0"], "16384m", "{env}");
        assert!(
            env["ROCR_VISIBLE_DEVICES"]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "{env}"
        );
        let mask = env["HSA_CU_MASK"].as_str().unwrap();
        let ranges = mask.strip_prefix("0:").expect("one device: 0:<ranges>");
        let set = CuSet::parse(ranges, 104).unwrap();
        assert_eq!(set.len(), 40, "{mask}");
        let dev_paths: Vec<&str> = entry["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["containerPath"].as_str().unwrap())
            .collect();
        assert!(dev_paths.contains(&"/dev/kfd"), "{dev_paths:?}");
        assert!(
            dev_paths.iter().any(|p| p.starts_with("/dev/dri/renderD")),
            "{dev_paths:?}"
        );
        assert!(
            entry["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["containerPath"] == "/usr/local/vgpu/libamvgpu.so"
                    && m["readOnly"] == true),
            "{entry}"
        );
        cu_sets.push(set);
    }
    assert_eq!(devices[0], devices[1], "first fit packs both on one GPU");
    assert!(!cu_sets[0].overlaps(&cu_sets[1]), "{cu_sets:?}");
    assert_eq!(cdi_files(&dir).len(), 2);

    // A third 40-CU claim pinned to that GPU does not fit (40 + 40 + 40 > 104 CUs).
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let slice = slice_api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let dev = slice
        .spec
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .find(|d| d.name == devices[0])
        .unwrap();
    let uuid = dev.attributes.as_ref().unwrap()["uuid"]
        .string
        .clone()
        .unwrap();
    create(&claims, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "40"}}}}]}}}))
    .await;
    create(
        &pods,
        pod("c", json!({"name": "gpu", "resourceClaimName": "pinned"})),
    )
    .await;
    let reason = wait("pod c unschedulable", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("c").await.ok()?;
            let cond = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (cond.status == "False").then_some((cond.reason, cond.message))
        }
    })
    .await;
    assert_eq!(reason.0.as_deref(), Some("Unschedulable"));
    let message = reason.1.unwrap();
    assert!(
        message.starts_with("0/1 nodes are available: 1 cannot allocate claim \"pinned\""),
        "{message}"
    );
    assert!(
        pods.get("c")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );

    // Deleting a: kubelet unprepares (its CDI spec goes), the claim is freed and deleted,
    // and c fits now.
    let claim_a = claim_of(&claims, &a).await.name_any();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let c = running(&pods, "c").await;
    let pinned = claims.get("pinned").await.unwrap();
    let r = &pinned
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert_eq!(r.device, devices[0]);
    wait("a's claim deleted", || {
        let claims = claims.clone();
        let name = claim_a.clone();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    let c_mask = record(&c)["main"][0]["envs"]["HSA_CU_MASK"]
        .as_str()
        .unwrap()
        .to_owned();
    let c_set = CuSet::parse(c_mask.strip_prefix("0:").unwrap(), 104).unwrap();
    assert!(!c_set.overlaps(&cu_sets[1]), "c and b disjoint: {c_mask}");
    assert_eq!(cdi_files(&dir).len(), 2, "a's spec removed, c's written");

    // kubelet-sim goes away; b is deleted meanwhile; the next kubelet-sim unprepares b's
    // claim from its checkpoint.
    let claim_b = claim_of(&claims, &b).await;
    let claim_b_uid = claim_b.uid().unwrap();
    kubelet.shutdown().await;
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert!(driver.checkpoint().await.claims.contains_key(&claim_b_uid));
    let kubelet = KubeletSim::start_with_dra(kubelet_args(&dir), client.clone(), dra_config(&dir))
        .await
        .unwrap();
    wait("b's claim unprepared after the restart", || {
        let driver = driver.clone();
        let uid = claim_b_uid.clone();
        async move { (!driver.checkpoint().await.claims.contains_key(&uid)).then_some(()) }
    })
    .await;
    assert_eq!(cdi_files(&dir).len(), 1, "only c's spec is left");

    // The driver restarts (a new process: what it holds is its checkpoint on disk);
    // kubelet-sim registers its new socket, and a new pod on that GPU gets CUs apart from
    // c's, which the reloaded checkpoint still holds.
    let _ = stop_plugin.send(());
    tokio::time::timeout(TIMEOUT, plugin)
        .await
        .unwrap()
        .unwrap();
    let (_driver, stop_plugin, plugin) = start_plugin(&client, &dir, &gpus).await;
    wait("b's claim freed and deleted", || {
        let claims = claims.clone();
        let name = claim_b.name_any();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    create(&pods, pod("d", template.clone())).await;
    let d = running(&pods, "d").await;
    let d_claim = claim_of(&claims, &d).await;
    let d_result = &d_claim
        .clone()
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert_eq!(d_result.device, devices[0], "first fit: the GPU c is on");
    let d_mask = record(&d)["main"][0]["envs"]["HSA_CU_MASK"]
        .as_str()
        .unwrap()
        .to_owned();
    let d_set = CuSet::parse(d_mask.strip_prefix("0:").unwrap(), 104).unwrap();
    assert!(!d_set.overlaps(&c_set), "d {d_mask} and c {c_mask}");

    // d is deleted with no other pod scheduled in between: its capacity comes back too
    // (64 CUs on that GPU fit only without d's 40).
    pods.delete("d", &DeleteParams::default()).await.unwrap();
    wait("d's claim freed and deleted", || {
        let claims = claims.clone();
        let name = d_claim.name_any();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    create(&claims, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pinned-64", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "64"}}}}]}}}))
    .await;
    create(
        &pods,
        pod(
            "e",
            json!({"name": "gpu", "resourceClaimName": "pinned-64"}),
        ),
    )
    .await;
    running(&pods, "e").await;

    kubelet.shutdown().await;
    scheduler.abort();
    let _ = stop_plugin.send(());
    tokio::time::timeout(TIMEOUT, plugin)
        .await
        .unwrap()
        .unwrap();
}

/// A plain-count pod: container `main` with `amd.com/gpu: <n>` in its limits, labelled so
/// the HAMi webhook leaves it alone, with no claims.
fn count_pod(name: &str, n: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
            "labels": {"hami.io/webhook": "ignore"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "rocm",
                "resources": {"limits": {"amd.com/gpu": n.to_string()}}}],
        },
    })
}

/// The pod's extended-resource claim (KEP-5004), from its status.
async fn extended_claim_of(claims: &Api<ResourceClaim>, pod: &Pod) -> ResourceClaim {
    let st = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .expect("extendedResourceClaimStatus");
    claims.get(&st.resource_claim_name).await.unwrap()
}

async fn gone(claims: &Api<ResourceClaim>, name: &str) {
    wait(&format!("claim {name} deleted"), || {
        let claims = claims.clone();
        let name = name.to_owned();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_gpu_counts_get_whole_gpus_through_the_extended_resource_class() {
    let DraNode {
        _server,
        client,
        tree: _tree,
        dir,
        kubelet,
        gpus: _,
        driver: _driver,
        stop_plugin,
        plugin,
        scheduler,
    } = dra_node().await;
    // The chart's class (crates/manifests device_class with extendedResourceName on).
    let class_api: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    create(
        &class_api,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "amdgpu.hami-rs.io"},
        "spec": {"extendedResourceName": "amd.com/gpu",
            "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let slice = slice_api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let slice_devices = slice.spec.devices.clone().unwrap();

    // amd.com/gpu: 1 → the scheduler's claim, one whole MI210.
    create(&pods, count_pod("whole", 1)).await;
    let whole = running(&pods, "whole").await;
    let st = whole
        .status
        .as_ref()
        .unwrap()
        .extended_resource_claim_status
        .clone()
        .unwrap();
    assert_eq!(st.request_mappings.len(), 1);
    let m = &st.request_mappings[0];
    assert_eq!(
        (
            m.container_name.as_str(),
            m.resource_name.as_str(),
            m.request_name.as_str()
        ),
        ("main", "amd.com/gpu", "container-0-request-0")
    );
    let c = extended_claim_of(&claims, &whole).await;
    assert!(
        c.name_any().starts_with("whole-extended-resources-"),
        "{}",
        c.name_any()
    );
    assert_eq!(
        c.annotations()["resource.kubernetes.io/extended-resource-claim"],
        "true"
    );
    let owner = &c.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Pod", whole.uid().unwrap().as_str(), Some(true))
    );
    let req = &c.spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
    assert_eq!(req.name, "container-0-request-0");
    let exactly = req.exactly.as_ref().unwrap();
    assert_eq!(
        (exactly.device_class_name.as_str(), exactly.count),
        ("amdgpu.hami-rs.io", Some(1))
    );
    let status = c.status.clone().unwrap();
    assert_eq!(
        status.reserved_for.as_ref().unwrap()[0].uid,
        whole.uid().unwrap()
    );
    let results = status.allocation.unwrap().devices.unwrap().results.unwrap();
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!(r.request, "container-0-request-0");
    let dev = slice_devices.iter().find(|d| d.name == r.device).unwrap();
    let cap = dev.capacity.as_ref().unwrap();
    let used = r.consumed_capacity.as_ref().unwrap();
    // The whole device: its full memory and CUs (the request policies' defaults), one share.
    assert_eq!(used["memory"], cap["memory"].value, "{used:?}");
    assert_eq!(used["computeUnits"], cap["computeUnits"].value, "{used:?}");
    assert_eq!(used["shares"].0, "1", "{used:?}");
    // kubelet gave the container the request's CDI devices through the mapping: the GPU
    // whole, so no hook, no CU mask and no memory limit (the device plugin's whole-GPU env).
    let rec = record(&whole);
    let entry = &rec["main"][0];
    assert_eq!(entry["claim"], c.name_any(), "{rec}");
    assert_eq!(entry["request"], "container-0-request-0", "{rec}");
    let env = entry["envs"].as_object().unwrap();
    let uuid = dev.attributes.as_ref().unwrap()["uuid"]
        .string
        .clone()
        .unwrap();
    assert!(
        env["ROCR_VISIBLE_DEVICES"]
            .as_str()
            .is_some_and(|v| !v.is_empty() && !v.contains(',')),
        "{env:?}"
    );
    for absent in ["HSA_CU_MASK", "HIP_DEVICE_MEMORY_LIMIT_0", "LD_AUDIT"] {
        assert!(!env.contains_key(absent), "{absent} in {env:?}");
    }
    let dev_paths: Vec<&str> = entry["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["containerPath"].as_str().unwrap())
        .collect();
    assert!(dev_paths.contains(&"/dev/kfd"), "{dev_paths:?}");
    assert_eq!(
        dev_paths
            .iter()
            .filter(|p| p.starts_with("/dev/dri/renderD"))
            .count(),
        1,
        "{dev_paths:?}"
    );
    assert!(
        entry["mounts"].as_array().unwrap().is_empty(),
        "no hook mount for a whole GPU: {entry}"
    );

    // A slice pinned to that GPU cannot land on it while the pod holds it whole.
    create(&claims, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "slice-on-it", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu.hami-rs.io", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")}}],
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "8"}}}}]}}}))
    .await;
    create(
        &pods,
        pod(
            "slice",
            json!({"name": "gpu", "resourceClaimName": "slice-on-it"}),
        ),
    )
    .await;
    let message = wait("the slice pod unschedulable", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("slice").await.ok()?;
            let cond = p
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (cond.status == "False").then_some(cond.message)
        }
    })
    .await
    .unwrap();
    assert!(
        message.starts_with("0/1 nodes are available: 1 cannot allocate claim \"slice-on-it\""),
        "{message}"
    );

    // Deleting the pod: kubelet unprepares, the claim is freed and deleted, the GPU is free
    // again and the slice runs on it.
    let whole_claim = c.name_any();
    pods.delete("whole", &DeleteParams::default())
        .await
        .unwrap();
    gone(&claims, &whole_claim).await;
    let slice_pod = running(&pods, "slice").await;
    let sr = &claims
        .get("slice-on-it")
        .await
        .unwrap()
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert_eq!(sr.device, r.device);
    assert!(record(&slice_pod)["main"][0]["envs"]["HSA_CU_MASK"].is_string());

    // amd.com/gpu: 2 → one request of count 2, two distinct whole GPUs, both in the
    // container's CDI devices; not the one the slice holds.
    create(&pods, count_pod("two", 2)).await;
    let two = running(&pods, "two").await;
    let c2 = extended_claim_of(&claims, &two).await;
    let req = &c2.spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
    assert_eq!(req.exactly.as_ref().unwrap().count, Some(2));
    let results = c2
        .status
        .clone()
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    assert_eq!(results.len(), 2);
    assert_ne!(results[0].device, results[1].device);
    assert!(results.iter().all(|x| x.device != r.device), "{results:?}");
    let rec = record(&two);
    let env = &rec["main"][0]["envs"];
    assert_eq!(
        env["ROCR_VISIBLE_DEVICES"]
            .as_str()
            .unwrap()
            .split(',')
            .count(),
        2,
        "{env}"
    );
    assert!(env.get("HSA_CU_MASK").is_none(), "{env}");
    assert_eq!(cdi_files(&dir).len(), 2, "the slice's and two's specs");
    pods.delete("two", &DeleteParams::default()).await.unwrap();
    gone(&claims, &c2.name_any()).await;
    // kubelet unprepared it: only the slice's CDI spec is left.
    wait("two's CDI spec removed", || {
        let n = cdi_files(&dir).len();
        async move { (n == 1).then_some(()) }
    })
    .await;

    kubelet.shutdown().await;
    scheduler.abort();
    let _ = stop_plugin.send(());
    tokio::time::timeout(TIMEOUT, plugin)
        .await
        .unwrap()
        .unwrap();
}
