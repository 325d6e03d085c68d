//! kube-rs against the embedded server: CRUD, selectors, paging, optimistic concurrency,
//! every patch type, finalizers, binding, events, faults and bad input.

use crate::common;

use common::{client, pod, start};
use k8s_openapi::api::core::v1::{Binding, ConfigMap, Namespace, Node, ObjectReference, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use serde_json::json;

fn api_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn crud_and_optimistic_concurrency() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.uid.as_ref().unwrap().len(), 36);
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(
        api_code(
            pods.create(&PostParams::default(), &pod("a"))
                .await
                .unwrap_err()
        ),
        409
    );

    let got = pods.get("a").await.unwrap();
    assert_eq!(got.metadata.resource_version, meta.resource_version);
    assert_eq!(api_code(pods.get("missing").await.unwrap_err()), 404);

    // replace with the current resourceVersion works, with a stale one is a Conflict
    let mut fresh = got.clone();
    fresh
        .metadata
        .labels
        .get_or_insert_default()
        .insert("v".into(), "2".into());
    let replaced = pods
        .replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        got.metadata.resource_version
    );
    match pods
        .replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
            assert!(
                s.message.contains("the object has been modified"),
                "{}",
                s.message
            );
        }
        e => panic!("{e:?}"),
    }

    // generateName
    let mut g = pod("");
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let gen_pod = pods.create(&PostParams::default(), &g).await.unwrap();
    assert!(gen_pod.metadata.name.unwrap().starts_with("gen-"));

    // namespaces: a missing one is 404 on create; new ones work
    let other: Api<Pod> = Api::namespaced(c.clone(), "nowhere");
    match other
        .create(&PostParams::default(), &pod("x"))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.message.as_str()),
            (404, "namespaces \"nowhere\" not found")
        ),
        e => panic!("{e:?}"),
    }
    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    let team: Api<Pod> = Api::namespaced(c.clone(), "team");
    team.create(&PostParams::default(), &pod("x"))
        .await
        .unwrap();
    assert_eq!(
        Api::<Pod>::all(c.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );

    // dryRun: answered, not stored
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let d = pods.create(&dry, &pod("dry")).await.unwrap();
    assert_eq!(d.metadata.name.as_deref(), Some("dry"));
    assert_eq!(api_code(pods.get("dry").await.unwrap_err()), 404);

    // delete returns the object; afterwards 404
    let deleted = pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_left());
    assert_eq!(api_code(pods.get("a").await.unwrap_err()), 404);
    // deleting a namespace takes its objects with it
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_code(team.get("x").await.unwrap_err()), 404);
}

