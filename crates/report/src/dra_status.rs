//! Per DRA node and device: who holds which share, and what is free (`hami status`, issue 20).
//! Read from the cluster's own objects: the driver's ResourceSlices (what each device
//! offers: `memory`, `computeUnits`, `shares`) and the allocated ResourceClaims (what each
//! result consumed, which pods reserved the claim, and the CU ranges the driver chose and
//! wrote to `status.devices`). No node lock or annotation is involved in DRA mode, so these
//! objects are the whole truth.

use std::collections::BTreeMap;

use hami_protocol::capacity;
use hami_protocol::dra::{COMPUTE_UNITS, CU_RANGES, MEMORY, MEMORY_BYTES, SHARES};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Serialize;

/// One node's devices of one DRA driver.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraNode {
    /// The node (the slices' `spec.nodeName`).
    pub name: String,
    /// Its devices, by pool then device name.
    pub devices: Vec<DraDevice>,
    /// Slices or claims that could not be read, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// One published device and its shares.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraDevice {
    /// `<pool>/<device>`.
    pub name: String,
    /// The `uuid` attribute (the AMD SMI UUID the device plugin would register).
    pub uuid: String,
    /// The `productName` attribute.
    pub product: String,
    /// Tainted (unhealthy) devices take no new claims.
    pub tainted: bool,
    /// Capacity in bytes, CUs and shares (0 when not published).
    pub memory_bytes: u64,
    /// CUs published.
    pub compute_units: u64,
    /// Shares published.
    pub shares: u64,
    /// What the allocated claims consume of each (all of it for a device allocated whole,
    /// a hard partition).
    pub memory_used_bytes: u64,
    /// CUs consumed.
    pub compute_units_used: u64,
    /// Shares consumed (one per allocation result).
    pub shares_used: u64,
    /// One entry per allocation result on this device.
    pub holders: Vec<DraHolder>,
}

/// One claim's share of a device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraHolder {
    /// `namespace/claim` (and the request name after `:`).
    pub claim: String,
    /// The pods reserving the claim, `namespace/name`, sorted; empty before a pod reserved it.
    pub pods: Vec<String>,
    /// Bytes consumed.
    pub memory_bytes: u64,
    /// CUs consumed.
    pub compute_units: u64,
    /// The CU ranges the driver chose at prepare (`status.devices[].data.cuRanges`); empty
    /// until a kubelet prepared the claim.
    pub cu_ranges: String,
    /// The memory limit the driver applied at prepare (`status.devices[].data.memoryBytes`);
    /// `None` until a kubelet prepared the claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
}

/// One share a pod holds: the node, the device and the claim's result on it.
#[derive(Debug, Clone, Copy)]
pub struct PodShare<'a> {
    /// The DRA node.
    pub node: &'a DraNode,
    /// The device.
    pub device: &'a DraDevice,
    /// The claim's result on it.
    pub holder: &'a DraHolder,
}

/// The shares of `pod` (`namespace/name`) among [`build`]'s nodes: each result of a claim
/// reserved for it, in node, device and claim order.
pub fn pod_shares<'a>(nodes: &'a [DraNode], pod: &str) -> Vec<PodShare<'a>> {
    let mut out = Vec::new();
    for node in nodes {
        for device in &node.devices {
            for holder in device
                .holders
                .iter()
                .filter(|h| h.pods.iter().any(|p| p == pod))
            {
                out.push(PodShare {
                    node,
                    device,
                    holder,
                });
            }
        }
    }
    out
}

