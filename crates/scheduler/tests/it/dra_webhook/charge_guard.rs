//! D-33 through the shipped webhook configuration on the embedded API server: a tenant's
//! UPDATE that lowers, raises, garbles or removes a DRA pod's quota charge is refused — by
//! the main webhook, and by the guard where the pod is labelled to skip the main one — and
//! the charge and the namespace's usage stay as admitted; updates that leave the charge
//! alone pass; a charge forged into a CREATE is refused.

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
