//! Publishing the node's GPUs: the register annotation every interval (removed when no GPU
//! is offered), node capacity with `-report_node_capacity`, Events on health changes, and
//! the device list that ListAndWatch serves. Node annotations override the operating mode
//! and expected compute partition per node. The register patch also writes the heartbeat
//! `hami.io/node-handshake-amd` (`hami_protocol::handshake`), a value that changes at every
//! refresh, so the scheduler can tell a live plugin from a dead one's leftovers.

use std::collections::BTreeSet;
use std::path::PathBuf;

use hami_plugin_core::node_register::{publish_register, report_capacity};
use hami_protocol::cu_allocated::CuAllocation;
use hami_protocol::names::{AMD, Vendor, node as node_keys, pod as pod_keys};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use crate::discover_report::build_report;
use crate::exporter::{ExporterGpu, query, reported_unhealthy};
use crate::health::render_node_healthy;
use crate::health_events::gpu_events;
use crate::registration::{Notice, OperatingMode, RegisteredDevice, RegistrationSettings};

/// The publisher.
pub struct NodePublisher {
    /// The API client.
    pub client: kube::Client,
    /// The node to publish on.
    pub node: String,
    /// Where sysfs is mounted (`--sysfs-root`).
    pub sysfs_root: PathBuf,
    /// Where `/dev` is mounted (the health check's device nodes).
    pub dev_root: PathBuf,
    /// How GPUs become registered devices.
    pub settings: RegistrationSettings,
    /// Also publish `amd.com/gpumem` and `amd.com/gpucores` as node capacity.
    pub report_node_capacity: bool,
    /// Where the devices offered now go (ListAndWatch and Allocate read them).
    pub devices: watch::Sender<Vec<RegisteredDevice>>,
    previous: Option<Vec<RegisteredDevice>>,
    /// Notices already recorded as Events (each once while it holds).
    noticed: BTreeSet<Notice>,
    /// AMD device-metrics exporter socket (`--exporter-socket`); health source when present.
    pub exporter_socket: Option<PathBuf>,
    /// Seconds between refreshes, announced in the heartbeat (`--register-interval`).
    pub handshake_period_secs: u64,
}

impl NodePublisher {
    /// A publisher with no exporter socket and nothing published yet.
    pub fn new(
        client: kube::Client,
        node: String,
        sysfs_root: PathBuf,
        dev_root: PathBuf,
        settings: RegistrationSettings,
        report_node_capacity: bool,
        devices: watch::Sender<Vec<RegisteredDevice>>,
    ) -> Self {
        Self {
            client,
            node,
            sysfs_root,
            dev_root,
            settings,
            report_node_capacity,
            devices,
            previous: None,
            noticed: BTreeSet::new(),
            exporter_socket: None,
            handshake_period_secs: 30,
        }
    }

    /// Settings with the node's per-node overrides applied.
    pub fn effective_settings(&self, node: &Node) -> Result<RegistrationSettings, String> {
        let mut s = self.settings.clone();
        let ann = node.metadata.annotations.clone().unwrap_or_default();
        if let Some(mode) = ann.get(node_keys::AMD_OPERATING_MODE) {
            s.mode = OperatingMode::parse(mode)
                .map_err(|e| format!("node annotation {}: {e}", node_keys::AMD_OPERATING_MODE))?;
        }
        if let Some(p) = ann
            .get(node_keys::AMD_COMPUTE_PARTITION)
            .filter(|p| !p.trim().is_empty())
        {
            s.expected_compute_partition = Some(p.trim().to_ascii_uppercase());
        }
        Ok(s)
    }

