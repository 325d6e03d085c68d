use std::sync::Arc;

use hami_protocol::node_register::DeviceInfo;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::snapshot::{Gpu, NodeDevices};

fn gpu(id: &str, count: u32, devmem: u64) -> Gpu {
    Gpu {
        vendor: Vendor::Nvidia,
        info: DeviceInfo {
            id: id.into(),
            count,
            devmem,
            devcore: 100,
            device_type: "NVIDIA-A100".into(),
            health: true,
            ..Default::default()
        },
    }
}

fn slice(uid: &str, priority: i32, on: &[(&str, u64, u64)]) -> PodFacts {
    PodFacts {
        uid: uid.into(),
        namespace: "ns".into(),
        name: uid.into(),
        priority,
        protection: None,
        labels: BTreeMap::new(),
        charges: on
            .iter()
            .map(|(id, mem, cores)| DeviceCharge {
                uuid: (*id).into(),
                slots: 1,
                mem_mib: *mem,
                cores: *cores,
            })
            .collect(),
    }
}

fn snapshot(gpus: Vec<Gpu>, pods: &[PodFacts]) -> NodeSnapshot {
    let mut s = NodeSnapshot::idle(Arc::new(NodeDevices {
        name: "n".into(),
        gpus,
        ..Default::default()
    }));
    for p in pods {
        assert!(s.charge(&p.charges).is_empty());
    }
    s
}

fn preemptor(priority: i32, limits: serde_json::Value) -> Preemptor {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": "ns", "uid": "big"},
        "spec": {"priority": priority, "containers": [{"name": "c", "resources": {"limits": limits}}]}
    }))
    .unwrap();
    Preemptor::from_pod(
        &pod,
        &RequestDefaults::default(),
        GpuPolicy::default(),
        NodePolicy::Binpack,
    )
    .unwrap()
}

fn half() -> Preemptor {
    preemptor(
        1000,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "50"}),
    )
}

fn decide(
    pre: &Preemptor,
    node: &NodeSnapshot,
    pods: &[PodFacts],
    proposed: &[&str],
    pdbs: &[PdbFacts],
) -> PreemptionDecision {
    let proposals: BTreeMap<String, Vec<String>> = [(
        "n".to_string(),
        proposed.iter().map(|s| s.to_string()).collect(),
    )]
    .into();
    decide_preemption(
        pre,
        &proposals,
        |name| {
            (name == "n").then_some(NodeCandidate {
                snapshot: node,
                pods,
            })
        },
        pdbs,
    )
}

fn victims(d: &PreemptionDecision) -> Vec<String> {
    d.result.node_name_to_meta_victims["n"]
        .pods
        .iter()
        .flatten()
        .map(|p| p.uid.clone())
        .collect()
}

#[test]
fn reads_go_pascal_case_and_writes_it_back() {
    let body = br#"{"Pod": {"metadata": {"name": "big", "uid": "u"}},
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "a"}, {"uid": "b"}], "NumPDBViolations": 1},
                                  "n2": {"Pods": null, "NumPDBViolations": 0}, "n3": null}}"#;
    let args = decode_args(body).unwrap();
    assert_eq!(args.pod.clone().unwrap().metadata.uid.as_deref(), Some("u"));
    let p = proposals(&args);
    assert_eq!(p["n1"], ["a", "b"]);
    assert!(p["n2"].is_empty() && p["n3"].is_empty());
    // Full victims (an extender that is not nodeCacheCapable), camelCase keys too.
    let body = br#"{"pod": {"metadata": {"name": "big"}},
        "nodeNameToVictims": {"n1": {"pods": [{"metadata": {"name": "v", "uid": "v-uid"}}], "numPDBViolations": 0}}}"#;
    assert_eq!(proposals(&decode_args(body).unwrap())["n1"], ["v-uid"]);
    let result = ExtenderPreemptionResult {
        node_name_to_meta_victims: [(
            "n1".to_string(),
            MetaVictims {
                pods: Some(vec![MetaPod { uid: "a".into() }]),
                num_pdb_violations: 2,
            },
        )]
        .into(),
    };
    assert_eq!(
        serde_json::to_string(&result).unwrap(),
        r#"{"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"a"}],"NumPDBViolations":2}}}"#
    );
}

