//! Host per-GPU readings: AMD from sysfs (`mem_info_vram_used`, `gpu_busy_percent` of each
//! amdgpu card), identified exactly as the AMD device plugin registers them (its discovery
//! and registration are reused, so the `device_uuid` labels match the pod annotations).
//!
//! NVIDIA: this build has no NVML binding (the project links no NVML crate and does not
//! dlopen), so NVIDIA host metrics are not emitted; [`nvidia_host_metrics_note`] says so at
//! start-up. Per-container NVIDIA metrics come from the HAMi-core regions and are complete.

use std::collections::BTreeMap;
use std::path::Path;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegistrationSettings, register};

/// One host GPU (or partition) as the monitor reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGpu {
    /// DRM card minor (AMD).
    pub index: u32,
    /// The registered id: AMD SMI UUID, or a partition id.
    pub uuid: String,
    /// `AMD-<market name>`.
    pub device_type: String,
    /// PCI address, what DRM fdinfo calls `drm-pdev`.
    pub pci_bdf: String,
    pub memory_used: Option<u64>,
    pub busy_percent: Option<f64>,
}

/// Reads the AMD GPUs under `sysfs_root`. Cards whose counters cannot be read are still
/// listed (their identity is needed to map fdinfo), with the missing values left out.
pub fn amd_host_gpus(sysfs_root: &Path) -> Result<Vec<HostGpu>, String> {
    let discovery = discover(sysfs_root).map_err(|e| e.to_string())?;
    let registration = register(&discovery, &RegistrationSettings::default(), |_| true);
    let mut out = Vec::new();
    for device in registration.devices {
        let pci = sysfs_root
            .join("bus/pci/drivers/amdgpu")
            .join(&device.pci_bdf);
        let dir = if pci.exists() {
            pci
        } else {
            sysfs_root
                .join("class/drm")
                .join(format!("card{}", device.card))
                .join("device")
        };
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .map(|s| s.trim().to_owned())
        };
        out.push(HostGpu {
            index: device.card,
            uuid: device.info.id.clone(),
            device_type: format!("AMD-{}", device.info.device_type),
            pci_bdf: device.pci_bdf.clone(),
            memory_used: read("mem_info_vram_used").and_then(|v| v.parse().ok()),
            busy_percent: read("gpu_busy_percent").and_then(|v| v.parse().ok()),
        });
    }
    Ok(out)
}

/// PCI address → registered id, for mapping DRM fdinfo clients to devices. Partitions of one
/// card share its address; the whole card's first entry wins.
pub fn uuid_by_pdev(gpus: &[HostGpu]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for gpu in gpus {
        map.entry(gpu.pci_bdf.clone())
            .or_insert_with(|| gpu.uuid.clone());
    }
    map
}

/// Logged once at start-up.
pub fn nvidia_host_metrics_note() -> &'static str {
    "NVIDIA host metrics (hami_host_gpu_*) are not emitted: this build has no NVML binding; per-container NVIDIA metrics from HAMi-core regions are unaffected"
}
