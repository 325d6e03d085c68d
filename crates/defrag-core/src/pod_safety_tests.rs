//! The pod-safety rule over real Pod and PodDisruptionBudget objects (as the API server
//! serves them), and the cluster it builds over the scheduler's own state.

use std::collections::HashMap;

use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::extender::{FilterConfig, decide_filter};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};

use super::*;

const NOW: i64 = 1_800_000_000;

fn pod(extra: Value) -> Pod {
    let mut v = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
        "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c"}]}});
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn pdb(
    namespace: &str,
    name: &str,
    selector: Option<Value>,
    allowed: Option<i32>,
) -> PodDisruptionBudget {
    let mut v = json!({"metadata": {"name": name, "namespace": namespace}, "spec": {}});
    if let Some(s) = selector {
        v["spec"]["selector"] = s;
    }
    if let Some(a) = allowed {
        v["status"] = json!({"disruptionsAllowed": a, "currentHealthy": 1, "desiredHealthy": 1,
            "expectedPods": 1});
    }
    serde_json::from_value(v).unwrap()
}

fn web() -> Option<Value> {
    Some(json!({"matchLabels": {"app": "web"}}))
}

fn owned(uid: &str) -> Value {
    json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "web-1", "uid": uid, "controller": true}]}})
}

#[test]
fn the_covering_budget_is_the_tightest_matching_one_in_the_pods_namespace() {
    let p = pod(json!({}));
    assert_eq!(covering_pdb(&p, &[]), None);
    // Another namespace, another selector, no selector: none covers it.
    let others = [
        pdb("other", "a", web(), Some(3)),
        pdb(
            "ns",
            "b",
            Some(json!({"matchLabels": {"app": "db"}})),
            Some(3),
        ),
        pdb("ns", "c", None, Some(3)),
    ];
    assert_eq!(covering_pdb(&p, &others), None);
    let mut all = others.to_vec();
    all.push(pdb("ns", "loose", web(), Some(2)));
    all.push(pdb(
        "ns",
        "tight",
        Some(json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]})),
        Some(1),
    ));
    assert_eq!(
        covering_pdb(&p, &all),
        Some(Pdb {
            name: "ns/tight".into(),
            disruptions_allowed: 1
        })
    );
    // No status yet (the disruption controller has not counted): it allows none.
    let unset = [pdb("ns", "new", web(), None)];
    assert_eq!(covering_pdb(&p, &unset).unwrap().disruptions_allowed, 0);
    // A pod without a namespace is in `default`.
    let mut bare = pod(json!({}));
    bare.metadata.namespace = None;
    let d = [pdb("default", "d", web(), Some(1))];
    assert_eq!(covering_pdb(&bare, &d).unwrap().name, "default/d");
}

#[test]
fn replicas_count_the_controllers_pods_not_being_deleted() {
    let mut pods = vec![
        pod(owned("rs")),
        pod(owned("rs")),
        pod(owned("rs")),
        pod(json!({})),
    ];
    pods[2].metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2027-01-15T08:00:00Z")).unwrap());
    let replicas = replicas_by_controller(&pods);
    assert_eq!(replicas, HashMap::from([("rs".to_string(), 2)]));
    let s = safety(&pods[0], &replicas, &[], NOW);
    assert_eq!(
        s.owner,
        Some(Owner {
            kind: "ReplicaSet".into(),
            name: "web-1".into(),
            replicas: 2
        })
    );
    // An owner reference that is not the controller makes no owner.
    let mut loose = pod(owned("x"));
    loose.metadata.owner_references.as_mut().unwrap()[0].controller = None;
    assert_eq!(safety(&loose, &replicas, &[], NOW).owner, None);
    // A controller none of the listed pods counts: one replica.
    let alone = pod(owned("elsewhere"));
    assert_eq!(
        safety(&alone, &replicas, &[], NOW).owner.unwrap().replicas,
        1
    );
}