#[test]
fn a_body_over_one_mib_is_413_and_a_bad_one_400() {
    let mut big = br#"{"Pod": {"metadata": {"name": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', PREEMPT_BODY_LIMIT));
    big.extend(br#""}}}"#);
    let err = decode_args(&big).unwrap_err();
    assert_eq!(err.http_status(), 413);
    assert!(err.to_string().contains("1048576"), "{err}");
    for bad in [
        &b"nope"[..],
        b"[]",
        br#"{"NodeNameToMetaVictims": {"n": {"Pods": 3}}}"#,
    ] {
        assert_eq!(decode_args(bad).unwrap_err().http_status(), 400);
    }
}

#[test]
fn a_high_priority_pod_evicts_the_fewest_low_priority_slices_on_one_card() {
    // Card A: four quarter slices; card B: two half slices. Fewest: one half on B.
    let mut pods: Vec<PodFacts> = (0..4)
        .map(|i| slice(&format!("a{i}"), 0, &[("A", 1000, 25)]))
        .collect();
    pods.push(slice("b0", 0, &[("B", 1000, 50)]));
    pods.push(slice("b1", 0, &[("B", 2000, 50)]));
    let node = snapshot(vec![gpu("A", 8, 40_000), gpu("B", 8, 40_000)], &pods);
    let d = decide(&half(), &node, &pods, &[], &[]);
    // Among equals on B, the larger slice goes first.
    assert_eq!(victims(&d), ["b1"]);
    assert_eq!(d.victim_count(), 1);
    // Lower priority beats fewer: with B's slices at priority 5, A's quarter slices go.
    for p in pods.iter_mut().filter(|p| p.uid.starts_with('b')) {
        p.priority = 5;
    }
    let d = decide(&half(), &node, &pods, &[], &[]);
    assert_eq!(victims(&d), ["a0", "a1"]);
}

#[test]
fn a_two_gpu_pod_makes_room_on_the_two_cheapest_cards() {
    let pods = vec![
        slice("pa", 0, &[("A", 1000, 100)]),
        slice("pb", 1, &[("B", 1000, 100)]),
        slice("pc", 3, &[("C", 1000, 100)]),
    ];
    let node = snapshot(
        vec![
            gpu("A", 8, 40_000),
            gpu("B", 8, 40_000),
            gpu("C", 8, 40_000),
        ],
        &pods,
    );
    let two = preemptor(
        1000,
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "50"}),
    );
    let d = decide(&two, &node, &pods, &[], &[]);
    assert_eq!(victims(&d), ["pa", "pb"]);
    // One pod on two cards frees both: one victim is enough.
    let pods = vec![
        slice("wide", 0, &[("A", 1000, 100), ("B", 1000, 100)]),
        slice("pc", 0, &[("C", 1000, 100)]),
    ];
    let node = snapshot(
        vec![
            gpu("A", 8, 40_000),
            gpu("B", 8, 40_000),
            gpu("C", 8, 40_000),
        ],
        &pods,
    );
    assert_eq!(victims(&decide(&two, &node, &pods, &[], &[])), ["wide"]);
}

#[test]
fn protected_pods_are_never_victims() {
    for why in [
        Protection::Critical,
        Protection::DaemonSet,
        Protection::Static,
        Protection::NotPreemptible,
        Protection::Terminating,
    ] {
        let mut pods = vec![slice("p", 0, &[("A", 1000, 100)])];
        pods[0].protection = Some(why);
        let node = snapshot(vec![gpu("A", 8, 40_000)], &pods);
        let d = decide(&half(), &node, &pods, &[], &[]);
        assert!(d.result.node_name_to_meta_victims.is_empty(), "{why:?}");
        assert!(matches!(d.vetoed["n"], Veto::NoEvictionFits(_)), "{why:?}");
        // Proposed by kube-scheduler: the node is dropped rather than the pod named.
        let d = decide(&half(), &node, &pods, &["p"], &[]);
        assert_eq!(
            d.vetoed["n"],
            Veto::Protected {
                pod: "ns/p".into(),
                why
            }
        );
        let message = d.all_vetoed_message().unwrap();
        assert!(
            message.contains("ns/p") && message.contains(why.as_str()),
            "{message}"
        );
    }
    // Equal priority is not lower.
    let pods = vec![slice("p", 1000, &[("A", 1000, 100)])];
    let node = snapshot(vec![gpu("A", 8, 40_000)], &pods);
    assert!(
        decide(&half(), &node, &pods, &[], &[])
            .vetoed
            .contains_key("n")
    );
}

