//! Allocate latency on the embedded API server: the kubelet's gRPC Allocate on the plugin's
//! unix socket, for pods whose decision the scheduler wrote (device list, bind phase, node
//! lock). Each call reads the node and the node's pods, plans, patches the pod and releases
//! the lock. Run: `cargo bench -p hami-amd-plugin --bench allocate_latency`.

use std::time::{Duration, Instant};

use clap::Parser;
use hami_amd_plugin::cli::Args;
use hami_deviceplugin_api::connect_unix;
use hami_deviceplugin_api::v1beta1::device_plugin_client::DevicePluginClient;
use hami_deviceplugin_api::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use hami_protocol::device_list::{ContainerDevice, encode_pod_devices};
use hami_protocol::names::{AMD, node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::{NodeLock, PodRef};
use serde_json::json;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let pods: usize = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(240);
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    server
        .create_object(
            "v1",
            "nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        )
        .unwrap();
    let tree = hami_sysfs_fixtures::mi300x_cpx().unwrap();
    // Slices of CPX partitions: the opt-in (partitions are whole devices by default).
    let devices = hami_amd_plugin::discover_report::build_report(
        &tree.sysfs_root(),
        &tree.dev_root(),
        &hami_amd_plugin::registration::RegistrationSettings {
            slice_partitions: true,
            ..Default::default()
        },
    )
    .unwrap()
    .registration
    .devices;
    let sockets = tree.sysfs_root().parent().unwrap().join("device-plugins");
    let mut args = Args::parse_from(["k8s-device-plugin"]);
    args.sysfs_root = tree.sysfs_root();
    args.dev_root = tree.dev_root();
    args.device_plugin_dir = sockets.clone();
    args.node_name = Some("n1".into());
    args.cgroup_root = tree.sysfs_root().join("fs/cgroup");
    args.slice_partitions = true;
    let settings = args.registration_settings().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let plugin = tokio::spawn(hami_amd_plugin::plugin::serve(
        args,
        settings,
        client.clone(),
        rx,
    ));
    let socket = sockets.join(hami_amd_plugin::plugin::ENDPOINT);
    while !socket.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut grpc = DevicePluginClient::new(connect_unix(&socket).await.unwrap());
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let mut samples = Vec::with_capacity(pods);
    for i in 0..pods {
        let d = &devices[i % devices.len()];
        let list = encode_pod_devices(&[vec![ContainerDevice {
            uuid: d.info.id.clone(),
            device_type: d.info.device_type.clone(),
            mem_mib: 1024,
            cores: 9,
        }]])
        .unwrap();
        let name = format!("p{i}");
        server
            .create_object(
                "v1",
                "pods",
                Some("default"),
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "annotations": {AMD.devices_to_allocate: list, AMD.devices_allocated: list,
                        pod_keys::BIND_PHASE: "allocating", pod_keys::VGPU_NODE: "n1"}},
                    "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
                    "status": {"phase": "Pending"}}),
            )
            .unwrap();
        let lock = NodeLock::new(1_700_000_000, PodRef::new("default", &name))
            .encode()
            .unwrap();
        nodes
            .patch(
                "n1",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: lock}}}),
                ),
            )
            .await
            .unwrap();
        let start = Instant::now();
        let resp = grpc
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![format!("{}#0", d.device_key)],
                }],
            })
            .await
            .unwrap()
            .into_inner();
        samples.push(start.elapsed());
        assert!(resp.container_responses[0].envs.contains_key("HSA_CU_MASK"));
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "allocate_latency: {} Allocate calls (pods on the node grow 1..{}), p50 {:?}, p99 {:?}, max {:?}",
        samples.len(),
        pods,
        pct(0.50),
        pct(0.99),
        samples[samples.len() - 1]
    );
    stop.send(true).unwrap();
    let _ = plugin.await;
}
