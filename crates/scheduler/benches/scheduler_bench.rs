//! Scheduler benchmarks (run: `cargo bench -p hami-scheduler --bench scheduler_bench`).
//!
//! 1. Filter latency p50/p99 at 100, 1,000 and 5,000 nodes × 8 GPUs: the decision over
//!    the informer-fed state (heartbeat expiry, `decide_filter` inside the quota gate: what
//!    `/filter` does under its lock), and the same with the extender JSON request decoded
//!    first (what one `/filter` call costs the scheduler); at 5,000 nodes also with a
//!    ResourceQuota of HAMi's keys in force in the pod's namespace (issue 30: p99 < 5 ms),
//!    once with room and once exhausted (every node answered with the refusal).
//! 2. End-to-end pods/s through the embedded API server: the simulated kube-scheduler,
//!    `/filter` and `/bind` over HTTP, a device-plugin stand-in that releases the node
//!    lock as soon as the pod is bound; 64 pods in flight on 1,000 nodes.
//!
//! `--only filter|spread|binpack` (after `--bench`) runs one part (for `perf record`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hami_apiserver::{ApiServer, Config};
use hami_kube_scheduler_sim::SimKubeScheduler;
use hami_protocol::names::{node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::NodeLock;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode, encode_node_devices};
use hami_protocol::selection::NodePolicy;
use hami_scheduler::config::Settings;
use hami_scheduler::extender::{ExtenderArgs, FilterConfig, from_json_any_case};
use hami_scheduler::extender_client::{ExtenderClient, Trust};
use hami_scheduler::leader::Leadership;
use hami_scheduler::quota_gate::filter_within_quota;
use hami_scheduler::runtime::Scheduler;
use hami_scheduler::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

fn gpus(node: usize) -> Vec<DeviceInfo> {
    (0..8)
        .map(|g| DeviceInfo {
            id: format!("gpu-{node}-{g}"),
            index: g as u32 + 1,
            count: 10,
            devmem: 196_288,
            devcore: 304,
            device_type: "AMD Instinct MI300X".into(),
            numa: g / 4,
            mode: DeviceMode::HamiCore,
            health: true,
            device_vendor: "AMD".into(),
            custom_info: CustomInfo::default(),
        })
        .collect()
}

fn node_json(name: &str, index: usize) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {
        "hami.io/node-amd-register": encode_node_devices(&gpus(index)).unwrap()}},
        "status": {"capacity": {"amd.com/gpu": "80"}}})
}

fn pod_json(name: &str, uid: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "8192", "amd.com/gpucores": "25"}}}]}})
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Whether a ResourceQuota of HAMi's keys governs the bench pod's namespace.
#[derive(Clone, Copy, PartialEq)]
enum Quota {
    None,
    /// Room for the pod: every decision is checked and charged.
    Room,
    /// Less left than the pod asks: every decision is refused by the gate.
    Exhausted,
}

fn quota(slices: u64) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": "gpus", "namespace": "default"},
        "spec": {"hard": {"limits.amd.com/gpu": slices.to_string(),
            "limits.amd.com/gpumem": (slices * 8192).to_string(),
            "limits.amd.com/gpucores": (slices * 25).to_string()}}}))
    .unwrap()
}

