//! The webhook's DRA mode (issue 20, Deliver item 3) as pure functions: a pod's HAMi AMD
//! request (`amd.com/gpu|gpumem|gpumem-percentage|gpucores` and the `amd.com/*` steering
//! annotations, already parsed and defaulted by `hami_protocol::requests`) becomes, per
//! container, a ResourceClaimTemplate spec for the AMD DRA driver plus the pod patch that
//! points the container at it.
//!
//! Percentages need the device's size, so each claim is written per device *shape* (the
//! distinct product name, memory and compute units among this driver's ResourceSlices):
//! one shape is an `exactly` request pinned to it, several are `firstAvailable`
//! sub-requests, smallest fitting device first (binpack by shape: memory, then compute
//! units, then product name). Only shapes that can hold the request are listed (a device
//! whose memory is below the request's is left out). A claim lists at most 8 sub-requests
//! (`MAX_FIRST_AVAILABLE`, kube-scheduler's limit): when more shapes can hold the request,
//! the 8 with the most devices in the cluster are kept (ties: the smaller first), still
//! smallest first, and the claim says which it left out ([`ContainerClaim::warnings`], the
//! admission response's warnings, which kubectl prints) — never silently. Amounts follow SPEC §1
//! and §2.2: memory `gpumem` MiB, or `floor(devmem × pct / 100)` MiB; compute units
//! `floor(pct × cus / 100)` clamped to `[1, cus]`, on RDNA (policy step 2) rounded up to
//! whole WGPs (`amd_cu_count`, the device plugin path's charge); `gpucores` absent or 100 leaves compute units to the policy default (all of them:
//! a memory-only request reserves every CU). A request that depends on no device size (a
//! count, a fixed `gpumem`, no type filter) is one unpinned `exactly` request.
//!
//! Templates are content-addressed (`hami-amd-<16 hex of the spec's hash>`): identical
//! requests share one, and a template of that name with another spec is never overwritten.
//! `hami.io/gpu-scheduler-policy` and `hami.io/node-scheduler-policy` have no claim form
//! (kube-scheduler's own scoring places DRA pods); they are ignored in this mode.

use std::collections::BTreeMap;

use hami_protocol::capacity::{format_bytes, format_count};
use hami_protocol::dra::{
    AMD_MODE_ANNOTATION, AMD_MODE_DEVICE_PLUGIN, AMD_MODE_DRA, ATTR_NUMA_NODE, ATTR_PRODUCT_NAME,
    ATTR_TYPE, ATTR_UUID, ATTR_XGMI_HIVE, CLAIM_PREFIX, CLAIM_REQUEST, COMPUTE_UNITS, DRIVER,
    EXACT_COUNT, MANAGED_BY_LABEL, MANAGED_BY_WEBHOOK, MAX_FIRST_AVAILABLE, MEMORY, SHARES,
};
use hami_protocol::names::{AMD, Vendor};
use hami_protocol::requests::{
    ContainerKind, ContainerRequest, DeviceRequest, MemoryRequest, amd_cu_count, container_slots,
};
use hami_protocol::selection::DeviceSelector;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, Device, DeviceClaim, DeviceConstraint,
    DeviceRequest as ClaimRequest, DeviceSelector as ClaimSelector, DeviceSubRequest,
    ExactDeviceRequest, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

/// Which front end serves a pod's AMD requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AmdMode {
    /// The device plugin and the extender (today's behaviour).
    #[default]
    DevicePlugin,
    /// ResourceClaims for the AMD DRA driver.
    Dra,
}

impl AmdMode {
    /// Reads `device-plugin` or `dra`.
    pub fn parse(value: &str) -> Result<AmdMode, String> {
        match value {
            AMD_MODE_DEVICE_PLUGIN => Ok(AmdMode::DevicePlugin),
            AMD_MODE_DRA => Ok(AmdMode::Dra),
            other => Err(format!(
                "{other:?} is not an AMD mode: write {AMD_MODE_DEVICE_PLUGIN} or {AMD_MODE_DRA}"
            )),
        }
    }

    /// The spelling of [`AmdMode::parse`].
    pub const fn as_str(self) -> &'static str {
        match self {
            AmdMode::DevicePlugin => AMD_MODE_DEVICE_PLUGIN,
            AmdMode::Dra => AMD_MODE_DRA,
        }
    }

    /// The pod's mode: its `hami.io/amd-mode` annotation, else `default`.
    pub fn of_pod(pod: &Pod, default: AmdMode) -> Result<AmdMode, String> {
        match pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(AMD_MODE_ANNOTATION))
        {
            None => Ok(default),
            Some(v) => AmdMode::parse(v)
                .map_err(|e| format!("metadata.annotations[{AMD_MODE_ANNOTATION}]: {e}")),
        }
    }
}

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

