//! The region's bytes, as HAMi-core 1.2 lays them out (`shared_region_t`, SPEC Appendix A).
//! Little-endian, natural C alignment, `sem_t` = 32 bytes. Every offset below is checked at
//! compile time, so a change that would move a field does not build.
//!
//! Fields other processes write concurrently are atomics; the two semaphores are opaque
//! `sem_t` cells that only `sem_init` touches (our writer locks with kernel record locks,
//! see `region.rs`, and initialises the semaphores so HAMi-core tools find them valid).

use std::cell::UnsafeCell;
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU32, AtomicU64};

/// `initialized_flag` of an initialised region (`MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`).
pub const MAGIC: i32 = 19_920_718;
/// Layout major version (HAMi-core's `MAJOR_VERSION`): a reader refuses another.
pub const MAJOR_VERSION: u32 = 1;
/// Layout minor version written (readers also take 1.1 and 1.0).
pub const MINOR_VERSION: u32 = 2;
/// Device slots (`CUDA_DEVICE_MAX_COUNT`).
pub const MAX_DEVICES: usize = 16;
/// Process slots (`SHARED_REGION_MAX_PROCESS_NUM`).
pub const MAX_PROCS: usize = 1024;
/// Bytes of each NVML UUID buffer.
pub const UUID_LEN: usize = 96;
/// `sizeof(shared_region_t)`; the file is one byte longer (HAMi-core writes a NUL there).
pub const REGION_SIZE: usize = 2_008_952;
/// Length of the region file.
pub const FILE_SIZE: usize = REGION_SIZE + 1;

/// Slot `status` values.
pub const STATUS_FREE: i32 = 0;
/// `status` of a slot whose process runs.
pub const STATUS_RUNNING: i32 = 1;

/// `device_memory_t` (64 B): per-process usage of one device.
#[repr(C)]
pub struct DeviceMemory {
    /// HAMi-core's context bytes; this writer keeps 0 (allocations go to `data_size`).
    pub context_size: AtomicU64,
    /// Bytes of loaded modules.
    pub module_size: AtomicU64,
    /// Bytes of allocations.
    pub data_size: AtomicU64,
    /// HAMi-core's `offset` figure.
    pub offset: AtomicU64,
    /// Sum of the above; what limits are checked against.
    pub total: AtomicU64,
    /// Zero; padding of the reference layout.
    pub unused: [AtomicU64; 3],
}

/// `device_util_t` (48 B).
#[repr(C)]
pub struct DeviceUtil {
    /// Decoder utilization, percent.
    pub dec_util: AtomicU64,
    /// Encoder utilization, percent.
    pub enc_util: AtomicU64,
    /// Compute utilization, percent (the sampler's, per slot).
    pub sm_util: AtomicU64,
    /// Zero; padding of the reference layout.
    pub unused: [AtomicU64; 3],
}

/// `shrreg_proc_slot_t` (1,960 B).
#[repr(C)]
pub struct ProcSlot {
    /// Container-namespace pid (0 = free).
    pub pid: AtomicI32,
    /// Host pid (0 = unknown).
    pub hostpid: AtomicI32,
    /// Indexed by container device index (NVML order inside the container).
    pub used: [DeviceMemory; MAX_DEVICES],
    /// Bytes a monitor measured for this process per device.
    pub monitorused: [AtomicU64; MAX_DEVICES],
    /// Utilization per device.
    pub device_util: [DeviceUtil; MAX_DEVICES],
    /// [`STATUS_FREE`] or [`STATUS_RUNNING`].
    pub status: AtomicI32,
    _pad: u32,
    /// Even = stable. Bumped before and after each update of `used`, as HAMi-core does, so its
    /// readers see consistent values.
    pub seqlock: AtomicU64,
    /// `unused[0]` of the reference: we store the owner's start time (clock ticks since boot,
    /// `/proc/self/stat` field 22) here for diagnostics; readers ignore it.
    pub start_time: AtomicU64,
    /// `unused[1]` of the reference: bumped at every claim of the slot, so a lock word left by
    /// a dead former owner never names the slot's next owner (see [`lock_word`]).
    pub generation: AtomicU64,
}

