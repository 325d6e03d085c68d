//! Properties of a plan over random inline fleets and workloads: nothing is overbooked,
//! what the report says was placed is exactly what the cluster state holds, every pod is
//! accounted for, and a plan is deterministic; with priorities, no preemption evicts a pod
//! of the preemptor's priority or above.

use std::collections::BTreeMap;

use hami_planner::engine::{PodOutcome, expand_workloads, run_policy};
use hami_planner::fleet::{build_nodes, model_devices};
use hami_planner::scenario::{GpuModel, GpuSource, NodeGroup, Workload};
use hami_protocol::names::Vendor;
use hami_protocol::selection::{GpuPolicy, GpuPolicyKind, NodePolicy};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;

fn group(i: usize, nodes: u32, gpus: u32, mem: u64, cus: u32, share: u32) -> NodeGroup {
    NodeGroup {
        name: format!("g{i}"),
        count: nodes,
        gpus: GpuSource::Models(vec![GpuModel {
            vendor: Vendor::Amd,
            device_type: "AMD Test".into(),
            count: gpus,
            memory_mib: mem,
            cores: cus,
            share,
            numa: 0,
            xgmi: i.is_multiple_of(2),
        }]),
    }
}

fn workload(
    i: usize,
    count: u32,
    (gpus, mem, pct): (u32, u64, u32),
    init: bool,
    priority: i32,
) -> Workload {
    // Odd workloads ask for XGMI peers (met only on the hive groups).
    let annotations = json!({"amd.com/link-bind": if i % 2 == 1 { "true" } else { "false" }});
    let limits = json!({"amd.com/gpu": gpus, "amd.com/gpumem": mem, "amd.com/gpucores": pct});
    let mut spec = json!({"containers": [{"name": "c", "resources": {"limits": limits}}], "priority": priority});
    if init {
        spec["initContainers"] = json!([{"name": "i", "resources": {"limits": {"amd.com/gpu": 1, "amd.com/gpumem": mem * 2}}}]);
    }
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": format!("w{i}"), "annotations": annotations}, "spec": spec}),
    )
    .unwrap();
    Workload { count, pod }
}

fn priority_of(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn plans_never_overbook(
        groups in prop::collection::vec((1u32..4, 1u32..5, 1000u64..20000, 10u32..120, 1u32..5), 1..3),
        loads in prop::collection::vec((0u32..8, 1u32..4, 100u64..12000, 1u32..101, any::<bool>()), 1..4),
        binpack in any::<bool>(),
        node_spread in any::<bool>(),
        priorities in prop::collection::vec(prop::sample::select(vec![0, 10, 1000]), 4),
    ) {
        let groups: Vec<NodeGroup> = groups.iter().enumerate()
            .map(|(i, g)| group(i, g.0, g.1, g.2, g.3, g.4)).collect();
        let workloads: Vec<Workload> = loads.iter().enumerate()
            .map(|(i, w)| workload(i, w.0, (w.1, w.2, w.3), w.4, priorities[i])).collect();
        let specs: Vec<_> = groups.iter().enumerate().map(|(i, g)| match &g.gpus {
            GpuSource::Models(m) => model_devices(i, m),
            GpuSource::Capture { .. } => unreachable!(),
        }).collect();
        let nodes = build_nodes(&groups, &specs).unwrap();
        let pods = expand_workloads(&workloads);
        let gpu = GpuPolicy {
            kind: if binpack { GpuPolicyKind::Binpack } else { GpuPolicyKind::Spread },
            numa: false,
        };
        let node = if node_spread { NodePolicy::Spread } else { NodePolicy::Binpack };
        let run = run_policy(&nodes, &pods, gpu, node);
        prop_assert_eq!(run.outcomes.len(), pods.len());

        // Sum of the placements per (node, GPU) is exactly the state's usage.
        let mut charged: BTreeMap<(String, String), (u32, u64, u64)> = BTreeMap::new();
        for (planned, o) in pods.iter().zip(&run.outcomes) {
            match o {
                PodOutcome::Placed { node, charges } => {
                    // Multi-GPU link-bind pods only on hive groups (even group index).
                    if planned.workload % 2 == 1 && loads[planned.workload].1 > 1 {
                        let group: usize = node[1..node.find('-').unwrap()].parse().unwrap();
                        prop_assert!(group.is_multiple_of(2), "link-bind pod on {}", node);
                    }
                    for c in charges {
                        let e = charged.entry((node.clone(), c.uuid.clone())).or_default();
                        e.0 += c.slots;
                        e.1 += c.mem_mib;
                        e.2 += c.cores;
                    }
                }
                PodOutcome::Unplaceable { reason } => prop_assert!(!reason.is_empty()),
                PodOutcome::Evicted { by, reason, .. } => {
                    prop_assert!(!reason.is_empty());
                    let by = &by["default/".len()..];
                    let by = &pods.iter().find(|p| p.pod.metadata.name.as_deref() == Some(by)).unwrap().pod;
                    prop_assert!(priority_of(by) > priority_of(&planned.pod), "{:?} evicted by a pod of no higher priority", planned.pod.metadata.name);
                }
                PodOutcome::NoGpu => prop_assert!(false, "every test pod asks for a GPU"),
            }
        }
        for snap in run.state.nodes() {
            for (g, u) in snap.devices.gpus.iter().zip(&snap.usage) {
                prop_assert!(u.used <= g.info.count);
                prop_assert!(u.mem_mib <= g.info.devmem);
                prop_assert!(u.cores <= u64::from(g.info.devcore));
                let want = charged.remove(&(snap.devices.name.clone(), g.info.id.clone())).unwrap_or_default();
                prop_assert_eq!((u.used, u.mem_mib, u.cores), want);
            }
        }
        prop_assert!(charged.is_empty(), "charges on unknown GPUs: {:?}", charged);
        for p in &run.preemptions {
            prop_assert!(!p.victims.is_empty());
            for v in &p.victims {
                prop_assert!(v.priority < p.priority, "{:?}", p);
            }
        }

        // Deterministic.
        let again = run_policy(&nodes, &pods, gpu, node);
        prop_assert_eq!(&again.outcomes, &run.outcomes);
    }
}
