//! Which node a pod with ResourceClaims goes to, and what each of its claims is allocated:
//! the pure part of kube-scheduler's `DynamicResources` plugin as the simulated scheduler
//! models it (no I/O, no async). Per node, the pod's claims are allocated one after another
//! by `hami_structured_allocation::allocator` over that node's ResourceSlices, counting what other claims
//! (and this pod's earlier claims) already hold; a claim allocated before pins the pod to the
//! node of its allocation. Nodes are tried in the order of a [`NodeOrder`]; the first node
//! where every claim fits wins.
//!
//! Not modelled: slices with `nodeSelector`/`allNodes`/`perDeviceNodeSelection` (only
//! `nodeName` slices are seen), scoring plugins other than the [`NodeOrder`] (kube-scheduler
//! itself has no binpack for DRA devices; `MostAllocated` stands in for a binpack scorer),
//! `percentageOfNodesToScore` (all nodes are considered), and whatever the allocator model
//! refuses (its module doc names it).

use std::collections::BTreeMap;

use hami_dra_core::api::{DeviceClaim, DeviceRequestAllocationResult, ResourceSlice};
use hami_dra_core::quantity;
use hami_structured_allocation::allocator::{self, DeviceClass};

/// One claim of the pod.
#[derive(Debug, Clone, Copy)]
pub struct PodClaim<'a> {
    /// The claim's name (for messages).
    pub name: &'a str,
    /// Its UID (the allocator's share-id seed).
    pub uid: &'a str,
    /// What it asks for.
    pub spec: &'a DeviceClaim,
    /// The node of its existing allocation, when it is allocated already.
    pub allocated_on: Option<&'a str>,
}

/// One node as placement sees it.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// The node's name.
    pub name: &'a str,
    /// The ResourceSlices with `spec.nodeName` = this node.
    pub slices: &'a [ResourceSlice],
    /// What allocated claims hold of this node's devices.
    pub allocated: &'a [DeviceRequestAllocationResult],
    /// [`utilization`] of the above (callers cache it: it changes only with them).
    pub utilization: f64,
}

/// The order nodes are tried in (ties broken by node name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeOrder {
    /// By name.
    #[default]
    ByName,
    /// Most allocated first (binpack).
    MostAllocated,
    /// Least allocated first (spread).
    LeastAllocated,
}

/// Where the pod goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The node.
    pub node: String,
    /// Per claim, in the pod's order: the new allocation's results, or `None` when the claim
    /// was allocated already.
    pub results: Vec<Option<Vec<DeviceRequestAllocationResult>>>,
}

/// Why no node fits: per node, the first claim that did not fit and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    /// Nodes considered.
    pub nodes: usize,
    /// Node → reason.
    pub reasons: BTreeMap<String, String>,
}

impl std::fmt::Display for Unschedulable {
    /// kube-scheduler's shape: `0/3 nodes are available: 2 <reason>, 1 <reason>.`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in self.reasons.values() {
            *counts.entry(r.as_str()).or_default() += 1;
        }
        write!(f, "0/{} nodes are available", self.nodes)?;
        if counts.is_empty() {
            return f.write_str(".");
        }
        let mut parts: Vec<(usize, &str)> = counts.into_iter().map(|(r, n)| (n, r)).collect();
        parts.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let text: Vec<String> = parts.iter().map(|(n, r)| format!("{n} {r}")).collect();
        write!(f, ": {}.", text.join(", "))
    }
}

