//! Wiring of the running plugin: NVML, the publisher loop (`hami_plugin_core::publisher_loop`,
//! timed by `refresh_schedule`), the hook's preload file, kubelet sessions.

use std::path::Path;
use std::time::Duration;

use hami_deviceplugin_api::HEALTHY;
use hami_plugin_core::kubelet_session::{SessionConfig, serve_then_join, shutdown_on_signal};
use hami_plugin_core::publisher_loop::{Publisher, run_publisher};
use hami_plugin_core::refresh_schedule::RefreshPolicy;
use tokio::sync::watch;

use crate::allocate_plan::{HOOK_CONTAINER_PATH, PlanSettings};
use crate::cli::Args;
use crate::kube_shell::KubeAllocator;
use crate::node_publisher::NodePublisher;
use crate::nvml::Nvml;
use crate::registration::{NvidiaSettings, RegisteredGpu};

/// Socket file name of the plugin (the reference's `nvidia-<resource>.sock`).
pub const ENDPOINT: &str = "nvidia-gpu.sock";

/// The kubelet device list: `count` ids per GPU (`<UUID>#<k>`), with the GPU's health.
pub fn kubelet_devices(devices: &[RegisteredGpu]) -> Vec<hami_deviceplugin_api::v1beta1::Device> {
    devices
        .iter()
        .flat_map(|d| {
            let health = if d.info.health {
                HEALTHY
            } else {
                hami_deviceplugin_api::UNHEALTHY
            };
            d.kubelet_ids()
                .map(move |id| hami_deviceplugin_api::v1beta1::Device {
                    id: id.to_string(),
                    health: health.to_owned(),
                    topology: None,
                })
        })
        .collect()
}

/// Writes `<hook dir>/ld.so.preload` naming the hook's container path, unless it already
/// does: mounted at `/etc/ld.so.preload`, it makes the dynamic linker load the hook into
/// every process of a sliced container.
pub fn write_ld_so_preload(path: &Path) -> std::io::Result<()> {
    let wanted = format!("{HOOK_CONTAINER_PATH}\n");
    if std::fs::read_to_string(path).is_ok_and(|t| t == wanted) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Write then rename, so a container never mounts a half-written file.
    let tmp = path.with_extension("preload.tmp");
    std::fs::write(&tmp, wanted)?;
    std::fs::rename(tmp, path)
}

