//! What the scheduler's API-server tests set up the same way: the embedded API server and a
//! client, a node whose AMD plugin registered one MI210 (10 slices), a one-slice GPU pod, a
//! scheduler that is always leader, and filter's arguments for one node; for the end-to-end
//! tests, the scheduler in front of the API server as it is installed ([`start_front`]) and a
//! bounded [`wait`].
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config, RunningApiServer};
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_kube_scheduler_sim::front::{SchedulerFront, client_as, component_user};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderArgs;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The AMD plugin's register annotation for one MI210 split 10 ways.
pub(crate) const AMD_REGISTER: &str = r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#;

/// The embedded API server (no authentication) and an anonymous client of it.
pub(crate) async fn api() -> (RunningApiServer, Client) {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    (api, client)
}

/// Creates the Node `n` from `metadata` (its `name` set here) and `status` (none if null).
pub(crate) async fn create_node(client: &Client, mut metadata: Value, status: Value) -> Node {
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
pub(crate) async fn cluster() -> (RunningApiServer, Client) {
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
pub(crate) async fn kubelet_reports(client: &Client, count: &str) {
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
pub(crate) async fn create_gpu_pod(client: &Client, name: &str) -> Pod {
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
pub(crate) fn start_scheduler(client: &Client) -> Arc<Scheduler> {
    Scheduler::start(
        client.clone(),
        Settings::default(),
        Arc::new(Leadership::always()),
    )
}

/// Filter's arguments for `pod` on node `n` alone.
pub(crate) fn filter_args(pod: &Pod) -> ExtenderArgs {
    serde_json::from_value(json!({"pod": pod, "nodenames": ["n"]})).unwrap()
}

/// A directory of its own under the system temp dir (the process id and the clock's
/// nanoseconds in its name), removed with what is in it when dropped.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    /// A new name starting with `prefix` (the directory is made by whoever writes there).
    pub(crate) fn new(prefix: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        TempDir(std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id())))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// [`api`] with rustls' ring provider installed first: the API server calls the webhook, and
/// the simulated kube-scheduler the extender, over HTTPS.
pub(crate) async fn tls_api() -> (RunningApiServer, Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    api().await
}

/// A client of `api` acting as the ServiceAccount `service_account` where the chart installs.
pub(crate) fn as_component(api: &RunningApiServer, service_account: &str) -> Client {
    client_as(
        &api.url(),
        &component_user(&hami_manifests::Settings::default(), service_account),
    )
    .unwrap()
}

/// The embedded API server with the scheduler in front of it, as installed.
pub(crate) struct Front {
    /// The API server.
    pub api: RunningApiServer,
    /// An anonymous (admin) client of it.
    pub client: Client,
    /// The scheduler, always leader.
    pub scheduler: Arc<Scheduler>,
    /// Where it serves over TLS, and the CA its clients trust.
    pub front: SchedulerFront,
    /// Its serving certificate and key.
    pub dir: TempDir,
}

/// Starts on `api` the scheduler with `settings`, acting as its ServiceAccount (the API
/// server admits UPDATEs, and D-4 lets only it and the plugins write the scheduler-owned
/// annotations); serves it over TLS with the shipped webhook configuration (failurePolicy
/// Fail) pointed at it, the certificate in a [`TempDir`] named from `tls_dir_prefix`; spawns
/// the simulated kube-scheduler calling its extender, as `kube_scheduler` makes it of the
/// plain one; and waits (bounded) until the scheduler has synced.
pub(crate) async fn start_front(
    (api, client): (RunningApiServer, Client),
    settings: &Settings,
    tls_dir_prefix: &str,
    kube_scheduler: impl FnOnce(SimKubeScheduler) -> SimKubeScheduler,
) -> Front {
    let dir = TempDir::new(tls_dir_prefix);
    let scheduler = Scheduler::start(
        as_component(&api, hami_manifests::names::SCHEDULER),
        settings.clone(),
        Arc::new(Leadership::always()),
    );
    let front = SchedulerFront::start(
        &scheduler,
        &dir.0,
        &hami_manifests::Settings::default(),
        &client,
    )
    .await
    .unwrap();
    tokio::spawn(
        kube_scheduler(
            front
                .kube_scheduler(client.clone(), settings.scheduler_name.clone())
                .unwrap(),
        )
        .run(),
    );
    wait("the scheduler syncs", || async { scheduler.ready() }).await;
    Front {
        api,
        client,
        scheduler,
        front,
        dir,
    }
}

/// Waits (bounded: 20 s) until `f` holds.
pub(crate) async fn wait<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
