//! Per-process state, built on first use and rebuilt in a forked child (which needs its own
//! slot): settings, the region, the allocations, the CUDA→container device map, the limiter.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use hami_cuda_region::{InitValues, MAX_DEVICES, Region};

use crate::config::{HookConfig, resolve};
use crate::cuda_abi::*;
use crate::symbols::{Sym, real_fn};
use hami_kernel_locks::fork_mark::{ForkMark, Mark, own_pid};

/// What a tracked allocation is keyed by: pointers, VMM handles and arrays live in
/// different name spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Pointer,
    Handle,
    Array,
}

/// Hash of allocation keys (device addresses, handles): the default SipHash costs more than
/// the rest of a free; keys are not attacker-chosen (the driver hands them out). Mixed with
/// murmur3's finaliser, as page-aligned addresses differ only in their high bits.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(29) ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
    fn write_isize(&mut self, value: isize) {
        self.write_u64(value as u64);
    }
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

type Allocations = HashMap<(Kind, u64), (usize, u64), std::hash::BuildHasherDefault<KeyHasher>>;

pub struct DeviceLimiter {
    pub tokens: AtomicI64,
    /// 0 = unlimited, else tokens per tick.
    pub refill: AtomicU64,
    pub consumed: AtomicU64,
}

pub struct State {
    pub config: HookConfig,
    pub region: Option<Region>,
    pub allocations: Mutex<Allocations>,
    /// CUDA ordinal → container (NVML) index; identity until mapped.
    pub device_map: [AtomicUsize; MAX_DEVICES],
    pub mapped: AtomicBool,
    pub limiters: [DeviceLimiter; MAX_DEVICES],
    /// Average blocks of a kernel launch (cost of graph launches), ×16 fixed point.
    pub average_blocks_x16: AtomicU64,
    pub sampler_started: AtomicBool,
    pub last_kernel_second: AtomicU64,
}

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static CURRENT_PID: AtomicI32 = AtomicI32::new(0);
static BUILD: Mutex<()> = Mutex::new(());

/// Set once CURRENT holds this process's state; wiped in a forked child, so the hot path
/// needs no `getpid` system call.
static FORK_MARK: ForkMark = ForkMark::new();

/// The state of this process (built on first call; a forked child builds its own).
pub fn state() -> &'static State {
    // The mark is set only after CURRENT holds this process's leaked state.
    if FORK_MARK.read() == Mark::Set {
        // SAFETY: CURRENT holds a leaked &'static State built for this process.
        return unsafe { &*(CURRENT.load(Acquire) as *const State) };
    }
    // Slow path: no mark yet (first calls, or a kernel without MADV_WIPEONFORK) or a child.
    let pid = own_pid();
    if CURRENT_PID.load(Acquire) == pid {
        // SAFETY: CURRENT is stored before CURRENT_PID and holds this pid's leaked state.
        return unsafe { &*(CURRENT.load(Acquire) as *const State) };
    }
    let _guard = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if CURRENT_PID.load(Acquire) == pid {
        // SAFETY: as above.
        return unsafe { &*(CURRENT.load(Acquire) as *const State) };
    }
    // A parent's state (after fork) is left alone: its slot belongs to the parent.
    let built: &'static State = Box::leak(Box::new(State::build()));
    CURRENT.store(built as *const State as usize, Release);
    CURRENT_PID.store(pid, Release);
    FORK_MARK.set();
    built
}

