//! The webhook's decision (SPEC §3, D-4) as a pure function: a pod in, "leave it", "deny
//! with this message" or "allow with this JSON patch" out. The HTTP shell wraps it in
//! AdmissionReview v1/v1beta1.
//!
//! D-4, whole: the scheduler-owned `hami.io/*` annotations may be set, changed or removed
//! only by the identities in [`WebhookConfig::annotation_writers`] (the scheduler's and the
//! device plugins' ServiceAccounts), on every CREATE and UPDATE of every pod — pods without
//! GPU requests and pods labelled `hami.io/webhook=ignore` included: such annotations are
//! how usage is counted, so a forged one takes GPUs or CUs away from real pods.

use std::collections::BTreeMap;

use hami_protocol::names::{
    ADMISSION_WRITTEN_ANNOTATIONS, DEFAULT_SCHEDULER_NAME, SCHEDULER_OWNED_ANNOTATIONS, Vendor,
    env, pod as pod_keys,
};
use hami_protocol::requests::{ContainerKind, RequestDefaults, container_slots, pod_requests};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::dra_claims::{AmdMode, ContainerClaim, Shape};
use crate::quota_admission::{DRA_CHARGE_ANNOTATION, claims_charge, format_charge};

/// What the webhook is configured with.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Our `schedulerName`; pods are handed to it.
    pub scheduler_name: String,
    /// Also take pods whose schedulerName is `default-scheduler` (the default pod value).
    pub force_overwrite_default_scheduler: bool,
    /// Request defaults the webhook makes explicit in containers' limits.
    pub defaults: RequestDefaults,
    /// Usernames (AdmissionReview `request.userInfo.username`) that may write the
    /// scheduler-owned annotations: the scheduler's and the device plugins' own identities.
    pub annotation_writers: Vec<String>,
    /// The AMD front end of pods without a `hami.io/amd-mode` annotation (`--amd-mode`).
    pub amd_mode: AmdMode,
}

/// The ServiceAccounts of the shipped manifests and chart that write scheduler-owned
/// annotations (`crates/manifests`: the scheduler, the AMD and the NVIDIA device plugin).
pub const ANNOTATION_WRITER_SERVICE_ACCOUNTS: [&str; 3] = [
    "hami-scheduler",
    "hami-device-plugin",
    "hami-nvidia-device-plugin",
];

/// The default writers: those ServiceAccounts in `namespace` (where the chart installs).
pub fn default_annotation_writers(namespace: &str) -> Vec<String> {
    ANNOTATION_WRITER_SERVICE_ACCOUNTS
        .iter()
        .map(|sa| format!("system:serviceaccount:{namespace}:{sa}"))
        .collect()
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            scheduler_name: DEFAULT_SCHEDULER_NAME.into(),
            force_overwrite_default_scheduler: true,
            defaults: RequestDefaults::default(),
            annotation_writers: default_annotation_writers("kube-system"),
            amd_mode: AmdMode::default(),
        }
    }
}

/// One AdmissionReview request for a pod, decoded.
#[derive(Debug, Clone, Copy)]
pub struct PodReview<'a> {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'a str,
    /// `request.userInfo.username`.
    pub username: &'a str,
    /// `request.object`: the pod as it will be (absent on DELETE).
    pub object: Option<&'a Pod>,
    /// The pod before an UPDATE.
    pub old_object: Option<&'a Pod>,
}

/// D-4's annotations and those the webhook writes at admission (D-33: the DRA mode's quota
/// charge, D-29, which a user lowering or removing it would escape the quota with).
fn owned_keys() -> impl Iterator<Item = &'static str> {
    SCHEDULER_OWNED_ANNOTATIONS
        .iter()
        .chain(ADMISSION_WRITTEN_ANNOTATIONS)
        .copied()
}

/// Why `key` is not the user's, and what to do instead: the charge is set when the pod is
/// admitted, so only a new pod gets a new one.
fn refusal(key: &str, config: &WebhookConfig, who: Option<&str>) -> String {
    let field = format!("metadata.annotations[{key}]");
    match (key == DRA_CHARGE_ANNOTATION, who) {
        (true, None) => format!(
            "{field} records what a DRA-mode pod's claims charge its namespace's quotas and is set by the scheduler's webhook when the pod is admitted; remove it from the pod"
        ),
        (true, Some(user)) => format!(
            "{field} records what this pod's DRA claims charge its namespace's quotas; the scheduler's webhook set it when the pod was admitted and {user} may not set, change or remove it (the writers are {}); to change what the pod asks for, delete the pod and create it again",
            writers_text(config)
        ),
        (false, None) => format!(
            "{field} is written by the scheduler and the device plugins only ({}); remove it from the pod",
            writers_text(config)
        ),
        (false, Some(user)) => format!(
            "{field} is written by the scheduler and the device plugins only ({}); {user} may not set, change or remove it",
            writers_text(config)
        ),
    }
}

