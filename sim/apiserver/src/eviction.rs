//! `POST pods/{name}/eviction` (policy/v1 Eviction) as kube-apiserver's eviction REST
//! answers it: the pod's PodDisruptionBudget decides, the pod is deleted through the
//! ordinary delete (finalizers and preconditions honoured).
//!
//! - unknown pod: 404; an Eviction whose `metadata.name` differs from the URL: 400;
//! - a pod that is Pending, Succeeded or Failed, or already being deleted: deleted, no
//!   budget consulted (the real server's `canIgnorePDB`);
//! - no budget in the pod's namespace selects the pod: deleted;
//! - more than one: 500, as the real server ("does not support");
//! - one budget: its `status.disruptionsAllowed` decides. This server runs no disruption
//!   controller, so the status is what a client wrote through `/status` (absent reads as
//!   0, as an unprocessed budget blocks evictions on a real cluster). 0: 429
//!   `TooManyRequests` with a `DisruptionBudget` cause naming the budget; negative: 403;
//!   positive: the budget's `disruptionsAllowed` is lowered by one and the pod recorded in
//!   `status.disruptedPods` (so two evictions cannot spend one disruption), then the pod
//!   is deleted. The real server also checks `observedGeneration` and the
//!   `unhealthyPodEvictionPolicy`; this server keeps no `generation`, and does neither.
//!
//! `deleteOptions.preconditions` of the Eviction apply to the delete.

use serde_json::{Value, json};

use crate::meta::now_rfc3339;
use crate::resources::{ResourceType, lookup};
use crate::selector::{LabelReq, LabelSelector};
use crate::status::ApiError;
use crate::store::{DeleteOptions, ListOptions, Store, Subresource};

/// The `reason` of the StatusCause a budget's refusal carries (policy/v1 `DisruptionBudgetCause`).
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";

/// Evicts pod `ns/name` as the body (an Eviction) asks; see the module doc for the rules.
pub fn evict(
    s: &mut Store,
    pods: &'static ResourceType,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<(), ApiError> {
    if let Some(bn) = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty() && *n != name)
    {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object: {name} != {bn}"
        )));
    }
    let opts = body
        .get("deleteOptions")
        .map(DeleteOptions::from_body)
        .unwrap_or_default();
    let pod = s.get(pods, ns, name)?;
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending");
    let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
    if terminating || matches!(phase, "Pending" | "Succeeded" | "Failed") {
        s.delete(pods, ns, name, &opts)?;
        return Ok(());
    }
    let pdbs = lookup("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))?;
    let page = s.list(pdbs, Some(ns), &ListOptions::default())?;
    let mut covering: Vec<Value> = page
        .items
        .iter()
        .map(|v| v.to_value())
        .filter(|b| selects(b.pointer("/spec/selector"), &pod))
        .collect();
    let budget = match covering.len() {
        0 => {
            s.delete(pods, ns, name, &opts)?;
            return Ok(());
        }
        1 => covering.remove(0),
        _ => {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let bname = budget
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let status_i64 = |k: &str| {
        budget
            .pointer(&format!("/status/{k}"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let allowed = status_i64("disruptionsAllowed");
    if allowed < 0 {
        return Err(ApiError::forbidden("pdb disruptions allowed is negative"));
    }
    if allowed == 0 {
        let mut e = ApiError::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        );
        e.details = Some(json!({
            "causes": [{
                "reason": DISRUPTION_BUDGET_CAUSE,
                "message": format!(
                    "The disruption budget {bname} needs {} healthy pods and has {} currently",
                    status_i64("desiredHealthy"),
                    status_i64("currentHealthy")
                ),
            }]
        }));
        return Err(e);
    }
    let mut updated = budget;
    updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if !updated["status"]["disruptedPods"].is_object() {
        updated["status"]["disruptedPods"] = json!({});
    }
    updated["status"]["disruptedPods"][name] = json!(now_rfc3339());
    s.update(pdbs, ns, &bname, updated, Subresource::Status)?;
    s.delete(pods, ns, name, &opts)?;
    Ok(())
}

/// Whether a policy/v1 budget's `spec.selector` selects the pod: null selects nothing, `{}`
/// every pod of the namespace; `matchLabels` and `matchExpressions` must all hold (an
/// unknown operator selects nothing, as an invalid selector would be refused at create).
pub fn selects(selector: Option<&Value>, pod: &Value) -> bool {
    let Some(sel) = selector.filter(|s| s.is_object()) else {
        return false;
    };
    let mut reqs = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push(LabelReq::Eq(k.clone(), v.as_str().unwrap_or("").into()));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let values = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect();
        reqs.push(match e.get("operator").and_then(Value::as_str) {
            Some("In") => LabelReq::In(key, values),
            Some("NotIn") => LabelReq::NotIn(key, values),
            Some("Exists") => LabelReq::Exists(key),
            Some("DoesNotExist") => LabelReq::NotExists(key),
            _ => return false,
        });
    }
    LabelSelector(reqs).matches(pod)
}
