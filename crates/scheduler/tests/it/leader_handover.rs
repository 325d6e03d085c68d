//! The leader-handover window (issue 30): a Filter that started while its replica led but
//! whose decision was written only after the lease ran out is voided. Another replica may
//! have taken over before that write landed, and its first decisions may not have seen it;
//! kube-scheduler gets an error (it binds nothing on the decision and asks the new leader).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::ExtenderArgs;
use hami_scheduler::leader::{ElectionConfig, Leadership};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_written_after_the_lease_ran_out_is_voided() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#}}}))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}}}]}
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();

    let leadership = Arc::new(Leadership::elected());
    let election = tokio::spawn(hami_scheduler::leader::run(
        client.clone(),
        ElectionConfig {
            namespace: "kube-system".into(),
            name: "hami-scheduler".into(),
            identity: "replica-a".into(),
            lease_duration: Duration::from_secs(3),
            renew_interval: Duration::from_millis(300),
        },
        leadership.clone(),
    ));
    let scheduler = Scheduler::start(client.clone(), Settings::default(), leadership.clone());
    until("the replica leads", Duration::from_secs(5), || {
        scheduler.decides()
    })
    .await;
    // It stops renewing (its lease holds at most 2.4 s more), and the API server answers
    // slower than that: the decision's patch is written after the lease ran out.
    election.abort();
    api.faults().set_latency(Duration::from_secs(4));
    let args: ExtenderArgs =
        serde_json::from_value(json!({"pod": pod, "nodenames": ["n"]})).unwrap();
    let answer = scheduler.filter(args).await;
    api.faults().set_latency(Duration::ZERO);
    assert!(!leadership.is_leader());
    assert!(
        answer.error.contains("lost the leadership") && answer.nodenames.is_none(),
        "{answer:?}"
    );
    let uid = pod.metadata.uid.unwrap();
    assert!(
        scheduler.state().holding(&uid).is_none(),
        "the voided decision still holds its slice"
    );
}
