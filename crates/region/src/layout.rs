//! The byte layout of the shared accounting region, version 1.0 (see README.md, "Layout").
//!
//! Every field is an atomic so that a shared reference to the mapping is sound while other
//! processes write it; nothing in here is ever accessed through `&mut`. Offsets are pinned by
//! compile-time assertions at the bottom of this file: changing one is a major version bump.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

/// `b"HIPR"` read as a little-endian u32; stored last, with release order, by the creator.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HIPR");
/// Incompatible layout changes bump this; readers refuse any other major.
pub const MAJOR_VERSION: u32 = 1;
/// Compatible additions (reserved fields given a meaning) bump this.
pub const MINOR_VERSION: u32 = 0;
/// Devices per container (SPEC §5).
pub const MAX_DEVICES: usize = 64;
/// Process slots per container (SPEC §5).
pub const MAX_PROCS: usize = 1024;
/// `DeviceAccount::limit` value meaning "no limit configured for this device".
pub const LIMIT_NONE: u64 = u64::MAX;

/// `ProcSlot::status`: free for the next process.
pub const SLOT_FREE: u32 = 0;
/// `ProcSlot::status`: owned by a process (alive while it holds the slot's record lock).
pub const SLOT_ACTIVE: u32 = 1;

/// Region header: identity and geometry, so a reader can refuse what it does not understand.
#[repr(C)]
pub struct RegionHeader {
    /// [`MAGIC`] once initialised; 0 while the creator is still writing.
    pub magic: AtomicU32,
    /// Layout major version: a reader refuses another.
    pub major: AtomicU32,
    /// Layout minor version: additions a reader of the same major may ignore.
    pub minor: AtomicU32,
    /// [`MAX_DEVICES`] at creation.
    pub max_devices: AtomicU32,
    /// [`MAX_PROCS`] at creation.
    pub max_procs: AtomicU32,
    /// `size_of::<ProcSlot>()` at creation.
    pub slot_size: AtomicU32,
    /// `size_of::<RegionLayout>()` at creation.
    pub region_size: AtomicU64,
    /// Number of devices that had a limit variable when the region was created.
    pub configured_devices: AtomicU32,
    /// One past the highest slot index ever claimed: readers scan `slots[..slot_high_water]`.
    pub slot_high_water: AtomicU32,
    /// Zero; room for header fields without a new major version.
    pub reserved: [AtomicU64; 3],
}

/// Per-device accounting, one cache line each so that devices do not contend.
#[repr(C, align(64))]
pub struct DeviceAccount {
    /// Accounting lock: 0 free, otherwise [`lock_word`] of the holder (its slot index + 1
    /// in the low 32 bits, the slot's generation in the high 32 bits).
    pub lock: AtomicU64,
    /// Bytes reserved on this device by all slots: always the sum of `slots[*].used[d]`.
    pub used: AtomicU64,
    /// Limit in bytes, [`LIMIT_NONE`] if none. 0 refuses every allocation (D-3).
    pub limit: AtomicU64,
    /// Highest `used` seen since creation.
    pub peak: AtomicU64,
    /// Zero; pads the account to its cache line.
    pub reserved: [AtomicU64; 4],
}

/// Utilization of one device by one process (SPEC §6), written by samplers.
#[repr(C)]
pub struct DeviceUtil {
    /// Decoder utilization, percent.
    pub dec_util: AtomicU64,
    /// Encoder utilization, percent.
    pub enc_util: AtomicU64,
    /// Compute utilization, percent.
    pub sm_util: AtomicU64,
    /// Zero; room for another figure.
    pub reserved: AtomicU64,
}

/// One process. Slots never move: a process keeps its index for life (no compaction).
#[repr(C, align(64))]
pub struct ProcSlot {
    /// [`SLOT_FREE`] or [`SLOT_ACTIVE`].
    pub status: AtomicU32,
    /// PID in the container's PID namespace.
    pub pid: AtomicI32,
    /// PID in the host namespace, 0 while unknown (filled by the monitor).
    pub hostpid: AtomicI32,
    /// Incremented on every claim, so that a lock word of a dead former owner never
    /// matches the slot's next owner.
    pub generation: AtomicU32,
    /// Start time of the process in clock ticks since boot (`/proc/<pid>/stat` field 22),
    /// for humans and monitors; liveness uses the record lock, not this.
    pub start_time: AtomicU64,
    /// Zero; room for slot fields without a new major version.
    pub reserved: [AtomicU64; 5],
    /// Bytes this process holds per device.
    pub used: [AtomicU64; MAX_DEVICES],
    /// Bytes a monitor measured for this process per device (e.g. from DRM fdinfo).
    pub monitor_used: [AtomicU64; MAX_DEVICES],
    /// Utilization per device.
    pub util: [DeviceUtil; MAX_DEVICES],
}

