//! The preempt verb over HTTP as kube-scheduler calls it (issue 30 item 2): its two request
//! forms, victims refined to the fewest lowest-priority slices on the GPU the pod takes,
//! unknown nodes and pods dropped, protected pods never named, PodDisruptionBudgets read
//! through the scheduler's own watch, the Event when every node is vetoed, the metrics,
//! and bad bodies answered 400 / 413 with a clear error.

use std::sync::Arc;

use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::{cluster, start_scheduler, wait};
use crate::http_api::{json_body, request};

/// Creates `default/<name>` bound to node `n`; with `mem` MiB and `cores` % of GPU `G` it
/// holds a slice there as the scheduler records one (D-4: our schedulerName, a managed
/// resource, the device-list annotations).
async fn pod_on_n(client: &Client, name: &str, spec: Value, slice: Option<(u32, u32)>) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"schedulerName": "hami-scheduler", "nodeName": "n",
            "containers": [{"name": "c", "image": "x"}]}
    });
    for (k, v) in spec.as_object().unwrap() {
        pod["spec"][k] = v.clone();
    }
    if let Some((mem, cores)) = slice {
        pod["spec"]["containers"][0]["resources"] =
            json!({"limits": {"amd.com/gpu": "1", "amd.com/gpumem": mem.to_string()}});
        pod["metadata"]["annotations"] = json!({
            "hami.io/vgpu-node": "n",
            "hami.io/amd-devices-allocated": format!("G,AMD Instinct MI210,{mem},{cores}:;"),
        });
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

/// A PodDisruptionBudget over `app in (apps)` that allows no disruption now.
async fn tight_pdb(client: &Client, name: &str, apps: &[&str]) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchExpressions": [
            {"key": "app", "operator": "In", "values": apps}]}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &pdb).await.unwrap();
    let status = json!({"status": {"disruptionsAllowed": 0, "currentHealthy": 1,
        "desiredHealthy": 1, "expectedPods": 1}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// POSTs `body` to `/preempt` (blocking I/O off the runtime's workers).
async fn preempt(port: u16, body: Vec<u8>) -> (u16, String) {
    tokio::task::spawn_blocking(move || request(port, "POST", "/preempt", &body))
        .await
        .unwrap()
}

/// The victims' UIDs per node of a 200 answer, and each node's PDB violations.
fn victims(body: &str) -> Vec<(String, Vec<String>, i64)> {
    let answer = json_body(body);
    let nodes = answer["NodeNameToMetaVictims"]
        .as_object()
        .unwrap_or_else(|| panic!("no NodeNameToMetaVictims: {body}"));
    nodes
        .iter()
        .map(|(node, v)| {
            let uids = v["Pods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["UID"].as_str().unwrap().to_owned())
                .collect();
            (node.clone(), uids, v["NumPDBViolations"].as_i64().unwrap())
        })
        .collect()
}

fn serve(scheduler: &Arc<Scheduler>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(scheduler.clone()),
        listener,
        None,
    ));
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_names_the_fewest_lowest_priority_slices_and_never_a_protected_pod() {
    let (_api, client) = cluster().await;
    // GPU G of node n (1000 MiB, 100 %) is full: two priority-0 slices of 300 MiB / 30 %,
    // a priority-500 one of 300 / 30, and a critical one of 100 / 10.
    let low_a = pod_on_n(&client, "low-a", json!({"priority": 0}), Some((300, 30))).await;
    let low_b = pod_on_n(&client, "low-b", json!({"priority": 0}), Some((300, 30))).await;
    let mid = pod_on_n(&client, "mid", json!({"priority": 500}), Some((300, 30))).await;
    let critical = pod_on_n(
        &client,
        "critical",
        json!({"priority": 2_000_000_000, "priorityClassName": "system-node-critical"}),
        Some((100, 10)),
    )
    .await;
    // Holds no slice: kube-scheduler's in-tree dry run may want its CPU.
    let plain = pod_on_n(&client, "plain", json!({"priority": 0}), None).await;
    let preemptor: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "priority": 1000, "containers": [{"name": "c",
            "image": "x", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "300",
            "amd.com/gpucores": "30"}}}]}
    }))
    .unwrap();
    let preemptor = Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &preemptor)
        .await
        .unwrap();
    let scheduler = start_scheduler(&client);
    wait("the scheduler syncs and sees the four slices", || async {
        scheduler.ready()
            && scheduler
                .state()
                .node("n")
                .is_some_and(|n| n.usage[0].used == 4)
    })
    .await;
    let port = serve(&scheduler);
    let lows = [uid(&low_a), uid(&low_b)];

    // Kubernetes ≥ 1.38, nodeCacheCapable: an empty list to fill; an unknown node; a
    // proposed pod that holds no slice (named, listed from the API server) and one nobody
    // knows (dropped, no error).
    let args = json!({"Pod": preemptor, "NodeNameToMetaVictims": {
        "n": {"Pods": [{"UID": uid(&plain)}, {"UID": "no-such-pod"}], "NumPDBViolations": 0},
        "ghost": {"Pods": null, "NumPDBViolations": 0}}});
    let (status, body) = preempt(port, args.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let answer = victims(&body);
    assert_eq!(answer.len(), 1, "the unknown node is dropped: {body}");
    let (node, uids, violations) = &answer[0];
    assert_eq!(node, "n");
    assert_eq!(uids.len(), 2, "the plain pod and one low slice: {body}");
    assert_eq!(uids[0], uid(&plain));
    assert!(lows.contains(&uids[1]), "{body}");
    assert_eq!(*violations, 0);

    // The full-pod form (not nodeCacheCapable), empty: filled the same way.
    let args =
        json!({"Pod": preemptor, "NodeNameToVictims": {"n": {"Pods": [], "NumPDBViolations": 0}}});
    let (status, body) = preempt(port, args.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let answer = victims(&body);
    assert_eq!(answer[0].1.len(), 1, "{body}");
    assert!(lows.contains(&answer[0].1[0]), "{body}");

    // Both low slices under a budget that allows no disruption: the priority-500 slice goes
    // instead (kube-scheduler's order: fewest violations first).
    tight_pdb(&client, "lows", &["low-a", "low-b"]).await;
    let empty = json!({"Pod": preemptor, "NodeNameToMetaVictims": {"n": {"Pods": []}}});
    let answer = until(port, &empty, |a| a[0].1 == [uid(&mid)]).await;
    assert_eq!(answer[0].2, 0, "no budget is broken");

    // Every slice under a tight budget: the cheapest goes, and the violation is counted.
    tight_pdb(&client, "mid", &["mid"]).await;
    let answer = until(port, &empty, |a| a[0].2 == 1).await;
    assert_eq!(answer[0].1.len(), 1);
    assert!(lows.contains(&answer[0].1[0]), "{answer:?}");

    // The critical pod is never named, even proposed: the node is vetoed, and the pod is
    // told why in an Event.
    let args = json!({"Pod": preemptor, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": uid(&critical)}]}}});
    let (status, body) = preempt(port, args.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{body}");
    assert!(victims(&body).is_empty(), "{body}");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    wait("the PreemptionVetoed event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                let note = e.note.as_deref().unwrap_or_default();
                e.reason.as_deref() == Some("PreemptionVetoed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("big")
                    && note.contains("default/critical may not be evicted (critical)")
                    && note.contains("on n")
            })
    })
    .await;
    // A pod labelled hami.io/preemptible=false likewise.
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch(
            "low-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"hami.io/preemptible": "false"}}})),
        )
        .await
        .unwrap();
    let args =
        json!({"Pod": preemptor, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": uid(&low_a)}]}}});
    until(port, &args, |a| a.is_empty()).await;
    // Nor is it chosen when the list is ours to fill: the other low slice is.
    let answer = until(port, &empty, |a| a[0].1 == [uid(&low_b)]).await;
    assert_eq!(answer[0].2, 1);

    // A preemptor of priority 0 may evict nobody: every slice is as important.
    let mut humble = preemptor.clone();
    humble.spec.as_mut().unwrap().priority = Some(0);
    let args = json!({"Pod": humble, "NodeNameToMetaVictims": {"n": {"Pods": []}}});
    let (_, body) = preempt(port, args.to_string().into_bytes()).await;
    assert!(victims(&body).is_empty(), "{body}");

    let text = scheduler.metrics.render(&scheduler.state());
    let value = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{series} missing: {text}"))
    };
    assert!(value(r#"hami_scheduler_preemption_total{zone="vGPU",result="victims"}"#) >= 5.0);
    assert!(value(r#"hami_scheduler_preemption_total{zone="vGPU",result="vetoed"}"#) >= 3.0);
    assert_eq!(
        value(r#"hami_scheduler_preemption_total{zone="vGPU",result="error"}"#),
        0.0
    );
    assert!(value(r#"hami_scheduler_preemption_victims_count{zone="vGPU"}"#) >= 5.0);
}

/// Calls `/preempt` with `args` until its victims satisfy `done` (bounded: the
/// scheduler's watches are eventually consistent); returns them.
async fn until(
    port: u16,
    args: &Value,
    done: impl Fn(&[(String, Vec<String>, i64)]) -> bool,
) -> Vec<(String, Vec<String>, i64)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, body) = preempt(port, args.to_string().into_bytes()).await;
        assert_eq!(status, 200, "{body}");
        let got = victims(&body);
        if done(&got) {
            return got;
        }
        assert!(std::time::Instant::now() < deadline, "still {body}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_preempt_bodies_get_400_or_413_with_a_clear_error() {
    let (_api, client) = cluster().await;
    let scheduler = start_scheduler(&client);
    wait("the scheduler syncs", || async { scheduler.ready() }).await;
    let port = serve(&scheduler);
    let cases: [(&[u8], u16, &str); 4] = [
        (b"{not json", 400, "not JSON"),
        (b"[]", 400, "must be a JSON object"),
        (
            br#"{"Pod": 3}"#,
            400,
            "does not match ExtenderPreemptionArgs",
        ),
        (br#"{"NodeNameToMetaVictims": {}}"#, 400, "carries no Pod"),
    ];
    for (body, want, says) in cases {
        let (status, answer) = preempt(port, body.to_vec()).await;
        assert_eq!(status, want, "{answer}");
        let error = json_body(&answer)["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(error.contains(says), "{says}: {answer}");
    }
    // A pod whose requests do not read is the request's fault too.
    let bad = json!({"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "150"}}}]}}});
    let (status, answer) = preempt(port, bad.to_string().into_bytes()).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("amd.com/gpucores"), "{answer}");

    let huge = vec![b' '; (1 << 20) + 10];
    let (status, answer) = preempt(port, huge).await;
    assert_eq!(status, 413, "{answer}");
    assert!(
        json_body(&answer)["error"]
            .as_str()
            .unwrap()
            .contains("larger than 1048576 bytes"),
        "{answer}"
    );

    let text = scheduler.metrics.render(&scheduler.state());
    assert!(
        text.contains(r#"hami_scheduler_preemption_total{zone="vGPU",result="error"} 6"#),
        "{text}"
    );
}
