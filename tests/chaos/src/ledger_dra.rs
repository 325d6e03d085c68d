//! The DRA node's ledger: pure checks over the ResourceClaims, ResourceSlices and pods the
//! API server holds and the two checkpoints on the node (the driver's `checkpoint.json`, what
//! it prepared; kubelet-sim's `dra_manager_state`, what it asked to prepare). Quantities
//! and CU lists are decoded by `hami-protocol`, the checkpoints by their owners' types.
//!
//! - Capacity: per slice device, the allocated claims' `consumedCapacity` (memory,
//!   computeUnits, shares) sums to at most the device's capacity in the pool's newest slices;
//!   every allocation names a device the slices publish.
//! - CUs: the ranges the driver published in `status.devices` (`cuRanges`) of prepared claims
//!   reserved for a live pod are disjoint per device, within the device, as many as
//!   allocated and the ones its checkpoint holds; the checkpoint never holds one CU of a GPU
//!   twice. (A claim whose prepare failed after its status was written, say the driver was
//!   killed in between, shows ranges the driver does not hold; its retry writes them again.)
//! - Running pods: each claim of a Running DRA pod is allocated to the pod's node, reserved
//!   for it, prepared (in the driver's checkpoint), and what kubelet-sim started the
//!   container with (`HSA_CU_MASK`, memory limit) is what the driver published.
//! - Released (after the run): no claim, driver checkpoint entry or kubelet-sim checkpoint
//!   entry is left of a pod that is gone.

use std::collections::{BTreeMap, BTreeSet};

use hami_amdgpu_dra_plugin::checkpoint::Checkpoint;
use hami_kubelet_sim::dra_state::DraState;
use hami_kubelet_sim::records::{RECORD_ANNOTATION, envs_of};
use hami_protocol::capacity;
use hami_protocol::cu_list::{CuSet, HsaCuMask};
use hami_protocol::dra::{COMPUTE_UNITS, CU_RANGES, DRIVER, MEMORY, MEMORY_BYTES, SHARES};
use hami_protocol::memory_limit::parse_memory_limit;
use hami_protocol::names::env;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use crate::ledger::Violation;

/// The capacities the ledger sums, in the order it reports them.
const CAPACITIES: [&str; 3] = [MEMORY, COMPUTE_UNITS, SHARES];

fn claim_key(c: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or("default"),
        c.metadata.name.as_deref().unwrap_or("")
    )
}

fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

/// Whether the pod asks for ResourceClaims (the DRA path).
pub fn is_dra_pod(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

fn allocated(c: &ResourceClaim) -> bool {
    c.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

/// This driver's allocation results of the claim: (pool, device, consumedCapacity).
fn results(c: &ResourceClaim) -> Vec<(&str, &str, BTreeMap<&str, &str>)> {
    c.status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER)
        .map(|r| {
            let consumed = r
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.0.as_str()))
                .collect();
            (r.pool.as_str(), r.device.as_str(), consumed)
        })
        .collect()
}

/// This driver's `status.devices` of the claim: (pool, device, cuRanges, memoryBytes).
fn published(c: &ResourceClaim) -> Vec<(&str, &str, Option<&str>, Option<u64>)> {
    c.status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .into_iter()
        .flatten()
        .filter(|d| d.driver == DRIVER)
        .map(|d| {
            let data = d.data.as_ref().map(|x| &x.0);
            (
                d.pool.as_str(),
                d.device.as_str(),
                data.and_then(|v| v.get(CU_RANGES)).and_then(|v| v.as_str()),
                data.and_then(|v| v.get(MEMORY_BYTES))
                    .and_then(|v| v.as_u64()),
            )
        })
        .collect()
}

