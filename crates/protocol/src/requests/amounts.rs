//! What one container asks for once read: counts, memory, cores, and the defaults and
//! per-vendor limits the reading applies.

use serde::Serialize;

use super::ContainerKind;
use crate::names::Vendor;

/// Most GPUs one container can use: the accounting regions have 64 AMD and 16 NVIDIA
/// device slots.
pub const fn max_gpus_per_container(vendor: Vendor) -> u32 {
    match vendor {
        Vendor::Amd => 64,
        Vendor::Nvidia => 16,
    }
}

/// Scheduler-configurable defaults (HAMi's `defaultMemory`, `defaultCores`, `defaultGPUNum`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDefaults {
    /// NVIDIA memory in MiB when neither `gpumem` nor a percentage is given; 0 = whole card.
    pub nvidia_default_memory_mib: u64,
    /// NVIDIA cores when `gpucores` is absent but memory is given; 0 = no core reservation.
    pub nvidia_default_cores: u32,
    /// GPU count added when a container gives memory or cores without a count.
    pub default_gpu_count: u32,
}

impl Default for RequestDefaults {
    fn default() -> Self {
        Self {
            nvidia_default_memory_mib: 0,
            nvidia_default_cores: 0,
            default_gpu_count: 1,
        }
    }
}

/// Device memory wanted on each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "value")]
pub enum MemoryRequest {
    /// All of the GPU's memory.
    Whole,
    /// This many MiB (`gpumem`).
    Mib(u64),
    /// Percent of the GPU's memory, 1..=100.
    Percent(u32),
}

impl MemoryRequest {
    /// MiB to reserve on a GPU with `devmem_mib`: `floor(devmem × pct / 100)` for
    /// percentages.
    pub fn resolve(self, devmem_mib: u64) -> u64 {
        match self {
            MemoryRequest::Whole => devmem_mib,
            MemoryRequest::Mib(mib) => mib,
            MemoryRequest::Percent(pct) => {
                u64::try_from(u128::from(devmem_mib) * u128::from(pct) / 100).unwrap_or(u64::MAX)
            }
        }
    }
}

/// AMD CU count for a percentage of a GPU with `devcore` CUs whose WGP holds `cu_per_wgp`
/// CUs (the register's `cuPerWGP`; 0 or absent read as 1): SPEC §2.2's
/// `floor(pct × devcore / 100)` clamped to `[1, devcore]`, then, where a WGP holds more than
/// one CU (RDNA: 2), rounded **up** to whole WGPs and clamped to the GPU's whole WGPs
/// (`devcore` rounded down). A slice on RDNA is made of whole WGPs (§2.5), so this is
/// exactly what the plugin's CU choice gives: the scheduler charges what the pod gets
/// (5 % of 64 CUs is 4, not the 3 of the floor, of which one WGP = 2 would be given).
/// 0 when the GPU reports no CUs (or fewer than one WGP).
pub fn amd_cu_count(cores_percent: u32, devcore: u32, cu_per_wgp: u32) -> u32 {
    if devcore == 0 {
        return 0;
    }
    let cus = u64::from(cores_percent) * u64::from(devcore) / 100;
    let cus = u32::try_from(cus).unwrap_or(u32::MAX).clamp(1, devcore);
    let w = cu_per_wgp.max(1);
    if w == 1 {
        return cus;
    }
    cus.div_ceil(w).saturating_mul(w).min(devcore / w * w)
}

/// One vendor's request of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRequest {
    /// Number of GPUs.
    pub count: u32,
    /// Memory on each GPU.
    pub memory: MemoryRequest,
    /// Percent of each GPU's compute (AMD: CUs, NVIDIA: SMs); 0 = no core reservation
    /// (NVIDIA's configured default only).
    pub cores_percent: u32,
    /// NVIDIA task priority (`nvidia.com/priority`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Resources the webhook adds to the container's limits to make the defaults explicit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub added_limits: Vec<(&'static str, String)>,
}

/// What one container asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerRequest {
    /// The container's name.
    pub name: String,
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// The AMD request, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd: Option<DeviceRequest>,
    /// The NVIDIA request, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvidia: Option<DeviceRequest>,
}

impl ContainerRequest {
    /// The request for `vendor`, if any.
    pub fn get(&self, vendor: Vendor) -> Option<&DeviceRequest> {
        match vendor {
            Vendor::Amd => self.amd.as_ref(),
            Vendor::Nvidia => self.nvidia.as_ref(),
        }
    }

    /// Whether the container asks for no GPU at all.
    pub fn is_empty(&self) -> bool {
        self.amd.is_none() && self.nvidia.is_none()
    }
}
