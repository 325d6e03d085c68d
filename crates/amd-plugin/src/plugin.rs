//! Wiring of the running plugin: publisher loop, health loop, dmem writer, kubelet sessions.
//! The publisher loop is `hami_plugin_core::publisher_loop`, timed by `refresh_schedule`.

use std::time::Duration;

use tokio::sync::watch;

use crate::allocate_plan::PlanSettings;
use crate::cli::Args;
use crate::dmem::spawn_writer;
use crate::grpc_server::kubelet_devices;
use crate::kube_shell::KubeAllocator;
use crate::node_publisher::NodePublisher;
use crate::registration::RegistrationSettings;
use hami_plugin_core::kubelet_session::{SessionConfig, serve_then_join, shutdown_on_signal};
use hami_plugin_core::publisher_loop::{Publisher, run_publisher};
use hami_plugin_core::refresh_schedule::RefreshPolicy;

/// Node event reason when the dmem controller is absent.
pub const DMEM_UNAVAILABLE: &str = crate::dmem_delegation::REASON_UNAVAILABLE;

/// Socket file name of the plugin (the reference's `amd.com_<resource>`).
pub const ENDPOINT: &str = "amd.com_gpu";

/// Runs the plugin until `shutdown` turns true.
pub async fn serve(
    args: Args,
    settings: RegistrationSettings,
    client: kube::Client,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let node = args
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("NODE_NAME is not set: set it to the node this plugin runs on (the DaemonSet passes spec.nodeName)"))?;
    let (devices_tx, devices_rx) = watch::channel(Vec::new());
    let oversubscribe = settings.device_memory_scaling > 1.0;
    let mut publisher = NodePublisher::new(
        client.clone(),
        node.clone(),
        args.sysfs_root.clone(),
        args.dev_root.clone(),
        settings,
        args.report_node_capacity,
        devices_tx,
    );
    publisher.exporter_socket = Some(args.exporter_socket.clone());
    publisher.handshake_period_secs = args.register_interval.max(1);
    // First publication before serving, so kubelet never sees an empty list by mistake.
    if let Err(e) = publisher.refresh().await {
        tracing::warn!("first node publication failed, retrying in the background: {e}");
    }
    let interval = Duration::from_secs(args.register_interval.max(1));
    let pulse = (args.pulse > 0).then(|| Duration::from_secs(args.pulse));
    let policy = RefreshPolicy {
        interval,
        retry_after_failure: Duration::from_secs(5),
        // Health between publications at the pulse, else once per interval.
        health_every: Some(pulse.unwrap_or(interval)),
    };
    let publisher_task = tokio::spawn(run_publisher(publisher, policy, shutdown.clone()));
    // Whether pod cgroups can get dmem.max: checked at start and every interval, each
    // change published once (annotation, Node Event, log), not once per Allocate.
    tokio::spawn(crate::dmem_watch::watch_delegation(
        client.clone(),
        node.clone(),
        args.cgroup_root.clone(),
        interval,
        shutdown.clone(),
    ));
    let dmem = spawn_writer(args.cgroup_root.clone(), Duration::from_secs(60));
    let hook = args.host_hook_path.join("vgpu/libamvgpu.so");
    let allocator = KubeAllocator::new(
        client,
        node,
        devices_rx.clone(),
        PlanSettings {
            hook_host_path: hook.display().to_string(),
            oversubscribe,
            cache_host_root: args
                .host_hook_path
                .join("vgpu/containers")
                .display()
                .to_string(),
            cdi: args.cdi,
            ..Default::default()
        },
        Some(dmem),
    );
    if args.cdi {
        // The spec follows the device list (a GPU gone or back rewrites it).
        let mut watch_devices = devices_rx.clone();
        let dir = args.cdi_spec_dir.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let devices = watch_devices.borrow_and_update().clone();
                match crate::cdi::write_spec(&dir, &devices) {
                    Ok(()) => {
                        tracing::info!(dir = %dir.display(), devices = devices.len(), "CDI spec written")
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), "cannot write the CDI spec: {e}")
                    }
                }
                tokio::select! {
                    changed = watch_devices.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
    }
    let resource = hami_protocol::names::AMD.resource_count;
    let config = SessionConfig::new(args.device_plugin_dir.clone(), ENDPOINT, resource);
    let lister = |d: &Vec<_>| kubelet_devices(d);
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

    async fn recheck_health(&mut self) {
        NodePublisher::recheck_health(self).await
    }
}

/// `k8s-device-plugin` without a subcommand: serve until SIGINT/SIGTERM.
pub async fn run(args: Args, settings: RegistrationSettings) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!("cannot build a Kubernetes client (in-cluster config or KUBECONFIG): {e}")
    })?;
    let rx = shutdown_on_signal();
    serve(args, settings, client, rx).await
}
