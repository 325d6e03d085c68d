//! Which pods' allocation annotations are believed (D-4, issue 17 item 11).
//!
//! The webhook denies `hami.io/*` allocation annotations written by anyone but the
//! scheduler and the plugins, but a webhook can be bypassed (a namespace it does not cover,
//! an outage with `failurePolicy: Ignore`, an older server without `matchConditions`). So
//! every consumer of those annotations — the scheduler's usage, the AMD plugin's CU usage,
//! the monitor — reads them only from pods the scheduler placed, by this one rule.

use k8s_openapi::api::core::v1::Pod;

use crate::names::{Vendor, pod as pod_keys};
use crate::requests::container_slots;

/// The resources that make a pod ours to place: every vendor's count, memory, memory
/// percentage and cores (`nvidia.com/priority` alone asks for no GPU).
pub fn managed_resources() -> impl Iterator<Item = &'static str> {
    Vendor::ALL.into_iter().flat_map(|v| {
        let n = v.names();
        [
            n.resource_count,
            n.resource_memory,
            n.resource_memory_percentage,
            n.resource_cores,
        ]
    })
}

/// Whether any container (init, sidecar or app) lists a managed resource in its limits or
/// requests.
pub fn requests_managed_resource(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    container_slots(spec).iter().any(|slot| {
        slot.container.resources.as_ref().is_some_and(|r| {
            [&r.limits, &r.requests].into_iter().flatten().any(|map| {
                map.keys()
                    .any(|key| managed_resources().any(|m| m == key.as_str()))
            })
        })
    })
}

/// The rule: the scheduler placed `pod` — and its allocation annotations count — when
/// 1. `spec.schedulerName` is exactly `scheduler_name` (the webhook sets it on every pod
///    it hands to us; kube-scheduler sends us no other pod),
/// 2. a container requests a managed resource ([`requests_managed_resource`]), and
/// 3. the pod is not labelled `hami.io/webhook=ignore` (such a pod never went through the
///    webhook that validates and hands pods to us).
///
/// Any other pod's `hami.io/*` allocation annotations are forged or stale and ignored.
pub fn placed_by_scheduler(pod: &Pod, scheduler_name: &str) -> bool {
    let ours = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .is_some_and(|name| !name.is_empty() && name == scheduler_name);
    let ignored = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(pod_keys::WEBHOOK_LABEL))
        .is_some_and(|v| v == pod_keys::WEBHOOK_IGNORE);
    ours && !ignored && requests_managed_resource(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_our_gpu_pods_count() {
        let gpu = json!({"limits": {"amd.com/gpu": "1"}});
        let placed = pod(json!({"metadata": {"name": "p"}, "spec": {
            "schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": gpu}]}}));
        assert!(placed_by_scheduler(&placed, "hami-scheduler"));
        assert!(!placed_by_scheduler(&placed, "other"));
        // An init container's request counts; requests count like limits.
        let init = pod(json!({"metadata": {}, "spec": {"schedulerName": "s",
            "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpumem": "10"}}}],
            "containers": [{"name": "c"}]}}));
        assert!(placed_by_scheduler(&init, "s"));
        let cases = [
            // No GPU request (the live forgery of issue 17).
            json!({"metadata": {}, "spec": {"schedulerName": "s", "containers": [{"name": "c",
                "resources": {"limits": {"cpu": "1"}}}]}}),
            // Priority alone asks for no GPU.
            json!({"metadata": {}, "spec": {"schedulerName": "s", "containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/priority": "1"}}}]}}),
            // Another scheduler placed it.
            json!({"metadata": {}, "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "resources": gpu}]}}),
            json!({"metadata": {}, "spec": {"containers": [{"name": "c", "resources": gpu}]}}),
            // It skipped the webhook.
            json!({"metadata": {"labels": {"hami.io/webhook": "ignore"}}, "spec": {"schedulerName": "s",
                "containers": [{"name": "c", "resources": gpu}]}}),
            json!({"metadata": {}}),
        ];
        for case in cases {
            assert!(!placed_by_scheduler(&pod(case.clone()), "s"), "{case}");
        }
        // An empty name never matches an unset schedulerName.
        let unnamed =
            pod(json!({"metadata": {}, "spec": {"containers": [{"name": "c", "resources": gpu}]}}));
        assert!(!placed_by_scheduler(&unnamed, ""));
    }

    #[test]
    fn managed_resources_cover_every_vendor() {
        let all: Vec<_> = managed_resources().collect();
        assert_eq!(all.len(), 8);
        assert!(all.contains(&"amd.com/gpumem-percentage"));
        assert!(all.contains(&"nvidia.com/gpucores"));
        assert!(!all.contains(&"nvidia.com/priority"));
    }
}
