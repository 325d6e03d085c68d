//! Pod start latency, bound → Running (issue 29): the same pods through kubelet-sim's
//! containerd runtime (CRI v1 → a real containerd 1.6 + runc, one sandbox and one container
//! per pod, the test busybox image) and through its stand-in runtime (`unshare`), in one
//! run, one pod at a time (latency, not throughput), the earlier pods left running.
//!
//! Run by hand as root (needs Debian's `containerd runc buildah busybox-static`):
//! `cargo bench -p hami-kubelet-sim --bench pod_start` (`PODS=n` for other than 50).
//! The pod is created already bound (`nodeName`): the clock starts at that write and stops
//! when the API server first shows phase `Running` (read every millisecond).

use std::time::{Duration, Instant};

use hami_containerd_host::shared::{TEST_BUSYBOX, TEST_PAUSE};
use hami_kubelet_sim::container_runtime::RuntimeArgs;
use hami_kubelet_sim::cri_args::{CriArgs, RuntimeKind};
use hami_kubelet_sim::{Args, KubeletSim};
use serde_json::json;

/// kubelet-sim's sync interval in both runs (its fallback poll; pods arrive by watch).
const SYNC_MS: u64 = 50;

fn main() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "pod_start: needs root and Debian's packages ({}); nothing measured",
            hami_containerd_host::INSTALL
        );
        return;
    }
    let pods = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50usize);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run(pods));
}

async fn run(pods: usize) {
    let Some(shared) = hami_containerd_host::shared::containerd() else {
        return;
    };
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .expect("the API server");
    let client = kube::Client::try_from(kube::Config::new(
        server.url().parse().expect("the API server's URL"),
    ))
    .expect("a client");
    let dir = std::env::temp_dir().join(format!("pod-start-{}", std::process::id()));
    let cri = RuntimeArgs {
        state_dir: Some(dir.join("cri")),
        cri: CriArgs {
            kind: RuntimeKind::Containerd,
            containerd_socket: shared.socket.clone(),
            pause_image: TEST_PAUSE.into(),
            image_archive_dir: Some(shared.archives.clone()),
            cni_config: None,
            kubernetes_service: None,
        },
        ..Default::default()
    };
    let stand_in = RuntimeArgs {
        image_env: vec!["PATH=/usr/bin:/bin".into()],
        state_dir: Some(dir.join("stand-in")),
        ..Default::default()
    };
    println!("pod start, bound → Running, {pods} pods one at a time (sync {SYNC_MS} ms)");
    println!("| runtime | p50 | p99 | max |");
    println!("|---|---|---|---|");
    for (label, node, runtime) in [
        ("containerd 1.6 + runc (CRI)", "cri", cri),
        ("stand-in (unshare)", "standin", stand_in),
    ] {
        let sim = KubeletSim::start(
            Args {
                socket_dir: dir.join(node).join("device-plugins"),
                node_name: node.into(),
                record_dir: None,
                run_containers: true,
                runtime,
                sync_interval_ms: SYNC_MS,
            },
            client.clone(),
        )
        .await
        .expect("kubelet-sim");
        let mut took = Vec::with_capacity(pods);
        for i in 0..pods {
            let name = format!("{node}-{i}");
            let start = Instant::now();
            server
                .create_object(
                    "v1",
                    "pods",
                    Some("default"),
                    json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": "default"},
                        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "main", "image": TEST_BUSYBOX,
                                "command": ["/bin/sh", "-c", "exec sleep 3600"]}]}}),
                )
                .expect("the pod is created");
            loop {
                let pod = server.get_object("v1", "pods", "default", &name);
                if pod.is_some_and(|p| p["status"]["phase"] == "Running") {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "{name} not Running after 60 s"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            took.push(start.elapsed());
        }
        took.sort();
        let at = |q: f64| took[((took.len() as f64 * q).ceil() as usize).clamp(1, took.len()) - 1];
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        println!(
            "| {label} | {} | {} | {} |",
            ms(at(0.50)),
            ms(at(0.99)),
            ms(took[took.len() - 1])
        );
        sim.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