#[tokio::test]
async fn selectors_and_paging() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for i in 0..7 {
        let mut p = pod(&format!("p{i}"));
        let labels = p.metadata.labels.get_or_insert_default();
        labels.insert(
            "tier".into(),
            if i % 2 == 0 { "even" } else { "odd" }.into(),
        );
        if i < 3 {
            labels.insert("gpu".into(), "yes".into());
        }
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    let q = async |sel: &str| names(pods.list(&ListParams::default().labels(sel)).await.unwrap());
    assert_eq!(q("tier=even").await, ["p0", "p2", "p4", "p6"]);
    assert_eq!(q("tier!=even").await, ["p1", "p3", "p5"]);
    assert_eq!(q("tier in (odd),gpu").await, ["p1"]);
    assert_eq!(q("tier notin (odd),!gpu").await, ["p4", "p6"]);
    assert_eq!(q("gpu").await.len(), 3);

    // bind two pods to nodes, then select by spec.nodeName, status.phase, metadata.name
    let binding = |node: &str| -> Binding {
        Binding {
            target: ObjectReference {
                kind: Some("Node".into()),
                name: Some(node.into()),
                api_version: Some("v1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    };
    let _: Status = pods
        .create_subresource("binding", "p1", &PostParams::default(), &binding("n1"))
        .await
        .unwrap();
    let _: Status = pods
        .create_subresource("binding", "p2", &PostParams::default(), &binding("n2"))
        .await
        .unwrap();
    let again = pods
        .create_subresource::<Binding, Status>(
            "binding",
            "p1",
            &PostParams::default(),
            &binding("n2"),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(again), 409);
    let f = async |sel: &str| {
        names(
            Api::<Pod>::all(c.clone())
                .list(&ListParams::default().fields(sel))
                .await
                .unwrap(),
        )
    };
    assert_eq!(f("spec.nodeName=n1").await, ["p1"]);
    assert_eq!(f("spec.nodeName=").await.len(), 5);
    assert_eq!(f("status.phase=Pending,metadata.name=p3").await, ["p3"]);
    assert_eq!(f("metadata.namespace=kube-system").await.len(), 0);
    let bad = Api::<Pod>::all(c.clone())
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await
        .unwrap_err();
    assert_eq!(api_code(bad), 400);
    let scheduled = pods.get("p1").await.unwrap();
    assert_eq!(scheduled.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert!(
        scheduled
            .status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );

    // limit / continue
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3);
    loop {
        let page = pods.list(&lp).await.unwrap();
        assert!(page.items.len() <= 3);
        let cont = page.metadata.continue_.clone();
        seen.extend(names(page));
        match cont {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(seen, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
}

#[tokio::test]
async fn every_patch_type() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    let rv = p.metadata.resource_version.clone().unwrap();
    let pp = PatchParams::default();

    // merge patch, with a resourceVersion precondition
    let merged = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv, "annotations": {"a": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.metadata.annotations.unwrap()["a"], "1");
    let stale = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv, "annotations": {"a": "2"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(stale), 409);

    // JSON patch with test
    let cur = merged.metadata.resource_version.unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": cur},
        {"op": "add", "path": "/metadata/labels/j", "value": "x"}
    ]))
    .unwrap();
    let jp = pods
        .patch("p", &pp, &Patch::Json::<()>(ops.clone()))
        .await
        .unwrap();
    assert_eq!(jp.metadata.labels.unwrap()["j"], "x");
    assert_eq!(
        api_code(
            pods.patch("p", &pp, &Patch::Json::<()>(ops))
                .await
                .unwrap_err()
        ),
        422
    );

    // strategic merge: containers merge by name (the rest of the container is kept)
    let sp = pods
        .patch(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}}),
            ),
        )
        .await
        .unwrap();
    let spec = sp.spec.as_ref().unwrap();
    assert_eq!(spec.containers.len(), 1);
    assert_eq!(spec.containers[0].image.as_deref(), Some("busybox:1.37"));
    assert_eq!(spec.containers[0].env.as_ref().unwrap()[0].name, "A");
    // changing an immutable pod field (env, restartPolicy) is refused, as Kubernetes does
    let env =
        json!({"spec": {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]}]}});
    assert_eq!(
        api_code(
            pods.patch("p", &pp, &Patch::Strategic(env))
                .await
                .unwrap_err()
        ),
        422
    );
    let imm = pods
        .patch(
            "p",
            &pp,
            &Patch::Strategic(json!({"spec": {"restartPolicy": "Never"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(imm), 422);
    // strategic merge on a configmap-free list-merge path: node taints merge by key
    let nodes: Api<Node> = Api::all(c.clone());
    nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "t1"}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})).unwrap()).await.unwrap();
    let t = nodes
        .patch(
            "t1",
            &pp,
            &Patch::Strategic(json!({"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(t.spec.unwrap().taints.unwrap().len(), 2);

    // server-side apply: creates, prunes what the manager stopped applying, keeps what
    // others own, conflicts with other managers unless forced
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let ap = PatchParams::apply("test-manager");
    let cfg = |data: serde_json::Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": data});
    let created = cms
        .patch("cfg", &ap, &Patch::Apply(cfg(json!({"a": "1"}))))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone();
    let same = cms
        .patch("cfg", &ap, &Patch::Apply(cfg(json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version, rv,
        "re-applying the same configuration is a no-op"
    );
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"edited": "x"}})),
    )
    .await
    .unwrap();
    let applied = cms
        .patch("cfg", &ap, &Patch::Apply(cfg(json!({"b": "2"}))))
        .await
        .unwrap();
    let data = applied.data.unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["b", "edited"],
        "a was pruned, the merge-patched field kept"
    );
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|m| (m.manager.unwrap(), m.operation.unwrap()))
        .collect();
    assert!(
        managers.contains(&("test-manager".into(), "Apply".into())),
        "{managers:?}"
    );
    let other = PatchParams::apply("other-manager");
    match cms
        .patch("cfg", &other, &Patch::Apply(cfg(json!({"b": "3"}))))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert!(
                s.message
                    .contains("conflict with \"test-manager\": .data.b"),
                "{}",
                s.message
            );
        }
        e => panic!("{e:?}"),
    }
    let forced = cms
        .patch("cfg", &other.force(), &Patch::Apply(cfg(json!({"b": "3"}))))
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["b"], "3");
    let no_manager = cms
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Apply(cfg(json!({"b": "4"}))),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(no_manager), 422);

    // status subresource
    let st = pods
        .patch_status(
            "p",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().phase.as_deref(), Some("Running"));
    let nodes: Api<Node> = Api::all(c.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Merge(json!({"status": {"capacity": {"hami.io/vgpu": "10"}}})),
        )
        .await
        .unwrap();
    assert_eq!(n.status.unwrap().capacity.unwrap()["hami.io/vgpu"].0, "10");
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let server = start().await;
    let c = client(&server);
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "f", "finalizers": ["hami.io/cleanup"]}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let d = cms.delete("f", &DeleteParams::default()).await.unwrap();
    let obj = d.left().expect("object returned while finalizers remain");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert!(cms.get("f").await.is_ok());
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_code(cms.get("f").await.unwrap_err()), 404);
}

