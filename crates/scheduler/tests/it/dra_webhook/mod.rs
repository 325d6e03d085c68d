//! The webhook's DRA mode end to end on the embedded API server: pods written with HAMi's
//! AMD API go through the shipped webhook configuration (over HTTPS), which creates the
//! content-addressed ResourceClaimTemplates and patches the pods; the simulated
//! kube-scheduler's claim controller makes the claims and its DynamicResources plugin
//! allocates them (dra-core's allocator) on the DRA nodes' ResourceSlices, which have the
//! shape the AMD DRA driver publishes for the MI210 capture (64 GiB, 104 CUs, 10 shares).
//!
//! Here the shared setup; [`claims`]: what admission writes and DRA allocates (bad input
//! included, and more device types than a claim lists); [`templates`]: the templates' life
//! (shapes tried smallest first, stamps, the sweep); [`quota`]: namespace quotas charged
//! from the claims (D-29); [`charge_guard`]: no tenant changes that charge (D-33).

mod charge_guard;
mod claims;
mod preemption;
mod quota;
mod templates;

use crate::common;

use std::time::Duration;

use hami_kube_scheduler_sim::dra::DraOptions;
use hami_protocol::dra::{DRIVER, LAST_USED_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK};
use hami_protocol::requests::{RequestDefaults, pod_requests};
use hami_scheduler::config::Settings;
use hami_scheduler::dra_claims::{pod_claims, shapes};
use hami_scheduler::dra_sweep::SweepTuning;
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use common::{Front as Cluster, wait};

/// One device as the AMD DRA driver's `hami_dra_core::slice::device` publishes it.
fn device(index: usize, product: &str, memory: &str, cus: u64, numa: i64) -> Value {
    json!({
        "name": format!("gpu-{index}"),
        "allowMultipleAllocations": true,
        "attributes": {
            "type": {"string": "amdgpu-slice"},
            "uuid": {"string": format!("{product}-uuid-{index}").replace(' ', "-")},
            "productName": {"string": product},
            "gfxVersion": {"version": "9.0.10"},
            "wgpMode": {"bool": false},
            "partitionIndex": {"int": 0},
            "xgmiHive": {"string": "0000:03:00.0"},
            "xgmiPeers": {"int": 3},
            "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", 3 + index)},
            "resource.kubernetes.io/numaNode": {"int": numa},
        },
        "capacity": {
            "memory": {"value": memory, "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}},
            "computeUnits": {"value": cus.to_string(), "requestPolicy": {"default": cus.to_string(), "validRange": {"min": "1", "max": cus.to_string(), "step": "1"}}},
            "shares": {"value": "10", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "10", "step": "1"}}},
        }
    })
}

async fn dra_node(client: &Client, node: &str, devices: Vec<Value>) {
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"hami.io/amd-mode": "dra"}},
    }))
    .unwrap();
    let created = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-amdgpu-hami-rs-io-0"), "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": created.metadata.uid, "controller": true}]},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap();
    Api::<ResourceSlice>::all(client.clone())
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

async fn start(settings: Settings) -> Cluster {
    let (api, client) = common::tls_api().await;
    // The chart's DeviceClass (draPlugin on).
    let mut manifests = hami_manifests::Settings::default();
    manifests.values.dra_plugin.enabled = true;
    let hami_manifests::Object::DeviceClass(class) =
        hami_manifests::objects::device_class(&manifests)
    else {
        panic!("the chart's DeviceClass is not a DeviceClass")
    };
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    common::start_front((api, client), &settings, "hami-dra-webhook", |sim| {
        sim.with_dra(DraOptions::default())
    })
    .await
}

fn amd_pod(name: &str, annotations: Value, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "rocm/pytorch", "resources": {"limits": limits}}]}
    }))
    .unwrap()
}

fn dra() -> Value {
    json!({"hami.io/amd-mode": "dra"})
}

fn slice_limits() -> Value {
    json!({"amd.com/gpu": "1", "amd.com/gpucores": "25", "amd.com/gpumem": "4096"})
}

async fn create(c: &Cluster, pod: &Pod) -> Result<Pod, String> {
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), pod)
        .await
        .map_err(|e| e.to_string())
}

async fn templates(c: &Cluster) -> Vec<ResourceClaimTemplate> {
    Api::<ResourceClaimTemplate>::namespaced(c.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// The pod once bound, and its (allocated) claim.
async fn bound(c: &Cluster, name: &str) -> (Pod, ResourceClaim) {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), "default");
    wait(&format!("{name} is bound"), || async {
        let p = pods.get(name).await.unwrap();
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
    })
    .await;
    let pod = pods.get(name).await.unwrap();
    let claim_name = pod
        .status
        .as_ref()
        .unwrap()
        .resource_claim_statuses
        .as_ref()
        .unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let claim = claims.get(&claim_name).await.unwrap();
    (pod, claim)
}

/// (request, device, consumedCapacity) of each allocation result.
fn results(claim: &ResourceClaim) -> Vec<(String, String, Value)> {
    let allocation = claim.status.as_ref().unwrap().allocation.as_ref().unwrap();
    allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .iter()
        .flatten()
        .map(|r| {
            (
                r.request.clone(),
                format!("{}/{}", r.pool, r.device),
                serde_json::to_value(&r.consumed_capacity).unwrap(),
            )
        })
        .collect()
}

fn container_json(pod: &Pod) -> Value {
    serde_json::to_value(&pod.spec.as_ref().unwrap().containers[0]).unwrap()
}

fn limits_of(pod: &Pod) -> Value {
    container_json(pod)["resources"]["limits"].clone()
}
