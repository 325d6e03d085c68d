//! The scheduling cycle of one DRA pod: its claims found (or waited for), its
//! extended-resource claim (KEP-5004) found or drafted, placement by the pure
//! [`crate::dra_placement`] over the state's view, and the new allocations assumed.

use std::collections::{BTreeMap, HashSet};

use hami_dra_core::api::{self as model, DeviceRequestAllocationResult};
use k8s_openapi::api::core::v1::{ContainerExtendedResourceRequest, Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::runtime::reflector::{self, Store};

use super::mapped_extended;
use super::state::{ClaimWrite, DraState, allocation_node, convert};
use crate::dra_placement::{NodeView, PodClaim, Unschedulable, place};
use crate::extended_resources as ext;

/// What one DRA pod's scheduling cycle decided.
pub(crate) enum Decision {
    /// A claim does not exist yet (the claim controller is making it): try again soon.
    Waiting,
    /// No node fits.
    Unschedulable(String),
    /// Place it: the node, and per claim (name, object, new results or `None`).
    Place {
        node: String,
        claims: Vec<ClaimWrite>,
        /// The extended-resource claim's part (KEP-5004), when the pod has one.
        extended: Option<Box<ExtendedClaim>>,
    },
}

/// The pod's extended-resource claim in a [`Decision::Place`].
pub(crate) struct ExtendedClaim {
    /// A new claim: the object to create, the temporary UID its allocation is assumed under,
    /// and its allocation. `None`: it exists from an earlier try (among `claims`).
    pub(super) create: Option<(ResourceClaim, String, Vec<DeviceRequestAllocationResult>)>,
    /// The existing claim's name (when `create` is `None`).
    pub(super) name: Option<String>,
    /// `pod.status.extendedResourceClaimStatus.requestMappings`.
    pub(super) mappings: Vec<ContainerExtendedResourceRequest>,
}

/// The node's allocatable of `resource`, as a count.
fn allocatable(nodes: &Store<Node>, node: &str, resource: &str) -> Option<u64> {
    let n = nodes.get(&reflector::ObjectRef::new(node))?;
    let q = n.status.as_ref()?.allocatable.as_ref()?.get(resource)?;
    hami_dra_core::quantity::parse(&q.0).ok()
}

/// The nodes a scheduling cycle sees: the schedulable ones' names, and the Node objects
/// (their allocatable, for KEP-5004).
pub(crate) struct Nodes<'a> {
    pub(crate) schedulable: &'a HashSet<String>,
    pub(crate) objects: &'a Store<Node>,
}