/// `shared_region_t` (2,008,952 B).
#[repr(C)]
pub struct SharedRegion {
    /// [`MAGIC`] once initialised.
    pub initialized_flag: AtomicI32,
    /// [`MAJOR_VERSION`].
    pub major_version: AtomicU32,
    /// Minor version of the layout written.
    pub minor_version: AtomicU32,
    /// HAMi-core's SM-limit initialisation flag (written 0).
    pub sm_init_flag: AtomicI32,
    /// HAMi-core: the pid of the process holding the region lock, 0 when none (it takes the
    /// lock over when that process is dead). Ours: the same role as a lock word — 0 free,
    /// else [`lock_word`] of the holder's slot — taken with one CAS, so a reservation makes no
    /// system call.
    pub owner_pid: AtomicU64,
    /// HAMi-core's region semaphore; only initialised here (we lock with `owner_pid`).
    pub sem: UnsafeCell<libc::sem_t>,
    /// Number of devices whose UUIDs are recorded.
    pub device_num: AtomicU64,
    /// NVML UUID of each device, NUL-padded.
    pub uuids: [[AtomicU8; UUID_LEN]; MAX_DEVICES],
    /// Memory limit in bytes per device, 0 = none.
    pub limit: [AtomicU64; MAX_DEVICES],
    /// SM limit in percent per device.
    pub sm_limit: [AtomicU64; MAX_DEVICES],
    /// Process slots.
    pub procs: [ProcSlot; MAX_PROCS],
    /// One past the highest slot ever claimed: readers scan `procs[..proc_num]`.
    pub proc_num: AtomicI32,
    /// Nonzero: the utilization sampler and limiter run (HAMi-core's switch).
    pub utilization_switch: AtomicI32,
    /// HAMi-core's recent-kernel counter for the priority scheduler.
    pub recent_kernel: AtomicI32,
    /// HAMi-core's task priority.
    pub priority: AtomicI32,
    /// Time of the last kernel launch (HAMi-core's field).
    pub last_kernel_time: AtomicU64,
    /// HAMi-core's post-init semaphore; only initialised here.
    pub sem_postinit: UnsafeCell<libc::sem_t>,
}

// SAFETY: every field is an atomic except the two `sem_t` cells, which are touched only by
// `sem_init` while the region is being created under the init lock (process-shared
// semaphores are designed to be used from any thread of any process).
unsafe impl Sync for SharedRegion {}

// Appendix A, pinned.
const _: () = {
    assert!(size_of::<libc::sem_t>() == 32);
    assert!(size_of::<DeviceMemory>() == 64);
    assert!(size_of::<DeviceUtil>() == 48);
    assert!(size_of::<ProcSlot>() == 1960);
    assert!(offset_of!(ProcSlot, pid) == 0);
    assert!(offset_of!(ProcSlot, hostpid) == 4);
    assert!(offset_of!(ProcSlot, used) == 8);
    assert!(offset_of!(ProcSlot, monitorused) == 1032);
    assert!(offset_of!(ProcSlot, device_util) == 1160);
    assert!(offset_of!(ProcSlot, status) == 1928);
    assert!(offset_of!(ProcSlot, seqlock) == 1936);
    assert!(offset_of!(ProcSlot, start_time) == 1944);
    assert!(offset_of!(ProcSlot, generation) == 1952);
    assert!(offset_of!(DeviceMemory, total) == 32);
    assert!(offset_of!(DeviceUtil, sm_util) == 16);
    assert!(offset_of!(SharedRegion, initialized_flag) == 0);
    assert!(offset_of!(SharedRegion, major_version) == 4);
    assert!(offset_of!(SharedRegion, minor_version) == 8);
    assert!(offset_of!(SharedRegion, sm_init_flag) == 12);
    assert!(offset_of!(SharedRegion, owner_pid) == 16);
    assert!(offset_of!(SharedRegion, sem) == 24);
    assert!(offset_of!(SharedRegion, device_num) == 56);
    assert!(offset_of!(SharedRegion, uuids) == 64);
    assert!(offset_of!(SharedRegion, limit) == 1600);
    assert!(offset_of!(SharedRegion, sm_limit) == 1728);
    assert!(offset_of!(SharedRegion, procs) == 1856);
    assert!(offset_of!(SharedRegion, proc_num) == 2_008_896);
    assert!(offset_of!(SharedRegion, utilization_switch) == 2_008_900);
    assert!(offset_of!(SharedRegion, recent_kernel) == 2_008_904);
    assert!(offset_of!(SharedRegion, priority) == 2_008_908);
    assert!(offset_of!(SharedRegion, last_kernel_time) == 2_008_912);
    assert!(offset_of!(SharedRegion, sem_postinit) == 2_008_920);
    assert!(size_of::<SharedRegion>() == REGION_SIZE);
};

/// The region lock word (`owner_pid`) of the owner of slot `index` at `generation`; never 0.
pub const fn lock_word(index: usize, generation: u64) -> u64 {
    ((generation & 0xffff_ffff) << 32) | (index as u64 + 1)
}

