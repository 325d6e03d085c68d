//! From discovered GPUs to registered devices (SPEC §2.1, D-8): the `hami.io/node-amd-register`
//! entries, the kubelet device ids, and what Allocate needs to know about each device.
//! Pure: the health of each render node is passed in.

use hami_protocol::identity::{
    KubeletDeviceId, WHOLE_GPU_PARTITION, amd_smi_uuid, partition_device_id, rocr_id,
};
use hami_protocol::node_register::{CustomInfo, DeviceInfo, DeviceMode, default_amd_share_count};

use crate::discovery::{Discovery, Gpu, Partition};

/// How the node offers its GPUs (env `OPERATING_MODE`, node annotation
/// `hami.io/amd-operating-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OperatingMode {
    /// Whole cards are sliced by CU masks (count = share count); a hard partition of a
    /// partitioned card is one device of count 1, mode `xcp` (seed: "一个硬分区条目只计一次"),
    /// unless [`RegistrationSettings::slice_partitions`] opts in to slicing it too.
    #[default]
    Cu,
    /// Every hardware compute partition is one device of count 1.
    Partition,
}

impl OperatingMode {
    /// Parses `OPERATING_MODE` (case-insensitive; empty means `cu`); the error says which values work.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "cu" | "" => Ok(OperatingMode::Cu),
            "partition" => Ok(OperatingMode::Partition),
            other => Err(format!(
                "operating mode {other:?} is not supported: use \"cu\" (slice by CU masks) or \"partition\" (one device per compute partition)"
            )),
        }
    }

    /// The spelling [`OperatingMode::parse`] accepts and the annotation carries.
    pub fn as_str(self) -> &'static str {
        match self {
            OperatingMode::Cu => "cu",
            OperatingMode::Partition => "partition",
        }
    }
}

/// Settings that shape registration.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrationSettings {
    /// How whole cards and partitions become devices.
    pub mode: OperatingMode,
    /// `-split_count`; `None` = 2 on gfx12, else 10.
    pub split_count: Option<u32>,
    /// `-device_memory_scaling` (> 0; > 1 oversubscribes memory).
    pub device_memory_scaling: f64,
    /// The compute partition mode the node should run (`COMPUTE_PARTITION`), e.g. `CPX`.
    pub expected_compute_partition: Option<String>,
    /// Opt-in (`--slice-partitions`, env `SLICE_PARTITIONS`): in `cu` mode, slice hard
    /// partitions by CU masks like whole cards (count = share count, mode `hami-core`).
    /// Off by default: the seed counts a partition entry once.
    pub slice_partitions: bool,
}

impl Default for RegistrationSettings {
    fn default() -> Self {
        Self {
            mode: OperatingMode::Cu,
            split_count: None,
            device_memory_scaling: 1.0,
            expected_compute_partition: None,
            slice_partitions: false,
        }
    }
}

/// A registered device and what the plugin needs to serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredDevice {
    /// The register-annotation entry.
    pub info: DeviceInfo,
    /// kubelet device key (`<bdf>` or `amdgpu_xcp_<n>`); kubelet ids are `<key>#<k>`.
    pub device_key: String,
    /// Value for `ROCR_VISIBLE_DEVICES`.
    pub rocr_id: String,
    /// DRM card minor (`/dev/dri/card<N>`), mounted into the container.
    pub card: u32,
    /// DRM render minor (`/dev/dri/renderD<M>`), mounted into the container.
    pub render: u32,
    /// PCI address of the card (dmem region `drm/<bdf>/vram0`).
    pub pci_bdf: String,
    /// CUs per WGP of the card (2 on RDNA): CU masks must keep a WGP's CUs together.
    pub cu_per_wgp: u32,
    /// Unscaled memory of the device in bytes (dmem limits are real bytes).
    pub mem_bytes: u64,
    /// Unscaled memory of the whole card in bytes (its dmem region's size).
    pub card_mem_bytes: u64,
    /// KFD topology node of this device (ROCr enumerates visible GPUs in this order).
    pub kfd_node: u32,
    /// Hard partition index (0 for a whole card).
    pub partition_index: u8,
}

impl RegisteredDevice {
    /// The kubelet device ids of this device's shares.
    pub fn kubelet_ids(&self) -> impl Iterator<Item = KubeletDeviceId> + '_ {
        (0..self.info.count).map(|share| KubeletDeviceId {
            device_key: self.device_key.clone(),
            share,
        })
    }
}

/// Registration result: devices plus notes for the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registration {
    /// The devices to register, in discovery order.
    pub devices: Vec<RegisteredDevice>,
    /// Notes for the operator, e.g. a partition left out.
    pub warnings: Vec<String>,
    /// What the plugin also reports as a Node Event (each also in `warnings`).
    pub notices: Vec<Notice>,
}

/// Something about the node's GPUs an operator must see (a Node Event), not only a log line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Notice {
    /// Event reason, e.g. [`PARTITION_MISMATCH`].
    pub reason: &'static str,
    /// Event message, saying what to change.
    pub message: String,
}

/// A card runs another compute partition mode than the node expects.
pub const PARTITION_MISMATCH: &str = "AMDGPUPartitionMismatch";
/// Two cards report one KFD `unique_id`; their registered ids are disambiguated.
pub const DUPLICATE_UNIQUE_ID: &str = "AMDGPUDuplicateUniqueId";

