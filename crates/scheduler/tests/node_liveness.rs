//! A node whose device plugin died is not offered (issue 17 item 13): kubelet drops the
//! vendor's count resource to 0 when its plugin is gone, while the plugin's register
//! annotation stays behind; filter stops offering the node's GPUs of that vendor and says
//! why, and offers them again once kubelet reports devices again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderArgs;
use hami_scheduler::leader::Leadership;
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_plugin_is_gone_is_not_offered() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#}}}))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let kubelet_reports = |count: &str| {
        let nodes = nodes.clone();
        let caps = json!({"amd.com/gpu": count});
        async move {
            nodes
                .patch_status(
                    "n",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"capacity": caps, "allocatable": caps}})),
                )
                .await
                .unwrap();
        }
    };
    kubelet_reports("10").await;
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100"}}}]}}))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let scheduler = Scheduler::start(
        client.clone(),
        Settings::default(),
        Arc::new(Leadership::always()),
    );
    let args = || -> ExtenderArgs {
        serde_json::from_value(json!({"pod": pod, "nodenames": ["n"]})).unwrap()
    };
    let until_filter = |want_fit: bool| {
        let scheduler = scheduler.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let r = scheduler.filter(args()).await;
                if r.error.is_empty() && r.nodenames.is_some() == want_fit {
                    return r;
                }
                assert!(
                    Instant::now() < deadline,
                    "filter never {}: {r:?}",
                    if want_fit { "fit" } else { "refused" }
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    until_filter(true).await;
    // The plugin dies: kubelet reports 0 devices; the annotation stays.
    kubelet_reports("0").await;
    let refused = until_filter(false).await;
    assert!(
        refused.failed_nodes["n"].contains("amd.com/gpu allocatable 0"),
        "{:?}",
        refused.failed_nodes
    );
    // It comes back.
    kubelet_reports("10").await;
    until_filter(true).await;
}

/// The register heartbeat (`hami.io/node-handshake-amd`): kubelet still reports devices
/// (the plugin's gRPC side lives) but its publisher stopped refreshing (hung, lost its API
/// access): after 3 periods without a change the node is not offered; a refresh brings it
/// back. The "plugin" writes what the plugins write, with `hami_protocol::handshake`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_plugin_stopped_refreshing_is_not_offered_then_comes_back() {
    use hami_protocol::handshake;
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let register = r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#;
    let node: Node = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
    )
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let caps = json!({"amd.com/gpu": "10"});
    nodes
        .patch_status(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": caps, "allocatable": caps}})),
        )
        .await
        .unwrap();
    // One refresh as the plugins do it: register + heartbeat in one merge patch. The
    // plugin's clock is skewed a day into the past: never compared with ours.
    let refresh = |tick: i64| {
        let nodes = nodes.clone();
        async move {
            let beat = handshake::format(1_700_000_000 - 86_400 + tick, 1);
            nodes
                .patch(
                    "n",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "hami.io/node-amd-register": register,
                        handshake::key(hami_protocol::names::Vendor::Amd): beat,
                    }}})),
                )
                .await
                .unwrap();
        }
    };
    refresh(0).await;
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100"}}}]}}))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let scheduler = Scheduler::start(
        client.clone(),
        Settings::default(),
        Arc::new(Leadership::always()),
    );
    let filter = || {
        let scheduler = scheduler.clone();
        let args: ExtenderArgs =
            serde_json::from_value(json!({"pod": pod, "nodenames": ["n"]})).unwrap();
        async move { scheduler.filter(args).await }
    };
    // While the plugin refreshes (more often than its 1 s period, each value new), the
    // node stays offered, well past 3 periods.
    let started = Instant::now();
    let mut tick = 1;
    let mut offered = false;
    while started.elapsed() < Duration::from_secs(5) || !offered {
        let r = filter().await;
        let fits = r.error.is_empty() && r.nodenames.is_some();
        // Before the scheduler's first sight of the node, a refusal is expected.
        assert!(
            fits || !offered,
            "refused while the plugin refreshes: {r:?}"
        );
        offered |= fits;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never offered: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        refresh(tick).await;
        tick += 1;
    }
    // The plugin stops refreshing: refused after 3 periods (3 s), with the rule in the reason.
    let stopped = Instant::now();
    let refused = loop {
        let r = filter().await;
        if r.error.is_empty() && r.nodenames.is_none() {
            break r;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "still offered: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        stopped.elapsed() >= Duration::from_millis(2_000),
        "refused {:?} after the last refresh, before 3 periods",
        stopped.elapsed()
    );
    let why = &refused.failed_nodes["n"];
    assert!(
        why.contains("stopped refreshing") && why.contains("hami.io/node-handshake-amd"),
        "{why}"
    );
    // It refreshes again: offered again.
    refresh(tick).await;
    let back = Instant::now();
    loop {
        let r = filter().await;
        if r.error.is_empty() && r.nodenames.is_some() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "not offered again: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
