//! Mutating admission webhooks: on a pod CREATE, and on an UPDATE (PUT, or PATCH of any
//! type: `object` the patched result, `oldObject` the stored pod), the server calls every
//! webhook of every `MutatingWebhookConfiguration` whose rules (operations, resources with
//! their subresources as upstream's `pods`, `pods/status`, `pods/*`, `*/*`, scope),
//! selectors (the objectSelector of an UPDATE matches the new or the old object) and
//! `matchConditions` ([`crate::match_conditions`]) match, over HTTPS trusting the configured
//! `caBundle`, with an `AdmissionReview` of the version the webhook accepts (`userInfo` the
//! requesting user), and applies the JSONPatch it returns. Denials and failures follow
//! `failurePolicy`.

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

/// Upstream's rule matcher (rules.go `resource()`): `res/sub` entries, `*` in either part
/// (a `*` subresource matches the resource itself too); a plain `pods` (or `*`) names the
/// main resource only, so `pods/status` writes reach only rules that list them.
fn rule_matches(rule: &Value, r: &ResourceType, sub: Option<&str>, operation: &str) -> bool {
    let opsub = sub.unwrap_or("");
    let resources_ok = rule
        .get("resources")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter().filter_map(Value::as_str).any(|x| {
                let (res, s) = x.split_once('/').unwrap_or((x, ""));
                (res == "*" || res == r.plural) && (s == "*" || s == opsub)
            })
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

/// Whether any webhook of `configs` has a rule for this operation on `r` (and `sub`): the
/// cheap test before the object is prepared for admission.
pub fn any_rule_matches(
    configs: &[Arc<Value>],
    r: &ResourceType,
    sub: Option<&str>,
    operation: &str,
) -> bool {
    configs.iter().any(|cfg| {
        cfg.get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(|h| {
                h.get("rules")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .any(|rule| rule_matches(rule, r, sub, operation))
    })
}

/// What is being admitted: the operation on which resource and subresource.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The resource.
    pub resource: &'a ResourceType,
    /// `status` for `pods/status`; None for the resource itself.
    pub sub: Option<&'a str>,
    /// `CREATE` or `UPDATE`.
    pub operation: &'a str,
}

/// The webhooks, in configuration order, that apply to this request. `old` is the stored
/// object of an UPDATE: the objectSelector matches if the new or the old object matches
/// (upstream's `MatchObjectSelector`).
pub fn matching_webhooks(
    configs: &[Arc<Value>],
    t: Target<'_>,
    object: &Value,
    old: Option<&Value>,
    namespace_labels: Option<&Value>,
) -> Vec<Result<Webhook, String>> {
    let (r, operation) = (t.resource, t.operation);
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
            if !rules
                .iter()
                .any(|rule| rule_matches(rule, r, t.sub, operation))
            {
                continue;
            }
            if r.namespaced
                && !structured_selector_matches(h.get("namespaceSelector"), namespace_labels)
            {
                continue;
            }
            let selects = |o: &Value| {
                structured_selector_matches(h.get("objectSelector"), o.pointer("/metadata/labels"))
            };
            if !selects(object) && !old.is_some_and(selects) {
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
    /// The `fieldManager` query parameter, as the request's options carry it.
    pub field_manager: Option<String>,
}

/// The request's options as upstream sends them: `CreateOptions` on CREATE, and on UPDATE
/// `UpdateOptions` (a PATCH's options converted, as upstream's `patchToUpdateOptions`).
fn options(operation: &str, who: &Requester) -> Value {
    let kind = if operation == "UPDATE" {
        "UpdateOptions"
    } else {
        "CreateOptions"
    };
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if who.dry_run {
        o["dryRun"] = json!(["All"]);
    }
    if let Some(m) = &who.field_manager {
        o["fieldManager"] = json!(m);
    }
    o
}

/// The AdmissionReview request sent to a webhook.
pub fn build_review(
    hook: &Webhook,
    uid: &str,
    t: Target<'_>,
    object: &Value,
    old: Option<&Value>,
    namespace: &str,
    who: &Requester,
) -> Value {
    let r = t.resource;
    let user = who.user.clone().unwrap_or_else(unauthenticated_admin);
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let gvr = json!({"group": r.group, "version": r.version, "resource": r.plural});
    let mut review = json!({
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
            "operation": t.operation,
            "userInfo": {"username": user.name, "groups": user.groups},
            "object": object,
            "oldObject": old.cloned().unwrap_or(Value::Null),
            "dryRun": who.dry_run,
            "options": options(t.operation, who)
        }
    });
    // Upstream omits an empty subResource (omitempty).
    if let Some(sub) = t.sub {
        review["request"]["subResource"] = json!(sub);
        review["request"]["requestSubResource"] = json!(sub);
    }
    review
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
    object: Value,
    who: Requester,
) -> Result<Value, ApiError> {
    let t = Target {
        resource: r,
        sub: None,
        operation: "CREATE",
    };
    admit(configs, t, namespace, namespace_labels, object, None, who).await
}

/// Runs mutating admission for `t` of `object` (`old`: the stored object of an UPDATE)
/// and returns the mutated object, or the Status error to answer with.
pub async fn admit(
    configs: Vec<Arc<Value>>,
    t: Target<'_>,
    namespace: &str,
    namespace_labels: Option<Value>,
    mut object: Value,
    old: Option<Value>,
    who: Requester,
) -> Result<Value, ApiError> {
    let r = t.resource;
    let hooks = matching_webhooks(
        &configs,
        t,
        &object,
        old.as_ref(),
        namespace_labels.as_ref(),
    );
    for hook in hooks {
        let hook = match hook {
            Ok(h) => h,
            Err(e) => return Err(ApiError::internal(format!("Internal error occurred: {e}"))),
        };
        let uid = meta::new_uid();
        let review = build_review(&hook, &uid, t, &object, old.as_ref(), namespace, &who);
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
        let create = Target {
            resource: pods,
            sub: None,
            operation: "CREATE",
        };
        let update = Target {
            operation: "UPDATE",
            ..create
        };
        let hooks = matching_webhooks(&[config(json!({}))], create, &pod, None, None);
        let h = hooks[0].as_ref().unwrap();
        assert_eq!(h.review_api_version, "admission.k8s.io/v1beta1");
        assert!(!h.fail_closed);
        assert_eq!(h.timeout, Duration::from_secs(3));
        assert!(!h.ca_bundle.is_empty());
        assert!(matching_webhooks(&[config(json!({}))], update, &pod, None, None).is_empty());
        let nodes = lookup("", "v1", "nodes").unwrap();
        let node_create = Target {
            resource: nodes,
            ..create
        };
        assert!(matching_webhooks(&[config(json!({}))], node_create, &pod, None, None).is_empty());
        let sel = config(json!({"objectSelector": {"matchLabels": {"gpu": "no"}}}));
        assert!(matching_webhooks(std::slice::from_ref(&sel), create, &pod, None, None).is_empty());
        // UPDATE: the new or the old object may match the objectSelector.
        let sel = config(json!({"objectSelector": {"matchLabels": {"gpu": "no"}},
            "rules": [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}));
        let old = json!({"metadata": {"labels": {"gpu": "no"}}});
        assert_eq!(
            matching_webhooks(std::slice::from_ref(&sel), update, &pod, Some(&old), None).len(),
            1
        );
        assert!(matching_webhooks(&[sel], update, &pod, Some(&pod), None).is_empty());
        let nssel = config(
            json!({"namespaceSelector": {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}}),
        );
        assert_eq!(
            matching_webhooks(
                std::slice::from_ref(&nssel),
                create,
                &pod,
                None,
                Some(&json!({"hami.io/webhook": "ignore"}))
            )
            .len(),
            0
        );
        assert_eq!(
            matching_webhooks(&[nssel], create, &pod, None, Some(&json!({}))).len(),
            1
        );
    }

    #[test]
    fn rules_name_subresources_as_upstream() {
        let pods = lookup("", "v1", "pods").unwrap();
        let rule = |res: &str| json!({"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": [res]});
        let status = Some("status");
        for (res, main, st) in [
            ("pods", true, false),
            ("*", true, false),
            ("pods/status", false, true),
            // upstream's matcher: a `*` subresource matches none too (rules.go resource()).
            ("pods/*", true, true),
            ("*/status", false, true),
            ("*/*", true, true),
            ("pods/binding", false, false),
        ] {
            assert_eq!(
                rule_matches(&rule(res), pods, None, "UPDATE"),
                main,
                "{res}"
            );
            assert_eq!(
                rule_matches(&rule(res), pods, status, "UPDATE"),
                st,
                "{res}/status"
            );
        }
        assert!(!rule_matches(&rule("pods"), pods, None, "CREATE"));
    }

    #[test]
    fn failing_conditions_refuse_as_upstream_forbids() {
        let pods = lookup("", "v1", "pods").unwrap();
        let cfg = config(json!({"failurePolicy": "Fail", "matchConditions": [
            {"name": "a", "expression": "object.metadata.annotations['x'] == 'y'"}
        ]}));
        let pod = json!({"metadata": {"generateName": "p-"}});
        let t = Target {
            resource: pods,
            sub: None,
            operation: "CREATE",
        };
        let hooks = matching_webhooks(&[cfg], t, &pod, None, None);
        let hook = hooks[0].as_ref().unwrap();
        let who = Requester::default();
        let review = build_review(hook, "u", t, &pod, None, "default", &who);
        assert_eq!(review["request"]["userInfo"]["username"], "system:admin");
        let e = conditions_allow_call(hook, pods, &review).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
        // No name yet (generateName): upstream's NewForbidden leaves it out.
        assert_eq!(
            e.message,
            "pods is forbidden: expression 'object.metadata.annotations['x'] == 'y'' resulted in error: no such key: annotations"
        );
        let named = json!({"metadata": {"name": "p", "annotations": {"x": "z"}}});
        let review = build_review(hook, "u", t, &named, None, "default", &who);
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
