use super::*;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};

const DRIVER: &str = DEFAULT_DRIVER;

fn slice(node: &str, generation: i64, devices: Value) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-s")},
        "spec": {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices}
    }))
    .unwrap()
}

fn gpu(name: &str, uuid: &str) -> Value {
    json!({"name": name,
        "attributes": {"uuid": {"string": uuid}, "productName": {"string": "AMD Instinct MI210"}},
        "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"}}})
}

fn result(request: &str, device: &str, share: &str, mem: &str, cus: &str) -> Value {
    json!({"request": request, "driver": DRIVER, "pool": "n1", "device": device,
        "shareID": share, "consumedCapacity": {"memory": mem, "computeUnits": cus}})
}

fn claim(name: &str, uid: &str, pod_uid: &str, results: Value, devices: Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": pod_uid}],
            "devices": devices}
    }))
    .unwrap()
}

fn status(device: &str, share: &str, ranges: &str) -> Value {
    json!({"driver": DRIVER, "pool": "n1", "device": device, "shareID": share,
        "data": {"cuRanges": ranges, "memoryBytes": 1}})
}

fn pod(containers: Value, init: Value, status: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "pod-1"},
        "spec": {"containers": containers, "initContainers": init,
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "t"},
                {"name": "direct", "resourceClaimName": "shared"},
                {"name": "pending", "resourceClaimTemplateName": "t"}]},
        "status": status
    }))
    .unwrap()
}

fn devices() -> SliceDevices {
    slice_devices(
        DRIVER,
        "n1",
        &[
            slice("n1", 2, json!([gpu("gpu-0", "U0"), gpu("gpu-1", "U1")])),
            // Older generation and another node: ignored.
            slice("n1", 1, json!([gpu("gpu-9", "OLD")])),
            slice("n2", 5, json!([gpu("gpu-0", "V0")])),
        ],
    )
}

#[test]
fn slices_of_this_node_newest_generation() {
    let d = devices();
    assert_eq!(d.len(), 2);
    let g1 = &d[&("n1".to_string(), "gpu-1".to_string())];
    assert_eq!(g1.uuid, "U1");
    assert_eq!(g1.memory, 64 << 30);
    assert_eq!(g1.compute_units, 104);
}

#[test]
fn containers_get_their_claims_devices_and_regions_their_first_container() {
    let p = pod(
        json!([
            {"name": "train", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "side", "resources": {"claims": [{"name": "direct"}]}},
            {"name": "plain"}]),
        json!([{"name": "warm", "resources": {"claims": [{"name": "direct", "request": "b"}]}}]),
        json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"},
            {"name": "pending"}]}),
    );
    assert_eq!(
        claim_names(&p),
        vec!["p-gpu-x".to_string(), "shared".to_string()]
    );
    let claims: HashMap<String, ResourceClaim> = [
        (
            "p-gpu-x".to_string(),
            claim(
                "p-gpu-x",
                "c-1",
                "pod-1",
                json!([
                    result("gpu", "gpu-1", "s1", "4Gi", "20"),
                    // Another driver's result in the same claim: not ours.
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "x"},
                    result("gpu", "gpu-7", "s2", "1Gi", "2")
                ]),
                json!([status("gpu-1", "s1", "0-19")]),
            ),
        ),
        (
            "shared".to_string(),
            claim(
                "shared",
                "c-2",
                "pod-1",
                json!([
                    result("a", "gpu-0", "s3", "2Gi", "10"),
                    result("b/sub", "gpu-1", "s4", "1Gi", "4")
                ]),
                json!([
                    status("gpu-0", "s3", "10-19"),
                    status("gpu-1", "s4", "20-23")
                ]),
            ),
        ),
    ]
    .into();
    let d = dra_pod(&p, &claims, DRIVER, "n1", &devices());
    assert!(d.problems.is_empty(), "{:?}", d.problems);
    let train = &d.containers["train"];
    assert_eq!(train.len(), 2);
    assert_eq!(
        (train[0].uuid.as_str(), train[0].mem_mib, train[0].cores),
        ("U1", 4096, 20)
    );
    assert_eq!(train[0].device_type, "AMD Instinct MI210");
    // A device no slice names (yet): named by pool/device, and the shell is told.
    assert_eq!(train[1].uuid, "n1/gpu-7");
    assert!(
        d.unknown_devices
            .contains(&("n1".to_string(), "gpu-7".to_string()))
    );
    // The init container comes first and asks only for request b (a subrequest of it).
    let warm = &d.containers["warm"];
    assert_eq!(warm.len(), 1);
    assert_eq!(warm[0].uuid, "U1");
    assert_eq!(d.containers["side"].len(), 2);
    assert!(!d.containers.contains_key("plain"));
    // Regions: c-1 is train's; c-2 (shared by warm and side) is warm's, the first in
    // device-list order; device a is not warm's.
    let r1 = &d.regions["c-1"];
    assert_eq!(
        (r1.pod_uid.as_str(), r1.container.as_str()),
        ("pod-1", "train")
    );
    assert_eq!(
        r1.devices,
        vec![
            RegionDevice {
                vdevice_index: Some(0),
                uuid: "U1".into()
            },
            RegionDevice {
                vdevice_index: Some(1),
                uuid: "n1/gpu-7".into()
            },
        ]
    );
    let r2 = &d.regions["c-2"];
    assert_eq!(r2.container, "warm");
    assert_eq!(
        r2.devices,
        vec![
            RegionDevice {
                vdevice_index: None,
                uuid: "U0".into()
            },
            RegionDevice {
                vdevice_index: Some(0),
                uuid: "U1".into()
            },
        ]
    );
    // CU ranges per device in device-list order (warm's c-2 share of U1 first), each
    // claim's once although two containers use c-2.
    assert_eq!(
        d.cu_allocated,
        vec![
            ("U0".into(), "10-19".into()),
            ("U1".into(), "20-23,0-19".into())
        ]
    );
}

