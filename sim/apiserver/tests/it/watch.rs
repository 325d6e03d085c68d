//! Watches through kube-rs: raw watch events, resume, 410 Expired, bookmarks, timeouts,
//! the `watcher`/reflector (including relist after 410 and streaming lists), and leader
//! election with kube-lease-manager.

use crate::common;

use std::time::Duration;

use common::{client, eventually, pod, start, start_with};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, ConfigMap, ObjectReference, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

async fn next_event<S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin>(
    s: &mut S,
) -> WatchEvent<ConfigMap> {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("event in time")
        .expect("stream open")
        .expect("no error")
}

#[tokio::test]
async fn raw_watch_events_resume_and_expire() {
    let server = start().await;
    let c = client(&server);
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    // resourceVersion "0": current objects first, as ADDED
    let mut s = cms
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(
        matches!(next_event(&mut s).await, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("before"))
    );
    let created = cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv_after_create = created.metadata.resource_version.clone().unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(matches!(next_event(&mut s).await, WatchEvent::Added(_)));
    assert!(
        matches!(next_event(&mut s).await, WatchEvent::Modified(o) if o.data.as_ref().unwrap()["k"] == "w")
    );
    let deleted_rv = match next_event(&mut s).await {
        WatchEvent::Deleted(o) => o.metadata.resource_version.unwrap(),
        e => panic!("{e:?}"),
    };
    assert_eq!(deleted_rv, server.resource_version().to_string());

    // resume after the create: the modification and the delete are replayed
    let mut resumed = cms
        .watch(&WatchParams::default(), &rv_after_create)
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        next_event(&mut resumed).await,
        WatchEvent::Modified(_)
    ));
    assert!(matches!(
        next_event(&mut resumed).await,
        WatchEvent::Deleted(_)
    ));

    // after the history is expired, resuming from an old version is 410 Expired
    server.faults().expire_watch_history();
    let mut expired = cms
        .watch(&WatchParams::default(), &rv_after_create)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut expired).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        e => panic!("{e:?}"),
    }
    assert!(expired.next().await.is_none(), "stream ends after the 410");

    // closing all watches ends open streams
    server.faults().close_all_watches();
    assert!(
        tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn bookmarks_and_timeouts() {
    let server = start_with(hami_apiserver::Config {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let c = client(&server);
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let rv = server.resource_version().to_string();
    let mut s = cms
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut s).await {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
        e => panic!("{e:?}"),
    }
    let t = std::time::Instant::now();
    while let Some(ev) = s.next().await {
        ev.unwrap();
    }
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "timeoutSeconds=2 ended the watch after {took:?}"
    );
}

#[tokio::test]
async fn watch_with_field_selector_sees_pods_enter_and_leave() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    let all: Api<Pod> = Api::all(c.clone());
    let rv = server.resource_version().to_string();
    let mut s = all
        .watch(&WatchParams::default().fields("spec.nodeName=n1"), &rv)
        .await
        .unwrap()
        .boxed();
    let binding = Binding {
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _: Status = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(ev, WatchEvent::Added(_)),
        "a pod bound to n1 enters the selection as ADDED: {ev:?}"
    );
}

#[tokio::test]
async fn reflector_relists_after_410() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("p0"))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<Pod>();
    let stream = watcher(Api::<Pod>::all(c.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // Errors (the injected 500, the 410) are retried by the watcher itself.
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.len(), 1);
    pods.create(&PostParams::default(), &pod("p1"))
        .await
        .unwrap();
    eventually("p1 reflected", async || reader.len() == 2).await;

    // Cut the watches and fail the re-watch once (the watcher backs off); meanwhile change
    // things and forget the history: the watcher's resume gets 410 and it must relist to
    // see p2 and the deletion of p0.
    server
        .faults()
        .fail_next(Some("watch"), Some("pods"), 1, 500);
    server.faults().close_all_watches();
    eventually("re-watch refused", async || {
        server
            .request_log()
            .iter()
            .any(|r| r.verb == "watch" && r.status == 500)
    })
    .await;
    pods.create(&PostParams::default(), &pod("p2"))
        .await
        .unwrap();
    pods.delete("p0", &DeleteParams::default()).await.unwrap();
    server.faults().expire_watch_history();
    eventually("relisted state", async || {
        let mut names: Vec<String> = reader
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        names == ["p1", "p2"]
    })
    .await;
    let log = server.request_log();
    let lists = log
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "pods")
        .count();
    assert!(lists >= 2, "expected a relist, saw {lists} list requests");
    assert!(log.iter().any(|r| r.verb == "watch" && r.status == 500));
    task.abort();
}

