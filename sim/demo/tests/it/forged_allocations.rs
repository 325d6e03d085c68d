//! D-4 on the running stack (issue 17 item 11): a pod that asks for no GPU may not carry
//! the scheduler's allocation annotations — the webhook refuses it, and so does the D-4
//! guard webhook when the pod is labelled `hami.io/webhook=ignore` (which the main webhook
//! never sees) — and when one gets through anyway (here: created while the webhook
//! configuration is absent, as pods that predate the chart's install),
//! its forged `hami.io/amd-cu-allocated` and device list no longer take the node's GPUs
//! away: a later GPU pod on that node is placed by the scheduler, gets its CUs from the
//! AMD plugin and runs, and the monitor reports no grant for the forged pod.

use crate::common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{once_args, scratch};
use hami_demo::{Cluster, Progress};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

const GPU_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: after-forgery
  annotations:
    amd.com/use-gputype: MI210
spec:
  containers:
  - name: main
    image: rocm/pytorch
    resources:
      limits: {amd.com/gpu: 1, amd.com/gpumem: 4096, amd.com/gpucores: 50}
"#;

fn monitor_scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_allocations_neither_pass_the_webhook_nor_block_later_gpu_pods() {
    let _one_cluster = common::ONE_CLUSTER.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = scratch("forged");
    let args = once_args(dir.clone(), &dir);
    let mut sink = Vec::new();
    let mut progress = Progress::new(&mut sink);
    let cluster = Cluster::start(&args, &mut progress).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");

    // Every CU and all memory of every MI210 on the node, as a forger would write them.
    let node = "mi210-node";
    let gpus: Vec<(String, String, u64, u32)> = {
        let state = cluster.scheduler.state();
        state
            .node(node)
            .unwrap()
            .devices
            .gpus
            .iter()
            .map(|g| {
                (
                    g.info.id.clone(),
                    g.info.device_type.clone(),
                    g.info.devmem,
                    g.info.devcore,
                )
            })
            .collect()
    };
    assert_eq!(gpus.len(), 8);
    let cus: serde_json::Map<String, serde_json::Value> = gpus
        .iter()
        .map(|(id, _, _, cores)| (id.clone(), json!(format!("0-{}", cores - 1))))
        .collect();
    let list: String = gpus
        .iter()
        .map(|(id, ty, mem, cores)| format!("{id},{ty},{mem},{cores}:"))
        .collect::<String>()
        + ";";
    let cu_forgery =
        json!({"hami.io/amd-cu-allocated": serde_json::Value::Object(cus).to_string()});
    // What the scheduler counts: the device list (every byte of every GPU).
    let list_forgery = json!({"hami.io/amd-devices-allocated": list, "hami.io/vgpu-node": node,
        "hami.io/bind-phase": "success"});
    let forged = |name: &str, labels: serde_json::Value, annotations: &serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"nodeName": node, "schedulerName": "hami-scheduler",
                "containers": [{"name": "idle", "image": "busybox"}]}
        }))
        .unwrap()
    };

    // 1. The webhook refuses the forgery on a pod without GPU requests.
    match pods
        .create(
            &PostParams::default(),
            &forged("forger", json!({}), &cu_forgery),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 403 && status.message.contains("hami.io/"),
            "{status:?}"
        ),
        other => panic!("a non-GPU pod with allocation annotations was admitted: {other:?}"),
    }

    // ... and the guard webhook refuses it on a pod the main webhook's selectors skip.
    let ignore = json!({"hami.io/webhook": "ignore"});
    match pods
        .create(
            &PostParams::default(),
            &forged("ignored-forger", ignore.clone(), &cu_forgery),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 403 && status.message.contains("hami.io/"),
            "{status:?}"
        ),
        other => panic!("the D-4 guard admitted an ignore-labelled forgery: {other:?}"),
    }

    // 2. Pods created while no webhook is registered carry the forgeries anyway: one the CU
    //    map the AMD plugin unions (issue 17's live case), one the device list the
    //    scheduler counts.
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let mut registered = Vec::new();
    for mut h in hooks.list(&Default::default()).await.unwrap().items {
        let name = h.metadata.name.clone().unwrap();
        hooks.delete(&name, &Default::default()).await.unwrap();
        h.metadata.resource_version = None;
        h.metadata.uid = None;
        registered.push(h);
    }
    for (name, annotations) in [("bypass-cus", &cu_forgery), ("bypass-list", &list_forgery)] {
        pods.create(
            &PostParams::default(),
            &forged(name, ignore.clone(), annotations),
        )
        .await
        .expect("no webhook is registered");
    }
    for h in &registered {
        hooks.create(&PostParams::default(), h).await.unwrap();
    }
    // Bounded wait until the node's kubelet ran them: the informers have seen them by then.
    let deadline = Instant::now() + Duration::from_secs(10);
    for name in ["bypass-cus", "bypass-list"] {
        while Instant::now() < deadline {
            let p = pods.get(name).await.unwrap();
            if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // 3. A real GPU pod for that node's GPUs is placed and runs.
    std::fs::write(dir.join("after-forgery.yaml"), GPU_POD).unwrap();
    let submitted = cluster.submit_examples(&dir, &mut progress).await.unwrap();
    cluster
        .settle(&submitted, Duration::from_secs(20), &mut progress)
        .await;
    let pod = pods.get("after-forgery").await.unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running"),
        "{annotations:?}\n{}",
        String::from_utf8_lossy(&sink)
    );
    assert_eq!(annotations["hami.io/vgpu-node"], node);
    assert_eq!(annotations["hami.io/bind-phase"], "success");
    // Its CUs overlap the forged ones: the forgery counted for nothing.
    assert!(annotations.contains_key("hami.io/amd-cu-allocated"));

    // 4. The monitor reports grants for the real pod only.
    let monitor = cluster.nodes.iter().find(|n| n.name == node).unwrap();
    let addr = monitor.monitor_addr;
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = tokio::task::spawn_blocking(move || monitor_scrape(addr))
            .await
            .unwrap();
        if text.contains("pod=\"after-forgery\"") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let granted = |pod: &str| {
        text.lines().any(|l| {
            l.starts_with("hami_container_device_allocated_")
                && l.contains(&format!("pod=\"{pod}\""))
        })
    };
    assert!(granted("after-forgery"), "{text}");
    assert!(!granted("bypass-cus") && !granted("bypass-list"), "{text}");
    cluster.shutdown().await;
}
