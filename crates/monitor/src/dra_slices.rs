//! DRA pods (issue 20), pure: this node's devices as the driver's ResourceSlices publish
//! them (the newest generation of each pool), by pool and device name: the `uuid`
//! attribute is the `device_uuid` label of a claim's device, the capacities its size.

use std::collections::BTreeMap;

use hami_protocol::capacity;
use hami_protocol::dra::{COMPUTE_UNITS, MEMORY};
use k8s_openapi::api::resource::v1::ResourceSlice;

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
