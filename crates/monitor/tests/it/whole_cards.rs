//! Whole cards held by pods HAMi did not place (issue 26 item 1) are on `/metrics`: the
//! device plugin's record (`hami.io/amd-whole-cards`, `hami.io/nvidia-whole-cards`), read
//! by the one counting rule (`hami_protocol::whole_cards::held_cards`), gives one
//! `hami_vgpu_whole_card{namespace,pod,device_uuid}` = 1 per held card. The pods live in the
//! embedded API server; the monitor's real informer and HTTP server report them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::scrape;
use hami_local_ports::free_port;
use hami_monitor::node_monitor::MonitorConfig;
use hami_monitor::server::{ServeConfig, serve};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NODE: &str = "node-w";

async fn create(api: &Api<Pod>, pod: Value, phase: &str) {
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let name = pod.metadata.name.clone().unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .unwrap();
}

/// A pod on `node` asking for `count` of `resource`, with `annotations`.
fn pod(name: &str, node: &str, resource: &str, count: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x",
            "resources": {"limits": {resource: count}}}]}
    })
}

/// The `hami_vgpu_whole_card` series of a scrape: (pod, device_uuid) → value.
fn whole_cards(text: &str) -> BTreeMap<(String, String), f64> {
    let label = |labels: &str, key: &str| -> String {
        let start = labels.find(&format!("{key}=\"")).unwrap() + key.len() + 2;
        labels[start..].split('"').next().unwrap().to_owned()
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("hami_vgpu_whole_card{"))
        .map(|rest| {
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            assert_eq!(label(labels, "namespace"), "default", "{rest}");
            assert_eq!(label(labels, "zone"), "vGPU", "{rest}");
            (
                (label(labels, "pod"), label(labels, "device_uuid")),
                value.parse().unwrap(),
            )
        })
        .collect()
}

/// Scrapes until `done` holds (bounded: many refresh intervals on a loaded machine).
async fn scrape_until(port: u16, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(port).await.unwrap_or_default();
        if !text.is_empty() && done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_held_whole_by_pods_hami_did_not_place_are_reported_one_series_each() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    let amd_key = "hami.io/amd-whole-cards";
    let nv_key = "hami.io/nvidia-whole-cards";
    // Plain pods (default scheduler): their records count, at most as many as they ask.
    create(
        &pods,
        pod(
            "plain-amd",
            NODE,
            "amd.com/gpu",
            "2",
            json!({amd_key: "CARD-A,CARD-B,CARD-X"}),
        ),
        "Running",
    )
    .await;
    create(
        &pods,
        pod(
            "plain-nv",
            NODE,
            "nvidia.com/gpu",
            "1",
            json!({nv_key: "GPU-1"}),
        ),
        "Running",
    )
    .await;
    // Not counted: a pod HAMi placed (its holdings are its device lists), an ended pod,
    // a record that does not decode (counted as a bad annotation instead).
    let mut placed = pod(
        "placed",
        NODE,
        "amd.com/gpu",
        "1",
        json!({amd_key: "CARD-P"}),
    );
    placed["spec"]["schedulerName"] = json!("hami-scheduler");
    create(&pods, placed, "Running").await;
    create(
        &pods,
        pod(
            "ended",
            NODE,
            "amd.com/gpu",
            "1",
            json!({amd_key: "CARD-E"}),
        ),
        "Succeeded",
    )
    .await;
    create(
        &pods,
        pod(
            "garbled",
            NODE,
            "amd.com/gpu",
            "1",
            json!({amd_key: "CARD-G,,"}),
        ),
        "Running",
    )
    .await;

    let base = std::env::temp_dir().join(format!("hami-monitor-whole-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let hook = base.join("hook");
    std::fs::create_dir_all(hook.join("containers")).unwrap();
    std::fs::create_dir_all(base.join("proc")).unwrap();
    std::fs::create_dir_all(base.join("sys")).unwrap();
    let port = free_port();
    let config = ServeConfig {
        monitor: MonitorConfig {
            hook_path: hook,
            proc_root: base.join("proc"),
            sys_root: base.join("sys"),
            node_name: NODE.into(),
            gc_grace: Duration::from_secs(300),
            nvml_library: None,
        },
        bind: format!("127.0.0.1:{port}").parse().unwrap(),
        legacy_metrics: hami_monitor::metrics::LegacyMetrics::Seed,
        scheduler_name: "hami-scheduler".into(),
        refresh_interval: Duration::from_secs(1),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let monitor = tokio::spawn(serve(config, client.clone(), async {
        let _ = rx.await;
    }));

    let want: BTreeMap<(String, String), f64> = [
        ("plain-amd", "CARD-A"),
        ("plain-amd", "CARD-B"),
        ("plain-nv", "GPU-1"),
    ]
    .iter()
    .map(|(p, c)| ((p.to_string(), c.to_string()), 1.0))
    .collect();
    let text = scrape_until(port, "the held cards and the bad record", |t| {
        whole_cards(t) == want
            && t.lines().any(|l| {
                l.starts_with("hami_monitor_errors_total{") && l.contains("annotation_invalid")
            })
    })
    .await;
    // The Prometheus 0.0.4 text needs HELP and TYPE on the family (promtool).
    assert!(
        text.lines()
            .any(|l| l.starts_with("# HELP hami_vgpu_whole_card ") && l.contains("whole")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "# TYPE hami_vgpu_whole_card gauge"),
        "{text}"
    );

    // The pod ends: its cards are no longer reported.
    pods.delete("plain-amd", &DeleteParams::default())
        .await
        .unwrap();
    let only_nv: BTreeMap<_, _> = want
        .into_iter()
        .filter(|((p, _), _)| p == "plain-nv")
        .collect();
    scrape_until(port, "plain-amd's cards gone", |t| {
        whole_cards(t) == only_nv
    })
    .await;

    let _ = tx.send(());
    monitor.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
