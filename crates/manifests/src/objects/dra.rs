//! The AMD DRA driver: arguments, DeviceClass, DaemonSet.

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};

use crate::names::*;

use crate::settings::Settings;

use super::*;

/// The DRA driver's flags (the chart's `dra-plugin.yaml` writes the same). The hook and the
/// per-claim files live under the hook directory, mounted at its host path, so the paths
/// the CDI specs name are host paths.
pub fn dra_plugin_args(settings: &Settings) -> Vec<String> {
    let d = &settings.values.dra_plugin;
    let hook_dir = host_hook_dir(settings);
    let mut args = vec![format!("--dev-root={HOST_DEV_MOUNT}")];
    if let Some(n) = d.split_count {
        args.push(format!("--split_count={n}"));
    }
    args.extend([
        format!("--cdi-dir={}", d.cdi_spec_dir),
        format!("--hook-host-path={hook_dir}/libamvgpu.so"),
        format!("--cache-root={hook_dir}/dra"),
        format!("--publish-interval={}", d.publish_interval),
    ]);
    args
}

/// The DeviceClass of the DRA driver's devices; with `draPlugin.extendedResourceName` it
/// also serves `amd.com/gpu` counts (KEP-5004).
pub fn device_class(settings: &Settings) -> Object {
    let d = &settings.values.dra_plugin;
    Object::DeviceClass(DeviceClass {
        metadata: meta(DRA_DRIVER, None, DRA_PLUGIN),
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == \"{DRA_DRIVER}\""),
                }),
            }]),
            extended_resource_name: d
                .extended_resource_name
                .then(|| s(hami_protocol::names::AMD.resource_count)),
            ..Default::default()
        },
    })
}

/// The AMD DRA driver DaemonSet, on the nodes labelled for DRA (hook installed atomically
/// by an init container, as the device plugin does on its nodes).
pub fn dra_plugin_daemon_set(settings: &Settings) -> Object {
    let d = &settings.values.dra_plugin;
    let hook_dir = host_hook_dir(settings);
    let plugin_dir = format!("{KUBELET_PLUGINS_DIR}/{DRA_DRIVER}");
    let mut placement = d.pod.clone();
    placement
        .node_selector
        .insert(s(AMD_MODE_LABEL), s(AMD_MODE_DRA));
    daemon_set(
        DRA_PLUGIN,
        &settings.namespace,
        PodSpec {
            init_containers: Some(vec![install_container(
                settings,
                hook_install_script(),
                &hook_dir,
            )]),
            containers: vec![Container {
                name: s("dra-plugin"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/amdgpu-dra-plugin")]),
                args: Some(dra_plugin_args(settings)),
                env: Some(vec![env_field("NODE_NAME", "spec.nodeName")]),
                resources: resources(&d.pod.resources),
                volume_mounts: Some(vec![
                    mount("plugins-registry", PLUGINS_REGISTRY_DIR, false),
                    mount("plugin", &plugin_dir, false),
                    mount("sys", "/sys", true),
                    mount("cgroup", "/sys/fs/cgroup", false),
                    mount("dev", HOST_DEV_MOUNT, true),
                    mount("cdi", &d.cdi_spec_dir, false),
                    mount("hook", &hook_dir, false),
                ]),
                // uid 0 owns kubelet's plugin directories, the cgroup files (dmem limits)
                // and the hook directory; no capability on top of that.
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&[])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("plugins-registry", PLUGINS_REGISTRY_DIR, Some("Directory")),
                host_path("plugin", &plugin_dir, Some("DirectoryOrCreate")),
                host_path("sys", "/sys", Some("Directory")),
                host_path("cgroup", "/sys/fs/cgroup", Some("Directory")),
                host_path("dev", "/dev", Some("Directory")),
                host_path("cdi", &d.cdi_spec_dir, Some("DirectoryOrCreate")),
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
            ]),
            ..Default::default()
        },
        &placement,
    )
}
