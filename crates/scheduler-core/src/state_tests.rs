use super::*;
use serde_json::json;

fn node(name: &str, devmem: u64) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        "hami.io/node-amd-register": format!(r#"[{{"id":"{name}-gpu","count":10,"devmem":{devmem},"devcore":100,"type":"AMD X","health":true}}]"#)
    }}})).unwrap()
}

fn pod(uid: &str, node: &str, allocated: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {
            "hami.io/vgpu-node": node, "hami.io/amd-devices-allocated": allocated}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c",
            "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

#[test]
fn forged_allocations_count_for_nothing() {
    // D-4 / issue 17: allocation annotations on a pod the scheduler did not place.
    let forged = |name: &str, spec: serde_json::Value, labels: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels, "annotations": {
                "hami.io/vgpu-node": "n1", "hami.io/amd-devices-allocated": "n1-gpu,AMD X,900,90:;"}},
            "spec": spec, "status": {"phase": "Running"}
        }))
        .unwrap()
    };
    let gpu = json!([{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]);
    let mut s = ClusterState::new();
    s.upsert_node(&node("n1", 1000));
    for pod in [
        forged(
            "no-gpu",
            json!({"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]}),
            json!({}),
        ),
        forged(
            "other-scheduler",
            json!({"schedulerName": "default-scheduler", "containers": gpu}),
            json!({}),
        ),
        forged(
            "ignored",
            json!({"schedulerName": "hami-scheduler", "containers": gpu}),
            json!({"hami.io/webhook": "ignore"}),
        ),
    ] {
        s.upsert_pod(&pod);
    }
    assert_eq!(s.pod_count(), 0);
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 0);
    // A scheduler with another name does not count our default name's pods.
    let mut other = ClusterState::for_scheduler("volcano");
    other.upsert_node(&node("n1", 1000));
    other.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,100,10:;", "Running"));
    assert_eq!(other.pod_count(), 0);
}

#[test]
fn a_card_held_whole_by_a_plain_pod_is_full_until_it_ends() {
    let plain = |phase: &str, cards: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "plain", "namespace": "ns", "uid": "plain",
                "labels": {"hami.io/webhook": "ignore"},
                "annotations": {"hami.io/amd-whole-cards": cards}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    };
    let mut s = ClusterState::new();
    s.upsert_node(&node("n1", 1000));
    s.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,100,10:;", "Running"));
    s.upsert_pod(&plain("Running", "n1-gpu"));
    let full = GpuUsageView::of(&s);
    assert_eq!(full, (10, 1000, 100));
    let held: Vec<_> = s.whole_card_holdings().map(|(_, w)| w.clone()).collect();
    assert_eq!(
        held,
        vec![WholeCardHolding {
            namespace: "ns".into(),
            name: "plain".into(),
            node: "n1".into(),
            cards: vec!["n1-gpu".into()]
        }]
    );
    // Ended: the slice's usage only; a bad value is a problem, not a holding.
    s.upsert_pod(&plain("Succeeded", "n1-gpu"));
    assert_eq!(GpuUsageView::of(&s), (1, 100, 10));
    s.upsert_pod(&plain("Running", "n1-gpu,,"));
    assert_eq!(GpuUsageView::of(&s), (1, 100, 10));
    assert!(s.pod_problems["plain"].contains("hami.io/amd-whole-cards"));
    s.upsert_pod(&plain("Running", "n1-gpu"));
    assert_eq!(GpuUsageView::of(&s), (10, 1000, 100));
    // Deleted, and gone after a relist.
    s.remove_pod("plain");
    assert_eq!(GpuUsageView::of(&s), (1, 100, 10));
    s.upsert_pod(&plain("Running", "n1-gpu"));
    s.reset_pods(std::iter::empty());
    assert_eq!(s.whole_card_holdings().count(), 0);
    assert_eq!(GpuUsageView::of(&s), (0, 0, 0));
}

struct GpuUsageView;
impl GpuUsageView {
    fn of(s: &ClusterState) -> (u32, u64, u64) {
        let u = s.node("n1").unwrap().usage[0];
        (u.used, u.mem_mib, u.cores)
    }
}