#[tokio::test]
async fn streaming_list_watcher() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for i in 0..3 {
        pods.create(&PostParams::default(), &pod(&format!("s{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store::<Pod>();
    let stream = watcher(
        Api::<Pod>::all(c.clone()),
        watcher::Config::default().streaming_lists(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // Errors (the injected 500, the 410) are retried by the watcher itself.
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.len(), 3);
    assert!(
        server
            .request_log()
            .iter()
            .any(|r| r.verb == "watch" && r.query.contains("sendInitialEvents=true"))
    );
    task.abort();
}

#[tokio::test]
async fn lease_leader_election() {
    use kube_lease_manager::LeaseManagerBuilder;
    let server = start().await;
    let c = client(&server);
    let a = LeaseManagerBuilder::new(c.clone(), "hami-scheduler")
        .with_namespace("kube-system")
        .with_identity("a")
        .with_duration(5)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let b = LeaseManagerBuilder::new(c.clone(), "hami-scheduler")
        .with_namespace("kube-system")
        .with_identity("b")
        .with_duration(5)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    assert!(
        a.changed().await.unwrap(),
        "a becomes leader of a free lease"
    );
    // b cannot take a held lease; give it a moment to try
    let b_try = tokio::time::timeout(Duration::from_millis(1500), b.changed()).await;
    assert!(
        b_try.is_err() || !b_try.unwrap().unwrap(),
        "b must not lead while a holds the lease"
    );
    let lease = server
        .get_object(
            "coordination.k8s.io/v1",
            "leases",
            "kube-system",
            "hami-scheduler",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    a.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), b.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(got, "b leads after a released");
    let lease = server
        .get_object(
            "coordination.k8s.io/v1",
            "leases",
            "kube-system",
            "hami-scheduler",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    assert!(lease["spec"]["leaseTransitions"].as_i64().unwrap() >= 1);
}

#[tokio::test]
async fn lease_takeover_after_holder_crash() {
    use kube_lease_manager::LeaseManagerBuilder;
    let server = start().await;
    let c = client(&server);
    let a = LeaseManagerBuilder::new(c.clone(), "takeover")
        .with_namespace("kube-system")
        .with_identity("a")
        .with_duration(2)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    assert!(a.changed().await.unwrap());
    drop(a); // "crash": no release, no renewal
    let b = LeaseManagerBuilder::new(c.clone(), "takeover")
        .with_namespace("kube-system")
        .with_identity("b")
        .with_duration(2)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    // b clears the expired lease (a strategic patch, dropping a's field ownership) and then
    // applies itself as holder without a field-manager conflict, as on a real server.
    let got = tokio::time::timeout(Duration::from_secs(15), b.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(got, "b takes over the expired lease");
    let lease = server
        .get_object(
            "coordination.k8s.io/v1",
            "leases",
            "kube-system",
            "takeover",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    let managers: Vec<&str> = lease["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(
        managers
            .iter()
            .all(|m| m.starts_with("kube-lease-manager-")),
        "{managers:?}"
    );
    let patches: Vec<u16> = server
        .request_log()
        .iter()
        .filter(|r| r.verb == "patch")
        .map(|r| r.status)
        .collect();
    assert!(
        patches.iter().all(|s| *s == 200),
        "no patch was refused: {patches:?}"
    );
}
