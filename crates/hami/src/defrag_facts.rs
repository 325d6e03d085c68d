//! What `hami defrag plan` tells the planner about the cluster (pure: the shell lists
//! nodes, pods and PodDisruptionBudgets, this decides): the scheduler's state built the way
//! `hami status` builds it, and per pod holding slices what it asks for and the facts that
//! decide whether it may be moved (`hami_defrag_core::pod_safety`, shared with the web UI).

use std::collections::BTreeMap;

use hami_defrag_core::pod_safety::{self, controller};
use hami_defrag_core::{Cluster, PodRequest};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::input::InputError;

/// The planner's cluster: the scheduler's state of `state`, and as candidates the pods
/// holding slices that still read as the scheduler reads them, each with the facts of
/// [`pod_safety::safety`] (the rule the web UI's preview shares). The defrag reservations
/// in force at `now` count as taken, except those held for the owner of `pending`.
pub(crate) fn cluster(
    state: &ClusterState,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    gpu_policy: GpuPolicy,
    now: i64,
    pending: Option<&Pod>,
) -> Cluster {
    pod_safety::cluster_from_pods(state, pods, pdbs, now, pending, |pod| {
        request(pod, gpu_policy).ok()
    })
}

/// What `pod` asks for, as the scheduler's filter reads it with the default request
/// settings and `gpu_policy` for a pod without its own.
pub(crate) fn request(pod: &Pod, gpu_policy: GpuPolicy) -> Result<PodRequest, InputError> {
    PodRequest::from_pod(pod, &RequestDefaults::default(), gpu_policy).map_err(InputError)
}

/// A scenario's pod of workload number `index`: controlled by the workload (kind
/// `Workload`, its template's name), unless its template names a controller itself.
pub(crate) fn owned_by_workload(
    mut pod: Pod,
    workload: &hami_planner::scenario::Workload,
    index: usize,
) -> Pod {
    if controller(&pod).is_none() {
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "hami.io/v1".into(),
            kind: "Workload".into(),
            name: workload.name().to_owned(),
            uid: format!("workload-{index}"),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
    }
    pod
}

/// The pending pod `ns/name` of `pods` and what it asks for; an unknown pod or one already
/// placed is the user's to fix (one asking no GPU, the core refuses).
pub(crate) fn pending_pod<'a>(
    wanted: &str,
    pods: &'a [Pod],
    state: &ClusterState,
    gpu_policy: GpuPolicy,
) -> Result<(&'a Pod, PodRequest), InputError> {
    let (namespace, name) = wanted.split_once('/').ok_or_else(|| {
        InputError(format!(
            "--pending-pod {wanted}: name the pod as NAMESPACE/NAME"
        ))
    })?;
    let pod = pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == namespace
                && p.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| {
            InputError(format!(
                "--pending-pod {wanted}: no such pod in the cluster (kubectl get pod -n {namespace} {name})"
            ))
        })?;
    let holds = pod
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| state.holdings().find(|(u, _)| u.as_str() == uid));
    if let Some((_, holding)) = holds {
        return Err(InputError(format!(
            "--pending-pod {wanted}: the pod already holds GPU slices on node {}; name a pod that waits",
            holding.node
        )));
    }
    Ok((pod, request(pod, gpu_policy)?))
}

/// The pods holding slices that the policy keeps in place, `namespace/name` and why, sorted.
pub(crate) fn protected(
    cluster: &Cluster,
    policy: &hami_defrag_core::Policy,
) -> BTreeMap<String, String> {
    pod_safety::protected(cluster, policy)
}
