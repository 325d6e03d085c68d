//! Publishing the node's GPUs: rediscover through NVML every interval, feed the device list
//! that ListAndWatch serves, and write `hami.io/node-nvidia-register` (removed when no GPU
//! is offered); with `--report-node-capacity` also `nvidia.com/gpumem` (MiB) and
//! `nvidia.com/gpucores` as node capacity. The same patch writes the register heartbeat
//! `hami.io/node-handshake-nvidia` (`hami_protocol::handshake`), a value that changes at
//! every refresh, so the scheduler can tell a live plugin from a dead one's leftovers.

use hami_plugin_core::node_register::{publish_register, report_capacity};
use hami_protocol::names::{NVIDIA, Vendor};
use hami_protocol::node_register::{DeviceInfo, encode_node_devices};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tokio::sync::watch;

use crate::nvml::Nvml;
use crate::registration::{NvidiaSettings, RegisteredGpu, register};

/// The publisher.
pub struct NodePublisher {
    /// The API client.
    pub client: kube::Client,
    /// The node to publish on.
    pub node: String,
    /// The loaded NVML.
    pub nvml: Nvml,
    /// How GPUs become register entries.
    pub settings: NvidiaSettings,
    /// Also publish `nvidia.com/gpumem` and `nvidia.com/gpucores` as node capacity.
    pub report_node_capacity: bool,
    /// Where the GPUs offered now go (ListAndWatch and Allocate read them).
    pub devices: watch::Sender<Vec<RegisteredGpu>>,
    /// Seconds between refreshes, announced in the heartbeat (`--register-interval`).
    pub handshake_period_secs: u64,
    /// GPUs a critical XID made unhealthy (`xid_watch`), applied to each discovery.
    pub xid_health: Option<crate::xid_watch::SharedXidHealth>,
}

impl NodePublisher {
    /// One refresh: rediscover, serve, publish.
    pub async fn refresh(&mut self) -> Result<(), String> {
        let nvml = self.nvml;
        let found = tokio::task::spawn_blocking(move || nvml.discover())
            .await
            .map_err(|e| format!("NVML discovery did not finish: {e}"))?
            .map_err(|e| e.to_string())?;
        let registration = register(&found.gpus, &self.settings);
        for w in found.warnings.iter().chain(&registration.warnings) {
            tracing::warn!("{w}");
        }
        let mut devices = registration.devices;
        if let Some(health) = &self.xid_health {
            crate::xid_watch::apply_to_discovery(health, &mut devices, &self.client, &self.node)
                .await;
        }
        self.devices.send_if_modified(|current| {
            let changed = *current != devices;
            if changed {
                current.clone_from(&devices);
            }
            changed
        });
        let infos: Vec<DeviceInfo> = devices.iter().map(|d| d.info.clone()).collect();
        let value = if infos.is_empty() {
            None
        } else {
            Some(encode_node_devices(&infos).map_err(|e| e.to_string())?)
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        publish_register(
            &nodes,
            &self.node,
            NVIDIA.node_register,
            Vendor::Nvidia,
            value,
            self.handshake_period_secs,
        )
        .await?;
        if self.report_node_capacity {
            let mem: u64 = infos.iter().map(|d| d.devmem).sum();
            let cores: u64 = infos.iter().map(|d| u64::from(d.devcore)).sum();
            let memory = (NVIDIA.resource_memory, mem);
            report_capacity(&nodes, &self.node, memory, (NVIDIA.resource_cores, cores)).await?;
        }
        Ok(())
    }
}
