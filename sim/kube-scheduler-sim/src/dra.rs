//! The shell of kube-scheduler's `DynamicResources` plugin for pods with
//! `spec.resourceClaims`: informers of ResourceSlices, DeviceClasses, ResourceClaims and
//! ResourceClaimTemplates; an assume cache of allocations being written (so the next pod
//! counts them before the informer shows them); per pod, placement by the pure
//! [`crate::dra_placement`], then — asynchronously, like kube-scheduler's binding cycle —
//! each new allocation written to the claim's `status` (`allocation` with the node's
//! `nodeSelector`, `reservedFor` the pod) with the claim's resourceVersion as precondition,
//! the pod added to `reservedFor` of claims allocated before, and the pod bound. A failed
//! write undoes what this pod wrote and the pod goes back to the queue.
//!
//! Extended resources a DeviceClass maps (KEP-5004, pure part in
//! [`crate::extended_resources`]): on nodes that offer none of them as allocatable, the
//! special claim is placed with the pod's other claims (assumed under a temporary UID until
//! it exists); the binding cycle creates it, writes its allocation and reservation, records
//! `pod.status.extendedResourceClaimStatus`, then binds; a failure deletes it again. A claim
//! of an earlier try (the pod still pending) is placed as it is. The claim controller frees
//! and deletes it when the pod goes (it is owned by the pod).
//!
//! Not modelled: the extender is not called for DRA pods (a pod with claims and extender
//! resources gets no extender filter), nor are the other filter plugins (NodeResourcesFit,
//! affinity, taints of Nodes): a node offering a mapped extended resource as allocatable is
//! refused with that reason instead of being fitted by NodeResourcesFit, and extended
//! resources no class maps are not checked; in a scheduler with an extender, a pod without
//! claims goes to the extender even when a class maps its resources (kube-scheduler would
//! run both, and the extender refuses DRA nodes); claims shared by several pods are reserved
//! for each but placed by the first; binding conditions (KEP-5007) are not waited for.

//!
//! Files: `dra/state.rs` (the informers, the assume cache and the cluster view placement
//! reads), `dra/scheduling_cycle.rs` (one pod's decision), `dra/binding_cycle.rs` (the claim
//! writes and the binding, undone on failure).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::dra_placement::NodeOrder;
use crate::extended_resources as ext;

mod binding_cycle;
mod scheduling_cycle;
mod state;

pub(crate) use binding_cycle::{bind, unreserve};
pub(crate) use scheduling_cycle::{Decision, Nodes, decide};
pub use state::{DraState, allocation_node};

/// How the simulated scheduler places DRA pods.
#[derive(Debug, Clone, Copy, Default)]
pub struct DraOptions {
    /// The order nodes are tried in (`MostAllocated` = binpack).
    pub node_order: NodeOrder,
}

/// Whether a pod has ResourceClaims (and so takes the DRA path).
pub fn has_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The pod's requests of extended resources a DeviceClass in `state` maps (KEP-5004: such a
/// pod takes the DRA path even without claims).
pub fn mapped_extended(state: &DraState, pod: &Pod) -> BTreeMap<String, u64> {
    let requests = ext::pod_requests(pod);
    if requests.is_empty() {
        return requests;
    }
    let classes = state.classes.state();
    ext::mapped(
        &requests,
        &ext::class_mapping(classes.iter().map(|c| c.as_ref())),
    )
}