#[test]
fn usage_follows_pods() {
    let mut s = ClusterState::new();
    s.upsert_node(&node("n1", 1000));
    s.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,100,10:;", "Running"));
    s.upsert_pod(&pod("p2", "n1", "n1-gpu,AMD X,200,20:;", "Pending"));
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 300);
    s.upsert_pod(&pod("p2", "n1", "n1-gpu,AMD X,200,20:;", "Succeeded"));
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 100);
    s.remove_pod("p1");
    assert_eq!(s.node("n1").unwrap().usage[0].used, 0);
    // A pod seen before its node still counts once the node arrives.
    s.upsert_pod(&pod("p3", "n2", "n2-gpu,AMD X,50,5:;", "Running"));
    s.upsert_node(&node("n2", 1000));
    assert_eq!(s.node("n2").unwrap().usage[0].mem_mib, 50);
    // Re-registration with new devices keeps the pods' usage.
    s.upsert_node(&node("n2", 2000));
    assert_eq!(s.node("n2").unwrap().usage[0].mem_mib, 50);
    assert_eq!(s.node("n2").unwrap().devices.gpus[0].info.devmem, 2000);
}

#[test]
fn a_plugin_that_stops_refreshing_is_withdrawn_then_offered_again() {
    use std::time::Duration;
    let beat = |t: i64| {
        let mut n = node("n1", 1000);
        n.metadata.annotations.as_mut().unwrap().insert(
            "hami.io/node-handshake-amd".into(),
            hami_protocol::handshake::format(t, 10),
        );
        n
    };
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut st = ClusterState::new();
    st.upsert_node_at(&beat(1), t0);
    st.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,100,10:;", "Running"));
    st.expire_heartbeats(t0 + s(29));
    assert!(st.node("n1").unwrap().devices.offers(Vendor::Amd));
    // The informer re-delivers the same value (a resync): no refresh.
    st.upsert_node_at(&beat(1), t0 + s(25));
    st.expire_heartbeats(t0 + s(30));
    let n = st.node("n1").unwrap();
    assert!(!n.devices.offers(Vendor::Amd));
    assert!(
        n.devices
            .register_error(Vendor::Amd)
            .unwrap()
            .contains("stopped refreshing"),
        "{:?}",
        n.devices.register_errors
    );
    // It refreshes again: offered again, with the pod's usage.
    st.upsert_node_at(&beat(2), t0 + s(31));
    let n = st.node("n1").unwrap();
    assert!(n.devices.offers(Vendor::Amd));
    assert_eq!(n.usage[0].mem_mib, 100);
    // A node without the annotation is never judged by the heartbeat rule.
    st.upsert_node_at(&node("n2", 1000), t0);
    st.expire_heartbeats(t0 + s(10_000));
    assert!(st.node("n2").unwrap().devices.offers(Vendor::Amd));
}

#[test]
fn bad_pod_annotation_is_a_problem_not_a_crash() {
    let mut s = ClusterState::new();
    s.upsert_node(&node("n1", 1000));
    s.upsert_pod(&pod("p1", "n1", "garbage", "Running"));
    assert!(s.pod_problems["p1"].contains("hami.io/amd-devices-allocated"));
    assert_eq!(s.pod_count(), 0);
}

#[test]
fn pending_decision_survives_stale_informer_events() {
    let mut s = ClusterState::new();
    s.upsert_node(&node("n1", 1000));
    let charges = vec![DeviceCharge {
        uuid: "n1-gpu".into(),
        slots: 1,
        mem_mib: 400,
        cores: 40,
    }];
    let mut expected = BTreeMap::new();
    expected.insert(
        "hami.io/amd-devices-allocated",
        "n1-gpu,AMD X,400,40:;".to_string(),
    );
    s.reserve(
        "p1",
        PodHolding {
            namespace: "ns".into(),
            name: "p1".into(),
            node: "n1".into(),
            charges,
            grants: Vec::new(),
        },
        expected,
    );
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 400);
    // The informer still shows the pod without our annotations: keep the reservation.
    let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "p1", "uid": "p1"}, "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}})).unwrap();
    s.upsert_pod(&bare);
    assert!(s.is_pending("p1"));
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 400);
    // Now the patch came back.
    s.upsert_pod(&pod("p1", "n1", "n1-gpu,AMD X,400,40:;", "Pending"));
    assert!(!s.is_pending("p1"));
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 400);
    // Relist without the pod: it is gone.
    s.reset_pods(std::iter::empty());
    assert_eq!(s.node("n1").unwrap().usage[0].mem_mib, 0);
}
