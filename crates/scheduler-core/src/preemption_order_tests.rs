//! The search on the per-GPU orders a node's list keeps ([`super::order::GpuOrder`]) decides
//! as the reference search, which reads every pod's flat charges, on nodes the other
//! property tests do not draw: pods holding several slices (on several GPUs, twice on one
//! GPU, on a GPU the node no longer lists), AMD and NVIDIA GPUs side by side, slices of
//! a priority equal to the preemptor's, and lists kept through inserts, updates and
//! removals in any order.

use std::sync::Arc;

use hami_protocol::node_register::DeviceInfo;
use hami_protocol::requests::{ContainerKind, DeviceRequest, MemoryRequest};
use hami_protocol::selection::GpuPolicyKind;
use proptest::prelude::*;

use super::*;
use crate::snapshot::{Gpu, NodeDevices};

fn gpu(i: usize, amd: bool) -> Gpu {
    Gpu {
        vendor: if amd { Vendor::Amd } else { Vendor::Nvidia },
        info: DeviceInfo {
            id: format!("G{i}"),
            count: 6,
            devmem: 8_000,
            devcore: 100,
            device_type: if amd {
                "AMD Instinct MI300X".into()
            } else {
                "NVIDIA-A100".into()
            },
            health: true,
            ..Default::default()
        },
    }
}

/// `(gpu, slots, MiB/500, cores/10)`; a gpu past the node's last is one it does not list.
type ChargeSpec = (usize, u32, u64, u64);

/// `(charges, priority, protected, labelled)`.
type PodSpec = (Vec<ChargeSpec>, i32, bool, bool);

fn arb_pods() -> impl Strategy<Value = Vec<PodSpec>> {
    proptest::collection::vec(
        (
            proptest::collection::vec((0usize..5, 1u32..3, 0u64..8, 0u64..6), 0..4),
            0i32..6,
            proptest::bool::weighted(0.15),
            proptest::bool::weighted(0.3),
        ),
        0..20,
    )
}

fn facts(k: usize, spec: &PodSpec) -> PodFacts {
    let (charges, priority, protected, labelled) = spec;
    PodFacts {
        uid: format!("p{k:02}"),
        namespace: "ns".into(),
        name: format!("p{k:02}"),
        priority: *priority,
        protection: protected.then_some(Protection::NotPreemptible),
        labels: if *labelled {
            [("app".to_string(), "web".to_string())].into()
        } else {
            BTreeMap::new()
        },
        charges: charges
            .iter()
            .map(|&(g, slots, mem, cores)| DeviceCharge {
                uuid: format!("G{g}"),
                slots,
                mem_mib: mem * 500,
                cores: cores * 10,
            })
            .collect(),
    }
}

