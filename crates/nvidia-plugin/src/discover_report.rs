//! `nvidia-device-plugin discover`: what NVML reports and the exact register annotation.

use hami_protocol::node_register::{DeviceInfo, encode_node_devices};

use crate::nvml::Nvml;
use crate::registration::{NvidiaSettings, register};

/// Text report: one line per GPU, warnings, then the annotation value.
pub fn discover_text(library: &str, settings: &NvidiaSettings) -> Result<String, String> {
    let nvml = Nvml::load(library).map_err(|e| e.to_string())?;
    let found = nvml.discover().map_err(|e| e.to_string())?;
    let registration = register(&found.gpus, settings);
    let mut out = String::new();
    for gpu in &found.gpus {
        out.push_str(&format!(
            "GPU {} {} {:?} {} MiB\n",
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.memory_bytes >> 20
        ));
    }
    for w in found.warnings.iter().chain(&registration.warnings) {
        out.push_str(&format!("warning: {w}\n"));
    }
    let infos: Vec<DeviceInfo> = registration
        .devices
        .iter()
        .map(|d| d.info.clone())
        .collect();
    let value = encode_node_devices(&infos).map_err(|e| e.to_string())?;
    out.push_str(&format!(
        "{}: {value}\n",
        hami_protocol::names::NVIDIA.node_register
    ));
    Ok(out)
}
