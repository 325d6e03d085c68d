//! The CDI option (seed: device nodes "或 CDI 名称", or CDI names): with `--cdi`, Allocate
//! answers with CDI device names (`amd.com/gpu=card<N>`) instead of device nodes, and the
//! plugin keeps a CDI spec (`<cdi dir>/amd.com-gpu.json`, kind `amd.com/gpu`)
//! that tells the runtime what each name injects: the card's `/dev/dri/card<N>` and
//! `/dev/dri/renderD<M>`, and `/dev/kfd` for every device (common edits). Env, mounts and
//! everything else of the response stay as they are. The upstream plugin uses the same
//! kind, names and file name.
//!
//! A spec declares the oldest CDI version that has every feature it uses ([`min_version`],
//! as the CDI library's own writers do): a runtime refuses a spec whose version it does not
//! know, whatever the spec uses, and runtimes built on CDI libraries before 0.6 (Debian 12's
//! podman 4.3: "unresolvable CDI devices") know no version after 0.5.0.
//!
//! The names, the spec and its validation (pure); the plugin's `cdi::write_spec` writes it.

use serde_json::{Value, json};

use hami_amd_discovery::registration::RegisteredDevice;
use hami_protocol::container_plan::ContainerPlan;

/// The CDI versions a spec may declare, oldest first (0.3.0 is the oldest the CDI library
/// still reads).
pub const CDI_VERSIONS: [&str; 4] = ["0.3.0", "0.4.0", "0.5.0", "0.6.0"];
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
    let mut spec = json!({
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": {"deviceNodes": [{"path": "/dev/kfd"}]},
    });
    spec["cdiVersion"] = min_version(&spec).into();
    spec
}

/// The oldest CDI version with every feature `spec` uses (the CDI library's
/// `MinimumRequiredVersion` rules for the versions in [`CDI_VERSIONS`]): 0.6.0 for
/// annotations or a dot in the class, 0.5.0 for a device name starting with a digit (a
/// claim UID) or a device node's `hostPath`, 0.4.0 for a mount's `type`.
pub fn min_version(spec: &Value) -> &'static str {
    let devices = spec["devices"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let class_dot = spec["kind"]
        .as_str()
        .and_then(|k| k.split_once('/'))
        .is_some_and(|(_, class)| class.contains('.'));
    let annotated = |v: &Value| v["annotations"].as_object().is_some_and(|a| !a.is_empty());
    if class_dot || annotated(spec) || devices.iter().any(annotated) {
        return "0.6.0";
    }
    let edits: Vec<&Value> = devices
        .iter()
        .map(|d| &d["containerEdits"])
        .chain([&spec["containerEdits"]])
        .collect();
    let all = |key: &str| -> Vec<&Value> {
        edits
            .iter()
            .filter_map(|e| e[key].as_array())
            .flatten()
            .collect()
    };
    let digit_name = devices.iter().any(|d| {
        d["name"]
            .as_str()
            .and_then(|n| n.bytes().next())
            .is_some_and(|b| b.is_ascii_digit())
    });
    let host_path = all("deviceNodes")
        .iter()
        .any(|n| n["hostPath"].as_str().is_some_and(|p| !p.is_empty()));
    if digit_name || host_path {
        return "0.5.0";
    }
    if all("mounts")
        .iter()
        .any(|m| m["type"].as_str().is_some_and(|t| !t.is_empty()))
    {
        return "0.4.0";
    }
    "0.3.0"
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
    let version = spec["cdiVersion"].as_str().unwrap_or_default();
    let rank = |v: &str| CDI_VERSIONS.iter().position(|k| *k == v);
    match (rank(version), rank(min_version(spec))) {
        (Some(declared), Some(needed)) if declared >= needed => {}
        (Some(_), _) => {
            return Err(format!(
                "cdiVersion {version} lacks features the spec uses (needs {})",
                min_version(spec)
            ));
        }
        _ => {
            return Err(format!(
                "cdiVersion {version:?} is not one of {CDI_VERSIONS:?}"
            ));
        }
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

    fn one_device(name: &str, edits: Value) -> Value {
        json!({"kind": CDI_KIND, "devices": [{"name": name, "containerEdits": edits}],
            "containerEdits": {"deviceNodes": [{"path": "/dev/kfd"}]}})
    }

    #[test]
    fn a_spec_declares_the_oldest_version_with_what_it_uses() {
        let nodes = json!({"deviceNodes": [{"path": "/dev/dri/card1"}]});
        let mut spec = one_device("card1", nodes.clone());
        // Device nodes, env and plain bind mounts: what every runtime reads (podman 4.3
        // refused the 0.6.0 this used to declare).
        assert_eq!(min_version(&spec), "0.3.0");
        spec["containerEdits"]["env"] = json!(["A=1"]);
        spec["containerEdits"]["mounts"] =
            json!([{"hostPath": "/a", "containerPath": "/a", "options": ["bind", "ro"]}]);
        assert_eq!(min_version(&spec), "0.3.0");
        spec["containerEdits"]["mounts"][0]["type"] = json!("bind");
        assert_eq!(min_version(&spec), "0.4.0");
        // A claim UID starts with a digit more often than not.
        assert_eq!(
            min_version(&one_device("7f3c-gpu-0", nodes.clone())),
            "0.5.0"
        );
        let host = json!({"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]});
        assert_eq!(min_version(&one_device("card1", host)), "0.5.0");
        let mut annotated = one_device("card1", nodes.clone());
        annotated["devices"][0]["annotations"] = json!({"a": "b"});
        assert_eq!(min_version(&annotated), "0.6.0");
        let mut dotted = one_device("card1", nodes);
        dotted["kind"] = json!("amd.com/gpu.v2");
        assert_eq!(min_version(&dotted), "0.6.0");
    }

    #[test]
    fn validate_wants_a_known_version_with_every_feature_used() {
        let mut spec = one_device("7f3c-gpu-0", json!({"deviceNodes": [{"path": "/dev/x"}]}));
        spec["cdiVersion"] = json!("0.5.0");
        validate(&spec).unwrap();
        spec["cdiVersion"] = json!("0.6.0");
        validate(&spec).unwrap();
        spec["cdiVersion"] = json!("0.4.0");
        assert!(validate(&spec).unwrap_err().contains("needs 0.5.0"));
        spec["cdiVersion"] = json!("0.9.0");
        assert!(validate(&spec).unwrap_err().contains("not one of"));
    }
}
