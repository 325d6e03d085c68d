//! From the scenario's node groups to Node objects carrying register annotations, exactly
//! what the scheduler's informer would see.
//!
//! Capture GPUs go the real way: the capture's sysfs tree is built in a temp directory
//! (`hami-sysfs-fixtures`), discovered and registered by `hami-amd-discovery` (the code
//! the AMD plugin registers with), and the resulting `DeviceInfo`s are encoded with the
//! protocol's codec. That is the only I/O here; it happens once per (capture, settings),
//! not once per node.

use std::collections::BTreeMap;
use std::sync::Mutex;

use hami_amd_discovery::discovery::{Discovery, discover};
use hami_amd_discovery::registration::{RegistrationSettings, register};
use hami_protocol::identity::{WHOLE_GPU_PARTITION, amd_smi_uuid};
use hami_protocol::names::Vendor;
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode, encode_node_devices};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::PlanError;
use crate::scenario::{CaptureName, GpuModel, GpuSource, NodeGroup};

/// What one node of a group registers, per vendor.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeDevicesSpec {
    /// AMD register entries.
    pub amd: Vec<DeviceInfo>,
    /// NVIDIA register entries.
    pub nvidia: Vec<DeviceInfo>,
}

/// Discovers and registers a capture's GPUs as the AMD plugin does on a real node
/// (every render node healthy).
pub fn capture_devices(
    capture: CaptureName,
    settings: &RegistrationSettings,
) -> Result<Vec<DeviceInfo>, PlanError> {
    let fail = |problem: String| PlanError::Fixture {
        capture: capture.as_str().to_owned(),
        problem,
    };
    let discovery = discovered(capture).map_err(fail)?;
    let registration = register(&discovery, settings, |_| true);
    if registration.devices.is_empty() {
        return Err(fail(format!(
            "discovery found no GPU ({})",
            discovery.warnings.join("; ")
        )));
    }
    Ok(registration.devices.into_iter().map(|d| d.info).collect())
}

/// Each capture's discovery, made once per process: building a capture's sysfs tree and
/// discovering it takes up to seconds (the MI300X CPX capture's thousands of files), which
/// the web UI's What-if page would otherwise pay on every request, outside its deadline.
static DISCOVERED: Mutex<Vec<(CaptureName, Discovery)>> = Mutex::new(Vec::new());

/// The capture's discovery, from [`DISCOVERED`] or made (and kept) now.
fn discovered(capture: CaptureName) -> Result<Discovery, String> {
    let known = |cache: &[(CaptureName, Discovery)]| {
        cache
            .iter()
            .find(|(c, _)| *c == capture)
            .map(|(_, d)| d.clone())
    };
    if let Some(d) = DISCOVERED.lock().ok().and_then(|cache| known(&cache)) {
        return Ok(d);
    }
    let tree = match capture {
        CaptureName::Mi210Xgmi => hami_sysfs_fixtures::mi210_xgmi(),
        CaptureName::Mi300xCpx => hami_sysfs_fixtures::mi300x_cpx(),
        CaptureName::OneGpu => hami_sysfs_fixtures::one_gpu(),
    }
    .map_err(|e| format!("cannot build its sysfs tree in a temp directory: {e}"))?;
    let discovery = discover(&tree.sysfs_root()).map_err(|e| e.to_string())?;
    if let Ok(mut cache) = DISCOVERED.lock()
        && known(&cache).is_none()
    {
        cache.push((capture, discovery.clone()));
    }
    Ok(discovery)
}

/// Devices of inline models. Ids are made the way the plugins make them (AMD SMI UUIDs,
/// NVIDIA `GPU-` UUIDs) from a serial unique within the group.
pub fn model_devices(group_index: usize, models: &[GpuModel]) -> NodeDevicesSpec {
    let mut spec = NodeDevicesSpec::default();
    for (m, model) in models.iter().enumerate() {
        // Synthesized PCI addresses: domain = model, bus = card; only used for XGMI.
        let bdf = |g: u32| format!("{m:04x}:{g:02x}:00.0");
        for g in 0..model.count {
            let custom_info = if model.xgmi {
                CustomInfo {
                    pci_bdf: Some(bdf(g)),
                    xgmi_peers: (0..model.count).filter(|p| *p != g).map(bdf).collect(),
                    ..CustomInfo::default()
                }
            } else {
                CustomInfo::default()
            };
            let serial = ((group_index as u64 + 1) << 32) | ((m as u64) << 16) | u64::from(g);
            let (id, list) = match model.vendor {
                Vendor::Amd => (amd_smi_uuid(serial, 0, WHOLE_GPU_PARTITION), &mut spec.amd),
                Vendor::Nvidia => (
                    format!(
                        "GPU-{:08x}-{:04x}-4000-8000-{:012x}",
                        group_index + 1,
                        m,
                        serial & 0xffff_ffff
                    ),
                    &mut spec.nvidia,
                ),
            };
            list.push(DeviceInfo {
                id,
                index: u32::try_from(list.len()).unwrap_or(u32::MAX),
                count: model.share,
                devmem: model.memory_mib,
                devcore: model.cores,
                device_type: model.device_type.clone(),
                numa: model.numa,
                mode: DeviceMode::HamiCore,
                health: true,
                device_vendor: model.vendor.word().to_owned(),
                custom_info,
            });
        }
    }
    spec
}