#[test]
fn protection_is_read_from_the_pod() {
    let pod = |extra: serde_json::Value| -> Pod {
        let mut base = json!({"metadata": {"name": "p", "uid": "p"}, "spec": {"containers": []}});
        json_merge(&mut base, extra);
        serde_json::from_value(base).unwrap()
    };
    assert_eq!(protection(&pod(json!({}))), None);
    let cases = [
        (
            json!({"spec": {"priorityClassName": "system-node-critical"}}),
            Protection::Critical,
        ),
        (
            json!({"spec": {"priority": 2_000_000_000}}),
            Protection::Critical,
        ),
        (
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "x"}]}}),
            Protection::DaemonSet,
        ),
        (
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}}),
            Protection::Static,
        ),
        (
            json!({"metadata": {"labels": {"hami.io/preemptible": "false"}}}),
            Protection::NotPreemptible,
        ),
        (
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            Protection::Terminating,
        ),
    ];
    for (extra, want) in cases {
        assert_eq!(protection(&pod(extra.clone())), Some(want), "{extra}");
    }
    assert_eq!(
        protection(&pod(
            json!({"metadata": {"labels": {"hami.io/preemptible": "true"}}})
        )),
        None
    );
}

fn json_merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                json_merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

#[test]
fn lists_are_filled_never_emptied_and_unknowns_dropped() {
    let pods = vec![
        slice("gpu-a", 0, &[("A", 1000, 100)]),
        slice("gpu-b", 0, &[("B", 1000, 60)]),
        slice("cpu-only", 0, &[]),
    ];
    let node = snapshot(vec![gpu("A", 8, 40_000), gpu("B", 8, 40_000)], &pods);
    // Empty (Kubernetes ≥ 1.38): filled. One victim either way: the smaller slice goes.
    assert_eq!(victims(&decide(&half(), &node, &pods, &[], &[])), ["gpu-b"]);
    // In-tree's CPU victim is kept beside ours; its unknown one is dropped.
    let d = decide(&half(), &node, &pods, &["cpu-only", "ghost", "gpu-a"], &[]);
    assert_eq!(victims(&d), ["cpu-only", "gpu-b"]);
    assert_eq!(d.unknown_pods, [("n".to_string(), "ghost".to_string())]);
    // A pod that fits already: an empty answer would empty the list: dropped.
    let small = preemptor(
        1000,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "10"}),
    );
    let d = decide(&small, &node, &pods, &["gpu-a"], &[]);
    assert_eq!(d.vetoed["n"], Veto::NothingToEvict);
    assert!(d.result.node_name_to_meta_victims.is_empty());
    // Unknown nodes are dropped, the rest answered.
    let proposals: BTreeMap<String, Vec<String>> = [
        ("n".to_string(), vec![]),
        ("nowhere".to_string(), vec!["x".into()]),
    ]
    .into();
    let d = decide_preemption(
        &half(),
        &proposals,
        |name| {
            (name == "n").then_some(NodeCandidate {
                snapshot: &node,
                pods: &pods,
            })
        },
        &[],
    );
    assert_eq!(d.vetoed["nowhere"], Veto::UnknownNode);
    assert_eq!(victims(&d), ["gpu-b"]);
    // No GPU asked: kube-scheduler's proposal passes through.
    let cpu = preemptor(1000, json!({"cpu": "1"}));
    let d = decide(&cpu, &node, &pods, &["cpu-only"], &[]);
    assert_eq!(victims(&d), ["cpu-only"]);
}

#[test]
fn a_node_the_pod_cannot_fit_even_empty_is_dropped() {
    let pods = vec![slice("p", 0, &[("A", 1000, 100)])];
    let node = snapshot(vec![gpu("A", 8, 40_000)], &pods);
    let huge = preemptor(
        1000,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "80000"}),
    );
    let d = decide(&huge, &node, &pods, &[], &[]);
    let Veto::NoEvictionFits(why) = &d.vetoed["n"] else {
        panic!("{:?}", d.vetoed)
    };
    assert!(why.contains("CardInsufficientMemory"), "{why}");
    let two = preemptor(1000, json!({"nvidia.com/gpu": "2"}));
    assert!(matches!(
        decide(&two, &node, &pods, &[], &[]).vetoed["n"],
        Veto::NoEvictionFits(_)
    ));
}

fn pdb(allowed: i32, labels: serde_json::Value) -> PdbFacts {
    PdbFacts {
        namespace: "ns".into(),
        selector: Some(serde_json::from_value(labels).unwrap()),
        disruptions_allowed: allowed,
        disrupted: BTreeSet::new(),
    }
}