/// The whole file.
#[repr(C)]
pub struct RegionLayout {
    /// Identity and geometry.
    pub header: RegionHeader,
    /// One account per device.
    pub devices: [DeviceAccount; MAX_DEVICES],
    /// One slot per process.
    pub slots: [ProcSlot; MAX_PROCS],
}

/// Bytes of the region (and of the file).
pub const REGION_SIZE: usize = size_of::<RegionLayout>();
/// Bytes of one process slot.
pub const SLOT_SIZE: usize = size_of::<ProcSlot>();
/// File offset of slot 0.
pub const SLOTS_OFFSET: usize = std::mem::offset_of!(RegionLayout, slots);

/// File offset of slot `index`: the byte its owner holds a record lock on for life.
pub const fn slot_offset(index: usize) -> usize {
    SLOTS_OFFSET + index * SLOT_SIZE
}

/// The device-lock word of the owner of slot `index` at `generation`; never 0.
pub const fn lock_word(index: usize, generation: u32) -> u64 {
    ((generation as u64) << 32) | (index as u64 + 1)
}

/// The slot index a non-zero lock word names.
pub const fn lock_holder(word: u64) -> Option<usize> {
    let low = (word & 0xffff_ffff) as usize;
    if low == 0 { None } else { Some(low - 1) }
}

const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(RegionHeader, magic) == 0);
    assert!(offset_of!(RegionHeader, major) == 4);
    assert!(offset_of!(RegionHeader, minor) == 8);
    assert!(offset_of!(RegionHeader, max_devices) == 12);
    assert!(offset_of!(RegionHeader, max_procs) == 16);
    assert!(offset_of!(RegionHeader, slot_size) == 20);
    assert!(offset_of!(RegionHeader, region_size) == 24);
    assert!(offset_of!(RegionHeader, configured_devices) == 32);
    assert!(offset_of!(RegionHeader, slot_high_water) == 36);
    assert!(size_of::<RegionHeader>() == 64);

    assert!(offset_of!(DeviceAccount, lock) == 0);
    assert!(offset_of!(DeviceAccount, used) == 8);
    assert!(offset_of!(DeviceAccount, limit) == 16);
    assert!(offset_of!(DeviceAccount, peak) == 24);
    assert!(size_of::<DeviceAccount>() == 64);

    assert!(size_of::<DeviceUtil>() == 32);

    assert!(offset_of!(ProcSlot, status) == 0);
    assert!(offset_of!(ProcSlot, pid) == 4);
    assert!(offset_of!(ProcSlot, hostpid) == 8);
    assert!(offset_of!(ProcSlot, generation) == 12);
    assert!(offset_of!(ProcSlot, start_time) == 16);
    assert!(offset_of!(ProcSlot, used) == 64);
    assert!(offset_of!(ProcSlot, monitor_used) == 576);
    assert!(offset_of!(ProcSlot, util) == 1088);
    assert!(size_of::<ProcSlot>() == 3136);

    assert!(offset_of!(RegionLayout, header) == 0);
    assert!(offset_of!(RegionLayout, devices) == 64);
    assert!(offset_of!(RegionLayout, slots) == 4160);
    assert!(size_of::<RegionLayout>() == 3_215_424);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_reads_as_hipr_in_the_file() {
        assert_eq!(MAGIC.to_le_bytes(), *b"HIPR");
    }

    #[test]
    fn lock_words_name_their_slot_and_differ_by_generation() {
        assert_eq!(lock_holder(lock_word(0, 0)), Some(0));
        assert_eq!(lock_holder(lock_word(1023, 7)), Some(1023));
        assert_ne!(lock_word(5, 1), lock_word(5, 2));
        assert_eq!(lock_holder(0), None);
    }

    #[test]
    fn slot_offsets_are_stable_and_disjoint() {
        assert_eq!(slot_offset(0), 4160);
        assert_eq!(slot_offset(1), 4160 + 3136);
        assert_eq!(slot_offset(MAX_PROCS - 1) + SLOT_SIZE, REGION_SIZE);
    }
}
