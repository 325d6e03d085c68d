//! The CDI option, the shell: writes the node's CDI spec. Names, the spec itself, its
//! validation and the CDI form of a response are the pure core's `hami_amd_core::cdi`,
//! re-exported here so `cdi::*` keeps its paths.

use std::path::Path;

use crate::registration::RegisteredDevice;
pub use hami_amd_core::cdi::*;

/// Writes the spec atomically (temporary file, then rename), so a runtime never reads half.
pub fn write_spec(dir: &Path, devices: &[RegisteredDevice]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{SPEC_FILE}.tmp"));
    let text = serde_json::to_string_pretty(&spec(devices)).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join(SPEC_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocate_plan::{ContainerPlan, DevicePath, MountPlan};
    use crate::discover_report::build_report;
    use crate::registration::RegistrationSettings;
    use serde_json::{Value, json};

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
        // Device nodes only: the oldest version, one every CDI runtime reads.
        assert_eq!(spec["cdiVersion"], "0.3.0");
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