#[test]
fn pdb_violations_are_counted_as_kube_scheduler_counts_them() {
    let labelled = |uid: &str, app: &str| {
        let mut p = slice(uid, 0, &[("A", 1000, 25)]);
        p.labels.insert("app".into(), app.into());
        p
    };
    let pods = [
        labelled("a", "web"),
        labelled("b", "web"),
        labelled("c", "db"),
    ];
    let budget = pdb(1, json!({"matchLabels": {"app": "web"}}));
    assert_eq!(pdb_violations(&pods, std::slice::from_ref(&budget)), 1);
    let not_in = pdb(
        0,
        json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
    );
    assert_eq!(pdb_violations(&pods, &[budget.clone(), not_in]), 2);
    // Empty selector, other namespace, already disrupted: match nothing.
    let mut other = pdb(0, json!({"matchLabels": {"app": "web"}}));
    other.namespace = "elsewhere".into();
    let mut disrupted = pdb(0, json!({"matchLabels": {"app": "db"}}));
    disrupted.disrupted.insert("c".into());
    assert_eq!(
        pdb_violations(&pods, &[pdb(0, json!({})), other, disrupted]),
        0
    );
    // The decision avoids a pod a PDB protects when another will do, and says so when not.
    let node = snapshot(vec![gpu("A", 8, 40_000)], &pods);
    let strict = pdb(
        0,
        json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
    );
    let three_quarters = preemptor(
        1000,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "75"}),
    );
    let db = pdb(0, json!({"matchLabels": {"app": "db"}}));
    let d = decide(&three_quarters, &node, &pods, &[], &[db]);
    assert_eq!(victims(&d), ["a", "b"]);
    assert_eq!(
        d.result.node_name_to_meta_victims["n"].num_pdb_violations,
        0
    );
    let d = decide(&three_quarters, &node, &pods, &[], &[strict]);
    assert_eq!(
        d.result.node_name_to_meta_victims["n"].num_pdb_violations,
        2
    );
}

/// A random node of 1–3 NVIDIA GPUs filled with slices of random priority and protection.
fn scenario() -> impl Strategy<Value = (Vec<Gpu>, Vec<PodFacts>)> {
    let gpus = 1usize..4;
    let slices = proptest::collection::vec(
        (
            0usize..3,
            1u64..8,
            1u64..6,
            0i32..6,
            proptest::bool::weighted(0.15),
        ),
        0..24,
    );
    (gpus, slices).prop_map(|(n, slices)| {
        let gpus: Vec<Gpu> = (0..n).map(|i| gpu(&format!("G{i}"), 6, 8_000)).collect();
        let mut used = vec![(0u32, 0u64, 0u64); n];
        let mut pods = Vec::new();
        for (k, (g, mem, cores, priority, protected)) in slices.into_iter().enumerate() {
            let g = g % n;
            let (mem, cores) = (mem * 500, cores * 10);
            let u = &mut used[g];
            if u.0 >= 6 || u.1 + mem > 8_000 || u.2 + cores > 100 {
                continue;
            }
            *u = (u.0 + 1, u.1 + mem, u.2 + cores);
            let mut p = slice(
                &format!("p{k}"),
                priority,
                &[(&format!("G{g}"), mem, cores)],
            );
            p.protection = protected.then_some(Protection::NotPreemptible);
            pods.push(p);
        }
        (gpus, pods)
    })
}