impl State {
    fn build() -> State {
        use hami_kernel_locks::hook_config_file::{Source, locate};
        use hami_protocol::hook_config::{CONTAINER_PATH, PATH_ENV};
        let get = |k: &str| std::env::var(k).ok();
        let source = locate(std::path::Path::new(CONTAINER_PATH), get(PATH_ENV));
        let config = match &source {
            Source::File { config, .. } => crate::config::from_file(config, &get),
            Source::Absent => resolve(&get),
            Source::Invalid(reason) => crate::config::unusable(reason, resolve(&get).log_level),
        };
        crate::log::set_level(config.log_level);
        for error in &config.limit_errors {
            crate::log::error(format_args!("{error}"));
        }
        let init = InitValues {
            limits: config.limits,
            sm_limits: config.sm_limits,
            priority: config.priority,
        };
        let attached = match &source {
            // Nothing of an unusable config is trusted, its cache path included.
            Source::Invalid(_) => Err(None),
            _ => Region::attach_expecting(
                std::path::Path::new(&config.cache_path),
                &init,
                config.cache_inode,
            )
            .map_err(Some),
        };
        if let Source::File { path, .. } = &source {
            crate::log::debug(format_args!("settings from {path}"));
        }
        let region = match attached {
            Ok(mut region) => {
                for (device, stored, ours) in region.limit_mismatches(&init) {
                    if config.from_config {
                        crate::log::warn(format_args!(
                            "device {device}: the region's limit {stored} differs from the hook config's {ours}; the config's is the most in force"
                        ));
                    } else {
                        crate::log::warn(format_args!(
                            "device {device}: the region keeps the limit {stored} of its creator (this process asked for {ours}); delete {} with no GPU process running to change it",
                            config.cache_path
                        ));
                    }
                }
                // The region is writable by every process of the container: the read-only
                // config's limits are the most it can hold (issue 26 item 3).
                if config.from_config {
                    region.cap_limits(&init);
                }
                Some(region)
            }
            Err(Some(err)) => {
                crate::log::error(format_args!(
                    "{err}; limited devices refuse allocations (fail closed)"
                ));
                None
            }
            Err(None) => None,
        };
        let hostpid = crate::host_pid::own().unwrap_or(0);
        if let Some(region) = &region {
            region.set_hostpid(hostpid);
        }
        State {
            config,
            region,
            allocations: Mutex::new(Allocations::default()),
            device_map: std::array::from_fn(AtomicUsize::new),
            mapped: AtomicBool::new(false),
            limiters: std::array::from_fn(|_| DeviceLimiter {
                tokens: AtomicI64::new(0),
                refill: AtomicU64::new(0),
                consumed: AtomicU64::new(0),
            }),
            average_blocks_x16: AtomicU64::new(16),
            sampler_started: AtomicBool::new(false),
            last_kernel_second: AtomicU64::new(0),
        }
    }

    /// Maps CUDA ordinals to container devices by UUID (once the driver is initialised) and
    /// records the container's devices in the region; starts the sampler.
    pub fn after_init(&'static self) {
        // A load first: this runs on every allocation and launch.
        if self.mapped.load(Acquire) || self.mapped.swap(true, AcqRel) {
            return;
        }
        let nvml = nvml_uuids();
        let cuda = cuda_uuids();
        if let (Some(nvml), Some(cuda)) = (&nvml, &cuda) {
            for (ordinal, uuid) in cuda.iter().enumerate().take(MAX_DEVICES) {
                match nvml.iter().position(|n| n == uuid) {
                    Some(index) => self.device_map[ordinal].store(index, Relaxed),
                    None => crate::log::warn(format_args!(
                        "CUDA device {ordinal} ({uuid}) is not among the NVML devices; it is accounted as device {ordinal}"
                    )),
                }
            }
        }
        if let (Some(region), Some(nvml)) = (&self.region, &nvml) {
            region.set_devices(nvml);
        }
        crate::sampler::start(self);
    }

    /// Container device index of CUDA ordinal `ordinal`.
    pub fn index_of(&self, ordinal: c_int) -> Option<usize> {
        let o = usize::try_from(ordinal).ok().filter(|o| *o < MAX_DEVICES)?;
        Some(self.device_map[o].load(Relaxed))
    }

