//! Namespace quotas at admission (issue 30), both modes. A pod is refused when its
//! namespace's quotas cannot hold it even on the smallest GPU of the cluster it could get.
//!
//! Device-plugin requests are only checked here: Filter charges them, with the real MiB and
//! CUs of the GPUs it chose ([`crate::quota_gate`]). DRA-mode AMD requests (D-29) never reach
//! our Filter — kube-scheduler's DynamicResources plugin places their claims — so the
//! webhook is their gate: it checks and reserves what the claims ask on the smallest shape
//! they can land on, under the state's lock (two pods racing for the last quota are
//! serialized), writes that charge on the pod ([`DRA_CHARGE_ANNOTATION`], owned by the
//! scheduler as D-4's annotations are), and the state charges the pod from it from then on
//! until it ends — across restarts, as the device-plugin charge is rebuilt from the
//! allocation annotations.

use std::time::Instant;

use hami_protocol::names::Vendor;
use hami_protocol::placement::placed_by_scheduler;
use hami_protocol::requests::{ContainerRequest, container_slots, pod_requests};
use hami_protocol::selection::DeviceSelector;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::admission::WebhookConfig;
use crate::dra_claims::{AmdMode, ContainerClaim, Shape, per_device_charge, pod_claims};
use crate::quota::{Amounts, Dimension, GpuShape, QuotaKey, QuotaRefusal, admission_ask, combine};
use crate::quota_book::Ticket;
use crate::state::ClusterState;

/// The pod annotation holding what a DRA-mode pod's claims charge its namespace's quotas
/// (the protocol's name, here at its old path).
pub use hami_protocol::names::pod::DRA_QUOTA_CHARGE as DRA_CHARGE_ANNOTATION;

/// The annotation's value for `amounts` (the keys with a non-zero amount).
pub fn format_charge(amounts: &Amounts) -> String {
    amounts
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{}={v}", k.resource()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`format_charge`]'s text back.
pub fn parse_charge(text: &str) -> Result<Amounts, String> {
    let mut amounts = Amounts::default();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (resource, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not <resource>=<amount>"))?;
        let key = QuotaKey::ALL
            .into_iter()
            .find(|k| k.resource() == resource)
            .ok_or_else(|| format!("{resource:?} is not a quota resource"))?;
        let value = value
            .parse::<u64>()
            .map_err(|_| format!("{value:?} is not a whole number"))?;
        amounts.set(key, value);
    }
    Ok(amounts)
}

/// What a DRA-mode pod's AMD claims charge (the caller knows the pod's mode): per container,
/// the claim's per-device MiB and compute share on the smallest shape it can land on × its
/// device count; the pod's charge is HAMi's max(sum of app containers, max of init
/// containers). Zero when the claims cannot be written (the webhook denies such a pod).
pub fn dra_ask(pod: &Pod, requests: &[ContainerRequest], shapes: &[Shape]) -> Amounts {
    match pod_claims(pod, requests, shapes) {
        Ok(claims) => claims_charge(pod, requests, shapes, &claims),
        Err(_) => Amounts::default(),
    }
}

/// [`dra_ask`] of claims already made by `pod_claims` (the webhook has them).
pub fn claims_charge(
    pod: &Pod,
    requests: &[ContainerRequest],
    shapes: &[Shape],
    claims: &[ContainerClaim],
) -> Amounts {
    let Some(spec) = &pod.spec else {
        return Amounts::default();
    };
    let empty = Default::default();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let Ok(selector) = DeviceSelector::from_annotations(Vendor::Amd, annotations) else {
        return Amounts::default();
    };
    let slots = container_slots(spec);
    let mut kinds = Vec::new();
    let mut per_container = Vec::new();
    for (slot, request) in slots.iter().zip(requests) {
        let mut a = Amounts::default();
        let claim = claims
            .iter()
            .find(|c| c.kind == slot.kind && c.index == slot.index);
        if let (Some(claim), Some(amd)) = (claim, &request.amd) {
            let (mib, cores) = per_device_charge(amd, &selector, shapes, &claim.left_out);
            let count = u64::from(amd.count);
            a.set(QuotaKey::new(Vendor::Amd, Dimension::Slices), count);
            a.set(
                QuotaKey::new(Vendor::Amd, Dimension::MemoryMib),
                mib.saturating_mul(count),
            );
            a.set(
                QuotaKey::new(Vendor::Amd, Dimension::CoresPercent),
                cores.saturating_mul(count),
            );
        }
        kinds.push(slot.kind);
        per_container.push(a);
    }
    combine(&kinds, &per_container)
}

/// A pod's ask at admission, in the namespace of a quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionAsk {
    /// The pod's namespace.
    pub namespace: String,
    /// The whole pod: device-plugin requests on the smallest GPU, DRA claims on the
    /// smallest shape.
    pub total: Amounts,
    /// The DRA claims' part, which only admission charges.
    pub dra: Amounts,
}