fn filter_latency(nodes: usize, quota_mode: Quota) {
    let mut state = ClusterState::new();
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        state.upsert_node(&serde_json::from_value::<Node>(node_json(name, i)).unwrap());
    }
    // Half of the nodes already run two slices on their first GPU (pods of this scheduler
    // asking for GPUs: only those hold devices, D-4).
    for (i, name) in names.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        for k in 0..2 {
            let mut pod: Pod =
                serde_json::from_value(pod_json(&format!("old-{i}-{k}"), &format!("old-{i}-{k}")))
                    .unwrap();
            pod.metadata.annotations = Some(
                [
                    (pod_keys::VGPU_NODE.to_owned(), name.clone()),
                    (
                        "hami.io/amd-devices-allocated".to_owned(),
                        format!("gpu-{i}-0,AMD Instinct MI300X,8192,76:;"),
                    ),
                ]
                .into(),
            );
            state.upsert_pod(&pod);
        }
    }
    assert_eq!(
        state.pod_count(),
        nodes.div_ceil(2) * 2,
        "the old pods hold slices"
    );
    // The old pods hold `nodes` slices in the namespace.
    match quota_mode {
        Quota::None => {}
        Quota::Room => state.quota.apply_quota(&quota(nodes as u64 + 1_000)),
        Quota::Exhausted => state.quota.apply_quota(&quota(nodes as u64)),
    }
    let pod: Pod = serde_json::from_value(pod_json("bench", "bench-uid")).unwrap();
    let config = FilterConfig::default();
    // What `/filter` does under the state's lock (`runtime::Scheduler::filter`).
    let decide = |state: &mut ClusterState, pod: &Pod, names: &[String]| {
        state.expire_heartbeats(Instant::now());
        filter_within_quota(state, pod, names, &config, 0)
    };
    let placed = |d: &hami_scheduler::extender::FilterDecision| match quota_mode {
        Quota::Exhausted => d.result.nodenames.is_none() && d.patch.is_none(),
        Quota::None | Quota::Room => d.result.nodenames.is_some(),
    };
    let body =
        serde_json::to_vec(&json!({"pod": pod_json("bench", "bench-uid"), "nodenames": names}))
            .unwrap();
    let iterations = if nodes >= 5000 { 200 } else { 1000 };
    for _ in 0..20 {
        decide(&mut state, &pod, &names);
    }
    let mut core = Vec::with_capacity(iterations);
    let mut with_json = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let d = decide(&mut state, &pod, &names);
        core.push(started.elapsed());
        assert!(placed(&d), "{:?}", d.result.error);
        let started = Instant::now();
        let args: ExtenderArgs = from_json_any_case(&body).unwrap();
        let d = decide(
            &mut state,
            args.pod.as_ref().unwrap(),
            args.nodenames.as_ref().unwrap(),
        );
        with_json.push(started.elapsed());
        assert!(placed(&d));
    }
    core.sort();
    with_json.sort();
    let quota_note = match quota_mode {
        Quota::None => "",
        Quota::Room => " (quota in force, room)",
        Quota::Exhausted => " (quota exhausted)",
    };
    println!(
        "filter {nodes:>5} nodes x 8 GPUs{quota_note}: decision p50 {:>8.3} ms  p99 {:>8.3} ms | with JSON request decode p50 {:>8.3} ms  p99 {:>8.3} ms",
        percentile(&core, 0.5).as_secs_f64() * 1e3,
        percentile(&core, 0.99).as_secs_f64() * 1e3,
        percentile(&with_json, 0.5).as_secs_f64() * 1e3,
        percentile(&with_json, 0.99).as_secs_f64() * 1e3,
    );
}

/// The harness's view of a watched object: the metadata a watch resumes from and the harness
/// reads (name, namespace, resourceVersion, annotations), and a pod's node. The harness's
/// watchers used to decode every Pod and Node whole (managedFields, spec, status: ≈ 0.5 G
/// instructions a spread run) to read these, on the 2 cores the scheduler under test has.
#[derive(Clone, Debug)]
struct Lite<K> {
    metadata: ObjectMeta,
    node_name: Option<String>,
    kind: std::marker::PhantomData<fn() -> K>,
}

