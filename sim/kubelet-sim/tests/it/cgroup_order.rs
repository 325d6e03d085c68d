//! When a DRA driver meets the pod cgroup, in kubelet's order (`Kubelet.SyncPod` makes it with
//! `pcm.EnsureExists` before the runtime's `SyncPod` calls `PrepareDynamicResources`, and
//! `createPodSandbox` comes only after the prepare): a probe driver looks at the node's
//! cgroup tree inside every `NodePrepareResources` call. The pod cgroup (with `dmem.max`,
//! where a driver writes the pod's device-memory limit) is there from the first call, and
//! stays while a refused prepare is retried and while the claim does not exist yet; the
//! sandbox's cgroup is never there during a prepare and comes once a prepare succeeded.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hami_deviceplugin_api::dra_v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use hami_deviceplugin_api::dra_v1::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use hami_deviceplugin_api::pluginregistration::registration_server::{
    Registration, RegistrationServer,
};
use hami_deviceplugin_api::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use hami_deviceplugin_api::{DRA_PLUGIN_TYPE, DRA_V1_SERVICE, bind_unix};
use hami_kubelet_sim::cgroup_layout::{CgroupDriver, Layout, Qos, SANDBOX};
use hami_kubelet_sim::container_runtime::container_id;
use hami_kubelet_sim::dra_manager::DraConfig;
use hami_kubelet_sim::pod_cgroups::CgroupConfig;
use hami_kubelet_sim::{Args, KubeletSim, NodeConfig};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tonic::{Request, Response, Status};

const DRIVER: &str = "probe.example.com";
const TIMEOUT: Duration = Duration::from_secs(20);

/// What the probe saw of the pod's cgroups inside one NodePrepareResources call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    pod_cgroup: bool,
    dmem_max: bool,
    sandbox: bool,
}

#[derive(Default)]
struct Probe {
    /// The pod cgroup and its sandbox's, once the pod exists.
    paths: Mutex<Option<(PathBuf, PathBuf)>>,
    /// One entry per NodePrepareResources call.
    seen: Mutex<Vec<Seen>>,
    /// Calls still to refuse (the claim's error set), to have kubelet-sim retry.
    refuse: Mutex<u32>,
}

#[derive(Clone)]
struct Service(Arc<Probe>, String);

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.1.clone(),
            supported_versions: vec![DRA_V1_SERVICE.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[tonic::async_trait]
impl DraPlugin for Service {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let paths = self.0.paths.lock().unwrap().clone();
        let (pod, sandbox) = paths.ok_or_else(|| Status::internal("no pod yet"))?;
        self.0.seen.lock().unwrap().push(Seen {
            pod_cgroup: pod.is_dir(),
            dmem_max: pod.join("dmem.max").is_file(),
            sandbox: sandbox.exists(),
        });
        let error = {
            let mut refuse = self.0.refuse.lock().unwrap();
            let e = if *refuse > 0 { "not yet" } else { "" };
            *refuse = refuse.saturating_sub(1);
            e.to_owned()
        };
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let r = NodePrepareResourceResponse {
                    devices: vec![Device {
                        request_names: vec!["gpu".into()],
                        pool_name: "node-a".into(),
                        device_name: "gpu-0".into(),
                        cdi_device_ids: Vec::new(),
                    }],
                    error: error.clone(),
                };
                (c.uid, r)
            })
            .collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// Polls `check` until it holds, at most [`TIMEOUT`].
async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn serve_probe(probe: Arc<Probe>, registry: &Path) -> tokio::task::JoinHandle<()> {
    // One socket serves both: kubelet-sim dials the endpoint GetInfo names.
    let socket = registry.join("probe-reg.sock");
    let incoming = bind_unix(&socket).unwrap();
    let service = Service(probe, socket.display().to_string());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service.clone()))
            .add_service(DraPluginServer::new(service))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_prepare_meets_the_pod_cgroup_and_never_the_sandbox() {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let dir = std::env::temp_dir().join(format!("kubelet-sim-cg-order-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("cgroup");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("cgroup.controllers"), "cpu memory pids dmem\n").unwrap();
    let registry = dir.join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let probe = Arc::new(Probe {
        refuse: Mutex::new(2),
        ..Probe::default()
    });
    let probe_task = serve_probe(probe.clone(), &registry);
    let sim = KubeletSim::start_node(
        Args {
            socket_dir: dir.join("device-plugins"),
            node_name: "node-a".into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 20,
        },
        client.clone(),
        NodeConfig {
            dra: Some(DraConfig {
                registry_dir: registry.clone(),
                state_file: dir.join("dra_manager_state"),
                cdi_dirs: vec![dir.join("cdi")],
            }),
            cgroups: Some(CgroupConfig {
                root: root.clone(),
                driver: CgroupDriver::Cgroupfs,
            }),
        },
    )
    .await
    .unwrap();

    // The pod first, its claim not there yet (bound by hand: no scheduler here).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": "node-a",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
            "containers": [{"name": "main", "image": "i"}]},
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = pod.uid().unwrap();
    let layout = Layout {
        driver: CgroupDriver::Cgroupfs,
    };
    let pod_cg = root.join(layout.pod(Qos::BestEffort, &uid));
    let sandbox_cg =
        root.join(layout.container(Qos::BestEffort, &uid, &container_id(&uid, SANDBOX)));
    *probe.paths.lock().unwrap() = Some((pod_cg.clone(), sandbox_cg.clone()));

    // Admitted, its claim unreadable: the pod cgroup is made all the same, no sandbox.
    wait_until("the pod cgroup before any prepare", async || {
        pod_cg.is_dir()
    })
    .await;
    assert!(!sandbox_cg.exists());
    assert!(probe.seen.lock().unwrap().is_empty());

    // The claim, allocated to the probe and reserved for the pod.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "probe"}}]}},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    claims
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "allocation": {"devices": {"results": [{"request": "gpu",
                    "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": uid}],
            }})),
        )
        .await
        .unwrap();

    wait_until("the pod Running", async || {
        pods.get("p")
            .await
            .ok()
            .and_then(|p| p.status?.phase)
            .as_deref()
            == Some("Running")
    })
    .await;
    let seen = probe.seen.lock().unwrap().clone();
    // Two refused prepares, then the one that succeeded.
    assert_eq!(seen.len(), 3, "{seen:?}");
    for s in &seen {
        assert_eq!(
            *s,
            Seen {
                pod_cgroup: true,
                dmem_max: true,
                sandbox: false,
            },
            "what each prepare met: {seen:?}"
        );
    }
    assert!(
        sandbox_cg.is_dir(),
        "the sandbox once the claim is prepared"
    );

    // Gone: its claim unprepared, its cgroups removed.
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    wait_until("the pod cgroup removed", async || !pod_cg.exists()).await;
    sim.shutdown().await;
    probe_task.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
