//! What the defrag planner is told about the live cluster the UI watches (issue 32 item 2
//! in the What-if page): the scheduler's state built from the watched nodes and pods, and
//! per pod holding slices what it asks and the facts that decide whether it may move —
//! `hami_defrag_core::pod_safety`, the rule `hami defrag plan` uses, with the
//! PodDisruptionBudgets the UI listed for the request (none when it may not list them: the
//! page then says so, and the commands it shows check them). Pure.

use std::collections::BTreeMap;

use hami_defrag_core::{Cluster, PodRequest, pod_safety};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

/// What `pod` asks, as the scheduler's filter reads it (default settings and policy).
pub(crate) fn request(pod: &Pod) -> Result<PodRequest, String> {
    PodRequest::from_pod(pod, &RequestDefaults::default(), GpuPolicy::default())
}

/// The planner's cluster from `state`, `pods` and `pdbs`: candidates are the pods holding
/// slices whose request reads as the scheduler reads it; the defrag reservations in force
/// at `now` count as taken, except those of `pending`'s owner.
pub(crate) fn cluster(
    state: &ClusterState,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    now: i64,
    pending: Option<&Pod>,
) -> Cluster {
    pod_safety::cluster_from_pods(state, pods, pdbs, now, pending, |pod| request(pod).ok())
}

/// The pods holding slices the policy keeps in place: `namespace/name` and why.
pub(crate) fn protected(
    cluster: &Cluster,
    policy: &hami_defrag_core::Policy,
) -> BTreeMap<String, String> {
    pod_safety::protected(cluster, policy)
}
