//! The AMD and NVIDIA device plugins: arguments, hook install, DaemonSets, placement.

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, SecurityContext,
};

use crate::names::*;

use crate::settings::{PodPlacement, Settings};

use super::*;

/// The AMD device plugin flags. `-split_count` only when the operator sets it, so the
/// plugin's per-architecture default (2 on gfx12) applies otherwise.
pub fn device_plugin_args(settings: &Settings) -> Vec<String> {
    let p = &settings.values.device_plugin;
    let mut args = vec![format!("--pulse={}", p.pulse)];
    if let Some(n) = p.split_count {
        args.push(format!("--split_count={n}"));
    }
    args.push(format!(
        "--device_memory_scaling={}",
        p.device_memory_scaling
    ));
    if p.report_node_capacity {
        args.push(s("--report_node_capacity"));
    }
    args.push(format!("--dev-root={HOST_DEV_MOUNT}"));
    if p.slice_partitions {
        args.push(s("--slice-partitions"));
    }
    if !p.exporter_socket.is_empty() {
        args.push(format!("--exporter-socket={}", p.exporter_socket));
    }
    if p.cdi.enabled {
        args.push(s("--cdi"));
        args.push(format!("--cdi-spec-dir={}", p.cdi.spec_dir));
    }
    args
}

/// The directory of the exporter's socket (mounted read-only at the same path), if used.
pub fn exporter_socket_dir(settings: &Settings) -> Option<String> {
    let socket = &settings.values.device_plugin.exporter_socket;
    let (dir, _) = socket.rsplit_once('/')?;
    Some(if dir.is_empty() {
        s("/")
    } else {
        dir.to_owned()
    })
}

/// The host's `/dev`, read-only, where the AMD plugin opens `dri/renderD<N>` for health.
pub const HOST_DEV_MOUNT: &str = "/host/dev";

/// The AMD hook directory on the host (`$HOST_HOOK_PATH/vgpu`).
pub fn host_hook_dir(settings: &Settings) -> String {
    hook_dir_of(&settings.values.device_plugin.host_hook_path)
}

/// The init-container script that installs the AMD hook atomically.
pub fn hook_install_script() -> String {
    install_script(HOOK_IN_IMAGE, "libamvgpu.so")
}

/// The init-container script that installs the NVIDIA hook atomically.
pub fn nvidia_hook_install_script() -> String {
    install_script(NVIDIA_HOOK_IN_IMAGE, "libvgpu.so")
}

/// The AMD device plugin DaemonSet (hook installed atomically by an init container).
pub fn device_plugin_daemon_set(settings: &Settings) -> Object {
    let p = &settings.values.device_plugin;
    let hook_dir = host_hook_dir(settings);
    let plugin_security = if p.privileged {
        SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }
    } else {
        // uid 0 owns kubelet's socket directory, the cgroup files and the hook directory;
        // no capability is needed on top of that (discovery reads sysfs only).
        SecurityContext {
            run_as_user: Some(0),
            ..restricted(&[])
        }
    };
    let mut mounts = vec![
        mount("device-plugins", DEVICE_PLUGIN_DIR, false),
        mount("sys", "/sys", true),
        mount("cgroup", "/sys/fs/cgroup", false),
        mount("dev", HOST_DEV_MOUNT, true),
        mount("hook", &hook_dir, false),
    ];
    let mut volumes = vec![
        host_path("device-plugins", DEVICE_PLUGIN_DIR, Some("Directory")),
        host_path("sys", "/sys", Some("Directory")),
        host_path("cgroup", "/sys/fs/cgroup", Some("Directory")),
        host_path("dev", "/dev", Some("Directory")),
        host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
    ];
    // The exporter's socket: connect() works through a read-only mount (sockets are not
    // subject to it), and the directory may appear after the plugin starts.
    if let Some(dir) = exporter_socket_dir(settings) {
        mounts.push(mount("exporter", &dir, true));
        volumes.push(host_path("exporter", &dir, Some("DirectoryOrCreate")));
    }
    // The CDI spec directory, writable only when the plugin writes a spec there.
    if p.cdi.enabled {
        mounts.push(mount("cdi", &p.cdi.spec_dir, false));
        volumes.push(host_path("cdi", &p.cdi.spec_dir, Some("DirectoryOrCreate")));
    }
    daemon_set(
        DEVICE_PLUGIN,
        &settings.namespace,
        PodSpec {
            init_containers: Some(vec![install_container(
                settings,
                hook_install_script(),
                &hook_dir,
            )]),
            containers: vec![Container {
                name: s("device-plugin"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/k8s-device-plugin")]),
                args: Some(device_plugin_args(settings)),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOST_HOOK_PATH", &p.host_hook_path),
                    env("OPERATING_MODE", &p.operating_mode),
                ]),
                resources: resources(&p.pod.resources),
                volume_mounts: Some(mounts),
                security_context: Some(plugin_security),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        },
        &device_plugin_placement(settings),
    )
}