/// (pool, device) → capacity name → value, from each pool's newest-generation slices.
fn capacities(slices: &[ResourceSlice]) -> BTreeMap<(String, String), BTreeMap<String, u64>> {
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == DRIVER) {
        let g = newest.entry(s.spec.pool.name.as_str()).or_insert(i64::MIN);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut out = BTreeMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == DRIVER) {
        if newest.get(s.spec.pool.name.as_str()) != Some(&s.spec.pool.generation) {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            let caps = d
                .capacity
                .iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), capacity::parse(&v.value.0).ok()?)))
                .collect();
            out.insert((s.spec.pool.name.clone(), d.name.clone()), caps);
        }
    }
    out
}

/// What the claims allocated on one device consume, per capacity, and which claims they are.
type DeviceUse<'a> = (BTreeMap<&'a str, u64>, Vec<String>);

/// No slice device holds more than its capacity (see the module doc); allocations naming
/// devices no slice publishes are reported too.
pub fn check_capacity(claims: &[ResourceClaim], slices: &[ResourceSlice]) -> Vec<Violation> {
    let caps = capacities(slices);
    let mut out = Vec::new();
    // (pool, device) → (sums per capacity, claims)
    let mut used: BTreeMap<(String, String), DeviceUse> = BTreeMap::new();
    for c in claims.iter().filter(|c| allocated(c)) {
        for (pool, device, consumed) in results(c) {
            let key = (pool.to_owned(), device.to_owned());
            let Some(cap) = caps.get(&key) else {
                out.push(Violation::DraUnknownDevice {
                    claim: claim_key(c),
                    device: format!("{pool}/{device}"),
                });
                continue;
            };
            let slot = used.entry(key).or_default();
            slot.1.push(claim_key(c));
            for name in CAPACITIES {
                // No consumedCapacity: an exclusive allocation takes all of the device.
                let amount = match consumed.get(name) {
                    Some(text) => match capacity::parse(text) {
                        Ok(n) => n,
                        Err(e) => {
                            out.push(Violation::Undecodable {
                                pod: claim_key(c),
                                what: format!("consumedCapacity {name}: {e}"),
                            });
                            continue;
                        }
                    },
                    None => cap.get(name).copied().unwrap_or(0),
                };
                *slot.0.entry(name).or_default() += amount;
            }
        }
    }
    for ((pool, device), (sums, holders)) in used {
        let cap = &caps[&(pool.clone(), device.clone())];
        for (name, sum) in sums {
            let limit = cap.get(name).copied().unwrap_or(0);
            if sum > limit {
                out.push(Violation::DraOvercommit {
                    device: format!("{pool}/{device}"),
                    what: name,
                    used: sum,
                    capacity: limit,
                    claims: holders.clone(),
                });
            }
        }
    }
    out
}

/// Pods that hold their claims: present, not finished, not being deleted (by UID).
fn live_pods(pods: &[Pod]) -> BTreeMap<&str, &Pod> {
    pods.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ) && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect()
}

fn reserved_for(c: &ResourceClaim) -> impl Iterator<Item = &str> {
    c.status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.uid.as_str())
}

