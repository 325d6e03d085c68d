//! DRA pods (issue 20), pure: which devices each container of a pod got through its
//! ResourceClaims, and to which container and devices the region file of a claim belongs.
//!
//! In DRA mode a pod carries no `hami.io/*-devices-allocated` annotation. Its containers
//! name claims in `resources.claims` (pod claims resolved through `spec.resourceClaims` and
//! `status.resourceClaimStatuses`) or get one through `status.extendedResourceClaimStatus`
//! (`amd.com/gpu` counts, KEP-5004). A claim's `status.allocation.devices.results` of our
//! driver on this node's pool are its devices, in the order the driver prepared them
//! (`hami_dra_core::prepare::plan_prepare` keeps the results' order): the hook's region in
//! `<cache root>/claims/<claim uid>/` counts device `i` for the claim's `i`-th result
//! (`HIP_VISIBLE_DEVICES=0..n`). The device's `uuid` attribute in the driver's
//! ResourceSlice is the AMD SMI UUID the device plugin registers: the `device_uuid` label.
//! The CU ranges are the driver's `status.devices[].data.cuRanges`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hami_protocol::capacity;
use hami_protocol::device_list::{ContainerDevice, ContainerDevices};
use hami_protocol::requests::container_slots;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use hami_protocol::dra::{COMPUTE_UNITS, CU_RANGES, MEMORY};

/// The DRA driver whose claims the monitor reads by default.
pub const DEFAULT_DRIVER: &str = hami_protocol::dra::DRIVER;

/// One device of the driver's ResourceSlices on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevice {
    /// The `uuid` attribute (registered device id).
    pub uuid: String,
    /// The `productName` attribute.
    pub product: String,
    /// The `memory` capacity, bytes (0 when not published).
    pub memory: u64,
    /// The `computeUnits` capacity (0 when not published).
    pub compute_units: u64,
}

/// This node's devices by (pool, device name).
pub type SliceDevices = BTreeMap<(String, String), SliceDevice>;

/// The devices of `driver`'s slices of `node`, newest generation of each pool only (as
/// the scheduler counts them). Unreadable capacities count 0.
pub fn slice_devices(driver: &str, node: &str, slices: &[ResourceSlice]) -> SliceDevices {
    let mine: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(node))
        .collect();
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for s in &mine {
        let e = newest
            .entry(s.spec.pool.name.as_str())
            .or_insert(s.spec.pool.generation);
        *e = (*e).max(s.spec.pool.generation);
    }
    let mut out = SliceDevices::new();
    for s in mine {
        let pool = &s.spec.pool;
        if newest.get(pool.name.as_str()) != Some(&pool.generation) {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            let attr = |k: &str| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get(k))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default()
            };
            let cap = |k: &str| {
                d.capacity
                    .as_ref()
                    .and_then(|c| c.get(k))
                    .and_then(|c| capacity::parse(&c.value.0).ok())
                    .unwrap_or(0)
            };
            out.insert(
                (pool.name.clone(), d.name.clone()),
                SliceDevice {
                    uuid: attr(hami_protocol::dra::ATTR_UUID),
                    product: attr(hami_protocol::dra::ATTR_PRODUCT_NAME),
                    memory: cap(MEMORY),
                    compute_units: cap(COMPUTE_UNITS),
                },
            );
        }
    }
    out
}

/// Pod claim name → ResourceClaim object name (direct, or generated from a template).
fn claim_objects(pod: &Pod) -> BTreeMap<&str, &str> {
    let generated: BTreeMap<&str, &str> = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|s| Some((s.name.as_str(), s.resource_claim_name.as_deref()?)))
        .collect();
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| {
            let object = c
                .resource_claim_name
                .as_deref()
                .or_else(|| generated.get(c.name.as_str()).copied())?;
            Some((c.name.as_str(), object))
        })
        .collect()
}

/// The ResourceClaims (in the pod's namespace) the pod's containers use, sorted, once each:
/// what the shell fetches. Empty for a pod without DRA claims.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let mut names: BTreeSet<String> = claim_objects(pod)
        .into_values()
        .map(str::to_owned)
        .collect();
    if let Some(ext) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    {
        names.insert(ext.resource_claim_name.clone());
    }
    names.into_iter().collect()
}

