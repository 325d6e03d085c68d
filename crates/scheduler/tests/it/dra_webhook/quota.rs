//! Namespace quotas in DRA mode (issue 30, D-29), through the shipped webhook: a pod whose
//! claims (on the smallest shape they can land on) or NVIDIA request exceed its namespace's
//! quota is refused with the numbers; of two pods racing for the last quota exactly one is
//! admitted, also when neither is stored yet (the admission's reservation counts); a restarted scheduler counts the admitted pods again from their charge
//! annotation; a pod's charge goes when it ends; a bad quota value limits nothing.

use super::*;

use hami_protocol::names::Vendor;
use hami_scheduler::quota::{Dimension, QuotaKey};
use hami_scheduler::runtime::Scheduler;
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams};

pub(super) const AMD_GPU: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::Slices);
pub(super) const AMD_MEM: QuotaKey = QuotaKey::new(Vendor::Amd, Dimension::MemoryMib);

pub(super) fn used(s: &Scheduler, key: QuotaKey) -> u64 {
    s.state().quota.ledger().used("default").get(key)
}

/// The webhook in front of a DRA node with two MI210s (64 GiB, 104 CUs) and the quota
/// `gpus` in `default`, seen by the scheduler.
pub(super) async fn with_quota(hard: Value) -> Cluster {
    let c = start(Settings::default()).await;
    dra_node(
        &c.client,
        "dra-node",
        (0..2)
            .map(|i| device(i, "AMD Instinct MI210", "64Gi", 104, 0))
            .collect(),
    )
    .await;
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": "default"}, "spec": {"hard": hard}
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    wait("the scheduler sees the quota", || async {
        c.scheduler.state().quota.ledger().governs("default")
    })
    .await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_pods_over_the_quota_are_refused_at_admission_for_amd_and_nvidia() {
    let c =
        with_quota(json!({"limits.amd.com/gpumem": "40000", "limits.nvidia.com/gpumem": "1000"}))
            .await;
    // 75 % of the MI210's 64 GiB: 49152 MiB.
    let message = create(
        &c,
        &amd_pod(
            "too-big",
            dra(),
            json!({"amd.com/gpu": "1", "amd.com/gpumem-percentage": "75"}),
        ),
    )
    .await
    .unwrap_err();
    for part in [
        "ResourceQuota default/gpus",
        "limits.amd.com/gpumem",
        "to 40000 MiB",
        "0 used",
        "asks for 49152",
    ] {
        assert!(message.contains(part), "{part} missing in: {message}");
    }
    // Its NVIDIA request (device-plugin) counts too.
    let message = create(
        &c,
        &amd_pod(
            "nv-big",
            dra(),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "1000", "nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}),
        ),
    )
    .await
    .unwrap_err();
    assert!(
        message.contains("limits.nvidia.com/gpumem") && message.contains("asks for 2000"),
        "{message}"
    );
    // Within the quota: admitted, its charge written on it and counted from admission on.
    let pod = create(&c, &amd_pod("fits", dra(), slice_limits()))
        .await
        .unwrap();
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["hami.io/dra-quota-charge"],
        "amd.com/gpu=1,amd.com/gpumem=4096,amd.com/gpucores=25"
    );
    assert_eq!(used(&c.scheduler, AMD_MEM), 4096);
    bound(&c, "fits").await;
    assert_eq!(used(&c.scheduler, AMD_MEM), 4096);
    // Exported as the device-plugin mode's usage is.
    let text = c.scheduler.metrics.render(&c.scheduler.state());
    assert!(
        text.lines()
            .any(|l| l.starts_with("hami_resource_quota_used{")
                && l.contains(r#"namespace="default""#)
                && l.contains(r#"quota_name="amd.com/gpumem""#)
                && l.contains(r#"limit="40000""#)
                && l.ends_with(" 4096.0")),
        "{text}"
    );
    let message = create(
        &c,
        &amd_pod(
            "rest",
            dra(),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "36000"}),
        ),
    )
    .await
    .unwrap_err();
    assert!(
        message.contains("4096 used") && message.contains("asks for 36000"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_dra_pods_racing_for_the_last_quota_one_is_admitted() {
    let c = with_quota(json!({"limits.amd.com/gpu": "1"})).await;
    let (pa, pb) = (
        amd_pod("a", dra(), slice_limits()),
        amd_pod("b", dra(), slice_limits()),
    );
    let (a, b) = tokio::join!(create(&c, &pa), create(&c, &pb));
    let (winner, refused) = match (&a, &b) {
        (Ok(_), Err(e)) => ("a", e),
        (Err(e), Ok(_)) => ("b", e),
        _ => panic!("exactly one must pass: {a:?} {b:?}"),
    };
    assert!(
        refused.contains("limits.amd.com/gpu to 1 GPUs") && refused.contains("1 used"),
        "{refused}"
    );
    bound(&c, winner).await;
    // Seen and placed: its reservation became its charge, not a second one.
    assert_eq!(used(&c.scheduler, AMD_GPU), 1);
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .delete(winner, &DeleteParams::default())
        .await
        .unwrap();
    wait("the winner's charge is released", || async {
        used(&c.scheduler, AMD_GPU) == 0
    })
    .await;

    // Straight to the webhook, so no pod is ever stored: only the admission's reservation
    // can refuse the second. A dry run reserves nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(hami_scheduler::http::serve_on(
        hami_scheduler::http::router(c.scheduler.clone()),
        listener,
        None,
    ));
    let post = |name: &'static str, dry_run: bool| {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": name, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
            "namespace": "default", "dryRun": dry_run, "object": amd_pod(name, dra(), slice_limits())}});
        tokio::task::spawn_blocking(move || {
            let (status, body) =
                crate::http_api::request(port, "POST", "/webhook", review.to_string().as_bytes());
            assert_eq!(status, 200, "{body}");
            crate::http_api::json_body(&body)["response"].clone()
        })
    };
    assert_eq!(post("dry", true).await.unwrap()["allowed"], true);
    assert_eq!(used(&c.scheduler, AMD_GPU), 0);
    let (x, y) = tokio::join!(post("x", false), post("y", false));
    let (x, y) = (x.unwrap(), y.unwrap());
    let allowed = [&x, &y].iter().filter(|r| r["allowed"] == true).count();
    assert_eq!(allowed, 1, "{x} {y}");
    let denied = if x["allowed"] == true { &y } else { &x };
    assert!(
        denied["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1 used")),
        "{denied}"
    );
    assert_eq!(used(&c.scheduler, AMD_GPU), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_counts_dra_pods_again_and_an_ended_pod_is_released() {
    let c = with_quota(json!({"limits.amd.com/gpu": "1"})).await;
    create(&c, &amd_pod("a", dra(), slice_limits()))
        .await
        .unwrap();
    bound(&c, "a").await;
    // A fresh scheduler (a restart): the usage comes back from the pod's annotation.
    let again = common::start_scheduler(&c.client);
    wait("the new scheduler counts pod a", || async {
        again.ready() && used(&again, AMD_GPU) == 1
    })
    .await;
    let slices = Api::<ResourceSlice>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "default", "object": amd_pod("b", dra(), slice_limits())}});
    let refusal = hami_scheduler::quota_admission::admit(
        &serde_json::to_vec(&review).unwrap(),
        &again.settings.webhook,
        &mut again.state(),
        &shapes(slices.iter()),
        false,
        std::time::Instant::now(),
    )
    .expect_err("refused after the restart");
    assert_eq!((refusal.used, refusal.asked, refusal.limit), (1, 1, 1));
    // The pod ends: released by both, and the next one is admitted.
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    wait("pod a's charge is released", || async {
        used(&c.scheduler, AMD_GPU) == 0 && used(&again, AMD_GPU) == 0
    })
    .await;
    create(&c, &amd_pod("b", dra(), slice_limits()))
        .await
        .unwrap();
    // Deleted: released too.
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    wait("pod b's charge is released", || async {
        used(&c.scheduler, AMD_GPU) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_quota_value_is_reported_and_limits_no_dra_pod() {
    let c = with_quota(json!({"limits.amd.com/gpumem": "-5", "limits.amd.com/gpu": "1"})).await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    wait("a QuotaValueIgnored event names the key", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("QuotaValueIgnored")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpus")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("spec.hard[limits.amd.com/gpumem]"))
            })
    })
    .await;
    // 60000 MiB: the ignored key limits nothing; the good key in the same quota still does.
    create(
        &c,
        &amd_pod(
            "big",
            dra(),
            json!({"amd.com/gpu": "1", "amd.com/gpumem": "60000"}),
        ),
    )
    .await
    .unwrap();
    let message = create(&c, &amd_pod("more", dra(), slice_limits()))
        .await
        .unwrap_err();
    assert!(
        message.contains("limits.amd.com/gpu to 1 GPUs"),
        "{message}"
    );
}