/// The CU ranges of live prepared claims are disjoint per device, within it, of the
/// allocated count and the checkpoint's; the checkpoint holds no CU twice (see the module
/// doc). `driver` must be read before `claims` and `pods` after them, so that a claim in
/// both is prepared and live at the claims' snapshot.
pub fn check_cus(
    pods: &[Pod],
    claims: &[ResourceClaim],
    slices: &[ResourceSlice],
    driver: &Checkpoint,
) -> Vec<Violation> {
    let caps = capacities(slices);
    let live = live_pods(pods);
    let mut out = Vec::new();
    let mut sets: BTreeMap<String, Vec<(String, CuSet)>> = BTreeMap::new();
    for c in claims.iter().filter(|c| allocated(c)) {
        let uid = c.metadata.uid.as_deref().unwrap_or("");
        let Some(entry) = driver.claims.get(uid) else {
            continue;
        };
        if !reserved_for(c).any(|u| live.contains_key(u)) {
            continue;
        }
        let allocated: BTreeMap<(&str, &str), BTreeMap<&str, &str>> = results(c)
            .into_iter()
            .map(|(p, d, consumed)| ((p, d), consumed))
            .collect();
        for (pool, device, ranges, _) in published(c) {
            let Some(text) = ranges else { continue };
            let devcore = caps
                .get(&(pool.to_owned(), device.to_owned()))
                .and_then(|m| m.get(COMPUTE_UNITS))
                .copied()
                .unwrap_or(u64::from(u32::MAX)) as u32;
            let set = match CuSet::parse(text, devcore) {
                Ok(s) => s,
                Err(e) => {
                    out.push(Violation::Undecodable {
                        pod: claim_key(c),
                        what: format!("status.devices {pool}/{device} {CU_RANGES} {text:?}: {e}"),
                    });
                    continue;
                }
            };
            let Some(consumed) = allocated.get(&(pool, device)) else {
                out.push(Violation::DraStatusMismatch {
                    claim: claim_key(c),
                    what: format!("status.devices names {pool}/{device}, which is not allocated"),
                });
                continue;
            };
            if let Some(n) = consumed
                .get(COMPUTE_UNITS)
                .and_then(|t| capacity::parse(t).ok())
                && n != set.len()
            {
                out.push(Violation::DraStatusMismatch {
                    claim: claim_key(c),
                    what: format!(
                        "{pool}/{device}: {CU_RANGES} {text} is {} CUs, {n} allocated",
                        set.len()
                    ),
                });
            }
            let held = entry
                .devices
                .iter()
                .find(|d| d.pool == pool && d.device == device)
                .map(|d| CuSet::parse(&d.cus, u32::MAX));
            if !matches!(&held, Some(Ok(h)) if *h == set) {
                out.push(Violation::DraStatusMismatch {
                    claim: claim_key(c),
                    what: format!(
                        "{pool}/{device}: published {CU_RANGES} {text}, the driver's checkpoint holds {:?}",
                        held.map(|h| h.map(|h| h.to_string()))
                    ),
                });
            }
            sets.entry(format!("{pool}/{device}"))
                .or_default()
                .push((claim_key(c), set));
        }
    }
    let mut held: BTreeMap<&str, Vec<(String, CuSet)>> = BTreeMap::new();
    for (uid, c) in &driver.claims {
        for d in &c.devices {
            // Empty: a whole device handed over without a mask (no other claim shares it).
            if let Ok(set) = CuSet::parse(&d.cus, u32::MAX) {
                held.entry(d.device_id.as_str())
                    .or_default()
                    .push((format!("{}/{} (uid {uid})", c.namespace, c.name), set));
            }
        }
    }
    for (gpu, v) in held {
        sets.entry(format!("{gpu} (driver checkpoint)"))
            .or_default()
            .extend(v);
    }
    for (device, v) in sets {
        for (i, (a, sa)) in v.iter().enumerate() {
            for (b, sb) in &v[i + 1..] {
                if sa.overlaps(sb) {
                    out.push(Violation::CuOverlap {
                        gpu: device.clone(),
                        a: a.clone(),
                        b: b.clone(),
                        common: sa.intersection(sb).to_string(),
                    });
                }
            }
        }
    }
    out
}

/// The claims of the pod (from its `status.resourceClaimStatuses`), by claim name; `None`
/// for an entry the claim controller has not recorded yet.
fn pod_claims<'a>(
    pod: &Pod,
    claims: &'a [ResourceClaim],
) -> Vec<(String, Option<&'a ResourceClaim>)> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .map(|entry| {
            let name = entry.resource_claim_name.clone().or_else(|| {
                pod.status
                    .as_ref()?
                    .resource_claim_statuses
                    .iter()
                    .flatten()
                    .find(|s| s.name == entry.name)?
                    .resource_claim_name
                    .clone()
            });
            let claim = name.as_deref().and_then(|n| {
                claims.iter().find(|c| {
                    c.metadata.name.as_deref() == Some(n)
                        && c.metadata.namespace.as_deref().unwrap_or("default") == ns
                })
            });
            (name.unwrap_or_else(|| entry.name.clone()), claim)
        })
        .collect()
}