#[tokio::test]
async fn event_recorder_publishes_and_patches_series() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    let recorder = Recorder::new(c.clone(), Reporter::from("hami-scheduler"));
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: p.metadata.name.clone(),
        namespace: Some("default".into()),
        uid: p.metadata.uid.clone(),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "Scheduled".into(),
        note: Some("bound to n1".into()),
        action: "Binding".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("Scheduled"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    let log = server.request_log();
    assert!(log.iter().any(|r| r.verb == "create"
        && r.resource == "events"
        && r.path.starts_with("/apis/events.k8s.io/v1/")));
    assert!(
        log.iter()
            .any(|r| r.verb == "patch" && r.resource == "events" && r.status == 200)
    );
}

#[tokio::test]
async fn injected_faults_and_request_log() {
    let server = start().await;
    let c = client(&server);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    server
        .faults()
        .fail_next(Some("patch"), Some("pods"), 2, 500);
    let pp = PatchParams::default();
    let patch = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    assert_eq!(
        api_code(pods.patch("p", &pp, &patch).await.unwrap_err()),
        500
    );
    assert_eq!(
        api_code(pods.patch("p", &pp, &patch).await.unwrap_err()),
        500
    );
    pods.patch("p", &pp, &patch).await.unwrap();
    // kube-rs retries 429 by itself: the log shows the 429, the caller sees success
    server.faults().fail_next(None, Some("pods"), 1, 429);
    pods.get("p").await.unwrap();
    let gets: Vec<u16> = server
        .request_log()
        .iter()
        .filter(|r| r.verb == "get")
        .map(|r| r.status)
        .collect();
    assert_eq!(gets, [429, 200]);
    server.faults().fail_next(Some("get"), None, 1, 403);
    assert_eq!(api_code(pods.get("p").await.unwrap_err()), 403);
    server
        .faults()
        .set_latency(std::time::Duration::from_millis(150));
    let t = std::time::Instant::now();
    pods.get("p").await.unwrap();
    assert!(t.elapsed() >= std::time::Duration::from_millis(150));
    server.faults().clear();
    let patches: Vec<_> = server
        .request_log()
        .into_iter()
        .filter(|r| r.verb == "patch")
        .collect();
    assert_eq!(
        patches.iter().map(|r| r.status).collect::<Vec<_>>(),
        [500, 500, 200]
    );
    assert_eq!(
        patches[2].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert!(patches[2].body.contains("\"x\":\"y\""));
}

/// Raw requests for inputs kube-rs would never send.
async fn raw(
    c: &kube::Client,
    method: &str,
    uri: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ct)
        .body(body)
        .unwrap();
    match c.request::<serde_json::Value>(req).await {
        Ok(v) => (200, v),
        Err(kube::Error::Api(s)) => (s.code, serde_json::to_value(&*s).unwrap()),
        Err(e) => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn bad_input_gets_kubernetes_statuses() {
    let server = start().await;
    let c = client(&server);
    let base = "/api/v1/namespaces/default/configmaps";
    let j = "application/json";
    assert_eq!(raw(&c, "POST", base, j, b"{not json".to_vec()).await.0, 400);
    let wrong_kind = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}});
    assert_eq!(
        raw(
            &c,
            "POST",
            base,
            j,
            serde_json::to_vec(&wrong_kind).unwrap()
        )
        .await
        .0,
        400
    );
    let wrong_version = json!({"apiVersion": "v2", "kind": "ConfigMap", "metadata": {"name": "x"}});
    assert_eq!(
        raw(
            &c,
            "POST",
            base,
            j,
            serde_json::to_vec(&wrong_version).unwrap()
        )
        .await
        .0,
        400
    );
    let bad_name =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_DNS"}});
    let (code, status) = raw(&c, "POST", base, j, serde_json::to_vec(&bad_name).unwrap()).await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    let huge = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"a": "x".repeat(3 * 1024 * 1024)}});
    assert_eq!(
        raw(&c, "POST", base, j, serde_json::to_vec(&huge).unwrap())
            .await
            .0,
        413
    );
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok"}});
    assert_eq!(
        raw(&c, "POST", base, j, serde_json::to_vec(&ok).unwrap())
            .await
            .0,
        200
    );
    assert_eq!(
        raw(
            &c,
            "PATCH",
            &format!("{base}/ok"),
            "text/plain",
            b"{}".to_vec()
        )
        .await
        .0,
        415
    );
    assert_eq!(
        raw(
            &c,
            "PATCH",
            &format!("{base}/ok"),
            "application/merge-patch+json",
            b"[1,".to_vec()
        )
        .await
        .0,
        400
    );
    assert_eq!(
        raw(
            &c,
            "PATCH",
            &format!("{base}/ok"),
            "application/json-patch+json",
            b"{\"op\":1}".to_vec()
        )
        .await
        .0,
        400
    );
    assert_eq!(
        raw(&c, "GET", "/api/v1/namespaces/default/widgets", j, vec![])
            .await
            .0,
        404
    );
    // nothing was stored but "ok", and the server still serves
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let names: Vec<_> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["ok"]);
}

