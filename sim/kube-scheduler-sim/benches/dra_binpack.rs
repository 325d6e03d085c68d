//! DRA pods/s end to end on the embedded API server (issue 20 "Performance"; run:
//! `cargo bench -p hami-kube-scheduler-sim --bench dra_binpack -- [binpack|spread|byname] [pods] [in flight]`).
//!
//! 1,000 Nodes, each with one ResourceSlice of 8 MI300X-sized shared devices (192Gi,
//! 304 CUs, 10 shares, request policies as the driver publishes them), a DeviceClass and a
//! ResourceClaimTemplate asking 8Gi and 76 CUs. Pods are created through the API (64 in
//! flight by default); the simulated kube-scheduler's DRA path creates each pod's claim from
//! the template, records it in the pod's status, allocates it (binpack: most allocated node
//! first), writes the claim's allocation and reservation and binds the pod. A pod counts
//! when a watch shows it bound. No node lock exists in this path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hami_apiserver::{ApiServer, Config};
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kube_scheduler_sim::dra::DraOptions;
use hami_kube_scheduler_sim::dra_placement::NodeOrder;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NODES: usize = 1000;
const DRIVER: &str = hami_dra_core::DRIVER;

fn slice(node: &str) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "allowMultipleAllocations": true,
                "attributes": {"uuid": {"string": format!("{node}-gpu-{i}")}},
                "capacity": {
                    "memory": {"value": "192Gi", "requestPolicy": {"default": "192Gi",
                        "validRange": {"min": "1Mi", "max": "192Gi", "step": "1Mi"}}},
                    "computeUnits": {"value": "304", "requestPolicy": {"default": "304",
                        "validRange": {"min": "1", "max": "304", "step": "1"}}},
                    "shares": {"value": "10", "requestPolicy": {"default": "1",
                        "validRange": {"min": "1", "max": "10", "step": "1"}}},
                }
            })
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}")},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}})
}

async fn create<K>(api: &Api<K>, v: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

async fn run(order: NodeOrder, pods: usize, in_flight: usize) {
    let server = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    futures::stream::iter(0..NODES)
        .for_each_concurrent(32, |i| {
            let (node_api, slice_api) = (node_api.clone(), slice_api.clone());
            async move {
                let name = format!("node-{i:04}");
                create(
                    &node_api,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
                )
                .await;
                create(&slice_api, slice(&name)).await;
            }
        })
        .await;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    create(&classes, json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "amdgpu-slice"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}))
    .await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), "default");
    create(
        &templates,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "slice", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "amdgpu-slice", "count": 1,
            "capacity": {"requests": {"memory": "8Gi", "computeUnits": "76"}}}}]}}}}),
    )
    .await;

    // Bound pods, as a watch shows them, release their creator's slot.
    let waiting: Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<()>>>> = Arc::default();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let w = waiting.clone();
    tokio::spawn(
        watcher(pod_api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .for_each(move |p| {
                if let Ok(p) = p
                    && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
                    && let Some(tx) = w.lock().unwrap().remove(&p.name_any())
                {
                    let _ = tx.send(());
                }
                async {}
            }),
    );
    tokio::spawn(
        SimKubeScheduler::dra_only(
            client.clone(),
            "default-scheduler",
            DraOptions { node_order: order },
        )
        .run(),
    );
    // The scheduler's informers list 1,000 slices first.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    futures::stream::iter(0..pods)
        .for_each_concurrent(in_flight, |i| {
            let (pod_api, waiting) = (pod_api.clone(), waiting.clone());
            async move {
                let name = format!("p{i}");
                let (tx, rx) = tokio::sync::oneshot::channel();
                waiting.lock().unwrap().insert(name.clone(), tx);
                create(&pod_api, json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"schedulerName": "default-scheduler",
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice"}],
                        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}}))
                .await;
                tokio::time::timeout(Duration::from_secs(120), rx)
                    .await
                    .expect("pod bound within 120 s")
                    .unwrap();
            }
        })
        .await;
    let elapsed = started.elapsed();
    // Binpack check: 4 pods of 76 CUs per 304-CU GPU, 32 per node.
    let bound = pod_api.list(&Default::default()).await.unwrap();
    let mut per_node: HashMap<String, usize> = HashMap::new();
    for p in &bound.items {
        *per_node
            .entry(p.spec.as_ref().unwrap().node_name.clone().unwrap())
            .or_default() += 1;
    }
    // Never over-committed: per device, the claims' consumed CUs within its 304.
    let claim_api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let mut cus: HashMap<(String, String), u64> = HashMap::new();
    let mut claim_node: HashMap<String, String> = HashMap::new();
    for c in claim_api.list(&Default::default()).await.unwrap().items {
        let alloc = c
            .status
            .and_then(|s| s.allocation)
            .expect("every claim allocated");
        for r in alloc.devices.and_then(|d| d.results).unwrap_or_default() {
            let n: u64 = r.consumed_capacity.unwrap()["computeUnits"]
                .0
                .parse()
                .unwrap();
            *cus.entry((r.pool.clone(), r.device.clone())).or_default() += n;
            let owner = &c.metadata.owner_references.as_ref().unwrap()[0].name;
            claim_node.insert(owner.clone(), r.pool.clone());
        }
    }
    let most = cus.values().max().copied().unwrap_or(0);
    assert!(most <= 304, "a device holds {most} of 304 CUs");
    for p in &bound.items {
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_ref(),
            claim_node.get(&p.name_any()),
            "pod {} bound where its claim is not",
            p.name_any()
        );
    }
    println!(
        "DRA end to end, {order:?}: {pods} pods ({in_flight} in flight) on {NODES} nodes × 8 GPUs bound in {:.2} s = {:.0} pods/s; {} nodes used, at most {} pods on one, at most {most} CUs on one GPU",
        elapsed.as_secs_f64(),
        pods as f64 / elapsed.as_secs_f64(),
        per_node.len(),
        per_node.values().max().unwrap_or(&0),
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let order = match args.first().map(String::as_str) {
        None | Some("binpack") => NodeOrder::MostAllocated,
        Some("spread") => NodeOrder::LeastAllocated,
        Some("byname") => NodeOrder::ByName,
        Some(other) => panic!("unknown order {other:?}: binpack, spread or byname"),
    };
    let pods = args
        .get(1)
        .map_or(1000, |p| p.parse().expect("pods: a number"));
    let in_flight = args
        .get(2)
        .map_or(64, |p| p.parse().expect("in flight: a number"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(order, pods, in_flight));
}