    /// Container device index of the current context.
    pub fn current_index(&'static self) -> Result<usize, CuResult> {
        self.after_init();
        let get = real_fn!(
            Sym::CuCtxGetDevice,
            unsafe extern "C" fn(*mut c_int) -> CuResult
        )
        .ok_or(CUDA_ERROR_NOT_FOUND)?;
        let mut ordinal: c_int = -1;
        // SAFETY: the real cuCtxGetDevice with a valid out pointer.
        let rc = unsafe { get(&mut ordinal) };
        if rc != CUDA_SUCCESS {
            return Err(rc);
        }
        self.index_of(ordinal).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Limit of container device `index` (0 = none), and whether it must refuse everything.
    pub fn limit(&self, index: usize) -> u64 {
        match &self.region {
            Some(region) => region.limit(index),
            None => self.config.limits.get(index).copied().unwrap_or(0),
        }
    }

    /// Whether device `index` refuses every allocation (bad limit, unusable region).
    pub fn refuses_all(&self, index: usize) -> bool {
        self.fail_closed(index)
    }

    fn fail_closed(&self, index: usize) -> bool {
        self.config.fail_closed.get(index).copied().unwrap_or(true)
            || (self.region.is_none() && self.limit(index) != 0)
    }

    pub fn usage(&self, index: usize) -> u64 {
        self.region.as_ref().map_or(0, |r| r.device_usage(index))
    }

    /// Reserves `bytes` on container device `index` before the real allocation.
    pub fn reserve(&self, index: usize, bytes: u64) -> Result<(), CuResult> {
        if self.fail_closed(index) {
            crate::log::info(format_args!(
                "device {index}: allocation of {bytes} bytes refused (fail closed: see the error above)"
            ));
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        match &self.region {
            None => Ok(()),
            Some(region) => region.reserve(index, bytes).map_err(|refusal| {
                crate::log::info(format_args!("allocation refused: {refusal}"));
                CUDA_ERROR_OUT_OF_MEMORY
            }),
        }
    }

    pub fn release(&self, index: usize, bytes: u64) {
        if let Some(region) = &self.region {
            region.release(index, bytes);
        }
    }

    /// Remembers a new allocation. The driver handing out a key we still hold means the old
    /// allocation was freed by a path we do not wrap: its bytes go back instead of being lost
    /// under the new record.
    ///
    /// A panic while the records are held (a bug) poisons their lock; the next caller takes
    /// them as they are (every change to them is a single insert or remove).
    pub fn track(&self, kind: Kind, key: u64, index: usize, bytes: u64) {
        let mut allocations = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        // Test builds only: `allocations` in VGPU_TEST_PANIC_IN panics here, lock held.
        crate::ffi_guard::fault_point("allocations");
        let replaced = allocations.insert((kind, key), (index, bytes));
        drop(allocations);
        if let Some((old_index, old_bytes)) = replaced {
            crate::log::warn(format_args!(
                "the driver returned {key:#x} again while it was recorded with {old_bytes} bytes on device {old_index}: it was freed by a call this hook does not wrap; its bytes are returned"
            ));
            self.release(old_index, old_bytes);
        }
    }

    /// Forgets `key` before the real free: once the driver frees it, a racing allocation may
    /// get the same key back, and its record must not be the one a late removal takes away.
    pub fn forget(&self, kind: Kind, key: u64) -> Option<(usize, u64)> {
        self.allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(kind, key))
    }

    /// Puts back a record whose real free failed (the driver still holds the memory, so it
    /// cannot have handed the key to anyone else).
    pub fn restore(&self, kind: Kind, key: u64, record: (usize, u64)) {
        self.allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((kind, key), record);
    }
}

fn cuda_uuids() -> Option<Vec<String>> {
    let count_fn = real_fn!(
        Sym::CuDeviceGetCount,
        unsafe extern "C" fn(*mut c_int) -> CuResult
    )?;
    let uuid_fn = real_fn!(
        Sym::CuDeviceGetUuid,
        unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult
    )?;
    let mut count: c_int = 0;
    // SAFETY: real driver call with a valid out pointer.
    if unsafe { count_fn(&mut count) } != CUDA_SUCCESS {
        return None;
    }
    let mut out = Vec::new();
    for ordinal in 0..count {
        let mut b = [0u8; 16];
        // SAFETY: real driver call with a 16-byte out buffer.
        if unsafe { uuid_fn(&mut b, ordinal) } != CUDA_SUCCESS {
            return None;
        }
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        out.push(format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ));
    }
    Some(out)
}

/// NVML handle of container device `index`.
pub fn nvml_handle(index: usize) -> Option<*mut c_void> {
    let get = real_fn!(
        Sym::NvmlDeviceGetHandleByIndexV2,
        unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int
    )?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: real NVML call with a valid out pointer.
    (unsafe { get(index as c_uint, &mut handle) } == NVML_SUCCESS).then_some(handle)
}

pub fn nvml_init() -> bool {
    if !crate::symbols::nvml_available() {
        return false;
    }
    real_fn!(Sym::NvmlInitV2, unsafe extern "C" fn() -> c_int)
        // SAFETY: real nvmlInit_v2, no arguments; it is reference counted.
        .is_some_and(|init| unsafe { init() } == NVML_SUCCESS)
}

fn nvml_uuids() -> Option<Vec<String>> {
    if !nvml_init() {
        crate::log::warn(format_args!(
            "libnvidia-ml.so.1 is not usable: no device UUIDs, no utilization sampling, no compute limit"
        ));
        return None;
    }
    let count_fn = real_fn!(
        Sym::NvmlDeviceGetCountV2,
        unsafe extern "C" fn(*mut c_uint) -> c_int
    )?;
    let uuid_fn = real_fn!(
        Sym::NvmlDeviceGetUuid,
        unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int
    )?;
    let mut count: c_uint = 0;
    // SAFETY: real NVML call with a valid out pointer.
    if unsafe { count_fn(&mut count) } != NVML_SUCCESS {
        return None;
    }
    let mut out = Vec::new();
    for index in 0..(count as usize).min(MAX_DEVICES) {
        let handle = nvml_handle(index)?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: real NVML call with a 96-byte buffer.
        if unsafe { uuid_fn(handle, buf.as_mut_ptr(), 96) } != NVML_SUCCESS {
            return None;
        }
        // SAFETY: NVML NUL-terminates within the buffer on success.
        out.push(
            unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    Some(out)
}
