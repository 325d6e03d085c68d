//! The allocator model never over-commits: property test over random pools and claim
//! sequences (allocate, sometimes free; requests `exactly` or `firstAvailable` with up to
//! three sub-requests), checked by an independent ledger. Then `firstAvailable`'s order,
//! backtracking and constraint scoping, and the errors.

use std::collections::BTreeMap;

use hami_dra_core::api::*;
use hami_dra_core::quantity::parse;
use hami_structured_allocation::allocator::{DeviceClass, allocate, attribute, consumed_amount};
use proptest::prelude::*;

/// count, memory, computeUnits, NUMA selector.
type Req = (i64, Option<u64>, Option<u64>, Option<i64>);

/// One alternative: `exactly`; several: `firstAvailable` sub-requests `s0`, `s1`, ….
type Alts = Vec<Req>;

const DRV: &str = "amdgpu.hami-rs.io";

fn class() -> DeviceClass {
    DeviceClass {
        name: "gpu".into(),
        selectors: vec![format!("device.driver == \"{DRV}\"")],
    }
}

fn cap(value: u64, step: u64, default: u64, shared: bool) -> DeviceCapacity {
    DeviceCapacity {
        value: value.to_string(),
        request_policy: shared.then(|| CapacityRequestPolicy {
            default: Some(default.to_string()),
            valid_values: vec![],
            valid_range: Some(CapacityRequestPolicyRange {
                min: step.to_string(),
                max: Some(value.to_string()),
                step: Some(step.to_string()),
            }),
        }),
    }
}

