//! Namespace quotas with HAMi's keys (issue 30) on the embedded API server: the webhook
//! refuses a pod over its namespace's quota (AMD and NVIDIA) naming the quota, the key and
//! the numbers; Filter lets only one of two pods racing for the last of a quota through
//! and records `QuotaExceeded` on the other; a restarted scheduler rebuilds the usage from
//! the pods' allocation annotations and still refuses; a pod over its quota on one node's
//! card is placed on a node whose card keeps it within; NVIDIA's race and restart count the
//! real MiB of a memory percentage; a pod's charge is released when it
//! ends (kept while it is being deleted); a bad value is ignored with a `QuotaValueIgnored`
//! Event naming the key; the usage and limits are exported as HAMi's quota metrics.

use crate::common;

use std::sync::Arc;

use hami_protocol::names::Vendor;
use hami_protocol::node_register::{DeviceInfo, encode_node_devices};
use hami_scheduler::config::Settings;
use hami_scheduler::quota::{Dimension, QuotaKey};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const AMD_MEM: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::MemoryMib);

async fn create_quota(client: &Client, name: &str, hard: Value) {
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"hard": hard}
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
}

fn gpu_pod(name: &str, limits: Value, finalizer: bool) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
            "resources": {"limits": limits}}]}
    });
    if finalizer {
        pod["metadata"]["finalizers"] = json!(["hami.io/test-hold"]);
    }
    serde_json::from_value(pod).unwrap()
}

async fn create_pod(client: &Client, pod: &Pod) -> Result<Pod, kube::Error> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), pod)
        .await
}

