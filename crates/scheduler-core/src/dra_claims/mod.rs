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
//!
//! Files: [`mode`] (device plugin or DRA), [`shapes`] (the slices' device shapes),
//! [`claim_spec`] (one request as a claim spec), [`selectors`] (its CEL), [`template`]
//! (template and entry names, spec equality), [`patch`] (the pod patch), [`charge`] (what a
//! claim costs the namespace's quota); here, the claim of one container and the claims of
//! a pod.

use std::collections::BTreeMap;

use hami_protocol::dra::MAX_FIRST_AVAILABLE;
use hami_protocol::names::Vendor;
use hami_protocol::requests::{ContainerKind, ContainerRequest, container_slots};
use hami_protocol::selection::DeviceSelector;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceClaimTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub mod charge;
pub mod claim_spec;
pub mod mode;
pub mod patch;
pub mod selectors;
pub mod shapes;
pub mod template;

pub use charge::per_device_charge;
pub use claim_spec::{ClaimChoice, claim_spec};
pub use mode::AmdMode;
pub use patch::patch;
pub use selectors::shape_selector;
pub use shapes::{Shape, shapes};
use template::managed_labels;
pub use template::{entry_name, is_dns_label, same_spec, template_name};

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

/// Where the claim of a container lands, for messages: `spec.containers[0] (name)`.
pub fn claim_field(claim: &ContainerClaim) -> String {
    format!("{} ({})", claim.field(), claim.container)
}

#[cfg(test)]
mod tests;
