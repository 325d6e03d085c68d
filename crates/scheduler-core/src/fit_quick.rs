//! A yes/no "does the pod fit this node?" for callers that ask it many times per request
//! with only the usage changing (the preempt verb's victim search asks it a dozen times
//! per node, over up to 1,000 nodes per call): no placement, no refusal text, no
//! allocation.
//!
//! It is [`super::fit_node`]'s answer by construction, not a second rule: each GPU is
//! judged by the same `Judge::check`, and the shortcut is taken only where the answer cannot
//! depend on which GPUs `fit_node` would pick. That holds when at most one container asks
//! for GPUs (nothing is fitted after its picks, and one vendor's picks never touch another
//! vendor's GPUs) and binding plays no part (no NUMA or XGMI binding, or exactly one GPU
//! asked: any one eligible GPU is a NUMA group and an XGMI set of its own). Then `fit_node`
//! succeeds exactly when every requested vendor is offered, the node has at least as many
//! of its GPUs as asked, and at least that many pass `Judge::check`. Any other pod is judged by
//! `fit_node` itself. Test: `agrees_with_fit_node` (property).

use hami_protocol::names::Vendor;
use hami_protocol::requests::DeviceRequest;
use hami_protocol::selection::GpuPolicyKind;

use super::{FitRequest, Judge, fit_node};
use crate::snapshot::NodeSnapshot;

/// A pod prepared for many yes/no fits against nodes whose usage changes.
#[derive(Debug, Clone)]
pub struct QuickFit<'a> {
    req: FitRequest<'a>,
    /// The one GPU container's request per vendor where the shortcut holds; `None`: every
    /// answer is `fit_node`'s.
    shortcut: Option<Vec<(Vendor, &'a DeviceRequest)>>,
}