/// One device of a claim's region: region device `i` is `devices[i]`, the claim's `i`-th
/// GPU on this node in result order, each GPU once (D-22).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionDevice {
    /// Its position in the owning container's devices; `None` when that container does
    /// not use this request of the claim.
    pub vdevice_index: Option<usize>,
    /// Registered device id (the slice's `uuid`; `<pool>/<device>` while unknown).
    pub uuid: String,
}

/// Whose a claim's region file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRegion {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container its usage is reported for: the first one (in device-list order)
    /// using the claim (a claim shared by containers has one region for all of them).
    pub container: String,
    /// Region device index → device.
    pub devices: Vec<RegionDevice>,
}

/// What a pod's claims grant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraPod {
    /// Container name → its devices, in the order of its claim references.
    pub containers: BTreeMap<String, ContainerDevices>,
    /// Device uuid → CU ranges the driver chose (claims on one device joined by `,`).
    pub cu_allocated: Vec<(String, String)>,
    /// Claim UID → whose its region is.
    pub regions: BTreeMap<String, ClaimRegion>,
    /// Problems, one line each (the claim is skipped).
    pub problems: Vec<String>,
    /// Claims whose `consumedCapacity` cannot be read, one line each: the driver refuses
    /// to prepare them, so they grant nothing here either (never the whole device).
    pub unreadable: Vec<String>,
    /// (pool, device) of our driver that no slice of this node names (yet).
    pub unknown_devices: BTreeSet<(String, String)>,
}

/// Why a claim's results cannot be counted: a `memory` or `computeUnits` consumed capacity
/// that is not a whole quantity. The driver reads them with the same parser and refuses
/// the whole claim (`hami_dra_core::prepare`, `PrepareError::Quantity`); a missing one is
/// an exclusive device, all of it.
fn unreadable_capacity(
    claim: &str,
    results: &[&k8s_openapi::api::resource::v1::DeviceRequestAllocationResult],
) -> Option<String> {
    results.iter().find_map(|r| {
        let consumed = r.consumed_capacity.as_ref()?;
        [MEMORY, COMPUTE_UNITS].into_iter().find_map(|key| {
            let value = consumed.get(key)?;
            let e = capacity::parse(&value.0).err()?;
            Some(format!(
                "claim {claim}: device {}: consumedCapacity.{key} {:?} cannot be read ({e}); the driver refuses to prepare this claim, so it is reported as holding nothing",
                r.device, value.0
            ))
        })
    })
}

