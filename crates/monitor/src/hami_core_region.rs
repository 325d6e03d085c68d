//! Reader of the HAMi-core shared region (SPEC Appendix A): version 1.1/1.2 and the older
//! v0 layout, from any [`RegionBytes`]. Pure: no I/O, never a lock or the region's
//! semaphore; it only loads fields.

use crate::region_bytes::RegionBytes;

/// `initialized_flag` of an initialised region.
pub const MAGIC: i32 = 19_920_718;
/// Device slots (`CUDA_DEVICE_MAX_COUNT`).
pub const MAX_DEVICES: usize = 16;
/// Process slots (`SHARED_REGION_MAX_PROCESS_NUM`).
pub const MAX_PROCS: usize = 1024;
/// Bytes of each NVML UUID buffer.
pub const UUID_LEN: usize = 96;
/// Smallest file that can hold the 12-byte header (magic + two version words).
pub const HEADER_LEN: usize = 12;

/// Where the fields of one layout version sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `v1` or `v0`.
    pub name: &'static str,
    /// File size of this layout.
    pub size: usize,
    /// Byte offset of the device count.
    pub device_num: usize,
    /// Byte offset of `uuids[]`.
    pub uuids: usize,
    /// Byte offset of `limit[]`.
    pub limit: usize,
    /// Byte offset of `sm_limit[]`.
    pub sm_limit: usize,
    /// Byte offset of `procs[]`.
    pub procs: usize,
    /// Byte offset of `proc_num`.
    pub proc_num: usize,
    /// Byte offset of `utilization_switch`.
    pub utilization_switch: usize,
    /// Byte offset of `recent_kernel`.
    pub recent_kernel: usize,
    /// Byte offset of `priority`.
    pub priority: usize,
    /// Byte offset of `last_kernel_time` (absent in v0).
    pub last_kernel_time: Option<usize>,
    /// Where the fields of a process slot sit.
    pub slot: SlotLayout,
}

/// Where the fields of one process slot sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    /// Bytes per slot.
    pub size: usize,
    /// Offset of `pid` in a slot.
    pub pid: usize,
    /// Offset of `hostpid`.
    pub hostpid: usize,
    /// Offset of `used[]`.
    pub used: usize,
    /// `device_memory_t` size: context, module, data, offset, total (+ reserved in v1).
    pub used_stride: usize,
    /// Offset of `monitorused[]`.
    pub monitorused: usize,
    /// Offset of `device_util[]`.
    pub util: usize,
    /// `device_util_t` size: dec, enc, sm (+ reserved in v1).
    pub util_stride: usize,
    /// Offset of `status`.
    pub status: usize,
}

/// HAMi-core 1.1 and 1.2 (identical layouts; 1.2 marks the fixed ABI of 2026-04).
pub const V1: Layout = Layout {
    name: "v1",
    size: 2_008_952,
    device_num: 56,
    uuids: 64,
    limit: 1600,
    sm_limit: 1728,
    procs: 1856,
    proc_num: 2_008_896,
    utilization_switch: 2_008_900,
    recent_kernel: 2_008_904,
    priority: 2_008_908,
    last_kernel_time: Some(2_008_912),
    slot: SlotLayout {
        size: 1960,
        pid: 0,
        hostpid: 4,
        used: 8,
        used_stride: 64,
        monitorused: 1032,
        util: 1160,
        util_stride: 48,
        status: 1928,
    },
};

/// HAMi-core 2024-04-18 … 2024-08-27: no version words.
pub const V0: Layout = Layout {
    name: "v0",
    size: 1_197_896,
    device_num: 48,
    uuids: 56,
    limit: 1592,
    sm_limit: 1720,
    procs: 1848,
    proc_num: 1_197_880,
    utilization_switch: 1_197_884,
    recent_kernel: 1_197_888,
    priority: 1_197_892,
    last_kernel_time: None,
    slot: SlotLayout {
        size: 1168,
        pid: 0,
        hostpid: 4,
        used: 8,
        used_stride: 40,
        monitorused: 648,
        util: 776,
        util_stride: 24,
        status: 1160,
    },
};