/// The device plugin's placement: its values, and with `draPlugin.enabled` never on a node
/// labelled for DRA (the requirement is added to every required node-selector term, since
/// terms are ORed).
pub fn device_plugin_placement(settings: &Settings) -> PodPlacement {
    let mut placement = settings.values.device_plugin.pod.clone();
    if !settings.values.dra_plugin.enabled {
        return placement;
    }
    let not_dra = NodeSelectorRequirement {
        key: s(AMD_MODE_LABEL),
        operator: s("NotIn"),
        values: Some(vec![s(AMD_MODE_DRA)]),
    };
    let node_affinity = placement
        .affinity
        .node_affinity
        .get_or_insert_with(Default::default);
    let required = node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Default::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(not_dra.clone());
    }
    placement
}

/// The NVIDIA device plugin flags.
pub fn nvidia_device_plugin_args(settings: &Settings) -> Vec<String> {
    let p = &settings.values.nvidia_device_plugin;
    let mut args = vec![
        format!("--device-split-count={}", p.device_split_count),
        format!("--device-memory-scaling={}", p.device_memory_scaling),
        format!("--device-cores-scaling={}", p.device_cores_scaling),
    ];
    if p.report_node_capacity {
        args.push(s("--report-node-capacity"));
    }
    args
}

/// The NVIDIA device plugin DaemonSet: NVML from the driver the runtime exposes, the CUDA
/// hook installed like the AMD one; the plugin writes `vgpu/ld.so.preload` and the
/// per-container cache directories under the hook directory (which the monitor reads).
pub fn nvidia_device_plugin_daemon_set(settings: &Settings) -> Object {
    let p = &settings.values.nvidia_device_plugin;
    let hook_dir = hook_dir_of(&p.host_hook_path);
    daemon_set(
        NVIDIA_DEVICE_PLUGIN,
        &settings.namespace,
        PodSpec {
            runtime_class_name: (!p.runtime_class_name.is_empty())
                .then(|| p.runtime_class_name.clone()),
            init_containers: Some(vec![install_container(
                settings,
                nvidia_hook_install_script(),
                &hook_dir,
            )]),
            containers: vec![Container {
                name: s("device-plugin"),
                image: Some(settings.values.node_image().reference()),
                image_pull_policy: Some(settings.values.images.pull_policy.clone()),
                command: Some(vec![s("/usr/bin/nvidia-device-plugin")]),
                args: Some(nvidia_device_plugin_args(settings)),
                env: Some(vec![
                    env_field("NODE_NAME", "spec.nodeName"),
                    env("HOOK_PATH", &p.host_hook_path),
                    // The NVIDIA Container Toolkit mounts the driver's libraries (NVML) and
                    // device nodes into containers that ask for them.
                    env("NVIDIA_VISIBLE_DEVICES", "all"),
                    env("NVIDIA_DRIVER_CAPABILITIES", "utility"),
                ]),
                resources: resources(&p.pod.resources),
                volume_mounts: Some(vec![
                    mount("device-plugins", DEVICE_PLUGIN_DIR, false),
                    mount("hook", &hook_dir, false),
                ]),
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    ..restricted(&[])
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                host_path("device-plugins", DEVICE_PLUGIN_DIR, Some("Directory")),
                host_path("hook", &hook_dir, Some("DirectoryOrCreate")),
            ]),
            ..Default::default()
        },
        &p.pod,
    )
}
