//! The whole NVIDIA path on the embedded API server: pods created through the API go
//! through the HAMi webhook and the simulated kube-scheduler to the scheduler's filter and
//! bind (real `hami-scheduler` over TLS), then the simulated kubelet calls the real
//! `nvidia-device-plugin` process (stand-in NVML), which allocates and releases the lock.

use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_kube_scheduler_sim::front::{SchedulerFront, client_as, component_user};
use hami_plugin_harness::{api_with_node, env_of, spawn_nvidia_plugin_as, start_kubelet};
use hami_protocol::names::{NVIDIA, node as node_keys, pod as pod_keys};
use hami_protocol::node_register::decode_node_devices;
use hami_scheduler::config::Settings;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const NODE: &str = "gpu-node";

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_plugin_and_kubelet_place_and_start_nvidia_slices() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (api, client) = api_with_node(NODE).await;
    let scratch = std::env::temp_dir().join(format!("nv-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();

    // Scheduler: extender + webhook over TLS, the webhook configuration that ships pointed
    // at this process, kube-scheduler calling the extender.
    let settings = Settings::default();
    // The scheduler and the plugin act as their ServiceAccounts: the API server admits
    // UPDATEs, and D-4 lets only them write the scheduler-owned annotations.
    let manifests = hami_manifests::Settings::default();
    let scheduler = Scheduler::start(
        client_as(
            &api.url(),
            &component_user(&manifests, hami_manifests::names::SCHEDULER),
        )
        .unwrap(),
        settings.clone(),
        Arc::new(Leadership::always()),
    );
    let front = SchedulerFront::start(
        &scheduler,
        &scratch,
        &hami_manifests::Settings::default(),
        &client,
    )
    .await
    .unwrap();
    tokio::spawn(
        front
            .kube_scheduler(client.clone(), settings.scheduler_name.clone())
            .unwrap()
            .run(),
    );

    // Node: simulated kubelet + the plugin process over the stand-in NVML (2 GPUs).
    let sockets = scratch.join("device-plugins");
    std::fs::create_dir_all(&sockets).unwrap();
    let sim = start_kubelet(sockets.clone(), NODE, client.clone()).await;
    let plugin_user = component_user(&manifests, hami_manifests::names::NVIDIA_DEVICE_PLUGIN);
    let _plugin = KillOnDrop(spawn_nvidia_plugin_as(
        env!("CARGO_BIN_EXE_nvidia-device-plugin"),
        &api,
        NODE,
        &scratch,
        2,
        Some(&plugin_user),
    ));
    assert!(
        sim.wait_for_allocatable("nvidia.com/gpu", 20, Duration::from_secs(30))
            .await,
        "plugin log:\n{}",
        std::fs::read_to_string(scratch.join("plugin.log")).unwrap_or_default()
    );
    let node = api.get_object("v1", "nodes", "", NODE).unwrap();
    let gpus = decode_node_devices(
        node["metadata"]["annotations"][NVIDIA.node_register]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = {
            let state = scheduler.state();
            state.nodes().next().is_some()
        };
        if seen && scheduler.ready() {
            break;
        }
        assert!(Instant::now() < deadline, "scheduler never saw the node");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Two 30 % / 2 GiB slices and one whole-card-memory container; the pods carry no
    // scheduler name: the webhook routes them to HAMi.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["s1", "s2"] {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "30"}}}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for name in ["s1", "s2"] {
        let pod = wait_running(&api, name).await;
        let env = env_of(&pod, "cuda");
        assert_eq!(env["CUDA_DEVICE_MEMORY_LIMIT_0"], "2048m", "{name}");
        assert_eq!(env["CUDA_DEVICE_SM_LIMIT"], "30", "{name}");
        let visible = env["NVIDIA_VISIBLE_DEVICES"].as_str().unwrap();
        assert!(gpus.iter().any(|g| g.id == visible), "{visible}");
        assert_eq!(
            pod["metadata"]["annotations"][pod_keys::BIND_PHASE],
            "success"
        );
        assert_eq!(
            pod["metadata"]["annotations"][NVIDIA.devices_to_allocate],
            ";"
        );
    }
    assert!(
        node_annotation(&api, node_keys::MUTEX_LOCK).is_none(),
        "the plugin released the lock"
    );
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&scratch);
}

fn node_annotation(api: &hami_apiserver::RunningApiServer, key: &str) -> Option<String> {
    api.get_object("v1", "nodes", "", NODE).unwrap()["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

async fn wait_running(api: &hami_apiserver::RunningApiServer, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod = api.get_object("v1", "pods", "default", name).unwrap();
        match pod["status"]["phase"].as_str() {
            Some("Running") => return pod,
            Some("Failed") => panic!("pod {name} failed: {pod}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "pod {name} never ran: {pod}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
