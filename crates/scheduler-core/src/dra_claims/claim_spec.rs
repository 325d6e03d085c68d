//! One container's AMD request as a claim spec: an `exactly` request, or `firstAvailable`
//! sub-requests per device shape (smallest first, at most `MAX_FIRST_AVAILABLE`, the rest
//! said as left out), with the amounts each shape gives the request.

use std::collections::BTreeMap;

use hami_protocol::capacity::{format_bytes, format_count};
use hami_protocol::dra::{
    ATTR_NUMA_NODE, ATTR_UUID, ATTR_XGMI_HIVE, CLAIM_REQUEST, COMPUTE_UNITS, DRIVER, EXACT_COUNT,
    MAX_FIRST_AVAILABLE, MEMORY,
};
use hami_protocol::names::AMD;
use hami_protocol::requests::{DeviceRequest, MemoryRequest, amd_cu_count};
use hami_protocol::selection::DeviceSelector;
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClaim, DeviceConstraint, DeviceRequest as ClaimRequest,
    DeviceSubRequest, ExactDeviceRequest, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Shape;
use super::selectors::{cel, shape_selector, uuid_list};

/// What one (sub-)request asks of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Amounts {
    pub(super) memory_mib: Option<u64>,
    pub(super) compute_units: Option<u64>,
}

impl Amounts {
    fn capacity(&self) -> Option<CapacityRequirements> {
        let mut requests = BTreeMap::new();
        if let Some(mib) = self.memory_mib {
            requests.insert(
                MEMORY.to_owned(),
                Quantity(format_bytes(mib.saturating_mul(1 << 20))),
            );
        }
        if let Some(cus) = self.compute_units {
            requests.insert(COMPUTE_UNITS.to_owned(), Quantity(format_count(cus)));
        }
        (!requests.is_empty()).then_some(CapacityRequirements {
            requests: Some(requests),
        })
    }
}

/// The amounts of `request` on `shape`, or `None` when the shape cannot hold it.
pub(super) fn amounts_on(request: &DeviceRequest, shape: &Shape) -> Option<Amounts> {
    let devmem = shape.memory_mib();
    let memory_mib = match request.memory {
        MemoryRequest::Whole | MemoryRequest::Percent(100) => None,
        MemoryRequest::Mib(mib) if mib > devmem => return None,
        MemoryRequest::Mib(mib) => Some(mib),
        MemoryRequest::Percent(_) if devmem == 0 => return None,
        MemoryRequest::Percent(_) => Some(request.memory.resolve(devmem).max(1)),
    };
    let compute_units = if request.cores_percent >= 100 {
        None
    } else {
        let cus = u32::try_from(shape.compute_units).ok().filter(|c| *c > 0)?;
        // The policy's step is the WGP (2 on RDNA): whole WGPs, rounded up, as the device
        // plugin path charges (the allocator would round up to the step all the same).
        let wgp = u32::try_from(shape.cu_step).unwrap_or(1);
        match amd_cu_count(request.cores_percent, cus, wgp) {
            0 => return None, // not one whole WGP
            c => Some(u64::from(c)),
        }
    };
    Some(Amounts {
        memory_mib,
        compute_units,
    })
}

/// Whether the request's amounts depend on the device it lands on (or its type filter
/// needs the shapes' product names).
pub(super) fn needs_shapes(request: &DeviceRequest, selector: &DeviceSelector) -> bool {
    matches!(request.memory, MemoryRequest::Percent(p) if p < 100)
        || request.cores_percent < 100
        || !selector.use_types.is_empty()
        || !selector.nouse_types.is_empty()
}

fn describe(request: &DeviceRequest) -> String {
    let memory = match request.memory {
        MemoryRequest::Whole => "all memory".to_owned(),
        MemoryRequest::Mib(m) => format!("{m} MiB"),
        MemoryRequest::Percent(p) => format!("{p} % of the memory"),
    };
    format!(
        "{} GPU(s) with {memory} and {} % of the compute units",
        request.count, request.cores_percent
    )
}