    /// One refresh: rediscover, publish, raise events.
    pub async fn refresh(&mut self) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.node)
            .await
            .map_err(|e| format!("cannot read node {}: {e}", self.node))?;
        let settings = self.effective_settings(&node)?;
        let report = build_report(&self.sysfs_root, &self.dev_root, &settings)?;
        for w in report
            .discovery
            .warnings
            .iter()
            .chain(&report.registration.warnings)
        {
            tracing::warn!("{w}");
        }
        // Partition-mode mismatches and duplicate unique_ids are Events, once each while
        // they last (a notice that goes away and comes back is reported again).
        let current: BTreeSet<Notice> = report.registration.notices.iter().cloned().collect();
        for notice in current.difference(&self.noticed) {
            record_node_event(
                &self.client,
                &self.node,
                &crate::health_events::GpuEvent {
                    reason: notice.reason,
                    kind: "Warning",
                    message: notice.message.clone(),
                },
            )
            .await;
        }
        self.noticed = current;
        let mut devices = report.registration.devices.clone();
        let states = self.exporter_states().await;
        for d in &mut devices {
            d.info.health = d.info.health && !reported_unhealthy(d, &states);
        }
        self.devices.send_replace(devices.clone());
        // The annotation carries the exporter's verdict too (health false).
        let infos: Vec<_> = devices.iter().map(|d| d.info.clone()).collect();
        let value = if infos.is_empty() {
            None
        } else {
            Some(
                hami_protocol::node_register::encode_node_devices(&infos)
                    .map_err(|e| e.to_string())?,
            )
        };
        publish_register(
            &nodes,
            &self.node,
            AMD.node_register,
            Vendor::Amd,
            value,
            self.handshake_period_secs,
        )
        .await?;
        if self.report_node_capacity {
            let mem: u64 = devices.iter().map(|d| d.info.devmem).sum();
            let cores = 100 * devices.len() as u64;
            let memory = (AMD.resource_memory, mem);
            report_capacity(&nodes, &self.node, memory, (AMD.resource_cores, cores)).await?;
        }
        if let Some(previous) = &self.previous {
            let in_use = self.ids_in_use().await;
            for event in gpu_events(previous, &devices, &in_use) {
                self.record(&event).await;
            }
        }
        self.previous = Some(devices);
        Ok(())
    }

    /// The exporter's view, empty when it is not configured, absent or not answering.
    async fn exporter_states(&self) -> Vec<ExporterGpu> {
        let Some(socket) = &self.exporter_socket else {
            return Vec::new();
        };
        match query(socket).await {
            Ok(states) => states.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(
                    "AMD device-metrics exporter: {e}; using the render-node check only"
                );
                Vec::new()
            }
        }
    }

    /// Re-checks the render nodes and the exporter; updates the served list when health
    /// changed.
    pub async fn recheck_health(&self) {
        let states = self.exporter_states().await;
        self.devices.send_if_modified(|devices| {
            let mut changed = false;
            for d in devices.iter_mut() {
                let now = render_node_healthy(&self.sysfs_root, &self.dev_root, d.render)
                    && !reported_unhealthy(d, &states);
                if now != d.info.health {
                    d.info.health = now;
                    changed = true;
                }
            }
            changed
        });
    }

    async fn ids_in_use(&self) -> BTreeSet<String> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let Ok(list) = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node)))
            .await
        else {
            return BTreeSet::new();
        };
        list.items
            .iter()
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .filter_map(|p| {
                p.metadata
                    .annotations
                    .as_ref()?
                    .get(pod_keys::AMD_CU_ALLOCATED)
            })
            .filter_map(|t| CuAllocation::parse(t).ok())
            .flat_map(|a| a.0.into_keys())
            .collect()
    }

    async fn record(&self, event: &crate::health_events::GpuEvent) {
        record_node_event(&self.client, &self.node, event).await;
    }
}

/// Records a Node event (core v1, namespace `default`, as kubelet does for nodes) and logs it.
pub async fn record_node_event(
    client: &kube::Client,
    node: &str,
    event: &crate::health_events::GpuEvent,
) {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let ev: Result<Event, _> = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{node}.")},
        "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
        "reason": event.reason,
        "message": event.message,
        "type": event.kind,
        "source": {"component": "amd-device-plugin", "host": node},
        "count": 1,
    }));
    let Ok(mut ev) = ev else { return };
    ev.first_timestamp = Some(now.clone());
    ev.last_timestamp = Some(now);
    tracing::warn!(reason = event.reason, "{}", event.message);
    if let Err(e) = events.create(&PostParams::default(), &ev).await {
        tracing::warn!("cannot record event {}: {e}", event.reason);
    }
}
