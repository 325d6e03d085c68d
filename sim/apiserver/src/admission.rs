//! Mutating admission webhooks: on pod CREATE the server calls every webhook of every
//! `MutatingWebhookConfiguration` whose rules, selectors and `matchConditions`
//! ([`crate::match_conditions`]) match, over HTTPS trusting the configured `caBundle`, with
//! an `AdmissionReview` of the version the webhook accepts (`userInfo` the requesting
//! user), and applies the JSONPatch it returns. Denials and failures follow `failurePolicy`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::match_conditions::{self, Condition, Decision};
use crate::meta;
use crate::rbac::UserInfo;
use crate::resources::ResourceType;
use crate::selector::structured_selector_matches;
use crate::status::ApiError;

/// One webhook to call, extracted from a configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    /// The webhook's `name` in its configuration, used in errors and the request log.
    pub name: String,
    /// Where to POST the review: `clientConfig.url`, or the URL of `clientConfig.service`.
    pub url: String,
    /// The decoded `caBundle`: the only roots the webhook's certificate is checked against.
    pub ca_bundle: Vec<u8>,
    /// How long to wait for the answer: `timeoutSeconds`, 10 s when absent, clamped to
    /// 1–30 s as Kubernetes validates it.
    pub timeout: Duration,
    /// true for `failurePolicy: Fail` (the v1 default).
    pub fail_closed: bool,
    /// `admission.k8s.io/v1` or `admission.k8s.io/v1beta1`.
    pub review_api_version: &'static str,
    /// Its `matchConditions`, compiled.
    pub match_conditions: Vec<Condition>,
}

fn list_has(list: Option<&Value>, want: &str) -> bool {
    list.and_then(Value::as_array).is_some_and(|a| {
        a.iter()
            .any(|x| x.as_str() == Some("*") || x.as_str() == Some(want))
    })
}

fn rule_matches(rule: &Value, r: &ResourceType, operation: &str) -> bool {
    let resources_ok = rule
        .get("resources")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|x| x == "*" || x == r.plural)
        });
    let scope_ok = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Namespaced" => r.namespaced,
        "Cluster" => !r.namespaced,
        _ => true,
    };
    list_has(rule.get("operations"), operation)
        && list_has(rule.get("apiGroups"), r.group)
        && list_has(rule.get("apiVersions"), r.version)
        && resources_ok
        && scope_ok
}

fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    serde_json::from_value::<k8s_openapi::ByteString>(Value::String(s.to_string()))
        .map(|b| b.0)
        .map_err(|e| format!("invalid base64: {e}"))
}

/// The webhooks, in configuration order, that apply to this request.
pub fn matching_webhooks(
    configs: &[Arc<Value>],
    r: &ResourceType,
    operation: &str,
    object: &Value,
    namespace_labels: Option<&Value>,
) -> Vec<Result<Webhook, String>> {
    let mut out = Vec::new();
    for cfg in configs {
        for h in cfg
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let rules = h
                .get("rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !rules.iter().any(|rule| rule_matches(rule, r, operation)) {
                continue;
            }
            if r.namespaced
                && !structured_selector_matches(h.get("namespaceSelector"), namespace_labels)
            {
                continue;
            }
            if !structured_selector_matches(
                h.get("objectSelector"),
                object.pointer("/metadata/labels"),
            ) {
                continue;
            }
            let name = h
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let fail_closed = h.get("failurePolicy").and_then(Value::as_str) != Some("Ignore");
            let timeout = Duration::from_secs(
                h.get("timeoutSeconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(10)
                    .clamp(1, 30),
            );
            let versions: Vec<&str> = h
                .get("admissionReviewVersions")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let review_api_version = match versions.iter().find(|v| **v == "v1" || **v == "v1beta1")
            {
                Some(&"v1beta1") => "admission.k8s.io/v1beta1",
                Some(_) => "admission.k8s.io/v1",
                None => {
                    out.push(Err(format!(
                        "webhook {name:?} accepts none of the AdmissionReview versions v1, v1beta1"
                    )));
                    continue;
                }
            };
            let cc = h.get("clientConfig").cloned().unwrap_or(Value::Null);
            let url = match (cc.get("url").and_then(Value::as_str), cc.get("service")) {
                (Some(u), _) => u.to_string(),
                (None, Some(svc)) => format!(
                    "https://{}.{}.svc:{}{}",
                    svc.get("name").and_then(Value::as_str).unwrap_or(""),
                    svc.get("namespace").and_then(Value::as_str).unwrap_or(""),
                    svc.get("port").and_then(Value::as_u64).unwrap_or(443),
                    svc.get("path").and_then(Value::as_str).unwrap_or("/")
                ),
                (None, None) => {
                    out.push(Err(format!("webhook {name:?} has no clientConfig")));
                    continue;
                }
            };
            let ca_bundle = match cc.get("caBundle").and_then(Value::as_str) {
                Some(b) => match decode_base64(b) {
                    Ok(v) => v,
                    Err(e) => {
                        out.push(Err(format!("webhook {name:?}: caBundle: {e}")));
                        continue;
                    }
                },
                None => Vec::new(),
            };
            out.push(Ok(Webhook {
                name,
                url,
                ca_bundle,
                timeout,
                fail_closed,
                review_api_version,
                match_conditions: match_conditions::conditions(h),
            }));
        }
    }
    out
}

