//! End to end on the embedded API server: pods created through the API go through the
//! webhook (called by the API server over HTTPS with the caBundle), the simulated
//! kube-scheduler, filter and bind; a stand-in for the device plugin's last step releases
//! the node lock as the real plugin does.

use crate::common;

use std::time::{Duration, Instant};

use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{node as node_keys, pod as pod_keys};
use hami_protocol::node_lock::NodeLock;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode, encode_node_devices};
use hami_scheduler::config::Settings;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::Front as Cluster;

fn mi300x(id: &str, bdf: &str) -> DeviceInfo {
    DeviceInfo {
        id: id.into(),
        index: 1,
        count: 10,
        devmem: 196_288,
        devcore: 304,
        device_type: "AMD Instinct MI300X".into(),
        numa: 0,
        mode: DeviceMode::HamiCore,
        health: true,
        device_vendor: "AMD".into(),
        custom_info: CustomInfo {
            pci_bdf: Some(bdf.into()),
            cu_per_wgp: Some(1),
            ..Default::default()
        },
    }
}

async fn add_node(client: &Client, name: &str, devices: &[DeviceInfo]) {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"hami.io/node-amd-register": encode_node_devices(devices).unwrap()}},
        "status": {"capacity": {"amd.com/gpu": (devices.len() * 10).to_string()}}
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// What the AMD device plugin does last for a pod it allocated: `bind-phase=success`,
/// then release the node lock.
pub(crate) async fn plugin_stand_in(client: Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        for node in nodes
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let Some(value) = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(node_keys::MUTEX_LOCK))
            else {
                continue;
            };
            let Ok(lock) = NodeLock::parse(value) else {
                continue;
            };
            let Some(owner) = lock.owner else { continue };
            let pods: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
            let Ok(pod) = pods.get(&owner.name).await else {
                continue;
            };
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none()
            {
                continue;
            }
            let patch = json!({"metadata": {"annotations": {pod_keys::BIND_PHASE: "success"}}});
            let _ = pods
                .patch(&owner.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            let release = json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: null}}});
            let _ = nodes
                .patch(
                    node.metadata.name.as_deref().unwrap(),
                    &PatchParams::default(),
                    &Patch::Merge(&release),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn start(settings: Settings) -> Cluster {
    let c = common::start_front(
        common::tls_api().await,
        &settings,
        "hami-sched-e2e",
        |sim| sim,
    )
    .await;
    // The plugin acts as its ServiceAccount: D-4 lets only it and the scheduler write the
    // scheduler-owned annotations.
    tokio::spawn(plugin_stand_in(common::as_component(
        &c.api,
        hami_manifests::names::DEVICE_PLUGIN,
    )));
    c
}

fn pod(name: &str, init: Value, containers: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"initContainers": init, "containers": containers}
    }))
    .unwrap()
}

fn gpu_container(name: &str, limits: Value) -> Value {
    json!({"name": name, "image": "rocm/pytorch", "resources": {"limits": limits}})
}

