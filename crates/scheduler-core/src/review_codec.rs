//! The webhook's AdmissionReview codec: one review body in, the answer out (v1 and
//! v1beta1, answered in the version received), with the DRA claim templates the patch
//! names for the shell to create. Pure: the HTTP status is a plain number, the shapes are
//! passed in, and no template is created here.

use hami_protocol::dra::AMD_MODE_ANNOTATION;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::admission::{Admission, PodReview, WebhookConfig, review_pod_with};
use crate::dra_claims::{AmdMode, ContainerClaim, Shape};

/// Whether a review body may be a DRA-mode pod (so the slices are worth reading): the
/// default mode is DRA, or the body names the mode annotation.
pub fn may_need_shapes(body: &[u8], config: &WebhookConfig) -> bool {
    config.amd_mode == AmdMode::Dra
        || body
            .windows(AMD_MODE_ANNOTATION.len())
            .any(|w| w == AMD_MODE_ANNOTATION.as_bytes())
}

/// The webhook's decision on one AdmissionReview body, before any API call.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The HTTP status to answer with (200, or 400 for a body that is no AdmissionReview).
    pub status: u16,
    /// The AdmissionReview answer (or the error body of a bad request).
    pub body: Value,
    /// DRA mode: the claim templates the patch names (the caller creates them).
    pub claims: Vec<ContainerClaim>,
    /// `request.namespace` (the pod's, else `default`).
    pub namespace: String,
    /// `request.dryRun`: nothing may be created.
    pub dry_run: bool,
}

impl Reviewed {
    /// Turns the answer into a denial with `message` (fail closed), dropping any patch.
    pub fn deny(&mut self, message: String) {
        if let Some(response) = self.body.get_mut("response").and_then(Value::as_object_mut) {
            response.remove("patch");
            response.remove("patchType");
            response.remove("warnings");
            response.insert("allowed".into(), json!(false));
            response.insert(
                "status".into(),
                json!({"code": 403, "reason": "Forbidden", "message": message, "status": "Failure"}),
            );
        }
        self.claims.clear();
    }

    /// The denial message, if the answer is a denial.
    pub fn denied(&self) -> Option<&str> {
        self.body
            .pointer("/response/status/message")
            .and_then(Value::as_str)
            .filter(|_| self.body.pointer("/response/allowed") == Some(&json!(false)))
    }

    /// The slices could not be read: a denial for want of shapes says why.
    pub fn note_missing_shapes(&mut self, why: &str) {
        if let Some(message) = self.denied()
            && message.contains("no ResourceSlice of")
        {
            let message = format!("{message} (the scheduler cannot read ResourceSlices: {why})");
            self.deny(message);
        }
    }
}

/// What a DRA-mode pod that would preempt is told at admission (a warning kubectl prints):
/// kube-scheduler has no preemption for ResourceClaims until KEP-5690, so a pod of priority
/// above 0 (kube-apiserver's Priority admission has turned `priorityClassName` into
/// `spec.priority` before webhooks run) waits for a GPU to free instead. Nothing for
/// priority 0 or `preemptionPolicy: Never`, which would not preempt anyway.
pub fn dra_preemption_warning(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let priority = spec.priority.filter(|p| *p > 0)?;
    if spec.preemption_policy.as_deref() == Some("Never") {
        return None;
    }
    Some(format!(
        "priority {priority}: DRA-mode pods cannot preempt (none upstream until KEP-5690); it waits for a free GPU"
    ))
}

/// The webhook's answer to one AdmissionReview body, knowing no device shapes (the DRA
/// templates of [`review_with`] are not created here).
pub fn review(bytes: &[u8], config: &WebhookConfig) -> (u16, Value) {
    let reviewed = review_with(bytes, config, &[]);
    (reviewed.status, reviewed.body)
}

