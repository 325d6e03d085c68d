//! The device shapes of the AMD DRA driver's ResourceSlices (product name, memory,
//! compute units), each with its number of devices: what a percentage is a percentage of.

use hami_protocol::dra::{ATTR_PRODUCT_NAME, ATTR_TYPE, COMPUTE_UNITS, DRIVER, MEMORY, SHARES};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

/// One device shape of this driver's ResourceSlices. The derived order is the order
/// sub-requests are tried in, smallest first: memory, then compute units, then product
/// name, ascending.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape {
    /// The `memory` capacity, bytes.
    pub memory_bytes: u64,
    /// The `computeUnits` capacity.
    pub compute_units: u64,
    /// The `productName` attribute.
    pub product_name: String,
    /// The `computeUnits` request policy's step (1 without one).
    pub cu_step: u64,
    /// The `shares` capacity (1 without one).
    pub shares: u64,
    /// The `type` attribute (`amdgpu-slice`, `amdgpu-partition`).
    pub device_type: String,
    /// How many devices of this shape the slices publish (every node): which shapes a claim
    /// keeps when more can hold a request than it may list.
    pub devices: u64,
}

impl Shape {
    /// Memory in whole MiB.
    pub fn memory_mib(&self) -> u64 {
        self.memory_bytes >> 20
    }
}

/// An attribute by its short name in the driver's domain (or fully qualified).
fn string_attribute<'a>(device: &'a Device, name: &str) -> Option<&'a str> {
    let attributes = device.attributes.as_ref()?;
    attributes
        .get(name)
        .or_else(|| attributes.get(&format!("{DRIVER}/{name}")))
        .and_then(|a| a.string.as_deref())
}

fn capacity(device: &Device, name: &str) -> Option<u64> {
    let c = device.capacity.as_ref()?.get(name)?;
    hami_protocol::capacity::parse(&c.value.0).ok()
}

/// The distinct device shapes of this driver's slices (other drivers' are ignored), sorted,
/// each with its number of devices. Tainted devices count (the allocator skips them, the
/// shape still exists); a device without a product name, memory or compute units cannot be
/// sized and is left out.
pub fn shapes<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>) -> Vec<Shape> {
    let mut out: Vec<Shape> = slices
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| {
            let step = d
                .capacity
                .as_ref()?
                .get(COMPUTE_UNITS)?
                .request_policy
                .as_ref()
                .and_then(|p| p.valid_range.as_ref())
                .and_then(|r| r.step.as_ref())
                .and_then(|q| hami_protocol::capacity::parse(&q.0).ok())
                .unwrap_or(1);
            Some(Shape {
                product_name: string_attribute(d, ATTR_PRODUCT_NAME)?.to_owned(),
                memory_bytes: capacity(d, MEMORY)?,
                compute_units: capacity(d, COMPUTE_UNITS)?,
                cu_step: step.max(1),
                shares: capacity(d, SHARES).unwrap_or(1),
                device_type: string_attribute(d, ATTR_TYPE)
                    .unwrap_or_default()
                    .to_owned(),
                devices: 1,
            })
        })
        .collect();
    out.sort();
    // Equal shapes are adjacent (`devices` orders last): one entry, their devices summed.
    out.dedup_by(|later, kept| {
        let same = Shape {
            devices: kept.devices,
            ..later.clone()
        } == *kept;
        if same {
            kept.devices += later.devices;
        }
        same
    });
    out
}