/// The user in a review when authentication is off: what the admin token would be.
pub fn unauthenticated_admin() -> UserInfo {
    UserInfo {
        name: "system:admin".into(),
        groups: vec![
            crate::rbac::MASTERS_GROUP.into(),
            "system:authenticated".into(),
        ],
    }
}

/// Who asks, and how.
#[derive(Debug, Clone, Default)]
pub struct Requester {
    /// The authenticated user; None when authentication is off ([`unauthenticated_admin`]).
    pub user: Option<UserInfo>,
    /// `dryRun=All`: webhooks are told (`request.dryRun`), the object is not stored.
    pub dry_run: bool,
}

/// The AdmissionReview request sent to a webhook.
pub fn build_review(
    hook: &Webhook,
    uid: &str,
    r: &ResourceType,
    operation: &str,
    object: &Value,
    namespace: &str,
    who: &Requester,
) -> Value {
    let user = who.user.clone().unwrap_or_else(unauthenticated_admin);
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let gvr = json!({"group": r.group, "version": r.version, "resource": r.plural});
    json!({
        "apiVersion": hook.review_api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""),
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": user.name, "groups": user.groups},
            "object": object,
            "oldObject": null,
            "dryRun": who.dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// What a webhook answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The webhook allowed the pod, with the JSONPatch to apply if it sent one.
    Allowed(Option<json_patch::Patch>),
    /// The webhook refused the pod; the error is what the client gets.
    Denied(ApiError),
}

/// Interprets an AdmissionReview response body. Err means the call failed (malformed answer).
pub fn interpret_response(hook: &Webhook, uid: &str, body: &Value) -> Result<Verdict, String> {
    let resp = body
        .get("response")
        .ok_or("webhook response has no \"response\"")?;
    if hook.review_api_version == "admission.k8s.io/v1" {
        if body.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
            || body.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
        {
            return Err(
                "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview".into(),
            );
        }
        let got = resp.get("uid").and_then(Value::as_str).unwrap_or("");
        if got != uid {
            return Err(format!("expected response.uid={uid:?}, got {got:?}"));
        }
    }
    let allowed = resp
        .get("allowed")
        .and_then(Value::as_bool)
        .ok_or("webhook response has no \"allowed\"")?;
    if !allowed {
        let status = resp.get("status").cloned().unwrap_or(Value::Null);
        let code = status
            .get("code")
            .and_then(Value::as_u64)
            .filter(|c| *c >= 400)
            .unwrap_or(403) as u16;
        let msg = status.get("message").and_then(Value::as_str).unwrap_or("");
        let reason = status
            .get("reason")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .unwrap_or(crate::faults::reason_for(code));
        let message = if msg.is_empty() {
            format!(
                "admission webhook {:?} denied the request without explanation",
                hook.name
            )
        } else {
            format!(
                "admission webhook {:?} denied the request: {msg}",
                hook.name
            )
        };
        return Ok(Verdict::Denied(ApiError::new(code, reason, message)));
    }
    // Go decodes a []byte field from a base64 string or from an array of numbers; kube-rs's
    // AdmissionResponse sends the latter, so accept both as the real server does.
    let bytes: Option<Vec<u8>> = match resp.get("patch") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) if p.is_empty() => None,
        Some(Value::String(p)) => Some(decode_base64(p)?),
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|x| x.as_u64().filter(|n| *n <= 255).map(|n| n as u8))
                .collect::<Option<Vec<u8>>>()
                .ok_or("webhook response patch is neither base64 nor an array of bytes")?,
        ),
        Some(_) => {
            return Err("webhook response patch is neither base64 nor an array of bytes".into());
        }
    };
    match bytes {
        None => Ok(Verdict::Allowed(None)),
        Some(bytes) => {
            if let Some(pt) = resp.get("patchType").and_then(Value::as_str)
                && pt != "JSONPatch"
            {
                return Err(format!("unsupported patch type {pt:?}"));
            }
            let patch: json_patch::Patch = serde_json::from_slice(&bytes)
                .map_err(|e| format!("webhook returned an invalid JSON patch: {e}"))?;
            Ok(Verdict::Allowed(Some(patch)))
        }
    }
}

