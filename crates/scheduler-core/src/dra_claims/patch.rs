//! The pod patch: each claimed container pointed at its template (its `amd.com/*`
//! requests and limits removed, `resources.claims` and `spec.resourceClaims` added).

use hami_protocol::names::AMD;
use hami_protocol::requests::{ContainerKind, container_slots};
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Value, json};

use super::ContainerClaim;

/// JSON Pointer escaping (RFC 6901) of one path segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The RFC 6902 operations pointing each claimed container at its template: its `amd.com/*`
/// requests and limits removed, `resources.claims` and `spec.resourceClaims` added.
pub fn patch(spec: &PodSpec, claims: &[ContainerClaim]) -> Vec<Value> {
    let mut ops = Vec::new();
    let slots = container_slots(spec);
    for claim in claims {
        let Some(slot) = slots
            .iter()
            .find(|s| s.kind == claim.kind && s.index == claim.index)
        else {
            continue;
        };
        let base = match claim.kind {
            ContainerKind::App => format!("/spec/containers/{}", claim.index),
            _ => format!("/spec/initContainers/{}", claim.index),
        };
        let resources = slot.container.resources.as_ref();
        for (section, map) in [
            ("limits", resources.and_then(|r| r.limits.as_ref())),
            ("requests", resources.and_then(|r| r.requests.as_ref())),
        ] {
            for name in AMD.resources() {
                if map.is_some_and(|m| m.contains_key(name)) {
                    ops.push(json!({"op": "remove", "path": format!("{base}/resources/{section}/{}", escape(name))}));
                }
            }
        }
        let entry = json!({"name": claim.entry_name});
        match resources {
            None => ops.push(
                json!({"op": "add", "path": format!("{base}/resources"), "value": {"claims": [entry]}}),
            ),
            Some(r) if r.claims.is_none() => ops.push(
                json!({"op": "add", "path": format!("{base}/resources/claims"), "value": [entry]}),
            ),
            Some(_) => ops.push(
                json!({"op": "add", "path": format!("{base}/resources/claims/-"), "value": entry}),
            ),
        }
    }
    let entries: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c.entry_name, "resourceClaimTemplateName": c.template_name}))
        .collect();
    if spec.resource_claims.is_none() && !entries.is_empty() {
        ops.push(json!({"op": "add", "path": "/spec/resourceClaims", "value": entries}));
    } else {
        for e in entries {
            ops.push(json!({"op": "add", "path": "/spec/resourceClaims/-", "value": e}));
        }
    }
    ops
}
