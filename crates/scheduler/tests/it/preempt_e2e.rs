//! Preemption end to end (issue 30 item 3): the simulated kube-scheduler's PostFilter in
//! front of the scheduler's filter and preempt verbs, as kube-scheduler < 1.38 and ≥ 1.38
//! run it. A priority-1000 pod finds one full card: with 1.38 it evicts exactly one
//! priority-0 slice and runs; a critical pod and one labelled `hami.io/preemptible: "false"`
//! are never chosen; before 1.38 no victim is ever sent to the extender, so it waits.

use hami_kube_scheduler_sim::preemption::PreemptMode;
use hami_scheduler::config::Settings;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

use crate::common::{self, Front, wait};

/// `default/<name>` asking for `mem` MiB and `cores` % of one AMD GPU, with `spec` merged.
async fn gpu_pod(client: &Client, name: &str, mem: u32, cores: u32, extra: Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": mem.to_string(),
                "amd.com/gpucores": cores.to_string()}}}]}
    });
    for (k, v) in extra["spec"].as_object().into_iter().flatten() {
        pod["spec"][k] = v.clone();
    }
    for (k, v) in extra["labels"].as_object().into_iter().flatten() {
        pod["metadata"]["labels"][k] = v.clone();
    }
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap()
}

async fn bound(client: &Client, name: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), "default")
        .get_opt(name)
        .await
        .unwrap()
        .is_some_and(|p| p.spec.and_then(|s| s.node_name).is_some())
}

async fn exists(client: &Client, name: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), "default")
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

/// Node `n`'s one GPU (1000 MiB, 100 CUs) filled by the stand-in kube-scheduler: two
/// priority-0 slices, a critical one and a priority-0 one that may not be preempted.
async fn full_card(mode: PreemptMode) -> Front {
    let (api, client) = common::tls_api().await;
    common::create_node(
        &client,
        json!({"annotations": {"hami.io/node-amd-register": common::AMD_REGISTER}}),
        json!({"capacity": {"amd.com/gpu": "10"}, "allocatable": {"amd.com/gpu": "10"}}),
    )
    .await;
    let c = common::start_front(
        (api, client),
        &Settings::default(),
        "hami-preempt-e2e",
        |sim| sim.with_preemption(mode),
    )
    .await;
    tokio::spawn(crate::e2e::plugin_stand_in(common::as_component(
        &c.api,
        hami_manifests::names::DEVICE_PLUGIN,
    )));
    let fill = [
        ("low-1", 300, 30, json!({"spec": {"priority": 0}})),
        ("low-2", 300, 30, json!({"spec": {"priority": 0}})),
        (
            "critical",
            100,
            10,
            json!({"spec": {"priority": 2_000_000_000, "priorityClassName": "system-node-critical"}}),
        ),
        (
            "keep",
            300,
            30,
            json!({"spec": {"priority": 0}, "labels": {"hami.io/preemptible": "false"}}),
        ),
    ];
    for (name, mem, cores, extra) in fill {
        gpu_pod(&c.client, name, mem, cores, extra).await;
        wait(&format!("{name} is bound"), || bound(&c.client, name)).await;
    }
    c
}

/// One watch event of a pod: whether it carried `DisruptionTarget` True
/// `PreemptionByScheduler`, and whether the pod was being deleted (or deleted).
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    disruption_target: bool,
    deleting: bool,
}

/// Records from now on every watch event of the pods in `default`.
async fn victims_seen(client: &Client) -> Arc<Mutex<Vec<Seen>>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = seen.clone();
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            let (pod, deleted) = match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => (p, false),
                WatchEvent::Deleted(p) => (p, true),
                _ => continue,
            };
            let disruption_target = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "DisruptionTarget"
                        && c.status == "True"
                        && c.reason.as_deref() == Some("PreemptionByScheduler")
                });
            into.lock().unwrap().push(Seen {
                name: pod.metadata.name.clone().unwrap_or_default(),
                disruption_target,
                deleting: deleted || pod.metadata.deletion_timestamp.is_some(),
            });
        }
    });
    seen
}