/// Share of the node's capacity held by allocations, in [0, 1]: per device and capacity
/// name consumed / value (an exclusive device held counts full), averaged.
pub fn utilization(slices: &[ResourceSlice], allocated: &[DeviceRequestAllocationResult]) -> f64 {
    let Ok(used) = allocator::usage(allocated) else {
        return 0.0;
    };
    let (mut sum, mut n) = (0.0, 0usize);
    for s in slices {
        for d in &s.spec.devices {
            let key = (
                s.spec.driver.clone(),
                s.spec.pool.name.clone(),
                d.name.clone(),
            );
            let u = used.get(&key);
            if !d.allow_multiple_allocations || d.capacity.is_empty() {
                sum += if u.is_some_and(|u| u.allocations > 0) {
                    1.0
                } else {
                    0.0
                };
                n += 1;
                continue;
            }
            for (k, c) in &d.capacity {
                let Ok(total) = quantity::parse(&c.value) else {
                    continue;
                };
                if total == 0 {
                    continue;
                }
                let taken = u.and_then(|u| u.consumed.get(k)).copied().unwrap_or(0);
                sum += (taken as f64 / total as f64).min(1.0);
                n += 1;
            }
        }
    }
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Allocates every claim of the pod on one node, or says why it cannot.
fn on_node(
    claims: &[PodClaim],
    classes: &[DeviceClass],
    node: &NodeView,
) -> Result<Vec<Option<Vec<DeviceRequestAllocationResult>>>, String> {
    let mut held: Vec<DeviceRequestAllocationResult> = node.allocated.to_vec();
    let mut out = Vec::with_capacity(claims.len());
    for c in claims {
        if let Some(on) = c.allocated_on {
            if on != node.name {
                return Err(format!(
                    "claim {:?} is allocated on another node ({on})",
                    c.name
                ));
            }
            out.push(None);
            continue;
        }
        match allocator::allocate(c.spec, classes, node.slices, &held, c.uid) {
            Ok(results) => {
                held.extend(results.iter().cloned());
                out.push(Some(results));
            }
            Err(e) => return Err(format!("cannot allocate claim {:?}: {e}", c.name)),
        }
    }
    Ok(out)
}

/// Places the pod (see the module doc). An error of the model itself (an unsupported
/// feature, a missing class) is a reason like any other: the pod stays pending with it.
pub fn place(
    claims: &[PodClaim],
    classes: &[DeviceClass],
    nodes: &[NodeView],
    order: NodeOrder,
) -> Result<Placement, Unschedulable> {
    let mut ordered: Vec<(f64, &NodeView)> = nodes
        .iter()
        .map(|n| {
            let score = match order {
                NodeOrder::ByName => 0.0,
                NodeOrder::MostAllocated => -n.utilization,
                NodeOrder::LeastAllocated => n.utilization,
            };
            (score, n)
        })
        .collect();
    ordered.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.name.cmp(b.1.name)));
    let mut reasons = BTreeMap::new();
    for (_, node) in ordered {
        match on_node(claims, classes, node) {
            Ok(results) => {
                return Ok(Placement {
                    node: node.name.to_owned(),
                    results,
                });
            }
            Err(r) => {
                reasons.insert(node.name.to_owned(), r);
            }
        }
    }
    Err(Unschedulable {
        nodes: nodes.len(),
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_dra_core::api::{ResourcePool, ResourceSliceSpec};
    use serde_json::json;

    const CLASS: &str = "amdgpu-slice";

    fn classes() -> Vec<DeviceClass> {
        vec![DeviceClass {
            name: CLASS.into(),
            selectors: vec![format!("device.driver == \"{}\"", hami_dra_core::DRIVER)],
        }]
    }

    /// A node's slice with `gpus` shared devices of 64Gi / 104 CUs / 10 shares (an MI210).
    fn slice(node: &str, gpus: usize) -> ResourceSlice {
        let devices: Vec<serde_json::Value> = (0..gpus)
            .map(|i| {
                json!({
                    "name": format!("gpu-{i}"),
                    "allowMultipleAllocations": true,
                    "capacity": {
                        "memory": {"value": "64Gi", "requestPolicy": {"default": "64Gi",
                            "validRange": {"min": "1Mi", "max": "64Gi", "step": "1Mi"}}},
                        "computeUnits": {"value": "104", "requestPolicy": {"default": "104",
                            "validRange": {"min": "1", "max": "104", "step": "1"}}},
                        "shares": {"value": "10", "requestPolicy": {"default": "1",
                            "validRange": {"min": "1", "max": "10", "step": "1"}}},
                    }
                })
            })
            .collect();
        ResourceSlice {
            api_version: "resource.k8s.io/v1".into(),
            kind: "ResourceSlice".into(),
            metadata: Default::default(),
            spec: ResourceSliceSpec {
                driver: hami_dra_core::DRIVER.into(),
                pool: ResourcePool {
                    name: node.into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                node_name: Some(node.into()),
                all_nodes: None,
                devices: serde_json::from_value(json!(devices)).unwrap(),
            },
        }
    }

    fn claim(mem: &str, cus: u32) -> DeviceClaim {
        serde_json::from_value(json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": CLASS, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": mem, "computeUnits": cus.to_string()}}}}]}))
        .unwrap()
    }

    struct Cluster {
        names: Vec<String>,
        slices: Vec<Vec<ResourceSlice>>,
        held: Vec<Vec<DeviceRequestAllocationResult>>,
    }

    impl Cluster {
        fn new(nodes: usize, gpus: usize) -> Self {
            let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
            Self {
                slices: names.iter().map(|n| vec![slice(n, gpus)]).collect(),
                held: vec![Vec::new(); nodes],
                names,
            }
        }
        fn views(&self) -> Vec<NodeView<'_>> {
            (0..self.names.len())
                .map(|i| NodeView {
                    name: &self.names[i],
                    slices: &self.slices[i],
                    allocated: &self.held[i],
                    utilization: utilization(&self.slices[i], &self.held[i]),
                })
                .collect()
        }
        /// Places one single-claim pod and records its allocation.
        fn place(
            &mut self,
            spec: &DeviceClaim,
            uid: &str,
            order: NodeOrder,
        ) -> Result<String, Unschedulable> {
            let claims = [PodClaim {
                name: uid,
                uid,
                spec,
                allocated_on: None,
            }];
            let p = place(&claims, &classes(), &self.views(), order)?;
            let i = self.names.iter().position(|n| *n == p.node).unwrap();
            self.held[i].extend(p.results[0].clone().unwrap());
            Ok(p.node)
        }
    }

    #[test]
    fn binpack_fills_one_node_before_the_next_and_spread_alternates() {
        let spec = claim("16Gi", 26);
        let mut c = Cluster::new(3, 1);
        // node-0 first (all empty: by name), then it stays the most allocated until full
        for i in 0..4 {
            assert_eq!(
                c.place(&spec, &format!("p{i}"), NodeOrder::MostAllocated)
                    .unwrap(),
                "node-0"
            );
        }
        assert_eq!(
            c.place(&spec, "p4", NodeOrder::MostAllocated).unwrap(),
            "node-1"
        );
        let mut s = Cluster::new(3, 1);
        let got: Vec<String> = (0..3)
            .map(|i| {
                s.place(&spec, &format!("s{i}"), NodeOrder::LeastAllocated)
                    .unwrap()
            })
            .collect();
        assert_eq!(got, ["node-0", "node-1", "node-2"]);
    }

    #[test]
    fn a_pods_claims_share_the_node_and_count_each_other() {
        let c = Cluster::new(2, 1);
        let a = claim("40Gi", 60);
        let b = claim("40Gi", 60);
        // together they do not fit one GPU: each alone does
        let claims = [
            PodClaim {
                name: "a",
                uid: "ua",
                spec: &a,
                allocated_on: None,
            },
            PodClaim {
                name: "b",
                uid: "ub",
                spec: &b,
                allocated_on: None,
            },
        ];
        let e = place(&claims, &classes(), &c.views(), NodeOrder::ByName).unwrap_err();
        assert_eq!(e.reasons.len(), 2);
        assert!(e.reasons["node-0"].contains("claim \"b\""), "{e}");
        assert!(
            e.to_string()
                .starts_with("0/2 nodes are available: 2 cannot allocate claim \"b\""),
            "{e}"
        );
    }

    #[test]
    fn an_allocated_claim_pins_the_node() {
        let c = Cluster::new(3, 1);
        let a = claim("1Gi", 2);
        let b = claim("1Gi", 2);
        let claims = [
            PodClaim {
                name: "a",
                uid: "ua",
                spec: &a,
                allocated_on: Some("node-2"),
            },
            PodClaim {
                name: "b",
                uid: "ub",
                spec: &b,
                allocated_on: None,
            },
        ];
        let p = place(&claims, &classes(), &c.views(), NodeOrder::MostAllocated).unwrap();
        assert_eq!(p.node, "node-2");
        assert!(p.results[0].is_none());
        assert_eq!(p.results[1].as_ref().unwrap()[0].pool, "node-2");
    }

    #[test]
    fn held_capacity_is_respected_and_reasons_name_the_claim() {
        let mut c = Cluster::new(1, 1);
        c.place(&claim("60Gi", 10), "big", NodeOrder::ByName)
            .unwrap();
        let e = c
            .place(&claim("8Gi", 10), "late", NodeOrder::ByName)
            .unwrap_err();
        assert_eq!(e.nodes, 1);
        assert!(e.reasons["node-0"].contains("\"late\""), "{e}");
        // what still fits does
        c.place(&claim("4Gi", 10), "small", NodeOrder::ByName)
            .unwrap();
        // unknown class: a reason, not a panic
        let bad: DeviceClaim = serde_json::from_value(json!({"requests": [{"name": "g",
            "exactly": {"deviceClassName": "nope"}}]}))
        .unwrap();
        let e = c.place(&bad, "bad", NodeOrder::ByName).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn a_first_available_claim_takes_the_shape_the_node_has() {
        // The webhook's per-shape sub-requests: no 32Gi device exists, the 64Gi one does;
        // results are named `gpu/<sub>` and count as held capacity like any other.
        let shape = |mem: &str| {
            format!(
                "device.capacity[\"{d}\"].memory.compareTo(quantity(\"{mem}\")) == 0 && device.capacity[\"{d}\"].computeUnits.compareTo(quantity(\"104\")) == 0",
                d = hami_dra_core::DRIVER
            )
        };
        let spec: DeviceClaim = serde_json::from_value(json!({"requests": [{"name": "gpu",
            "firstAvailable": [
                {"name": "s0", "deviceClassName": CLASS, "count": 1,
                 "selectors": [{"cel": {"expression": shape("32Gi")}}],
                 "capacity": {"requests": {"memory": "16Gi", "computeUnits": "52"}}},
                {"name": "s1", "deviceClassName": CLASS, "count": 1,
                 "selectors": [{"cel": {"expression": shape("64Gi")}}],
                 "capacity": {"requests": {"memory": "32Gi", "computeUnits": "52"}}}]}]}))
        .unwrap();
        let mut c = Cluster::new(2, 1);
        assert_eq!(c.place(&spec, "a", NodeOrder::ByName).unwrap(), "node-0");
        assert_eq!(c.held[0][0].request, "gpu/s1");
        assert_eq!(c.held[0][0].consumed_capacity["memory"], "32Gi");
        assert_eq!(c.place(&spec, "b", NodeOrder::ByName).unwrap(), "node-0");
        // node-0's 64Gi are held by the two: the third goes to node-1.
        assert_eq!(c.place(&spec, "c", NodeOrder::ByName).unwrap(), "node-1");
    }

    #[test]
    fn utilization_counts_capacity_share() {
        let mut c = Cluster::new(1, 2);
        assert_eq!(c.views()[0].utilization, 0.0);
        // 32Gi of 128Gi, 52 of 208 CUs, 1 of 20 shares
        c.place(&claim("32Gi", 52), "x", NodeOrder::ByName).unwrap();
        let u = c.views()[0].utilization;
        let want = (0.5 + 0.5 + 0.1) / 6.0;
        assert!((u - want).abs() < 1e-9, "{u} vs {want}");
    }

    #[test]
    fn no_nodes_reads_as_kube_scheduler_says_it() {
        let spec = claim("1Gi", 1);
        let claims = [PodClaim {
            name: "a",
            uid: "u",
            spec: &spec,
            allocated_on: None,
        }];
        let e = place(&claims, &classes(), &[], NodeOrder::ByName).unwrap_err();
        assert_eq!(e.to_string(), "0/0 nodes are available.");
    }
}