fn without_victims(node: &NodeSnapshot, pods: &[PodFacts], gone: &[&str]) -> NodeSnapshot {
    let kept: Vec<PodFacts> = pods
        .iter()
        .filter(|p| !gone.contains(&p.uid.as_str()))
        .cloned()
        .collect();
    snapshot(node.devices.gpus.clone(), &kept)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn victims_are_lower_priority_minimal_on_the_cards_taken_and_make_the_pod_fit(
        (gpus, pods) in scenario(),
        count in 1u32..3,
        mem in 1u64..9,
        cores in 1u32..11,
        priority in 0i32..7,
    ) {
        let pre = preemptor(priority, json!({"nvidia.com/gpu": count.to_string(),
            "nvidia.com/gpumem": (mem * 500).to_string(), "nvidia.com/gpucores": (cores * 10).to_string()}));
        let node = snapshot(gpus, &pods);
        let d = decide(&pre, &node, &pods, &[], &[]);
        match d.result.node_name_to_meta_victims.get("n") {
            Some(_) => {
                let chosen = victims(&d);
                prop_assert!(!chosen.is_empty());
                let gone: Vec<&str> = chosen.iter().map(String::as_str).collect();
                for uid in &gone {
                    let p = pods.iter().find(|p| p.uid == *uid).unwrap();
                    prop_assert!(p.priority < priority, "victim {uid} has priority {}", p.priority);
                    prop_assert!(p.protection.is_none());
                }
                // The result fits by Filter's own rule …
                let after = without_victims(&node, &pods, &gone);
                let placement = fit_node(&after, &pre.fit_request());
                prop_assert!(placement.is_ok());
                // … on the cards the victims held slices on …
                let taken: Vec<String> = placement.unwrap().runs.values().flatten().flatten()
                    .map(|d| d.uuid.clone()).collect();
                for uid in &gone {
                    let p = pods.iter().find(|p| p.uid == *uid).unwrap();
                    prop_assert!(p.charges.iter().any(|c| taken.contains(&c.uuid)));
                }
                // … and returning any one victim breaks it.
                for keep in &gone {
                    let fewer: Vec<&str> = gone.iter().copied().filter(|g| g != keep).collect();
                    prop_assert!(fits(&pre, &without_victims(&node, &pods, &fewer)).is_err(),
                        "{keep} was not needed");
                }
            }
            None => match &d.vetoed["n"] {
                Veto::NothingToEvict => prop_assert!(fits(&pre, &node).is_ok()),
                Veto::NoEvictionFits(_) => {
                    let eligible: Vec<&str> = pods.iter()
                        .filter(|p| p.priority < priority && p.protection.is_none())
                        .map(|p| p.uid.as_str()).collect();
                    prop_assert!(fits(&pre, &without_victims(&node, &pods, &eligible)).is_err());
                }
                other => prop_assert!(false, "unexpected veto {other:?}"),
            },
        }
    }
}