/// The webhook's matchConditions over this review's request (the object as earlier
/// webhooks left it): whether to call it, or the 403 a failing condition under
/// `failurePolicy: Fail` answers with (upstream's `NewForbidden` of the errors).
fn conditions_allow_call(
    hook: &Webhook,
    r: &ResourceType,
    review: &Value,
) -> Result<bool, ApiError> {
    if hook.match_conditions.is_empty() {
        return Ok(true);
    }
    let vars = match_conditions::bindings(&review["request"]);
    match match_conditions::decide(&hook.match_conditions, hook.fail_closed, &vars) {
        Decision::Call => Ok(true),
        Decision::Skip { condition } => {
            tracing::debug!(webhook = %hook.name, condition, "matchCondition false: webhook skipped");
            Ok(false)
        }
        Decision::SkipOnError(e) => {
            tracing::warn!(webhook = %hook.name, "matchConditions failed, failurePolicy Ignore: {e}");
            Ok(false)
        }
        Decision::Refuse(e) => {
            let name = review
                .pointer("/request/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let gr = if r.group.is_empty() {
                r.plural.to_string()
            } else {
                format!("{}.{}", r.plural, r.group)
            };
            let message = if name.is_empty() {
                format!("{gr} is forbidden: {e}")
            } else {
                format!("{gr} \"{name}\" is forbidden: {e}")
            };
            let mut err = ApiError::new(403, "Forbidden", message);
            err.details = Some(json!({"name": name, "group": r.group, "kind": r.plural}));
            Err(err)
        }
    }
}