fn largest(shapes: &[&Shape]) -> String {
    shapes
        .iter()
        .max_by_key(|s| (s.memory_bytes, s.compute_units))
        .map(|s| {
            format!(
                "{} with {} MiB and {} CUs",
                s.product_name,
                s.memory_mib(),
                s.compute_units
            )
        })
        .unwrap_or_else(|| "none".into())
}

/// One container's claim spec and the shapes the sub-request limit left out of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimChoice {
    /// The claim's spec.
    pub spec: ResourceClaimSpec,
    /// Shapes that can hold the request but are not listed (more than
    /// `MAX_FIRST_AVAILABLE` could), the smaller first.
    pub left_out: Vec<Shape>,
}

/// Of `subs` (distinct shapes that hold the request, smallest first, `devices` summed over
/// equal sub-requests), the ones a claim lists and the ones left out: all when they are at
/// most `MAX_FIRST_AVAILABLE`, else the `MAX_FIRST_AVAILABLE` with the most devices (ties:
/// the smaller), both still smallest first.
fn keep_most_devices<T>(subs: Vec<(Shape, T)>) -> (Vec<(Shape, T)>, Vec<Shape>) {
    if subs.len() <= MAX_FIRST_AVAILABLE {
        return (subs, Vec::new());
    }
    let mut rank: Vec<usize> = (0..subs.len()).collect();
    rank.sort_by_key(|&i| (std::cmp::Reverse(subs[i].0.devices), i));
    let kept: std::collections::BTreeSet<usize> =
        rank.into_iter().take(MAX_FIRST_AVAILABLE).collect();
    let mut keep = Vec::new();
    let mut left_out = Vec::new();
    for (i, sub) in subs.into_iter().enumerate() {
        if kept.contains(&i) {
            keep.push(sub);
        } else {
            left_out.push(sub.0);
        }
    }
    (keep, left_out)
}