/// The scheduling cycle of one DRA pod over `view` (which it updates with what it assumes).
pub(crate) fn decide(state: &DraState, pod: &Pod, cycle_nodes: &Nodes) -> Decision {
    let (nodes, node_objects) = (cycle_nodes.schedulable, cycle_nodes.objects);
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    let mut objects = Vec::new();
    for n in &names {
        match state.pod_claim(pod, n) {
            Some(c) => objects.push(c),
            None => return Decision::Waiting,
        }
    }
    // KEP-5004: the pod's extended-resource claim, found from an earlier try or made here.
    let extended = mapped_extended(state, pod);
    let mut new_extended: Option<(ResourceClaim, model::DeviceClaim)> = None;
    let mut mappings = Vec::new();
    let mut existing_extended = None;
    if !extended.is_empty() {
        let classes = state.classes.state();
        let mapping = ext::class_mapping(classes.iter().map(|c| c.as_ref()));
        let (requests, m) = ext::requests_and_mappings(pod, &extended, &mapping);
        mappings = m;
        match state
            .claims
            .state()
            .into_iter()
            .find(|c| ext::is_claim_of(c, pod))
        {
            Some(c) => {
                existing_extended = Some(c.name_any());
                objects.push(c);
            }
            None => {
                let body = match ext::claim_body(pod, &requests) {
                    Ok(b) => b,
                    Err(e) => return Decision::Unschedulable(e),
                };
                match convert::<_, model::DeviceClaim>(&body.spec.devices) {
                    Ok(spec) => new_extended = Some((body, spec)),
                    Err(e) => {
                        return Decision::Unschedulable(format!(
                            "the extended-resource claim cannot be read: {e}"
                        ));
                    }
                }
            }
        }
    }
    let mut specs = Vec::new();
    for c in &objects {
        match convert::<_, model::DeviceClaim>(&c.spec.devices) {
            Ok(s) => specs.push(s),
            Err(e) => {
                return Decision::Unschedulable(format!(
                    "claim {:?} cannot be read: {e}",
                    c.name_any()
                ));
            }
        }
    }
    let uids: Vec<String> = objects
        .iter()
        .map(|c| c.uid().unwrap_or_default())
        .collect();
    let assumed = state.assumed_nodes();
    let on: Vec<Option<String>> = objects
        .iter()
        .zip(&uids)
        .map(|(c, uid)| allocation_node(c).or_else(|| assumed.get(uid).cloned()))
        .collect();
    let claim_names: Vec<String> = objects.iter().map(|c| c.name_any()).collect();
    let mut pod_claims: Vec<PodClaim> = (0..objects.len())
        .map(|i| PodClaim {
            name: &claim_names[i],
            uid: &uids[i],
            spec: &specs[i],
            allocated_on: on[i].as_deref(),
        })
        .collect();
    let temp_uid = format!("<extended-resources>/{}", pod.uid().unwrap_or_default());
    let extended_label = format!(
        "<extended-resources: {}>",
        extended.keys().cloned().collect::<Vec<_>>().join(",")
    );
    if let Some((_, spec)) = &new_extended {
        pod_claims.push(PodClaim {
            name: &extended_label,
            uid: &temp_uid,
            spec,
            allocated_on: None,
        });
    }
    // A node offering a mapped resource as allocatable serves it through a device plugin.
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    let view = state.view();
    let node_views: Vec<NodeView> = view
        .nodes
        .iter()
        .filter(|n| nodes.contains(&n.name))
        .filter(|n| {
            let Some(r) =
                ext::device_plugin_served(&extended, |r| allocatable(node_objects, &n.name, r))
            else {
                return true;
            };
            refused.insert(
                n.name.clone(),
                format!("node(s) serve {r} through a device plugin, not DRA"),
            );
            false
        })
        .map(|n| NodeView {
            name: &n.name,
            slices: &n.slices,
            allocated: &n.allocated,
            utilization: n.utilization,
        })
        .collect();
    match place(
        &pod_claims,
        &view.classes,
        &node_views,
        state.options.node_order,
    ) {
        Ok(mut p) => {
            let new_results = new_extended
                .as_ref()
                .and_then(|_| p.results.pop().flatten());
            for (i, r) in p.results.iter().enumerate() {
                if let Some(r) = r {
                    state.assume(&uids[i], &p.node, r);
                }
            }
            let extended = if extended.is_empty() {
                None
            } else {
                let create = match (new_extended, new_results) {
                    (Some((body, _)), Some(results)) => {
                        state.assume(&temp_uid, &p.node, &results);
                        Some((body, temp_uid, results))
                    }
                    _ => None,
                };
                Some(Box::new(ExtendedClaim {
                    create,
                    name: existing_extended,
                    mappings,
                }))
            };
            Decision::Place {
                node: p.node,
                claims: objects.into_iter().zip(p.results).collect(),
                extended,
            }
        }
        Err(Unschedulable { mut reasons, .. }) => {
            reasons.append(&mut refused);
            Decision::Unschedulable(
                Unschedulable {
                    // Nodes without slices count too: kube-scheduler reports every node.
                    nodes: nodes.len(),
                    reasons,
                }
                .to_string(),
            )
        }
    }
}
