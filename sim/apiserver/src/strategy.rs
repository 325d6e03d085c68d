//! Per-resource rules applied on create and update, after the pattern of the Kubernetes
//! registry "strategies": what the server resets, defaults and refuses for each type.

use serde_json::{Value, json};

use crate::meta;
use crate::resources::ResourceType;

/// A list of (field path, message) problems; empty means valid.
pub type Causes = Vec<(&'static str, String)>;

/// Whether updates to the main resource ignore `status` (it has a `/status` subresource).
pub fn has_status_subresource(r: &ResourceType) -> bool {
    r.subresources.contains(&"status")
}

/// Defaults and resets applied to a new object, before validation.
pub fn prepare_for_create(r: &ResourceType, obj: &mut Value) {
    match r.plural {
        "pods" => {
            let qos = pod_qos_class(obj);
            obj["status"] = json!({"phase": "Pending", "qosClass": qos});
            // The ServiceAccount admission plugin's default, which it leaves out of mirror pods.
            let mirror = obj
                .pointer("/metadata/annotations")
                .and_then(Value::as_object)
                .is_some_and(|a| a.contains_key(crate::service_accounts::MIRROR_POD_ANNOTATION));
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("restartPolicy").or_insert(json!("Always"));
                spec.entry("schedulerName")
                    .or_insert(json!("default-scheduler"));
                spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
                spec.entry("terminationGracePeriodSeconds")
                    .or_insert(json!(30));
                if !mirror {
                    spec.entry("serviceAccountName").or_insert(json!("default"));
                }
                spec.entry("enableServiceLinks").or_insert(json!(true));
                spec.entry("priority").or_insert(json!(0));
                if let Some(Value::Array(cs)) = spec.get_mut("containers") {
                    for c in cs {
                        if let Some(c) = c.as_object_mut() {
                            let latest = c
                                .get("image")
                                .and_then(Value::as_str)
                                .is_some_and(|i| !i.contains(':') || i.ends_with(":latest"));
                            c.entry("imagePullPolicy").or_insert_with(|| {
                                json!(if latest { "Always" } else { "IfNotPresent" })
                            });
                            c.entry("terminationMessagePath")
                                .or_insert(json!("/dev/termination-log"));
                            c.entry("terminationMessagePolicy").or_insert(json!("File"));
                            c.entry("resources").or_insert(json!({}));
                        }
                    }
                }
            }
        }
        "namespaces" => {
            obj["status"] = json!({"phase": "Active"});
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            let name = obj
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null);
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = m.entry("labels").or_insert(json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), name);
                }
            }
        }
        "secrets" => {
            if let Some(o) = obj.as_object_mut() {
                o.entry("type").or_insert(json!("Opaque"));
            }
        }
        // resourceClaimStrategy.PrepareForCreate: the status subresource owns the status
        // (allocation by the scheduler, devices by the driver); a create cannot set it.
        "resourceclaims" => obj["status"] = json!({}),
        _ => {}
    }
}