/// Layouts older than v0 (no `device_util`): named in the refusal so the user knows why.
pub const PRE_V0_SIZE: usize = 804_680;

/// Why a cache file cannot be read (yet). Each names what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreRegionError {
    /// The file has no bytes yet.
    #[error(
        "the cache file is empty (0 bytes): the container's first CUDA process has not created it yet, or was killed while creating it"
    )]
    Empty,
    /// Shorter than the header; its size.
    #[error(
        "the cache file has {0} bytes, fewer than the 12-byte header: not a HAMi-core region, or still being created"
    )]
    Truncated(usize),
    /// The header is still zero.
    #[error(
        "the cache file's header is still zero: HAMi-core has not finished initialising it (retried on the next scan)"
    )]
    NotInitialized,
    /// Not HAMi-core's magic.
    #[error(
        "wrong magic {found} (expected {MAGIC}): not a HAMi-core shared region; remove the file if nothing uses it"
    )]
    WrongMagic {
        /// The magic read.
        found: i32,
    },
    /// A version and size this monitor does not know.
    #[error(
        "HAMi-core region version {major}.{minor} with {size} bytes is not supported (this monitor reads 1.1, 1.2 and v0); upgrade the monitor or HAMi-core so they match"
    )]
    UnknownVersion {
        /// Major version read.
        major: u32,
        /// Minor version read.
        minor: u32,
        /// File size.
        size: usize,
    },
    /// Smaller than the smallest known layout.
    #[error("the cache file has {size} bytes, fewer than the smallest known layout (v0, {} bytes){}; the file is truncated, or from a HAMi-core older than 2024-04-18, which has no utilization fields — upgrade it", V0.size, if *.size == PRE_V0_SIZE || *.size == PRE_V0_SIZE + 1 { " — this is the pre-2024-04 layout" } else { "" })]
    TooSmall {
        /// File size.
        size: usize,
    },
    /// Between the v0 and v1 sizes.
    #[error("the cache file has {size} bytes: more than a v0 region ({} bytes) and fewer than a v1 region ({} bytes); a v1 file still growing or truncated (retried on the next scan)", V0.size + 1, V1.size)]
    BetweenLayouts {
        /// File size.
        size: usize,
    },
}

impl CoreRegionError {
    /// The `kind` label of the error counter.
    pub fn kind(&self) -> &'static str {
        match self {
            CoreRegionError::Empty => "cache_empty",
            CoreRegionError::Truncated(_)
            | CoreRegionError::TooSmall { .. }
            | CoreRegionError::BetweenLayouts { .. } => "cache_truncated",
            CoreRegionError::NotInitialized => "cache_not_initialized",
            CoreRegionError::WrongMagic { .. } => "cache_wrong_magic",
            CoreRegionError::UnknownVersion { .. } => "cache_unknown_version",
        }
    }
}

/// Picks the layout of a region from its header and size (SPEC Appendix A; the reference's
/// rule, except that v1 minors other than 1 and 2 are refused instead of trusted).
pub fn detect_layout(
    bytes: &(impl RegionBytes + ?Sized),
) -> Result<&'static Layout, CoreRegionError> {
    let size = bytes.len();
    if size == 0 {
        return Err(CoreRegionError::Empty);
    }
    if size < HEADER_LEN {
        return Err(CoreRegionError::Truncated(size));
    }
    let magic = bytes.i32_at(0);
    if magic == 0 {
        return Err(CoreRegionError::NotInitialized);
    }
    if magic != MAGIC {
        return Err(CoreRegionError::WrongMagic { found: magic });
    }
    let (major, minor) = (bytes.u32_at(4), bytes.u32_at(8));
    if size >= V1.size {
        return if major == 1 && matches!(minor, 1 | 2) {
            Ok(&V1)
        } else {
            Err(CoreRegionError::UnknownVersion { major, minor, size })
        };
    }
    // HAMi-core always writes sizeof + 1 bytes: anything longer than a v0 file and shorter
    // than a v1 file is a v1 file cut short, not a v0 one (the reference misreads it).
    if size > V0.size + 1 {
        return Err(CoreRegionError::BetweenLayouts { size });
    }
    if size >= V0.size {
        return Ok(&V0);
    }
    Err(CoreRegionError::TooSmall { size })
}

