//! A node whose device plugin died is not offered (issue 17 item 13): kubelet drops the
//! vendor's count resource to 0 when its plugin is gone, while the plugin's register
//! annotation stays behind; filter stops offering the node's GPUs of that vendor and says
//! why, and offers them again once kubelet reports devices again.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    AMD_REGISTER, api, create_gpu_pod, create_node, filter_args, kubelet_reports, start_scheduler,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_plugin_is_gone_is_not_offered() {
    let (_api, client) = api().await;
    create_node(
        &client,
        json!({"annotations": {"hami.io/node-amd-register": AMD_REGISTER}}),
        Value::Null,
    )
    .await;
    kubelet_reports(&client, "10").await;
    let pod = create_gpu_pod(&client, "p").await;
    let scheduler = start_scheduler(&client);
    let until_filter = |want_fit: bool| {
        let scheduler = scheduler.clone();
        let pod = &pod;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let r = scheduler.filter(filter_args(pod)).await;
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
    kubelet_reports(&client, "0").await;
    let refused = until_filter(false).await;
    assert!(
        // No eviction brings the plugin back: never offered to preemption.
        refused.failed_and_unresolvable_nodes["n"].contains("amd.com/gpu allocatable 0"),
        "{:?}",
        refused.failed_and_unresolvable_nodes
    );
    // It comes back.
    kubelet_reports(&client, "10").await;
    until_filter(true).await;
}

/// The register heartbeat (`hami.io/node-handshake-amd`): kubelet still reports devices
/// (the plugin's gRPC side lives) but its publisher stopped refreshing (hung, lost its API
/// access): after 3 periods without a change the node is not offered; a refresh brings it
/// back. The "plugin" writes what the plugins write, with `hami_protocol::handshake`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_plugin_stopped_refreshing_is_not_offered_then_comes_back() {
    use hami_protocol::handshake;
    let (_api, client) = api().await;
    let nodes: Api<Node> = Api::all(client.clone());
    create_node(&client, json!({}), Value::Null).await;
    kubelet_reports(&client, "10").await;
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
                        "hami.io/node-amd-register": AMD_REGISTER,
                        handshake::key(hami_protocol::names::Vendor::Amd): beat,
                    }}})),
                )
                .await
                .unwrap();
        }
    };
    refresh(0).await;
    let pod = create_gpu_pod(&client, "p").await;
    let scheduler = start_scheduler(&client);
    let filter = || {
        let scheduler = scheduler.clone();
        let args = filter_args(&pod);
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
    let why = &refused.failed_and_unresolvable_nodes["n"];
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