/// The slot and generation a non-zero lock word names (any word does: a foreign or stale
/// one names a slot whose generation or liveness will not match).
pub const fn lock_holder(word: u64) -> Option<(usize, u64)> {
    let low = (word & 0xffff_ffff) as usize;
    if low == 0 {
        None
    } else {
        Some((low - 1, word >> 32))
    }
}

/// Byte offsets for readers that work on raw bytes (the monitor).
pub mod offsets {
    use super::*;
    /// Byte offset of `shared_region_t.device_num`.
    pub const DEVICE_NUM: usize = offset_of!(SharedRegion, device_num);
    /// Byte offset of `shared_region_t.uuids`.
    pub const UUIDS: usize = offset_of!(SharedRegion, uuids);
    /// Byte offset of `shared_region_t.limit`.
    pub const LIMIT: usize = offset_of!(SharedRegion, limit);
    /// Byte offset of `shared_region_t.sm_limit`.
    pub const SM_LIMIT: usize = offset_of!(SharedRegion, sm_limit);
    /// Byte offset of `shared_region_t.procs`.
    pub const PROCS: usize = offset_of!(SharedRegion, procs);
    /// Byte offset of `shared_region_t.proc_num`.
    pub const PROC_NUM: usize = offset_of!(SharedRegion, proc_num);
    /// Byte offset of `shared_region_t.owner_pid`.
    pub const OWNER_PID: usize = offset_of!(SharedRegion, owner_pid);
    /// Byte offset of `shared_region_t.utilization_switch`.
    pub const UTILIZATION_SWITCH: usize = offset_of!(SharedRegion, utilization_switch);
    /// Byte offset of `shared_region_t.recent_kernel`.
    pub const RECENT_KERNEL: usize = offset_of!(SharedRegion, recent_kernel);
    /// Byte offset of `shared_region_t.priority`.
    pub const PRIORITY: usize = offset_of!(SharedRegion, priority);
    /// Byte offset of `shared_region_t.last_kernel_time`.
    pub const LAST_KERNEL_TIME: usize = offset_of!(SharedRegion, last_kernel_time);
    /// Bytes of one `ProcSlot` (the stride of its array).
    pub const SLOT_SIZE: usize = size_of::<ProcSlot>();
    /// Byte offset of `shrreg_proc_slot_t.pid`.
    pub const SLOT_PID: usize = offset_of!(ProcSlot, pid);
    /// Byte offset of `shrreg_proc_slot_t.hostpid`.
    pub const SLOT_HOSTPID: usize = offset_of!(ProcSlot, hostpid);
    /// Byte offset of `shrreg_proc_slot_t.used`.
    pub const SLOT_USED: usize = offset_of!(ProcSlot, used);
    /// Bytes of one `DeviceMemory` (the stride of its array).
    pub const USED_STRIDE: usize = size_of::<DeviceMemory>();
    /// Byte offset of `shrreg_proc_slot_t.monitorused`.
    pub const SLOT_MONITORUSED: usize = offset_of!(ProcSlot, monitorused);
    /// Byte offset of `shrreg_proc_slot_t.device_util`.
    pub const SLOT_UTIL: usize = offset_of!(ProcSlot, device_util);
    /// Bytes of one `DeviceUtil` (the stride of its array).
    pub const UTIL_STRIDE: usize = size_of::<DeviceUtil>();
    /// Byte offset of `shrreg_proc_slot_t.status`.
    pub const SLOT_STATUS: usize = offset_of!(ProcSlot, status);
    /// Byte offset of the slot's claim generation (ours; HAMi-core's reserved bytes).
    pub const SLOT_GENERATION: usize = offset_of!(ProcSlot, generation);
}

impl SharedRegion {
    /// A zeroed region on the heap (tests and tools; the hook maps a file instead).
    pub fn boxed_zeroed() -> Box<SharedRegion> {
        let layout = std::alloc::Layout::new::<SharedRegion>();
        // SAFETY: every field of SharedRegion (atomics, integers, sem_t bytes) is valid when
        // all-zero; the pointer comes from the global allocator with SharedRegion's layout,
        // which is what Box::from_raw requires. A null pointer is handled.
        unsafe {
            let ptr = std::alloc::alloc_zeroed(layout).cast::<SharedRegion>();
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(ptr)
        }
    }

    /// The UUID stored for `device` (up to the first NUL).
    pub fn uuid(&self, device: usize) -> String {
        let bytes: Vec<u8> = self.uuids[device]
            .iter()
            .map(|b| b.load(std::sync::atomic::Ordering::Relaxed))
            .take_while(|b| *b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