/// The claim spec of one container's AMD request.
pub fn claim_spec(
    request: &DeviceRequest,
    selector: &DeviceSelector,
    shapes: &[Shape],
) -> Result<ClaimChoice, String> {
    let mut left_out = Vec::new();
    let mut common = Vec::new();
    if !selector.use_uuids.is_empty() {
        common.push(cel(uuid_list(&selector.use_uuids)));
    }
    if !selector.nouse_uuids.is_empty() {
        common.push(cel(format!("!({})", uuid_list(&selector.nouse_uuids))));
    }
    let count = i64::from(request.count);
    let exactly = |amounts: &Amounts, pin: Option<&Shape>| {
        let mut selectors = Vec::new();
        if let Some(shape) = pin {
            selectors.push(cel(shape_selector(shape)));
        }
        selectors.extend(common.iter().cloned());
        (selectors, amounts.capacity())
    };
    let device_request = if needs_shapes(request, selector) {
        if shapes.is_empty() {
            return Err(format!(
                "asks for {}: no ResourceSlice of {DRIVER} yet: percentages need the device size (so do {} and {}); retry once the DRA driver has published its devices, or ask for amd.com/gpumem in MiB without amd.com/gpucores",
                describe(request),
                AMD.use_gputype,
                AMD.nouse_gputype
            ));
        }
        let mut sorted: Vec<&Shape> = shapes.iter().collect();
        sorted.sort();
        let typed: Vec<&Shape> = sorted
            .into_iter()
            .filter(|s| selector.type_allowed(&s.product_name))
            .collect();
        if typed.is_empty() {
            let mut seen: Vec<&str> = shapes.iter().map(|s| s.product_name.as_str()).collect();
            seen.dedup();
            return Err(format!(
                "{} / {} leave no device: the devices are {}",
                AMD.use_gputype,
                AMD.nouse_gputype,
                seen.join(", ")
            ));
        }
        let mut subs: Vec<(Shape, Amounts)> = Vec::new();
        for shape in &typed {
            // Only shapes that can hold the request.
            let Some(amounts) = amounts_on(request, shape) else {
                continue;
            };
            // Shapes differing only in type, step or shares give the same sub-request.
            if let Some((same, _)) = subs.iter_mut().find(|(s, _)| {
                (&s.product_name, s.memory_bytes, s.compute_units)
                    == (&shape.product_name, shape.memory_bytes, shape.compute_units)
            }) {
                same.devices += shape.devices;
                continue;
            }
            subs.push(((*shape).clone(), amounts));
        }
        let (subs, dropped) = keep_most_devices(subs);
        left_out = dropped;
        match subs.as_slice() {
            [] => {
                return Err(format!(
                    "asks for {}, more than any device holds: the largest is {}",
                    describe(request),
                    largest(&typed)
                ));
            }
            [(shape, amounts)] => {
                let (selectors, capacity) = exactly(amounts, Some(shape));
                ClaimRequest {
                    name: CLAIM_REQUEST.to_owned(),
                    exactly: Some(ExactDeviceRequest {
                        allocation_mode: Some(EXACT_COUNT.to_owned()),
                        count: Some(count),
                        device_class_name: DRIVER.to_owned(),
                        selectors: Some(selectors),
                        capacity,
                        ..Default::default()
                    }),
                    first_available: None,
                }
            }
            many => ClaimRequest {
                name: CLAIM_REQUEST.to_owned(),
                exactly: None,
                first_available: Some(
                    many.iter()
                        .enumerate()
                        .map(|(i, (shape, amounts))| {
                            let (selectors, capacity) = exactly(amounts, Some(shape));
                            DeviceSubRequest {
                                name: format!("shape-{i}"),
                                allocation_mode: Some(EXACT_COUNT.to_owned()),
                                count: Some(count),
                                device_class_name: DRIVER.to_owned(),
                                selectors: Some(selectors),
                                capacity,
                                tolerations: None,
                            }
                        })
                        .collect(),
                ),
            },
        }
    } else {
        let memory_mib = match request.memory {
            MemoryRequest::Mib(m) => Some(m),
            _ => None,
        };
        if let Some(mib) = memory_mib
            && !shapes.is_empty()
            && shapes.iter().all(|s| mib > s.memory_mib())
        {
            let all: Vec<&Shape> = shapes.iter().collect();
            return Err(format!(
                "asks for {}, more than any device holds: the largest is {}",
                describe(request),
                largest(&all)
            ));
        }
        let (selectors, capacity) = exactly(
            &Amounts {
                memory_mib,
                compute_units: None,
            },
            None,
        );
        ClaimRequest {
            name: CLAIM_REQUEST.to_owned(),
            exactly: Some(ExactDeviceRequest {
                allocation_mode: Some(EXACT_COUNT.to_owned()),
                count: Some(count),
                device_class_name: DRIVER.to_owned(),
                selectors: (!selectors.is_empty()).then_some(selectors),
                capacity,
                ..Default::default()
            }),
            first_available: None,
        }
    };
    let mut constraints = Vec::new();
    if request.count > 1 {
        let over = |distinct: Option<String>, matching: Option<String>| DeviceConstraint {
            distinct_attribute: distinct,
            match_attribute: matching,
            requests: Some(vec![CLAIM_REQUEST.to_owned()]),
        };
        // Distinct GPUs, as the device plugin gives a multi-GPU container.
        constraints.push(over(Some(format!("{DRIVER}/{ATTR_UUID}")), None));
        if selector.numa_bind {
            constraints.push(over(None, Some(ATTR_NUMA_NODE.to_owned())));
        }
        if selector.link_bind {
            constraints.push(over(None, Some(format!("{DRIVER}/{ATTR_XGMI_HIVE}"))));
        }
    }
    Ok(ClaimChoice {
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![device_request]),
                constraints: (!constraints.is_empty()).then_some(constraints),
                config: None,
            }),
        },
        left_out,
    })
}
