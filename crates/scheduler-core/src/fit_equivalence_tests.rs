//! Filter's fit gives, on any nodes and any pod, exactly the answers of the fit it replaced
//! (`fit_reference.rs`, fit.rs as of 3a640bd): the chosen node and its device lists and
//! score, every refused node with its text, the refusal labels, the nodes no eviction
//! cures, the count of fitting nodes and the top nodes.

use std::sync::Arc;

use hami_protocol::names::Vendor;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode};
use hami_protocol::requests::{ContainerKind, ContainerRequest, DeviceRequest, MemoryRequest};
use hami_protocol::selection::{DeviceSelector, GpuPolicy, GpuPolicyKind, NodePolicy};
use proptest::prelude::*;

use super::{FilterOutcome, FitRequest, Selectors, filter, fit_node, reference};
use crate::snapshot::{Gpu, GpuUsage, NodeDevices, NodeSnapshot};

/// (AMD?, shares, model, MiB, cores, NUMA node, healthy, XGMI peer bits): models 0–3 are
/// fixed GPU models, three of them alike but for their CUs per WGP and type; 4–6 take the
/// random MiB and cores, their type and CUs per WGP from the peer bits.
type GpuSpec = (bool, u32, u8, u64, u32, i32, bool, u8);

/// (MiB, cores, CUs per WGP, type) of the fixed models.
const MODELS: [(u64, u32, Option<u32>, &str); 4] = [
    (16_384, 64, Some(2), "AMD Radeon PRO W7900"),
    (16_384, 64, Some(1), "AMD Instinct MI300X"),
    (16_384, 64, None, "NVIDIA-A100"),
    (40_960, 100, Some(0), "NVIDIA-H100"),
];

fn arb_gpu() -> impl Strategy<Value = GpuSpec> {
    (
        proptest::bool::weighted(0.7),
        1u32..5,
        0u8..7,
        prop_oneof![Just(0u64), 1_000u64..40_000],
        prop_oneof![Just(0u32), Just(100u32), 1u32..200],
        -1i32..2,
        proptest::bool::weighted(0.9),
        0u8..16,
    )
}

/// (shares used, MiB used, cores used, held whole): MiB and cores as a percentage of the
/// GPU's (up to 120 %), or now and then so large that the node score's sums pass 2^53.
type UsageSpec = (u32, Taken, Taken, bool);

#[derive(Debug, Clone, Copy)]
enum Taken {
    Percent(u64),
    Huge,
}

impl Taken {
    fn of(self, total: u64) -> u64 {
        match self {
            Taken::Percent(p) => total * p / 100,
            Taken::Huge => u64::MAX / 5 + 3,
        }
    }
}

fn arb_taken() -> impl Strategy<Value = Taken> {
    prop_oneof![
        6 => Just(Taken::Percent(0)),
        6 => (0u64..=120).prop_map(Taken::Percent),
        1 => Just(Taken::Huge),
    ]
}

fn arb_usage() -> impl Strategy<Value = UsageSpec> {
    (
        prop_oneof![3 => Just(0u32), 2 => 0u32..3, 1 => 0u32..6],
        arb_taken(),
        arb_taken(),
        proptest::bool::weighted(0.05),
    )
}

/// A node: its GPUs with their usage, and how it registered.
#[derive(Debug, Clone)]
struct NodeSpec {
    gpus: Vec<(GpuSpec, UsageSpec)>,
    /// 0: as listed; 1: AMD register annotation invalid; 2: AMD withdrawn (plugin not
    /// serving); 3: DRA mode for AMD.
    registration: u8,
}

fn arb_node() -> impl Strategy<Value = NodeSpec> {
    (
        prop_oneof![
            1 => proptest::collection::vec((arb_gpu(), arb_usage()), 0..3),
            4 => proptest::collection::vec((arb_gpu(), arb_usage()), 2..9),
        ],
        prop_oneof![8 => Just(0u8), 1 => 1u8..4],
    )
        .prop_map(|(gpus, registration)| NodeSpec { gpus, registration })
}