fn owned_annotations(pod: &Pod) -> BTreeMap<&'static str, &str> {
    let annotations = pod.metadata.annotations.as_ref();
    owned_keys()
        .filter_map(|key| Some((key, annotations?.get(key)?.as_str())))
        .collect()
}

fn writers_text(config: &WebhookConfig) -> String {
    if config.annotation_writers.is_empty() {
        "no one is configured".into()
    } else {
        config.annotation_writers.join(", ")
    }
}

fn labelled_ignore(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(pod_keys::WEBHOOK_LABEL))
        .is_some_and(|v| v == pod_keys::WEBHOOK_IGNORE)
}

/// The decision for one request: D-4 for every pod and operation, then, for a CREATE, the
/// mutation of [`admit`]. No device shapes are known: see [`review_pod_with`].
pub fn review_pod(review: &PodReview, config: &WebhookConfig) -> Admission {
    review_pod_with(review, config, &[])
}

/// [`review_pod`] with the AMD DRA driver's device shapes (`dra_claims::shapes` of its
/// ResourceSlices), which DRA-mode pods asking for percentages need.
pub fn review_pod_with(review: &PodReview, config: &WebhookConfig, shapes: &[Shape]) -> Admission {
    let deny = |message: String| Admission::Deny { message };
    let writer = config
        .annotation_writers
        .iter()
        .any(|w| w == review.username);
    match review.operation {
        "CREATE" => {
            let Some(pod) = review.object else {
                return deny("the AdmissionReview request has no object".into());
            };
            if !writer && let Some((key, _)) = owned_annotations(pod).into_iter().next() {
                return deny(refusal(key, config, None));
            }
            if labelled_ignore(pod) {
                return Admission::Ignore {
                    why: format!(
                        "pod is labelled {}={}",
                        pod_keys::WEBHOOK_LABEL,
                        pod_keys::WEBHOOK_IGNORE
                    ),
                };
            }
            admit_checked(pod, config, shapes)
        }
        "UPDATE" => {
            let Some(pod) = review.object else {
                return deny("the AdmissionReview request has no object".into());
            };
            if writer {
                return Admission::Ignore {
                    why: format!("{} may write scheduler-owned annotations", review.username),
                };
            }
            // Without the old pod every owned annotation counts as new (fail closed).
            let before = review.old_object.map(owned_annotations).unwrap_or_default();
            let after = owned_annotations(pod);
            let changed = owned_keys().find(|key| before.get(key) != after.get(key));
            let user = if review.username.is_empty() {
                "this user"
            } else {
                review.username
            };
            match changed {
                Some(key) => deny(refusal(key, config, Some(user))),
                None => Admission::Ignore {
                    why: "no scheduler-owned annotation changed".into(),
                },
            }
        }
        other => Admission::Ignore {
            why: format!("{other} is not checked"),
        },
    }
}

/// The webhook's answer for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Not a pod for us; allowed unchanged.
    Ignore {
        /// Why it was left alone.
        why: String,
    },
    /// Allowed with an RFC 6902 patch (possibly empty).
    Allow {
        /// The JSON patch operations.
        patch: Vec<Value>,
        /// DRA mode: the ResourceClaimTemplates the patch names, which must exist before
        /// the pod is answered (empty otherwise).
        claims: Vec<ContainerClaim>,
    },
    /// Refused; the message says what to change.
    Deny {
        /// The message the user sees.
        message: String,
    },
}

/// JSON Pointer escaping (RFC 6901) of one path segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The CREATE decision for a pod from an ordinary user (not one of the annotation
/// writers): scheduler-owned annotations are refused on every pod.
pub fn admit(pod: &Pod, config: &WebhookConfig) -> Admission {
    review_pod(
        &PodReview {
            operation: "CREATE",
            username: "",
            object: Some(pod),
            old_object: None,
        },
        config,
    )
}