/// Kubernetes' QoS classification: BestEffort (no requests/limits), Guaranteed (every
/// container limits cpu and memory with requests equal to limits), Burstable otherwise.
pub fn pod_qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|f| pod.pointer(&format!("/spec/{f}")).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in &containers {
        let req = c.pointer("/resources/requests").and_then(Value::as_object);
        let lim = c.pointer("/resources/limits").and_then(Value::as_object);
        let relevant =
            |m: Option<&serde_json::Map<String, Value>>, k: &str| m.and_then(|m| m.get(k)).cloned();
        for k in ["cpu", "memory"] {
            let (rq, lm) = (relevant(req, k), relevant(lim, k));
            if rq.is_some() || lm.is_some() {
                any = true;
            }
            match (rq, lm) {
                (_, None) => guaranteed = false,
                (Some(a), Some(b)) if a != b => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn label_causes(obj: &Value, causes: &mut Causes) {
    if let Some(labels) = obj.pointer("/metadata/labels") {
        let Some(labels) = labels.as_object() else {
            causes.push(("metadata.labels", "must be a map of strings".into()));
            return;
        };
        for (k, v) in labels {
            let Some(v) = v.as_str() else {
                causes.push((
                    "metadata.labels",
                    format!("value of {k:?} must be a string"),
                ));
                continue;
            };
            let key_ok = !k.is_empty()
                && k.len() <= 317
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
            if !key_ok {
                causes.push(("metadata.labels", format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.'")));
            }
            let val_ok = v.len() <= 63
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && (v.is_empty()
                    || (v.starts_with(|c: char| c.is_ascii_alphanumeric())
                        && v.ends_with(|c: char| c.is_ascii_alphanumeric())));
            if !val_ok {
                causes.push(("metadata.labels", format!("Invalid value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
            }
        }
    }
    if let Some(a) = obj.pointer("/metadata/annotations")
        && !a
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string))
    {
        causes.push(("metadata.annotations", "must be a map of strings".into()));
    }
}

/// Validation shared by create and update.
pub fn validate(r: &ResourceType, obj: &Value) -> Causes {
    let mut causes = Causes::new();
    label_causes(obj, &mut causes);
    if r.plural == "pods" {
        match obj.pointer("/spec/containers").and_then(Value::as_array) {
            None => causes.push(("spec.containers", "Required value".into())),
            Some(cs) if cs.is_empty() => causes.push(("spec.containers", "Required value".into())),
            Some(cs) => {
                let mut seen = std::collections::BTreeSet::new();
                for c in cs {
                    match c.get("name").and_then(Value::as_str) {
                        None | Some("") => {
                            causes.push(("spec.containers[].name", "Required value".into()))
                        }
                        Some(n) => {
                            if let Some(e) = meta::dns1123_label_error(n) {
                                causes.push(("spec.containers[].name", e));
                            }
                            if !seen.insert(n.to_string()) {
                                causes.push((
                                    "spec.containers[].name",
                                    format!("Duplicate value: {n:?}"),
                                ));
                            }
                        }
                    }
                    if c.get("image")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        causes.push(("spec.containers[].image", "Required value".into()));
                    }
                }
            }
        }
    }
    if r.group == "events.k8s.io"
        && let Some(series) = obj.get("series").filter(|s| !s.is_null())
    {
        // kube-apiserver's ValidateEventCreate/Update: a series is a repeat, with its time.
        if series
            .get("count")
            .and_then(Value::as_i64)
            .is_none_or(|c| c < 2)
        {
            causes.push(("series.count", "Invalid value: should be at least 2".into()));
        }
        if series
            .get("lastObservedTime")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(("series.lastObservedTime", "Required value".into()));
        }
    }
    if r.plural == "mutatingwebhookconfigurations"
        && let Some(hooks) = obj.get("webhooks").and_then(Value::as_array)
    {
        for h in hooks {
            if h.get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(("webhooks[].name", "Required value".into()));
            }
            let url = h.pointer("/clientConfig/url").and_then(Value::as_str);
            let svc = h.pointer("/clientConfig/service");
            match (url, svc) {
                (None, None) => causes.push((
                    "webhooks[].clientConfig",
                    "Required value: exactly one of url or service is required".into(),
                )),
                (Some(u), _) if !u.starts_with("https://") => causes.push((
                    "webhooks[].clientConfig.url",
                    "Unsupported value: 'https' is the only allowed URL scheme".into(),
                )),
                _ => {}
            }
            match h.get("sideEffects").and_then(Value::as_str) {
                None => causes.push((
                    "webhooks[].sideEffects",
                    "Required value: must specify one of None, NoneOnDryRun".into(),
                )),
                // admissionregistration/v1 allows only these (Some, Unknown were v1beta1's).
                Some("None" | "NoneOnDryRun") => {}
                Some(other) => causes.push((
                    "webhooks[].sideEffects",
                    format!(
                        "Unsupported value: {other:?}: supported values: \"None\", \"NoneOnDryRun\""
                    ),
                )),
            }
            if h.get("admissionReviewVersions")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                causes.push((
                    "webhooks[].admissionReviewVersions",
                    "Required value: must specify one of v1, v1beta1".into(),
                ));
            }
            // matchConditions compile now, as a real server compiles them before storing.
            causes.extend(crate::match_conditions::validate(h));
        }
    }
    causes
}

/// Pod spec fields that may change after creation (everything else is immutable).
const POD_MUTABLE_SPEC: &[&str] = &[
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
];

/// Refuses updates the real server refuses (pod spec immutability, binding changes).
pub fn validate_update(r: &ResourceType, old: &Value, new: &Value) -> Causes {
    let mut causes = validate(r, new);
    if r.plural == "pods" {
        let strip = |v: &Value| {
            let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(m) = s.as_object_mut() {
                for f in POD_MUTABLE_SPEC {
                    m.remove(*f);
                }
                for list in ["containers", "initContainers"] {
                    if let Some(Value::Array(cs)) = m.get_mut(list) {
                        for c in cs {
                            if let Some(c) = c.as_object_mut() {
                                c.remove("image");
                            }
                        }
                    }
                }
            }
            s
        };
        if strip(old) != strip(new) {
            causes.push(("spec", "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into()));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn qos() {
        let be = json!({"spec": {"containers": [{"name": "a"}]}});
        assert_eq!(pod_qos_class(&be), "BestEffort");
        let g = json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}}]}});
        assert_eq!(pod_qos_class(&g), "Guaranteed");
        let b = json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "1"}}}]}});
        assert_eq!(pod_qos_class(&b), "Burstable");
    }

    #[test]
    fn a_created_claim_has_an_empty_status() {
        let rc = lookup("resource.k8s.io", "v1", "resourceclaims").unwrap();
        let mut c = json!({"metadata": {"name": "c"}, "spec": {}, "status": {"allocation": {"devices": {}}, "reservedFor": [{"name": "p"}]}});
        prepare_for_create(rc, &mut c);
        assert_eq!(c["status"], json!({}));
        assert_eq!(c["spec"], json!({}));
    }

    #[test]
    fn event_series_needs_a_count_and_a_time() {
        let ev = crate::resources::lookup("events.k8s.io", "v1", "events").unwrap();
        let with = |series: Value| json!({"metadata": {"name": "e"}, "series": series});
        assert_eq!(validate(ev, &with(json!({}))).len(), 2);
        assert!(
            validate(
                ev,
                &with(json!({"count": 2, "lastObservedTime": "2026-01-01T00:00:00.000000Z"}))
            )
            .is_empty()
        );
        assert!(validate(ev, &json!({"metadata": {"name": "e"}})).is_empty());
    }

    #[test]
    fn pod_validation() {
        let pods = lookup("", "v1", "pods").unwrap();
        assert!(
            validate(
                pods,
                &json!({"spec": {"containers": [{"name": "a", "image": "x"}]}})
            )
            .is_empty()
        );
        assert_eq!(validate(pods, &json!({"spec": {}})).len(), 1);
        assert_eq!(
            validate(pods, &json!({"spec": {"containers": [{"name": "A"}]}})).len(),
            2
        );
        let bad_label = json!({"metadata": {"labels": {"a": "-x"}}, "spec": {"containers": [{"name": "a", "image": "x"}]}});
        assert_eq!(validate(pods, &bad_label).len(), 1);
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let img = json!({"spec": {"containers": [{"name": "a", "image": "y"}]}});
        assert!(validate_update(pods, &old, &img).is_empty());
        let node = json!({"spec": {"nodeName": "n", "containers": [{"name": "a", "image": "x"}]}});
        assert_eq!(validate_update(pods, &old, &node).len(), 1);
    }
}
