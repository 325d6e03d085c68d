//! The one node-lock client (plugin-core's `node_lock_client`, used by bind and by both
//! plugins) against the embedded API server: future-stamped locks are taken over, transient
//! errors and conflicts are retried with backoff, deadlines hold even when the server does
//! not answer, and the messages that reach kube-scheduler and Events carry no kube-rs debug
//! dumps (issue 17 items 12 and 14). Two binds of one pod at once both succeed and leave
//! the lock the pod's.

use crate::common;

use std::time::{Duration, Instant};

use common::{cluster, create_gpu_pod as create_pod, filter_args, start_scheduler};
use hami_plugin_core::node_lock_client::{
    LockError, NodeLockClient, Released, TakeOutcome, unix_now,
};
use hami_protocol::names::node as node_keys;
use hami_protocol::node_lock::{NodeLock, PodRef, TakeOverReason};
use hami_scheduler::extender::ExtenderBindingArgs;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// Takes the lock on `n` for `me` (held 60 s), trying for at most `within`.
async fn acquire_within(
    locks: &NodeLockClient,
    me: &PodRef,
    within: Duration,
) -> Result<TakeOutcome, LockError> {
    locks
        .acquire("n", me, Duration::from_secs(60), Instant::now() + within)
        .await
}

async fn set_lock(client: &Client, value: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: value}}})),
        )
        .await
        .unwrap();
}

async fn lock_value(client: &Client) -> Option<String> {
    Api::<Node>::all(client.clone())
        .get("n")
        .await
        .unwrap()
        .metadata
        .annotations
        .and_then(|a| a.get(node_keys::MUTEX_LOCK).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_stamped_lock_is_taken_over_not_waited_for() {
    let (_api, client) = cluster().await;
    create_pod(&client, "other").await;
    // Written by a peer whose clock runs 576 s ahead ("since -576s … expires after 60s").
    let future = NodeLock::new(unix_now() + 576, PodRef::new("default", "other"))
        .encode()
        .unwrap();
    set_lock(&client, &future).await;
    let locks = NodeLockClient::new(client.clone());
    let me = PodRef::new("default", "me");
    let started = Instant::now();
    let outcome = acquire_within(&locks, &me, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        outcome,
        TakeOutcome::TookOver {
            reason: TakeOverReason::FutureStamp,
            previous: future
        }
    );
    assert!(
        NodeLock::parse(&lock_value(&client).await.unwrap())
            .unwrap()
            .is_owned_by(&me)
    );
    // A lock a few seconds ahead (ordinary skew) is a live lock: waited for.
    let near = NodeLock::new(unix_now() + 5, PodRef::new("default", "other"))
        .encode()
        .unwrap();
    set_lock(&client, &near).await;
    let err = acquire_within(&locks, &me, Duration::from_millis(400))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    assert!(err.to_string().contains("locked by default/other"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_and_conflicts_are_retried_with_backoff() {
    let (api, client) = cluster().await;
    let locks = NodeLockClient::new(client.clone());
    let me = PodRef::new("default", "me");
    let faults = api.faults();
    // The node read fails twice (503) and the lock write conflicts twice.
    faults.fail_next(Some("get"), Some("nodes"), 2, 503);
    faults.fail_next(Some("patch"), Some("nodes"), 2, 409);
    api.clear_request_log();
    let outcome = acquire_within(&locks, &me, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(outcome, TakeOutcome::Taken);
    let patches: Vec<_> = api
        .request_log()
        .into_iter()
        .filter(|r| r.verb == "patch")
        .collect();
    assert_eq!(patches.len(), 3, "two conflicts, then the write");
    // Release: the same client, same retries.
    faults.fail_next(Some("get"), Some("nodes"), 2, 500);
    let released = locks
        .release("n", &me, Instant::now() + Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(released, Released::Released);
    assert_eq!(lock_value(&client).await, None);
    // A refusal that retrying cannot fix comes back at once, as one readable line.
    faults.fail_next(Some("patch"), Some("nodes"), 1, 403);
    let started = Instant::now();
    let err = acquire_within(&locks, &me, Duration::from_secs(10))
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(err.contains("403 Forbidden"), "{err}");
    assert!(
        !err.contains("Status {") && !err.contains("ApiError"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_hold_when_the_server_does_not_answer() {
    let (api, client) = cluster().await;
    let locks = NodeLockClient::new(client.clone());
    let me = PodRef::new("default", "me");
    api.faults().set_latency(Duration::from_secs(5));
    let started = Instant::now();
    let err = acquire_within(&locks, &me, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the 500 ms deadline held: {:?}",
        started.elapsed()
    );
    assert!(matches!(err, LockError::Deadline { .. }), "{err}");
    let started = Instant::now();
    let err = locks
        .release("n", &me, Instant::now() + Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert!(err.to_string().contains("deadline passed"), "{err}");
}

/// Bind's messages (the extender's answer to kube-scheduler and the BindingFailed Event)
/// are readable sentences, not kube-rs's `ApiError: … (Status { … })` dumps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_errors_carry_no_debug_dumps() {
    let (api, client) = cluster().await;
    let scheduler = start_scheduler(&client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scheduler.ready() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pod = create_pod(&client, "p").await;
    let decided = scheduler.filter(filter_args(&pod)).await;
    assert_eq!(decided.error, "");
    api.faults()
        .fail_next(Some("create"), Some("pods/binding"), 1, 409);
    let bound = scheduler
        .bind(ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "default".into(),
            pod_uid: pod.metadata.uid.clone().unwrap(),
            node: "n".into(),
        })
        .await;
    assert!(
        bound.error.contains("cannot bind pod default/p to n"),
        "{}",
        bound.error
    );
    assert!(
        bound.error.contains("409 Conflict") && !bound.error.contains("Status {"),
        "{}",
        bound.error
    );
    // The failed bind released the lock it took.
    assert_eq!(lock_value(&client).await, None);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let deadline = Instant::now() + Duration::from_secs(5);
    let note = loop {
        let found = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("BindingFailed"));
        if let Some(e) = found {
            break e.note.unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "no BindingFailed event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        note.contains("409 Conflict") && !note.contains("Status {"),
        "{note}"
    );
}

/// The plugins' commit (plugin-core's `pod_commit`) reports API failures as one readable
/// line too: kubelet shows it in the pod's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_commit_errors_carry_no_debug_dumps() {
    let (api, client) = cluster().await;
    create_pod(&client, "p").await;
    api.faults().fail_next(Some("patch"), Some("pods"), 1, 500);
    let err = hami_plugin_core::pod_commit::commit_allocation(
        &client,
        "n",
        &PodRef::new("default", "p"),
        serde_json::Map::new(),
        true,
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("500 InternalError") && !err.contains("Status {"),
        "{err}"
    );
}

/// Two binds of the same pod at once (a follower retrying a forwarded bind that timed out
/// while the leader was still carrying it out): both answer success, and the lock stays
/// the pod's for its device plugin, whichever of them wrote `pods/binding` (the other one's
/// write fails with "already assigned" and must not undo the first's lock). Repeated a few
/// times, as the interleaving differs from run to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_binds_of_one_pod_both_succeed_and_keep_the_lock() {
    let (_api, client) = cluster().await;
    let scheduler = start_scheduler(&client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scheduler.ready() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        let name = format!("p{i}");
        // A tenth of the CUs each: the earlier pods keep theirs, and all five fit.
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "100", "amd.com/gpucores": "10"}}}]}
        }))
        .unwrap();
        let pod = pods
            .create(&kube::api::PostParams::default(), &pod)
            .await
            .unwrap();
        let decided = scheduler.filter(filter_args(&pod)).await;
        // Placed (bind refuses a GPU pod without filter's decision).
        assert_eq!(
            (decided.error.as_str(), decided.nodenames),
            ("", Some(vec!["n".to_string()])),
            "{name}"
        );
        let args = ExtenderBindingArgs {
            pod_name: name.clone(),
            pod_namespace: "default".into(),
            pod_uid: pod.metadata.uid.clone().unwrap(),
            node: "n".into(),
        };
        let (a, b) = tokio::join!(scheduler.bind(args.clone()), scheduler.bind(args));
        assert_eq!((a.error.as_str(), b.error.as_str()), ("", ""), "{name}");
        let lock = lock_value(&client).await.expect("the lock is held");
        assert!(
            NodeLock::parse(&lock).is_ok_and(|l| l.is_owned_by(&PodRef::new("default", &name))),
            "{name}: {lock}"
        );
        let bound = pods.get(&name).await.unwrap();
        assert_eq!(
            bound.spec.and_then(|s| s.node_name).as_deref(),
            Some("n"),
            "{name}"
        );
        // The plugin's last step (the lock released), before the next pod.
        Api::<Node>::all(client.clone())
            .patch(
                "n",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: null}}})),
            )
            .await
            .unwrap();
    }
}