/// The node a claim's allocation is for (`nodeSelector` `metadata.name In [node]`).
fn allocation_node(c: &ResourceClaim) -> Option<&str> {
    c.status
        .as_ref()?
        .allocation
        .as_ref()?
        .node_selector
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().map(String::as_str))
}

/// Every Running DRA pod's claims allocated to its node, reserved for it and prepared
/// (`prepared`: claim UIDs in the driver's checkpoint), and the container's env agrees with
/// the claim's published CUs and memory. Each violation comes with its pod's UID, so the
/// caller can drop those of pods that went away while the checkpoint was being read.
pub fn check_running(
    pods: &[Pod],
    claims: &[ResourceClaim],
    prepared: &BTreeSet<String>,
) -> Vec<(String, Violation)> {
    let mut out = Vec::new();
    for pod in pods.iter().filter(|p| {
        is_dra_pod(p)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && p.metadata.deletion_timestamp.is_none()
    }) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let mut bad = |what: String| {
            out.push((
                uid.clone(),
                Violation::DraNotPrepared {
                    pod: pod_key(pod),
                    what,
                },
            ))
        };
        let record = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECORD_ANNOTATION))
            .map(String::as_str)
            .unwrap_or("");
        for (name, claim) in pod_claims(pod, claims) {
            let Some(c) = claim else {
                bad(format!("Running, but its claim {name} does not exist"));
                continue;
            };
            if !allocated(c) {
                bad(format!("Running, but its claim {name} is not allocated"));
                continue;
            }
            if allocation_node(c) != node {
                bad(format!(
                    "Running on {node:?}, but its claim {name} is allocated for {:?}",
                    allocation_node(c)
                ));
            }
            if results(c).iter().any(|(pool, _, _)| Some(*pool) != node) {
                bad(format!("claim {name} holds devices of another node's pool"));
            }
            if !reserved_for(c).any(|u| u == uid) {
                bad(format!(
                    "Running, but its claim {name} is not reserved for it"
                ));
            }
            let claim_uid = c.metadata.uid.as_deref().unwrap_or("");
            if !prepared.contains(claim_uid) {
                bad(format!(
                    "Running, but its claim {name} (uid {claim_uid}) is not in the driver's checkpoint"
                ));
            }
            // What the container got: one device per claim here, so device 0 of the mask.
            let published = published(c);
            let Some(envs) = envs_of(record, "main") else {
                bad("Running, but kubelet-sim recorded nothing for its container".into());
                continue;
            };
            if let [(_, _, Some(ranges), bytes)] = published.as_slice() {
                let mask = envs
                    .get(env::HSA_CU_MASK)
                    .and_then(|v| v.as_str())
                    .map(HsaCuMask::parse);
                let want = CuSet::parse(ranges, u32::MAX);
                match (mask, want) {
                    (Some(Ok(m)), Ok(w)) if m.get(0) == Some(&w) => {}
                    (m, _) => bad(format!(
                        "HSA_CU_MASK {:?}, but claim {name} publishes {CU_RANGES} {ranges}",
                        m.map(|m| m.map(|m| m.to_string()))
                    )),
                }
                let limit_name = env::hip_device_memory_limit(0);
                let limit = envs
                    .get(&limit_name)
                    .and_then(|v| v.as_str())
                    .map(parse_memory_limit);
                match (limit, bytes) {
                    (Some(Ok(l)), Some(b)) if l == *b => {}
                    (l, b) => bad(format!(
                        "{limit_name} = {l:?} bytes, but claim {name} publishes {MEMORY_BYTES} {b:?}"
                    )),
                }
            }
        }
    }
    out
}