/// Requests of either vendor or both, one or two containers.
fn arb_preemptor() -> impl Strategy<Value = Preemptor> {
    let request = proptest::option::weighted(
        0.6,
        (0u32..3, 1u64..9, 0u32..11).prop_map(|(count, mem, cores)| DeviceRequest {
            count,
            memory: MemoryRequest::Mib(mem * 500),
            cores_percent: cores * 10,
            priority: None,
            added_limits: Vec::new(),
        }),
    );
    let container = (
        prop_oneof![3 => Just(ContainerKind::App), 1 => Just(ContainerKind::Init)],
        request.clone(),
        request,
    )
        .prop_map(|(kind, amd, nvidia)| ContainerRequest {
            name: "c".into(),
            kind,
            amd,
            nvidia,
        });
    let kind = prop_oneof![
        Just(GpuPolicyKind::Binpack),
        Just(GpuPolicyKind::Spread),
        Just(GpuPolicyKind::Mutex)
    ];
    (proptest::collection::vec(container, 1..3), 0i32..7, kind).prop_map(
        |(containers, priority, kind)| Preemptor {
            priority,
            containers,
            selectors: Selectors::default(),
            gpu_policy: GpuPolicy { kind, numa: false },
            node_policy: NodePolicy::Binpack,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_search_on_kept_orders_decides_as_the_reference(
        amd in proptest::collection::vec(any::<bool>(), 1..5),
        specs in arb_pods(),
        pre in arb_preemptor(),
        proposed in proptest::collection::vec(proptest::bool::weighted(0.2), 20),
        budget in proptest::option::of(0i32..2),
        changes in proptest::collection::vec((0usize..20, 0u8..3), 0..12),
    ) {
        let gpus: Vec<Gpu> = amd.iter().enumerate().map(|(i, a)| gpu(i, *a)).collect();
        let mut node = NodeSnapshot::idle(Arc::new(NodeDevices {
            name: "n".into(),
            gpus,
            ..Default::default()
        }));
        let pods: Vec<PodFacts> = specs.iter().enumerate().map(|(k, s)| facts(k, s)).collect();
        for p in &pods {
            // Charges on GPUs the node does not list are not counted.
            node.charge(&p.charges);
        }
        // Kept as the state keeps it, through changes in any order: some pods removed
        // and back, some first held with other charges and priority, or protected.
        let shared = |p: &PodFacts| {
            Arc::new(PodFacts {
                charges: Vec::new(),
                ..p.clone()
            })
        };
        let mut kept = NodePods::default();
        for (k, what) in &changes {
            let Some(p) = pods.get(*k) else { continue };
            match what {
                0 => {
                    kept.remove(&p.uid);
                }
                1 => {
                    let other = PodFacts {
                        priority: p.priority + 1,
                        protection: None,
                        ..p.clone()
                    };
                    let charges: Vec<DeviceCharge> = p.charges.iter().rev().cloned().collect();
                    kept.upsert(shared(&other), &charges);
                }
                _ => kept.upsert(shared(p), &[]),
            }
        }
        for p in pods.iter().rev() {
            kept.upsert(shared(p), &p.charges);
        }
        let mut uids: Vec<String> = pods
            .iter()
            .zip(&proposed)
            .filter(|(_, p)| **p)
            .map(|(p, _)| p.uid.clone())
            .collect();
        uids.push("ghost".into());
        let pdbs: Vec<PdbFacts> = budget
            .map(|b| PdbFacts {
                namespace: "ns".into(),
                selector: Some(serde_json::from_value(serde_json::json!({"matchLabels": {"app": "web"}})).unwrap()),
                disruptions_allowed: b,
                disrupted: BTreeSet::new(),
            })
            .into_iter()
            .collect();
        let proposals: BTreeMap<String, Vec<String>> = [("n".to_string(), uids)].into();
        let on_facts = |name: &str| {
            (name == "n").then_some(NodeCandidate {
                snapshot: &node,
                pods: &pods,
            })
        };
        let on_kept = |name: &str| {
            (name == "n").then_some(HeldCandidate {
                snapshot: &node,
                pods: &kept,
            })
        };
        let reference = decide_with(&pre, &proposals, on_facts, &pdbs, &Search::Reference);
        prop_assert_eq!(&decide_preemption(&pre, &proposals, on_facts, &pdbs), &reference);
        let kept_decision = decide_preemption_held(&pre, &proposals, on_kept, &pdbs);
        prop_assert_eq!(
            &kept_decision,
            &decide_with(&pre, &proposals, on_kept, &pdbs, &Search::Reference)
        );
        // Kept in UID order, which is the order the pods were drawn in.
        prop_assert_eq!(&kept_decision, &reference);
        // The node registers anew with one more GPU (another `Arc`: mapped afresh, not
        // from the map kept for the first), then a pod takes a slice on it (an id the
        // table lacked: the kept map is forgotten); decided twice (the second from the map
        // kept).
        let mut more = node.devices.gpus.clone();
        more.push(gpu(9, false));
        let mut node = NodeSnapshot::idle(Arc::new(NodeDevices {
            name: "n".into(),
            gpus: more,
            ..Default::default()
        }));
        let late = facts(99, &(vec![(9, 1, 4, 2)], 0, false, false));
        for p in pods.iter().chain([&late]) {
            node.charge(&p.charges);
        }
        let mut again = NodePods::default();
        for p in &pods {
            again.upsert(shared(p), &p.charges);
        }
        for round in 0..4 {
            if round == 2 {
                again.upsert(shared(&late), &late.charges);
            }
            // First the list whose map was kept for the first registration.
            let pods = if round == 0 { &kept } else { &again };
            let on_kept = |name: &str| {
                (name == "n").then_some(HeldCandidate {
                    snapshot: &node,
                    pods,
                })
            };
            prop_assert_eq!(
                decide_preemption_held(&pre, &proposals, on_kept, &pdbs),
                decide_with(&pre, &proposals, on_kept, &pdbs, &Search::Reference)
            );
        }
    }
}

/// What a slice holder costs in its node's list (the state keeps one per holder, 512k at
/// 1,000 nodes × 8 GPUs × 64 slices): its entry, its charge, its slice in its GPU's order.
#[test]
fn a_slice_holder_costs_80_bytes_in_its_node_list() {
    use super::order::Slice;
    use super::pods::{Charge, Held};
    assert_eq!(std::mem::size_of::<Held<Arc<PodFacts>>>(), 24);
    assert_eq!(std::mem::size_of::<Charge>(), 24);
    assert_eq!(std::mem::size_of::<Slice>(), 32);
}
