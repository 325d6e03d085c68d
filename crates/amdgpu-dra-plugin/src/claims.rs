//! Reading the ResourceClaim the kubelet names (it sends only namespace, name and UID), and
//! writing this driver's `status.devices` entries back through the status subresource.

use std::future::Future;

use hami_dra_core::api::{AllocatedDeviceStatus, ResourceClaim};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::kube_error::text;

/// Where claims come from: the API server in production.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`; the error says why it cannot be read.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;

    /// Sets `driver`'s entries of the claim's `status.devices` to `devices` (other drivers'
    /// entries kept), on the claim `seen` names (namespace, name, UID) and only while it
    /// has that UID (a claim recreated under the same name is an error, not a target).
    /// `seen` is the claim as [`ClaimSource::get`] returned it: a source may write against
    /// its resourceVersion and status, and must read again when that version is stale; a
    /// `seen` without `metadata.resourceVersion` (the driver's undo after a failed prepare)
    /// must be read first.
    fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// The namespace, name and UID of a claim as read, for a status write (each must be set).
pub fn claim_key(seen: &ResourceClaim) -> Result<(&str, &str, &str), String> {
    let m = &seen.metadata;
    match (m.namespace.as_deref(), m.name.as_deref(), m.uid.as_deref()) {
        (Some(ns), Some(name), Some(uid)) => Ok((ns, name, uid)),
        _ => Err(format!(
            "the claim read has no namespace, name or UID ({:?}/{:?}, UID {:?}); not writing its status",
            m.namespace, m.name, m.uid
        )),
    }
}

/// `current` (the claim's `status.devices`, raw) with `driver`'s entries replaced by
/// `devices`; `None` when that changes nothing.
pub fn merged_device_status(
    current: &[Value],
    driver: &str,
    devices: &[AllocatedDeviceStatus],
) -> Result<Option<Vec<Value>>, String> {
    let mut out: Vec<Value> = current
        .iter()
        .filter(|d| d.get("driver").and_then(Value::as_str) != Some(driver))
        .cloned()
        .collect();
    for d in devices {
        out.push(serde_json::to_value(d).map_err(|e| e.to_string())?);
    }
    Ok((out.as_slice() != current).then_some(out))
}

/// `resource.k8s.io/v1` ResourceClaims through kube's dynamic API, decoded into our own
/// types (the workspace's k8s-openapi feature has no resource.k8s.io/v1).
#[derive(Clone)]
pub struct KubeClaims {
    /// The API client.
    pub client: kube::Client,
}

/// kube's description of `resource.k8s.io/v1` ResourceClaims.
pub fn resource_claims() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: hami_dra_core::api::API_VERSION.into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource_claims());
        let obj = api
            .get(name)
            .await
            .map_err(|e| format!("reading ResourceClaim {namespace}/{name}: {}", text(&e)))?;
        let value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
        serde_json::from_value(value).map_err(|e| {
            format!("ResourceClaim {namespace}/{name} is not a resource.k8s.io/v1 claim: {e}")
        })
    }

    async fn set_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        self.write_device_status(seen, driver, devices).await
    }
}

/// Attempts at the status write when another writer (kube-scheduler, another driver) wins
/// the race for the claim's resourceVersion.
const STATUS_ATTEMPTS: usize = 5;

impl KubeClaims {
    async fn write_device_status(
        &self,
        seen: &ResourceClaim,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let (namespace, name, uid) = claim_key(seen)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource_claims());
        let what = format!("ResourceClaim {namespace}/{name}");
        // First against the claim as read (no second GET on the prepare path): its status is
        // lossless to merge when every entry is this driver's — ours are replaced whole —
        // while another driver's entry is merged from the raw object, read here, so fields
        // this build does not model survive.
        // A missing resourceVersion would make the patch unconditional (null deletes the
        // precondition): then read first, as for another driver's entry.
        let mut known = match (&seen.metadata.resource_version, &seen.status) {
            (None, _) => None,
            (Some(_), Some(s)) if s.devices.iter().any(|d| d.driver != driver) => None,
            (Some(rv), status) => {
                let current = status
                    .iter()
                    .flat_map(|s| &s.devices)
                    .map(serde_json::to_value)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                Some((Some(rv.clone()), current))
            }
        };
        for _ in 0..STATUS_ATTEMPTS {
            let (version, current) = match known.take() {
                Some(k) => k,
                None => {
                    // The claim itself, status included: `get` on the claim is granted for
                    // the claim GET already, so the status subresource needs only `patch`.
                    let obj = api
                        .get(name)
                        .await
                        .map_err(|e| format!("reading {what}: {}", text(&e)))?;
                    if obj.metadata.uid.as_deref() != Some(uid) {
                        return Err(format!(
                            "{what} now has UID {:?}, not {uid}: the claim was replaced; not writing its status",
                            obj.metadata.uid.as_deref().unwrap_or("")
                        ));
                    }
                    let current = obj
                        .data
                        .pointer("/status/devices")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    (obj.metadata.resource_version, current)
                }
            };
            let Some(next) = merged_device_status(&current, driver, devices)? else {
                return Ok(());
            };
            // The resourceVersion makes the merge patch conditional: entries another
            // writer added meanwhile are never overwritten, and a claim replaced under the
            // same name (a new version) is read again and refused above.
            let patch = json!({
                "metadata": {"resourceVersion": version},
                "status": {"devices": next},
            });
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    return Err(format!("writing status.devices of {what}: {}", text(&e)));
                }
            }
        }
        Err(format!(
            "writing status.devices of {what}: still conflicting after {STATUS_ATTEMPTS} attempts"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(device: &str, cus: &str) -> AllocatedDeviceStatus {
        AllocatedDeviceStatus {
            driver: "d.example.com".into(),
            pool: "node-a".into(),
            device: device.into(),
            data: Some(json!({"cuRanges": cus})),
            ..Default::default()
        }
    }

    #[test]
    fn only_this_drivers_entries_are_replaced() {
        let other = json!({"driver": "nic.example.com", "pool": "node-a", "device": "nic-0"});
        let stale = serde_json::to_value(ours("gpu-1", "0-3")).unwrap();
        let current = vec![stale, other.clone()];
        let next = merged_device_status(&current, "d.example.com", &[ours("gpu-0", "8-15")])
            .unwrap()
            .unwrap();
        assert_eq!(next.len(), 2);
        assert_eq!(next[0], other);
        assert_eq!(next[1]["device"], "gpu-0");
        assert_eq!(next[1]["data"]["cuRanges"], "8-15");
        // the same again: nothing to write
        assert_eq!(
            merged_device_status(&next, "d.example.com", &[ours("gpu-0", "8-15")]).unwrap(),
            None
        );
    }
}
