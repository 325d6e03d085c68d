//! The exported NVML functions (`nvml.h` ABI): devices are handles into a static table;
//! memory comes from the shared stand-in state; process utilization from each process's
//! kernel busy time in the last complete 100 ms window.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint};
use std::sync::OnceLock;
use std::sync::atomic::Ordering::Acquire;

use crate::fake_state::{
    Config, MAX_DEVICES, MAX_OWNERS, Mapped, State, WINDOW_NS, map_state, now_ns, uuid_text,
};

const SUCCESS: c_int = 0;
const UNINITIALIZED: c_int = 1;
const INVALID_ARGUMENT: c_int = 2;
const INSUFFICIENT_SIZE: c_int = 7;
const NOT_FOUND: c_int = 6;
const LIBRARY_NOT_FOUND: c_int = 12;

struct Nvml {
    config: Config,
    state: &'static State,
    mapped: Mapped,
}

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

/// One byte per device: handles are their addresses.
static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

fn nvml() -> Result<&'static Nvml, c_int> {
    match NVML.get() {
        Some(Ok(n)) => Ok(n),
        _ => Err(UNINITIALIZED),
    }
}

/// `Ok` once `nvmlInit` succeeded (the events module's check).
pub(crate) fn initialized() -> Result<(), c_int> {
    nvml().map(|_| ())
}

/// The device index of a handle (the events module's check).
pub(crate) fn device_index(handle: *const u8) -> Result<usize, c_int> {
    device_of(handle).map(|(_, d)| d)
}

/// The handle of device `d`.
pub(crate) fn handle_of(d: usize) -> *const u8 {
    HANDLES[..].as_ptr().wrapping_add(d)
}

fn device_of(handle: *const u8) -> Result<(&'static Nvml, usize), c_int> {
    let n = nvml()?;
    let base = HANDLES.as_ptr() as usize;
    let at = (handle as usize).wrapping_sub(base);
    if handle.is_null() || at >= n.config.device_count {
        return Err(INVALID_ARGUMENT);
    }
    Ok((n, at))
}

