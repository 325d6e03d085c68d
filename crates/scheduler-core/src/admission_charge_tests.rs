//! D-33: the DRA quota charge (D-29) is the webhook's. A tenant's UPDATE that lowers,
//! raises, garbles or removes it is refused with what to do instead; one that leaves it
//! alone is not; a charge forged into a CREATE is refused, and a writer's is overwritten
//! with the real one.

use super::tests::{apply, pod, review};
use super::*;

const TENANT: &str = "system:serviceaccount:team-a:deployer";
const SCHEDULER: &str = "system:serviceaccount:kube-system:hami-scheduler";

fn dra() -> WebhookConfig {
    WebhookConfig {
        amd_mode: AmdMode::Dra,
        ..WebhookConfig::default()
    }
}

fn dra_pod(annotations: Value) -> Value {
    json!({"metadata": {"name": "p", "namespace": "team-a", "annotations": annotations},
        "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096"}}}]}})
}

/// The pod as the webhook admits it for a tenant: its real charge written.
fn admitted() -> Value {
    let raw = dra_pod(json!({}));
    let Admission::Allow { patch, .. } = admit(&pod(raw.clone()), &dra()) else {
        panic!("the DRA pod is not admitted")
    };
    apply(raw, &patch)
}

fn charge(pod: &Value) -> &str {
    pod["metadata"]["annotations"][DRA_CHARGE_ANNOTATION]
        .as_str()
        .expect("no charge written")
}

fn with_charge(mut pod: Value, value: Option<&str>) -> Value {
    let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
    match value {
        Some(v) => annotations.insert(DRA_CHARGE_ANNOTATION.into(), json!(v)),
        None => annotations.remove(DRA_CHARGE_ANNOTATION),
    };
    pod
}

#[test]
fn a_tenant_may_not_change_the_charge_of_its_pod() {
    let old = admitted();
    let real = charge(&old).to_owned();
    assert!(real.contains("amd.com/gpumem=4096"), "{real}");
    let lowered = real.replace("amd.com/gpumem=4096", "amd.com/gpumem=1");
    let raised = real.replace("amd.com/gpumem=4096", "amd.com/gpumem=65536");
    let cases = [
        ("lowered", Some(lowered.as_str())),
        ("raised", Some(raised.as_str())),
        ("zero", Some("")),
        ("garbage", Some("amd.com/gpu=lots,,=")),
        ("removed", None),
    ];
    let (old_pod, config) = (pod(old.clone()), dra());
    for (case, value) in cases {
        let new = pod(with_charge(old.clone(), value));
        match review_pod(
            &review("UPDATE", TENANT, Some(&new), Some(&old_pod)),
            &config,
        ) {
            Admission::Deny { message } => {
                for part in [
                    "metadata.annotations[hami.io/dra-quota-charge]",
                    "charge its namespace's quotas",
                    "when the pod was admitted",
                    TENANT,
                    "may not set, change or remove it",
                    "delete the pod and create it again",
                ] {
                    assert!(
                        message.contains(part),
                        "{case}: {part} missing in {message}"
                    );
                }
            }
            other => panic!("{case}: {other:?}"),
        }
        // The scheduler's own identity may (no component rewrites it today; D-4's writers).
        assert!(
            matches!(
                review_pod(
                    &review("UPDATE", SCHEDULER, Some(&new), Some(&old_pod)),
                    &config
                ),
                Admission::Ignore { .. }
            ),
            "{case}"
        );
    }
    // Setting one on a pod that had none (a device-plugin pod, or one admitted before).
    let plain = pod(with_charge(old.clone(), None));
    let set = pod(old.clone());
    assert!(matches!(
        review_pod(&review("UPDATE", TENANT, Some(&set), Some(&plain)), &config),
        Admission::Deny { message } if message.contains("hami.io/dra-quota-charge")
    ));
    // An UPDATE that leaves the charge as it is: not refused.
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    relabelled["metadata"]["annotations"]["example.com/note"] = json!("x");
    assert!(matches!(
        review_pod(
            &review("UPDATE", TENANT, Some(&pod(relabelled)), Some(&old_pod)),
            &config
        ),
        Admission::Ignore { .. }
    ));
    // D-4's own annotations keep their message.
    let mut forged = old.clone();
    forged["metadata"]["annotations"]["hami.io/amd-cu-allocated"] = json!("{}");
    match review_pod(
        &review("UPDATE", TENANT, Some(&pod(forged)), Some(&old_pod)),
        &config,
    ) {
        Admission::Deny { message } => assert!(
            message.contains(
                "hami.io/amd-cu-allocated] is written by the scheduler and the device plugins only"
            ) && message.contains(TENANT),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_charge_forged_into_a_create_is_refused_and_a_writers_is_overwritten() {
    let config = dra();
    let real = charge(&admitted()).to_owned();
    for forged in ["amd.com/gpu=0", "", "garbage", real.as_str()] {
        let raw = dra_pod(json!({DRA_CHARGE_ANNOTATION: forged}));
        match review_pod(&review("CREATE", TENANT, Some(&pod(raw)), None), &config) {
            Admission::Deny { message } => {
                for part in [
                    "metadata.annotations[hami.io/dra-quota-charge]",
                    "set by the scheduler's webhook when the pod is admitted",
                    "remove it from the pod",
                ] {
                    assert!(
                        message.contains(part),
                        "{forged:?}: {part} missing in {message}"
                    );
                }
            }
            other => panic!("{forged:?}: {other:?}"),
        }
        // Also in device-plugin mode: the webhook never writes one there.
        let raw = dra_pod(json!({DRA_CHARGE_ANNOTATION: forged}));
        assert!(matches!(
            review_pod(
                &review("CREATE", TENANT, Some(&pod(raw)), None),
                &WebhookConfig::default()
            ),
            Admission::Deny { .. }
        ));
    }
    // A writer's CREATE passes D-4, and the patch replaces what it carried with the real
    // charge (a JSON-patch `add` of an existing member replaces it).
    let raw = dra_pod(json!({DRA_CHARGE_ANNOTATION: "amd.com/gpu=0"}));
    let Admission::Allow { patch, .. } = review_pod(
        &review("CREATE", SCHEDULER, Some(&pod(raw.clone())), None),
        &config,
    ) else {
        panic!("the writer's DRA pod is not admitted")
    };
    assert_eq!(charge(&apply(raw, &patch)), real);
}
