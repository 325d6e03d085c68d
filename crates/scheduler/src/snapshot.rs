//! What a node offers (its registered GPUs) and how much of each GPU is taken.

use std::collections::BTreeMap;
use std::sync::Arc;

use hami_protocol::names::Vendor;
use hami_protocol::node_register::{DeviceInfo, decode_node_devices};

use crate::usage::DeviceCharge;

/// A registered GPU (a whole card or one hard partition) of one vendor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub vendor: Vendor,
    pub info: DeviceInfo,
}

/// The GPUs a node registered, decoded once per annotation change and shared.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeDevices {
    pub name: String,
    pub gpus: Vec<Gpu>,
    /// Register annotations that did not decode; the node offers nothing of that vendor
    /// and filter reports why.
    pub register_errors: Vec<(Vendor, String)>,
}

impl NodeDevices {
    /// Reads the register annotations of a node.
    pub fn from_annotations(name: &str, annotations: &BTreeMap<String, String>) -> Self {
        let mut devices = NodeDevices {
            name: name.to_owned(),
            ..Default::default()
        };
        for vendor in Vendor::ALL {
            let key = vendor.names().node_register;
            let Some(text) = annotations.get(key) else {
                continue;
            };
            match decode_node_devices(text) {
                Ok(list) => devices
                    .gpus
                    .extend(list.into_iter().map(|info| Gpu { vendor, info })),
                Err(err) => devices
                    .register_errors
                    .push((vendor, format!("annotation {key} does not decode: {err}"))),
            }
        }
        devices
    }

    pub fn offers(&self, vendor: Vendor) -> bool {
        self.gpus.iter().any(|g| g.vendor == vendor)
    }

    pub fn register_error(&self, vendor: Vendor) -> Option<&str> {
        self.register_errors
            .iter()
            .find(|(v, _)| *v == vendor)
            .map(|(_, e)| e.as_str())
    }
}

/// How much of one GPU is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuUsage {
    /// Pods (slots) sharing it.
    pub used: u32,
    pub mem_mib: u64,
    /// CUs for AMD, percent for NVIDIA.
    pub cores: u64,
}

/// A node's GPUs with their usage, the input of [`crate::fit`].
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    pub devices: Arc<NodeDevices>,
    /// Same order as `devices.gpus`.
    pub usage: Vec<GpuUsage>,
}

impl NodeSnapshot {
    pub fn idle(devices: Arc<NodeDevices>) -> Self {
        let usage = vec![GpuUsage::default(); devices.gpus.len()];
        Self { devices, usage }
    }

    /// Adds a pod's charges; charges on unknown device ids are returned (a GPU vanished
    /// or was renamed: worth a log line, never a panic).
    pub fn charge<'a>(&mut self, charges: &'a [DeviceCharge]) -> Vec<&'a str> {
        let mut unknown = Vec::new();
        for charge in charges {
            match self
                .devices
                .gpus
                .iter()
                .position(|g| g.info.id == charge.uuid)
            {
                Some(i) => {
                    let u = &mut self.usage[i];
                    u.used = u.used.saturating_add(charge.slots);
                    u.mem_mib = u.mem_mib.saturating_add(charge.mem_mib);
                    u.cores = u.cores.saturating_add(charge.cores);
                }
                None => unknown.push(charge.uuid.as_str()),
            }
        }
        unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_register_annotation_is_recorded_not_fatal() {
        let mut a = BTreeMap::new();
        a.insert(
            "hami.io/node-amd-register".to_string(),
            "[{\"id\":\"x\",\"count\":-1}]".to_string(),
        );
        a.insert(
            "hami.io/node-nvidia-register".to_string(),
            r#"[{"id":"GPU-1","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-A100","health":true}]"#.to_string(),
        );
        let d = NodeDevices::from_annotations("n", &a);
        assert!(d.offers(Vendor::Nvidia) && !d.offers(Vendor::Amd));
        assert!(d.register_error(Vendor::Amd).unwrap().contains("\"count\""));
        let mut snap = NodeSnapshot::idle(Arc::new(d));
        let charges = [
            DeviceCharge {
                uuid: "GPU-1".into(),
                slots: 1,
                mem_mib: 10,
                cores: 5,
            },
            DeviceCharge {
                uuid: "gone".into(),
                slots: 1,
                mem_mib: 10,
                cores: 5,
            },
        ];
        assert_eq!(snap.charge(&charges), vec!["gone"]);
        assert_eq!(
            snap.usage[0],
            GpuUsage {
                used: 1,
                mem_mib: 10,
                cores: 5
            }
        );
    }
}
