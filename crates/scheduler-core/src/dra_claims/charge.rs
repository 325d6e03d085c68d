//! What a container's claim costs its namespace's quota (issue 30, DRA mode): per device,
//! the MiB and the share of the GPU's compute units it asks for on the smallest shape it
//! can land on — the claim's `firstAvailable` order tries that shape first, and the
//! device-plugin path's admission check uses the same "smallest GPU it could get" rule.

use hami_protocol::requests::{DeviceRequest, MemoryRequest};
use hami_protocol::selection::DeviceSelector;

use super::Shape;
use super::claim_spec::amounts_on;

/// Per device: `(MiB, percent of the GPU's compute)` the claim of `request` takes on the
/// smallest of `shapes` it may land on (type-allowed, able to hold it, not left out of the
/// claim). Without such a shape (no slices yet): a MiB ask as written, every CU for a
/// request without `gpucores` (100), and 0 for what only a device size can tell.
pub fn per_device_charge(
    request: &DeviceRequest,
    selector: &DeviceSelector,
    shapes: &[Shape],
    left_out: &[Shape],
) -> (u64, u64) {
    let key = |s: &Shape| (s.product_name.clone(), s.memory_bytes, s.compute_units);
    let candidates: Vec<(u64, u64)> = shapes
        .iter()
        .filter(|s| selector.type_allowed(&s.product_name))
        .filter(|s| !left_out.iter().any(|l| key(l) == key(s)))
        .filter_map(|s| {
            let a = amounts_on(request, s)?;
            let mib = a.memory_mib.unwrap_or_else(|| s.memory_mib());
            // A claim without computeUnits gets every CU (the driver's policy default).
            let cores = match (a.compute_units, s.compute_units) {
                (Some(cus), total) if total > 0 => cus.saturating_mul(100).div_ceil(total),
                _ => 100,
            };
            Some((mib, cores))
        })
        .collect();
    let mib = candidates.iter().map(|c| c.0).min();
    let cores = candidates.iter().map(|c| c.1).min();
    let fallback_mib = match request.memory {
        MemoryRequest::Mib(m) => m,
        _ => 0,
    };
    let fallback_cores = if request.cores_percent >= 100 { 100 } else { 0 };
    (mib.unwrap_or(fallback_mib), cores.unwrap_or(fallback_cores))
}
