//! The scheduler keeps no copy of pods (issue 17 item 10): the real `hami-scheduler`
//! binary, ready with 2,000 and then with 8,000 Deployment-shaped pods (managedFields
//! included) that it does not place, grows by less than 2 KiB per added pod. Caching every
//! pod in full (the kube-rs reflector it had, plus a buffer of the initial list) cost about
//! 33 KiB per pod: some 190 MiB here. What remains is a fixed cost of decoding list pages,
//! not a per-pod one. BENCHMARKS.md has the 50,000-pod figure (`benches/rss_pods.rs`).

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_local_ports::free_port;
use serde_json::json;

fn readyz(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn rss_mib(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Starts the real binary against `kubeconfig`, waits for `/readyz`, returns its RSS.
async fn ready_rss(kubeconfig: &std::path::Path) -> f64 {
    let (http, metrics) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hami-scheduler"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--http-bind=127.0.0.1:{http}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    // A scheduler that exits (a bind it cannot make, a kubeconfig it cannot read) is
    // reported at once with its exit status, not after the whole wait.
    let (ready, exited, mut child) = tokio::task::spawn_blocking(move || {
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return (false, Some(status), child);
            }
            if readyz(http) {
                return (true, None, child);
            }
            if started.elapsed() > Duration::from_secs(60) {
                return (false, None, child);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    let rss = rss_mib(pid);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        exited.is_none(),
        "the scheduler exited before it was ready: {exited:?}"
    );
    assert!(ready, "the scheduler did not become ready within 60 s");
    rss
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_memory_does_not_grow_with_pods_it_does_not_place() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("hami-pod-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let seed = |range: std::ops::Range<usize>| {
        for i in range {
            let managed = json!([{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": "2026-12-01T09:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}, "f:pod-template-hash": {}},
            "f:ownerReferences": {}}, "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {"f:image": {}, "f:env": {}, "f:ports": {}, "f:resources": {}}}}}}]);
            api.create_object("v1", "pods", Some("default"), json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-7d9f8c6b5-{i:05}"), "namespace": "default",
                "labels": {"app": "web", "pod-template-hash": "7d9f8c6b5"},
                "managedFields": managed,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8c6b5",
                    "uid": "5b0c3c9e-8f1a-4d7e-9a53-6a2b7f1d0c11", "controller": true}]},
            "spec": {"containers": [{"name": "web", "image": "registry.example.com/team/web:1.27.3",
                "ports": [{"containerPort": 8080}],
                "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
                "volumeMounts": [{"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
                "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}
        }))
        .unwrap();
        }
    };
    seed(0..2000);
    let small = ready_rss(&kubeconfig).await;
    seed(2000..8000);
    let large = ready_rss(&kubeconfig).await;
    eprintln!("RSS with 2,000 pods {small:.1} MiB, with 8,000 pods {large:.1} MiB");
    let _ = std::fs::remove_dir_all(&dir);
    let per_pod_kib = (large - small) * 1024.0 / 6000.0;
    assert!(
        per_pod_kib < 2.0,
        "hami-scheduler grew from {small:.1} MiB (2,000 pods) to {large:.1} MiB (8,000 pods): {per_pod_kib:.1} KiB per pod it does not place"
    );
}
