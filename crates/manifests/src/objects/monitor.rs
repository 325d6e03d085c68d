//! The monitor (DaemonSet, Service, ServiceMonitors) and the node labeller's DaemonSet.

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};

use serde_json::json;

use crate::names::*;

use crate::settings::Settings;

use super::*;

/// The monitor DaemonSet: reads the hooks' shared regions and the host's /proc (hostPID).
/// Both plugins keep their cache directories under the same hook directory (validated), so
/// one `HOOK_PATH` covers AMD and NVIDIA containers.
pub fn monitor_daemon_set(settings: &Settings) -> Object {
    let hook_dir = host_hook_dir(settings);
    let m = &settings.values.monitor;
    daemon_set(
        MONITOR,
        &settings.namespace,
        PodSpec {
            host_pid: Some(true),
            containers: vec![Container {
                name: s("monitor"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-vgpu-monitor")]),
                args: Some(vec![
                    format!("--metrics-bind-address=:{MONITOR_METRICS_PORT}"),
                    format!("--legacy-metrics={}", m.legacy_metrics),
                ]),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOOK_PATH", &hook_dir),
                    env("HAMI_SYS_ROOT", "/host/sys"),
                    // The monitor reports only pods this scheduler placed.
                    env(
                        "HAMI_SCHEDULER_NAME",
                        &settings.values.scheduler.scheduler_name,
                    ),
                ]),
                ports: Some(vec![port("metrics", MONITOR_METRICS_PORT)]),
                resources: resources(&m.pod.resources),
                volume_mounts: Some(vec![
                    mount("hook", &hook_dir, false),
                    mount("sys", "/host/sys", true),
                ]),
                // fdinfo of other users' processes needs ptrace read access.
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&["SYS_PTRACE"])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
                host_path("sys", "/sys", Some("Directory")),
            ]),
            ..Default::default()
        },
        &m.pod,
    )
}

/// The monitor's metrics Service (scraped by the ServiceMonitor, or by annotation).
pub fn monitor_service(settings: &Settings) -> Object {
    cluster_ip_service(
        MONITOR,
        &settings.namespace,
        &[("metrics", MONITOR_METRICS_PORT)],
    )
}

/// prometheus-operator ServiceMonitors for the scheduler and the monitor.
pub fn service_monitors(settings: &Settings) -> Vec<Object> {
    let sm = &settings.values.service_monitor;
    let one = |component: &str| {
        let mut meta_labels = labels(component);
        meta_labels.extend(sm.labels.clone());
        Object::Custom(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": component, "namespace": settings.namespace, "labels": meta_labels},
            "spec": {
                "selector": {"matchLabels": labels(component)},
                "endpoints": [{"port": "metrics", "interval": sm.interval}]
            }
        }))
    };
    let mut out = vec![one(SCHEDULER)];
    if settings.values.monitor.enabled {
        out.push(one(MONITOR));
    }
    out
}

/// The node labeller DaemonSet (reads sysfs, labels its Node).
pub fn node_labeller_daemon_set(settings: &Settings) -> Object {
    let l = &settings.values.node_labeller;
    daemon_set(
        NODE_LABELLER,
        &settings.namespace,
        PodSpec {
            containers: vec![Container {
                name: s("node-labeller"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-node-labeller")]),
                args: Some(vec![s("--sysfs-root=/host/sys")]),
                env: Some(vec![env_field("DS_NODE_NAME", "spec.nodeName")]),
                resources: resources(&l.pod.resources),
                volume_mounts: Some(vec![mount("sys", "/host/sys", true)]),
                security_context: Some(SecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(65532),
                    ..restricted(&[])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![host_path("sys", "/sys", Some("Directory"))]),
            ..Default::default()
        },
        &l.pod,
    )
}
