//! What the scheduler's API-server tests set up the same way: the embedded API server and a
//! client, a node whose AMD plugin registered one MI210 (10 slices), a one-slice GPU pod, a
//! scheduler that is always leader, and filter's arguments for one node.
#![allow(dead_code)] // each test binary uses its own part

use std::sync::Arc;

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderArgs;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The AMD plugin's register annotation for one MI210 split 10 ways.
pub const AMD_REGISTER: &str = r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#;

/// The embedded API server (no authentication) and an anonymous client of it.
pub async fn api() -> (RunningApiServer, Client) {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    (api, client)
}

/// Creates the Node `n` from `metadata` (its `name` set here) and `status` (none if null).
pub async fn create_node(client: &Client, mut metadata: Value, status: Value) -> Node {
    metadata["name"] = json!("n");
    let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata});
    if !status.is_null() {
        node["status"] = status;
    }
    let node: Node = serde_json::from_value(node).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
}

/// The API server with node `n`: registered by the AMD plugin ([`AMD_REGISTER`]) and with
/// kubelet reporting its 10 `amd.com/gpu`.
pub async fn cluster() -> (RunningApiServer, Client) {
    let (api, client) = api().await;
    create_node(
        &client,
        json!({"annotations": {"hami.io/node-amd-register": AMD_REGISTER}}),
        json!({"capacity": {"amd.com/gpu": "10"}, "allocatable": {"amd.com/gpu": "10"}}),
    )
    .await;
    (api, client)
}

/// What kubelet reports for node `n`: `count` of `amd.com/gpu` as capacity and allocatable
/// (0 once the vendor's device plugin is gone).
pub async fn kubelet_reports(client: &Client, count: &str) {
    let caps = json!({"amd.com/gpu": count});
    Api::<Node>::all(client.clone())
        .patch_status(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": caps, "allocatable": caps}})),
        )
        .await
        .unwrap();
}

/// Creates the pod `default/<name>` asking hami-scheduler for one AMD slice of 100 MiB.
pub async fn create_gpu_pod(client: &Client, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// A scheduler with the default settings that is always the leader.
pub fn start_scheduler(client: &Client) -> Arc<Scheduler> {
    Scheduler::start(
        client.clone(),
        Settings::default(),
        Arc::new(Leadership::always()),
    )
}

/// Filter's arguments for `pod` on node `n` alone.
pub fn filter_args(pod: &Pod) -> ExtenderArgs {
    serde_json::from_value(json!({"pod": pod, "nodenames": ["n"]})).unwrap()
}
