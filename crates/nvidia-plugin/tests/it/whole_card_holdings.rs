//! Issue 26 item 1 through the whole path: pods HAMi did not place (`nvidia.com/gpu` only,
//! webhook opt-out, `spec.nodeName` set) are given whole cards by the real
//! `nvidia-device-plugin` from the ids the simulated kubelet chose; the plugin records each
//! holding on the pod (`hami.io/nvidia-whole-cards`), so the second plain pod gets the
//! other card, a third is refused when only held cards are left, the real scheduler
//! (behind the simulated kube-scheduler) places no slice on a held card, and `hami status`'s
//! builder shows the cards held.

use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_kube_scheduler_sim::front::{SchedulerFront, client_as, component_user};
use hami_plugin_harness::{api_with_node, env_of, spawn_nvidia_plugin_as, start_kubelet};
use hami_protocol::names::NVIDIA;
use hami_scheduler::config::Settings;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "gpu-node";
const KEY: &str = "hami.io/nvidia-whole-cards";

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn plain_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"hami.io/webhook": "ignore"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "cuda", "image": "cuda:12",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_pods_get_distinct_recorded_cards_and_no_slice_lands_on_them() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (api, client) = api_with_node(NODE).await;
    let scratch = std::env::temp_dir().join(format!("nv-whole-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();

    // The real scheduler (extender + webhook over TLS, the shipped webhook configuration)
    // behind the simulated kube-scheduler; it and the plugin act as their ServiceAccounts.
    let settings = Settings::default();
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
    let front = SchedulerFront::start(&scheduler, &scratch, &manifests, &client)
        .await
        .unwrap();
    tokio::spawn(
        front
            .kube_scheduler(client.clone(), settings.scheduler_name.clone())
            .unwrap()
            .run(),
    );

    // Node: simulated kubelet + the plugin over the stand-in NVML (2 GPUs, 10 shares each).
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
    let log = || std::fs::read_to_string(scratch.join("plugin.log")).unwrap_or_default();
    assert!(
        sim.wait_for_allocatable("nvidia.com/gpu", 20, Duration::from_secs(30))
            .await,
        "plugin log:\n{}",
        log()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(scheduler.ready() && scheduler.state().nodes().next().is_some()) {
        assert!(Instant::now() < deadline, "scheduler never saw the node");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Two plain pods, one after the other: each gets a card, recorded, and not the same.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut cards = Vec::new();
    for name in ["plain-1", "plain-2"] {
        pods.create(&PostParams::default(), &plain_pod(name))
            .await
            .unwrap();
        let pod = wait_phase(&api, name, "Running", &log).await;
        let visible = env_of(&pod, "cuda")["NVIDIA_VISIBLE_DEVICES"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            pod["metadata"]["annotations"][KEY].as_str(),
            Some(visible.as_str()),
            "{name}: the holding is recorded on the pod: {pod}"
        );
        cards.push(visible);
    }
    assert_ne!(
        cards[0], cards[1],
        "the second plain pod was handed the card the first holds"
    );

    // A slice pinned to the first pod's card: the scheduler finds it full, places nothing.
    let slice: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "slice", "namespace": "default",
            "annotations": {NVIDIA.use_gpuuuid: cards[0]}},
        "spec": {"containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "20"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &slice).await.unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        let pod = api.get_object("v1", "pods", "default", "slice").unwrap();
        assert!(
            pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty),
            "a slice was placed on a card held whole: {pod}"
        );
        let failed = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("slice")
            });
        if let Some(e) = failed {
            break e.note.unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "slice never refused: {pod}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The scheduler's reason: the pinned card is held whole.
    assert!(refusal.contains("CardHeldWhole"), "{refusal}");

    // `hami status` (its builder over the listed objects) shows both cards held whole.
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    let notes = vec![("default".to_owned(), "slice".to_owned(), refusal.clone())];
    let report = hami_report::status_report(&nodes, &listed, &notes);
    let gpus = &report.nodes[0].gpus;
    for (card, owner) in cards.iter().zip(["default/plain-1", "default/plain-2"]) {
        let gpu = gpus.iter().find(|g| g.id == *card).unwrap();
        assert_eq!(
            gpu.holders,
            vec![format!("{owner} {}", hami_report::WHOLE_CARD_MARK)],
            "{card}"
        );
        assert_eq!(gpu.shares_used, gpu.shares, "{card} counts full");
        assert_eq!(gpu.memory_used_mib, gpu.memory_mib, "{card} counts full");
    }
    assert!(
        report.pending.iter().any(|p| p.pod == "default/slice"),
        "{:?}",
        report.pending
    );

    // Both cards held: kubelet can only offer shares of held cards, and the plugin refuses.
    pods.create(&PostParams::default(), &plain_pod("plain-3"))
        .await
        .unwrap();
    let failed = wait_phase(&api, "plain-3", "Failed", &log).await;
    let message = failed["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("holds whole") && message.contains(KEY),
        "{message}"
    );
    assert!(failed["metadata"]["annotations"][KEY].is_null(), "{failed}");

    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&scratch);
}

async fn wait_phase(
    api: &hami_apiserver::RunningApiServer,
    name: &str,
    phase: &str,
    log: &dyn Fn() -> String,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pod = api.get_object("v1", "pods", "default", name).unwrap();
        let now = pod["status"]["phase"].as_str().unwrap_or_default();
        if now == phase {
            return pod;
        }
        assert!(
            now != "Failed" && now != "Running" && now != "Succeeded",
            "pod {name} is {now}, not {phase}: {pod}\nplugin log:\n{}",
            log()
        );
        assert!(
            Instant::now() < deadline,
            "pod {name} never {phase}: {pod}\nplugin log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