/// Writes a container's hook config (mode 0644, then renamed into place, so a container
/// never mounts a half-written file); the hook reads it through a read-only mount.
pub fn write_hook_config(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("conf.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(tmp, path)
}

/// Removes the hook configs and region anchors (`<pod uid>_<container>.conf|.region` in
/// `config_root`) whose accounting directory in `cache_root` is gone (the monitor removes
/// those of deleted pods), so an anchor never keeps a dead container's region on disk.
pub fn prune_configs(config_root: &Path, cache_root: &Path) {
    let Ok(entries) = std::fs::read_dir(config_root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stem = match (path.file_stem(), path.extension()) {
            (Some(stem), Some(ext)) if ext == "conf" || ext == "region" => stem.to_owned(),
            _ => continue,
        };
        if !cache_root.join(&stem).exists() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Runs the plugin until `shutdown` turns true.
pub async fn serve(
    args: Args,
    settings: NvidiaSettings,
    client: kube::Client,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let node = args
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("NODE_NAME is not set: set it to the node this plugin runs on (the DaemonSet passes spec.nodeName)"))?;
    let nvml = Nvml::load(&args.nvml_library)?;
    let vgpu = args.hook_path.join("vgpu");
    let preload = vgpu.join("ld.so.preload");
    write_ld_so_preload(&preload).map_err(|e| {
        anyhow::anyhow!(
            "cannot write {}: {e}; the plugin needs the host hook directory (HOOK_PATH) mounted read-write",
            preload.display()
        )
    })?;
    let (devices_tx, devices_rx) = watch::channel(Vec::new());
    let oversubscribe = settings.memory_scaling > 1.0;
    // Critical XIDs make a GPU unhealthy (xid_health.rs); watched on a thread of their own.
    let recovery =
        (args.xid_recovery_seconds > 0).then(|| Duration::from_secs(args.xid_recovery_seconds));
    let xid_health = std::sync::Arc::new(std::sync::Mutex::new(crate::xid_health::XidHealth::new(
        recovery,
    )));
    tokio::spawn(crate::xid_watch::watch_xids(
        nvml,
        xid_health.clone(),
        recovery,
        devices_tx.clone(),
        client.clone(),
        node.clone(),
        shutdown.clone(),
    ));
    let mut publisher = NodePublisher {
        client: client.clone(),
        node: node.clone(),
        nvml,
        settings,
        report_node_capacity: args.report_node_capacity,
        devices: devices_tx,
        handshake_period_secs: args.register_interval.max(1),
        xid_health: Some(xid_health),
    };
    // First publication before serving, so kubelet never sees an empty list by mistake.
    if let Err(e) = publisher.refresh().await {
        tracing::warn!("first node publication failed, retrying in the background: {e}");
    }
    let interval = Duration::from_secs(args.register_interval.max(1));
    let policy = RefreshPolicy {
        interval,
        retry_after_failure: Duration::from_secs(5).min(interval),
        // Health (NVML) is read by each publication.
        health_every: None,
    };
    let publisher_task = tokio::spawn(run_publisher(publisher, policy, shutdown.clone()));
    let allocator = KubeAllocator::new(
        client,
        node,
        devices_rx.clone(),
        PlanSettings {
            hook_host_path: vgpu.join("libvgpu.so").display().to_string(),
            ld_so_preload_host_path: preload.display().to_string(),
            cache_host_root: vgpu.join("containers").display().to_string(),
            config_host_root: vgpu.join("configs").display().to_string(),
            oversubscribe,
        },
    );
    let pulse = (args.pulse > 0).then(|| Duration::from_secs(args.pulse));
    let resource = hami_protocol::names::NVIDIA.resource_count;
    let config = SessionConfig::new(args.device_plugin_dir.clone(), ENDPOINT, resource);
    let lister = |d: &Vec<RegisteredGpu>| kubelet_devices(d);
    serve_then_join(
        config,
        devices_rx,
        lister,
        allocator,
        pulse,
        shutdown,
        publisher_task,
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))
}

impl Publisher for NodePublisher {
    async fn refresh(&mut self) -> Result<(), String> {
        NodePublisher::refresh(self).await
    }
}

/// `nvidia-device-plugin` without a subcommand: serve until SIGINT/SIGTERM.
pub async fn run(args: Args, settings: NvidiaSettings) -> anyhow::Result<()> {
    if args.node_name.as_deref().is_none_or(str::is_empty) {
        anyhow::bail!(
            "NODE_NAME is not set: set it to the node this plugin runs on (the DaemonSet passes spec.nodeName)"
        );
    }
    let client = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!("cannot build a Kubernetes client (in-cluster config or KUBECONFIG): {e}")
    })?;
    let rx = shutdown_on_signal();
    serve(args, settings, client, rx).await
}

#[cfg(test)]
mod prune_tests {
    #[test]
    fn configs_of_gone_containers_are_pruned() {
        let root = std::env::temp_dir().join(format!("nv-prune-{}", std::process::id()));
        let (configs, containers) = (root.join("configs"), root.join("containers"));
        std::fs::create_dir_all(containers.join("uid_a")).unwrap();
        std::fs::create_dir_all(&configs).unwrap();
        for name in [
            "uid_a.conf",
            "uid_a.region",
            "uid_b.conf",
            "uid_b.region",
            "other",
        ] {
            std::fs::write(configs.join(name), b"x").unwrap();
        }
        super::prune_configs(&configs, &containers);
        let mut left: Vec<String> = std::fs::read_dir(&configs)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["other", "uid_a.conf", "uid_a.region"]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_file_names_the_hook_and_is_rewritten_when_wrong() {
        let dir = std::env::temp_dir().join(format!("nv-preload-{}", std::process::id()));
        let path = dir.join("vgpu/ld.so.preload");
        write_ld_so_preload(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "/usr/local/vgpu/libvgpu.so\n"
        );
        std::fs::write(&path, "/other.so\n").unwrap();
        write_ld_so_preload(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "/usr/local/vgpu/libvgpu.so\n"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
