//! The allocator model never over-commits: property test over random pools and claim
//! sequences (allocate, sometimes free), checked by an independent ledger.

use std::collections::BTreeMap;

use hami_dra_core::allocator::{DeviceClass, allocate, attribute, consumed_amount};
use hami_dra_core::api::*;
use hami_dra_core::quantity::parse;
use proptest::prelude::*;

/// count, memory, computeUnits, NUMA selector.
type Req = (i64, Option<u64>, Option<u64>, Option<i64>);

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

fn claim(reqs: &[Req], distinct: bool, same_numa: bool) -> DeviceClaim {
    let requests = reqs
        .iter()
        .enumerate()
        .map(|(i, (count, mem, cus, numa))| {
            let mut r = BTreeMap::new();
            if let Some(m) = mem {
                r.insert("memory".to_string(), m.to_string());
            }
            if let Some(c) = cus {
                r.insert("computeUnits".to_string(), c.to_string());
            }
            DeviceRequest {
                name: format!("r{i}"),
                exactly: Some(ExactDeviceRequest {
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
                }),
                first_available: vec![],
            }
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn never_over_commits(
        devs in prop::collection::vec(dev_strategy(), 1..5),
        claims in prop::collection::vec((prop::collection::vec(req_strategy(), 1..3), any::<bool>(), any::<bool>(), any::<bool>()), 1..14),
    ) {
        let slices = pool(&devs);
        let mut held: Vec<Vec<DeviceRequestAllocationResult>> = vec![];
        for (n, (reqs, distinct, numa, free_first)) in claims.iter().enumerate() {
            if *free_first && !held.is_empty() { held.remove(n % held.len()); }
            let c = claim(reqs, *distinct, *numa);
            let flat: Vec<_> = held.iter().flatten().cloned().collect();
            if let Ok(res) = allocate(&c, &[class()], &slices, &flat, &format!("c{n}")) {
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