#[test]
fn two_shares_of_one_gpu_in_one_claim_are_one_device_as_the_driver_prepares_them() {
    let p = pod(
        json!([{"name": "train", "resources": {"claims": [{"name": "gpu"}]}}]),
        json!([]),
        json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "g"}]}),
    );
    let claims: HashMap<String, ResourceClaim> = [(
        "g".to_string(),
        claim(
            "g",
            "c-1",
            "pod-1",
            json!([
                result("a", "gpu-0", "s1", "4Gi", "20"),
                result("b", "gpu-1", "s2", "1Gi", "10"),
                result("c", "gpu-0", "s3", "2Gi", "6")
            ]),
            json!([
                status("gpu-0", "s1", "0-19"),
                status("gpu-1", "s2", "0-9"),
                status("gpu-0", "s3", "20-25")
            ]),
        ),
    )]
    .into();
    let d = dra_pod(&p, &claims, DRIVER, "n1", &devices());
    let train = &d.containers["train"];
    // gpu-0 once, with both shares' memory and CUs; the region has two devices.
    assert_eq!(
        train
            .iter()
            .map(|c| (c.uuid.as_str(), c.mem_mib, c.cores))
            .collect::<Vec<_>>(),
        vec![("U0", 6144, 26), ("U1", 1024, 10)]
    );
    assert_eq!(
        d.regions["c-1"].devices,
        vec![
            RegionDevice {
                vdevice_index: Some(0),
                uuid: "U0".into()
            },
            RegionDevice {
                vdevice_index: Some(1),
                uuid: "U1".into()
            },
        ]
    );
    // Each share's CUs are still its own status entry.
    assert_eq!(
        d.cu_allocated,
        vec![
            ("U0".into(), "0-19,20-25".into()),
            ("U1".into(), "0-9".into())
        ]
    );
}

#[test]
fn claims_of_other_pods_or_drivers_or_unallocated_grant_nothing() {
    let p = pod(
        json!([{"name": "c", "resources": {"claims": [{"name": "gpu"}, {"name": "direct"}]}}]),
        json!([]),
        json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "g"}]}),
    );
    let mut other = claim(
        "g",
        "c-1",
        "pod-2",
        json!([result("gpu", "gpu-0", "s", "1Gi", "2")]),
        json!([]),
    );
    let claims: HashMap<String, ResourceClaim> = [
        ("g".to_string(), other.clone()),
        (
            "shared".to_string(),
            claim("shared", "c-2", "pod-1", json!([]), json!([])),
        ),
    ]
    .into();
    let d = dra_pod(&p, &claims, DRIVER, "n1", &devices());
    assert!(d.containers.is_empty() && d.regions.is_empty());
    assert_eq!(d.problems.len(), 1);
    assert!(
        d.problems[0].contains("claim g is not reserved for pod pod-1"),
        "{:?}",
        d.problems
    );
    // Allocated on another node's pool: not ours here, no problem.
    other
        .status
        .as_mut()
        .unwrap()
        .reserved_for
        .as_mut()
        .unwrap()[0]
        .uid = "pod-1".into();
    let d = dra_pod(
        &p,
        &[("g".to_string(), other)].into(),
        DRIVER,
        "n2",
        &devices(),
    );
    assert!(d.containers.is_empty() && d.problems.is_empty());
}

