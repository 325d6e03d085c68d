//! A new leader decides only on a view that shows the last leader's writes (D-23): its pod
//! watch lags (here frozen by a proxy, as a watch cache or a slow connection can lag), the old
//! leader placed a pod and died, and the new leader's first Filter must not give the same
//! room away again. On taking over, every informer lists again (a list cannot lag) and Filter
//! answers "catching up" until they have.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::lagging_watch::LaggingPodWatch;
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderFilterResult;
use hami_scheduler::leader::{ElectionConfig, Leadership};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::common::{self, filter_args};

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn election(identity: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: "kube-system".into(),
        name: "hami-scheduler".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_interval: Duration::from_millis(200),
    }
}

async fn create_pod(client: &Client, name: &str) -> Pod {
    // 600 of the GPU's 1,000 MiB: two such pods never fit one GPU.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "600", "amd.com/gpucores": "10"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_whose_pod_watch_lags_does_not_give_the_old_leaders_room_away() {
    let (api, direct) = common::api().await;
    common::create_node(
        &direct,
        json!({"annotations": {"hami.io/node-amd-register": common::AMD_REGISTER}}),
        serde_json::Value::Null,
    )
    .await;
    let proxy = LaggingPodWatch::start(api.addr()).await.unwrap();
    let lagging = Client::try_from(kube::Config::new(proxy.url.parse().unwrap())).unwrap();

    // Replica a leads; replica b follows, its informers reading through the proxy.
    let leader_a = Arc::new(Leadership::elected());
    let election_a = tokio::spawn(hami_scheduler::leader::run(
        direct.clone(),
        election("replica-a"),
        leader_a.clone(),
    ));
    let a = Scheduler::start(direct.clone(), Settings::default(), leader_a.clone());
    until("replica a leads", Duration::from_secs(10), || a.decides()).await;
    let leader_b = Arc::new(Leadership::elected());
    let b = Scheduler::start(lagging.clone(), Settings::default(), leader_b.clone());
    until("replica b listed", Duration::from_secs(10), || b.ready()).await;
    let election_b = tokio::spawn(hami_scheduler::leader::run(
        direct.clone(),
        election("replica-b"),
        leader_b.clone(),
    ));

    // b's pod watch stops delivering; a places p1 on the GPU and dies.
    proxy.freeze(true);
    let p1 = create_pod(&direct, "p1").await;
    let placed = a.filter(filter_args(&p1)).await;
    assert_eq!(placed.nodenames, Some(vec!["n".to_string()]), "{placed:?}");
    election_a.abort();
    until("replica b takes over", Duration::from_secs(15), || {
        leader_b.is_leader()
    })
    .await;

    // b's first decisions: "catching up" until its informers listed again, then p2 is
    // refused on n (p1 holds 600 of its 1,000 MiB), never placed beside p1.
    let p2 = create_pod(&direct, "p2").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer: ExtenderFilterResult = loop {
        let answer = b.filter(filter_args(&p2)).await;
        if answer.error.is_empty() {
            break answer;
        }
        assert!(
            answer.error.contains("listing") || answer.error.contains("not the leader"),
            "an unexpected refusal: {answer:?}"
        );
        assert!(
            Instant::now() < deadline,
            "replica b never decided: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    proxy.freeze(false);
    assert!(
        answer.nodenames.as_ref().is_none_or(Vec::is_empty),
        "the new leader gave p1's room to p2: {answer:?}"
    );
    let why = answer
        .failed_nodes
        .get("n")
        .or(answer.failed_and_unresolvable_nodes.get("n"));
    assert!(why.is_some(), "n is not refused with a reason: {answer:?}");
    election_b.abort();
}