/// A bind waiting behind another pod's lock tries again as soon as the scheduler's node
/// informer sees the lock go (issue 28 item 4), not when its backoff (50 ms doubling to a
/// 1 s cap) runs out: the release is made right after an attempt whose next wait is at
/// least 500 ms, and the bind is done well before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_waiting_for_a_lock_goes_on_as_soon_as_it_is_released() {
    let (api, client) = cluster().await;
    let scheduler = start_scheduler(&client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scheduler.ready() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The holder exists, so its lock is waited for (not taken over).
    create_pod(&client, "other").await;
    let pod = create_pod(&client, "p").await;
    let decided = scheduler.filter(filter_args(&pod)).await;
    assert_eq!(decided.error, "");
    let held = NodeLock::new(unix_now(), PodRef::new("default", "other"))
        .encode()
        .unwrap();
    set_lock(&client, &held).await;
    api.clear_request_log();
    let bind = tokio::spawn({
        let scheduler = scheduler.clone();
        let args = ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "default".into(),
            pod_uid: pod.metadata.uid.clone().unwrap(),
            node: "n".into(),
        };
        async move { scheduler.bind(args).await }
    });
    // Each attempt ends with a GET of the lock's owner; after the sixth the backoff window
    // is at its 1 s cap, so the wait that follows is at least 500 ms.
    let owner_checks = || {
        api.request_log()
            .iter()
            .filter(|r| {
                r.verb == "get" && r.resource == "pods" && r.name.as_deref() == Some("other")
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while owner_checks() < 6 {
        assert!(Instant::now() < deadline, "the bind stopped trying");
        assert!(
            !bind.is_finished(),
            "the bind ended while the lock was held"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let released = Instant::now();
    Api::<Node>::all(client.clone())
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {node_keys::MUTEX_LOCK: null}}})),
        )
        .await
        .unwrap();
    let bound = tokio::time::timeout(Duration::from_secs(20), bind)
        .await
        .expect("the bind never ended")
        .unwrap();
    let took = released.elapsed();
    assert_eq!(bound.error, "");
    assert!(
        took < Duration::from_millis(400),
        "the bind went on {took:?} after the release (its backoff wait was at least 500 ms)"
    );
    let lock = lock_value(&client).await.expect("the bind took the lock");
    assert!(NodeLock::parse(&lock).is_ok_and(|l| l.is_owned_by(&PodRef::new("default", "p"))));
}
