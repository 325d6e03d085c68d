//! What the core is given: the scheduler's node snapshots and, per pod holding slices, what
//! it holds, what it asks for (the scheduler fits it again by that when it is recreated)
//! and the facts that decide whether it may be moved at all.

use std::collections::BTreeMap;

use hami_protocol::names::Vendor;
use hami_protocol::requests::{ContainerRequest, RequestDefaults, pod_requests};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, PodPolicies};
use hami_scheduler_core::fit::Selectors;
use hami_scheduler_core::snapshot::NodeSnapshot;
use hami_scheduler_core::state::{ClusterState, PodHolding};
use hami_scheduler_core::usage::DeviceCharge;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// The cluster as the planner sees it.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Every node's GPUs and usage (the scheduler's snapshot), usage including every pod
    /// of [`Self::pods`] (and, after [`Self::count_reservations`], the capacity defrag
    /// reservations hold).
    pub nodes: Vec<NodeSnapshot>,
    /// The pods holding slices that the planner may consider moving.
    pub pods: Vec<PodFacts>,
}

impl Cluster {
    /// The scheduler's state, with `facts` saying for each pod holding slices what it asks
    /// for and how safe it is to move (`None`: the shell knows nothing of the pod, it is not
    /// a candidate; its slices stay counted). Nodes and pods are sorted by name, so a plan
    /// does not depend on the state's hash order.
    pub fn from_state(
        state: &ClusterState,
        mut facts: impl FnMut(&str, &PodHolding) -> Option<(PodRequest, Safety)>,
    ) -> Self {
        let mut nodes: Vec<NodeSnapshot> = state.nodes().cloned().collect();
        nodes.sort_by(|a, b| a.devices.name.cmp(&b.devices.name));
        let mut pods: Vec<PodFacts> = state
            .holdings()
            .filter_map(|(uid, h)| {
                let (request, safety) = facts(uid, h)?;
                Some(PodFacts {
                    uid: uid.clone(),
                    namespace: h.namespace.clone(),
                    name: h.name.clone(),
                    node: h.node.clone(),
                    charges: h.charges.clone(),
                    request,
                    safety,
                })
            })
            .collect();
        pods.sort_by(|a, b| {
            (&a.node, &a.namespace, &a.name).cmp(&(&b.node, &b.namespace, &b.name))
        });
        Self { nodes, pods }
    }

    /// Counts the defrag reservations in force at `now` (unix seconds) as taken, the way
    /// the scheduler's Filter counts them for every pod but the reserving owner's
    /// ([`hami_scheduler_core::reservations::for_filter`], over `state.reservations`, which
    /// the state read from the nodes' `reservation.defrag.hami.io/<uid>` annotations): no
    /// move then targets reserved capacity, and a measure counts it used.
    ///
    /// `for_pod`: the pending pod of a [`crate::Target::FitPod`]; what is reserved for its
    /// owner stays free (it is that owner's replacement, which Filter steers there). A moved
    /// pod never gets reserved capacity otherwise, not even one of the owner's: a
    /// reservation holds room for one replacement, that of the eviction that wrote it, so
    /// another of the owner's pods moved there would take the room that replacement needs.
    /// Limit: with `for_pod` the owner's reservations are free for the whole plan, moves
    /// included; the pending replacement fits them (they were sized for the pod it
    /// replaces), so such a plan is reached with no move unless its template changed.
    ///
    /// Call it on [`Self::from_state`]'s result for the same `state`. No reservation
    /// anywhere: nothing changes.
    pub fn count_reservations(&mut self, state: &ClusterState, for_pod: Option<&Pod>, now: i64) {
        if state.reservations.is_empty() {
            return;
        }
        let names: Vec<String> = self.nodes.iter().map(|n| n.devices.name.clone()).collect();
        let nobody = Pod::default();
        let mut found = hami_scheduler_core::reservations::for_filter(
            state,
            for_pod.unwrap_or(&nobody),
            &names,
            |name| state.node(name),
            now,
        );
        for node in &mut self.nodes {
            if let Some(charged) = found.charged.remove(&node.devices.name) {
                *node = charged;
            }
        }
    }
}

