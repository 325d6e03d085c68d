//! Health from AMD's device-metrics exporter (`--exporter-socket`), when it runs on the
//! node: its `metricssvc.MetricsService/List` answers one state per GPU, `Health`
//! `healthy`/`unhealthy`, keyed by `Device` (the PCI address or `amdgpu_xcp_<n>`, the ids
//! the ROCm plugin gives kubelet — our device keys) and `UUID`. A device is healthy when its
//! render node opens **and** the exporter does not call it unhealthy; a device the exporter
//! does not list, or an exporter that is absent or does not answer, leaves the render-node
//! check alone (as the upstream plugin does). The connection is short-lived: the exporter
//! comes and goes independently of the plugin.

use std::path::Path;
use std::time::Duration;

use crate::registration::RegisteredDevice;

/// The generated exporter protocol (`proto/metricssvc.proto`).
#[allow(clippy::all, missing_docs)]
pub mod metricssvc {
    tonic::include_proto!("metricssvc");
}

/// One GPU as the exporter reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExporterGpu {
    /// The device id kubelet sees (PCI address or `amdgpu_xcp_<n>`).
    pub device: String,
    /// The GPU's UUID as the exporter reports it.
    pub uuid: String,
    /// The exporter does not report it `unhealthy`.
    pub healthy: bool,
}

/// How long one query may take before the exporter is treated as absent.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the exporter; `Ok(None)` when its socket does not exist.
pub async fn query(socket: &Path) -> Result<Option<Vec<ExporterGpu>>, String> {
    if !socket.exists() {
        return Ok(None);
    }
    let ask = async {
        let channel = hami_deviceplugin_api::connect_unix(socket)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        let mut client = metricssvc::metrics_service_client::MetricsServiceClient::new(channel);
        let resp = client
            .list(())
            .await
            .map_err(|e| format!("{}: List failed: {}", socket.display(), e.message()))?
            .into_inner();
        Ok::<_, String>(
            resp.gpu_state
                .into_iter()
                .map(|g| ExporterGpu {
                    healthy: !g.health.trim().eq_ignore_ascii_case("unhealthy"),
                    device: g.device,
                    uuid: g.uuid,
                })
                .collect(),
        )
    };
    match tokio::time::timeout(QUERY_TIMEOUT, ask).await {
        Ok(r) => r.map(Some),
        Err(_) => Err(format!(
            "{}: no answer within {QUERY_TIMEOUT:?}",
            socket.display()
        )),
    }
}

/// Whether the exporter calls `dev` unhealthy (`false` when it does not list it).
pub fn reported_unhealthy(dev: &RegisteredDevice, states: &[ExporterGpu]) -> bool {
    states.iter().any(|g| {
        !g.healthy
            && (g.device.eq_ignore_ascii_case(&dev.device_key)
                || (!g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(&dev.info.id)))
    })
}
