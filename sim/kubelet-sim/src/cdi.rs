//! CDI device injection as a container runtime does it (containerd's and CRI-O's CDI
//! support): a fully qualified id `<vendor>/<class>=<name>` names a device of the spec of
//! that kind; the container gets the device's `containerEdits` and, once per spec, the
//! spec's own. Env (`K=V`), device nodes (`path`, `hostPath` defaulting to `path`) and
//! mounts (`ro` among `options` = read-only) are applied; hooks, `intelRdt` and
//! `additionalGIDs` are not (the stand-in runtime has none of them), and a spec that uses
//! them is refused rather than half-applied. Pure: the specs come in as parsed JSON.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::container_runtime::MountSpec;

/// What a container gets from CDI devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// Env, in application order (a later spec's value wins, as in the runtimes).
    pub env: BTreeMap<String, String>,
    /// Device nodes: (container path, host path).
    pub devices: Vec<(String, String)>,
    /// Mounts.
    pub mounts: Vec<MountSpec>,
}

fn apply(edits: &Value, out: &mut Edits, id: &str) -> Result<(), String> {
    let Some(obj) = edits.as_object() else {
        return Ok(());
    };
    for key in obj.keys() {
        if !matches!(key.as_str(), "env" | "deviceNodes" | "mounts") {
            return Err(format!(
                "CDI device {id}: containerEdits.{key} is not supported by this runtime"
            ));
        }
    }
    for e in obj
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = e
            .as_str()
            .ok_or_else(|| format!("CDI device {id}: env entry {e} is not a string"))?;
        let (k, v) = text
            .split_once('=')
            .ok_or_else(|| format!("CDI device {id}: env entry {text:?} has no '='"))?;
        out.env.insert(k.to_owned(), v.to_owned());
    }
    for d in obj
        .get("deviceNodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let path = d["path"]
            .as_str()
            .ok_or_else(|| format!("CDI device {id}: a device node without path"))?;
        let host = d["hostPath"].as_str().unwrap_or(path);
        let entry = (path.to_owned(), host.to_owned());
        if !out.devices.contains(&entry) {
            out.devices.push(entry);
        }
    }
    for m in obj
        .get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(host), Some(container)) = (m["hostPath"].as_str(), m["containerPath"].as_str())
        else {
            return Err(format!(
                "CDI device {id}: a mount needs hostPath and containerPath"
            ));
        };
        let read_only = m["options"]
            .as_array()
            .is_some_and(|o| o.iter().any(|x| x == "ro"));
        out.mounts.push(MountSpec {
            container_path: container.to_owned(),
            host_path: host.to_owned(),
            read_only,
        });
    }
    Ok(())
}

/// Resolves `ids` against `specs`; an unknown kind or device is an error (the runtime
/// refuses to create the container).
pub fn resolve(specs: &[Value], ids: &[String]) -> Result<Edits, String> {
    let mut out = Edits::default();
    let mut spec_edits_done: BTreeSet<usize> = BTreeSet::new();
    for id in ids {
        let (kind, name) = id
            .split_once('=')
            .ok_or_else(|| format!("CDI device id {id:?} is not <vendor>/<class>=<name>"))?;
        let found = specs.iter().enumerate().find_map(|(i, s)| {
            if s["kind"] != kind {
                return None;
            }
            s["devices"]
                .as_array()?
                .iter()
                .find(|d| d["name"] == name)
                .map(|d| (i, s, d))
        });
        let Some((i, spec, device)) = found else {
            return Err(format!("CDI device {id} is not in any spec"));
        };
        apply(&device["containerEdits"], &mut out, id)?;
        if spec_edits_done.insert(i) {
            apply(&spec["containerEdits"], &mut out, id)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> Value {
        json!({
            "cdiVersion": "0.6.0", "kind": "k8s.amdgpu.hami-rs.io/claim",
            "devices": [
                {"name": "u-gpu-0", "containerEdits": {"deviceNodes": [
                    {"path": "/dev/dri/card1"}, {"path": "/dev/dri/renderD128"}]}},
                {"name": "u-gpu-1", "containerEdits": {"deviceNodes": [
                    {"path": "/dev/dri/card2", "hostPath": "/host/card2"}]}},
            ],
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/kfd"}],
                "env": ["HSA_CU_MASK=0:0-39", "LD_AUDIT=/usr/local/vgpu/libamvgpu.so"],
                "mounts": [{"hostPath": "/h/lib.so", "containerPath": "/c/lib.so", "options": ["bind", "ro"]},
                           {"hostPath": "/h/cache", "containerPath": "/c/cache", "options": ["bind"]}],
            },
        })
    }

    #[test]
    fn device_and_spec_edits_apply_once() {
        let ids = [
            "k8s.amdgpu.hami-rs.io/claim=u-gpu-0".to_owned(),
            "k8s.amdgpu.hami-rs.io/claim=u-gpu-1".to_owned(),
        ];
        let e = resolve(&[spec()], &ids).unwrap();
        assert_eq!(e.env["HSA_CU_MASK"], "0:0-39");
        assert_eq!(
            e.devices,
            [
                ("/dev/dri/card1".to_owned(), "/dev/dri/card1".to_owned()),
                ("/dev/dri/renderD128".into(), "/dev/dri/renderD128".into()),
                ("/dev/kfd".into(), "/dev/kfd".into()),
                ("/dev/dri/card2".into(), "/host/card2".into()),
            ]
        );
        assert_eq!(e.mounts.len(), 2, "spec edits once: {:?}", e.mounts);
        assert!(e.mounts[0].read_only && !e.mounts[1].read_only);
    }

    #[test]
    fn unknown_ids_and_unsupported_edits_are_refused() {
        let e = resolve(&[spec()], &["k8s.amdgpu.hami-rs.io/claim=nope".into()]).unwrap_err();
        assert!(e.contains("not in any spec"), "{e}");
        assert!(
            resolve(&[spec()], &["no-equals".into()])
                .unwrap_err()
                .contains("<vendor>")
        );
        let mut s = spec();
        s["containerEdits"]["hooks"] = json!([{"hookName": "createContainer", "path": "/bin/x"}]);
        let e = resolve(&[s], &["k8s.amdgpu.hami-rs.io/claim=u-gpu-0".into()]).unwrap_err();
        assert!(e.contains("hooks is not supported"), "{e}");
        let mut s = spec();
        s["containerEdits"]["env"] = json!(["NOEQUALS"]);
        assert!(resolve(&[s], &["k8s.amdgpu.hami-rs.io/claim=u-gpu-0".into()]).is_err());
    }
}
