//! Where namespace quotas (issue 30, [`crate::quota`]) stop a pod: at admission, against
//! the smallest GPU of the cluster the pod could get ([`admission_refusal`]), and after
//! Filter has chosen its GPUs, against what they really cost ([`gate_filter`]). Both read
//! the [`QuotaBook`](crate::quota_book::QuotaBook) in [`ClusterState`]; the filter gate runs
//! under the same lock as the decision it checks.

use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{Vendor, pod as pod_keys};
use k8s_openapi::api::core::v1::Pod;

use crate::admission::WebhookConfig;
use crate::extender::{EventNote, ExtenderFilterResult, FilterDecision};
use crate::quota::{QUOTA_EXCEEDED_REASON, QuotaRefusal};
use crate::state::ClusterState;

/// Checks Filter's decision against the pod's namespace quotas and charges it; a decision
/// over a quota is undone (the state's reservation released) and every candidate node is
/// answered with the refusal, as unresolvable: evicting pods from a node frees no quota of
/// this namespace that kube-scheduler's preemption could count on.
pub fn gate_filter(
    state: &mut ClusterState,
    pod: &Pod,
    names: &[String],
    decision: FilterDecision,
) -> FilterDecision {
    let Some(patch) = &decision.patch else {
        return decision;
    };
    let Some(node) = patch.annotations.get(pod_keys::VGPU_NODE) else {
        return decision;
    };
    let Some(devices) = state.node(node).map(|n| n.devices.clone()) else {
        return decision;
    };
    let mut runs = Vec::new();
    for vendor in Vendor::ALL {
        if let Some(text) = patch.annotations.get(vendor.names().devices_allocated) {
            // Encoded by this filter a moment ago: it decodes.
            match decode_pod_devices(text) {
                Ok(r) => runs.push((vendor, r)),
                Err(e) => {
                    state.release(&patch.uid);
                    return refused(
                        names,
                        decision,
                        format!("cannot read back the decision: {e}"),
                    );
                }
            }
        }
    }
    let uid = patch.uid.clone();
    match state
        .quota
        .check_and_charge_decision(&uid, pod, runs, &devices)
    {
        Ok(()) => decision,
        Err(refusal) => {
            state.release(&uid);
            refused(names, decision, refusal.to_string())
        }
    }
}

fn refused(names: &[String], decision: FilterDecision, message: String) -> FilterDecision {
    FilterDecision {
        result: ExtenderFilterResult {
            failed_and_unresolvable_nodes: names
                .iter()
                .map(|n| (n.clone(), message.clone()))
                .collect(),
            ..Default::default()
        },
        patch: None,
        event: Some(EventNote {
            reason: QUOTA_EXCEEDED_REASON,
            warning: true,
            message,
        }),
        refusals: decision.refusals,
    }
}

/// The quota refusal of a pod's CREATE review, if its namespace's quotas cannot hold it
/// even on the smallest GPU of the cluster it could be given (nothing charged; DRA-mode
/// claims sized without device shapes: the webhook uses [`crate::quota_admission::admit`]).
/// A body that is no pod CREATE passes: the codec answers it.
pub fn admission_refusal(
    body: &[u8],
    config: &WebhookConfig,
    state: &ClusterState,
) -> Option<QuotaRefusal> {
    let ask = crate::quota_admission::admission_ask_of(body, config, state, &[])?;
    state.quota.check(&ask.namespace, &ask.total).err()
}

#[cfg(test)]
#[path = "quota_gate_tests.rs"]
mod tests;
