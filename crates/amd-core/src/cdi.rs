//! The CDI option (seed: device nodes "或 CDI 名称", or CDI names): with `--cdi`, Allocate
//! answers with CDI device names (`amd.com/gpu=card<N>`) instead of device nodes, and the
//! plugin keeps a CDI spec (`<cdi dir>/amd.com-gpu.json`, CDI 0.6.0, kind `amd.com/gpu`)
//! that tells the runtime what each name injects: the card's `/dev/dri/card<N>` and
//! `/dev/dri/renderD<M>`, and `/dev/kfd` for every device (common edits). Env, mounts and
//! everything else of the response stay as they are. The upstream plugin uses the same
//! kind, names, version and file name.
//!
//! The names, the spec and its validation (pure); the plugin's `cdi::write_spec` writes it.

use serde_json::{Value, json};

use hami_amd_discovery::registration::RegisteredDevice;
use hami_protocol::container_plan::ContainerPlan;

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