fn pool(specs: &[(bool, u64, u64, i64, bool)]) -> Vec<ResourceSlice> {
    let devices = specs
        .iter()
        .enumerate()
        .map(|(i, (shared, mem, cus, numa, tainted))| {
            let mut d = Device {
                name: format!("gpu-{i}"),
                allow_multiple_allocations: *shared,
                ..Device::default()
            };
            d.attributes.insert(
                "resource.kubernetes.io/numaNode".into(),
                DeviceAttribute::int(*numa),
            );
            d.attributes.insert(
                "resource.kubernetes.io/pciBusID".into(),
                DeviceAttribute::string(format!("0000:0{i}:00.0")),
            );
            d.capacity
                .insert("memory".into(), cap(*mem, 1, *mem, *shared));
            d.capacity
                .insert("computeUnits".into(), cap(*cus, 2, *cus, *shared));
            d.capacity.insert("shares".into(), cap(4, 1, 1, *shared));
            if *tainted {
                d.taints.push(DeviceTaint {
                    key: "k".into(),
                    value: None,
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
            d
        })
        .collect();
    vec![ResourceSlice {
        api_version: API_VERSION.into(),
        kind: "ResourceSlice".into(),
        metadata: ObjectMeta::default(),
        spec: ResourceSliceSpec {
            driver: DRV.into(),
            pool: ResourcePool {
                name: "n".into(),
                generation: 1,
                resource_slice_count: 1,
            },
            node_name: Some("n".into()),
            all_nodes: None,
            devices,
        },
    }]
}

fn exact((count, mem, cus, numa): &Req) -> ExactDeviceRequest {
    let mut r = BTreeMap::new();
    if let Some(m) = mem {
        r.insert("memory".to_string(), m.to_string());
    }
    if let Some(c) = cus {
        r.insert("computeUnits".to_string(), c.to_string());
    }
    ExactDeviceRequest {
        device_class_name: "gpu".into(),
        count: Some(*count),
        selectors: numa
            .map(|n| DeviceSelector {
                cel: Some(CelDeviceSelector {
                    expression: format!(
                        "device.attributes[\"resource.kubernetes.io\"].numaNode == {n}"
                    ),
                }),
            })
            .into_iter()
            .collect(),
        capacity: (!r.is_empty()).then_some(CapacityRequirements { requests: r }),
        ..Default::default()
    }
}

fn sub(name: &str, r: &Req) -> DeviceSubRequest {
    let e = exact(r);
    DeviceSubRequest {
        name: name.into(),
        device_class_name: e.device_class_name,
        selectors: e.selectors,
        allocation_mode: None,
        count: e.count,
        tolerations: vec![],
        capacity: e.capacity,
    }
}

fn claim(reqs: &[Req], distinct: bool, same_numa: bool) -> DeviceClaim {
    let alts: Vec<Alts> = reqs.iter().map(|r| vec![*r]).collect();
    claim_alts(&alts, distinct, same_numa)
}

fn claim_alts(reqs: &[Alts], distinct: bool, same_numa: bool) -> DeviceClaim {
    let requests = reqs
        .iter()
        .enumerate()
        .map(|(i, alts)| DeviceRequest {
            name: format!("r{i}"),
            exactly: (alts.len() == 1).then(|| exact(&alts[0])),
            first_available: if alts.len() == 1 {
                vec![]
            } else {
                alts.iter()
                    .enumerate()
                    .map(|(j, r)| sub(&format!("s{j}"), r))
                    .collect()
            },
        })
        .collect();
    let mut constraints = vec![];
    if distinct {
        constraints.push(DeviceConstraint {
            requests: vec![],
            match_attribute: None,
            distinct_attribute: Some("resource.kubernetes.io/pciBusID".into()),
        });
    }
    if same_numa {
        constraints.push(DeviceConstraint {
            requests: vec![],
            match_attribute: Some("resource.kubernetes.io/numaNode".into()),
            distinct_attribute: None,
        });
    }
    DeviceClaim {
        requests,
        constraints,
        config: vec![],
    }
}

/// The independent ledger: every device's consumption within its capacity, exclusive
/// devices held once, every consumed amount one the policy allows.
fn check(
    slices: &[ResourceSlice],
    held: &[Vec<DeviceRequestAllocationResult>],
) -> Result<(), String> {
    for d in &slices[0].spec.devices {
        let rs: Vec<_> = held
            .iter()
            .flatten()
            .filter(|r| r.device == d.name)
            .collect();
        if d.taints.iter().any(|t| t.effect == "NoSchedule") && !rs.is_empty() {
            return Err(format!("{} tainted but allocated", d.name));
        }
        if !d.allow_multiple_allocations {
            if rs.len() > 1 {
                return Err(format!("exclusive {} held {} times", d.name, rs.len()));
            }
            continue;
        }
        for (k, c) in &d.capacity {
            let mut sum = 0;
            for r in &rs {
                let v = parse(
                    r.consumed_capacity
                        .get(k)
                        .ok_or(format!("{k} not recorded"))?,
                )
                .unwrap();
                let p = c
                    .request_policy
                    .as_ref()
                    .unwrap()
                    .valid_range
                    .as_ref()
                    .unwrap();
                let (min, step) = (
                    parse(&p.min).unwrap(),
                    parse(p.step.as_ref().unwrap()).unwrap(),
                );
                if v < min || !(v - min).is_multiple_of(step) {
                    return Err(format!("{k}={v} off policy"));
                }
                sum += v;
            }
            if sum > parse(&c.value).unwrap() {
                return Err(format!(
                    "{} {k} over-committed: {sum} > {}",
                    d.name, c.value
                ));
            }
        }
    }
    Ok(())
}

fn dev_strategy() -> impl Strategy<Value = (bool, u64, u64, i64, bool)> {
    (
        prop::bool::weighted(0.8),
        1u64..64,
        (1u64..8).prop_map(|x| x * 4),
        0i64..2,
        prop::bool::weighted(0.1),
    )
}

fn req_strategy() -> impl Strategy<Value = (i64, Option<u64>, Option<u64>, Option<i64>)> {
    (
        1i64..3,
        prop::option::of(1u64..40),
        prop::option::of(1u64..20),
        prop::option::weighted(0.2, 0i64..2),
    )
}

/// Mostly `exactly`, a third `firstAvailable` with two or three sub-requests.
fn alts_strategy() -> impl Strategy<Value = Alts> {
    prop_oneof![
        2 => req_strategy().prop_map(|r| vec![r]),
        1 => prop::collection::vec(req_strategy(), 2..4),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn never_over_commits(
        devs in prop::collection::vec(dev_strategy(), 1..5),
        claims in prop::collection::vec((prop::collection::vec(alts_strategy(), 1..3), any::<bool>(), any::<bool>(), any::<bool>()), 1..14),
    ) {
        let slices = pool(&devs);
        let mut held: Vec<Vec<DeviceRequestAllocationResult>> = vec![];
        for (n, (alts, distinct, numa, free_first)) in claims.iter().enumerate() {
            if *free_first && !held.is_empty() { held.remove(n % held.len()); }
            let c = claim_alts(alts, *distinct, *numa);
            let flat: Vec<_> = held.iter().flatten().cloned().collect();
            if let Ok(res) = allocate(&c, &[class()], &slices, &flat, &format!("c{n}")) {
                // Which alternative each request got, from its results' names: `r<i>` for
                // `exactly`, `r<i>/s<j>` for a sub-request, one sub-request per request.
                let mut reqs: Vec<Req> = vec![];
                let mut js: Vec<usize> = vec![];
                let mut at = 0;
                for (i, a) in alts.iter().enumerate() {
                    let Some(first) = res.get(at) else {
                        prop_assert!(false, "no result for r{}", i);
                        unreachable!()
                    };
                    let j = if a.len() == 1 {
                        prop_assert_eq!(&first.request, &format!("r{i}"));
                        0
                    } else {
                        let j: usize = first.request.strip_prefix(&format!("r{i}/s")).and_then(|j| j.parse().ok()).unwrap_or(usize::MAX);
                        prop_assert!(j < a.len(), "{}", first.request);
                        j
                    };
                    let chosen = a[j];
                    js.push(j);
                    for k in 0..chosen.0 as usize {
                        prop_assert_eq!(&res[at + k].request, &first.request);
                        prop_assert_eq!(hami_dra_core::api::parent_request(&res[at + k].request), format!("r{i}"));
                    }
                    at += chosen.0 as usize;
                    reqs.push(chosen);
                }
                // First available: the first request's earlier sub-requests cannot be
                // allocated with the rest of this claim (the search tried them first).
                for k in 0..js[0] {
                    let mut earlier = alts.clone();
                    earlier[0] = vec![alts[0][k]];
                    let e = allocate(&claim_alts(&earlier, *distinct, *numa), &[class()], &slices, &flat, "x");
                    prop_assert!(e.is_err(), "r0/s{} fits but r0/s{} was chosen", k, js[0]);
                }
                let want: i64 = reqs.iter().map(|r| r.0).sum();
                prop_assert_eq!(res.len() as i64, want);
                let dev = |r: &DeviceRequestAllocationResult| slices[0].spec.devices.iter().find(|d| d.name == r.device).unwrap().clone();
                if *distinct {
                    let ids: std::collections::BTreeSet<_> = res.iter().map(|r| r.device.clone()).collect();
                    prop_assert_eq!(ids.len(), res.len());
                }
                if *numa {
                    let v: std::collections::BTreeSet<_> = res.iter().map(|r| attribute(DRV, &dev(r), "resource.kubernetes.io/numaNode").cloned()).collect();
                    prop_assert_eq!(v.len(), 1);
                }
                for (r, q) in res.iter().zip(reqs.iter().flat_map(|q| std::iter::repeat_n(q, q.0 as usize))) {
                    if let (Some(sel), d) = (q.3, dev(r)) {
                        prop_assert_eq!(attribute(DRV, &d, "resource.kubernetes.io/numaNode"), Some(&DeviceAttribute::int(sel)));
                    }
                    if let (Some(m), Some(got)) = (q.1, r.consumed_capacity.get("memory")) {
                        prop_assert!(parse(got).unwrap() >= m);
                    }
                }
                held.push(res);
            }
            prop_assert_eq!(check(&slices, &held), Ok(()));
        }
    }
}

#[test]
fn rounds_up_to_step_and_defaults_to_whole() {
    let p = CapacityRequestPolicy {
        default: Some("96".into()),
        valid_values: vec![],
        valid_range: Some(CapacityRequestPolicyRange {
            min: "2".into(),
            max: Some("96".into()),
            step: Some("2".into()),
        }),
    };
    assert_eq!(consumed_amount(96, Some(&p), Some(3)).unwrap(), Some(4));
    assert_eq!(consumed_amount(96, Some(&p), Some(1)).unwrap(), Some(2));
    assert_eq!(consumed_amount(96, Some(&p), None).unwrap(), Some(96));
    assert_eq!(consumed_amount(96, Some(&p), Some(97)).unwrap(), None);
    assert_eq!(consumed_amount(96, None, None).unwrap(), Some(96));
}

#[test]
fn a_whole_gpu_claim_excludes_slices_and_a_free_gpu_is_found() {
    let slices = pool(&[(true, 16, 8, 0, false), (true, 16, 8, 0, false)]);
    let whole = allocate(
        &claim(&[(1, None, None, None)], false, false),
        &[class()],
        &slices,
        &[],
        "a",
    )
    .unwrap();
    assert_eq!(whole[0].device, "gpu-0");
    assert_eq!(whole[0].consumed_capacity["memory"], "16");
    let slice = allocate(
        &claim(&[(1, Some(4), Some(2), None)], false, false),
        &[class()],
        &slices,
        &whole,
        "b",
    )
    .unwrap();
    assert_eq!(slice[0].device, "gpu-1");
    let no = allocate(
        &claim(&[(1, None, None, None)], false, false),
        &[class()],
        &slices,
        &[whole, slice].concat(),
        "c",
    );
    assert!(no.unwrap_err().to_string().contains("cannot allocate"));
}

#[test]
fn unsupported_features_are_named() {
    let slices = pool(&[(true, 16, 8, 0, false)]);
    let mut c = claim(&[(1, None, None, None)], false, false);
    c.requests[0].exactly.as_mut().unwrap().allocation_mode = Some("All".into());
    let e = allocate(&c, &[class()], &slices, &[], "x").unwrap_err();
    assert!(e.to_string().contains("allocationMode"), "{e}");
}

fn one_sub_claim(subs: &[(&str, Req)]) -> DeviceClaim {
    DeviceClaim {
        requests: vec![DeviceRequest {
            name: "gpu".into(),
            exactly: None,
            first_available: subs.iter().map(|(n, r)| sub(n, r)).collect(),
        }],
        constraints: vec![],
        config: vec![],
    }
}

#[test]
fn first_available_takes_the_second_when_the_first_cannot_fit() {
    // Two shared 16-unit GPUs; the first sub-request wants 32 (fits none), the second 8.
    let slices = pool(&[(true, 16, 8, 0, false), (true, 16, 8, 1, false)]);
    let c = one_sub_claim(&[
        ("big", (1, Some(32), None, None)),
        ("small", (1, Some(8), None, None)),
    ]);
    let res = allocate(&c, &[class()], &slices, &[], "a").unwrap();
    assert_eq!(res.len(), 1);
    assert_eq!(res[0].request, "gpu/small");
    assert_eq!(res[0].consumed_capacity["memory"], "8");
    // When the first fits, it is taken.
    let c = one_sub_claim(&[
        ("small", (1, Some(8), None, None)),
        ("big", (1, Some(32), None, None)),
    ]);
    assert_eq!(
        allocate(&c, &[class()], &slices, &[], "a").unwrap()[0].request,
        "gpu/small"
    );
    // Count comes from the chosen sub-request: two devices named gpu/two.
    let c = one_sub_claim(&[
        ("three", (3, None, None, None)),
        ("two", (2, Some(1), None, None)),
    ]);
    let res = allocate(&c, &[class()], &slices, &[], "a").unwrap();
    assert_eq!(
        res.iter().map(|r| r.request.as_str()).collect::<Vec<_>>(),
        ["gpu/two", "gpu/two"]
    );
    // Neither fits: the error says so.
    let c = one_sub_claim(&[
        ("a", (1, Some(32), None, None)),
        ("b", (1, Some(17), None, None)),
    ]);
    let e = allocate(&c, &[class()], &slices, &[], "a")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("none of request \"gpu\"'s 2 sub-requests"),
        "{e}"
    );
}

#[test]
fn first_available_backtracks_when_a_later_constraint_fails() {
    // gpu-0 on NUMA 0, gpu-1 on NUMA 1. `gpu`'s first sub-request takes NUMA 0, `nic` must be
    // on NUMA 1, and both must share a NUMA node: only `gpu/numa1` works.
    let slices = pool(&[(true, 16, 8, 0, false), (true, 16, 8, 1, false)]);
    let mut c = one_sub_claim(&[
        ("numa0", (1, None, None, Some(0))),
        ("numa1", (1, Some(4), Some(2), Some(1))),
    ]);
    c.requests.push(DeviceRequest {
        name: "nic".into(),
        exactly: Some(exact(&(1, Some(4), Some(2), Some(1)))),
        first_available: vec![],
    });
    c.constraints.push(DeviceConstraint {
        requests: vec!["gpu".into(), "nic".into()],
        match_attribute: Some("resource.kubernetes.io/numaNode".into()),
        distinct_attribute: None,
    });
    let res = allocate(&c, &[class()], &slices, &[], "a").unwrap();
    let got: Vec<_> = res
        .iter()
        .map(|r| (r.request.as_str(), r.device.as_str()))
        .collect();
    assert_eq!(got, [("gpu/numa1", "gpu-1"), ("nic", "gpu-1")]);
    // Without the constraint the first sub-request stands.
    c.constraints.clear();
    assert_eq!(
        allocate(&c, &[class()], &slices, &[], "a").unwrap()[0].request,
        "gpu/numa0"
    );
    // A constraint naming `gpu/numa1` does not bind `gpu/numa0`: the first is taken again.
    c.constraints.push(DeviceConstraint {
        requests: vec!["gpu/numa1".into(), "nic".into()],
        match_attribute: Some("resource.kubernetes.io/numaNode".into()),
        distinct_attribute: None,
    });
    assert_eq!(
        allocate(&c, &[class()], &slices, &[], "a").unwrap()[0].request,
        "gpu/numa0"
    );
    // ... and a distinctAttribute naming it does bind `gpu/numa1`.
    let slices1 = pool(&[(true, 16, 8, 1, false)]);
    let mut d = one_sub_claim(&[("numa1", (1, Some(4), Some(2), Some(1)))]);
    d.requests.push(c.requests[1].clone());
    d.constraints.push(DeviceConstraint {
        requests: vec!["gpu/numa1".into(), "nic".into()],
        match_attribute: None,
        distinct_attribute: Some("resource.kubernetes.io/pciBusID".into()),
    });
    assert!(allocate(&d, &[class()], &slices1, &[], "a").is_err());
    d.constraints[0].requests[0] = "gpu".into();
    assert!(allocate(&d, &[class()], &slices1, &[], "a").is_err());
    d.constraints.clear();
    assert_eq!(
        allocate(&d, &[class()], &slices1, &[], "a").unwrap().len(),
        2
    );
}

#[test]
fn first_available_mistakes_are_named() {
    let slices = pool(&[(true, 16, 8, 0, false)]);
    let r = (1, None, None, None);
    let nine: Vec<(String, Req)> = (0..9).map(|i| (format!("s{i}"), r)).collect();
    let nine: Vec<(&str, Req)> = nine.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    let e = allocate(&one_sub_claim(&nine), &[class()], &slices, &[], "a").unwrap_err();
    assert!(e.to_string().contains("at most 8"), "{e}");
    let e = allocate(
        &one_sub_claim(&[("a", r), ("a", r)]),
        &[class()],
        &slices,
        &[],
        "a",
    )
    .unwrap_err();
    assert!(e.to_string().contains("appears twice"), "{e}");
    let mut both = one_sub_claim(&[("a", r)]);
    both.requests[0].exactly = Some(exact(&r));
    let e = allocate(&both, &[class()], &slices, &[], "a").unwrap_err();
    assert!(
        e.to_string()
            .contains("both `exactly` and `firstAvailable`"),
        "{e}"
    );
    let mut unknown = one_sub_claim(&[("a", r)]);
    unknown.constraints.push(DeviceConstraint {
        requests: vec!["gpu/b".into()],
        match_attribute: Some("resource.kubernetes.io/numaNode".into()),
        distinct_attribute: None,
    });
    let e = allocate(&unknown, &[class()], &slices, &[], "a").unwrap_err();
    assert!(e.to_string().contains("\"gpu/b\""), "{e}");
    // A sub-request's own problem names `<request>/<sub>`.
    let mut bad = one_sub_claim(&[("a", r), ("b", r)]);
    bad.requests[0].first_available[1].device_class_name = "nope".into();
    let e = allocate(&bad, &[class()], &slices, &[], "a").unwrap_err();
    assert!(
        e.to_string().contains("\"gpu/b\"") && e.to_string().contains("nope"),
        "{e}"
    );
}

#[test]
fn webhook_selectors_select_and_a_missing_attribute_aborts() {
    let mut slices = pool(&[(true, 16, 8, 0, false), (true, 32, 8, 0, false)]);
    for (i, d) in slices[0].spec.devices.iter_mut().enumerate() {
        d.attributes
            .insert("uuid".into(), DeviceAttribute::string(format!("GPU-{i}")));
    }
    let with = |cel: &str| {
        let mut e = exact(&(1, None, None, None));
        e.selectors.push(DeviceSelector {
            cel: Some(CelDeviceSelector {
                expression: cel.into(),
            }),
        });
        DeviceClaim {
            requests: vec![DeviceRequest {
                name: "gpu".into(),
                exactly: Some(e),
                first_available: vec![],
            }],
            constraints: vec![],
            config: vec![],
        }
    };
    let one = |cel: &str| {
        allocate(&with(cel), &[class()], &slices, &[], "a").map(|r| r[0].device.clone())
    };
    assert_eq!(
        one(&format!(
            "device.capacity[\"{DRV}\"].memory.compareTo(quantity(\"32\")) == 0"
        ))
        .unwrap(),
        "gpu-1"
    );
    assert_eq!(
        one(&format!(
            "device.capacity[\"{DRV}\"].memory.compareTo(quantity(\"20\")) < 0"
        ))
        .unwrap(),
        "gpu-0"
    );
    assert_eq!(
        one(&format!(
            "device.attributes[\"{DRV}\"].uuid in [\"GPU-1\", \"GPU-9\"]"
        ))
        .unwrap(),
        "gpu-1"
    );
    assert_eq!(
        one(&format!(
            "!(device.attributes[\"{DRV}\"].uuid in [\"GPU-0\"])"
        ))
        .unwrap(),
        "gpu-1"
    );
    let e = one(&format!("device.attributes[\"{DRV}\"].serial == \"x\""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("CEL runtime error") && e.contains("serial") && e.contains("n/gpu-0"),
        "{e}"
    );
    // A class selector that is false first keeps the request's from being evaluated.
    let other = DeviceClass {
        name: "gpu".into(),
        selectors: vec!["device.driver == \"other.example.com\"".into()],
    };
    let e = allocate(
        &with(&format!("device.attributes[\"{DRV}\"].serial == \"x\"")),
        &[other],
        &slices,
        &[],
        "a",
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            hami_structured_allocation::allocator::AllocError::Unsatisfiable(_)
        ),
        "{e}"
    );
}

#[test]
fn a_selector_error_aborts_only_where_upstreams_lazy_search_reaches_it() {
    // gpu-0 has a uuid, gpu-1 none (shared devices); gpu-2/gpu-3 exclusive, gpu-2 without.
    let mut slices = pool(&[
        (true, 16, 8, 0, false),
        (true, 16, 8, 0, false),
        (false, 16, 8, 0, false),
        (false, 16, 8, 0, false),
    ]);
    for (i, d) in slices[0].spec.devices.iter_mut().enumerate() {
        if i == 0 || i == 3 {
            d.attributes
                .insert("uuid".into(), DeviceAttribute::string(format!("GPU-{i}")));
        }
    }
    let uuid_is = |u: &str| DeviceSelector {
        cel: Some(CelDeviceSelector {
            expression: format!("device.attributes[\"{DRV}\"].uuid == \"{u}\""),
        }),
    };
    let one = |r: &Req, sel: Option<DeviceSelector>| {
        let mut e = exact(r);
        e.selectors.extend(sel);
        DeviceClaim {
            requests: vec![DeviceRequest {
                name: "gpu".into(),
                exactly: Some(e),
                first_available: vec![],
            }],
            constraints: vec![],
            config: vec![],
        }
    };
    let small = (1, Some(4), Some(2), None);
    // gpu-0 satisfies the request before gpu-1 is reached: no error.
    let got = allocate(
        &one(&small, Some(uuid_is("GPU-0"))),
        &[class()],
        &slices,
        &[],
        "a",
    )
    .unwrap();
    assert_eq!(got[0].device, "gpu-0");
    // With gpu-0 full, the search goes on to gpu-1 and its lookup aborts.
    let full = allocate(
        &one(&(1, None, None, None), None),
        &[class()],
        &slices,
        &[],
        "f",
    )
    .unwrap();
    assert_eq!(full[0].device, "gpu-0");
    let e = allocate(
        &one(&small, Some(uuid_is("GPU-0"))),
        &[class()],
        &slices,
        &full,
        "a",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("n/gpu-1") && e.to_string().contains("runtime"),
        "{e}"
    );
    // An exclusive device in use is skipped before its selectors, as upstream.
    let mut excl = slices.clone();
    excl[0].spec.devices.drain(0..2);
    let held = DeviceRequestAllocationResult {
        request: "x".into(),
        driver: DRV.into(),
        pool: "n".into(),
        device: "gpu-2".into(),
        ..Default::default()
    };
    let got = allocate(
        &one(&small, Some(uuid_is("GPU-3"))),
        &[class()],
        &excl,
        &[held],
        "a",
    )
    .unwrap();
    assert_eq!(got[0].device, "gpu-3");
    let e = allocate(
        &one(&small, Some(uuid_is("GPU-3"))),
        &[class()],
        &excl,
        &[],
        "a",
    )
    .unwrap_err();
    assert!(e.to_string().contains("n/gpu-2"), "{e}");
    // A later sub-request's error does not matter when an earlier one is taken; it does when
    // the search gets there.
    let serial = DeviceSelector {
        cel: Some(CelDeviceSelector {
            expression: format!("device.attributes[\"{DRV}\"].serial == \"x\""),
        }),
    };
    let mut s1 = sub("s1", &small);
    s1.selectors.push(serial);
    let mk = |first: Req| DeviceClaim {
        requests: vec![DeviceRequest {
            name: "gpu".into(),
            exactly: None,
            first_available: vec![sub("s0", &first), s1.clone()],
        }],
        constraints: vec![],
        config: vec![],
    };
    let got = allocate(&mk(small), &[class()], &slices, &[], "a").unwrap();
    assert_eq!(got[0].request, "gpu/s0");
    let e = allocate(
        &mk((1, Some(64), None, None)),
        &[class()],
        &slices,
        &[],
        "a",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("\"gpu/s1\"") && e.to_string().contains("serial"),
        "{e}"
    );
}
