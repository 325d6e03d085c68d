//! The AMD device plugin sees, inside its container, exactly what its DaemonSet mounts.
//!
//! The DaemonSet is rendered (by Helm, and typed); a container filesystem is laid out from
//! its volumes and mounts only, over a host tree built from a real KFD capture (8 × MI210:
//! sysfs and /dev); the container's own `/dev` is the runtime's (no GPU nodes). The plugin's
//! flags are parsed with its own command line and its discovery + health check run at the
//! paths those flags name inside that filesystem. Every GPU must register healthy: health
//! opens `<dev-root>/dri/renderD<N>`, which a DaemonSet without the host's /dev cannot.

use std::path::{Path, PathBuf};

use crate::peers::Case;
use clap::Parser;
use hami_manifests::{Settings, names};
use serde_json::{Value, json};

/// Host paths that are not part of the fixture exist as empty directories.
fn host_path(host: &Path, p: &str) -> PathBuf {
    let full = host.join(p.trim_start_matches('/'));
    if !full.exists() {
        std::fs::create_dir_all(&full).unwrap();
    }
    full
}

/// Lays out `<root>` from the pod's hostPath volumes and the container's mounts (bind
/// mounts become symlinks: enough for reading). Returns the container's root.
fn container_root(host: &Path, pod_spec: &Value, container: &Value, root: &Path) {
    // What every container gets from the runtime whatever it mounts: a private /dev.
    std::fs::create_dir_all(root.join("dev")).unwrap();
    for n in ["null", "zero", "random", "urandom", "tty", "full"] {
        std::fs::write(root.join("dev").join(n), "").unwrap();
    }
    let volumes = pod_spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut mounts: Vec<(String, String)> = container["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap();
            let vol = volumes
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("mount {name} has no volume"));
            let src = vol["hostPath"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("volume {name} is not a hostPath"));
            (
                m["mountPath"].as_str().unwrap().to_string(),
                src.to_string(),
            )
        })
        .collect();
    mounts.sort_by_key(|(path, _)| path.len());
    let mut done: Vec<(String, String)> = Vec::new();
    for (path, src) in mounts {
        // A mount inside an earlier one must show the same host directory it would show
        // through the outer mount (true of /sys/fs/cgroup under /sys).
        if let Some((outer, outer_src)) = done
            .iter()
            .find(|(p, _)| path.starts_with(&format!("{p}/")))
        {
            let through_outer = format!("{outer_src}{}", &path[outer.len()..]);
            assert_eq!(
                through_outer, src,
                "mount {path} shadows {outer} with another directory"
            );
            host_path(host, &src);
            continue;
        }
        let target = root.join(path.trim_start_matches('/'));
        if target.exists() {
            std::fs::remove_dir_all(&target).unwrap();
        }
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(host_path(host, &src), &target).unwrap();
        done.push((path, src));
    }
}

/// Discovery + health as the plugin runs them, inside the container laid out from `ds`.
fn registered_health(ds: &Value) -> (usize, Vec<bool>) {
    let host_tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let host = host_tree.sysfs_root().parent().unwrap().to_path_buf();
    let spec = &ds["spec"]["template"]["spec"];
    let plugin = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "device-plugin")
        .unwrap();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("hami-dp-root-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    container_root(&host, spec, plugin, &root);
    let argv: Vec<String> = std::iter::once("k8s-device-plugin".to_string())
        .chain(serde_json::from_value::<Vec<String>>(plugin["args"].clone()).unwrap())
        .collect();
    let args = hami_amd_plugin::cli::Args::try_parse_from(argv).unwrap();
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap());
    let report = hami_amd_plugin::discover_report::build_report(
        &inside(&args.sysfs_root),
        &inside(&args.dev_root),
        &args.registration_settings().unwrap(),
    )
    .unwrap();
    let health = report
        .registration
        .devices
        .iter()
        .map(|d| d.info.health)
        .collect();
    let _ = std::fs::remove_dir_all(&root);
    (report.discovery.gpus.len(), health)
}

fn device_plugin(objects: Vec<Value>) -> Value {
    objects
        .into_iter()
        .find(|v| v["kind"] == "DaemonSet" && v["metadata"]["name"] == names::DEVICE_PLUGIN)
        .expect("the device plugin DaemonSet")
}

#[test]
fn every_gpu_registers_healthy_inside_the_rendered_daemonset() {
    let answer = crate::peers::run(
        &[
            Case::new("defaults", "hami-system", "v1.33.0", json!({})),
            Case::new(
                "privileged",
                "hami-system",
                "v1.33.0",
                json!({"devicePlugin": {"privileged": true}}),
            ),
        ],
        &[],
    );
    let typed = hami_manifests::objects::device_plugin_daemon_set(&Settings::default())
        .to_value()
        .unwrap();
    let mut daemon_sets = vec![("typed", typed)];
    for r in &answer.cases {
        assert!(r.error.is_none(), "{:?}", r.error);
        daemon_sets.push((
            "helm",
            device_plugin(r.objects().into_iter().map(|(_, v)| v).collect()),
        ));
    }
    for (what, ds) in daemon_sets {
        let (gpus, health) = registered_health(&ds);
        assert_eq!(gpus, 8, "{what}");
        assert_eq!(health.len(), 8, "{what}");
        assert!(
            health.iter().all(|h| *h),
            "{what}: GPUs unhealthy inside the DaemonSet's container: {health:?}"
        );
        // What health opens is mounted read-only.
        let plugin = &ds["spec"]["template"]["spec"]["containers"][0];
        let dev = plugin["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "dev")
            .unwrap_or_else(|| panic!("{what}: no /dev mount"));
        assert_eq!(dev["readOnly"], true, "{what}");
    }
}

#[test]
fn the_check_fails_without_the_hosts_dev() {
    // The same DaemonSet less its /dev mount (what shipped before): every GPU unhealthy,
    // so the test above cannot pass by accident.
    let mut ds = hami_manifests::objects::device_plugin_daemon_set(&Settings::default())
        .to_value()
        .unwrap();
    let c = &mut ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    let kept: Vec<Value> = c
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] != "dev")
        .cloned()
        .collect();
    *c = Value::Array(kept);
    let (gpus, health) = registered_health(&ds);
    assert_eq!(gpus, 8);
    assert!(health.iter().all(|h| !h), "{health:?}");
}