/// One container's claim: the template to create and where the pod points at it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerClaim {
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// Index in `spec.initContainers` or `spec.containers`.
    pub index: usize,
    /// The container's name.
    pub container: String,
    /// The pod's `spec.resourceClaims[].name` (and the container's `resources.claims[].name`).
    pub entry_name: String,
    /// The ResourceClaimTemplate's name (content-addressed).
    pub template_name: String,
    /// The template's spec.
    pub spec: ResourceClaimTemplateSpec,
    /// Shapes that can hold the request but are not in the claim: more could than a claim
    /// may list (`MAX_FIRST_AVAILABLE`). Not part of the template.
    pub left_out: Vec<Shape>,
}

impl ContainerClaim {
    /// What the user must be told about this claim (the admission response's warnings):
    /// that the sub-request limit applied, and each shape it left out (at most 10 named).
    pub fn warnings(&self) -> Vec<String> {
        if self.left_out.is_empty() {
            return Vec::new();
        }
        let field = claim_field(self);
        let mut out = vec![format!(
            "{field}: {} AMD device types can hold the request, more than the {MAX_FIRST_AVAILABLE} a claim may list: kept the {MAX_FIRST_AVAILABLE} with the most devices, left out {}",
            self.left_out.len() + MAX_FIRST_AVAILABLE,
            self.left_out.len()
        )];
        const NAMED: usize = 10;
        for shape in self.left_out.iter().take(NAMED) {
            out.push(format!(
                "{field}: left out {} ({} MiB, {} CUs, {} device{}): the pod cannot land on it",
                shape.product_name,
                shape.memory_mib(),
                shape.compute_units,
                shape.devices,
                if shape.devices == 1 { "" } else { "s" }
            ));
        }
        if self.left_out.len() > NAMED {
            out.push(format!(
                "{field}: and {} more device types left out",
                self.left_out.len() - NAMED
            ));
        }
        out
    }

    /// The template object to create in `namespace`.
    pub fn template(&self, namespace: &str) -> ResourceClaimTemplate {
        ResourceClaimTemplate {
            metadata: ObjectMeta {
                name: Some(self.template_name.clone()),
                namespace: Some(namespace.to_owned()),
                labels: Some(managed_labels()),
                ..Default::default()
            },
            spec: self.spec.clone(),
        }
    }

    fn field(&self) -> String {
        match self.kind {
            ContainerKind::App => format!("spec.containers[{}]", self.index),
            _ => format!("spec.initContainers[{}]", self.index),
        }
    }
}

fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_WEBHOOK.to_owned())])
}

/// 64-bit FNV-1a: a stable content hash without a dependency (names, not security: a
/// template of our name with another spec is refused, never used).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `hami-amd-<16 hex>` of the spec's JSON.
pub fn template_name(spec: &ResourceClaimTemplateSpec) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    format!("{CLAIM_PREFIX}{:016x}", fnv1a(&json))
}

/// Whether `name` is a DNS label (RFC 1123: ≤ 63, lowercase alphanumerics and `-`, no `-`
/// at either end).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The pod claim entry of a container: `hami-amd-<container>`, or, when that is no DNS
/// label, a cleaned prefix of it with 8 hex of the name's hash (stable, distinct per name).
pub fn entry_name(container: &str) -> String {
    let plain = format!("{CLAIM_PREFIX}{container}");
    if is_dns_label(&plain) {
        return plain;
    }
    let hash = format!("{:08x}", fnv1a(container.as_bytes()) as u32);
    let clean: String = container
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63 - CLAIM_PREFIX.len() - hash.len() - 1)
        .collect();
    let clean = clean.trim_matches('-');
    if clean.is_empty() {
        format!("{CLAIM_PREFIX}{hash}")
    } else {
        format!("{CLAIM_PREFIX}{clean}-{hash}")
    }
}

/// A CEL string literal (`"` and `\` escaped, control characters as `\u` escapes), so no
/// value can end the literal early.
fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The CEL selector pinning one shape: product name, memory and compute units equal.
pub fn shape_selector(shape: &Shape) -> String {
    format!(
        "device.attributes[\"{DRIVER}\"].{ATTR_PRODUCT_NAME} == {} && device.capacity[\"{DRIVER}\"].{MEMORY}.compareTo(quantity(\"{}\")) == 0 && device.capacity[\"{DRIVER}\"].{COMPUTE_UNITS}.compareTo(quantity(\"{}\")) == 0",
        cel_string(&shape.product_name),
        format_bytes(shape.memory_bytes),
        format_count(shape.compute_units),
    )
}

fn uuid_list(uuids: &[String]) -> String {
    let items: Vec<String> = uuids.iter().map(|u| cel_string(u)).collect();
    format!(
        "device.attributes[\"{DRIVER}\"].{ATTR_UUID} in [{}]",
        items.join(", ")
    )
}

fn cel(expression: String) -> ClaimSelector {
    ClaimSelector {
        cel: Some(CELDeviceSelector { expression }),
    }
}

