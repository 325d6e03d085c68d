//! Reader of our HIP hook's accounting region (hami-region layout 1.0, see
//! crates/region/README.md), from any [`RegionBytes`]. Pure: it never takes the region's
//! device locks or flock; liveness of a slot is asked of the caller (the shell probes the
//! slot's OFD record lock, which is what hami-region defines as "alive").

use std::mem::offset_of;

use hami_region::layout::{
    DeviceAccount, DeviceUtil, LIMIT_NONE, MAGIC, MAJOR_VERSION, MAX_DEVICES, MAX_PROCS, ProcSlot,
    REGION_SIZE, RegionHeader, RegionLayout, SLOT_ACTIVE, SLOT_SIZE, SLOTS_OFFSET, slot_offset,
};

use crate::region_bytes::RegionBytes;

/// Why a HIP region cannot be read (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HipRegionError {
    /// The file has no bytes yet.
    #[error("the HIP accounting file is empty (0 bytes): its first process has not sized it yet")]
    Empty,
    /// Not the region's size.
    #[error(
        "the HIP accounting file has {size} bytes, {REGION_SIZE} expected: truncated, or still being created"
    )]
    Truncated {
        /// File size.
        size: usize,
    },
    /// The magic is still zero.
    #[error(
        "the HIP accounting file's magic is still zero: its creator has not finished initialising it (retried on the next scan)"
    )]
    NotInitialized,
    /// Not the HIP region's magic.
    #[error(
        "wrong magic {found:#010x} (expected {MAGIC:#010x}, \"HIPR\"): not a HIP accounting region"
    )]
    WrongMagic {
        /// The magic read.
        found: u32,
    },
    /// A major version this monitor does not read.
    #[error(
        "HIP accounting region version {major}.{minor} ({detail}) is not supported by this monitor (major {MAJOR_VERSION}); upgrade the monitor to match libamvgpu.so"
    )]
    UnknownVersion {
        /// Major version read.
        major: u32,
        /// Minor version read.
        minor: u32,
        /// What else the header says.
        detail: String,
    },
}

impl HipRegionError {
    /// The `kind` label of the error counter.
    pub fn kind(&self) -> &'static str {
        match self {
            HipRegionError::Empty => "cache_empty",
            HipRegionError::Truncated { .. } => "cache_truncated",
            HipRegionError::NotInitialized => "cache_not_initialized",
            HipRegionError::WrongMagic { .. } => "cache_wrong_magic",
            HipRegionError::UnknownVersion { .. } => "cache_unknown_version",
        }
    }
}

/// One device of a HIP region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipDevice {
    /// In-container HIP device ordinal.
    pub index: usize,
    /// Σ bytes held by live processes.
    pub used: u64,
    /// Bytes accounted on the device (live + not yet reclaimed dead processes).
    pub accounted: u64,
    /// Bytes; `None` when no limit is configured.
    pub limit: Option<u64>,
    /// Highest `used` since the region was created, bytes.
    pub peak: u64,
    /// Σ `sm_util` written by a sampler into live slots (0 when none writes it).
    pub sm_util_sum: u64,
}

/// Everything the monitor reports from one HIP region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipReading {
    /// Minor version from the header.
    pub minor: u32,
    /// Device accounts, by in-container ordinal.
    pub devices: Vec<HipDevice>,
    /// Process slots whose process lives.
    pub live_processes: usize,
    /// Process slots whose process is gone.
    pub dead_processes: usize,
    /// Host pids of live slots that know theirs (0s left out).
    pub hostpids: Vec<i32>,
}

const HEADER: usize = offset_of!(RegionLayout, header);
const DEVICES: usize = offset_of!(RegionLayout, devices);

fn header_field(field: usize) -> usize {
    HEADER + field
}