/// The ask of a pod CREATE review whose namespace has a quota; `None` for anything else (no
/// pod CREATE — the codec answers it —, no quota, a pod not handed to this scheduler).
/// `shapes` are the DRA driver's device shapes.
pub fn admission_ask_of(
    body: &[u8],
    config: &WebhookConfig,
    state: &ClusterState,
    shapes: &[Shape],
) -> Option<AdmissionAsk> {
    let review: Value = serde_json::from_slice(body).ok()?;
    let request = review.get("request")?;
    if request.pointer("/kind/kind").and_then(Value::as_str) != Some("Pod")
        || request.get("operation").and_then(Value::as_str) != Some("CREATE")
    {
        return None;
    }
    let namespace = [
        request.get("namespace"),
        request.pointer("/object/metadata/namespace"),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_str)
    .find(|n| !n.is_empty())
    .unwrap_or("default");
    if !state.quota.ledger().governs(namespace) {
        return None;
    }
    let mut pod: Pod = serde_json::from_value(request.get("object")?.clone()).ok()?;
    // As the webhook's patch will make it: ours when unnamed (or `default-scheduler` with
    // the overwrite on), so placement's rule says whether the scheduler will charge it.
    let spec = pod.spec.as_mut()?;
    let current = spec.scheduler_name.as_deref().unwrap_or("");
    if current.is_empty()
        || (current == "default-scheduler" && config.force_overwrite_default_scheduler)
    {
        spec.scheduler_name = Some(config.scheduler_name.clone());
    }
    if !placed_by_scheduler(&pod, &config.scheduler_name) {
        return None;
    }
    let requests = pod_requests(&pod, &config.defaults).ok()?;
    let gpus: Vec<GpuShape> = state
        .nodes()
        .flat_map(|n| n.devices.gpus.iter().map(GpuShape::of))
        .collect();
    let mut total = admission_ask(&requests, &gpus);
    let mut dra = Amounts::default();
    if AmdMode::of_pod(&pod, config.amd_mode) == Ok(AmdMode::Dra) {
        dra = dra_ask(&pod, &requests, shapes);
        for dimension in [
            Dimension::Slices,
            Dimension::MemoryMib,
            Dimension::CoresPercent,
        ] {
            let key = QuotaKey::new(Vendor::Amd, dimension);
            total.set(key, dra.get(key));
        }
    }
    Some(AdmissionAsk {
        namespace: namespace.to_owned(),
        total,
        dra,
    })
}

/// The webhook's quota step for one review body, under the state's lock: the refusal, or
/// the reservation of the pod's DRA claims (none on a dry run, for a pod without DRA
/// claims, or in a namespace without quota), to cancel if the pod is denied after all.
pub fn admit(
    body: &[u8],
    config: &WebhookConfig,
    state: &mut ClusterState,
    shapes: &[Shape],
    dry_run: bool,
    now: Instant,
) -> Result<Option<Ticket>, QuotaRefusal> {
    let Some(ask) = admission_ask_of(body, config, state, shapes) else {
        return Ok(None);
    };
    state
        .quota
        .admit(&ask.namespace, &ask.total, ask.dra, !dry_run, now)
}

#[cfg(test)]
#[path = "quota_admission_tests.rs"]
mod tests;
