//! What the store holds stays bounded under pod churn (issue 18's soak: ~75 KiB more RSS
//! per churned pod). Each churned pod makes the writes the stack makes for it: create,
//! bind, the scheduler's and plugin's annotation patches, kubelet's record and status,
//! three Events from the scheduler (each mirrored as a core Event), the delete; and the
//! scheduler replicas' Lease renewals go on meanwhile.

use std::time::{Duration, Instant};

use hami_apiserver::patch::PatchType;
use hami_apiserver::resources::lookup;
use hami_apiserver::store::{DeleteOptions, Store, StoreStats, Subresource};
use serde_json::{Value, json};

fn pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("chaos-{i}"), "labels": {"app": "chaos"},
            "annotations": {"hami.io/vgpu-request": "amd.com/gpu=1,gpumem=4096,gpucores=30"}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main",
            "image": "busybox", "command": ["sleep", "3600"],
            "env": [{"name": "A", "value": "x".repeat(64)}],
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096",
                "amd.com/gpucores": "30"}}}]}
    })
}

fn event(i: usize, j: usize, reason: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": format!("chaos-{i}.{j}"), "namespace": "default"},
        "eventTime": "2026-12-01T12:00:00.000000Z",
        "reportingController": "hami-scheduler", "reportingInstance": "hami-scheduler-0",
        "action": "Scheduling", "reason": reason, "type": "Normal",
        "regarding": {"kind": "Pod", "namespace": "default", "name": format!("chaos-{i}")},
        "note": format!("pod default/chaos-{i}: node n1, GPU-{j}, 4096 MiB, 30% cores; {}", "y".repeat(80))
    })
}