/// The CREATE mutation, once D-4 has been checked.
fn admit_checked(pod: &Pod, config: &WebhookConfig, shapes: &[Shape]) -> Admission {
    let deny = |message: String| Admission::Deny { message };
    let Some(spec) = &pod.spec else {
        return deny("pod has no spec".into());
    };
    if spec.containers.is_empty() {
        return deny("pod has no containers".into());
    }
    let current = spec.scheduler_name.as_deref().unwrap_or("");
    let ours = current.is_empty()
        || current == config.scheduler_name
        || (current == "default-scheduler" && config.force_overwrite_default_scheduler);
    if !ours {
        return Admission::Ignore {
            why: format!("pod already has scheduler {current:?}"),
        };
    }
    let requests = match pod_requests(pod, &config.defaults) {
        Ok(requests) => requests,
        Err(err) => return deny(err.to_string()),
    };
    if requests.iter().all(|r| r.is_empty()) {
        return Admission::Ignore {
            why: "pod requests no GPU resource".into(),
        };
    }
    let slots = container_slots(spec);
    for (slot, request) in slots.iter().zip(&requests) {
        let privileged = slot
            .container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false);
        if privileged && !request.is_empty() {
            return deny(format!(
                "{} ({}) is privileged and requests GPUs: a privileged container sees every GPU, so it cannot get a slice; drop privileged or the GPU request",
                slot.field(),
                slot.container.name
            ));
        }
    }
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return deny(
            "spec.nodeName is already set: a pod that asks for GPU slices must be placed by the scheduler; remove spec.nodeName".into(),
        );
    }

    // DRA mode: the AMD requests become claims (annotation, else the configured default).
    let amd_mode = match AmdMode::of_pod(pod, config.amd_mode) {
        Ok(mode) => mode,
        Err(message) => return deny(message),
    };
    let claims = match amd_mode {
        AmdMode::Dra => match crate::dra_claims::pod_claims(pod, &requests, shapes) {
            Ok(claims) => claims,
            Err(message) => return deny(message),
        },
        AmdMode::DevicePlugin => Vec::new(),
    };

    let mut patch = Vec::new();
    if current != config.scheduler_name {
        patch.push(json!({
            "op": if spec.scheduler_name.is_some() { "replace" } else { "add" },
            "path": "/spec/schedulerName",
            "value": config.scheduler_name,
        }));
    }
    for (slot, request) in slots.iter().zip(&requests) {
        let base = match slot.kind {
            ContainerKind::App => format!("/spec/containers/{}", slot.index),
            _ => format!("/spec/initContainers/{}", slot.index),
        };
        let converted = claims
            .iter()
            .any(|c| c.kind == slot.kind && c.index == slot.index);
        let added: Vec<&(&'static str, String)> = Vendor::ALL
            .iter()
            // A converted container's AMD request lives in its claim now.
            .filter(|v| !(converted && **v == Vendor::Amd))
            .filter_map(|v| request.get(*v))
            .flat_map(|r| r.added_limits.iter())
            .collect();
        if !added.is_empty() {
            let resources = slot.container.resources.as_ref();
            let map = || {
                Value::Object(
                    added
                        .iter()
                        .map(|(k, v)| (k.to_string(), json!(v)))
                        .collect(),
                )
            };
            match resources {
                None => patch.push(json!({"op": "add", "path": format!("{base}/resources"), "value": {"limits": map()}})),
                Some(r) if r.limits.is_none() => {
                    patch.push(json!({"op": "add", "path": format!("{base}/resources/limits"), "value": map()}))
                }
                Some(_) => {
                    for (key, value) in &added {
                        patch.push(json!({"op": "add", "path": format!("{base}/resources/limits/{}", escape(key)), "value": value}));
                    }
                }
            }
        }
        // The CUDA hook reads the priority from the environment.
        if let Some(priority) = request.nvidia.as_ref().and_then(|r| r.priority) {
            let envs = slot.container.env.as_deref().unwrap_or_default();
            if !envs.iter().any(|e| e.name == env::CUDA_TASK_PRIORITY) {
                let var = json!({"name": env::CUDA_TASK_PRIORITY, "value": priority.to_string()});
                if slot.container.env.is_none() {
                    patch.push(json!({"op": "add", "path": format!("{base}/env"), "value": [var]}));
                } else {
                    patch.push(json!({"op": "add", "path": format!("{base}/env/-"), "value": var}));
                }
            }
        }
    }
    patch.extend(crate::dra_claims::patch(spec, &claims));
    if !claims.is_empty() {
        // What the claims cost the namespace's quota, read back by the state (D-29).
        let charge = format_charge(&claims_charge(pod, &requests, shapes, &claims));
        patch.push(match &pod.metadata.annotations {
            // A pod sent without `metadata` (or with an empty one) has no object to add
            // `annotations` to: add the whole member (an empty one is replaced, losing nothing).
            None if pod.metadata == ObjectMeta::default() => {
                json!({"op": "add", "path": "/metadata", "value": {"annotations": {DRA_CHARGE_ANNOTATION: charge}}})
            }
            None => json!({"op": "add", "path": "/metadata/annotations", "value": {DRA_CHARGE_ANNOTATION: charge}}),
            Some(_) => json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(DRA_CHARGE_ANNOTATION)), "value": charge}),
        });
    }
    Admission::Allow { patch, claims }
}

