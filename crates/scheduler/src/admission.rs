//! The webhook's decision (SPEC §3, D-4) as a pure function: a pod in, "leave it", "deny
//! with this message" or "allow with this JSON patch" out. The HTTP shell wraps it in
//! AdmissionReview v1/v1beta1.

use hami_protocol::names::{SCHEDULER_OWNED_ANNOTATIONS, Vendor, env};
use hami_protocol::requests::{ContainerKind, RequestDefaults, container_slots, pod_requests};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// What the webhook is configured with.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Our `schedulerName`; pods are handed to it.
    pub scheduler_name: String,
    /// Also take pods whose schedulerName is `default-scheduler` (the default pod value).
    pub force_overwrite_default_scheduler: bool,
    pub defaults: RequestDefaults,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            scheduler_name: "hami-scheduler".into(),
            force_overwrite_default_scheduler: true,
            defaults: RequestDefaults::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Not a pod for us; allowed unchanged.
    Ignore { why: String },
    /// Allowed with an RFC 6902 patch (possibly empty).
    Allow { patch: Vec<Value> },
    /// Refused; the message says what to change.
    Deny { message: String },
}

/// JSON Pointer escaping (RFC 6901) of one path segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

pub fn admit(pod: &Pod, config: &WebhookConfig) -> Admission {
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
    if let Some(annotations) = &pod.metadata.annotations
        && let Some(key) = SCHEDULER_OWNED_ANNOTATIONS
            .iter()
            .find(|k| annotations.contains_key(**k))
    {
        return deny(format!(
            "metadata.annotations[{key}] is written by the scheduler and the device plugin only; remove it from the pod"
        ));
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
        let added: Vec<&(&'static str, String)> = Vendor::ALL
            .iter()
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
    Admission::Allow { patch }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    /// Applies an RFC 6902 patch the simple way (add/replace only), to check that the patch
    /// really produces the defaulted pod.
    fn apply(mut doc: Value, patch: &[Value]) -> Value {
        for op in patch {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let target = doc
                .pointer_mut(parent)
                .unwrap_or_else(|| panic!("{parent} missing"));
            match target {
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
        let Admission::Allow { patch } = admit(&pod(raw.clone()), &WebhookConfig::default()) else {
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
        let Admission::Allow { patch: again } = admit(&pod(patched), &WebhookConfig::default())
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
        let Admission::Allow { patch } = admit(&pod(raw.clone()), &WebhookConfig::default()) else {
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

    #[test]
    fn escaping() {
        assert_eq!(escape("amd.com/gpu"), "amd.com~1gpu");
        assert_eq!(escape("a~b"), "a~0b");
    }
}