macro_rules! try_nv {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> c_int {
    let n = NVML.get_or_init(|| {
        let config = Config::from_env()?;
        let mapped = map_state(&config.state_path)?;
        Ok(Nvml {
            config,
            state: mapped.state,
            mapped,
        })
    });
    match n {
        Ok(_) => SUCCESS,
        Err(message) => {
            eprintln!("[stand-in libnvidia-ml] {message}");
            LIBRARY_NOT_FOUND
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> c_int {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> c_int {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> c_int {
    try_nv!(nvml());
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> c_int {
    let n = try_nv!(nvml());
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { count.write(n.config.device_count as c_uint) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> c_int {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *const u8,
) -> c_int {
    let n = try_nv!(nvml());
    if device.is_null() || index as usize >= n.config.device_count {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { device.write(HANDLES.as_ptr().add(index as usize)) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut *const u8,
) -> c_int {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *const u8, index: *mut c_uint) -> c_int {
    let (_, d) = try_nv!(device_of(device));
    if index.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { index.write(d as c_uint) };
    SUCCESS
}

unsafe fn write_text(text: &str, out: *mut c_char, len: c_uint) -> c_int {
    if out.is_null() || (len as usize) < text.len() + 1 {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `len` ≥ text + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast(), text.len());
        *out.add(text.len()) = 0;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *const u8,
    uuid: *mut c_char,
    len: c_uint,
) -> c_int {
    let (_, d) = try_nv!(device_of(device));
    // SAFETY: caller's buffer of `len` bytes.
    unsafe { write_text(&uuid_text(d), uuid, len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *const u8,
    name: *mut c_char,
    len: c_uint,
) -> c_int {
    let (_, d) = try_nv!(device_of(device));
    // SAFETY: caller's buffer of `len` bytes.
    unsafe { write_text(&format!("Stand-in NVIDIA GPU {d}"), name, len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: *const u8, minor: *mut c_uint) -> c_int {
    let (_, d) = try_nv!(device_of(device));
    if minor.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { minor.write(d as c_uint) };
    SUCCESS
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// Memory in use on device `d`, after the memory of dead processes went back (as a real
/// driver has done by the time NVML is asked).
fn used_now(n: &Nvml, d: usize) -> u64 {
    n.mapped.reclaim_dead(None);
    n.state.devices[d]
        .used
        .load(Acquire)
        .min(n.config.device_memory)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: *const u8, memory: *mut Memory) -> c_int {
    let (n, d) = try_nv!(device_of(device));
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    let total = n.config.device_memory;
    let used = used_now(n, d);
    // SAFETY: checked non-null.
    unsafe {
        memory.write(Memory {
            total,
            free: total - used,
            used,
        })
    };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *const u8,
    memory: *mut MemoryV2,
) -> c_int {
    let (n, d) = try_nv!(device_of(device));
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    let total = n.config.device_memory;
    let used = used_now(n, d);
    // SAFETY: checked non-null; the caller set `version`, which is kept.
    unsafe {
        (*memory).total = total;
        (*memory).reserved = 0;
        (*memory).free = total - used;
        (*memory).used = used;
    }
    SUCCESS
}

/// `nvmlProcessInfo_v1_t` (what the unversioned `nvmlDeviceGetComputeRunningProcesses` fills).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` of NVML 11.x/12.x (`_v2` and `_v3` of the call): 24 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    /// `0xFFFFFFFF` outside MIG mode.
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = {
    assert!(size_of::<ProcessInfoV1>() == 16);
    assert!(size_of::<ProcessInfoV2>() == 24);
};

/// Live processes with a context or memory on device `d`: (host pid, bytes).
fn compute_processes(n: &Nvml, d: usize) -> Vec<(c_uint, u64)> {
    n.mapped.reclaim_dead(None);
    (0..MAX_OWNERS)
        .filter_map(|index| {
            let owner = &n.state.owners[index];
            let pid = owner.pid.load(Acquire);
            let used = owner.used[d].load(Acquire);
            let on_device = owner.contexts.load(Acquire) & (1 << d) != 0 || used > 0;
            (pid > 0 && on_device && n.mapped.owner_alive(index)).then_some((pid as c_uint, used))
        })
        .collect()
}

/// NVML's contract: `*count` in = room, out = processes; too small → INSUFFICIENT_SIZE with
/// the count needed (HAMi-core calls it with room 0 first).
unsafe fn running_processes<T>(
    device: *const u8,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(c_uint, u64) -> T,
) -> c_int {
    let (n, d) = try_nv!(device_of(device));
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    let found = compute_processes(n, d);
    // SAFETY: count checked non-null; `infos` holds `*count` entries per the API.
    unsafe {
        let room = *count as usize;
        *count = found.len() as c_uint;
        if found.len() > room {
            return INSUFFICIENT_SIZE;
        }
        if found.is_empty() {
            return SUCCESS;
        }
        if infos.is_null() {
            return INVALID_ARGUMENT;
        }
        for (at, (pid, used)) in found.into_iter().enumerate() {
            infos.add(at).write(make(pid, used));
        }
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: *const u8,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> c_int {
    // SAFETY: the caller's arguments, per the NVML contract.
    unsafe {
        running_processes(device, count, infos, |pid, used_gpu_memory| ProcessInfoV1 {
            pid,
            used_gpu_memory,
        })
    }
}

fn v2(pid: c_uint, used_gpu_memory: u64) -> ProcessInfoV2 {
    ProcessInfoV2 {
        pid,
        used_gpu_memory,
        gpu_instance_id: 0xFFFF_FFFF,
        compute_instance_id: 0xFFFF_FFFF,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: *const u8,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> c_int {
    // SAFETY: the caller's arguments, per the NVML contract.
    unsafe { running_processes(device, count, infos, v2) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *const u8,
    count: *mut c_uint,
    infos: *mut ProcessInfoV2,
) -> c_int {
    // SAFETY: the caller's arguments, per the NVML contract.
    unsafe { running_processes(device, count, infos, v2) }
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// Samples of the last complete window newer than `last_seen` (µs since boot, monotonic).
fn samples(n: &Nvml, device: usize, last_seen: u64) -> Vec<ProcessUtilizationSample> {
    let window = (now_ns() / WINDOW_NS).saturating_sub(1);
    let stamp_us = (window + 1) * WINDOW_NS / 1000;
    if stamp_us <= last_seen {
        return Vec::new();
    }
    n.state.devices[device]
        .procs
        .iter()
        .filter(|p| n.mapped.pid_alive(p.pid.load(Acquire)))
        .filter_map(|p| {
            let busy = p.busy_in(window);
            (busy > 0).then(|| ProcessUtilizationSample {
                pid: p.pid.load(Acquire) as c_uint,
                time_stamp: stamp_us,
                sm_util: ((busy * 100 + WINDOW_NS / 2) / WINDOW_NS).min(100) as c_uint,
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            })
        })
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: *const u8,
    utilization: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: u64,
) -> c_int {
    let (n, d) = try_nv!(device_of(device));
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    let found = samples(n, d, last_seen);
    // SAFETY: count checked non-null; `utilization` holds `*count` samples per the API.
    unsafe {
        let room = *count as usize;
        *count = found.len() as c_uint;
        if found.is_empty() {
            return NOT_FOUND;
        }
        if utilization.is_null() || room < found.len() {
            return INSUFFICIENT_SIZE;
        }
        std::ptr::copy_nonoverlapping(found.as_ptr(), utilization, found.len());
    }
    SUCCESS
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// Device utilization over the last complete window: the busy time of every live process
/// on the device (they run one after another on the stand-in), clamped to 100 %.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: *const u8,
    utilization: *mut Utilization,
) -> c_int {
    let (n, d) = try_nv!(device_of(device));
    if utilization.is_null() {
        return INVALID_ARGUMENT;
    }
    let window = (now_ns() / WINDOW_NS).saturating_sub(1);
    let busy: u64 = n.state.devices[d]
        .procs
        .iter()
        .filter(|p| n.mapped.pid_alive(p.pid.load(Acquire)))
        .map(|p| p.busy_in(window))
        .sum();
    let gpu = ((busy * 100 + WINDOW_NS / 2) / WINDOW_NS).min(100) as c_uint;
    // SAFETY: checked non-null.
    unsafe { utilization.write(Utilization { gpu, memory: 0 }) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> c_int {
    try_nv!(nvml());
    // SAFETY: caller's buffer of `len` bytes.
    unsafe { write_text("550.54.15-stand-in", version, len) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: c_int) -> *const c_char {
    let s: &'static [u8] = match result {
        SUCCESS => b"Success\0",
        UNINITIALIZED => b"Uninitialized\0",
        INVALID_ARGUMENT => b"Invalid Argument\0",
        NOT_FOUND => b"Not Found\0",
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        10 => b"Timeout\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}