/// Whether an allocation result's request (`req` or `req/subrequest`) is `wanted`.
fn request_matches(result: &str, wanted: &str) -> bool {
    result == wanted
        || result
            .strip_prefix(wanted)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The DRA view of `pod`: `claims` are the fetched claims of [`claim_names`] by name; only
/// results of `driver` on pool `node` count, and only claims reserved for this pod.
pub fn dra_pod(
    pod: &Pod,
    claims: &HashMap<String, ResourceClaim>,
    driver: &str,
    node: &str,
    slices: &SliceDevices,
) -> DraPod {
    let mut out = DraPod::default();
    let (Some(uid), Some(spec)) = (pod.metadata.uid.as_deref(), pod.spec.as_ref()) else {
        return out;
    };
    let objects = claim_objects(pod);
    let ext = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref());
    let mut cu_seen: BTreeSet<(String, usize)> = BTreeSet::new();
    let mut cu: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    for slot in container_slots(spec) {
        let c = slot.container;
        // (claim object, request filter) in reference order.
        let mut refs: Vec<(&str, Option<&str>)> = c
            .resources
            .iter()
            .flat_map(|r| r.claims.iter().flatten())
            .filter_map(|r| Some((*objects.get(r.name.as_str())?, r.request.as_deref())))
            .collect();
        if let Some(ext) = ext {
            refs.extend(
                ext.request_mappings
                    .iter()
                    .filter(|m| m.container_name == c.name)
                    .map(|m| {
                        (
                            ext.resource_claim_name.as_str(),
                            Some(m.request_name.as_str()),
                        )
                    }),
            );
        }
        for (name, wanted) in refs {
            let Some(claim) = claims.get(name) else {
                continue;
            };
            let Some(claim_uid) = claim.metadata.uid.clone() else {
                continue;
            };
            let status = claim.status.as_ref();
            let reserved = status
                .into_iter()
                .flat_map(|s| s.reserved_for.iter().flatten())
                .any(|r| r.resource == "pods" && r.uid == uid);
            let results: Vec<_> = status
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .filter(|r| r.driver == driver && r.pool == node)
                .collect();
            if results.is_empty() {
                continue;
            }
            if !reserved {
                // Logged once per claim, however many containers name it.
                if reported.insert(name) {
                    out.problems.push(format!(
                        "claim {name} is not reserved for pod {uid}; its devices are not reported for this pod"
                    ));
                }
                continue;
            }
            if let Some(why) = unreadable_capacity(name, &results) {
                if reported.insert(name) {
                    out.unreadable.push(why);
                }
                continue;
            }
            let owner = !out.regions.contains_key(&claim_uid);
            let list = out.containers.entry(c.name.clone()).or_default();
            // One region device per GPU of the claim, in first-seen order, as the driver
            // prepares them (D-22: shares of one GPU in one claim are one device with their
            // memory summed and CUs joined); `merged` is each GPU's (list index, bytes).
            let mut region: Vec<RegionDevice> = Vec::with_capacity(results.len());
            let mut gpus: Vec<&str> = Vec::new();
            let mut merged: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
            for (i, r) in results.iter().enumerate() {
                let key = (r.pool.clone(), r.device.clone());
                let known = slices.get(&key);
                if known.is_none() {
                    out.unknown_devices.insert(key);
                }
                let uuid =
                    known.map_or_else(|| format!("{}/{}", r.pool, r.device), |d| d.uuid.clone());
                let gpu = gpus.iter().position(|g| *g == r.device).unwrap_or_else(|| {
                    gpus.push(&r.device);
                    region.push(RegionDevice {
                        vdevice_index: None,
                        uuid: uuid.clone(),
                    });
                    gpus.len() - 1
                });
                let selected = wanted.is_none_or(|w| request_matches(&r.request, w));
                if selected {
                    let consumed = |k: &str, full: u64| {
                        r.consumed_capacity
                            .as_ref()
                            .and_then(|c| c.get(k))
                            .and_then(|q| capacity::parse(&q.0).ok())
                            .unwrap_or(full)
                    };
                    let full = known.map_or(0, |d| d.memory);
                    let bytes = consumed(MEMORY, full);
                    let cores = u32::try_from(consumed(
                        COMPUTE_UNITS,
                        known.map_or(0, |d| d.compute_units),
                    ))
                    .unwrap_or(u32::MAX);
                    let at = match merged.get_mut(r.device.as_str()) {
                        // Another share of a GPU this container already has from this claim.
                        Some((at, sum)) => {
                            *sum = sum.saturating_add(bytes);
                            let sum = if full > 0 { (*sum).min(full) } else { *sum };
                            list[*at].mem_mib = sum >> 20;
                            list[*at].cores = list[*at].cores.saturating_add(cores);
                            *at
                        }
                        None => {
                            merged.insert(&r.device, (list.len(), bytes));
                            list.push(ContainerDevice {
                                uuid: uuid.clone(),
                                device_type: known.map(|d| d.product.clone()).unwrap_or_default(),
                                mem_mib: bytes >> 20,
                                cores,
                            });
                            list.len() - 1
                        }
                    };
                    if owner {
                        region[gpu].vdevice_index = Some(at);
                    }
                    let ranges = status
                        .into_iter()
                        .flat_map(|s| s.devices.iter().flatten())
                        .find(|d| {
                            d.driver == r.driver
                                && d.pool == r.pool
                                && d.device == r.device
                                && d.share_id == r.share_id
                        })
                        .and_then(|d| d.data.as_ref())
                        .and_then(|raw| raw.0.get(CU_RANGES))
                        .and_then(|v| v.as_str())
                        .filter(|s| !s.is_empty());
                    if let Some(ranges) = ranges
                        && cu_seen.insert((claim_uid.clone(), i))
                    {
                        cu.entry(uuid.clone()).or_default().push(ranges.to_owned());
                    }
                }
            }
            if owner {
                out.regions.insert(
                    claim_uid,
                    ClaimRegion {
                        pod_uid: uid.to_owned(),
                        container: c.name.clone(),
                        devices: region,
                    },
                );
            }
        }
    }
    out.cu_allocated = cu.into_iter().map(|(u, r)| (u, r.join(","))).collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn claim(
        name: &str,
        uid: &str,
        pod_uid: &str,
        results: Value,
        devices: Value,
    ) -> ResourceClaim {
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
}