/// Builds the DRA view of `driver`'s slices and the claims allocated from them (pure: the
/// shell lists, this decides). Nodes and devices come out sorted; a device's holders in
/// claim order.
pub fn build<'a, S, C>(driver: &str, slices: S, claims: C) -> Vec<DraNode>
where
    S: IntoIterator<Item = &'a ResourceSlice> + Clone,
    C: IntoIterator<Item = &'a ResourceClaim>,
{
    let mut nodes: BTreeMap<String, DraNode> = BTreeMap::new();
    // (pool, device) → (node, whether the device takes one allocation only)
    let mut index: BTreeMap<(String, String), (String, bool)> = BTreeMap::new();
    let mut newest: BTreeMap<String, i64> = BTreeMap::new();
    for slice in slices
        .clone()
        .into_iter()
        .filter(|s| s.spec.driver == driver)
    {
        let pool = &slice.spec.pool;
        let e = newest.entry(pool.name.clone()).or_insert(pool.generation);
        *e = (*e).max(pool.generation);
    }
    for slice in slices.into_iter().filter(|s| s.spec.driver == driver) {
        let pool = &slice.spec.pool;
        // Only a pool's newest generation counts, as for the scheduler.
        if newest.get(&pool.name) != Some(&pool.generation) {
            continue;
        }
        let node_name = slice.spec.node_name.clone().unwrap_or_default();
        let node = nodes.entry(node_name.clone()).or_insert_with(|| DraNode {
            name: node_name.clone(),
            devices: Vec::new(),
            problems: Vec::new(),
        });
        for device in slice.spec.devices.iter().flatten() {
            let attr = |k: &str| {
                device
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(k))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default()
            };
            let mut cap = |k: &str| {
                let Some(c) = device.capacity.as_ref().and_then(|c| c.get(k)) else {
                    return 0;
                };
                capacity::parse(&c.value.0).unwrap_or_else(|e| {
                    node.problems
                        .push(format!("{}/{}: capacity {k}: {e}", pool.name, device.name));
                    0
                })
            };
            let (memory_bytes, compute_units, shares) =
                (cap(MEMORY), cap(COMPUTE_UNITS), cap(SHARES));
            let exclusive = device.allow_multiple_allocations != Some(true);
            index.insert(
                (pool.name.clone(), device.name.clone()),
                (node_name.clone(), exclusive),
            );
            node.devices.push(DraDevice {
                name: format!("{}/{}", pool.name, device.name),
                uuid: attr(hami_protocol::dra::ATTR_UUID),
                product: attr(hami_protocol::dra::ATTR_PRODUCT_NAME),
                tainted: device.taints.as_ref().is_some_and(|t| !t.is_empty()),
                memory_bytes,
                compute_units,
                shares,
                memory_used_bytes: 0,
                compute_units_used: 0,
                shares_used: 0,
                holders: Vec::new(),
            });
        }
    }
    for claim in claims {
        let Some(status) = &claim.status else {
            continue;
        };
        let Some(results) = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
        else {
            continue;
        };
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut pods: Vec<String> = status
            .reserved_for
            .iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| format!("{ns}/{}", r.name))
            .collect();
        pods.sort();
        for result in results.iter().filter(|r| r.driver == driver) {
            let key = (result.pool.clone(), result.device.clone());
            let Some((node, exclusive)) = index
                .get(&key)
                .and_then(|(n, exclusive)| Some((nodes.get_mut(n)?, *exclusive)))
            else {
                continue;
            };
            let mut consumed = |k: &str| {
                result
                    .consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get(k))
                    .map(|q| {
                        capacity::parse(&q.0).unwrap_or_else(|e| {
                            node.problems
                                .push(format!("claim {ns}/{name}: consumed {k}: {e}"));
                            0
                        })
                    })
            };
            let (memory_bytes, compute_units) = (consumed(MEMORY), consumed(COMPUTE_UNITS));
            let data = status
                .devices
                .iter()
                .flatten()
                .find(|d| {
                    d.driver == driver
                        && d.pool == result.pool
                        && d.device == result.device
                        && d.share_id == result.share_id
                })
                .and_then(|d| d.data.as_ref());
            let cu_ranges = data
                .and_then(|raw| raw.0.get(CU_RANGES))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned();
            let memory_limit_bytes = data
                .and_then(|raw| raw.0.get(MEMORY_BYTES))
                .and_then(|v| v.as_u64());
            let device_name = format!("{}/{}", result.pool, result.device);
            let Some(device) = node.devices.iter_mut().find(|d| d.name == device_name) else {
                continue;
            };
            // A device without allowMultipleAllocations (a hard partition) is allocated
            // whole, and the API sets no consumedCapacity for it: its result holds all
            // of it, as the kube-scheduler and the monitor count it.
            let whole = |v: u64| if exclusive { v } else { 0 };
            let memory_bytes = memory_bytes.unwrap_or(whole(device.memory_bytes));
            let compute_units = compute_units.unwrap_or(whole(device.compute_units));
            // Claims' status is written by whoever may update it: a sum past u64 is
            // shown full and named, not wrapped to a small number (or a panic).
            for (used, amount, what) in [
                (&mut device.memory_used_bytes, memory_bytes, MEMORY),
                (&mut device.compute_units_used, compute_units, COMPUTE_UNITS),
            ] {
                *used = used.checked_add(amount).unwrap_or_else(|| {
                    node.problems.push(format!(
                        "{device_name}: consumed {what} adds up past {}",
                        u64::MAX
                    ));
                    u64::MAX
                });
            }
            device.shares_used += 1;
            device.holders.push(DraHolder {
                claim: format!("{ns}/{name}:{}", result.request),
                pods: pods.clone(),
                memory_bytes,
                compute_units,
                cu_ranges,
                memory_limit_bytes,
            });
        }
    }
    let mut out: Vec<DraNode> = nodes.into_values().collect();
    for node in &mut out {
        node.devices.sort_by(|a, b| a.name.cmp(&b.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(node: &str, generation: i64, devices: serde_json::Value) -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-amdgpu")},
            "spec": {
                "driver": "amdgpu.hami-rs.io", "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                "devices": devices,
            }
        }))
        .unwrap()
    }

    fn gpu(name: &str, uuid: &str, taints: serde_json::Value) -> serde_json::Value {
        json!({
            "name": name, "allowMultipleAllocations": true,
            "attributes": {"uuid": {"string": uuid}, "productName": {"string": "AMD Instinct MI210"}},
            "capacity": {"memory": {"value": "64Gi"}, "computeUnits": {"value": "104"}, "shares": {"value": "10"}},
            "taints": taints,
        })
    }

    fn claim(
        name: &str,
        results: serde_json::Value,
        reserved: &[&str],
        devices: serde_json::Value,
    ) -> ResourceClaim {
        let reserved: Vec<_> = reserved
            .iter()
            .map(|p| json!({"resource": "pods", "name": p, "uid": format!("uid-{p}")}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "amdgpu.hami-rs.io"}}]}},
            "status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": reserved,
                "devices": devices,
            }
        }))
        .unwrap()
    }

    #[test]
    fn shares_add_up_per_device_with_their_pods_and_cu_ranges() {
        let slices = [
            slice(
                "n1",
                1,
                json!([
                    gpu("gpu-0", "U0", json!([])),
                    gpu(
                        "gpu-1",
                        "U1",
                        json!([{"key": "unhealthy", "effect": "NoSchedule"}])
                    )
                ]),
            ),
            // An older generation of the same pool: ignored.
            slice("n1", 0, json!([gpu("gpu-7", "old", json!([]))])),
            slice("n2", 3, json!([gpu("gpu-0", "V0", json!([]))])),
        ];
        let result = |device: &str, share: &str, mem: &str, cus: &str| {
            json!({"request": "gpu", "driver": "amdgpu.hami-rs.io", "pool": "n1", "device": device,
                   "shareID": share, "consumedCapacity": {"memory": mem, "computeUnits": cus, "shares": "1"}})
        };
        let claims = [
            claim(
                "a",
                json!([result("gpu-0", "s1", "16Gi", "26")]),
                &["pod-a"],
                json!([{"driver": "amdgpu.hami-rs.io", "pool": "n1", "device": "gpu-0", "shareID": "s1",
                        "data": {"cuRanges": "0-25", "memoryBytes": 17179869184u64}}]),
            ),
            // Allocated, not prepared yet: no CU ranges, no pod.
            claim(
                "b",
                json!([result("gpu-0", "s2", "8Gi", "26")]),
                &[],
                json!([]),
            ),
            // Another driver's result on a device name we also use: not ours.
            claim(
                "c",
                json!([{"request": "gpu", "driver": "gpu.amd.com", "pool": "n1", "device": "gpu-0"}]),
                &["pod-c"],
                json!([]),
            ),
        ];
        let nodes = build("amdgpu.hami-rs.io", &slices, &claims);
        assert_eq!(
            nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["n1", "n2"]
        );
        let n1 = &nodes[0];
        assert_eq!(n1.devices.len(), 2, "{n1:?}");
        let g0 = &n1.devices[0];
        assert_eq!((g0.name.as_str(), g0.uuid.as_str()), ("n1/gpu-0", "U0"));
        assert_eq!(
            (g0.memory_bytes, g0.compute_units, g0.shares),
            (64 << 30, 104, 10)
        );
        assert_eq!(
            (g0.memory_used_bytes, g0.compute_units_used, g0.shares_used),
            (24 << 30, 52, 2)
        );
        assert_eq!(g0.holders[0].pods, ["ml/pod-a"]);
        assert_eq!(g0.holders[0].cu_ranges, "0-25");
        assert_eq!(g0.holders[0].claim, "ml/a:gpu");
        assert_eq!(g0.holders[0].memory_limit_bytes, Some(16 << 30));
        assert!(g0.holders[1].pods.is_empty() && g0.holders[1].cu_ranges.is_empty());
        assert_eq!(g0.holders[1].memory_limit_bytes, None);
        // A pod's shares: only the claims reserved for it.
        let shares = pod_shares(&nodes, "ml/pod-a");
        assert_eq!(shares.len(), 1);
        assert_eq!(
            (shares[0].node.name.as_str(), shares[0].device.uuid.as_str()),
            ("n1", "U0")
        );
        assert_eq!(shares[0].holder.compute_units, 26);
        assert!(pod_shares(&nodes, "ml/pod-c").is_empty());
        assert!(n1.devices[1].tainted && !g0.tainted);
        assert!(n1.problems.is_empty());
        assert_eq!(nodes[1].devices[0].shares_used, 0);
    }

    #[test]
    fn consumed_sums_past_u64_are_full_and_named() {
        let result = |share: &str| {
            json!([{"request": "gpu", "driver": "amdgpu.hami-rs.io", "pool": "n1", "device": "gpu-0",
                    "shareID": share, "consumedCapacity": {"memory": "10Ei", "computeUnits": "10E"}}])
        };
        let share = |i: u8| format!("00000000-0000-0000-0000-00000000000{i}");
        let claims = [
            claim("a", result(&share(1)), &[], json!([])),
            claim("b", result(&share(2)), &[], json!([])),
        ];
        let slices = [slice("n1", 1, json!([gpu("gpu-0", "U0", json!([]))]))];
        let nodes = build("amdgpu.hami-rs.io", &slices, &claims);
        let device = &nodes[0].devices[0];
        assert_eq!(device.memory_used_bytes, u64::MAX);
        assert_eq!(device.compute_units_used, u64::MAX);
        assert_eq!(device.holders[1].memory_bytes, 10 << 60);
        assert_eq!(
            nodes[0].problems,
            [
                "n1/gpu-0: consumed memory adds up past 18446744073709551615",
                "n1/gpu-0: consumed computeUnits adds up past 18446744073709551615"
            ]
        );
    }

    #[test]
    fn a_hard_partition_is_held_whole() {
        // A partition (shares 1, no allowMultipleAllocations) and its claim's result, which
        // the API gives no consumedCapacity.
        let mut part = gpu("gpu-0-cpx-0", "P0", json!([]));
        part["allowMultipleAllocations"] = json!(false);
        part["capacity"] = json!({"memory": {"value": "24Gi"}, "computeUnits": {"value": "38"},
            "shares": {"value": "1"}});
        let mut free = part.clone();
        free["name"] = json!("gpu-0-cpx-1");
        let slices = [slice("n1", 1, json!([part, free]))];
        let claims = [claim(
            "a",
            json!([{"request": "gpu", "driver": "amdgpu.hami-rs.io", "pool": "n1",
                    "device": "gpu-0-cpx-0"}]),
            &["pod-a"],
            json!([]),
        )];
        let nodes = build("amdgpu.hami-rs.io", &slices, &claims);
        let [held, free] = &nodes[0].devices[..] else {
            panic!("{nodes:?}")
        };
        assert_eq!(
            (
                held.memory_used_bytes,
                held.compute_units_used,
                held.shares_used
            ),
            (24 << 30, 38, 1)
        );
        assert_eq!(
            (held.holders[0].memory_bytes, held.holders[0].compute_units),
            (24 << 30, 38)
        );
        assert_eq!((free.memory_used_bytes, free.shares_used), (0, 0));
        assert!(nodes[0].problems.is_empty());
    }

    #[test]
    fn unreadable_quantities_are_named_not_guessed() {
        let mut bad = gpu("gpu-0", "U0", json!([]));
        bad["capacity"]["memory"]["value"] = json!("1.5Gi");
        let nodes = build("amdgpu.hami-rs.io", &[slice("n1", 1, json!([bad]))], &[]);
        assert_eq!(nodes[0].devices[0].memory_bytes, 0);
        assert!(
            nodes[0].problems[0].contains("n1/gpu-0: capacity memory"),
            "{:?}",
            nodes[0].problems
        );
    }
}