#[derive(serde::Deserialize)]
struct LiteRaw {
    metadata: LiteMeta,
    spec: Option<LiteSpec>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LiteMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LiteSpec {
    node_name: Option<String>,
}

impl<'de, K> serde::Deserialize<'de> for Lite<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = LiteRaw::deserialize(d)?;
        Ok(Lite {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                namespace: raw.metadata.namespace,
                resource_version: raw.metadata.resource_version,
                annotations: raw.metadata.annotations,
                ..ObjectMeta::default()
            },
            node_name: raw.spec.and_then(|s| s.node_name),
            kind: std::marker::PhantomData,
        })
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Lite<K> {
    type DynamicType = ();
    type Scope = K::Scope;
    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The names of the bound pods, fed by one pod watch: the harness waits on it instead of
/// polling. Each in-flight pod used to be GET every 5 ms (64 × 200/s, and the plugin
/// stand-in as many again) — on 2 cores that load competed with the scheduler it measured.
#[derive(Default)]
struct Bound {
    names: std::sync::Mutex<std::collections::HashSet<String>>,
    changed: tokio::sync::Notify,
}

impl Bound {
    async fn watch(self: Arc<Self>, client: Client) {
        let pods: Api<Lite<Pod>> = Api::namespaced(client, "default");
        let stream = watcher(pods, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(pod)) = stream.next().await {
            if pod.node_name.is_some() {
                let name = pod.metadata.name.clone().unwrap_or_default();
                self.names.lock().unwrap().insert(name);
                self.changed.notify_waiters();
            }
        }
    }

    async fn wait_for(&self, name: &str) {
        loop {
            let changed = self.changed.notified();
            if self.names.lock().unwrap().contains(name) {
                return;
            }
            changed.await;
        }
    }
}

/// Releases a node's lock as soon as its owner pod is bound (the plugin's last step).
async fn plugin_stand_in(client: Client, bound: Arc<Bound>) {
    let nodes: Api<Lite<Node>> = Api::all(client.clone());
    let stream = watcher(nodes.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    futures::pin_mut!(stream);
    while let Some(Ok(node)) = stream.next().await {
        let Some(value) = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            .cloned()
        else {
            continue;
        };
        let client = client.clone();
        let nodes = nodes.clone();
        let bound = bound.clone();
        tokio::spawn(async move {
            let Some(owner) = NodeLock::parse(&value).ok().and_then(|l| l.owner) else {
                return;
            };
            let pods: Api<Lite<Pod>> = Api::namespaced(client, &owner.namespace);
            if tokio::time::timeout(Duration::from_secs(1), bound.wait_for(&owner.name))
                .await
                .is_err()
            {
                return;
            }
            let _ = pods
                .patch(
                    &owner.name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        &json!({"metadata": {"annotations": {pod_keys::BIND_PHASE: "success"}}}),
                    ),
                )
                .await;
            let name = node.metadata.name.clone().unwrap_or_default();
            let _ = nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        &json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: null}}}),
                    ),
                )
                .await;
        });
    }
}

async fn end_to_end(node_policy: NodePolicy, pods: usize, in_flight: usize) {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    for i in 0..1000 {
        api.create_object("v1", "nodes", None, node_json(&format!("node-{i}"), i))
            .unwrap();
    }
    let mut settings = Settings::default();
    settings.filter.node_policy = node_policy;
    let scheduler = Scheduler::start(client.clone(), settings, Arc::new(Leadership::always()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler.clone()),
        listener,
        None,
    ));
    while !scheduler.ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let extender =
        ExtenderClient::new(&format!("http://127.0.0.1:{port}"), Trust::Insecure).unwrap();
    tokio::spawn(SimKubeScheduler::new(client.clone(), "hami-scheduler", extender).run());
    let bound = Arc::new(Bound::default());
    tokio::spawn(bound.clone().watch(client.clone()));
    tokio::spawn(plugin_stand_in(client.clone(), bound.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let api_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = Vec::new();
    for i in 0..pods {
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let api_pods = api_pods.clone();
        let bound = bound.clone();
        tasks.push(tokio::spawn(async move {
            let mut pod: Pod = serde_json::from_value(pod_json(&format!("p{i}"), "")).unwrap();
            pod.metadata.uid = None;
            api_pods.create(&PostParams::default(), &pod).await.unwrap();
            bound.wait_for(&format!("p{i}")).await;
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    println!(
        "end to end, node policy {node_policy:?}: {pods} pods ({in_flight} in flight) on 1,000 nodes × 8 GPUs bound in {:.2} s = {:.0} pods/s",
        elapsed.as_secs_f64(),
        pods as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let runs = |part: &str| only.is_none_or(|o| o == part);
    if runs("filter") {
        for nodes in [100, 1000, 5000] {
            filter_latency(nodes, Quota::None);
        }
        filter_latency(5000, Quota::Room);
        filter_latency(5000, Quota::Exhausted);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if runs("spread") {
        runtime.block_on(end_to_end(NodePolicy::Spread, 1000, 64));
    }
    if runs("binpack") {
        runtime.block_on(end_to_end(NodePolicy::Binpack, 300, 64));
    }
}