/// Creates the pod [`gpu_pod`] builds; panics naming it when refused.
async fn created_pod(client: &Client, name: &str, limits: Value, finalizer: bool) -> Pod {
    create_pod(client, &gpu_pod(name, limits, finalizer))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The node registration of one NVIDIA A100 (40960 MiB) shared 10 ways.
fn a100_register() -> String {
    let a100 = DeviceInfo {
        id: "GPU-A100".into(),
        count: 10,
        devmem: 40_960,
        devcore: 100,
        device_type: "NVIDIA A100".into(),
        health: true,
        ..Default::default()
    };
    encode_node_devices(&[a100]).unwrap()
}

/// A scheduler started on `client`, once it has synced and listed the quota.
async fn scheduler_seeing_quota(client: &Client) -> Arc<Scheduler> {
    let s = common::start_scheduler(client);
    common::wait("the scheduler syncs and sees the quota", || async {
        s.ready() && s.state().quota.ledger().governs("default")
    })
    .await;
    s
}

/// One AMD slice of `mib` MiB and 10 % of the GPU (node `n` of [`common::cluster`]
/// offers 1000 MiB and 100 CUs; without `gpucores` a slice takes every CU).
async fn amd_pod(client: &Client, name: &str, mib: u32, finalizer: bool) -> Pod {
    let limits =
        json!({"amd.com/gpu": "1", "amd.com/gpumem": mib.to_string(), "amd.com/gpucores": "10"});
    created_pod(client, name, limits, finalizer).await
}

fn used(s: &Scheduler, key: QuotaKey) -> u64 {
    s.state().quota.ledger().used("default").get(key)
}

/// Node `n` with one MI210 and a scheduler that has listed the quota `quota`.
async fn scheduler_with_quota(
    hard: Value,
) -> (hami_apiserver::RunningApiServer, Client, Arc<Scheduler>) {
    let (api, client) = common::cluster().await;
    create_quota(&client, "gpus", hard).await;
    let s = scheduler_seeing_quota(&client).await;
    (api, client, s)
}

/// Waits until an Event of `reason` is recorded about the object `name`; its note.
async fn event_note(client: &Client, name: &str, reason: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let found = || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .and_then(|e| e.note)
    };
    common::wait(&format!("a {reason} event on {name}"), || async {
        found().await.is_some()
    })
    .await;
    found().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_pods_over_the_quota_for_amd_and_nvidia() {
    let (api, client) = common::tls_api().await;
    common::create_node(
        &client,
        json!({"annotations": {
            "hami.io/node-amd-register": common::AMD_REGISTER,
            "hami.io/node-nvidia-register": a100_register()}}),
        json!({"capacity": {"amd.com/gpu": "10", "nvidia.com/gpu": "10"}}),
    )
    .await;
    create_quota(
        &client,
        "team",
        json!({"limits.amd.com/gpumem": "500", "limits.nvidia.com/gpumem": "1000"}),
    )
    .await;
    let c = common::start_front((api, client), &Settings::default(), "hami-quota", |sim| sim).await;
    common::wait("the scheduler sees the quota", || async {
        c.scheduler.state().quota.ledger().governs("default")
    })
    .await;
    let refused = |pod: Pod| {
        let client = c.client.clone();
        async move {
            let e = create_pod(&client, &pod).await.unwrap_err();
            e.to_string()
        }
    };
    // AMD: 600 MiB over a 500 MiB limit, and 60 % of the smallest GPU (1000 MiB) too.
    let message = refused(gpu_pod(
        "amd-big",
        json!({"amd.com/gpu": "1", "amd.com/gpumem": "600"}),
        false,
    ))
    .await;
    for part in [
        "ResourceQuota default/team",
        "limits.amd.com/gpumem",
        "to 500 MiB",
        "0 used",
        "asks for 600",
    ] {
        assert!(message.contains(part), "{part} missing in: {message}");
    }
    let message = refused(gpu_pod(
        "amd-pct",
        json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "60"}),
        false,
    ))
    .await;
    assert!(message.contains("asks for 600"), "{message}");
    // NVIDIA: per-GPU memory × GPU count, 2 × 600 MiB over 1000.
    let message = refused(gpu_pod(
        "nv-big",
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "600"}),
        false,
    ))
    .await;
    assert!(
        message.contains("limits.nvidia.com/gpumem") && message.contains("asks for 1200"),
        "{message}"
    );
    // Within the quota: admitted.
    for (name, limits) in [
        (
            "amd-ok",
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "400"}),
        ),
        (
            "nv-ok",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
        ),
    ] {
        created_pod(&c.client, name, limits, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_racing_for_the_last_quota_never_both_pass_filter() {
    let (_api, client, s) = scheduler_with_quota(json!({"limits.amd.com/gpumem": "150"})).await;
    let a = amd_pod(&client, "a", 100, false).await;
    let b = amd_pod(&client, "b", 100, false).await;
    let (ra, rb) = tokio::join!(
        s.filter(common::filter_args(&a)),
        s.filter(common::filter_args(&b))
    );
    let passed: Vec<&str> = [("a", &ra), ("b", &rb)]
        .into_iter()
        .filter(|(_, r)| r.nodenames.as_deref() == Some(&["n".to_string()][..]))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(passed.len(), 1, "{ra:?} {rb:?}");
    let (loser, result) = if passed[0] == "a" {
        ("b", &rb)
    } else {
        ("a", &ra)
    };
    let why = &result.failed_and_unresolvable_nodes["n"];
    assert!(
        why.contains("ResourceQuota default/gpus limits limits.amd.com/gpumem to 150 MiB")
            && why.contains("100 used")
            && why.contains("asks for 100"),
        "{why}"
    );
    assert_eq!(used(&s, AMD_MEM), 100);
    let note = event_note(&client, loser, "QuotaExceeded").await;
    assert!(
        note.contains("limits.amd.com/gpumem") && note.contains("50 over"),
        "{note}"
    );
}

/// What a memory percentage costs depends on the card: over the quota on node `n`'s card
/// (1000 MiB, Filter's first choice: its name sorts first), within it on node `s`'s smaller
/// one (400 MiB). The extender answers `s`, `n` unresolvable with its numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_over_its_quota_on_one_node_is_placed_on_a_node_within_it() {
    let (_api, client, s) = scheduler_with_quota(json!({"limits.amd.com/gpumem": "300"})).await;
    let small = r#"[{"id":"S","count":10,"devmem":400,"devcore":100,"type":"AMD Instinct MI210","health":true}]"#;
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "s", "annotations": {"hami.io/node-amd-register": small}},
        "status": {"capacity": {"amd.com/gpu": "10"}, "allocatable": {"amd.com/gpu": "10"}}}))
    .unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    common::wait("the scheduler sees node s", || async {
        s.state().node("s").is_some()
    })
    .await;
    let limits =
        json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "50", "amd.com/gpucores": "10"});
    let pod = created_pod(&client, "half", limits, false).await;
    let args = serde_json::from_value(json!({"pod": pod, "nodenames": ["n", "s"]})).unwrap();
    let result = s.filter(args).await;
    assert_eq!(result.nodenames, Some(vec!["s".to_string()]), "{result:?}");
    let why = &result.failed_and_unresolvable_nodes["n"];
    assert!(
        why.contains("limits.amd.com/gpumem to 300 MiB") && why.contains("asks for 500"),
        "{why}"
    );
    assert_eq!(used(&s, AMD_MEM), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_rebuilds_usage_from_annotations_and_still_refuses() {
    let (_api, client, s) = scheduler_with_quota(json!({"limits.amd.com/gpumem": "150"})).await;
    let a = amd_pod(&client, "a", 100, false).await;
    assert!(s.filter(common::filter_args(&a)).await.nodenames.is_some());
    drop(s);
    let s = common::start_scheduler(&client);
    common::wait("the new scheduler counts pod a again", || async {
        s.ready() && used(&s, AMD_MEM) == 100
    })
    .await;
    let b = amd_pod(&client, "b", 100, false).await;
    let result = s.filter(common::filter_args(&b)).await;
    assert!(result.nodenames.is_none(), "{result:?}");
    assert!(
        result.failed_and_unresolvable_nodes["n"].contains("100 used"),
        "{result:?}"
    );
    // The webhook's check reads the same rebuilt usage.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "default", "object": gpu_pod("c", json!({"amd.com/gpu": "1", "amd.com/gpumem": "100"}), false)}});
    let refusal = hami_scheduler::quota_gate::admission_refusal(
        &serde_json::to_vec(&review).unwrap(),
        &s.settings.webhook,
        &s.state(),
    )
    .expect("refused after the restart");
    assert_eq!(
        (refusal.used, refusal.asked, refusal.limit),
        (100, 100, 150)
    );
}

/// NVIDIA in Filter: of two pods racing for the last of the quota exactly one passes, charged
/// the real MiB of its memory percentage (half the A100's 40960); a restarted scheduler
/// counts exactly that again from the pod's annotations and still refuses the loser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_pods_race_for_the_last_quota_and_a_restart_counts_the_real_mib() {
    const NV_MEM: QuotaKey = QuotaKey::new(Vendor::Nvidia, Dimension::MemoryMib);
    let (_api, client) = common::api().await;
    common::create_node(
        &client,
        json!({"annotations": {
            "hami.io/node-nvidia-register": a100_register()}}),
        json!({"capacity": {"nvidia.com/gpu": "10"}, "allocatable": {"nvidia.com/gpu": "10"}}),
    )
    .await;
    create_quota(
        &client,
        "gpus",
        json!({"limits.nvidia.com/gpumem": "30000"}),
    )
    .await;
    let s = scheduler_seeing_quota(&client).await;
    let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50",
        "nvidia.com/gpucores": "10"});
    let a = created_pod(&client, "a", limits.clone(), false).await;
    let b = created_pod(&client, "b", limits, false).await;
    let (ra, rb) = tokio::join!(
        s.filter(common::filter_args(&a)),
        s.filter(common::filter_args(&b))
    );
    let (loser, refused) = match (&ra.nodenames, &rb.nodenames) {
        (Some(_), None) => (&b, &rb),
        (None, Some(_)) => (&a, &ra),
        _ => panic!("exactly one passes: {ra:?} {rb:?}"),
    };
    assert!(
        refused.failed_and_unresolvable_nodes["n"].contains("asks for 20480"),
        "{refused:?}"
    );
    assert_eq!(used(&s, NV_MEM), 20_480);
    drop(s);
    let s = scheduler_seeing_quota(&client).await;
    common::wait("the new scheduler counts the winner again", || async {
        used(&s, NV_MEM) == 20_480
    })
    .await;
    let again = s.filter(common::filter_args(loser)).await;
    assert!(again.nodenames.is_none(), "{again:?}");
    assert!(
        again.failed_and_unresolvable_nodes["n"].contains("20480 used"),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_charge_is_released_when_it_ends_not_when_its_deletion_starts() {
    let (_api, client, s) = scheduler_with_quota(json!({"limits.amd.com/gpumem": "200"})).await;
    let held = amd_pod(&client, "held", 100, true).await;
    let done = amd_pod(&client, "done", 100, false).await;
    for pod in [&held, &done] {
        assert!(s.filter(common::filter_args(pod)).await.nodenames.is_some());
    }
    common::wait("both pods are counted from their annotations", || async {
        let st = s.state();
        !st.is_pending(held.metadata.uid.as_deref().unwrap())
            && !st.is_pending(done.metadata.uid.as_deref().unwrap())
    })
    .await;
    assert_eq!(used(&s, AMD_MEM), 200);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Deletion starts (a finalizer keeps the pod): its containers may still run.
    pods.delete("held", &DeleteParams::default()).await.unwrap();
    pods.patch_status(
        "done",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    // The watch delivers in order: once `done` is released, `held`'s deletion was seen.
    common::wait("the finished pod is released", || async {
        used(&s, AMD_MEM) == 100
    })
    .await;
    let next = amd_pod(&client, "next", 150, false).await;
    let result = s.filter(common::filter_args(&next)).await;
    assert!(result.nodenames.is_none(), "{result:?}");
    // The finalizer goes, the pod is removed: its charge with it.
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    common::wait("the deleted pod is released", || async {
        used(&s, AMD_MEM) == 0
    })
    .await;
    assert!(
        s.filter(common::filter_args(&next))
            .await
            .nodenames
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_quota_value_is_ignored_with_an_event_naming_the_key() {
    let (_api, client, s) = scheduler_with_quota(json!({
        "limits.amd.com/gpumem": "-5", "limits.nvidia.com/gpucores": "0.5", "limits.amd.com/gpu": "1"
    }))
    .await;
    let note = event_note(&client, "gpus", "QuotaValueIgnored").await;
    assert!(
        note.contains("spec.hard[limits.amd.com/gpumem]") && note.contains("\"-5\""),
        "{note}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let all = events.list(&ListParams::default()).await.unwrap().items;
    let about_quota = all
        .iter()
        .filter(|e| e.reason.as_deref() == Some("QuotaValueIgnored"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ResourceQuota"));
    assert!(about_quota.count() >= 1, "{all:?}");
    common::wait("the fractional value is reported too", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("spec.hard[limits.nvidia.com/gpucores]"))
            })
    })
    .await;
    // The bad key limits nothing; the good one in the same quota still does.
    let a = amd_pod(&client, "a", 900, false).await;
    assert!(s.filter(common::filter_args(&a)).await.nodenames.is_some());
    let b = amd_pod(&client, "b", 10, false).await;
    let result = s.filter(common::filter_args(&b)).await;
    assert!(
        result.failed_and_unresolvable_nodes["n"].contains("limits.amd.com/gpu to 1 GPUs"),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_usage_and_limits_are_exported_with_hamis_names_and_labels() {
    let (_api, client, s) = scheduler_with_quota(json!({
        "limits.amd.com/gpumem": "150", "limits.amd.com/gpu": "4", "limits.amd.com/gpucores": "100"
    }))
    .await;
    let a = amd_pod(&client, "a", 100, false).await;
    assert!(s.filter(common::filter_args(&a)).await.nodenames.is_some());
    let text = s.metrics.render(&s.state());
    // HAMi's labels: `quota_name` is the resource, `limit` (on the used series) its limit.
    let row = |family: &str, resource: &str, limit: Option<u64>| {
        text.lines()
            .find(|l| {
                l.starts_with(&format!("{family}{{"))
                    && l.contains(r#"namespace="default""#)
                    && l.contains(&format!(r#"quota_name="{resource}""#))
                    && limit.is_none_or(|v| l.contains(&format!(r#"limit="{v}""#)))
            })
            .unwrap_or_else(|| panic!("{family} {resource} missing in\n{text}"))
            .to_string()
    };
    assert!(
        row("hami_resource_quota_used", "amd.com/gpumem", Some(150)).ends_with(" 100.0"),
        "{text}"
    );
    assert!(
        row("hami_resource_quota_limit", "amd.com/gpumem", None).ends_with(" 150.0"),
        "{text}"
    );
    assert!(
        !row("hami_resource_quota_limit", "amd.com/gpumem", None).contains("limit="),
        "{text}"
    );
    assert!(
        row("hami_resource_quota_used", "amd.com/gpu", Some(4)).ends_with(" 1.0"),
        "{text}"
    );
    assert!(
        row("hami_resource_quota_limit", "amd.com/gpu", None).ends_with(" 4.0"),
        "{text}"
    );
    // 10 % of a 100-CU GPU: 10 CUs, charged as their share of the GPU's CUs.
    assert!(
        row("hami_resource_quota_used", "amd.com/gpucores", Some(100)).ends_with(" 10.0"),
        "{text}"
    );
}
