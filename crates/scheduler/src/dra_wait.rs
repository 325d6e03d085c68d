//! DRA mode has no preemption (issue 30): kube-scheduler's DynamicResources plugin cannot
//! simulate freeing a ResourceClaim, so a DRA pod whose priority would preempt never evicts
//! anyone; it waits for a GPU to free (upstream: KEP-5690). Admission warns
//! ([`dra_preemption_warning`]); once kube-scheduler has found it unschedulable the pod also
//! gets a Warning Event ([`WAITS_REASON`]) saying so and what to do, posted by the leader
//! from the pod informer's view (the pod informer passes every pod it applies to [`waiting`],
//! outside the state's lock: [`crate::informer::Wakes`]).

use std::collections::HashSet;
use std::sync::Arc;

use hami_protocol::dra::CLAIM_PREFIX;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use crate::kube_error;
use crate::review_codec::dra_preemption_warning;

/// The reason of the Event on a DRA pod that waits where it would have preempted.
pub const WAITS_REASON: &str = "DRAPreemptionUnavailable";

/// Where upstream's DRA preemption is tracked.
pub const KEP: &str = "https://github.com/kubernetes/enhancements/issues/5690";

/// A DRA pod that waits and would have preempted: where to post the Event, and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// The pod's UID (one Event per pod).
    pub uid: String,
    /// The pod.
    pub reference: ObjectReference,
    /// The Event's note.
    pub note: String,
}

/// The notice for `pod` if it is a DRA-mode pod (claims the webhook made, `hami-amd-*`)
/// that kube-scheduler has marked `PodScheduled=False` `Unschedulable`, is unbound and
/// alive, and has a priority that would preempt (above 0, `preemptionPolicy` not `Never`).
pub fn waiting(pod: &Pod) -> Option<Waiting> {
    let spec = pod.spec.as_ref()?;
    let dra = spec
        .resource_claims
        .iter()
        .flatten()
        .any(|c| c.name.starts_with(CLAIM_PREFIX));
    if !dra || spec.node_name.is_some() || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let unschedulable = status.conditions.iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if !unschedulable {
        return None;
    }
    let priority = dra_preemption_warning(pod).and(spec.priority)?;
    let uid = pod.metadata.uid.clone()?;
    Some(Waiting {
        reference: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: Some(uid.clone()),
            ..Default::default()
        },
        uid,
        note: format!(
            "priority {priority}: no GPU is free and this DRA-mode pod evicts no lower-priority \
             pod: kube-scheduler has no preemption for ResourceClaims until KEP-5690 ({KEP}); \
             it waits until a GPU frees. To run it sooner, delete or scale down lower-priority \
             pods on the DRA nodes, or admit it in device-plugin mode (annotation \
             hami.io/amd-mode: device-plugin, on device-plugin nodes), where it can preempt"
        ),
    })
}

/// Posts each waiting DRA pod's Event once (per pod, while this replica leads).
pub(crate) async fn events(
    mut waiting: tokio::sync::mpsc::UnboundedReceiver<Waiting>,
    recorder: Recorder,
    leader: Arc<crate::leader::Leadership>,
) {
    let mut told: HashSet<String> = HashSet::new();
    while let Some(w) = waiting.recv().await {
        if !leader.is_leader() || told.contains(&w.uid) {
            continue;
        }
        let event = Event {
            type_: EventType::Warning,
            reason: WAITS_REASON.to_owned(),
            note: Some(w.note.chars().take(1000).collect()),
            action: "Preempt".to_owned(),
            secondary: None,
        };
        match recorder.publish(&event, &w.reference).await {
            Ok(()) => {
                // Bounded: a pod told twice after a clear is better than memory that grows.
                if told.len() >= 10_000 {
                    told.clear();
                }
                told.insert(w.uid);
            }
            Err(e) => {
                warn!(error = %kube_error::text(&e), "cannot record the {WAITS_REASON} event")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(priority: i32, policy: Option<&str>, condition: bool, claims: bool) -> Pod {
        let mut p = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"priority": priority, "containers": [{"name": "c"}]},
            "status": {"phase": "Pending"}
        });
        if let Some(policy) = policy {
            p["spec"]["preemptionPolicy"] = json!(policy);
        }
        if claims {
            p["spec"]["resourceClaims"] =
                json!([{"name": "hami-amd-c", "resourceClaimTemplateName": "hami-amd-x"}]);
        }
        if condition {
            p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable"}]);
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn only_an_unschedulable_dra_pod_that_would_preempt_is_told() {
        let told = waiting(&pod(1000, None, true, true)).unwrap();
        assert!(told.note.starts_with("priority 1000:"), "{}", told.note);
        assert!(told.note.contains("KEP-5690") && told.note.contains(KEP));
        assert_eq!(told.reference.name.as_deref(), Some("p"));
        assert_eq!(told.uid, "u1");
        assert_eq!(waiting(&pod(0, None, true, true)), None, "priority 0");
        assert_eq!(waiting(&pod(1000, Some("Never"), true, true)), None);
        assert_eq!(
            waiting(&pod(1000, None, false, true)),
            None,
            "not failed yet"
        );
        assert_eq!(waiting(&pod(1000, None, true, false)), None, "not DRA");
        let mut bound = pod(1000, None, true, true);
        bound.spec.as_mut().unwrap().node_name = Some("n".into());
        assert_eq!(waiting(&bound), None);
    }
}
