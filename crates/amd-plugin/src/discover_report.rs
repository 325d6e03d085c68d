//! `k8s-device-plugin discover`: what the plugin would publish on this node, without an
//! API server, so operators can check a node before deploying.

use std::fmt::Write as _;
use std::path::Path;

use hami_protocol::node_register::encode_node_devices;
use serde_json::{Value, json};

use crate::discovery::{Discovery, discover};
use crate::health::render_node_healthy;
use crate::registration::{Registration, RegistrationSettings, register};

/// Everything `discover` found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The GPUs sysfs shows.
    pub discovery: Discovery,
    /// What would be registered from them.
    pub registration: Registration,
    /// The exact `hami.io/node-amd-register` value (`None` when nothing can be offered,
    /// in which case the plugin removes the annotation).
    pub register_annotation: Option<String>,
}

/// Runs discovery and registration below the given roots.
pub fn build_report(
    sysfs_root: &Path,
    dev_root: &Path,
    settings: &RegistrationSettings,
) -> Result<Report, String> {
    let discovery = discover(sysfs_root).map_err(|e| e.to_string())?;
    let registration = register(&discovery, settings, |render| {
        render_node_healthy(sysfs_root, dev_root, render)
    });
    let infos: Vec<_> = registration
        .devices
        .iter()
        .map(|d| d.info.clone())
        .collect();
    let register_annotation = if infos.is_empty() {
        None
    } else {
        Some(encode_node_devices(&infos).map_err(|e| e.to_string())?)
    };
    Ok(Report {
        discovery,
        registration,
        register_annotation,
    })
}

impl Report {
    /// Machine-readable form (`--output json`).
    pub fn to_json(&self) -> Value {
        let gpus: Vec<Value> = self
            .discovery
            .gpus
            .iter()
            .map(|g| {
                json!({
                    "pciBDF": g.bdf,
                    "deviceId": format!("0x{:04x}", g.device_id),
                    "marketName": g.market_name,
                    "numa": g.numa,
                    "vramMiB": g.vram_bytes >> 20,
                    "gfxTargetVersion": g.gfx_target_version,
                    "uniqueId": g.unique_id.to_string(),
                    "cuPerWGP": g.cu_per_wgp,
                    "computeUnits": g.compute_units(),
                    "computeQueues": g.compute_queues,
                    "computePartition": g.compute_partition,
                    "memoryPartition": g.memory_partition,
                    "xgmiPeers": g.xgmi_peers,
                    "partitions": g.partitions.iter().map(|p| json!({
                        "index": p.index,
                        "deviceKey": p.device_key,
                        "kfdNode": p.kfd_node,
                        "card": p.card,
                        "renderD": p.render,
                        "computeUnits": p.compute_units,
                        "memMiB": p.mem_bytes.map(|b| b >> 20),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let devices: Vec<Value> = self
            .registration
            .devices
            .iter()
            .map(|d| {
                json!({
                    "id": d.info.id,
                    "rocrId": d.rocr_id,
                    "kubeletIds": d.kubelet_ids().map(|k| k.to_string()).collect::<Vec<_>>(),
                    "devices": [format!("/dev/dri/card{}", d.card), format!("/dev/dri/renderD{}", d.render)],
                })
            })
            .collect();
        let mut warnings = self.discovery.warnings.clone();
        warnings.extend(self.registration.warnings.iter().cloned());
        json!({
            "gpus": gpus,
            "devices": devices,
            "warnings": warnings,
            "registerAnnotation": self.register_annotation,
        })
    }

    /// Human-readable form.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "GPUs found: {}", self.discovery.gpus.len());
        for g in &self.discovery.gpus {
            let _ = writeln!(
                out,
                "  {} {} (0x{:04x}, gfx {}) NUMA {} VRAM {} MiB, {} CUs, cuPerWGP {}, partition {}/{}, XGMI peers [{}]",
                g.bdf,
                g.market_name,
                g.device_id,
                g.gfx_target_version,
                g.numa,
                g.vram_bytes >> 20,
                g.compute_units(),
                g.cu_per_wgp,
                g.compute_partition.as_deref().unwrap_or("-"),
                g.memory_partition.as_deref().unwrap_or("-"),
                g.xgmi_peers.join(" "),
            );
        }
        let _ = writeln!(out, "Devices offered: {}", self.registration.devices.len());
        for d in &self.registration.devices {
            let _ = writeln!(
                out,
                "  {} key {} card{} renderD{} count {} devmem {} MiB devcore {} health {} ROCr {}",
                d.info.id,
                d.device_key,
                d.card,
                d.render,
                d.info.count,
                d.info.devmem,
                d.info.devcore,
                d.info.health,
                d.rocr_id
            );
        }
        for w in self
            .discovery
            .warnings
            .iter()
            .chain(&self.registration.warnings)
        {
            let _ = writeln!(out, "warning: {w}");
        }
        match &self.register_annotation {
            Some(value) => {
                let _ = writeln!(out, "hami.io/node-amd-register={value}");
            }
            None => {
                let _ = writeln!(
                    out,
                    "no GPU to offer: the plugin would remove hami.io/node-amd-register"
                );
            }
        }
        out
    }
}