#[test]
fn a_claim_whose_consumed_capacity_cannot_be_read_holds_nothing() {
    let p = pod(
        json!([
            {"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "b", "resources": {"claims": [{"name": "gpu"}, {"name": "direct"}]}}]),
        json!([]),
        json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "g"}]}),
    );
    let claims: HashMap<String, ResourceClaim> = [
        (
            "g".to_string(),
            claim(
                "g",
                "c-1",
                "pod-1",
                // One readable result and one the driver refuses: the whole claim is.
                json!([
                    result("gpu", "gpu-0", "s1", "4Gi", "20"),
                    result("gpu", "gpu-1", "s2", "1500m", "8")
                ]),
                json!([status("gpu-0", "s1", "0-19")]),
            ),
        ),
        (
            "shared".to_string(),
            claim(
                "shared",
                "c-2",
                "pod-1",
                json!([result("x", "gpu-1", "s3", "2Gi", "2.5")]),
                json!([]),
            ),
        ),
    ]
    .into();
    let d = dra_pod(&p, &claims, DRIVER, "n1", &devices());
    assert!(d.containers.is_empty(), "{:?}", d.containers);
    assert!(d.regions.is_empty() && d.cu_allocated.is_empty());
    assert!(d.problems.is_empty(), "{:?}", d.problems);
    // Once per claim, however many containers name it.
    assert_eq!(d.unreadable.len(), 2, "{:?}", d.unreadable);
    assert!(
        d.unreadable[0].contains("claim g: device gpu-1: consumedCapacity.memory \"1500m\"")
            && d.unreadable[0].contains("refuses to prepare"),
        "{:?}",
        d.unreadable
    );
    assert!(
        d.unreadable[1]
            .contains("claim shared: device gpu-1: consumedCapacity.computeUnits \"2.5\""),
        "{:?}",
        d.unreadable
    );
}

