//! D-33 through the shipped webhook configuration on the embedded API server: a tenant's
//! UPDATE that lowers, raises, garbles or removes a DRA pod's quota charge is refused — by
//! the main webhook, and by the guard where the pod is labelled to skip the main one — and
//! the charge and the namespace's usage stay as admitted; updates that leave the charge
//! alone pass; a charge forged into a CREATE is refused; a pods/status write (whose labels
//! and annotations the API server keeps, as upstream's podStatusStrategy does) that changes
//! the charge or a D-4 annotation is refused by the guard.

use super::quota::{AMD_MEM, used, with_quota};
use super::*;

use hami_protocol::names::pod::DRA_QUOTA_CHARGE;
use kube::api::{Patch, PatchParams};

async fn patch(c: &Cluster, name: &str, metadata: Value) -> Result<Pod, String> {
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await
        .map_err(|e| e.to_string())
}

/// A tenant's merge patch of the pod's status subresource carrying `metadata`.
async fn patch_status(c: &Cluster, name: &str, body: Value) -> Result<Pod, String> {
    Api::<Pod>::namespaced(c.client.clone(), "default")
        .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(|e| e.to_string())
}

fn charge_of(pod: &Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(DRA_QUOTA_CHARGE)
        .cloned()
}

/// Every way a tenant could rewrite the charge is refused by `webhook`, with what to do.
async fn every_rewrite_is_refused(c: &Cluster, name: &str, real: &str, webhook: &str) {
    let rewrites = [
        json!("amd.com/gpu=1,amd.com/gpumem=1"),
        json!("amd.com/gpu=1,amd.com/gpumem=65536"),
        json!("amd.com/gpu=lots"),
        json!(""),
        Value::Null,
    ];
    for value in rewrites {
        let message = patch(c, name, json!({"annotations": {DRA_QUOTA_CHARGE: value}}))
            .await
            .map(|p| format!("{:?} {:?}", p.metadata.annotations, p.metadata.labels))
            .expect_err("a tenant changed the charge");
        for part in [
            &format!("admission webhook \"{webhook}\" denied the request"),
            "metadata.annotations[hami.io/dra-quota-charge]",
            "when the pod was admitted",
            "delete the pod and create it again",
        ] {
            assert!(
                message.contains(part),
                "{value}: {part} missing in {message}"
            );
        }
    }
    let stored = Api::<Pod>::namespaced(c.client.clone(), "default")
        .get(name)
        .await
        .unwrap();
    assert_eq!(charge_of(&stored).as_deref(), Some(real));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_rewrite_the_charge_of_its_dra_pod() {
    let c = with_quota(json!({"limits.amd.com/gpumem": "40000"})).await;
    let pod = create(&c, &amd_pod("fits", dra(), slice_limits()))
        .await
        .unwrap();
    let real = charge_of(&pod).expect("the webhook wrote the charge");
    wait("the admission is charged", || async {
        used(&c.scheduler, AMD_MEM) == 4096
    })
    .await;

    every_rewrite_is_refused(&c, "fits", &real, "vgpu.hami.io").await;
    // Other updates of the pod never reach the webhook's refusal.
    let relabelled = patch(
        &c,
        "fits",
        json!({"labels": {"team": "a"}, "annotations": {"example.com/note": "x"}}),
    )
    .await
    .unwrap();
    assert_eq!(charge_of(&relabelled), Some(real.clone()));
    // Labelled to skip the main webhook (a label change, allowed): the guard, which has no
    // selectors, refuses instead.
    patch(&c, "fits", json!({"labels": {"hami.io/webhook": "ignore"}}))
        .await
        .unwrap();
    every_rewrite_is_refused(&c, "fits", &real, "guard.vgpu.hami.io").await;
    bound(&c, "fits").await;
    assert_eq!(used(&c.scheduler, AMD_MEM), 4096);
    status_writes_cannot_rewrite_owned_annotations(&c, "fits", &real).await;
    assert_eq!(used(&c.scheduler, AMD_MEM), 4096);

    // Brought along at CREATE: refused, whatever its value.
    let mut annotations = dra();
    annotations[DRA_QUOTA_CHARGE] = json!("amd.com/gpu=0");
    let message = create(&c, &amd_pod("forged", annotations, slice_limits()))
        .await
        .unwrap_err();
    assert!(
        message.contains("metadata.annotations[hami.io/dra-quota-charge]")
            && message.contains("remove it from the pod"),
        "{message}"
    );
}

/// Through pods/status, which only the guard is sent (D-33): the API server keeps a status
/// write's annotations, so without the guard these would land. Refused: a changed or removed
/// charge, a forged D-4 annotation. Let through: a status write that leaves them alone, its
/// label kept as upstream keeps it (the route really carries metadata).
async fn status_writes_cannot_rewrite_owned_annotations(c: &Cluster, name: &str, real: &str) {
    let guard = "admission webhook \"guard.vgpu.hami.io\" denied the request";
    for value in [json!("amd.com/gpu=1,amd.com/gpumem=1"), Value::Null] {
        let message = patch_status(
            c,
            name,
            json!({"metadata": {"annotations": {DRA_QUOTA_CHARGE: value}},
                   "status": {"message": "tenant"}}),
        )
        .await
        .map(|p| format!("{:?}", p.metadata.annotations))
        .expect_err("a status write changed the charge");
        assert!(
            message.contains(guard)
                && message.contains("metadata.annotations[hami.io/dra-quota-charge]"),
            "{value}: {message}"
        );
    }
    let message = patch_status(
        c,
        name,
        json!({"metadata": {"annotations": {"hami.io/amd-cu-allocated": "{\"GPU-1\":\"0-103\"}"}}}),
    )
    .await
    .map(|p| format!("{:?}", p.metadata.annotations))
    .expect_err("a status write forged a D-4 annotation");
    assert!(
        message.contains(guard) && message.contains("hami.io/amd-cu-allocated"),
        "{message}"
    );
    let written = patch_status(
        c,
        name,
        json!({"metadata": {"labels": {"status-writer": "yes"}}, "status": {"message": "ok"}}),
    )
    .await
    .unwrap();
    assert_eq!(
        written
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("status-writer"))
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        written.status.and_then(|s| s.message).as_deref(),
        Some("ok")
    );
    let annotations = written.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(DRA_QUOTA_CHARGE).map(String::as_str),
        Some(real)
    );
    assert!(!annotations.contains_key("hami.io/amd-cu-allocated"));
}