async fn wait_bound(client: &Client, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pod = pods.get(name).await.unwrap();
        let phase = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(pod_keys::BIND_PHASE))
            .cloned();
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .is_some()
            && phase.as_deref() == Some("success")
        {
            return pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} was not bound in time: {:?}",
            pod.metadata.annotations
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> &'a str {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_flow_through_webhook_filter_and_bind() {
    let c = start(Settings::default()).await;
    add_node(
        &c.client,
        "node-a",
        &[mi300x(
            "8eff74b5-0000-1000-801b-b56457addd1b",
            "0000:83:00.0",
        )],
    )
    .await;
    add_node(
        &c.client,
        "node-b",
        &[mi300x(
            "8eff74b5-0000-1000-801b-b56457addd1c",
            "0000:84:00.0",
        )],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");

    // Two 50 % pods share one GPU (node binpack), with disjoint halves of the CU count.
    let half = json!({"amd.com/gpu": "1", "amd.com/gpumem": "4096", "amd.com/gpucores": "50"});
    pods.create(
        &PostParams::default(),
        &pod(
            "half-1",
            json!([]),
            json!([gpu_container("c", half.clone())]),
        ),
    )
    .await
    .unwrap();
    let first = wait_bound(&c.client, "half-1").await;
    assert_eq!(
        first.spec.as_ref().unwrap().scheduler_name.as_deref(),
        Some("hami-scheduler"),
        "set by the webhook"
    );
    pods.create(
        &PostParams::default(),
        &pod("half-2", json!([]), json!([gpu_container("c", half)])),
    )
    .await
    .unwrap();
    let second = wait_bound(&c.client, "half-2").await;
    let node_of = |p: &Pod| p.spec.as_ref().unwrap().node_name.clone().unwrap();
    assert_eq!(node_of(&first), node_of(&second));
    for p in [&first, &second] {
        let runs = decode_pod_devices(annotation(p, "hami.io/amd-devices-allocated")).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0][0].mem_mib, runs[0][0].cores), (4096, 152));
        assert_eq!(annotation(p, pod_keys::VGPU_NODE), node_of(p));
        assert!(!annotation(p, pod_keys::BIND_TIME).is_empty());
    }

    // A memory-only pod reserves every CU: the half-used GPU cannot take it.
    let mem_only = json!({"amd.com/gpumem": "1024"});
    pods.create(
        &PostParams::default(),
        &pod("mem-only", json!([]), json!([gpu_container("c", mem_only)])),
    )
    .await
    .unwrap();
    let mem = wait_bound(&c.client, "mem-only").await;
    assert_ne!(node_of(&mem), node_of(&first));
    let limits = mem.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits["amd.com/gpu"].0, "1", "count added by the webhook");
    let runs = decode_pod_devices(annotation(&mem, "hami.io/amd-devices-allocated")).unwrap();
    assert_eq!(runs[0][0].cores, 304);

    // The webhook refuses bad values with a message that says what to change.
    let err = pods
        .create(
            &PostParams::default(),
            &pod(
                "bad",
                json!([]),
                json!([gpu_container(
                    "c",
                    json!({"amd.com/gpu": "1", "amd.com/gpucores": "150"})
                )]),
            ),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 403);
    assert!(
        status.message.contains("amd.com/gpucores") && status.message.contains("from 1 to 100"),
        "{}",
        status.message
    );

    // No node has 4 GPUs: the pod stays pending with FailedScheduling / FilteringFailed events.
    pods.create(
        &PostParams::default(),
        &pod(
            "too-big",
            json!([]),
            json!([gpu_container("c", json!({"amd.com/gpu": "4"}))]),
        ),
    )
    .await
    .unwrap();
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        // kube-rs records events.k8s.io/v1 Events.
        let about = |reason: &str| {
            list.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("too-big")
                    && e.reason.as_deref() == Some(reason)
            })
        };
        if about("FilteringFailed") && about("FailedScheduling") {
            let message = list
                .iter()
                .find(|e| e.reason.as_deref() == Some("FilteringFailed"))
                .and_then(|e| e.note.clone())
                .unwrap_or_default();
            assert!(
                message.contains("no available node") && message.contains("NodeInsufficientDevice"),
                "{message}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no scheduling failure events for too-big: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        pods.get("too-big")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );

    // Metrics reflect the allocations.
    let text = c.scheduler.metrics.render(&c.scheduler.state());
    assert!(
        text.lines().any(|l| l.starts_with("hami_gpu_shared_count{")
            && l.contains("node-")
            && l.ends_with(" 2.0")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_pods_count_at_their_peak() {
    let c = start(Settings::default()).await;
    let mut small = mi300x("GPU-small", "0000:01:00.0");
    small.devmem = 10_000;
    add_node(&c.client, "node-s", &[small]).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    // Init needs 8000 MiB, the two app containers 4000 each: peak 8000, not 16000.
    let p = pod(
        "staged",
        json!([gpu_container(
            "prepare",
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "8000", "amd.com/gpucores": "40"})
        )]),
        json!([
            gpu_container("a", json!({"amd.com/gpu": "1", "amd.com/gpumem": "4000", "amd.com/gpucores": "30"})),
            {"name": "sidecar-free", "image": "busybox"},
            gpu_container("b", json!({"amd.com/gpu": "1", "amd.com/gpumem": "4000", "amd.com/gpucores": "30"}))
        ]),
    );
    pods.create(&PostParams::default(), &p).await.unwrap();
    let bound = wait_bound(&c.client, "staged").await;
    let text = annotation(&bound, "hami.io/amd-devices-allocated");
    let runs = decode_pod_devices(text).unwrap();
    assert_eq!(runs.len(), 4, "one run per container, init first: {text}");
    assert!(runs[2].is_empty());
    let usage = c.scheduler.state().node("node-s").unwrap().usage[0];
    assert_eq!(usage.mem_mib, 8000);
    assert_eq!(usage.cores, 182, "max(init 121 CUs, apps 91 + 91)");
    // 2000 MiB are left: a 3000 MiB pod does not fit, a 2000 MiB one does.
    pods.create(
        &PostParams::default(),
        &pod(
            "too-much",
            json!([]),
            json!([gpu_container(
                "c",
                json!({"amd.com/gpu": "1", "amd.com/gpumem": "3000", "amd.com/gpucores": "10"})
            )]),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            "fits",
            json!([]),
            json!([gpu_container(
                "c",
                json!({"amd.com/gpu": "1", "amd.com/gpumem": "2000", "amd.com/gpucores": "10"})
            )]),
        ),
    )
    .await
    .unwrap();
    wait_bound(&c.client, "fits").await;
    // Deliberate: a non-event has no condition to wait on; give a wrong bind time to happen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        pods.get("too-much")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );
}

/// The BindingFailed note recorded on pod `name`, waited for (bounded).
async fn binding_failed_note(client: &Client, name: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some("BindingFailed")
            });
        if let Some(e) = found {
            return e.note.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "no BindingFailed event for {name}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 26 item 4: a `/bind` for a GPU pod without a filter decision for the node — one
/// `/filter` refused, one that never went through filter — binds nothing: the pod stays
/// unbound with no bind phase, the node lock is not taken, and a BindingFailed Event says
/// why (landed: the pod was bound, `allocating` for good, the lock held until expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_without_a_filter_decision_binds_nothing() {
    let c = start(Settings::default()).await;
    add_node(&c.client, "node-a", &[mi300x("GPU-a", "0000:01:00.0")]).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");

    // More memory than the card has: kube-scheduler's filter call is refused.
    let too_big = json!({"amd.com/gpu": "1", "amd.com/gpumem": "300000", "amd.com/gpucores": "10"});
    pods.create(
        &PostParams::default(),
        &pod("refused", json!([]), json!([gpu_container("c", too_big)])),
    )
    .await
    .unwrap();
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    common::wait("filter refuses the pod", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("refused")
                    && e.reason.as_deref() == Some("FilteringFailed")
            })
    })
    .await;
    // Opted out of the webhook: left to the default scheduler, never filtered by us.
    let mut unfiltered = pod(
        "unfiltered",
        json!([]),
        json!([gpu_container(
            "c",
            json!({"amd.com/gpu": "1", "amd.com/gpucores": "10"})
        )]),
    );
    unfiltered.metadata.labels = Some([("hami.io/webhook".into(), "ignore".into())].into());
    pods.create(&PostParams::default(), &unfiltered)
        .await
        .unwrap();

    // A /bind sent anyway (another scheduler profile, a replay, a hand-written call).
    let extender = hami_scheduler::extender_client::ExtenderClient::new(
        &c.front.base,
        hami_scheduler::extender_client::Trust::Ca(c.front.ca_pem.clone().into_bytes()),
    )
    .unwrap();
    for name in ["refused", "unfiltered"] {
        let uid = pods.get(name).await.unwrap().metadata.uid.unwrap();
        let answer: Value = extender
            .call(
                "bind",
                &json!({"podName": name, "podNamespace": "default", "podUID": uid, "node": "node-a"}),
            )
            .await
            .unwrap();
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with(
                "no filter decision for node node-a; the pod must be scheduled through the hami filter"
            ),
            "{name}: {answer}"
        );
        let note = binding_failed_note(&c.client, name).await;
        assert_eq!(note, error, "{name}");
        let now = pods.get(name).await.unwrap();
        assert_eq!(
            now.spec.as_ref().unwrap().node_name,
            None,
            "{name} was bound"
        );
        assert_eq!(annotation(&now, pod_keys::BIND_PHASE), "", "{name}");
        let node = Api::<Node>::all(c.client.clone())
            .get("node-a")
            .await
            .unwrap();
        assert_eq!(
            node.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(node_keys::MUTEX_LOCK)),
            None,
            "{name}: the node lock was taken"
        );
    }
}