/// Checks the header the way hami-region's own attach does: magic, major, geometry.
pub fn check_header(bytes: &(impl RegionBytes + ?Sized)) -> Result<(), HipRegionError> {
    let size = bytes.len();
    if size == 0 {
        return Err(HipRegionError::Empty);
    }
    if size < REGION_SIZE {
        return Err(HipRegionError::Truncated { size });
    }
    let magic = bytes.u32_at(header_field(offset_of!(RegionHeader, magic)));
    if magic == 0 {
        return Err(HipRegionError::NotInitialized);
    }
    if magic != MAGIC {
        return Err(HipRegionError::WrongMagic { found: magic });
    }
    let major = bytes.u32_at(header_field(offset_of!(RegionHeader, major)));
    let minor = bytes.u32_at(header_field(offset_of!(RegionHeader, minor)));
    let geometry = (
        bytes.u32_at(header_field(offset_of!(RegionHeader, max_devices))) as usize,
        bytes.u32_at(header_field(offset_of!(RegionHeader, max_procs))) as usize,
        bytes.u32_at(header_field(offset_of!(RegionHeader, slot_size))) as usize,
        bytes.u64_at(header_field(offset_of!(RegionHeader, region_size))) as usize,
    );
    if major != MAJOR_VERSION || geometry != (MAX_DEVICES, MAX_PROCS, SLOT_SIZE, REGION_SIZE) {
        return Err(HipRegionError::UnknownVersion {
            major,
            minor,
            detail: format!(
                "{} devices, {} processes, {} B slots, {} B region",
                geometry.0, geometry.1, geometry.2, geometry.3
            ),
        });
    }
    Ok(())
}

/// The ranges a reading needs besides the slots: header and device accounts.
pub fn fixed_range() -> std::ops::Range<usize> {
    0..SLOTS_OFFSET
}

/// The slots below the high-water mark (read from the header), clamped like the reader.
pub fn slot_range(slot_high_water: u32) -> std::ops::Range<usize> {
    SLOTS_OFFSET..slot_offset((slot_high_water as usize).min(MAX_PROCS))
}

/// Offset of the header's `slot_high_water`.
pub const SLOT_HIGH_WATER: usize = HEADER + offset_of!(RegionHeader, slot_high_water);

/// Reads a HIP region. `slot_alive(index)` says whether slot `index`'s owner still holds its
/// record lock. Devices are reported when they have a limit or hold bytes.
pub fn read_region(
    bytes: &(impl RegionBytes + ?Sized),
    slot_alive: &mut dyn FnMut(usize) -> bool,
) -> Result<HipReading, HipRegionError> {
    check_header(bytes)?;
    let minor = bytes.u32_at(header_field(offset_of!(RegionHeader, minor)));
    let high = (bytes.u32_at(header_field(offset_of!(RegionHeader, slot_high_water))) as usize)
        .min(MAX_PROCS);
    let mut live = Vec::new();
    let mut dead_processes = 0;
    let mut hostpids = Vec::new();
    for index in 0..high {
        let base = slot_offset(index);
        if bytes.u32_at(base + offset_of!(ProcSlot, status)) != SLOT_ACTIVE {
            continue;
        }
        if !slot_alive(index) {
            dead_processes += 1;
            continue;
        }
        let hostpid = bytes.i32_at(base + offset_of!(ProcSlot, hostpid));
        if hostpid > 0 {
            hostpids.push(hostpid);
        }
        live.push(base);
    }
    let util_size = size_of::<DeviceUtil>();
    let mut devices = Vec::new();
    for index in 0..MAX_DEVICES {
        let account = DEVICES + index * size_of::<DeviceAccount>();
        let limit = bytes.u64_at(account + offset_of!(DeviceAccount, limit));
        let accounted = bytes.u64_at(account + offset_of!(DeviceAccount, used));
        let mut used = 0u64;
        let mut sm_util_sum = 0u64;
        for base in &live {
            used = used.saturating_add(bytes.u64_at(base + offset_of!(ProcSlot, used) + index * 8));
            sm_util_sum = sm_util_sum.saturating_add(bytes.u64_at(
                base + offset_of!(ProcSlot, util)
                    + index * util_size
                    + offset_of!(DeviceUtil, sm_util),
            ));
        }
        if limit == LIMIT_NONE && used == 0 && accounted == 0 {
            continue;
        }
        devices.push(HipDevice {
            index,
            used,
            accounted,
            limit: (limit != LIMIT_NONE).then_some(limit),
            peak: bytes.u64_at(account + offset_of!(DeviceAccount, peak)),
            sm_util_sum,
        });
    }
    Ok(HipReading {
        minor,
        devices,
        live_processes: live.len(),
        dead_processes,
        hostpids,
    })
}
