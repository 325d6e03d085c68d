//! Host per-GPU readings: AMD from sysfs (`mem_info_vram_used`, `gpu_busy_percent` of each
//! amdgpu card), identified exactly as the AMD device plugin registers them (its discovery
//! and registration are reused, so the `device_uuid` labels match the pod annotations).
//!
//! NVIDIA: through NVML loaded with `dlopen` (`hami-nvml`, the binding the NVIDIA plugin
//! uses), in `NodeMonitor` (memory in use, `nvmlDeviceGetUtilizationRates`).

use std::path::Path;

use hami_amd_discovery::discovery::discover;
use hami_amd_discovery::registration::{RegisteredDevice, RegistrationSettings, register};
use hami_protocol::names::Vendor;

/// One host GPU (or partition) as the monitor reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostGpu {
    /// DRM card minor (AMD).
    pub index: u32,
    /// The registered id: AMD SMI UUID, or a partition id.
    pub uuid: String,
    /// The registered type through `Vendor::device_type` (`AMD Instinct MI210`), as the
    /// scheduler labels the same GPU.
    pub device_type: String,
    /// PCI address, what DRM fdinfo calls `drm-pdev`.
    pub pci_bdf: String,
    /// `mem_info_vram_used`, bytes.
    pub memory_used: Option<u64>,
    /// `gpu_busy_percent`.
    pub busy_percent: Option<f64>,
}

/// Reads the AMD GPUs under `sysfs_root`. Cards whose counters cannot be read are still
/// listed (their identity is needed to map fdinfo), with the missing values left out.
pub fn amd_host_gpus(sysfs_root: &Path) -> Result<Vec<HostGpu>, String> {
    amd_host(sysfs_root).map(|(gpus, _)| gpus)
}

/// [`amd_host_gpus`] and the registered devices (DRM minors, partitions) they came from,
/// which attribute DRM clients to devices (`device_locator::locate`).
pub fn amd_host(sysfs_root: &Path) -> Result<(Vec<HostGpu>, Vec<RegisteredDevice>), String> {
    let discovery = discover(sysfs_root).map_err(|e| e.to_string())?;
    let registration = register(&discovery, &RegistrationSettings::default(), |_| true);
    let mut out = Vec::new();
    for device in &registration.devices {
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
            device_type: Vendor::Amd.device_type(&device.info.device_type),
            pci_bdf: device.pci_bdf.clone(),
            memory_used: read("mem_info_vram_used").and_then(|v| v.parse().ok()),
            busy_percent: read("gpu_busy_percent").and_then(|v| v.parse().ok()),
        });
    }
    Ok((out, registration.devices))
}
