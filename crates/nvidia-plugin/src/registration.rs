//! From NVML's GPUs to the register entries (SPEC §2.1, reference §5.3) and kubelet ids
//! (pure). Count = `--device-split-count`, devmem = MiB × `--device-memory-scaling`,
//! devcore = 100 × `--device-cores-scaling`, type = NVML name prefixed `NVIDIA-` unless it
//! starts with `NVIDIA`, mode `hami-core`.

use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::node_register::{DeviceInfo, DeviceMode};

use crate::nvml::NvmlGpu;

/// Settings of the registration.
#[derive(Debug, Clone, PartialEq)]
pub struct NvidiaSettings {
    /// Shares per GPU (kubelet ids per GPU, pods that may share it).
    pub split_count: u32,
    /// > 1 oversubscribes device memory (sets `CUDA_OVERSUBSCRIBE`).
    pub memory_scaling: f64,
    /// Multiplies devcore (100 × this).
    pub cores_scaling: f64,
}

impl Default for NvidiaSettings {
    fn default() -> Self {
        Self {
            split_count: 10,
            memory_scaling: 1.0,
            cores_scaling: 1.0,
        }
    }
}

impl NvidiaSettings {
    /// Refuses settings that would offer nothing or nonsense, saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.split_count == 0 {
            return Err("--device-split-count 0 would offer nothing: use at least 1".into());
        }
        if !(self.memory_scaling.is_finite() && self.memory_scaling > 0.0) {
            return Err(format!(
                "--device-memory-scaling {} must be a positive number (1 = no oversubscription)",
                self.memory_scaling
            ));
        }
        if !(self.cores_scaling.is_finite() && self.cores_scaling > 0.0) {
            return Err(format!(
                "--device-cores-scaling {} must be a positive number (1 = 100 % per GPU)",
                self.cores_scaling
            ));
        }
        Ok(())
    }
}

/// A GPU as offered by this plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredGpu {
    /// The register-annotation entry (`id` = NVML UUID).
    pub info: DeviceInfo,
}

impl RegisteredGpu {
    /// The kubelet device ids of this GPU's shares: `<UUID>#<k>`.
    pub fn kubelet_ids(&self) -> impl Iterator<Item = KubeletDeviceId> + '_ {
        (0..self.info.count).map(|share| KubeletDeviceId {
            device_key: self.info.id.clone(),
            share,
        })
    }
}

/// The registered type of an NVML product name: `NVIDIA-` prefixed unless it already
/// starts with `NVIDIA` (the scheduler matches the vendor word), device-list separators
/// replaced by spaces (the type travels in `UUID,TYPE,MEM,CORES:` lists).
pub fn device_type(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if matches!(c, ',' | ':' | ';') { ' ' } else { c })
        .collect();
    let clean = clean.trim();
    if clean.starts_with("NVIDIA") {
        clean.to_owned()
    } else if clean.is_empty() {
        "NVIDIA-GPU".into()
    } else {
        format!("NVIDIA-{clean}")
    }
}

/// Registration result: devices plus notes for the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registration {
    /// The GPUs to register, in NVML index order.
    pub devices: Vec<RegisteredGpu>,
    /// One line per GPU left out, saying why.
    pub warnings: Vec<String>,
}