#[test]
fn extended_resource_claims_map_requests_to_containers() {
    let p = pod(
        json!([{"name": "a"}, {"name": "b"}]),
        json!([]),
        json!({"extendedResourceClaimStatus": {"resourceClaimName": "p-ext",
            "requestMappings": [
                {"containerName": "a", "resourceName": "amd.com/gpu", "requestName": "container-0-request-0"},
                {"containerName": "b", "resourceName": "amd.com/gpu", "requestName": "container-1-request-0"}]}}),
    );
    // `shared` is named directly in spec.resourceClaims, even if no container uses it.
    assert_eq!(
        claim_names(&p),
        vec!["p-ext".to_string(), "shared".to_string()]
    );
    // Whole devices: no consumedCapacity, so the slice's capacity.
    let whole = |req: &str, dev: &str| json!({"request": req, "driver": DRIVER, "pool": "n1", "device": dev});
    let c = claim(
        "p-ext",
        "c-9",
        "pod-1",
        json!([
            whole("container-0-request-0", "gpu-0"),
            whole("container-1-request-0", "gpu-1")
        ]),
        json!([]),
    );
    let d = dra_pod(
        &p,
        &[("p-ext".to_string(), c)].into(),
        DRIVER,
        "n1",
        &devices(),
    );
    assert_eq!(d.containers["a"][0].uuid, "U0");
    assert_eq!(d.containers["a"][0].mem_mib, 64 << 10);
    assert_eq!(d.containers["a"][0].cores, 104);
    assert_eq!(d.containers["b"][0].uuid, "U1");
    assert_eq!(d.regions["c-9"].container, "a");
    assert_eq!(d.regions["c-9"].devices[1].vdevice_index, None);
    assert!(request_matches("r/s", "r") && !request_matches("rs", "r"));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// A claim: (device index, request "a"/"b") per result.
    fn claims_strategy() -> impl Strategy<Value = Vec<Vec<(usize, bool)>>> {
        proptest::collection::vec(
            proptest::collection::vec((0usize..3, any::<bool>()), 0..4),
            1..4,
        )
    }

    /// A container: (claim index, request filter None / "a" / "b") per reference.
    fn containers_strategy() -> impl Strategy<Value = Vec<Vec<(usize, Option<bool>)>>> {
        proptest::collection::vec(
            proptest::collection::vec((0usize..3, proptest::option::of(any::<bool>())), 0..3),
            1..4,
        )
    }

    proptest! {
        /// Whatever the claims and references: each region lists its claim's GPUs, each
        /// once, in result order; a region device's vdevice_index names a device of its
        /// owner container with the same uuid; each container gets exactly the GPUs its
        /// references select, each once per reference.
        #[test]
        fn regions_point_into_their_owners_devices(
            specs in claims_strategy(),
            refs in containers_strategy(),
        ) {
            let req = |b: bool| if b { "a" } else { "b" };
            let mut claims = HashMap::new();
            let mut pod_claims = Vec::new();
            for (i, results) in specs.iter().enumerate() {
                let results: Vec<Value> = results
                    .iter()
                    .enumerate()
                    .map(|(j, (d, r))| result(req(*r), &format!("gpu-{d}"), &format!("s{i}-{j}"), "1Gi", "2"))
                    .collect();
                let name = format!("c{i}");
                claims.insert(name.clone(), claim(&name, &format!("uid-{i}"), "pod-1", json!(results), json!([])));
                pod_claims.push(json!({"name": format!("k{i}"), "resourceClaimName": name}));
            }
            let containers: Vec<Value> = refs
                .iter()
                .enumerate()
                .map(|(n, rs)| {
                    let rs: Vec<Value> = rs
                        .iter()
                        .filter(|(c, _)| *c < specs.len())
                        .map(|(c, f)| match f {
                            None => json!({"name": format!("k{c}")}),
                            Some(b) => json!({"name": format!("k{c}"), "request": req(*b)}),
                        })
                        .collect();
                    json!({"name": format!("ctr{n}"), "resources": {"claims": rs}})
                })
                .collect();
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ml", "uid": "pod-1"},
                "spec": {"containers": containers, "resourceClaims": pod_claims}
            }))
            .unwrap();
            let slices = slice_devices(
                DRIVER,
                "n1",
                &[slice("n1", 1, json!([gpu("gpu-0", "U0"), gpu("gpu-1", "U1")]))],
            );
            let d = dra_pod(&p, &claims, DRIVER, "n1", &slices);
            prop_assert!(d.problems.is_empty());
            // A claim's GPUs, each once, in first-seen order (D-22).
            let gpus_of = |results: &mut dyn Iterator<Item = usize>| {
                let mut seen: Vec<usize> = Vec::new();
                for g in results {
                    if !seen.contains(&g) {
                        seen.push(g);
                    }
                }
                seen
            };
            for (uid, region) in &d.regions {
                let i: usize = uid.strip_prefix("uid-").unwrap().parse().unwrap();
                let gpus = gpus_of(&mut specs[i].iter().map(|(g, _)| *g));
                prop_assert_eq!(region.devices.len(), gpus.len());
                for (j, rd) in region.devices.iter().enumerate() {
                    let want = slices
                        .get(&("n1".to_string(), format!("gpu-{}", gpus[j])))
                        .map_or_else(|| format!("n1/gpu-{}", gpus[j]), |s| s.uuid.clone());
                    prop_assert_eq!(&rd.uuid, &want);
                    if let Some(v) = rd.vdevice_index {
                        let owned = &d.containers[&region.container];
                        prop_assert_eq!(&owned[v].uuid, &rd.uuid);
                    }
                }
            }
            for (n, rs) in refs.iter().enumerate() {
                let selected: usize = rs
                    .iter()
                    .filter(|(c, _)| *c < specs.len())
                    .map(|(c, f)| {
                        gpus_of(&mut specs[*c]
                            .iter()
                            .filter(|(_, r)| f.is_none_or(|b| b == *r))
                            .map(|(g, _)| *g))
                        .len()
                    })
                    .sum();
                let got = d.containers.get(&format!("ctr{n}")).map_or(0, Vec::len);
                prop_assert_eq!(got, selected);
                // A region is owned by the first container naming its claim.
                for (c, _) in rs.iter().filter(|(c, _)| *c < specs.len() && !specs[*c].is_empty()) {
                    let first = refs
                        .iter()
                        .position(|r| r.iter().any(|(x, _)| x == c))
                        .unwrap();
                    prop_assert_eq!(&d.regions[&format!("uid-{c}")].container, &format!("ctr{first}"));
                }
            }
        }
    }
}