#[test]
fn static_critical_gang_and_age_are_read_from_the_pod() {
    let none = HashMap::new();
    let plain = safety(&pod(json!({})), &none, &[], NOW);
    assert!(!plain.static_pod && !plain.critical && !plain.gang_member);
    // No time stamped (a scenario's pod): old enough.
    assert_eq!(plain.age_seconds, u64::MAX);
    let s = |extra: Value| safety(&pod(extra), &none, &[], NOW);
    assert!(
        s(json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})).static_pod
    );
    assert!(
        s(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node",
            "name": "n", "uid": "n"}]}})
        )
        .static_pod
    );
    assert!(s(json!({"spec": {"priority": 2_000_000_000}})).critical);
    assert!(!s(json!({"spec": {"priority": 1_999_999_999}})).critical);
    assert!(s(json!({"spec": {"priorityClassName": "system-node-critical"}})).critical);
    for key in GANG_KEYS {
        assert!(
            s(json!({"metadata": {"labels": {key: "g"}}})).gang_member,
            "{key}"
        );
        assert!(
            s(json!({"metadata": {"annotations": {key: "g"}}})).gang_member,
            "{key}"
        );
    }
    // Started beats created; only created: its age; a clock behind the stamp: age 0.
    let started = s(
        json!({"metadata": {"creationTimestamp": "2020-01-01T00:00:00Z"},
        "status": {"startTime": "2027-01-15T07:58:20Z"}}),
    );
    assert_eq!(started.age_seconds, 100);
    let created = pod(json!({"metadata": {"creationTimestamp": "2027-01-15T07:00:00Z"}}));
    assert_eq!(safety(&created, &none, &[], NOW).age_seconds, 3600);
    assert_eq!(safety(&created, &none, &[], NOW - 7200).age_seconds, 0);
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-amd-register": r#"[{"id":"G0","count":10,"devmem":65536,"devcore":104,"type":"AMD Instinct MI210","health":true}]"#}}}))
    .unwrap()
}

fn gpu_pod(name: &str, extra: Value) -> Pod {
    let mut p = pod(
        json!({"metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "amd.com/gpu": "1", "amd.com/gpumem": "8192", "amd.com/gpucores": "10"}}}]}}),
    );
    let mut v = serde_json::to_value(&p).unwrap();
    merge(&mut v, extra);
    p = serde_json::from_value(v).unwrap();
    p
}

#[test]
fn the_cluster_holds_the_read_pods_with_their_facts_and_the_policy_says_who_stays() {
    let mut state = ClusterState::new();
    state.upsert_node(&node("n1"));
    let names = vec!["n1".to_string()];
    let pods = vec![
        gpu_pod("a", owned("rs")),
        gpu_pod("b", owned("rs")),
        gpu_pod("bare", json!({})),
        gpu_pod("unread", json!({})),
    ];
    for p in &pods {
        let d = decide_filter(&mut state, p, &names, &FilterConfig::default(), 0);
        assert!(d.patch.is_some(), "{:?}", d.result);
    }
    let budgets = [pdb("ns", "web-pdb", web(), Some(1))];
    let read = |p: &Pod| {
        (p.metadata.name.as_deref() != Some("unread")).then(|| {
            PodRequest::from_pod(p, &RequestDefaults::default(), GpuPolicy::default()).unwrap()
        })
    };
    let cluster = cluster_from_pods(&state, &pods, &budgets, NOW, None, read);
    let shown: Vec<String> = cluster.pods.iter().map(|p| p.shown()).collect();
    // The pod whose request the shell could not read is no candidate.
    assert_eq!(shown, ["ns/a", "ns/b", "ns/bare"]);
    let a = &cluster.pods[0].safety;
    assert_eq!(a.owner.as_ref().unwrap().replicas, 2);
    assert_eq!(a.pdb.as_ref().unwrap().name, "ns/web-pdb");
    // Its slices stay counted all the same: four pods' 8 GiB on the card.
    let used: u64 = cluster.nodes[0].usage.iter().map(|u| u.mem_mib).sum();
    assert_eq!(used, 4 * 8192);
    let kept = protected(&cluster, &Policy::default());
    assert_eq!(
        kept.into_iter().collect::<Vec<_>>(),
        [(
            "ns/bare".to_string(),
            "no controller recreates it".to_string()
        )]
    );
}
