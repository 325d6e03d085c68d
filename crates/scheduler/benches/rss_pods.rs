//! Scheduler memory with many pods (run:
//! `cargo bench -p hami-scheduler --bench rss_pods --profile dev -- 50000`).
//!
//! The embedded API server runs in this process and is seeded through its HTTP API with
//! `N` pods shaped like a Deployment's (labels, owner reference, env, volume mounts,
//! status conditions, the server's `managedFields`), a tenth of them placed by hami
//! (device-list annotations on 100 nodes). The real `hami-scheduler` binary then runs as a
//! child process against it; the figure is the child's RSS once `/readyz` answers
//! (informers listed everything), and its peak (VmHWM).

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hami_apiserver::{ApiServer, Config};
use hami_local_ports::free_port;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode, encode_node_devices};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

fn status_kib(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn http_get(port: u16, path: &str) -> u16 {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn pod(i: usize) -> Pod {
    let placed = i.is_multiple_of(10);
    let node = format!("node-{}", i % 100);
    let mut annotations = serde_json::Map::new();
    if placed {
        annotations.insert("hami.io/vgpu-node".into(), json!(node));
        annotations.insert(
            "hami.io/amd-devices-allocated".into(),
            json!(format!("gpu-{}-0,AMD Instinct MI300X,1024,4:;", i % 100)),
        );
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web-7d9f8c6b5-{i:06}"), "namespace": "default",
            "labels": {"app": "web", "pod-template-hash": "7d9f8c6b5", "tier": "frontend"},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8c6b5",
                "uid": "5b0c3c9e-8f1a-4d7e-9a53-6a2b7f1d0c11", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"nodeName": if placed { Some(node) } else { None },
            "containers": [{"name": "web", "image": "registry.example.com/team/web:1.27.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "1024", "amd.com/gpucores": "4"}},
                "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}]},
        "status": {"phase": "Running", "conditions": [
            {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"},
            {"type": "ContainersReady", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}
    }))
    .unwrap()
}

fn node(i: usize) -> Node {
    let gpus: Vec<DeviceInfo> = (0..8)
        .map(|g| DeviceInfo {
            id: format!("gpu-{i}-{g}"),
            index: g + 1,
            count: 10,
            devmem: 196_288,
            devcore: 304,
            device_type: "AMD Instinct MI300X".into(),
            numa: 0,
            mode: DeviceMode::HamiCore,
            health: true,
            device_vendor: "AMD".into(),
            custom_info: CustomInfo::default(),
        })
        .collect();
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("node-{i}"),
        "annotations": {"hami.io/node-amd-register": encode_node_devices(&gpus).unwrap()}},
        "status": {"capacity": {"amd.com/gpu": "80"}, "allocatable": {"amd.com/gpu": "80"}}}),
    )
    .unwrap()
}

#[tokio::main]
async fn main() {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(50_000);
    let exe = env!("CARGO_BIN_EXE_hami-scheduler");
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..100 {
        nodes
            .create(&PostParams::default(), &node(i))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &pod(i)).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let sample = api
        .get_object("v1", "pods", "default", "web-7d9f8c6b5-000000")
        .unwrap();
    println!(
        "seeded {count} pods in {:.1}s ({} bytes of JSON each, managedFields entries: {})",
        started.elapsed().as_secs_f64(),
        sample.to_string().len(),
        sample["metadata"]["managedFields"]
            .as_array()
            .map_or(0, |a| a.len())
    );
    let dir = std::env::temp_dir().join(format!("hami-rss-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let (http, metrics) = (free_port(), free_port());
    let mut child = Command::new(exe)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--http-bind")
        .arg(format!("127.0.0.1:{http}"))
        .arg("--metrics-bind-address")
        .arg(format!("127.0.0.1:{metrics}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let ready = tokio::task::spawn_blocking(move || {
        while http_get(http, "/readyz") != 200 {
            if started.elapsed() > Duration::from_secs(300) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(started.elapsed())
    })
    .await
    .unwrap();
    let Some(ready) = ready else {
        let _ = child.kill();
        panic!("the scheduler did not become ready within 300 s");
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = status_kib(pid, "VmRSS:");
    let hwm = status_kib(pid, "VmHWM:");
    println!(
        "hami-scheduler with {count} pods on 100 nodes: ready after {:.1}s, RSS {:.1} MiB, peak RSS {:.1} MiB",
        ready.as_secs_f64(),
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