/// The devices of one node of each group, resolving each capture once.
pub fn resolve_groups(groups: &[NodeGroup]) -> Result<Vec<NodeDevicesSpec>, PlanError> {
    let mut cache: Vec<((CaptureName, RegistrationSettings), Vec<DeviceInfo>)> = Vec::new();
    let mut out = Vec::with_capacity(groups.len());
    for (i, group) in groups.iter().enumerate() {
        let spec = match &group.gpus {
            GpuSource::Capture { capture, settings } => {
                let key = (*capture, settings.clone());
                let amd = match cache.iter().find(|(k, _)| *k == key) {
                    Some((_, devices)) => devices.clone(),
                    None => {
                        let devices = capture_devices(*capture, settings)?;
                        cache.push((key, devices.clone()));
                        devices
                    }
                };
                NodeDevicesSpec {
                    amd,
                    nvidia: Vec::new(),
                }
            }
            GpuSource::Models(models) => model_devices(i, models),
        };
        out.push(spec);
    }
    Ok(out)
}

/// Node objects for every group: `<group>-0`, `<group>-1`, ... with the register
/// annotations written by the protocol's encoder.
pub fn build_nodes(
    groups: &[NodeGroup],
    specs: &[NodeDevicesSpec],
) -> Result<Vec<Node>, PlanError> {
    let mut nodes = Vec::new();
    for (i, (group, spec)) in groups.iter().zip(specs).enumerate() {
        let mut annotations = BTreeMap::new();
        for (vendor, devices) in [(Vendor::Amd, &spec.amd), (Vendor::Nvidia, &spec.nvidia)] {
            if devices.is_empty() {
                continue;
            }
            let text = encode_node_devices(devices).map_err(|e| PlanError::Field {
                path: String::new(),
                field: format!("fleet[{i}].gpus"),
                problem: e.to_string(),
            })?;
            annotations.insert(vendor.names().node_register.to_owned(), text);
        }
        for n in 0..group.count {
            nodes.push(Node {
                metadata: ObjectMeta {
                    name: Some(format!("{}-{n}", group.name)),
                    annotations: Some(annotations.clone()),
                    ..Default::default()
                },
                ..Default::default()
            });
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hami_amd_discovery::registration::OperatingMode;

    #[test]
    fn captures_register_like_the_plugin() {
        let mi210 =
            capture_devices(CaptureName::Mi210Xgmi, &RegistrationSettings::default()).unwrap();
        assert_eq!(mi210.len(), 8);
        assert!(mi210.iter().all(|d| d.devcore == 104 && d.count == 10));
        assert!(mi210.iter().all(|d| d.devmem == 65536));
        assert!(mi210.iter().all(|d| d.custom_info.xgmi_peers.len() == 3));
        let cpx = capture_devices(
            CaptureName::Mi300xCpx,
            &RegistrationSettings {
                mode: OperatingMode::Partition,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(cpx.len(), 63);
        assert!(cpx.iter().all(|d| d.count == 1 && d.devcore == 38));
    }

    #[test]
    fn a_capture_is_discovered_once_per_process() {
        let first = capture_devices(CaptureName::OneGpu, &RegistrationSettings::default()).unwrap();
        assert!(
            DISCOVERED
                .lock()
                .unwrap()
                .iter()
                .any(|(c, _)| *c == CaptureName::OneGpu)
        );
        let again = capture_devices(CaptureName::OneGpu, &RegistrationSettings::default()).unwrap();
        assert_eq!(first, again);
        // Settings still apply to the kept discovery.
        let split = capture_devices(
            CaptureName::OneGpu,
            &RegistrationSettings {
                split_count: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(split.iter().all(|d| d.count == 3), "{split:?}");
    }

    #[test]
    fn inline_ids_are_unique_per_node() {
        let models = vec![
            GpuModel {
                vendor: Vendor::Amd,
                device_type: "AMD X".into(),
                count: 3,
                memory_mib: 1000,
                cores: 100,
                share: 4,
                numa: 0,
                xgmi: true,
            },
            GpuModel {
                vendor: Vendor::Amd,
                device_type: "AMD Y".into(),
                count: 2,
                memory_mib: 1000,
                cores: 60,
                share: 4,
                numa: 1,
                xgmi: false,
            },
        ];
        let spec = model_devices(0, &models);
        assert_eq!(spec.amd.len(), 5);
        // The first model is one hive of three; the second has no links.
        assert_eq!(
            spec.amd[0].custom_info.xgmi_peers,
            ["0000:01:00.0", "0000:02:00.0"]
        );
        assert_eq!(
            spec.amd[2].custom_info.pci_bdf.as_deref(),
            Some("0000:02:00.0")
        );
        assert!(spec.amd[3].custom_info.xgmi_peers.is_empty());
        let text = encode_node_devices(&spec.amd).unwrap();
        assert_eq!(
            hami_protocol::node_register::decode_node_devices(&text).unwrap(),
            spec.amd
        );
    }
}