/// What one (sub-)request asks of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Amounts {
    memory_mib: Option<u64>,
    compute_units: Option<u64>,
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
fn amounts_on(request: &DeviceRequest, shape: &Shape) -> Option<Amounts> {
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
fn needs_shapes(request: &DeviceRequest, selector: &DeviceSelector) -> bool {
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

/// The claims of every container of `pod` with an AMD request (`requests` in
/// [`container_slots`] order, as `pod_requests` returns them), or the message saying what
/// to change.
pub fn pod_claims(
    pod: &Pod,
    requests: &[ContainerRequest],
    shapes: &[Shape],
) -> Result<Vec<ContainerClaim>, String> {
    let Some(spec) = &pod.spec else {
        return Ok(Vec::new());
    };
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let selector =
        DeviceSelector::from_annotations(Vendor::Amd, annotations).map_err(|e| e.to_string())?;
    let existing: Vec<&str> = spec
        .resource_claims
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    let mut out = Vec::new();
    for (slot, request) in container_slots(spec).iter().zip(requests) {
        let Some(amd) = &request.amd else { continue };
        let field = || format!("{} ({})", slot.field(), slot.container.name);
        let choice = claim_spec(amd, &selector, shapes).map_err(|e| format!("{}: {e}", field()))?;
        let spec = ResourceClaimTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(managed_labels()),
                ..Default::default()
            }),
            spec: choice.spec,
        };
        let entry = entry_name(&slot.container.name);
        let taken_in_container = slot
            .container
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.name == entry));
        if existing.contains(&entry.as_str()) || taken_in_container {
            return Err(format!(
                "{}: the pod already has a resource claim named {entry}, which the webhook adds for this container's amd.com/* request; rename that claim",
                field()
            ));
        }
        out.push(ContainerClaim {
            kind: slot.kind,
            index: slot.index,
            container: slot.container.name.clone(),
            entry_name: entry,
            template_name: template_name(&spec),
            spec,
            left_out: choice.left_out,
        });
    }
    Ok(out)
}

/// JSON Pointer escaping (RFC 6901) of one path segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The RFC 6902 operations pointing each claimed container at its template: its `amd.com/*`
/// requests and limits removed, `resources.claims` and `spec.resourceClaims` added.
pub fn patch(spec: &PodSpec, claims: &[ContainerClaim]) -> Vec<Value> {
    let mut ops = Vec::new();
    let slots = container_slots(spec);
    for claim in claims {
        let Some(slot) = slots
            .iter()
            .find(|s| s.kind == claim.kind && s.index == claim.index)
        else {
            continue;
        };
        let base = match claim.kind {
            ContainerKind::App => format!("/spec/containers/{}", claim.index),
            _ => format!("/spec/initContainers/{}", claim.index),
        };
        let resources = slot.container.resources.as_ref();
        for (section, map) in [
            ("limits", resources.and_then(|r| r.limits.as_ref())),
            ("requests", resources.and_then(|r| r.requests.as_ref())),
        ] {
            for name in AMD.resources() {
                if map.is_some_and(|m| m.contains_key(name)) {
                    ops.push(json!({"op": "remove", "path": format!("{base}/resources/{section}/{}", escape(name))}));
                }
            }
        }
        let entry = json!({"name": claim.entry_name});
        match resources {
            None => ops.push(
                json!({"op": "add", "path": format!("{base}/resources"), "value": {"claims": [entry]}}),
            ),
            Some(r) if r.claims.is_none() => ops.push(
                json!({"op": "add", "path": format!("{base}/resources/claims"), "value": [entry]}),
            ),
            Some(_) => ops.push(
                json!({"op": "add", "path": format!("{base}/resources/claims/-"), "value": entry}),
            ),
        }
    }
    let entries: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c.entry_name, "resourceClaimTemplateName": c.template_name}))
        .collect();
    if spec.resource_claims.is_none() && !entries.is_empty() {
        ops.push(json!({"op": "add", "path": "/spec/resourceClaims", "value": entries}));
    } else {
        for e in entries {
            ops.push(json!({"op": "add", "path": "/spec/resourceClaims/-", "value": e}));
        }
    }
    ops
}

/// Whether two claim specs mean the same (quantities compared by value: the API server
/// writes them canonically, `4096Mi` as `4Gi`).
pub fn same_spec(a: &ResourceClaimTemplateSpec, b: &ResourceClaimTemplateSpec) -> bool {
    fn canonical(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if key == "requests"
                        && let Value::Object(q) = value
                    {
                        for amount in q.values_mut() {
                            if let Some(n) = amount
                                .as_str()
                                .and_then(|s| hami_protocol::capacity::parse(s).ok())
                            {
                                *amount = json!(n);
                            }
                        }
                    } else {
                        canonical(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(canonical),
            _ => {}
        }
    }
    let norm = |s: &ResourceClaimTemplateSpec| {
        let mut v = serde_json::to_value(&s.spec).unwrap_or_default();
        canonical(&mut v);
        v
    };
    norm(a) == norm(b)
}

/// Where the claim of a container lands, for messages: `spec.containers[0] (name)`.
pub fn claim_field(claim: &ContainerClaim) -> String {
    format!("{} ({})", claim.field(), claim.container)
}

#[cfg(test)]
#[path = "dra_claims_tests.rs"]
mod tests;