fn high() -> Value {
    json!({"spec": {"priority": 1000}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_1_38_a_high_priority_pod_evicts_one_low_slice_and_runs() {
    let c = full_card(PreemptMode::From138).await;
    let seen = victims_seen(&c.client).await;
    gpu_pod(&c.client, "high", 300, 30, high()).await;
    wait("high runs on n", || bound(&c.client, "high")).await;
    let mut gone = Vec::new();
    for name in ["low-1", "low-2", "critical", "keep"] {
        if !exists(&c.client, name).await {
            gone.push(name);
        }
    }
    assert_eq!(gone.len(), 1, "exactly one victim: {gone:?}");
    assert!(gone[0].starts_with("low-"), "{gone:?}");
    // As upstream (`PodReasonPreemptionByScheduler`): the victim is marked
    // `DisruptionTarget` True before it is deleted, so its controller sees why it goes.
    let seen = seen.lock().unwrap().clone();
    let of_victim: Vec<&Seen> = seen.iter().filter(|s| s.name == gone[0]).collect();
    let marked = of_victim.iter().position(|s| s.disruption_target);
    let deleting = of_victim.iter().position(|s| s.deleting);
    assert!(
        marked.is_some() && deleting.is_some() && marked < deleting,
        "the victim is not marked DisruptionTarget/PreemptionByScheduler before its deletion: {of_victim:?}"
    );
    let high = Api::<Pod>::namespaced(c.client.clone(), "default")
        .get("high")
        .await
        .unwrap();
    assert_eq!(
        high.status.and_then(|s| s.nominated_node_name).as_deref(),
        Some("n"),
        "nominated before it was bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_1_38_no_victim_reaches_the_extender_and_the_pod_waits() {
    let c = full_card(PreemptMode::Before138).await;
    gpu_pod(&c.client, "high", 300, 30, high()).await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    // The PostFilter ran and dropped the node before the extender: nobody evicted.
    wait(
        "a failed attempt whose preemption found no victim",
        || async {
            let list = events.list(&ListParams::default()).await.unwrap().items;
            list.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("high")
                    && e.reason.as_deref() == Some("FailedScheduling")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("left no victim"))
            })
        },
    )
    .await;
    assert!(!bound(&c.client, "high").await);
    let text = c.scheduler.metrics.render(&c.scheduler.state());
    for result in ["victims", "vetoed", "no_gpu", "error"] {
        let series =
            format!(r#"hami_scheduler_preemption_total{{zone="vGPU",result="{result}"}} 0"#);
        assert!(
            text.contains(&series),
            "the preempt verb was called: {text}"
        );
    }
    for name in ["low-1", "low-2", "critical", "keep"] {
        assert!(exists(&c.client, name).await, "{name} was evicted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_fit_the_pod_even_empty_is_never_a_candidate() {
    let (api, client) = common::tls_api().await;
    // One GPU of 200 MiB, holding nothing: a 300 MiB pod never fits, whatever is evicted.
    let small = common::AMD_REGISTER.replace(r#""devmem":1000"#, r#""devmem":200"#);
    common::create_node(
        &client,
        json!({"annotations": {"hami.io/node-amd-register": small}}),
        json!({"capacity": {"amd.com/gpu": "10"}, "allocatable": {"amd.com/gpu": "10"}}),
    )
    .await;
    let c = common::start_front(
        (api, client),
        &Settings::default(),
        "hami-preempt-e2e",
        |sim| sim.with_preemption(PreemptMode::From138),
    )
    .await;
    gpu_pod(&c.client, "high", 300, 30, high()).await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let note = std::sync::Mutex::new(String::new());
    wait("the pod is refused", || async {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        let found = list.iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("high")
                && e.reason.as_deref() == Some("FailedScheduling")
        });
        if let Some(note_text) = found.and_then(|e| e.note.clone()) {
            *note.lock().unwrap() = note_text;
        }
        found.is_some()
    })
    .await;
    let note = note.into_inner().unwrap();
    assert!(note.contains("CardInsufficientMemory"), "{note}");
    // Unresolvable: no PostFilter ran, and the preempt verb was never called.
    assert!(!note.contains("preemption"), "{note}");
    let text = c.scheduler.metrics.render(&c.scheduler.state());
    assert!(
        text.contains(r#"hami_scheduler_preemption_total{zone="vGPU",result="victims"} 0"#)
            && text.contains(r#"hami_scheduler_preemption_total{zone="vGPU",result="vetoed"} 0"#),
        "{text}"
    );
}