/// Builds the registered devices (settings must be valid).
pub fn register(gpus: &[NvmlGpu], settings: &NvidiaSettings) -> Registration {
    let mut out = Registration::default();
    for gpu in gpus {
        let bad_id = gpu.uuid.is_empty() || gpu.uuid.contains([',', ':', ';', '#']);
        if bad_id {
            out.warnings.push(format!(
                "GPU {} skipped: NVML UUID {:?} is empty or contains one of , : ; #",
                gpu.index, gpu.uuid
            ));
            continue;
        }
        if out.devices.iter().any(|d| d.info.id == gpu.uuid) {
            out.warnings.push(format!(
                "GPU {} skipped: UUID {} is reported twice",
                gpu.index, gpu.uuid
            ));
            continue;
        }
        let mib = gpu.memory_bytes >> 20;
        if mib == 0 {
            out.warnings.push(format!(
                "GPU {} ({}) skipped: NVML reports no device memory",
                gpu.index, gpu.uuid
            ));
            continue;
        }
        out.devices.push(RegisteredGpu {
            info: DeviceInfo {
                id: gpu.uuid.clone(),
                index: gpu.index,
                count: settings.split_count,
                devmem: (mib as f64 * settings.memory_scaling).floor() as u64,
                devcore: (100.0 * settings.cores_scaling).floor() as u32,
                device_type: device_type(&gpu.name),
                // The reference's value when the PCI NUMA node is unknown.
                numa: 0,
                mode: DeviceMode::HamiCore,
                health: true,
                device_vendor: "NVIDIA".into(),
                custom_info: Default::default(),
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_protocol::node_register::{decode_node_devices, encode_node_devices};
    use proptest::prelude::*;

    fn gpu(index: u32, uuid: &str, name: &str, gib: u64) -> NvmlGpu {
        NvmlGpu {
            index,
            uuid: uuid.into(),
            name: name.into(),
            memory_bytes: gib << 30,
        }
    }

    #[test]
    fn types_get_the_vendor_word() {
        assert_eq!(
            device_type("NVIDIA A100-SXM4-80GB"),
            "NVIDIA A100-SXM4-80GB"
        );
        assert_eq!(device_type("Tesla T4"), "NVIDIA-Tesla T4");
        assert_eq!(device_type("odd,name:x;"), "NVIDIA-odd name x");
        assert_eq!(device_type(""), "NVIDIA-GPU");
    }

    #[test]
    fn counts_scaling_and_bad_gpus() {
        let settings = NvidiaSettings {
            split_count: 4,
            memory_scaling: 1.5,
            cores_scaling: 2.0,
        };
        let r = register(
            &[
                gpu(0, "GPU-a", "Tesla T4", 16),
                gpu(1, "GPU-a", "Tesla T4", 16),
                gpu(2, "", "X", 16),
                gpu(3, "GPU-c", "X", 0),
            ],
            &settings,
        );
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
        let d = &r.devices[0].info;
        assert_eq!((d.count, d.devmem, d.devcore), (4, 24576, 200));
        assert_eq!(
            r.devices[0]
                .kubelet_ids()
                .map(|i| i.to_string())
                .collect::<Vec<_>>(),
            ["GPU-a#0", "GPU-a#1", "GPU-a#2", "GPU-a#3"]
        );
        let text = encode_node_devices(std::slice::from_ref(d)).unwrap();
        assert!(text.contains(r#""type":"NVIDIA-Tesla T4""#), "{text}");
        assert!(text.contains(r#""mode":"hami-core""#), "{text}");
        assert!(settings.validate().is_ok());
        for bad in [
            NvidiaSettings {
                split_count: 0,
                ..Default::default()
            },
            NvidiaSettings {
                memory_scaling: 0.0,
                ..Default::default()
            },
            NvidiaSettings {
                cores_scaling: f64::NAN,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().unwrap_err().contains("--device-"));
        }
    }

    proptest! {
        /// Whatever NVML says, the annotation encodes and decodes back unchanged.
        #[test]
        fn registration_round_trips(names in proptest::collection::vec("[ -~]{0,24}", 1..5), split in 1u32..20) {
            let gpus: Vec<NvmlGpu> = names.iter().enumerate().map(|(i, n)| gpu(i as u32, &format!("GPU-{i:08x}"), n, 8)).collect();
            let r = register(&gpus, &NvidiaSettings { split_count: split, ..Default::default() });
            prop_assert_eq!(r.devices.len(), gpus.len());
            let infos: Vec<DeviceInfo> = r.devices.iter().map(|d| d.info.clone()).collect();
            let text = encode_node_devices(&infos).unwrap();
            let back = decode_node_devices(&text).unwrap();
            prop_assert_eq!(back, infos);
        }
    }
}