impl<'a> QuickFit<'a> {
    /// Prepares `req` (once per request, not per node).
    pub fn new(req: &FitRequest<'a>) -> Self {
        let mut asking = req.containers.iter().filter(|c| !c.is_empty());
        let shortcut = match (asking.next(), asking.next()) {
            (None, _) => Some(Vec::new()),
            (Some(container), None) => {
                let asks: Vec<(Vendor, &'a DeviceRequest)> = Vendor::ALL
                    .into_iter()
                    .filter_map(|v| container.get(v).map(|r| (v, r)))
                    .collect();
                let binds = |v: Vendor| {
                    let s = req.selectors.get(v);
                    s.numa_bind || s.link_bind || req.gpu_policy.numa
                };
                // Binding with 0 GPUs asked still needs a group (NUMA binding refuses a node
                // with no eligible GPU): left to fit_node, like any count above 1.
                let shortcut = asks.iter().all(|(v, r)| r.count == 1 || !binds(*v));
                shortcut.then_some(asks)
            }
            _ => None,
        };
        Self {
            req: req.clone(),
            shortcut,
        }
    }

    /// Whether the answer can only turn from no to yes as usage drops, for certain: where
    /// the shortcut holds (each GPU's `Judge::check` only gets easier). Elsewhere one
    /// container's picks steer the next one's, and no such promise is made.
    pub fn monotone(&self) -> bool {
        self.shortcut.is_some()
    }

    /// Whether the pod fits `node`: exactly `fit_node(node, req).is_ok()`.
    pub fn fits(&self, node: &NodeSnapshot) -> bool {
        let Some(asks) = &self.shortcut else {
            return fit_node(node, &self.req).is_ok();
        };
        let mutex = self.req.gpu_policy.kind == GpuPolicyKind::Mutex;
        asks.iter().all(|&(vendor, request)| {
            let mut judge = Judge::new(request, self.req.selectors.get(vendor), mutex);
            let want = request.count as usize;
            let (mut candidates, mut eligible) = (0usize, 0usize);
            for (i, gpu) in node.devices.gpus.iter().enumerate() {
                if gpu.vendor != vendor {
                    continue;
                }
                candidates += 1;
                let held = node.held_whole.get(i).copied().unwrap_or(false);
                if judge.check(gpu, &node.usage[i], held).is_ok() {
                    eligible += 1;
                }
                // Enough found: the rest cannot change the answer (eligible ≤ candidates).
                if eligible >= want {
                    return true;
                }
            }
            // Not offered (no GPU of the vendor), too few GPUs, or too few eligible.
            candidates > 0 && want <= candidates && eligible >= want
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode};
    use hami_protocol::requests::{ContainerKind, ContainerRequest, MemoryRequest};
    use hami_protocol::selection::{DeviceSelector, GpuPolicy, NodePolicy};
    use proptest::prelude::*;

    use super::*;
    use crate::fit::Selectors;
    use crate::snapshot::{Gpu, GpuUsage, NodeDevices};

    type GpuSpec = (bool, u32, u64, u32, i32, bool, u8, u8);

    fn arb_gpu() -> impl Strategy<Value = GpuSpec> {
        (
            any::<bool>(),
            1u32..4,
            prop_oneof![Just(0u64), 1_000u64..20_000],
            prop_oneof![Just(0u32), 1u32..200],
            -1i32..2,
            proptest::bool::weighted(0.85),
            0u8..3,
            0u8..16,
        )
    }

    type UsageSpec = (u32, u64, u64, bool);

    fn arb_usage() -> impl Strategy<Value = UsageSpec> {
        (
            0u32..4,
            0u64..20_000,
            0u64..200,
            proptest::bool::weighted(0.1),
        )
    }

    fn arb_request() -> impl Strategy<Value = Option<DeviceRequest>> {
        proptest::option::weighted(
            0.6,
            (
                prop_oneof![Just(1u32), 0u32..4],
                prop_oneof![
                    Just(MemoryRequest::Whole),
                    (1u64..12_000).prop_map(MemoryRequest::Mib),
                    (1u32..=100).prop_map(MemoryRequest::Percent)
                ],
                0u32..=100,
            )
                .prop_map(|(count, memory, cores_percent)| DeviceRequest {
                    count,
                    memory,
                    cores_percent,
                    priority: None,
                    added_limits: Vec::new(),
                }),
        )
    }

    fn arb_container() -> impl Strategy<Value = ContainerRequest> {
        (
            prop_oneof![
                3 => Just(ContainerKind::App),
                1 => Just(ContainerKind::Init),
                1 => Just(ContainerKind::Sidecar)
            ],
            arb_request(),
            arb_request(),
        )
            .prop_map(|(kind, amd, nvidia)| ContainerRequest {
                name: "c".into(),
                kind,
                amd,
                nvidia,
            })
    }

    fn arb_selector() -> impl Strategy<Value = DeviceSelector> {
        (0u8..4, 0u8..4, any::<bool>(), any::<bool>()).prop_map(|(types, uuids, numa, link)| {
            DeviceSelector {
                use_types: if types == 1 {
                    vec!["h100".into()]
                } else {
                    vec![]
                },
                nouse_types: if types == 2 {
                    vec!["mi300".into()]
                } else {
                    vec![]
                },
                use_uuids: if uuids == 1 {
                    vec!["G0".into(), "G2".into()]
                } else {
                    vec![]
                },
                nouse_uuids: if uuids == 2 {
                    vec!["G1".into()]
                } else {
                    vec![]
                },
                numa_bind: numa,
                link_bind: link,
            }
        })
    }

    fn node(gpus: &[GpuSpec], usage: &[UsageSpec]) -> NodeSnapshot {
        let types = ["AMD Instinct MI300X", "NVIDIA-A100", "NVIDIA-H100"];
        let gpus: Vec<Gpu> = gpus
            .iter()
            .enumerate()
            .map(
                |(i, &(is_amd, count, devmem, devcore, numa, health, ty, peers))| Gpu {
                    vendor: if is_amd { Vendor::Amd } else { Vendor::Nvidia },
                    info: DeviceInfo {
                        id: format!("G{i}"),
                        index: i as u32,
                        count,
                        devmem,
                        devcore,
                        device_type: types[usize::from(ty)].into(),
                        numa,
                        mode: DeviceMode::HamiCore,
                        health,
                        device_vendor: String::new(),
                        custom_info: CustomInfo {
                            pci_bdf: Some(format!("bdf{i}")),
                            cu_per_wgp: Some(1 + u32::from(peers % 2)),
                            xgmi_peers: (0..4)
                                .filter(|b| peers & (1 << b) != 0)
                                .map(|b| format!("bdf{b}"))
                                .collect(),
                            ..Default::default()
                        },
                    },
                },
            )
            .collect();
        let mut s = NodeSnapshot::idle(Arc::new(NodeDevices {
            name: "n".into(),
            gpus,
            ..Default::default()
        }));
        for (i, &(used, mem_mib, cores, held)) in usage.iter().take(s.usage.len()).enumerate() {
            s.usage[i] = GpuUsage {
                used,
                mem_mib,
                cores,
            };
            s.held_whole[i] = held;
        }
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The shortcut never answers differently from Filter's own fit, whatever the
        /// GPUs, their usage, the containers, selectors and policy.
        #[test]
        fn agrees_with_fit_node(
            gpus in proptest::collection::vec(arb_gpu(), 0..5),
            usage in proptest::collection::vec(arb_usage(), 5),
            containers in proptest::collection::vec(arb_container(), 1..4),
            amd in arb_selector(),
            nvidia in arb_selector(),
            kind in prop_oneof![Just(GpuPolicyKind::Binpack), Just(GpuPolicyKind::Spread), Just(GpuPolicyKind::Mutex)],
            numa in any::<bool>(),
        ) {
            let snapshot = node(&gpus, &usage);
            let selectors = Selectors { amd, nvidia };
            let req = FitRequest {
                containers: &containers,
                selectors: &selectors,
                gpu_policy: GpuPolicy { kind, numa },
                node_policy: NodePolicy::Binpack,
            };
            let quick = QuickFit::new(&req);
            prop_assert_eq!(quick.fits(&snapshot), fit_node(&snapshot, &req).is_ok());
        }
    }
}