/// What a pod asks for, as the scheduler's filter reads it.
#[derive(Debug, Clone)]
pub struct PodRequest {
    /// Per container, device-list order.
    pub containers: Vec<ContainerRequest>,
    /// Which GPUs it may use.
    pub selectors: Selectors,
    /// Its GPU policy (its annotation, or the scheduler's default).
    pub gpu_policy: GpuPolicy,
}

impl PodRequest {
    /// Reads a pod as the scheduler's filter does (`extender::decide_filter`: requests,
    /// selection annotations, GPU policy annotation); that reading is inline there, so it is
    /// repeated here over the same protocol functions.
    pub fn from_pod(
        pod: &Pod,
        defaults: &RequestDefaults,
        default_policy: GpuPolicy,
    ) -> Result<Self, String> {
        let shown = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let containers = pod_requests(pod, defaults).map_err(|e| format!("pod {shown}: {e}"))?;
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let amd = DeviceSelector::from_annotations(Vendor::Amd, &annotations);
        let nvidia = DeviceSelector::from_annotations(Vendor::Nvidia, &annotations);
        let policies = PodPolicies::from_annotations(&annotations);
        match (amd, nvidia, policies) {
            (Ok(amd), Ok(nvidia), Ok(policies)) => Ok(Self {
                containers,
                selectors: Selectors { amd, nvidia },
                gpu_policy: policies.gpu.unwrap_or(default_policy),
            }),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(format!("pod {shown}: {e}")),
        }
    }

    /// Whether any container asks for a GPU.
    pub fn asks_gpu(&self) -> bool {
        self.containers.iter().any(|c| !c.is_empty())
    }
}

/// One pod holding slices.
#[derive(Debug, Clone)]
pub struct PodFacts {
    /// Its uid.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// What it holds there, per GPU (`PodHolding::charges`).
    pub charges: Vec<DeviceCharge>,
    /// What it asks for.
    pub request: PodRequest,
    /// Whether it may be moved.
    pub safety: Safety,
}

impl PodFacts {
    /// `namespace/name`.
    pub fn shown(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The facts about a pod that decide whether it may be moved (the shell reads them from
/// the pod, its owner and the PodDisruptionBudgets).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Safety {
    /// The PodDisruptionBudget covering it, if any.
    pub pdb: Option<Pdb>,
    /// Its controller, if any (a bare pod has none: nobody recreates it).
    pub owner: Option<Owner>,
    /// Part of a gang (pod group): moving one member stalls the others.
    pub gang_member: bool,
    /// A static (mirror) pod: kubelet owns it, the API cannot move it.
    pub static_pod: bool,
    /// `system-node-critical`/`system-cluster-critical`, or a priority at or above the
    /// critical threshold.
    pub critical: bool,
    /// Seconds since it started.
    pub age_seconds: u64,
}

/// A PodDisruptionBudget as it stands now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pdb {
    /// `namespace/name` of the budget.
    pub name: String,
    /// `status.disruptionsAllowed`: evictions it allows now.
    pub disruptions_allowed: u32,
}

/// A pod's controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// `ReplicaSet`, `StatefulSet`, `DaemonSet`, `Job`, ...
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Desired replicas (1 for a Job's pod or a single-replica Deployment).
    pub replicas: u32,
}

/// Charges keyed by card id, for comparisons that must not depend on order.
pub(crate) fn by_card(charges: &[DeviceCharge]) -> BTreeMap<&str, (u64, u64, u32)> {
    charges
        .iter()
        .map(|c| (c.uuid.as_str(), (c.mem_mib, c.cores, c.slots)))
        .collect()
}
