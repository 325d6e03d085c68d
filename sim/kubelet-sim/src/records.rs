//! What each container got, as JSON, so tests and the demo can show it: the pod annotation
//! `kubelet-sim.hami.io/allocations` (and optionally a file) maps container name to a list of
//! `{resource, deviceIds, envs, devices, mounts}`.

use hami_deviceplugin_api::v1beta1::ContainerAllocateResponse;
use serde_json::{Value, json};

/// Pod annotation holding the records.
pub const RECORD_ANNOTATION: &str = "kubelet-sim.hami.io/allocations";

/// The record of one Allocate for one container and resource.
pub fn container_record(
    resource: &str,
    ids: &[String],
    response: &ContainerAllocateResponse,
) -> Value {
    json!({
        "resource": resource,
        "deviceIds": ids,
        "envs": response.envs,
        "devices": response.devices.iter().map(|d| json!({
            "containerPath": d.container_path, "hostPath": d.host_path, "permissions": d.permissions,
        })).collect::<Vec<_>>(),
        "mounts": response.mounts.iter().map(|m| json!({
            "containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only,
        })).collect::<Vec<_>>(),
        "cdiDevices": response.cdi_devices.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
    })
}

/// The env of `container` for `resource` from a record annotation value.
pub fn envs_of(record: &str, container: &str) -> Option<serde_json::Map<String, Value>> {
    let v: Value = serde_json::from_str(record).ok()?;
    let mut out = serde_json::Map::new();
    for entry in v.get(container)?.as_array()? {
        out.extend(entry.get("envs")?.as_object()?.clone());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_deviceplugin_api::v1beta1::Mount;

    #[test]
    fn record_round_trip() {
        let mut resp = ContainerAllocateResponse::default();
        resp.envs.insert("HSA_CU_MASK".into(), "0:0-75".into());
        resp.mounts.push(Mount {
            container_path: "/a".into(),
            host_path: "/b".into(),
            read_only: true,
        });
        let rec = container_record("amd.com/gpu", &["x#0".into()], &resp);
        let text = json!({"main": [rec]}).to_string();
        assert_eq!(envs_of(&text, "main").unwrap()["HSA_CU_MASK"], "0:0-75");
        assert!(envs_of(&text, "other").is_none());
        assert!(text.contains("\"readOnly\":true"));
    }
}