/// The ranges a reading of `layout` needs besides the slots: header through the SM limits,
/// and the tail fields (`proc_num` … end).
pub fn fixed_ranges(layout: &Layout) -> [std::ops::Range<usize>; 2] {
    [0..layout.procs, layout.proc_num..layout.size]
}

/// The process slots in use, as `proc_num` (read from the tail) says; clamped like the reader.
pub fn slot_range(layout: &Layout, proc_num: i32) -> std::ops::Range<usize> {
    let n = proc_num.clamp(0, MAX_PROCS as i32) as usize;
    layout.procs..layout.procs + n * layout.slot.size
}

/// Slots in use (`status != 0`) with a `pid` but no `hostpid` (their process runs in a
/// PID namespace of its own): `(slot index, pid)`.
pub fn unresolved_slots(bytes: &(impl RegionBytes + ?Sized), layout: &Layout) -> Vec<(usize, i32)> {
    let proc_num = (bytes.i32_at(layout.proc_num).clamp(0, MAX_PROCS as i32)) as usize;
    (0..proc_num)
        .filter_map(|index| {
            let base = layout.procs + index * layout.slot.size;
            let pid = bytes.i32_at(base + layout.slot.pid);
            (bytes.i32_at(base + layout.slot.status) != 0
                && pid > 0
                && bytes.i32_at(base + layout.slot.hostpid) == 0)
                .then_some((index, pid))
        })
        .collect()
}

/// Memory one container holds on one device, summed over its live process slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    /// CUDA contexts, bytes.
    pub context: u64,
    /// Loaded modules, bytes.
    pub module: u64,
    /// Allocations, bytes.
    pub data: u64,
    /// Their total as HAMi-core counts it, bytes.
    pub total: u64,
}

/// One device slot of a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreDevice {
    /// In-container (NVML order) device index.
    pub index: usize,
    /// NVML UUID of the device.
    pub uuid: String,
    /// Bytes, 0 = unlimited.
    pub limit: u64,
    /// Percent.
    pub sm_limit: u64,
    /// Memory held by live processes.
    pub memory: MemoryBreakdown,
    /// Σ `sm_util` of live slots, unclamped (clamping is the caller's decision, D-6).
    pub sm_util_sum: u64,
}

/// Everything the monitor reports from one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreReading {
    /// `v1` or `v0`.
    pub layout: &'static str,
    /// Major version from the header.
    pub major: u32,
    /// Minor version from the header.
    pub minor: u32,
    /// Device slots with a UUID.
    pub devices: Vec<CoreDevice>,
    /// Unix seconds; `None` for v0 or when never set.
    pub last_kernel_time: Option<u64>,
    /// `priority` of the region.
    pub priority: i32,
    /// Live process slots (status ≠ 0 and host pid not known dead).
    pub live_processes: usize,
    /// Slots skipped because their host process is gone (D-6: stale values of killed
    /// processes are not reported).
    pub dead_processes: usize,
    /// Device slots skipped because their UUID is unset (NVML not initialised yet) or not
    /// UTF-8.
    pub devices_without_uuid: usize,
}