/// Runs mutating admission for a CREATE of `object` (already defaulted) asked by `who`
/// and returns the mutated object, or the Status error to answer with.
pub async fn admit_create(
    configs: Vec<Arc<Value>>,
    r: &'static ResourceType,
    namespace: &str,
    namespace_labels: Option<Value>,
    mut object: Value,
    who: Requester,
) -> Result<Value, ApiError> {
    let hooks = matching_webhooks(&configs, r, "CREATE", &object, namespace_labels.as_ref());
    for hook in hooks {
        let hook = match hook {
            Ok(h) => h,
            Err(e) => return Err(ApiError::internal(format!("Internal error occurred: {e}"))),
        };
        let uid = meta::new_uid();
        let review = build_review(&hook, &uid, r, "CREATE", &object, namespace, &who);
        if !conditions_allow_call(&hook, r, &review)? {
            continue;
        }
        let body = serde_json::to_vec(&review).map_err(|e| ApiError::internal(e.to_string()))?;
        let call =
            crate::webhook_client::post_https(&hook.url, &hook.ca_bundle, body, hook.timeout);
        let outcome: Result<Verdict, String> = match call.await {
            Err(e) => Err(e),
            Ok((status, bytes)) if status != 200 => Err(format!(
                "received HTTP status {status}: {}",
                String::from_utf8_lossy(&bytes)
            )),
            Ok((_, bytes)) => serde_json::from_slice::<Value>(&bytes)
                .map_err(|e| format!("the response is not JSON: {e}"))
                .and_then(|v| interpret_response(&hook, &uid, &v)),
        };
        match outcome {
            Ok(Verdict::Denied(e)) => return Err(e),
            Ok(Verdict::Allowed(None)) => {}
            Ok(Verdict::Allowed(Some(patch))) => {
                let mut patched = object.clone();
                match json_patch::patch(&mut patched, &patch) {
                    Ok(()) => object = patched,
                    Err(e) if hook.fail_closed => {
                        return Err(ApiError::internal(format!(
                            "Internal error occurred: failed calling webhook {:?}: the JSON patch failed to apply: {e}",
                            hook.name
                        )));
                    }
                    Err(e) => {
                        tracing::warn!(webhook = %hook.name, "ignoring webhook patch that failed to apply: {e}")
                    }
                }
            }
            Err(e) if hook.fail_closed => {
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook {:?}: failed to call webhook: Post {:?}: {e}",
                    hook.name, hook.url
                )));
            }
            Err(e) => {
                tracing::warn!(webhook = %hook.name, "failed calling webhook, failurePolicy Ignore: {e}")
            }
        }
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    fn config(extra: Value) -> Arc<Value> {
        let mut h = json!({
            "name": "hami.io",
            "clientConfig": {"url": "https://127.0.0.1:9443/mutate", "caBundle": "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ=="},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "admissionReviewVersions": ["v1beta1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 3
        });
        if let (Some(h), Some(e)) = (h.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                h.insert(k.clone(), v.clone());
            }
        }
        Arc::new(json!({"webhooks": [h]}))
    }

    #[test]
    fn matching_honours_rules_and_selectors() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"labels": {"gpu": "yes"}}});
        let hooks = matching_webhooks(&[config(json!({}))], pods, "CREATE", &pod, None);
        let h = hooks[0].as_ref().unwrap();
        assert_eq!(h.review_api_version, "admission.k8s.io/v1beta1");
        assert!(!h.fail_closed);
        assert_eq!(h.timeout, Duration::from_secs(3));
        assert!(!h.ca_bundle.is_empty());
        assert!(matching_webhooks(&[config(json!({}))], pods, "UPDATE", &pod, None).is_empty());
        let nodes = lookup("", "v1", "nodes").unwrap();
        assert!(matching_webhooks(&[config(json!({}))], nodes, "CREATE", &pod, None).is_empty());
        let sel = config(json!({"objectSelector": {"matchLabels": {"gpu": "no"}}}));
        assert!(matching_webhooks(&[sel], pods, "CREATE", &pod, None).is_empty());
        let nssel = config(
            json!({"namespaceSelector": {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}}),
        );
        assert_eq!(
            matching_webhooks(
                std::slice::from_ref(&nssel),
                pods,
                "CREATE",
                &pod,
                Some(&json!({"hami.io/webhook": "ignore"}))
            )
            .len(),
            0
        );
        assert_eq!(
            matching_webhooks(&[nssel], pods, "CREATE", &pod, Some(&json!({}))).len(),
            1
        );
    }

    #[test]
    fn failing_conditions_refuse_as_upstream_forbids() {
        let pods = lookup("", "v1", "pods").unwrap();
        let cfg = config(json!({"failurePolicy": "Fail", "matchConditions": [
            {"name": "a", "expression": "object.metadata.annotations['x'] == 'y'"}
        ]}));
        let pod = json!({"metadata": {"generateName": "p-"}});
        let hooks = matching_webhooks(&[cfg], pods, "CREATE", &pod, None);
        let hook = hooks[0].as_ref().unwrap();
        let who = Requester::default();
        let review = build_review(hook, "u", pods, "CREATE", &pod, "default", &who);
        assert_eq!(review["request"]["userInfo"]["username"], "system:admin");
        let e = conditions_allow_call(hook, pods, &review).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
        // No name yet (generateName): upstream's NewForbidden leaves it out.
        assert_eq!(
            e.message,
            "pods is forbidden: expression 'object.metadata.annotations['x'] == 'y'' resulted in error: no such key: annotations"
        );
        let named = json!({"metadata": {"name": "p", "annotations": {"x": "z"}}});
        let review = build_review(hook, "u", pods, "CREATE", &named, "default", &who);
        assert_eq!(conditions_allow_call(hook, pods, &review), Ok(false));
    }

    #[test]
    fn responses() {
        let hook = Webhook {
            name: "w".into(),
            url: "https://x/".into(),
            ca_bundle: vec![],
            timeout: Duration::from_secs(1),
            fail_closed: true,
            review_api_version: "admission.k8s.io/v1",
            match_conditions: vec![],
        };
        // [{"op":"add","path":"/x","value":1}]
        let patch = "W3sib3AiOiJhZGQiLCJwYXRoIjoiL3giLCJ2YWx1ZSI6MX1d";
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": true, "patchType": "JSONPatch", "patch": patch}});
        match interpret_response(&hook, "u", &ok).unwrap() {
            Verdict::Allowed(Some(p)) => assert_eq!(p.0.len(), 1),
            other => panic!("{other:?}"),
        }
        assert!(interpret_response(&hook, "other", &ok).is_err());
        // kube-rs serialises the patch bytes as a JSON array of numbers
        let as_array = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": true, "patchType": "JSONPatch", "patch": br#"[{"op":"add","path":"/x","value":1}]"#.to_vec()}});
        assert!(matches!(
            interpret_response(&hook, "u", &as_array).unwrap(),
            Verdict::Allowed(Some(_))
        ));
        let junk = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": true, "patch": 5}});
        assert!(interpret_response(&hook, "u", &junk).is_err());
        let deny = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": false, "status": {"message": "no GPUs"}}});
        match interpret_response(&hook, "u", &deny).unwrap() {
            Verdict::Denied(e) => {
                assert_eq!(e.code, 403);
                assert_eq!(
                    e.message,
                    "admission webhook \"w\" denied the request: no GPUs"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
