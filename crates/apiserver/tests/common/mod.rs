//! Shared helpers of the integration tests: an in-process server and a kube-rs client.
#![allow(dead_code)]

use hami_apiserver::{ApiServer, Config, RunningApiServer};

pub async fn start() -> RunningApiServer {
    start_with(Config::default()).await
}

pub async fn start_with(config: Config) -> RunningApiServer {
    ApiServer::start(config).await.expect("server starts")
}

pub fn client(server: &RunningApiServer) -> kube::Client {
    let cfg = kube::Config::new(server.url().parse().expect("url"));
    kube::Client::try_from(cfg).expect("client")
}

pub fn pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "env": [{"name": "A", "value": "1"}]}]}
    }))
    .expect("pod")
}

/// Polls `f` until it returns true or 10 s pass.
pub async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}