/// After the run: nothing left of pods that are gone (see the module doc). `kubelet` is
/// kubelet-sim's checkpoint, `driver` the driver's.
pub fn check_released(
    pods: &[Pod],
    claims: &[ResourceClaim],
    driver: &Checkpoint,
    kubelet: &DraState,
) -> Vec<Violation> {
    let live = live_pods(pods);
    let present: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let mut out = Vec::new();
    let mut live_claims: BTreeSet<&str> = BTreeSet::new();
    for c in claims {
        let owner = c
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Pod" && o.controller == Some(true));
        let held = reserved_for(c).any(|u| live.contains_key(u));
        if held {
            live_claims.insert(c.metadata.uid.as_deref().unwrap_or(""));
        }
        if let Some(o) = owner
            && !present.contains(o.uid.as_str())
        {
            out.push(Violation::DraLeftover {
                claim: claim_key(c),
                what: format!(
                    "its pod {} is gone, the claim is still there ({})",
                    o.name,
                    if allocated(c) {
                        "allocated"
                    } else {
                        "not allocated"
                    }
                ),
            });
        } else if allocated(c) && !held {
            out.push(Violation::DraLeftover {
                claim: claim_key(c),
                what: "allocated, but reserved for no live pod".into(),
            });
        }
    }
    for (uid, c) in &driver.claims {
        if !live_claims.contains(uid.as_str()) {
            out.push(Violation::DraLeftover {
                claim: format!("{}/{}", c.namespace, c.name),
                what: format!("still in the driver's checkpoint (uid {uid}) with no live pod"),
            });
        }
    }
    for (uid, c) in &kubelet.claims {
        if !live_claims.contains(uid.as_str()) {
            out.push(Violation::DraLeftover {
                claim: format!("{}/{}", c.namespace, c.name),
                what: format!("still in kubelet-sim's DRA checkpoint (uid {uid}) with no live pod"),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_amdgpu_dra_plugin::checkpoint::{PreparedClaim, PreparedDevice};
    use serde_json::json;

    fn slice() -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "n-slice"},
            "spec": {"driver": DRIVER, "nodeName": "n", "pool": {"name": "n", "generation": 2,
                "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "allowMultipleAllocations": true, "capacity": {
                    "memory": {"value": "64Gi"}, "computeUnits": {"value": "104"},
                    "shares": {"value": "3"}}}]}
        }))
        .unwrap()
    }

    fn claim(name: &str, pod_uid: &str, mem: &str, cus: u64, ranges: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_uid,
                    "uid": pod_uid, "controller": true}]},
            "spec": {"devices": {}},
            "status": {
                "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER,
                    "pool": "n", "device": "gpu-0", "shareID": format!("s-{name}"),
                    "consumedCapacity": {"memory": mem, "computeUnits": cus.to_string(), "shares": "1"}}]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}},
                "reservedFor": [{"resource": "pods", "name": pod_uid, "uid": pod_uid}],
                "devices": [{"driver": DRIVER, "pool": "n", "device": "gpu-0",
                    "data": {"cuRanges": ranges, "memoryBytes": capacity::parse(mem).unwrap()}}],
            }
        }))
        .unwrap()
    }

    fn pod(uid: &str, claim: &str, record: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid,
                "annotations": {RECORD_ANNOTATION: record.to_string()}},
            "spec": {"nodeName": "n", "resourceClaims": [{"name": "gpu",
                "resourceClaimTemplateName": "t"}], "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "resourceClaimStatuses": [
                {"name": "gpu", "resourceClaimName": claim}]}
        }))
        .unwrap()
    }

    fn record(mask: &str, limit: &str) -> serde_json::Value {
        json!({"main": [{"claim": "c", "envs": {"HSA_CU_MASK": mask,
            "HIP_DEVICE_MEMORY_LIMIT_0": limit}}]})
    }

    fn checkpoint(entries: &[(&str, &str)]) -> Checkpoint {
        let mut cp = Checkpoint::default();
        for (name, cus) in entries {
            cp.claims.insert(
                format!("u-{name}"),
                PreparedClaim {
                    namespace: "default".into(),
                    name: (*name).into(),
                    devices: vec![PreparedDevice {
                        pool: "n".into(),
                        device: "gpu-0".into(),
                        device_id: "G".into(),
                        cus: (*cus).into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            );
        }
        cp
    }

    #[test]
    fn disjoint_claims_that_fit_pass() {
        let claims = [
            claim("a", "pa", "16Gi", 40, "0-39"),
            claim("b", "pb", "48Gi", 64, "40-103"),
        ];
        let pods = [
            pod("pa", "a", record("0:0-39", "16384m")),
            pod("pb", "b", record("0:40-103", "49152m")),
        ];
        let cp = checkpoint(&[("a", "0-39"), ("b", "40-103")]);
        assert_eq!(check_capacity(&claims, &[slice()]), vec![]);
        assert_eq!(check_cus(&pods, &claims, &[slice()], &cp), vec![]);
        let prepared: BTreeSet<String> = cp.claims.keys().cloned().collect();
        assert_eq!(check_running(&pods, &claims, &prepared), vec![]);
        let mut kubelet = DraState::default();
        kubelet.claims.insert("u-a".into(), Default::default());
        assert_eq!(check_released(&pods, &claims, &cp, &kubelet), vec![]);
    }

    #[test]
    fn overcommit_overlap_and_unprepared_running_pods_are_caught() {
        let claims = [
            claim("a", "pa", "40Gi", 60, "0-59"),
            claim("b", "pb", "40Gi", 50, "50-99"),
            claim("c", "pc", "1Gi", 2, "100-101"),
            claim("d", "pd", "1Gi", 2, "102-103"),
        ];
        let text: Vec<String> = check_capacity(&claims, &[slice()])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            text.iter()
                .any(|t| t.contains("memory over-committed: 88046829568 > 68719476736")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("computeUnits over-committed: 114 > 104")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("shares over-committed: 4 > 3")),
            "{text:?}"
        );
        let pods = [
            pod("pa", "a", record("0:0-59", "40960m")),
            pod("pb", "b", record("0:0-49", "40960m")),
        ];
        let cp = checkpoint(&[("a", "0-59"), ("b", "50-99")]);
        let v: Vec<String> = check_cus(&pods, &claims, &[slice()], &cp)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            v.iter()
                .any(|t| t.contains("n/gpu-0") && t.contains("share CUs 50-59")),
            "{v:?}"
        );
        assert!(v.iter().any(|t| t.contains("driver checkpoint")), "{v:?}");
        // c and d are reserved for pods that are gone: their ranges do not count.
        assert_eq!(v.len(), 2, "{v:?}");
        let prepared = BTreeSet::from(["u-a".to_owned()]);
        let r: Vec<String> = check_running(&pods, &claims, &prepared)
            .iter()
            .map(|(_, v)| v.to_string())
            .collect();
        assert!(
            r.iter()
                .any(|t| t.contains("default/pb") && t.contains("not in the driver's checkpoint")),
            "{r:?}"
        );
        assert!(
            r.iter()
                .any(|t| t.contains("default/pb") && t.contains("HSA_CU_MASK")),
            "{r:?}"
        );
        assert_eq!(r.len(), 2, "{r:?}");
    }

    #[test]
    fn leftovers_of_gone_pods_are_caught() {
        let claims = [claim("a", "pa", "1Gi", 2, "0-1")];
        let cp = checkpoint(&[("a", "0-1"), ("z", "2-3")]);
        let mut kubelet = DraState::default();
        kubelet.claims.insert("u-z".into(), Default::default());
        let v: Vec<String> = check_released(&[], &claims, &cp, &kubelet)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            v.iter()
                .any(|t| t.contains("default/a") && t.contains("pod pa is gone")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|t| t.contains("uid u-a") && t.contains("driver's checkpoint")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|t| t.contains("uid u-z") && t.contains("kubelet-sim")),
            "{v:?}"
        );
        assert_eq!(v.len(), 4, "{v:?}");
    }

    #[test]
    fn an_allocation_of_an_unpublished_device_is_reported() {
        let v = check_capacity(&[claim("a", "pa", "1Gi", 2, "0-1")], &[]);
        assert!(
            matches!(&v[..], [Violation::DraUnknownDevice { .. }]),
            "{v:?}"
        );
    }
}
