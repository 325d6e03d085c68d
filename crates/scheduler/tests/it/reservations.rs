//! Defrag reservations and preemption (issue 32 item 3, D-34): capacity a reservation holds
//! for another owner's replacement is taken for a preemptor too. Filter does not offer a
//! node to preemption where only such a reservation keeps the pod off
//! (`failedAndUnresolvableNodes`), and the preempt verb names no victim whose eviction
//! would free only room the reservation keeps; the reserving owner's own pod sees the
//! reserved room free, as in Filter.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::{cluster, filter_args, start_scheduler, wait};

/// The reserving owner: a ReplicaSet's uid.
const OWNER: &str = "rs-web-uid";

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Creates the unbound `default/<name>` of `priority` asking `mem` MiB and `cores` % of one
/// AMD GPU, controlled by `owner` when given.
async fn gpu_pod(
    client: &Client,
    name: &str,
    priority: i32,
    mem: u32,
    cores: u32,
    owner: Option<&str>,
) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "priority": priority, "containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": "1",
            "amd.com/gpumem": mem.to_string(), "amd.com/gpucores": cores.to_string()}}}]}
    });
    if let Some(uid) = owner {
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "web", "uid": uid, "controller": true}]);
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// The verb's answer for `pod` with node `n` proposed (no in-tree victims).
async fn preempt(port: u16, pod: &Pod) -> Value {
    let body = json!({"Pod": pod, "NodeNameToMetaVictims": {"n": {"Pods": []}}}).to_string();
    let (status, answer) = tokio::task::spawn_blocking(move || {
        crate::http_api::request(port, "POST", "/preempt", body.as_bytes())
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    crate::http_api::json_body(&answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_room_is_taken_for_a_preemptor_but_the_owners() {
    let (_api, client) = cluster().await;
    // GPU G of node n: 1000 MiB, 100 CUs. A priority-0 slice of 300 / 30 runs there, and
    // `hami defrag apply` reserved 600 / 60 for OWNER's replacement: 100 MiB are free.
    let now = unix_now();
    let reservation = json!({"owner_uid": OWNER, "owner": "ReplicaSet/web",
        "cards": [["G", 600, 60]], "reserved_at": now - 10, "expires_at": now + 600});
    Api::<Node>::all(client.clone())
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "reservation.defrag.hami.io/evicted-uid": reservation.to_string()}}})),
        )
        .await
        .unwrap();
    let low: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "low", "namespace": "default", "annotations": {
            "hami.io/vgpu-node": "n", "hami.io/amd-devices-allocated": "G,AMD Instinct MI210,300,30:;"}},
        "spec": {"schedulerName": "hami-scheduler", "nodeName": "n", "priority": 0,
            "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "300"}}}]}
    }))
    .unwrap();
    let low = Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &low)
        .await
        .unwrap();
    // Another owner's priority-500 pod asks 800 / 80; so does one of OWNER's.
    let other = gpu_pod(&client, "other", 500, 800, 80, Some("rs-other-uid")).await;
    let mine = gpu_pod(&client, "mine", 500, 800, 80, Some(OWNER)).await;
    let scheduler = start_scheduler(&client);
    wait(
        "the scheduler sees the slice and the reservation",
        || async {
            let state = scheduler.state();
            scheduler.ready()
                && state.reservations.on("n").len() == 1
                && state.node("n").is_some_and(|n| n.usage[0].used == 1)
        },
    )
    .await;

    // Filter: with the low slice evicted, 400 MiB would be free to the other owner's pod
    // (the reservation stays): no eviction helps. OWNER's pod would get 1000.
    let refused = scheduler.filter(filter_args(&other)).await;
    assert!(
        refused.failed_and_unresolvable_nodes.contains_key("n"),
        "n offered to preemption for the other owner's pod: {refused:?}"
    );
    let refused = scheduler.filter(filter_args(&mine)).await;
    assert!(refused.failed_nodes.contains_key("n"), "{refused:?}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler.clone()),
        listener,
        None,
    ));
    // The verb: nothing evicted for the other owner's pod ...
    let answer = preempt(port, &other).await;
    assert_eq!(
        answer["NodeNameToMetaVictims"],
        json!({}),
        "the low slice was evicted for room the reservation keeps: {answer}"
    );
    // ... the low slice for OWNER's, whose replacement the room is kept for.
    let answer = preempt(port, &mine).await;
    let victims = &answer["NodeNameToMetaVictims"]["n"]["Pods"];
    assert_eq!(
        victims,
        &json!([{"UID": low.metadata.uid.unwrap()}]),
        "{answer}"
    );
}
