//! The AMD DRA driver's DaemonSet, typed and as real Helm renders the chart, passes flags
//! that the driver's own parser (`hami_amdgpu_dra_plugin::args::Args`) accepts, with the
//! values the operator set; and every path those flags make the driver use is mounted
//! (writable where it writes), at the host's own path where kubelet, the container
//! runtime or a CDI spec names that path on the host.

use std::path::{Path, PathBuf};

use crate::peers::Case;
use clap::Parser;
use hami_amdgpu_dra_plugin::args::Args;
use hami_manifests::settings::{KubeVersion, Settings, Values};
use hami_manifests::{Object, names, objects};
use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};
use serde_json::{Value, json};

/// A Kubernetes version that serves resource.k8s.io/v1.
const KUBE: &str = "v1.36.0";

/// The DRA variants: the defaults, and every driver value set.
fn variants() -> Vec<(&'static str, Value)> {
    vec![
        ("dra-defaults", json!({"draPlugin": {"enabled": true}})),
        (
            "dra-set",
            json!({
                "draPlugin": {"enabled": true, "splitCount": 4, "publishInterval": 10,
                              "cdiSpecDir": "/etc/cdi"},
                "devicePlugin": {"hostHookPath": "/opt/hami/"},
            }),
        ),
    ]
}

fn settings(overrides: &Value) -> Settings {
    let mut merged = serde_json::to_value(Values::default()).unwrap();
    crate::peers::merge(&mut merged, overrides);
    Settings {
        values: Values::from_json(merged).unwrap(),
        kube_version: KubeVersion::parse(KUBE).unwrap(),
        ..Settings::default()
    }
}

/// The mount `path` lies under (the deepest one), and the host path it is there.
fn mounted<'a>(pod: &'a PodSpec, c: &'a Container, path: &Path) -> (&'a VolumeMount, PathBuf) {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{} is not mounted", path.display()));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == m.name)
        .unwrap_or_else(|| panic!("no volume {}", m.name));
    let host = volume
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("volume {} is not a hostPath", m.name));
    let rest = path.strip_prefix(&m.mount_path).unwrap();
    (m, Path::new(&host.path).join(rest))
}

/// The driver's container of the DaemonSet's pod: its flags parse and agree with `s`.
fn check(what: &str, pod: &PodSpec, s: &Settings) {
    let c = pod
        .containers
        .iter()
        .find(|c| c.name == "dra-plugin")
        .unwrap_or_else(|| panic!("{what}: no dra-plugin container"));
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/bin/amdgpu-dra-plugin".to_string()][..]),
        "{what}"
    );
    let argv = std::iter::once("amdgpu-dra-plugin".to_string()).chain(c.args.clone().unwrap());
    let args = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{what}: {e}"));
    let d = &s.values.dra_plugin;
    assert_eq!(args.command, None, "{what}: the DaemonSet serves kubelet");
    assert_eq!(args.driver_name, names::DRA_DRIVER, "{what}");
    assert_eq!(args.split_count, d.split_count, "{what}");
    assert_eq!(args.publish_interval, d.publish_interval, "{what}");
    assert_eq!(args.cdi_dir, Path::new(&d.cdi_spec_dir), "{what}");
    // The node name comes from the downward API (the flag is not passed).
    assert!(
        !c.args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--node-name")),
        "{what}"
    );
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(node_name, Some("spec.nodeName"), "{what}");

    // (path, the driver writes there, the host sees it at the same path): kubelet dials
    // the sockets at the paths the driver registers, the runtime reads the CDI specs on
    // the host, and the specs name the hook and the per-claim files by host path.
    let hook = PathBuf::from(&args.hook_host_path);
    let paths: [(&str, PathBuf, bool, bool); 8] = [
        ("registry", args.registry_dir.clone(), true, true),
        ("plugin", args.plugin_dir(), true, true),
        ("cdi", args.cdi_dir.clone(), true, true),
        ("hook", hook, false, true),
        ("cache", PathBuf::from(&args.cache_root), true, true),
        ("sysfs", args.sysfs_root.clone(), false, false),
        ("dev", args.dev_root.clone(), false, false),
        ("cgroup", args.cgroup_root.clone(), true, false),
    ];
    for (name, path, writes, host_path) in paths {
        let (m, host) = mounted(pod, c, &path);
        if writes {
            assert_ne!(
                m.read_only,
                Some(true),
                "{what}: {name} {} is mounted read-only",
                path.display()
            );
        }
        if host_path {
            assert_eq!(
                host,
                path,
                "{what}: {name} {} is another path on the host",
                path.display()
            );
        }
    }
    assert_eq!(
        args.plugin_dir(),
        Path::new(names::KUBELET_PLUGINS_DIR).join(names::DRA_DRIVER),
        "{what}: kubelet's plugin directory of this driver"
    );
    assert_eq!(
        args.registry_dir,
        Path::new(names::PLUGINS_REGISTRY_DIR),
        "{what}"
    );
}

fn daemon_set_pod(v: Value) -> PodSpec {
    serde_json::from_value(v["spec"]["template"]["spec"].clone()).unwrap()
}

#[test]
fn the_typed_dra_daemon_set_passes_flags_the_driver_parses() {
    for (name, overrides) in variants() {
        let s = settings(&overrides);
        let ds = objects::all(&s, false)
            .unwrap()
            .into_iter()
            .find(|o| {
                matches!(o, Object::DaemonSet(d) if d.metadata.name.as_deref() == Some(names::DRA_PLUGIN))
            })
            .unwrap_or_else(|| panic!("{name}: no DRA DaemonSet"));
        check(name, &daemon_set_pod(ds.to_value().unwrap()), &s);
    }
}

#[test]
fn the_charts_dra_daemon_set_passes_flags_the_driver_parses() {
    let cases: Vec<Case> = variants()
        .into_iter()
        .map(|(name, values)| Case {
            // chart_agreement.rs lints and validates; here only the flags matter.
            lint: false,
            validate: false,
            ..Case::new(name, "hami-system", KUBE, values)
        })
        .collect();
    let answer = crate::peers::run(&cases, &[]);
    for ((name, overrides), rendered) in variants().into_iter().zip(&answer.cases) {
        if let Some(e) = &rendered.error {
            panic!("{name}: Helm refused to render: {e}");
        }
        let ds = rendered
            .objects()
            .into_iter()
            .map(|(_, v)| v)
            .find(|v| v["kind"] == "DaemonSet" && v["metadata"]["name"] == names::DRA_PLUGIN)
            .unwrap_or_else(|| panic!("{name}: the chart renders no DRA DaemonSet"));
        check(
            &format!("chart {name}"),
            &daemon_set_pod(ds),
            &settings(&overrides),
        );
    }
}
