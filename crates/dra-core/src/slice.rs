//! The node's ResourceSlices from discovery and registration (issue 20 item 2): one device
//! per GPU and per hard partition; a GPU sliced by memory, CUs and shares is
//! `allowMultipleAllocations` with request policies; a hard partition counts once (the seed's
//! rule, `registration::register`) and so is an exclusive device. Unhealthy devices are
//! tainted, never dropped (a dropped device would orphan its running claims). The pool's
//! generation goes up exactly when what the slices say changes.

use std::collections::BTreeMap;

use hami_amd_discovery::discovery::{Discovery, Gpu};
use hami_amd_discovery::registration::{RegisteredDevice, Registration};

use crate::api::{
    API_VERSION, CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute,
    DeviceCapacity, DeviceTaint, ObjectMeta, OwnerReference, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use crate::quantity::{format_bytes, format_count};

use hami_protocol::dra::{
    ATTR_NUMA_NODE, ATTR_PCI_BUS_ID, ATTR_PRODUCT_NAME, ATTR_TYPE, ATTR_UUID, ATTR_XGMI_HIVE,
};
/// Capacity names (the protocol crate owns them).
pub use hami_protocol::dra::{COMPUTE_UNITS, MEMORY, SHARES};
/// Taint key of an unhealthy device.
pub const UNHEALTHY_TAINT: &str = "amdgpu.hami-rs.io/unhealthy";
/// `type` attribute values a DeviceClass selects on.
pub const TYPE_SLICE: &str = "amdgpu-slice";
/// `type` of a hard compute partition.
pub const TYPE_PARTITION: &str = "amdgpu-partition";
/// Upstream's limit per slice when any device has taints (ResourceSliceMaxDevicesWithAdvancedFeatures).
pub const MAX_DEVICES_PER_SLICE: usize = 64;

/// Who the slices belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    /// The node's name (also the pool name).
    pub name: String,
    /// The node's UID (the slices' owner reference).
    pub uid: String,
}

/// Why slices cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    /// A registered device has no discovered GPU behind it.
    #[error("registered device {id} (PCI {bdf}) has no GPU in the discovery it came from")]
    NoGpu {
        /// The registered id.
        id: String,
        /// Its PCI address.
        bdf: String,
    },
}

/// `gfx_target_version` 90402 → `9.4.2` (a semver the API server accepts).
pub fn gfx_version(target: u32) -> String {
    format!(
        "{}.{}.{}",
        target / 10000,
        (target / 100) % 100,
        target % 100
    )
}

/// A DNS-label device name: `gpu-<n>` for a card, `gpu-<n>-<mode>-<index>` for a partition.
fn device_name(gpu_index: usize, gpu: &Gpu, dev: &RegisteredDevice) -> String {
    if gpu.is_partitioned() {
        let mode: String = gpu
            .compute_partition
            .as_deref()
            .unwrap_or("xcp")
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let mode = if mode.is_empty() { "xcp".into() } else { mode };
        format!("gpu-{gpu_index}-{mode}-{}", dev.partition_index)
    } else {
        format!("gpu-{gpu_index}")
    }
}

/// The hive a card belongs to: the lowest PCI address among it and its XGMI peers. The
/// peer list itself would not fit an attribute (64 characters); a shared hive id lets a
/// claim ask for `matchAttribute: amdgpu.hami-rs.io/xgmiHive`.
fn xgmi_hive(gpu: &Gpu) -> Option<String> {
    if gpu.xgmi_peers.is_empty() {
        return None;
    }
    gpu.xgmi_peers.iter().chain([&gpu.bdf]).min().cloned()
}

fn range(min: u64, max: u64, step: u64, fmt: fn(u64) -> String) -> CapacityRequestPolicyRange {
    CapacityRequestPolicyRange {
        min: fmt(min),
        max: Some(fmt(max)),
        step: Some(fmt(step)),
    }
}

