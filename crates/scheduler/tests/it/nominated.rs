//! Nominated pods hold their slice (issue 30 item 2): after a preemption the room it freed
//! goes to the preemptor, not to a lower-priority pod filtered before the preemptor binds.
//! The pod informer keeps the nomination (a status update, as kube-scheduler writes it),
//! Filter and the preempt verb count it, and it is let go when the nomination is cleared.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::{cluster, filter_args, start_scheduler, wait};

/// Creates the unbound `default/<name>` of `priority` asking for `mem` MiB and `cores` %
/// of one AMD GPU.
async fn gpu_pod(client: &Client, name: &str, priority: i32, mem: u32, cores: u32) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "priority": priority, "containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1",
            "amd.com/gpumem": mem.to_string(), "amd.com/gpucores": cores.to_string()}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// Sets (or with `None` clears) the pod's `status.nominatedNodeName`.
async fn nominate(client: &Client, name: &str, node: Option<&str>) {
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nominatedNodeName": node}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_priority_pod_waits_while_a_nominated_pod_holds_the_room() {
    let (_api, client) = cluster().await;
    // GPU G of node n: 1000 MiB, 100 CUs, empty (the preemption's victims are gone). The
    // preemptor, nominated to n, asks 600 / 60; the low pod 500 / 50 would fit alone.
    gpu_pod(&client, "high", 1000, 600, 60).await;
    nominate(&client, "high", Some("n")).await;
    let low = gpu_pod(&client, "low", 0, 500, 50).await;
    let scheduler = start_scheduler(&client);
    wait("the scheduler syncs and sees the nomination", || async {
        scheduler.ready() && scheduler.state().nominations().len() == 1
    })
    .await;

    let refused = scheduler.filter(filter_args(&low)).await;
    assert!(refused.error.is_empty(), "{}", refused.error);
    assert_eq!(refused.nodenames, None, "{refused:?}");
    assert!(
        refused.failed_nodes["n"].contains("CardInsufficient"),
        "{refused:?}"
    );

    // kube-scheduler clears the nomination (the preemptor went elsewhere): the room is free.
    nominate(&client, "high", None).await;
    wait("the nomination is let go", || async {
        scheduler.state().nominations().is_empty()
    })
    .await;
    let placed = scheduler.filter(filter_args(&low)).await;
    assert_eq!(placed.nodenames, Some(vec!["n".to_string()]), "{placed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preempt_verb_evicts_nothing_for_room_a_nominated_pod_holds() {
    let (_api, client) = cluster().await;
    // A priority-0 slice of 300 / 30 runs on G; the priority-1000 preemptor, nominated to
    // n, will take 600 / 60 beside it; a priority-500 pod asks 800 / 80.
    let low: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "low", "namespace": "default", "annotations": {
            "hami.io/vgpu-node": "n", "hami.io/amd-devices-allocated": "G,AMD Instinct MI210,300,30:;"}},
        "spec": {"schedulerName": "hami-scheduler", "nodeName": "n", "priority": 0,
            "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "300"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &low)
        .await
        .unwrap();
    gpu_pod(&client, "high", 1000, 600, 60).await;
    nominate(&client, "high", Some("n")).await;
    let mid = gpu_pod(&client, "mid", 500, 800, 80).await;
    let scheduler = start_scheduler(&client);
    wait(
        "the scheduler sees the slice and the nomination",
        || async {
            scheduler.ready()
                && scheduler.state().nominations().len() == 1
                && scheduler
                    .state()
                    .node("n")
                    .is_some_and(|n| n.usage[0].used == 1)
        },
    )
    .await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler.clone()),
        listener,
        None,
    ));
    // Evicting the low slice would leave 1000 MiB, enough for mid alone, but the preemptor
    // takes 600 of it: mid still would not fit, so n is vetoed rather than the slice
    // evicted in vain.
    let body = json!({"Pod": mid, "NodeNameToMetaVictims": {"n": {"Pods": []}}}).to_string();
    let (status, answer) = tokio::task::spawn_blocking(move || {
        crate::http_api::request(port, "POST", "/preempt", body.as_bytes())
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    let answer = crate::http_api::json_body(&answer);
    assert_eq!(
        answer["NodeNameToMetaVictims"],
        json!({}),
        "nothing evicted: {answer}"
    );
}