fn build_node(name: String, spec: &NodeSpec) -> NodeSnapshot {
    let mut gpus: Vec<Gpu> = spec
        .gpus
        .iter()
        .enumerate()
        .map(
            |(i, &((is_amd, count, model, devmem, devcore, numa, health, peers), _))| {
                let (devmem, devcore, cu_per_wgp, device_type) =
                    match MODELS.get(usize::from(model)) {
                        Some(fixed) => *fixed,
                        None => (
                            devmem,
                            devcore,
                            [None, Some(1), Some(2), Some(0)][usize::from(peers / 4)],
                            MODELS[usize::from(peers % 4)].3,
                        ),
                    };
                Gpu {
                    vendor: if is_amd { Vendor::Amd } else { Vendor::Nvidia },
                    info: DeviceInfo {
                        id: format!("G{i}"),
                        index: i as u32,
                        count,
                        devmem,
                        devcore,
                        device_type: device_type.into(),
                        numa,
                        mode: DeviceMode::HamiCore,
                        health,
                        device_vendor: String::new(),
                        custom_info: CustomInfo {
                            pci_bdf: (peers != 15).then(|| format!("bdf{i}")),
                            cu_per_wgp,
                            xgmi_peers: (0..4)
                                .filter(|b| peers & (1 << b) != 0)
                                .map(|b| format!("BDF{b}"))
                                .collect(),
                            ..Default::default()
                        },
                    },
                }
            },
        )
        .collect();
    let mut devices = NodeDevices {
        name,
        ..Default::default()
    };
    let mut usage: Vec<UsageSpec> = spec.gpus.iter().map(|g| g.1).collect();
    if spec.registration != 0 {
        // The AMD GPUs are not offered, for the reason the registration gives.
        let keep: Vec<bool> = gpus.iter().map(|g| g.vendor != Vendor::Amd).collect();
        let mut k = keep.iter();
        gpus.retain(|_| *k.next().unwrap_or(&false));
        let mut k = keep.iter();
        usage.retain(|_| *k.next().unwrap_or(&false));
        let (label, why) = match spec.registration {
            1 => (
                super::refusal::REGISTER_INVALID,
                "annotation does not decode",
            ),
            2 => (super::refusal::PLUGIN_NOT_SERVING, "allocatable 0"),
            _ => (super::refusal::NODE_DRA_MODE, "DRA mode"),
        };
        devices.push_register_error(Vendor::Amd, label, why.to_owned());
    }
    devices.gpus = gpus;
    let mut node = NodeSnapshot::idle(Arc::new(devices));
    for (i, &(used, mem, cores, held)) in usage.iter().enumerate() {
        let info = &node.devices.gpus[i].info;
        node.usage[i] = GpuUsage {
            used,
            mem_mib: mem.of(info.devmem),
            cores: cores.of(u64::from(info.devcore)),
        };
        node.held_whole[i] = held;
    }
    node
}

fn arb_request() -> impl Strategy<Value = DeviceRequest> {
    (
        prop_oneof![6 => Just(1u32), 1 => 0u32..5],
        prop_oneof![
            1 => Just(MemoryRequest::Whole),
            4 => (1u64..12_000).prop_map(MemoryRequest::Mib),
            2 => (1u32..=60).prop_map(MemoryRequest::Percent)
        ],
        prop_oneof![3 => 0u32..=50, 1 => Just(0u32), 1 => Just(100u32), 1 => 0u32..=100],
    )
        .prop_map(|(count, memory, cores_percent)| DeviceRequest {
            count,
            memory,
            cores_percent,
            priority: None,
            added_limits: Vec::new(),
        })
}

/// A container's kind and its AMD and NVIDIA requests: mostly one vendor, sometimes
/// both or none.
fn arb_container()
-> impl Strategy<Value = (ContainerKind, Option<DeviceRequest>, Option<DeviceRequest>)> {
    (
        prop_oneof![
            4 => Just(ContainerKind::App),
            1 => Just(ContainerKind::Init),
            1 => Just(ContainerKind::Sidecar)
        ],
        prop_oneof![5 => Just((true, false)), 2 => Just((false, true)), 1 => Just((true, true)), 1 => Just((false, false))],
        arb_request(),
        arb_request(),
    )
        .prop_map(|(kind, (amd, nvidia), a, n)| (kind, amd.then_some(a), nvidia.then_some(n)))
}

fn arb_containers() -> impl Strategy<Value = Vec<ContainerRequest>> {
    // One container half the time (Filter's shortcut), else up to four of any kinds.
    prop_oneof![
        arb_container().prop_map(|c| vec![c]),
        proptest::collection::vec(arb_container(), 1..5),
    ]
    .prop_map(|cs| {
        cs.into_iter()
            .enumerate()
            .map(|(i, (kind, amd, nvidia))| ContainerRequest {
                name: format!("c{i}"),
                kind,
                amd,
                nvidia,
            })
            .collect()
    })
}