#[tokio::test]
async fn discovery_serves_kube_discovery() {
    let server = start().await;
    let c = client(&server);
    let v = c.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
    let discovery = kube::discovery::Discovery::new(c.clone())
        .run()
        .await
        .unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "coordination.k8s.io",
        "events.k8s.io",
        "admissionregistration.k8s.io",
    ] {
        assert!(groups.iter().any(|x| x == g), "{g} missing from {groups:?}");
    }
    let (ar, caps) = discovery
        .resolve_gvk(&kube::core::GroupVersionKind::gvk("", "v1", "Pod"))
        .unwrap();
    assert_eq!(ar.plural, "pods");
    assert!(caps.subresources.iter().any(|(s, _)| s.plural == "binding"));
}

/// kube-rs records `events.k8s.io/v1` Events; kubectl reads core `v1` ones. A real server
/// shows one event through both APIs, and so does this one.
#[tokio::test]
async fn recorder_events_show_as_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = common::start().await;
    let client = common::client(&server);
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), "default");
    let pod = pods
        .create(&Default::default(), &common::pod("evented"))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "hami-scheduler".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "FilteringFailed".into(),
        note: Some("no available node".into()),
        action: "Filtering".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &kube::Resource::object_ref(&pod, &()))
        .await
        .unwrap();
    let core: kube::Api<CoreEvent> = kube::Api::namespaced(client, "default");
    let list = core
        .list(&kube::api::ListParams::default().fields("involvedObject.name=evented"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1, "{list:?}");
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("FilteringFailed"));
    assert_eq!(e.message.as_deref(), Some("no available node"));
    assert_eq!(
        e.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("hami-scheduler")
    );
}
