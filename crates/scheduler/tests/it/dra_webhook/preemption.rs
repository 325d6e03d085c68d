//! DRA mode has no preemption (none upstream until KEP-5690): a DRA pod whose priority
//! would preempt is told so at admission (the AdmissionReview's warnings, which kubectl
//! prints) and, once kube-scheduler finds no GPU free, by a Warning Event on the pod
//! (`DRAPreemptionUnavailable`) naming the KEP and what to do; the lower-priority pod
//! holding the GPU keeps running.

use super::*;

use hami_scheduler::dra_wait::{KEP, WAITS_REASON};
use k8s_openapi::api::events::v1::Event;

fn with_priority(mut pod: Pod, priority: i32) -> Pod {
    pod.spec.as_mut().unwrap().priority = Some(priority);
    pod
}

/// The webhook's AdmissionReview answer for `pod`, over HTTPS as the API server calls it.
async fn admission(c: &Cluster, pod: &Pod) -> Value {
    let webhook = ExtenderClient::new(
        &c.front.base,
        Trust::Ca(c.front.ca_pem.clone().into_bytes()),
    )
    .unwrap();
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-p", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE", "namespace": "default", "dryRun": true,
        "userInfo": {"username": "alice"}, "object": pod}});
    webhook.call("webhook", &review).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_pod_that_would_preempt_waits_and_is_told_why() {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "dra-node",
        vec![device(0, "AMD Instinct MI210", "64Gi", 104, 0)],
    )
    .await;
    let whole = json!({"amd.com/gpu": "1", "amd.com/gpucores": "100", "amd.com/gpumem": "65536"});
    create(&c, &with_priority(amd_pod("low", dra(), whole), 0))
        .await
        .unwrap();
    bound(&c, "low").await;

    let high = with_priority(amd_pod("high", dra(), slice_limits()), 1000);
    // Admission: the client is warned (kubectl prints the response's warnings).
    let answer = admission(&c, &high).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let warnings: Vec<String> =
        serde_json::from_value(answer["response"]["warnings"].clone()).unwrap_or_default();
    assert!(
        warnings.iter().any(
            |w| w.starts_with("priority 1000: DRA-mode pods cannot preempt")
                && w.contains("KEP-5690")
        ),
        "{answer}"
    );

    create(&c, &high).await.unwrap();
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let told = || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(WAITS_REASON)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("high")
            })
    };
    wait("a DRAPreemptionUnavailable event on high", || async {
        told().await.is_some()
    })
    .await;
    let event = told().await.unwrap();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.starts_with("priority 1000:")
            && note.contains("KEP-5690")
            && note.contains(KEP)
            && note.contains("device-plugin mode"),
        "{note}"
    );
    // No one was evicted: the low pod still holds the GPU, the high one waits.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    assert!(pods.get_opt("low").await.unwrap().is_some());
    let waiting = pods.get("high").await.unwrap();
    assert!(waiting.spec.unwrap().node_name.is_none());

    // A priority-0 DRA pod that waits is told nothing (it would not preempt anyway).
    create(&c, &amd_pod("zero", dra(), slice_limits()))
        .await
        .unwrap();
    wait("zero is found unschedulable", || async {
        pods.get("zero")
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let about_zero = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(WAITS_REASON))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("zero"))
        .count();
    assert_eq!(about_zero, 0);
}
