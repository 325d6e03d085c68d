//! The CDI option (seed: device nodes "或 CDI 名称", or CDI names): with `--cdi`, Allocate
//! answers with CDI device names (`amd.com/gpu=card<N>`) instead of device nodes, and the
//! plugin keeps a CDI spec (`<cdi dir>/amd.com-gpu.json`, CDI 0.6.0, kind `amd.com/gpu`)
//! that tells the runtime what each name injects: the card's `/dev/dri/card<N>` and
//! `/dev/dri/renderD<M>`, and `/dev/kfd` for every device (common edits). Env, mounts and
//! everything else of the response stay as they are. The upstream plugin uses the same
//! kind, names, version and file name.

use std::path::Path;

use serde_json::{Value, json};

use crate::allocate_plan::ContainerPlan;
use crate::registration::RegisteredDevice;

/// CDI spec version written (the first with `deviceNodes` as used here and annotations).
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI kind (`vendor/class`).
pub const CDI_KIND: &str = "amd.com/gpu";
/// The spec's file name in the CDI directory.
pub const SPEC_FILE: &str = "amd.com-gpu.json";

/// The CDI name of a registered device (one per DRM card, so per partition too).
pub fn device_name(dev: &RegisteredDevice) -> String {
    format!("card{}", dev.card)
}

/// The spec for the node's devices.
pub fn spec(devices: &[RegisteredDevice]) -> Value {
    let mut seen = std::collections::BTreeSet::new();
    let entries: Vec<Value> = devices
        .iter()
        .filter(|d| seen.insert(d.card))
        .map(|d| {
            json!({
                "name": device_name(d),
                "containerEdits": {"deviceNodes": [
                    {"path": format!("/dev/dri/card{}", d.card)},
                    {"path": format!("/dev/dri/renderD{}", d.render)},
                ]},
            })
        })
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": {"deviceNodes": [{"path": "/dev/kfd"}]},
    })
}

/// Why a spec is not one a CDI runtime accepts.
pub fn validate(spec: &Value) -> Result<(), String> {
    let kind = spec["kind"].as_str().ok_or("no kind")?;
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("kind {kind:?} is not vendor/class"))?;
    let vendor_ok = !vendor.is_empty()
        && vendor
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && vendor.as_bytes()[0].is_ascii_alphanumeric();
    let class_ok = !class.is_empty()
        && class
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !vendor_ok || !class_ok {
        return Err(format!("kind {kind:?}: bad vendor or class"));
    }
    if spec["cdiVersion"].as_str() != Some(CDI_VERSION) {
        return Err("cdiVersion".into());
    }
    let mut names = std::collections::BTreeSet::new();
    for d in spec["devices"].as_array().ok_or("no devices")? {
        let name = d["name"].as_str().ok_or("device without name")?;
        let ok = name
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
        if !ok || !names.insert(name) {
            return Err(format!("device name {name:?} is invalid or repeated"));
        }
        let nodes = d["containerEdits"]["deviceNodes"]
            .as_array()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("device {name} injects nothing"))?;
        for n in nodes {
            if !n["path"].as_str().is_some_and(|p| p.starts_with('/')) {
                return Err(format!(
                    "device {name}: a device node path must be absolute"
                ));
            }
        }
    }
    Ok(())
}

/// Writes the spec atomically (temporary file, then rename), so a runtime never reads half.
pub fn write_spec(dir: &Path, devices: &[RegisteredDevice]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{SPEC_FILE}.tmp"));
    let text = serde_json::to_string_pretty(&spec(devices)).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join(SPEC_FILE))
}

/// Turns a planned response into its CDI form: the device nodes of registered devices (and
/// `/dev/kfd`) become CDI names, in the same order; anything else stays a device node.
pub fn to_cdi(plan: &mut ContainerPlan, devices: &[RegisteredDevice]) {
    let mut names = Vec::new();
    plan.devices.retain(|d| {
        if d.path == "/dev/kfd" {
            return false;
        }
        match devices.iter().find(|r| {
            d.path == format!("/dev/dri/card{}", r.card)
                || d.path == format!("/dev/dri/renderD{}", r.render)
        }) {
            Some(r) => {
                let name = format!("{CDI_KIND}={}", device_name(r));
                if !names.contains(&name) {
                    names.push(name);
                }
                false
            }
            None => true,
        }
    });
    plan.cdi_devices = names;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocate_plan::{DevicePath, MountPlan};
    use crate::discover_report::build_report;
    use crate::registration::RegistrationSettings;

    #[test]
    fn spec_names_every_card_and_injects_real_nodes() {
        let tree = hami_sysfs_fixtures::mi300x_cpx().unwrap();
        let devices = build_report(
            &tree.sysfs_root(),
            &tree.dev_root(),
            &RegistrationSettings::default(),
        )
        .unwrap()
        .registration
        .devices;
        let spec = spec(&devices);
        validate(&spec).unwrap();
        assert_eq!(spec["kind"], "amd.com/gpu");
        assert_eq!(spec["devices"].as_array().unwrap().len(), 63);
        assert_eq!(spec["containerEdits"]["deviceNodes"][0]["path"], "/dev/kfd");
        for d in spec["devices"].as_array().unwrap() {
            for n in d["containerEdits"]["deviceNodes"].as_array().unwrap() {
                let path = n["path"].as_str().unwrap();
                let rel = path.strip_prefix("/dev/").unwrap();
                assert!(tree.dev_root().join(rel).exists(), "{path}");
            }
        }
        let p3 = &spec["devices"][3];
        assert_eq!(p3["name"], format!("card{}", devices[3].card));
        // Written atomically; validate refuses what a runtime would refuse.
        let dir = tree.sysfs_root().join("cdi");
        write_spec(&dir, &devices).unwrap();
        let back: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(SPEC_FILE)).unwrap()).unwrap();
        assert_eq!(back, spec);
        let mut bad = spec.clone();
        bad["devices"][1]["name"] = bad["devices"][0]["name"].clone();
        assert!(validate(&bad).unwrap_err().contains("repeated"));
        bad = spec.clone();
        bad["kind"] = json!("amd.com");
        assert!(validate(&bad).is_err());

        let mut plan = ContainerPlan::default();
        for path in [
            "/dev/kfd".to_owned(),
            format!("/dev/dri/card{}", devices[3].card),
            format!("/dev/dri/renderD{}", devices[3].render),
            format!("/dev/dri/card{}", devices[0].card),
            format!("/dev/dri/renderD{}", devices[0].render),
        ] {
            plan.devices.push(DevicePath {
                path,
                permissions: "rw".into(),
            });
        }
        plan.mounts.push(MountPlan {
            container_path: "/x".into(),
            host_path: "/y".into(),
            read_only: true,
        });
        to_cdi(&mut plan, &devices);
        assert!(plan.devices.is_empty());
        assert_eq!(
            plan.cdi_devices,
            vec![
                format!("amd.com/gpu=card{}", devices[3].card),
                format!("amd.com/gpu=card{}", devices[0].card)
            ]
        );
        assert_eq!(plan.mounts.len(), 1, "mounts stay");
    }
}