/// The webhook's decision on one AdmissionReview body with the DRA driver's device shapes.
pub fn review_with(bytes: &[u8], config: &WebhookConfig, shapes: &[Shape]) -> Reviewed {
    let bad = |message: String| Reviewed {
        status: 400,
        body: json!({ "error": message }),
        claims: Vec::new(),
        namespace: String::new(),
        dry_run: false,
    };
    let Ok(review) = serde_json::from_slice::<Value>(bytes) else {
        return bad("the body is not JSON; expected an AdmissionReview".into());
    };
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !matches!(
        api_version,
        "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
    ) {
        return bad(format!(
            "apiVersion {api_version:?} is not admission.k8s.io/v1 or v1beta1"
        ));
    }
    let Some(request) = review.get("request") else {
        return bad("the AdmissionReview has no request".into());
    };
    let uid = request
        .get("uid")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    let mut response = json!({ "uid": uid, "allowed": true });
    let mut claims = Vec::new();
    let namespace = request
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| {
            request
                .pointer("/object/metadata/namespace")
                .and_then(Value::as_str)
        })
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_owned();
    let dry_run = request
        .get("dryRun")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let is_pod = request.pointer("/kind/kind").and_then(Value::as_str) == Some("Pod");
    let operation = request
        .get("operation")
        .and_then(Value::as_str)
        .unwrap_or("CREATE");
    let refuse = |response: &mut Value, code: u16, reason: &str, message: String| {
        response["allowed"] = json!(false);
        response["status"] =
            json!({"code": code, "reason": reason, "message": message, "status": "Failure"});
    };
    // D-4 is checked on UPDATE too (admission::review_pod); other operations pass.
    if is_pod && matches!(operation, "CREATE" | "UPDATE") {
        let decode = |field: &str| {
            request
                .get(field)
                .filter(|v| !v.is_null())
                .map(|o| serde_json::from_value::<Pod>(o.clone()))
        };
        match (decode("object"), decode("oldObject").transpose()) {
            (None, _) => refuse(
                &mut response,
                400,
                "BadRequest",
                "the AdmissionReview request has no object".into(),
            ),
            (Some(Err(e)), _) | (_, Err(e)) => refuse(
                &mut response,
                400,
                "BadRequest",
                format!("the pod in the AdmissionReview does not decode: {e}"),
            ),
            (Some(Ok(pod)), Ok(old)) => match review_pod_with(
                &PodReview {
                    operation,
                    username: request
                        .pointer("/userInfo/username")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    object: Some(&pod),
                    old_object: old.as_ref(),
                },
                config,
                shapes,
            ) {
                Admission::Ignore { .. } => {}
                Admission::Allow {
                    patch,
                    claims: templates,
                } => {
                    claims = templates;
                    // Said, never silent: what a claim could not list (kubectl prints
                    // an admission response's warnings to whoever created the pod).
                    let mut warnings: Vec<String> =
                        claims.iter().flat_map(ContainerClaim::warnings).collect();
                    if !claims.is_empty() {
                        warnings.extend(dra_preemption_warning(&pod));
                    }
                    if !warnings.is_empty() {
                        response["warnings"] = json!(warnings);
                    }
                    if !patch.is_empty() {
                        let encoded = serde_json::to_vec(&patch).unwrap_or_default();
                        response["patchType"] = json!("JSONPatch");
                        response["patch"] =
                            serde_json::to_value(ByteString(encoded)).unwrap_or_default();
                    }
                }
                Admission::Deny { message } => refuse(&mut response, 403, "Forbidden", message),
            },
        }
    }
    Reviewed {
        status: 200,
        body: json!({ "apiVersion": api_version, "kind": "AdmissionReview", "response": response }),
        claims,
        namespace,
        dry_run,
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn body(dry_run: Option<bool>, namespace: &str) -> Vec<u8> {
        let mut request = json!({
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": namespace,
            "userInfo": {"username": "alice"},
            "object": {"metadata": {"name": "p", "annotations": {"hami.io/amd-mode": "dra"}},
                       "spec": {"containers": [{"name": "c", "resources": {"limits": {"amd.com/gpumem": "1024"}}}]}}
        });
        if let Some(d) = dry_run {
            request["dryRun"] = json!(d);
        }
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
            .unwrap()
    }

    #[test]
    fn a_dra_review_names_its_templates_namespace_and_dry_run() {
        let config = WebhookConfig::default();
        let r = review_with(&body(Some(true), "team-a"), &config, &[]);
        assert_eq!((r.namespace.as_str(), r.dry_run), ("team-a", true));
        assert_eq!(r.claims.len(), 1);
        assert_eq!(r.body["response"]["patchType"], "JSONPatch");
        let r = review_with(&body(None, ""), &config, &[]);
        assert_eq!((r.namespace.as_str(), r.dry_run), ("default", false));
        // A failed create turns the answer into a denial without the patch.
        let mut r = review_with(&body(Some(false), "ns"), &config, &[]);
        r.deny("cannot create ResourceClaimTemplate ns/x: forbidden".into());
        assert_eq!(r.body["response"]["allowed"], false);
        assert!(r.body["response"].get("patch").is_none());
        assert!(r.claims.is_empty());
        assert_eq!(
            r.denied(),
            Some("cannot create ResourceClaimTemplate ns/x: forbidden")
        );
        // The slices could not be read: a denial for want of them says why.
        let pct = String::from_utf8(body(None, "ns"))
            .unwrap()
            .replace("amd.com/gpumem", "amd.com/gpumem-percentage")
            .replace("1024", "50");
        let mut r = review_with(pct.as_bytes(), &config, &[]);
        r.note_missing_shapes("403 Forbidden");
        let message = r.denied().unwrap();
        assert!(
            message.contains("no ResourceSlice of")
                && message.contains("cannot read ResourceSlices: 403 Forbidden"),
            "{message}"
        );
        // Only a DRA-mode review is worth reading the slices for.
        assert!(may_need_shapes(&body(None, "ns"), &config));
        let plain = br#"{"request": {"object": {"metadata": {}}}}"#;
        assert!(!may_need_shapes(plain, &config));
        let dra = WebhookConfig {
            amd_mode: AmdMode::Dra,
            ..WebhookConfig::default()
        };
        assert!(may_need_shapes(plain, &dra));
    }

    fn with_spec(body: &[u8], spec: Value) -> Vec<u8> {
        let mut v: Value = serde_json::from_slice(body).unwrap();
        for (k, x) in spec.as_object().unwrap() {
            v["request"]["object"]["spec"][k] = x.clone();
        }
        serde_json::to_vec(&v).unwrap()
    }

    fn warnings(r: &Reviewed) -> Vec<String> {
        r.body["response"]["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| w.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_dra_pod_that_would_preempt_is_told_it_cannot() {
        let config = WebhookConfig::default();
        let high = with_spec(&body(None, "ns"), json!({"priority": 1000}));
        let r = review_with(&high, &config, &[]);
        assert_eq!(r.claims.len(), 1, "{:?}", r.body);
        let w = warnings(&r);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("priority 1000: DRA-mode pods cannot preempt")
                && w[0].contains("KEP-5690"),
            "{w:?}"
        );
        // Kubernetes truncates admission warnings over 120 characters.
        assert!(w[0].len() <= 120, "{} characters: {}", w[0].len(), w[0]);
        // Priority 0 or none, or a pod that never preempts: nothing to say.
        for spec in [
            json!({}),
            json!({"priority": 0}),
            json!({"priority": 1000, "preemptionPolicy": "Never"}),
        ] {
            let r = review_with(&with_spec(&body(None, "ns"), spec.clone()), &config, &[]);
            assert_eq!(r.claims.len(), 1);
            assert!(warnings(&r).is_empty(), "{spec}: {:?}", r.body);
        }
        // A device-plugin-mode pod preempts through the extender: no warning.
        let plugin = String::from_utf8(high).unwrap().replace(
            r#""hami.io/amd-mode":"dra""#,
            r#""hami.io/amd-mode":"device-plugin""#,
        );
        let r = review_with(plugin.as_bytes(), &config, &[]);
        assert!(r.claims.is_empty(), "{:?}", r.body);
        assert_eq!(r.body["response"]["allowed"], true, "{:?}", r.body);
        assert!(warnings(&r).is_empty(), "{:?}", r.body);
    }
}
