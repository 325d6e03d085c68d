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
use k8s_openapi::api::resource::v1::ResourceClaim;

use hami_protocol::dra::{COMPUTE_UNITS, CU_RANGES, MEMORY};

/// The DRA driver whose claims the monitor reads by default.
pub const DEFAULT_DRIVER: &str = hami_protocol::dra::DRIVER;

// This node's devices from the driver's slices (`dra_slices.rs`); these paths stay.
pub use crate::dra_slices::{SliceDevice, SliceDevices, slice_devices};

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
mod tests;