fn arb_selector() -> impl Strategy<Value = DeviceSelector> {
    // Mostly no rules (most pods have none).
    (
        prop_oneof![4 => Just(0u8), 1 => 1u8..5],
        prop_oneof![4 => Just(0u8), 1 => 1u8..4],
        proptest::bool::weighted(0.15),
        proptest::bool::weighted(0.15),
    )
        .prop_map(|(types, uuids, numa_bind, link_bind)| DeviceSelector {
            use_types: match types {
                1 => vec!["h100".into()],
                3 => vec!["MI300".into(), "w7900".into()],
                _ => vec![],
            },
            nouse_types: match types {
                2 => vec!["mi300".into()],
                4 => vec!["A100".into(), "radeon".into()],
                _ => vec![],
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
            numa_bind,
            link_bind,
        })
}

fn arb_policy() -> impl Strategy<Value = (GpuPolicy, NodePolicy)> {
    (
        prop_oneof![
            Just(GpuPolicyKind::Binpack),
            Just(GpuPolicyKind::Spread),
            Just(GpuPolicyKind::Mutex)
        ],
        proptest::bool::weighted(0.2),
        prop_oneof![Just(NodePolicy::Binpack), Just(NodePolicy::Spread)],
    )
        .prop_map(|(kind, numa, node)| (GpuPolicy { kind, numa }, node))
}

/// Every field of two outcomes, the score bit for bit.
fn assert_same(new: &FilterOutcome, old: &FilterOutcome) -> Result<(), TestCaseError> {
    prop_assert_eq!(&new.chosen, &old.chosen);
    if let (Some((_, a)), Some((_, b))) = (&new.chosen, &old.chosen) {
        prop_assert_eq!(a.score.to_bits(), b.score.to_bits());
    }
    prop_assert_eq!(&new.failed, &old.failed);
    prop_assert_eq!(&new.unresolvable, &old.unresolvable);
    prop_assert_eq!(&new.refusals, &old.refusals);
    prop_assert_eq!(new.fitting, old.fitting);
    let bits = |top: &[(String, f64)]| -> Vec<(String, u64)> {
        top.iter().map(|(n, s)| (n.clone(), s.to_bits())).collect()
    };
    prop_assert_eq!(bits(&new.top), bits(&old.top));
    Ok(())
}

fn check_equal(
    nodes: &[NodeSnapshot],
    containers: &[ContainerRequest],
    selectors: &Selectors,
    (gpu_policy, node_policy): (GpuPolicy, NodePolicy),
) -> Result<(), TestCaseError> {
    let req = FitRequest {
        containers,
        selectors,
        gpu_policy,
        node_policy,
    };
    assert_same(&filter(nodes, &req), &reference::filter(nodes, &req))?;
    for node in nodes {
        prop_assert_eq!(fit_node(node, &req), reference::fit_node(node, &req));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// A few nodes (one thread), any GPUs, usage, registrations, containers, selectors
    /// and policies: the same answers as the fit before stop 38.
    #[test]
    fn filter_and_fit_node_agree_with_the_reference_fit(
        specs in proptest::collection::vec(arb_node(), 0..9),
        containers in arb_containers(),
        amd in arb_selector(),
        nvidia in arb_selector(),
        policy in arb_policy(),
        // Names out of order, some repeated (ties broken by name).
        names in proptest::collection::vec(0u8..4, 9),
    ) {
        let nodes: Vec<NodeSnapshot> = specs
            .iter()
            .zip(&names)
            .enumerate()
            .map(|(i, (spec, n))| build_node(format!("n{n}-{}", i % 3), spec))
            .collect();
        check_equal(&nodes, &containers, &Selectors { amd, nvidia }, policy)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Enough nodes for Filter to split the work across threads: still the same answers.
    #[test]
    fn filter_on_many_nodes_agrees_with_the_reference_fit(
        specs in proptest::collection::vec(arb_node(), 16),
        containers in arb_containers(),
        amd in arb_selector(),
        nvidia in arb_selector(),
        policy in arb_policy(),
    ) {
        let nodes: Vec<NodeSnapshot> = (0..300)
            .map(|i| build_node(format!("node-{:03}", (i * 7919) % 300), &specs[i % specs.len()]))
            .collect();
        check_equal(&nodes, &containers, &Selectors { amd, nvidia }, policy)?;
    }
}
