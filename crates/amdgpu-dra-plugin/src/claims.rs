//! Reading the ResourceClaim the kubelet names (it sends only namespace, name and UID), and
//! writing this driver's `status.devices` entries back through the status subresource.

use std::future::Future;

use hami_dra_core::api::{AllocatedDeviceStatus, ResourceClaim};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

/// Where claims come from: the API server in production.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`; the error says why it cannot be read.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;

    /// Sets `driver`'s entries of the claim's `status.devices` to `devices` (other drivers'
    /// entries kept), on the claim with UID `uid` only (a claim recreated under the same
    /// name is an error, not a target).
    fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> impl Future<Output = Result<(), String>> + Send;
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
            .map_err(|e| format!("reading ResourceClaim {namespace}/{name}: {e}"))?;
        let value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
        serde_json::from_value(value).map_err(|e| {
            format!("ResourceClaim {namespace}/{name} is not a resource.k8s.io/v1 claim: {e}")
        })
    }

    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        self.write_device_status(namespace, name, uid, driver, devices)
            .await
    }
}

/// Attempts at the status write when another writer (kube-scheduler, another driver) wins
/// the race for the claim's resourceVersion.
const STATUS_ATTEMPTS: usize = 5;

impl KubeClaims {
    async fn write_device_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        driver: &str,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), String> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource_claims());
        let what = format!("ResourceClaim {namespace}/{name}");
        for _ in 0..STATUS_ATTEMPTS {
            let obj = api
                .get_status(name)
                .await
                .map_err(|e| format!("reading {what}: {e}"))?;
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
            let Some(next) = merged_device_status(&current, driver, devices)? else {
                return Ok(());
            };
            // The resourceVersion makes the merge patch conditional: entries another
            // writer added meanwhile are never overwritten.
            let patch = json!({
                "metadata": {"resourceVersion": obj.metadata.resource_version},
                "status": {"devices": next},
            });
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(format!("writing status.devices of {what}: {e}")),
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