/// Reads a region. `host_alive(hostpid)` says whether a host pid still runs; slots whose
/// `hostpid` is 0 (not resolved by HAMi-core) are counted, since nothing says they are dead.
pub fn read_region(
    bytes: &(impl RegionBytes + ?Sized),
    host_alive: &dyn Fn(i32) -> bool,
) -> Result<CoreReading, CoreRegionError> {
    let layout = detect_layout(bytes)?;
    let (major, minor) = if layout.last_kernel_time.is_some() {
        (bytes.u32_at(4), bytes.u32_at(8))
    } else {
        (0, 0)
    };
    let device_num = (bytes.u64_at(layout.device_num) as usize).min(MAX_DEVICES);
    let proc_num = (bytes.i32_at(layout.proc_num).clamp(0, MAX_PROCS as i32)) as usize;

    let mut live_slots = Vec::new();
    let mut dead_processes = 0;
    for index in 0..proc_num {
        let base = layout.procs + index * layout.slot.size;
        if bytes.i32_at(base + layout.slot.status) == 0 {
            continue;
        }
        let hostpid = bytes.i32_at(base + layout.slot.hostpid);
        if hostpid > 0 && !host_alive(hostpid) {
            dead_processes += 1;
            continue;
        }
        live_slots.push(base);
    }

    let mut devices = Vec::with_capacity(device_num);
    let mut devices_without_uuid = 0;
    for index in 0..device_num {
        let raw = bytes.c_string_at(layout.uuids + index * UUID_LEN, UUID_LEN);
        let Ok(uuid) = String::from_utf8(raw) else {
            devices_without_uuid += 1;
            continue;
        };
        if uuid.is_empty() {
            devices_without_uuid += 1;
            continue;
        }
        let mut memory = MemoryBreakdown::default();
        let mut sm_util_sum = 0u64;
        for base in &live_slots {
            let used = base + layout.slot.used + index * layout.slot.used_stride;
            memory.context = memory.context.saturating_add(bytes.u64_at(used));
            memory.module = memory.module.saturating_add(bytes.u64_at(used + 8));
            memory.data = memory.data.saturating_add(bytes.u64_at(used + 16));
            memory.total = memory.total.saturating_add(bytes.u64_at(used + 32));
            let util = base + layout.slot.util + index * layout.slot.util_stride;
            sm_util_sum = sm_util_sum.saturating_add(bytes.u64_at(util + 16));
        }
        devices.push(CoreDevice {
            index,
            uuid,
            limit: bytes.u64_at(layout.limit + index * 8),
            sm_limit: bytes.u64_at(layout.sm_limit + index * 8),
            memory,
            sm_util_sum,
        });
    }
    let last_kernel_time = layout
        .last_kernel_time
        .map(|at| bytes.u64_at(at))
        .filter(|t| *t > 0);
    Ok(CoreReading {
        layout: layout.name,
        major,
        minor,
        devices,
        last_kernel_time,
        priority: bytes.i32_at(layout.priority),
        live_processes: live_slots.len(),
        dead_processes,
        devices_without_uuid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_add_up_to_the_documented_sizes() {
        for layout in [V1, V0] {
            assert_eq!(layout.procs + MAX_PROCS * layout.slot.size, layout.proc_num);
            assert_eq!(layout.uuids + MAX_DEVICES * UUID_LEN, layout.limit);
            assert_eq!(layout.limit + MAX_DEVICES * 8, layout.sm_limit);
            assert_eq!(layout.sm_limit + MAX_DEVICES * 8, layout.procs);
            let s = layout.slot;
            assert_eq!(s.used + MAX_DEVICES * s.used_stride, s.monitorused);
            assert_eq!(s.monitorused + MAX_DEVICES * 8, s.util);
            assert_eq!(s.util + MAX_DEVICES * s.util_stride, s.status);
        }
        assert_eq!(V1.size, 2_008_952);
        assert_eq!(V1.last_kernel_time, Some(V1.size - 40));
        assert_eq!(V0.size, V0.priority + 4);
    }
}
