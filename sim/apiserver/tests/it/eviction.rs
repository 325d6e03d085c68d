//! `pods/eviction` (policy/v1 Eviction) against PodDisruptionBudgets: allowed (201, the pod
//! deleted, the budget's disruptionsAllowed spent), refused (429 with a `DisruptionBudget`
//! cause, the pod kept), unknown pod (404), two budgets (500), pods that skip the budget
//! (Pending), a precondition of the Eviction's deleteOptions, and kube-rs's `evict`.

use kube::api::{Api, EvictParams};
use serde_json::{Value, json};

use crate::common::{http_json, start};

async fn put_status(server: &hami_apiserver::RunningApiServer, path: &str, obj: Value) {
    let (code, body) = http_json(
        server,
        "PUT",
        &format!("{path}/status"),
        "application/json",
        &obj,
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

async fn delete(server: &hami_apiserver::RunningApiServer, path: &str) {
    let (code, body) = http_json(server, "DELETE", path, "application/json", &json!({})).await;
    assert_eq!(code, 200, "{body}");
}

const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";

async fn running_pod(server: &hami_apiserver::RunningApiServer, name: &str, app: &str) {
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({"metadata": {"name": name, "labels": {"app": app}},
                   "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap();
    let mut pod = server.get_object("v1", "pods", "default", name).unwrap();
    pod["status"] = json!({"phase": "Running"});
    put_status(
        server,
        &format!("/api/v1/namespaces/default/pods/{name}"),
        pod,
    )
    .await;
}

/// A budget selecting `selector`, with `allowed` disruptions in its status (this server has
/// no disruption controller: the status is written as a client would).
async fn budget(
    server: &hami_apiserver::RunningApiServer,
    name: &str,
    selector: Value,
    allowed: i64,
) {
    server
        .create_object(
            "policy/v1",
            "poddisruptionbudgets",
            Some("default"),
            json!({"metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": selector}}),
        )
        .unwrap();
    let mut b = server
        .get_object("policy/v1", "poddisruptionbudgets", "default", name)
        .unwrap();
    b["status"] = json!({"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 2 - allowed, "expectedPods": 2});
    put_status(server, &format!("{PDBS}/{name}"), b).await;
}

async fn evict(server: &hami_apiserver::RunningApiServer, pod: &str, body: Value) -> (u16, Value) {
    http_json(
        server,
        "POST",
        &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
        "application/json",
        &body,
    )
    .await
}

fn eviction(pod: &str) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "default"}})
}

#[tokio::test]
async fn a_budget_with_room_allows_one_eviction_then_refuses_the_next() {
    let server = start().await;
    running_pod(&server, "a", "web").await;
    running_pod(&server, "b", "web").await;
    running_pod(&server, "other", "db").await;
    budget(
        &server,
        "web-pdb",
        json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
        1,
    )
    .await;
    let (code, body) = evict(&server, "a", eviction("a")).await;
    assert_eq!(code, 201, "{body}");
    assert!(server.get_object("v1", "pods", "default", "a").is_none());
    let b = server
        .get_object("policy/v1", "poddisruptionbudgets", "default", "web-pdb")
        .unwrap();
    assert_eq!(b["status"]["disruptionsAllowed"], 0);
    assert!(b["status"]["disruptedPods"]["a"].is_string(), "{b}");

    let (code, body) = evict(&server, "b", eviction("b")).await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["reason"], "TooManyRequests");
    let cause = &body["details"]["causes"][0];
    assert_eq!(cause["reason"], "DisruptionBudget");
    assert!(
        cause["message"].as_str().unwrap().contains("web-pdb"),
        "{cause}"
    );
    assert!(server.get_object("v1", "pods", "default", "b").is_some());

    // A pod no budget selects goes.
    let (code, _) = evict(&server, "other", eviction("other")).await;
    assert_eq!(code, 201);
    assert!(
        server
            .get_object("v1", "pods", "default", "other")
            .is_none()
    );
}

#[tokio::test]
async fn unknown_pods_two_budgets_pending_pods_and_preconditions() {
    let server = start().await;
    let (code, body) = evict(&server, "ghost", eviction("ghost")).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["reason"], "NotFound");

    running_pod(&server, "x", "web").await;
    let (code, body) = evict(&server, "x", eviction("y")).await;
    assert_eq!(code, 400, "{body}");

    budget(&server, "p1", json!({"matchLabels": {"app": "web"}}), 1).await;
    budget(&server, "p2", json!({}), 1).await;
    let (code, body) = evict(&server, "x", eviction("x")).await;
    assert_eq!(code, 500, "{body}");
    assert!(body["message"].as_str().unwrap().contains("more than one"));
    assert!(server.get_object("v1", "pods", "default", "x").is_some());

    let mut ev = eviction("x");
    ev["deleteOptions"] = json!({"preconditions": {"uid": "not-the-uid"}});
    delete(&server, &format!("{PDBS}/p2")).await;
    let (code, body) = evict(&server, "x", ev).await;
    assert_eq!(code, 409, "{body}");
    assert!(server.get_object("v1", "pods", "default", "x").is_some());

    // A Pending pod skips its budget, even one with no room.
    server
        .create_object(
            "v1",
            "pods",
            Some("default"),
            json!({"metadata": {"name": "pend", "labels": {"app": "web"}},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap();
    delete(&server, &format!("{PDBS}/p1")).await;
    budget(
        &server,
        "none-left",
        json!({"matchLabels": {"app": "web"}}),
        0,
    )
    .await;
    let (code, body) = evict(&server, "pend", eviction("pend")).await;
    assert_eq!(code, 201, "{body}");
    let (code, _) = evict(&server, "x", eviction("x")).await;
    assert_eq!(code, 429);
}

#[tokio::test]
async fn kube_rs_evict_reads_the_refusal_as_429() {
    let server = start().await;
    running_pod(&server, "k", "web").await;
    budget(&server, "full", json!({"matchLabels": {"app": "web"}}), 0).await;
    // kube-rs retries a 429 by default (15 times, backing off up to 1000 s); an evicting
    // client that bounds its own wait turns that off.
    let mut cfg = kube::Config::new(server.url().parse().unwrap());
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "default");
    match pods.evict("k", &EvictParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("expected a 429, got {other:?}"),
    }
    delete(&server, &format!("{PDBS}/full")).await;
    pods.evict("k", &EvictParams::default()).await.unwrap();
    assert!(server.get_object("v1", "pods", "default", "k").is_none());
}
