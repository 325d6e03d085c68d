//! A pod the simulated kubelet admitted is reported Running even when the API server
//! refuses the first status or record patch (a 409, an outage): the report is retried at
//! every pass, as kubelet's status manager does, instead of leaving the pod Pending for ever.

use std::time::Duration;

use hami_kubelet_sim::{Args, KubeletSim};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

async fn admitted_despite(resource: &str) {
    let server = hami_apiserver::ApiServer::start(hami_apiserver::Config::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "hami-kubelet-sim-retry-{}-{}",
        std::process::id(),
        resource.replace('/', "-")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let _sim = KubeletSim::start(
        Args {
            socket_dir: dir.clone(),
            node_name: "n1".into(),
            record_dir: None,
            run_containers: false,
            runtime: Default::default(),
            sync_interval_ms: 20,
        },
        client.clone(),
    )
    .await
    .unwrap();
    // The next patch of this resource is refused with a conflict.
    server
        .faults()
        .fail_next(Some("patch"), Some(resource), 1, 409);
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain", "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let phase = pods
            .get("plain")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .unwrap_or_default();
        if phase == "Running" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pod still {phase:?} 10 s after a refused {resource} patch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_status_patch_is_retried() {
    admitted_despite("pods/status").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_patch_is_retried() {
    admitted_despite("pods").await;
}