/// A preemptor of 1–2 containers (init or app, some asking no GPU), any GPU policy, NUMA
/// binding or not: single-GPU-container pods take [`QuickFit`]'s shortcut, the others
/// its fall-back to Filter's fit.
fn arb_preemptor() -> impl Strategy<Value = Preemptor> {
    use hami_protocol::requests::{ContainerKind, DeviceRequest, MemoryRequest};
    use hami_protocol::selection::GpuPolicyKind;
    let request = (0u32..3, 1u64..9, 0u32..11).prop_map(|(count, mem, cores)| DeviceRequest {
        count,
        memory: MemoryRequest::Mib(mem * 500),
        cores_percent: cores * 10,
        priority: None,
        added_limits: Vec::new(),
    });
    let container = (
        prop_oneof![3 => Just(ContainerKind::App), 1 => Just(ContainerKind::Init)],
        proptest::option::weighted(0.8, request),
    )
        .prop_map(|(kind, nvidia)| ContainerRequest {
            name: "c".into(),
            kind,
            amd: None,
            nvidia,
        });
    let kind = prop_oneof![
        Just(GpuPolicyKind::Binpack),
        Just(GpuPolicyKind::Spread),
        Just(GpuPolicyKind::Mutex)
    ];
    (
        proptest::collection::vec(container, 1..3),
        0i32..7,
        proptest::bool::weighted(0.2),
        kind,
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(containers, priority, numa_bind, kind, numa)| Preemptor {
            priority,
            containers,
            selectors: Selectors {
                amd: DeviceSelector::default(),
                nvidia: DeviceSelector {
                    numa_bind,
                    ..Default::default()
                },
            },
            gpu_policy: GpuPolicy { kind, numa },
            node_policy: NodePolicy::Binpack,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The verb's search (scratch usage, [`QuickFit`], GPUs skipped unsorted) decides
    /// exactly as the search as first written (Filter's `fit_node` on a fresh copy per
    /// trial): same victims in the same order, vetoes and their texts, unknown pods, PDB
    /// violations.
    #[test]
    fn the_fast_search_decides_exactly_as_the_reference(
        (gpus, mut pods) in scenario(),
        pre in arb_preemptor(),
        proposed in proptest::collection::vec(proptest::bool::weighted(0.2), 24),
        ghost in proptest::bool::weighted(0.2),
        held in proptest::option::weighted(0.15, 0usize..3),
        budget in proptest::option::of(0i32..2),
    ) {
        for (k, p) in pods.iter_mut().enumerate() {
            if k % 3 == 0 {
                p.labels.insert("app".into(), "web".into());
            }
        }
        let mut node = snapshot(gpus, &pods);
        if let Some(g) = held {
            // An id the node lacks is ignored.
            node.hold_whole(&[format!("G{g}")]);
        }
        let mut uids: Vec<String> = pods
            .iter()
            .zip(&proposed)
            .filter(|(_, p)| **p)
            .map(|(p, _)| p.uid.clone())
            .collect();
        if ghost {
            uids.push("ghost".into());
        }
        let pdbs: Vec<PdbFacts> = budget
            .map(|b| pdb(b, json!({"matchLabels": {"app": "web"}})))
            .into_iter()
            .collect();
        let proposals: BTreeMap<String, Vec<String>> = [("n".to_string(), uids)].into();
        let lookup = |name: &str| {
            (name == "n").then_some(NodeCandidate {
                snapshot: &node,
                pods: &pods,
            })
        };
        let quick = decide_preemption(&pre, &proposals, lookup, &pdbs);
        let reference = decide_with(&pre, &proposals, lookup, &pdbs, &Search::Reference);
        prop_assert_eq!(quick, reference);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The pods as the state keeps them for the verb ([`NodePods`]: facts shared, charges
    /// laid out flat, listed pods joined after) decide exactly as the same pods given with
    /// their charges, on a node whichever order it lists its GPUs in; so does a list kept
    /// in UID order through removals and updates, as the same pods in UID order.
    #[test]
    fn held_pods_decide_as_the_facts_they_came_from(
        (gpus, mut pods) in scenario(),
        pre in arb_preemptor(),
        proposed in proptest::collection::vec(proptest::bool::weighted(0.2), 24),
        listed in proptest::bool::weighted(0.3),
        reversed in proptest::bool::weighted(0.3),
        budget in proptest::option::of(0i32..2),
    ) {
        for (k, p) in pods.iter_mut().enumerate() {
            if k % 3 == 0 {
                p.labels.insert("app".into(), "web".into());
            }
        }
        let mut order = gpus;
        if reversed {
            order.reverse();
        }
        let node = snapshot(order, &pods);
        let shared = |p: &PodFacts| {
            Arc::new(PodFacts {
                charges: Vec::new(),
                ..p.clone()
            })
        };
        // Kept as the state keeps it: in UID order whatever the order of the changes,
        // some pods gone and back, some updated (their old charges left until compacted).
        let mut kept = NodePods::default();
        for p in pods.iter().rev() {
            kept.upsert(shared(p), &p.charges);
        }
        for p in pods.iter().step_by(3) {
            prop_assert!(kept.remove(&p.uid));
        }
        for p in pods.iter().step_by(2) {
            kept.upsert(shared(p), &p.charges);
        }
        for p in pods.iter().step_by(3) {
            kept.upsert(shared(p), &p.charges);
        }
        let mut by_uid = pods.clone();
        by_uid.sort_by(|a, b| a.uid.cmp(&b.uid));
        let mut held = NodePods::new(pods.iter().map(|p| (shared(p), p.charges.as_slice())));
        let mut uids: Vec<String> = pods
            .iter()
            .zip(&proposed)
            .filter(|(_, p)| **p)
            .map(|(p, _)| p.uid.clone())
            .collect();
        if listed {
            // A proposed pod holding no slice, read by the shell: after the holders.
            let plain = slice("plain", 0, &[]);
            held = held.with_listed([plain.clone(), pods.first().cloned().unwrap_or(plain.clone())]);
            kept = kept.with_listed([plain.clone()]);
            pods.push(plain.clone());
            by_uid.push(plain);
            uids.push("plain".into());
        }
        let pdbs: Vec<PdbFacts> = budget
            .map(|b| pdb(b, json!({"matchLabels": {"app": "web"}})))
            .into_iter()
            .collect();
        let proposals: BTreeMap<String, Vec<String>> = [("n".to_string(), uids)].into();
        let on_facts = |pods: &[PodFacts]| {
            decide_preemption(
                &pre,
                &proposals,
                |name| (name == "n").then_some(NodeCandidate { snapshot: &node, pods }),
                &pdbs,
            )
        };
        let on_held = |pods: &NodePods| {
            decide_preemption_held(
                &pre,
                &proposals,
                |name| (name == "n").then_some(HeldCandidate { snapshot: &node, pods }),
                &pdbs,
            )
        };
        prop_assert_eq!(held.len(), pods.len());
        prop_assert_eq!(on_facts(&pods), on_held(&held));
        prop_assert_eq!(kept.facts().cloned().collect::<Vec<_>>(), by_uid.iter().map(|p| PodFacts { charges: Vec::new(), ..p.clone() }).collect::<Vec<_>>());
        prop_assert_eq!(on_facts(&by_uid), on_held(&kept));
    }
}