/// One pod's life, as the stack writes it.
fn churn_one(s: &mut Store, i: usize) {
    let pods = lookup("", "v1", "pods").unwrap();
    let events = lookup("events.k8s.io", "v1", "events").unwrap();
    let leases = lookup("coordination.k8s.io", "v1", "leases").unwrap();
    let name = format!("chaos-{i}");
    s.create(pods, Some("default"), pod(i)).unwrap();
    let merge = |s: &mut Store, sub, body: Value| {
        s.patch(pods, "default", &name, PatchType::Merge, &body, sub)
            .unwrap();
    };
    merge(
        s,
        Subresource::Main,
        json!({"metadata": {"annotations": {"hami.io/vgpu-node": "n1", "hami.io/bind-phase": "allocating",
            "hami.io/vgpu-devices-to-allocate": "GPU-0,AMD,4096,30:;"}}}),
    );
    s.bind(
        "default",
        &name,
        &json!({"metadata": {"name": name}, "target": {"kind": "Node", "name": "n1"}}),
    )
    .unwrap();
    merge(
        s,
        Subresource::Main,
        json!({"metadata": {"annotations": {"hami.io/bind-phase": "success",
            "hami.io/vgpu-devices-allocated": "GPU-0,AMD,4096,30:;"}}}),
    );
    merge(
        s,
        Subresource::Main,
        json!({"metadata": {"annotations": {"kubelet-sim.hami.io/allocations": "x".repeat(300)}}}),
    );
    merge(
        s,
        Subresource::Status,
        json!({"status": {"phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    for (j, reason) in ["Scheduled", "Allocated", "Started"].iter().enumerate() {
        s.create(events, Some("default"), event(i, j, reason))
            .unwrap();
    }
    for r in 0..2 {
        let lease = format!("hami-scheduler-{r}");
        let body =
            json!({"spec": {"renewTime": format!("2026-12-01T12:00:{:02}.000000Z", i % 60)}});
        s.patch(
            leases,
            "kube-system",
            &lease,
            PatchType::Merge,
            &body,
            Subresource::Main,
        )
        .unwrap();
    }
    s.delete(pods, "default", &name, &DeleteOptions::default())
        .unwrap();
}

fn store() -> Store {
    let mut s = Store::new(hami_apiserver::store::DEFAULT_HISTORY);
    s.ensure_default_namespaces();
    let leases = lookup("coordination.k8s.io", "v1", "leases").unwrap();
    for r in 0..2 {
        s.create(
            leases,
            Some("kube-system"),
            json!({"metadata": {"name": format!("hami-scheduler-{r}")}, "spec": {"holderIdentity": "a"}}),
        )
        .unwrap();
    }
    s
}

fn kib(b: usize) -> usize {
    b / 1024
}

fn show(n: usize, st: &StoreStats) -> String {
    format!(
        "after {n:5} pods: {} objects ({} KiB), {} Events, {} history entries ({} KiB)",
        st.objects,
        kib(st.object_bytes),
        st.events,
        st.history,
        kib(st.history_bytes)
    )
}

/// The store after N churned pods holds no more than after N/4: Events are capped (the
/// oldest go first, as kube-apiserver's event TTL makes them go) and the watch history is
/// bounded in entries, so neither grows with the number of pods ever churned.
#[test]
fn churned_pods_leave_the_store_bounded() {
    let mut s = store();
    let mut lines = Vec::new();
    let mut at = Vec::new();
    for n in 1..=4000 {
        churn_one(&mut s, n);
        let _ = s.take_events();
        if n % 500 == 0 {
            let st = s.stats();
            lines.push(show(n, &st));
            at.push(st);
        }
    }
    let table = lines.join("\n");
    println!("{table}");
    let (quarter, end) = (at[1], at[at.len() - 1]);
    // Only the two Leases and the namespaces live on: objects are Events and little else.
    assert!(
        end.events <= hami_apiserver::store::DEFAULT_MAX_EVENTS,
        "Events kept forever:\n{table}"
    );
    assert!(
        end.object_bytes <= quarter.object_bytes + quarter.object_bytes / 10,
        "stored objects grow with pods churned:\n{table}"
    );
    assert!(
        end.history_bytes <= quarter.history_bytes + quarter.history_bytes / 10,
        "watch history grows with pods churned:\n{table}"
    );
    // After 4000 pods the store holds its bounds' worth: 2000 Events of ~0.8 KiB and 4096
    // history entries of ~1.3 KiB (before the bounds: 20 MiB of Events alone, growing by
    // 5 KiB per pod, and 10,000 history entries, 12.5 MiB).
    assert!(
        end.object_bytes + end.history_bytes <= 8 << 20,
        "the store holds more than 8 MiB:\n{table}"
    );
}

/// Events older than the TTL go at the next write, with a DELETED watch event (as an
/// etcd lease expiry shows them), their core mirror with them.
#[test]
fn events_older_than_the_ttl_are_deleted() {
    let ttl = Duration::from_millis(200);
    let mut s = store();
    s.set_event_bounds(ttl, 1000);
    let events = lookup("events.k8s.io", "v1", "events").unwrap();
    let core = lookup("", "v1", "events").unwrap();
    s.create(events, Some("default"), event(1, 0, "Old"))
        .unwrap();
    let written = Instant::now();
    assert_eq!(s.stats().events, 2, "the Event and its core mirror");
    // Wait (bounded) until the TTL has passed, then write anything.
    while written.elapsed() <= ttl {
        std::thread::yield_now();
    }
    let _ = s.take_events();
    s.create(events, Some("default"), event(2, 0, "New"))
        .unwrap();
    assert!(s.get(events, "default", "chaos-1.0").is_err(), "expired");
    assert!(
        s.get(core, "default", "chaos-1.0").is_err(),
        "mirror expired"
    );
    assert!(s.get(events, "default", "chaos-2.0").is_ok());
    let deleted: Vec<String> = s
        .take_events()
        .iter()
        .filter(|e| e.event_type == hami_apiserver::store::EventType::Deleted)
        .map(|e| format!("{}/{}", e.resource.group, e.name))
        .collect();
    assert_eq!(deleted, ["events.k8s.io/chaos-1.0", "/chaos-1.0"]);
}

/// Watch-history entries older than the history's age bound go at the next write; a watch
/// from a resourceVersion before them gets 410 Expired (and relists), as after an etcd
/// compaction.
#[test]
fn history_older_than_its_age_bound_is_compacted() {
    let age = Duration::from_millis(200);
    let mut s = store();
    s.set_history_max_age(age);
    let cms = lookup("", "v1", "configmaps").unwrap();
    let before = s.resource_version();
    s.create(cms, Some("default"), json!({"metadata": {"name": "a"}}))
        .unwrap();
    let written = Instant::now();
    assert_eq!(s.events_since(cms, before).unwrap().len(), 1);
    while written.elapsed() <= age {
        std::thread::yield_now();
    }
    let mid = s.resource_version();
    s.create(cms, Some("default"), json!({"metadata": {"name": "b"}}))
        .unwrap();
    assert_eq!(s.events_since(cms, before).unwrap_err().code, 410);
    assert_eq!(s.events_since(cms, mid).unwrap().len(), 1);
    assert_eq!(s.stats().history, 1);
}
