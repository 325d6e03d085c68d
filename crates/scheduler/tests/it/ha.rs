//! Two replicas with leader election on one embedded API server: the leader is killed
//! while a bind waits for a busy node lock; the other replica takes over, the pod is
//! filtered and bound again, and no GPU is double-booked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hami_apiserver::{ApiServer, Config};
use hami_plugin_core::node_lock_client::unix_now;
use hami_protocol::names::node as node_keys;
use hami_protocol::node_lock::{NodeLock, PodRef};
use hami_scheduler::config::Settings;
use hami_scheduler::extender::{ExtenderArgs, ExtenderBindingArgs};
use hami_scheduler::leader::{ElectionConfig, Leadership};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;

struct Replica {
    scheduler: Arc<Scheduler>,
    election: JoinHandle<()>,
}

fn replica(client: &Client, identity: &str, settings: &Settings) -> Replica {
    let leadership = Arc::new(Leadership::elected());
    let config = ElectionConfig {
        namespace: "kube-system".into(),
        name: "hami-scheduler".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_interval: Duration::from_millis(300),
    };
    let election = tokio::spawn(hami_scheduler::leader::run(
        client.clone(),
        config,
        leadership.clone(),
    ));
    Replica {
        scheduler: Scheduler::start(client.clone(), settings.clone(), leadership),
        election,
    }
}

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create_pod(client: &Client, name: &str, cores: u32) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": cores.to_string()}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

fn filter_args(pod: &Pod) -> ExtenderArgs {
    serde_json::from_value(json!({"pod": pod, "nodenames": ["n"]})).unwrap()
}

fn bind_args(pod: &Pod) -> ExtenderBindingArgs {
    ExtenderBindingArgs {
        pod_name: pod.metadata.name.clone().unwrap(),
        pod_namespace: "default".into(),
        pod_uid: pod.metadata.uid.clone().unwrap(),
        node: "n".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_during_bind_no_double_booking() {
    let api = ApiServer::start(Config::default()).await.unwrap();
    let client = Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G","count":10,"devmem":1000,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#}}}))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let settings = Settings {
        node_lock_expiry: Duration::from_secs(2),
        bind_lock_wait: Duration::from_secs(10),
        ..Settings::default()
    };

    let a = replica(&client, "replica-a", &settings);
    until("replica a leads", Duration::from_secs(10), || {
        a.scheduler.decides()
    })
    .await;
    let b = replica(&client, "replica-b", &settings);
    until("replica b synced", Duration::from_secs(5), || {
        b.scheduler.synced()
    })
    .await;
    // b has read the Lease and found a holding it (it tried and deferred, not yet tried).
    until(
        "replica b sees replica a's lease",
        Duration::from_secs(5),
        || b.scheduler.leader.holder().as_deref() == Some("replica-a"),
    )
    .await;
    assert!(
        a.scheduler.leader.is_leader() && !b.scheduler.leader.is_leader(),
        "exactly one leader"
    );
    // Readiness is not leadership (issue 13 item 6): the follower is Ready too, so a
    // rolling update's new pod becomes Ready while the old one still leads, and the
    // webhook Service keeps endpoints across a handover.
    assert!(b.scheduler.ready(), "{:?}", b.scheduler.view_problem());

    // A follower refuses to decide.
    let p1 = create_pod(&client, "p1", 60).await;
    let refused = b.scheduler.filter(filter_args(&p1)).await;
    assert!(
        refused.error.contains("not the leader"),
        "{}",
        refused.error
    );

    // Another pod holds the node lock, so the leader's bind of p1 will wait.
    create_pod(&client, "blocker", 1).await;
    let lock = NodeLock::new(unix_now(), PodRef::new("default", "blocker"))
        .encode()
        .unwrap();
    Api::<Node>::all(client.clone())
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: lock}}})),
        )
        .await
        .unwrap();

    let decided = a.scheduler.filter(filter_args(&p1)).await;
    assert_eq!(
        decided.nodenames,
        Some(vec!["n".to_string()]),
        "{}",
        decided.error
    );
    let a_sched = a.scheduler.clone();
    let p1_bind = bind_args(&p1);
    api.clear_request_log();
    let bind = tokio::spawn(async move { a_sched.bind(p1_bind).await });
    // The bind is under way: it has read node n to take the node lock (held by the blocker).
    until(
        "the leader's bind reads the node lock",
        Duration::from_secs(5),
        || {
            api.request_log()
                .iter()
                .any(|r| r.verb == "get" && r.resource == "nodes" && r.name.as_deref() == Some("n"))
        },
    )
    .await;
    // Kill the leader: its bind and its lease renewals stop.
    bind.abort();
    a.election.abort();

    until("replica b takes over", Duration::from_secs(15), || {
        b.scheduler.decides()
    })
    .await;
    assert!(
        !a.scheduler.leader.is_leader(),
        "the dead leader's leadership lapsed"
    );
    let stale = a.scheduler.filter(filter_args(&p1)).await;
    assert!(
        stale.error.contains("not the leader"),
        "a lapsed leader never decides: {}",
        stale.error
    );

    // kube-scheduler retries p1 against the new leader.
    let again = b.scheduler.filter(filter_args(&p1)).await;
    assert_eq!(
        again.nodenames,
        Some(vec!["n".to_string()]),
        "{}",
        again.error
    );
    let bound = b.scheduler.bind(bind_args(&p1)).await;
    assert_eq!(
        bound.error, "",
        "the blocker's lock expired and was taken over"
    );
    let p1_now = Api::<Pod>::namespaced(client.clone(), "default")
        .get("p1")
        .await
        .unwrap();
    assert_eq!(p1_now.spec.unwrap().node_name.as_deref(), Some("n"));

    // p1 holds 60 of 100 CUs: another 60 % pod must not fit on either replica's view.
    let p2 = create_pod(&client, "p2", 60).await;
    let refused = b.scheduler.filter(filter_args(&p2)).await;
    assert_eq!(refused.nodenames, None);
    assert_eq!(
        refused.failed_nodes["n"],
        "container c: 1/1 CardInsufficientCore"
    );
    let used = b.scheduler.state().node("n").unwrap().usage[0];
    assert_eq!(used.cores, 60, "p1 counted once");
    b.election.abort();
}
