//! One CDI spec per prepared claim (kind `k8s.amdgpu.hami-rs.io/claim`, device
//! `<claim uid>-<slice device>`): each device injects its card's DRM nodes; the claim-wide
//! edits inject `/dev/kfd`, the env of SPEC §2.6 and the hook, cache and config mounts.
//! Checked with the device plugin's CDI validator (`hami_amd_core::cdi::validate`, the same
//! CDI version). The claim UID in every name means a runtime never sees a reused name.

use std::collections::BTreeMap;

use hami_amd_core::allocate_plan::MountPlan;
use hami_amd_core::cdi::{min_version, validate};
use serde_json::{Value, json};

/// CDI vendor of the claim specs.
pub const CDI_VENDOR: &str = "k8s.amdgpu.hami-rs.io";
/// CDI class of the claim specs (ids are `k8s.amdgpu.hami-rs.io/claim=<name>`).
pub const CDI_CLASS: &str = "claim";

/// `<vendor>/<class>`.
pub fn kind() -> String {
    format!("{CDI_VENDOR}/{CDI_CLASS}")
}

/// The spec's file name in the CDI directory.
pub fn file_name(claim_uid: &str) -> String {
    format!("{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json")
}

/// The CDI name of one device of a claim.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI id kubelet hands the runtime.
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!("{}={}", kind(), device_name(claim_uid, device))
}

/// A device's DRM nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiDevice {
    /// The slice device name.
    pub device: String,
    /// DRM card minor.
    pub card: u32,
    /// DRM render minor.
    pub render: u32,
}

/// Builds and validates the claim's spec.
pub fn spec(
    claim_uid: &str,
    devices: &[CdiDevice],
    env: &BTreeMap<String, String>,
    mounts: &[MountPlan],
) -> Result<Value, String> {
    let devs: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!({
                "name": device_name(claim_uid, &d.device),
                "containerEdits": {"deviceNodes": [
                    {"path": format!("/dev/dri/card{}", d.card)},
                    {"path": format!("/dev/dri/renderD{}", d.render)},
                ]},
            })
        })
        .collect();
    let mut edits = json!({"deviceNodes": [{"path": "/dev/kfd"}]});
    if !env.is_empty() {
        edits["env"] = env
            .iter()
            .map(|(k, v)| Value::from(format!("{k}={v}")))
            .collect();
    }
    if !mounts.is_empty() {
        edits["mounts"] = mounts
            .iter()
            .map(|m| {
                let mut options = vec!["bind", "nosuid", "nodev"];
                if m.read_only {
                    options.push("ro");
                }
                json!({"hostPath": m.host_path, "containerPath": m.container_path, "options": options})
            })
            .collect();
    }
    let mut spec = json!({
        "kind": kind(),
        "devices": devs,
        "containerEdits": edits,
    });
    // The oldest version that has what the spec uses (0.5.0 when the claim UID starts with
    // a digit), so runtimes on older CDI libraries read it too.
    spec["cdiVersion"] = min_version(&spec).into();
    validate(&spec)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_declares_the_version_its_claim_uid_needs() {
        let devices = [CdiDevice {
            device: "gpu-0".into(),
            card: 1,
            render: 128,
        }];
        let env = BTreeMap::from([("HSA_CU_MASK".to_owned(), "0:0-3".to_owned())]);
        let mounts = [MountPlan {
            container_path: "/c".into(),
            host_path: "/h".into(),
            read_only: true,
        }];
        // Device names start with the claim UID: a digit needs CDI 0.5.0, which podman 4.3
        // reads; it refused the 0.6.0 every spec declared before.
        let digit = spec("7f3c1a2e-0000", &devices, &env, &mounts).unwrap();
        assert_eq!(digit["cdiVersion"], "0.5.0");
        let letter = spec("af3c1a2e-0000", &devices, &env, &mounts).unwrap();
        assert_eq!(letter["cdiVersion"], "0.3.0");
        assert_eq!(letter["containerEdits"]["mounts"][0]["options"][3], "ro");
    }
}