#[cfg(test)]
#[path = "admission_charge_tests.rs"]
mod charge_tests;

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    /// Applies an RFC 6902 patch the simple way (add/replace, and remove of a member), to
    /// check that the patch really produces the defaulted pod.
    pub(super) fn apply(mut doc: Value, patch: &[Value]) -> Value {
        for op in patch {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let target = doc
                .pointer_mut(parent)
                .unwrap_or_else(|| panic!("{parent} missing"));
            match target {
                Value::Object(map) if op["op"] == "remove" => {
                    map.remove(&last)
                        .unwrap_or_else(|| panic!("{path} missing"));
                }
                Value::Array(items) if last == "-" => items.push(op["value"].clone()),
                Value::Object(map) => {
                    map.insert(last, op["value"].clone());
                }
                other => panic!("cannot patch {other}"),
            }
        }
        doc
    }

    #[test]
    fn sets_scheduler_and_defaults() {
        let raw = json!({"metadata": {"name": "p"}, "spec": {
        "schedulerName": "default-scheduler",
        "initContainers": [{"name": "i"}],
        "containers": [
            {"name": "a", "resources": {"limits": {"amd.com/gpumem-percentage": "50"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}}},
            {"name": "c"}
        ]}});
        let Admission::Allow { patch, .. } = admit(&pod(raw.clone()), &WebhookConfig::default())
        else {
            panic!()
        };
        let patched = apply(raw, &patch);
        assert_eq!(patched["spec"]["schedulerName"], "hami-scheduler");
        assert_eq!(
            patched["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"],
            "1"
        );
        assert_eq!(
            patched["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpucores"],
            "100"
        );
        assert_eq!(
            patched["spec"]["containers"][1]["env"][0]["name"],
            "CUDA_TASK_PRIORITY"
        );
        assert!(patched["spec"]["containers"][2].get("resources").is_none());
        // The patched pod is stable: a second pass adds nothing but nothing is lost.
        let Admission::Allow { patch: again, .. } = admit(&pod(patched), &WebhookConfig::default())
        else {
            panic!()
        };
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn adds_missing_resources_and_limits_objects() {
        let raw = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"amd.com/gpucores": "20"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]}});
        let Admission::Allow { patch, .. } = admit(&pod(raw.clone()), &WebhookConfig::default())
        else {
            panic!()
        };
        let patched = apply(raw, &patch);
        assert_eq!(
            patched["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"],
            "1"
        );
        assert_eq!(patched["spec"]["schedulerName"], "hami-scheduler");
        let ops: Vec<&str> = patch.iter().map(|p| p["path"].as_str().unwrap()).collect();
        assert!(
            ops.contains(&"/spec/containers/1/resources/limits/nvidia.com~1gpucores"),
            "{ops:?}"
        );
    }

    #[test]
    fn ignores_and_denials() {
        let cfg = WebhookConfig::default();
        let other = pod(
            json!({"metadata": {}, "spec": {"schedulerName": "volcano", "containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
        );
        assert!(matches!(admit(&other, &cfg), Admission::Ignore { .. }));
        let plain = pod(json!({"metadata": {}, "spec": {"containers": [{"name": "a"}]}}));
        assert!(matches!(admit(&plain, &cfg), Admission::Ignore { .. }));
        let no_force = WebhookConfig {
            force_overwrite_default_scheduler: false,
            ..WebhookConfig::default()
        };
        let default_sched = pod(
            json!({"metadata": {}, "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
        );
        assert!(matches!(
            admit(&default_sched, &no_force),
            Admission::Ignore { .. }
        ));

        let cases = [
            (
                json!({"metadata": {}, "spec": {"containers": []}}),
                "no containers",
            ),
            (json!({"metadata": {}}), "no spec"),
            (
                json!({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "101"}}}]}}),
                "from 1 to 100",
            ),
            (
                json!({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "1.5"}}}]}}),
                "whole number",
            ),
            (
                json!({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "0"}}}]}}),
                "from 1 to 100",
            ),
            (
                json!({"metadata": {"annotations": {"hami.io/amd-devices-allocated": "x"}}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
                "hami.io/amd-devices-allocated] is written by the scheduler",
            ),
            (
                json!({"metadata": {}, "spec": {"containers": [{"name": "a", "securityContext": {"privileged": true}, "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
                "is privileged",
            ),
            (
                json!({"metadata": {}, "spec": {"nodeName": "n1", "containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
                "spec.nodeName",
            ),
        ];
        for (raw, expected) in cases {
            match admit(&pod(raw.clone()), &cfg) {
                Admission::Deny { message } => {
                    assert!(message.contains(expected), "{raw}: {message}")
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
        // A privileged container without GPUs beside a GPU container is fine.
        let mixed = pod(json!({"metadata": {}, "spec": {"containers": [
            {"name": "a", "securityContext": {"privileged": true}},
            {"name": "b", "resources": {"limits": {"amd.com/gpu": "1"}}}]}}));
        assert!(matches!(admit(&mixed, &cfg), Admission::Allow { .. }));
    }

    pub(super) fn review<'a>(
        operation: &'a str,
        username: &'a str,
        object: Option<&'a Pod>,
        old_object: Option<&'a Pod>,
    ) -> PodReview<'a> {
        PodReview {
            operation,
            username,
            object,
            old_object,
        }
    }

    #[test]
    fn owned_annotations_are_refused_on_every_pod_and_every_update() {
        let cfg = WebhookConfig::default();
        let forged = json!({"hami.io/amd-cu-allocated": r#"{"GPU-1":"0-103"}"#});
        let gpu = json!({"limits": {"amd.com/gpu": "1"}});
        // Pods the old webhook let through because it ignored them.
        let holes = [
            // No GPU request (the live forgery of issue 17).
            json!({"metadata": {"annotations": forged}, "spec": {"containers": [{"name": "a"}]}}),
            // Labelled to skip the webhook.
            json!({"metadata": {"annotations": forged, "labels": {"hami.io/webhook": "ignore"}},
                "spec": {"containers": [{"name": "a", "resources": gpu}]}}),
            // Another scheduler's pod.
            json!({"metadata": {"annotations": forged}, "spec": {"schedulerName": "volcano", "containers": [{"name": "a"}]}}),
        ];
        for raw in holes {
            match admit(&pod(raw.clone()), &cfg) {
                Admission::Deny { message } => assert!(
                    message.contains("hami.io/amd-cu-allocated")
                        && message.contains("system:serviceaccount:kube-system:hami-scheduler"),
                    "{message}"
                ),
                other => panic!("{raw}: {other:?}"),
            }
        }
        // Labelled to skip: not mutated (nothing else changes for such pods).
        let skipped = pod(
            json!({"metadata": {"labels": {"hami.io/webhook": "ignore"}},
            "spec": {"containers": [{"name": "a", "resources": gpu}]}}),
        );
        assert!(matches!(admit(&skipped, &cfg), Admission::Ignore { .. }));

        // CREATE by the scheduler's own identity: allowed (and mutated as usual).
        let sa = "system:serviceaccount:kube-system:hami-scheduler";
        let with = pod(
            json!({"metadata": {"annotations": forged}, "spec": {"containers": [{"name": "a", "resources": gpu}]}}),
        );
        assert!(matches!(
            review_pod(&review("CREATE", sa, Some(&with), None), &cfg),
            Admission::Allow { .. }
        ));

        // UPDATE: setting, changing or removing one is refused to everyone else.
        let plain = pod(
            json!({"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "a"}]}}),
        );
        let changed = pod(
            json!({"metadata": {"annotations": {"hami.io/amd-cu-allocated": r#"{"GPU-1":"0-1"}"#}}, "spec": {"containers": [{"name": "a"}]}}),
        );
        let user = "alice";
        for (old, new) in [(&plain, &with), (&with, &changed), (&with, &plain)] {
            match review_pod(&review("UPDATE", user, Some(new), Some(old)), &cfg) {
                Admission::Deny { message } => {
                    assert!(
                        message.contains("alice may not set, change or remove it"),
                        "{message}"
                    )
                }
                other => panic!("{other:?}"),
            }
            // ... but not to the plugins and the scheduler.
            let plugin = "system:serviceaccount:kube-system:hami-device-plugin";
            assert!(matches!(
                review_pod(&review("UPDATE", plugin, Some(new), Some(old)), &cfg),
                Admission::Ignore { .. }
            ));
        }
        // An UPDATE that leaves them alone is fine; without oldObject they count as new.
        let relabelled = pod(
            json!({"metadata": {"annotations": forged, "labels": {"x": "y"}}, "spec": {"containers": [{"name": "a", "resources": gpu}]}}),
        );
        assert!(matches!(
            review_pod(
                &review("UPDATE", user, Some(&relabelled), Some(&with)),
                &cfg
            ),
            Admission::Ignore { .. }
        ));
        assert!(matches!(
            review_pod(&review("UPDATE", user, Some(&with), None), &cfg),
            Admission::Deny { .. }
        ));
        assert!(matches!(
            review_pod(&review("UPDATE", user, Some(&plain), None), &cfg),
            Admission::Ignore { .. }
        ));
        // The writers are configurable.
        let custom = WebhookConfig {
            annotation_writers: vec!["alice".into()],
            ..WebhookConfig::default()
        };
        assert!(matches!(
            review_pod(&review("UPDATE", user, Some(&with), Some(&plain)), &custom),
            Admission::Ignore { .. }
        ));
        assert!(matches!(
            review_pod(&review("DELETE", user, None, Some(&with)), &cfg),
            Admission::Ignore { .. }
        ));
    }

    #[test]
    fn dra_mode_turns_amd_requests_into_claims_and_leaves_the_rest() {
        let dra = WebhookConfig {
            amd_mode: AmdMode::Dra,
            ..WebhookConfig::default()
        };
        let raw = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpumem": "4096"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]}});
        let Admission::Allow { patch, claims } = admit(&pod(raw.clone()), &dra) else {
            panic!()
        };
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].entry_name, "hami-amd-a");
        let ops: Vec<String> = patch.iter().map(|p| p.to_string()).collect();
        let text = ops.join("\n");
        // No amd.com default is added to a converted container; NVIDIA's still is.
        assert!(
            !text.contains("/spec/containers/0/resources/limits/amd.com~1gpu\",\"value"),
            "{text}"
        );
        assert!(text.contains("nvidia.com~1gpucores"), "{text}");
        assert!(text.contains("resourceClaimTemplateName"), "{text}");
        assert!(text.contains("\"remove\""), "{text}");
        // The annotation overrides the default both ways; device-plugin is today's answer.
        let mut annotated = raw.clone();
        annotated["metadata"]["annotations"] = json!({"hami.io/amd-mode": "device-plugin"});
        let today = admit(&pod(raw.clone()), &WebhookConfig::default());
        let Admission::Allow { claims, .. } = admit(&pod(annotated.clone()), &dra) else {
            panic!()
        };
        assert!(claims.is_empty());
        annotated["metadata"]["annotations"] = json!({"hami.io/amd-mode": "device-plugin"});
        assert_eq!(
            admit(&pod(annotated.clone()), &WebhookConfig::default()),
            today
        );
        annotated["metadata"]["annotations"] = json!({"hami.io/amd-mode": "dra"});
        assert!(matches!(
            admit(&pod(annotated.clone()), &WebhookConfig::default()),
            Admission::Allow { claims, .. } if claims.len() == 1
        ));
        annotated["metadata"]["annotations"] = json!({"hami.io/amd-mode": "bogus"});
        match admit(&pod(annotated), &WebhookConfig::default()) {
            Admission::Deny { message } => {
                assert!(message.contains("hami.io/amd-mode"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // Percentages without slices: refused with the reason.
        let pct = json!({"metadata": {}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"amd.com/gpucores": "25"}}}]}});
        match admit(&pod(pct), &dra) {
            Admission::Deny { message } => {
                assert!(
                    message.contains("no ResourceSlice of amdgpu.hami-rs.io yet"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("amd.com/gpu"), "amd.com~1gpu");
        assert_eq!(escape("a~b"), "a~0b");
    }
}