/// Builds the registered devices. `healthy(render_minor)` says whether a render node opens.
pub fn register(
    discovery: &Discovery,
    settings: &RegistrationSettings,
    healthy: impl Fn(u32) -> bool,
) -> Registration {
    let mut out = Registration::default();
    for gpu in &discovery.gpus {
        if let (Some(want), Some(have)) = (
            settings.expected_compute_partition.as_deref(),
            gpu.compute_partition.as_deref(),
        ) && !want.eq_ignore_ascii_case(have)
        {
            let message = format!(
                "GPU {} runs compute partition {have} but the node expects {want}: offering it as found",
                gpu.bdf
            );
            out.warnings.push(message.clone());
            out.notices.push(Notice {
                reason: PARTITION_MISMATCH,
                message,
            });
        }
        let twins: Vec<&str> = discovery
            .gpus
            .iter()
            .filter(|g| g.unique_id == gpu.unique_id && g.bdf != gpu.bdf)
            .map(|g| g.bdf.as_str())
            .collect();
        let partitioned = gpu.is_partitioned();
        for part in &gpu.partitions {
            let mut dev = device(gpu, part, partitioned, settings, healthy(part.render));
            if !twins.is_empty() {
                // Keep every card, with an id that names it: the plain id would be the same
                // for all of them (the node annotation refuses duplicates).
                dev.info.id = format!("{}-{}", dev.info.id, bdf_tag(&gpu.bdf));
            }
            out.devices.push(dev);
        }
        if !twins.is_empty() {
            let message = format!(
                "GPU {} reports KFD unique_id {} like {}: registered as {} (ids suffixed with the PCI address); the hardware or firmware reports a wrong serial",
                gpu.bdf,
                gpu.unique_id,
                twins.join(", "),
                out.devices.last().map(|d| d.info.id.as_str()).unwrap_or("")
            );
            out.warnings.push(message.clone());
            out.notices.push(Notice {
                reason: DUPLICATE_UNIQUE_ID,
                message,
            });
        }
    }
    out
}

/// A PCI address usable inside an id (no `:` or `.`): `0000:05:00.0` → `0000-05-00-0`.
fn bdf_tag(bdf: &str) -> String {
    bdf.replace([':', '.'], "-")
}

fn device(
    gpu: &Gpu,
    part: &Partition,
    partitioned: bool,
    settings: &RegistrationSettings,
    health: bool,
) -> RegisteredDevice {
    let id = if partitioned {
        partition_device_id(gpu.unique_id, part.index)
    } else {
        amd_smi_uuid(gpu.unique_id, gpu.device_id, WHOLE_GPU_PARTITION)
    };
    let mem_bytes = if partitioned {
        // A partition's own memory; without mem_banks, an even share of the card.
        part.mem_bytes
            .filter(|b| *b > 0)
            .unwrap_or(gpu.vram_bytes / gpu.partitions.len().max(1) as u64)
    } else {
        gpu.vram_bytes
    };
    let scaling =
        if settings.device_memory_scaling.is_finite() && settings.device_memory_scaling > 0.0 {
            settings.device_memory_scaling
        } else {
            1.0
        };
    let devmem = ((mem_bytes >> 20) as f64 * scaling).floor() as u64;
    let (count, mode) = match settings.mode {
        OperatingMode::Cu if partitioned && !settings.slice_partitions => (1, DeviceMode::Xcp),
        OperatingMode::Cu => (
            settings
                .split_count
                .filter(|c| *c > 0)
                .unwrap_or_else(|| default_amd_share_count(gpu.gfx_target_version)),
            DeviceMode::HamiCore,
        ),
        OperatingMode::Partition => (1, DeviceMode::Xcp),
    };
    RegisteredDevice {
        info: DeviceInfo {
            id,
            index: part.card,
            count,
            devmem,
            devcore: part.compute_units,
            device_type: gpu.market_name.clone(),
            numa: gpu.numa,
            mode,
            health,
            device_vendor: hami_protocol::names::Vendor::Amd.word().to_owned(),
            custom_info: CustomInfo {
                pci_bdf: Some(gpu.bdf.clone()),
                cu_per_wgp: Some(gpu.cu_per_wgp),
                compute_queues: Some(gpu.compute_queues),
                xgmi_peers: registered_peers(gpu, partitioned),
                compute_partition: gpu.compute_partition.clone(),
                memory_partition: gpu.memory_partition.clone(),
            },
        },
        device_key: part.device_key.clone(),
        rocr_id: rocr_id(gpu.unique_id),
        card: part.card,
        render: part.render,
        pci_bdf: gpu.bdf.clone(),
        cu_per_wgp: gpu.cu_per_wgp,
        mem_bytes,
        card_mem_bytes: gpu.vram_bytes,
        kfd_node: part.kfd_node,
        partition_index: part.index,
    }
}

/// `custominfo.xgmiPeers`: the cards reachable over XGMI and, for a partitioned card, the
/// card itself: its partitions share one die (and its fabric), so `amd.com/link-bind`
/// must treat two partitions of one card as peers. The scheduler's peer test is "the other
/// device's `pciBDF` is listed", and partitions of one card share their `pciBDF`.
fn registered_peers(gpu: &Gpu, partitioned: bool) -> Vec<String> {
    let mut peers = gpu.xgmi_peers.clone();
    if partitioned && !peers.contains(&gpu.bdf) {
        peers.push(gpu.bdf.clone());
        peers.sort();
    }
    peers
}