/// The slice device of one registered device. `time_added` is the taint time to use for a
/// new taint (kept from `previous` when the device was already tainted).
pub fn device(
    gpu_index: usize,
    gpu: &Gpu,
    dev: &RegisteredDevice,
    previous: Option<&Device>,
    now: &str,
) -> Device {
    let shared = dev.info.count > 1;
    let mut attributes = BTreeMap::new();
    let kind = if shared { TYPE_SLICE } else { TYPE_PARTITION };
    attributes.insert(ATTR_TYPE.into(), DeviceAttribute::string(kind));
    attributes.insert(ATTR_UUID.into(), DeviceAttribute::string(&dev.info.id));
    attributes.insert(
        ATTR_PRODUCT_NAME.into(),
        DeviceAttribute::string(dev.info.device_type.chars().take(64).collect::<String>()),
    );
    attributes.insert(
        "gfxVersion".into(),
        DeviceAttribute::version(gfx_version(gpu.gfx_target_version)),
    );
    attributes.insert("wgpMode".into(), DeviceAttribute::bool(dev.cu_per_wgp > 1));
    attributes.insert(
        "partitionIndex".into(),
        DeviceAttribute::int(dev.partition_index.into()),
    );
    if let Some(mode) = &gpu.compute_partition {
        let mem = gpu.memory_partition.as_deref().unwrap_or("");
        let profile = if mem.is_empty() {
            mode.to_lowercase()
        } else {
            format!("{}_{}", mode, mem).to_lowercase()
        };
        attributes.insert("partitionProfile".into(), DeviceAttribute::string(profile));
    }
    if let Some(hive) = xgmi_hive(gpu) {
        attributes.insert(ATTR_XGMI_HIVE.into(), DeviceAttribute::string(hive));
        attributes.insert(
            "xgmiPeers".into(),
            DeviceAttribute::int(gpu.xgmi_peers.len() as i64),
        );
    }
    attributes.insert(
        ATTR_PCI_BUS_ID.into(),
        DeviceAttribute::string(&dev.pci_bdf),
    );
    if dev.info.numa >= 0 {
        attributes.insert(
            ATTR_NUMA_NODE.into(),
            DeviceAttribute::int(dev.info.numa.into()),
        );
    }

    let mem = dev.info.devmem.saturating_mul(1 << 20);
    let cus = u64::from(dev.info.devcore);
    let w = u64::from(dev.cu_per_wgp.max(1));
    let shares = u64::from(dev.info.count);
    let mut capacity = BTreeMap::new();
    let policy = |default: String, r: CapacityRequestPolicyRange| {
        shared.then(|| CapacityRequestPolicy {
            default: Some(default),
            valid_values: Vec::new(),
            valid_range: Some(r),
        })
    };
    capacity.insert(
        MEMORY.into(),
        DeviceCapacity {
            value: format_bytes(mem),
            // Default: the whole memory, so a claim that names no memory is a whole GPU.
            request_policy: policy(
                format_bytes(mem),
                range(1 << 20, mem, 1 << 20, format_bytes),
            ),
        },
    );
    capacity.insert(
        COMPUTE_UNITS.into(),
        DeviceCapacity {
            value: format_count(cus),
            request_policy: policy(format_count(cus), range(w, cus, w, format_count)),
        },
    );
    capacity.insert(
        SHARES.into(),
        DeviceCapacity {
            value: format_count(shares),
            request_policy: policy(format_count(1), range(1, shares, 1, format_count)),
        },
    );

    let mut taints = Vec::new();
    if !dev.info.health {
        let kept = previous
            .and_then(|p| p.taints.iter().find(|t| t.key == UNHEALTHY_TAINT))
            .and_then(|t| t.time_added.clone());
        taints.push(DeviceTaint {
            key: UNHEALTHY_TAINT.into(),
            value: Some("true".into()),
            // NoSchedule: no new claims; running pods keep their slice (NoExecute would evict).
            effect: "NoSchedule".into(),
            time_added: Some(kept.unwrap_or_else(|| now.to_string())),
        });
    }
    Device {
        name: device_name(gpu_index, gpu, dev),
        attributes,
        capacity,
        allow_multiple_allocations: shared,
        taints,
    }
}

/// The devices of the node, in discovery order.
pub fn devices(
    discovery: &Discovery,
    registration: &Registration,
    previous: &[ResourceSlice],
    now: &str,
) -> Result<Vec<Device>, SliceError> {
    let old: BTreeMap<&str, &Device> = previous
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| (d.name.as_str(), d))
        .collect();
    let mut out = Vec::new();
    for dev in &registration.devices {
        let (index, gpu) = discovery
            .gpus
            .iter()
            .enumerate()
            .find(|(_, g)| g.bdf == dev.pci_bdf)
            .ok_or_else(|| SliceError::NoGpu {
                id: dev.info.id.clone(),
                bdf: dev.pci_bdf.clone(),
            })?;
        let name = device_name(index, gpu, dev);
        out.push(device(
            index,
            gpu,
            dev,
            old.get(name.as_str()).copied(),
            now,
        ));
    }
    Ok(out)
}

/// The local device of a slice device name (what Prepare resolves results to).
pub fn registered_by_name<'a>(
    discovery: &Discovery,
    registration: &'a Registration,
) -> BTreeMap<String, &'a RegisteredDevice> {
    let mut out = BTreeMap::new();
    for dev in &registration.devices {
        if let Some((i, gpu)) = discovery
            .gpus
            .iter()
            .enumerate()
            .find(|(_, g)| g.bdf == dev.pci_bdf)
        {
            out.insert(device_name(i, gpu, dev), dev);
        }
    }
    out
}

/// The node's pool as slices of at most [`MAX_DEVICES_PER_SLICE`] devices, owned by the
/// Node (garbage-collected with it). The generation is the previous one when nothing
/// changed, else one more; every slice of the pool carries it.
pub fn build_slices(
    driver: &str,
    node: &NodeRef,
    devices: Vec<Device>,
    previous: &[ResourceSlice],
) -> Vec<ResourceSlice> {
    let old_gen = previous.iter().map(|s| s.spec.pool.generation).max();
    let old_devices: Vec<&Device> = previous.iter().flat_map(|s| &s.spec.devices).collect();
    let unchanged = old_devices.len() == devices.len()
        && old_devices.iter().zip(&devices).all(|(a, b)| *a == b)
        && previous.len() == devices.len().div_ceil(MAX_DEVICES_PER_SLICE).max(1);
    let generation = match old_gen {
        Some(g) if unchanged => g,
        Some(g) => g + 1,
        None => 1,
    };
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices
            .chunks(MAX_DEVICES_PER_SLICE)
            .map(<[Device]>::to_vec)
            .collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, devices)| ResourceSlice {
            api_version: API_VERSION.into(),
            kind: "ResourceSlice".into(),
            metadata: ObjectMeta {
                name: Some(format!("{}-{}-{i}", node.name, driver.replace('.', "-"))),
                owner_references: vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.name.clone(),
                    uid: node.uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }],
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.into(),
                pool: ResourcePool {
                    name: node.name.clone(),
                    generation,
                    resource_slice_count: count,
                },
                node_name: Some(node.name.clone()),
                all_nodes: None,
                devices,
            },
        })
        .collect()
}
