//! NVML events (`nvml.h`): event sets, device registration and waiting, with XIDs a test
//! injects. `FAKE_NVML_XID_FILE` names a text file; each line `<device index> <xid>` is one
//! `nvmlEventTypeXidCriticalError` on that device (`eventData` = the XID, the instance ids
//! 0xFFFFFFFF: not MIG). Every event set sees every line once, in order, also lines written
//! before it was created (a real driver delivers only later ones: a test need not race the
//! plugin's start). Malformed lines are skipped with a message on stderr.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::device_index;

const SUCCESS: c_int = 0;
const INVALID_ARGUMENT: c_int = 2;
const TIMEOUT: c_int = 10;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID_CRITICAL: u64 = 0x8;

/// `nvmlEventData_t` of NVML 11/12: 32 bytes.
#[repr(C)]
pub struct EventData {
    pub device: *const u8,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = assert!(size_of::<EventData>() == 32);

/// One `nvmlEventSet_t`: the devices registered with their masks, and how far into the
/// XID file it has read.
#[derive(Default)]
struct EventSet {
    inner: Mutex<SetState>,
}

#[derive(Default)]
struct SetState {
    registered: Vec<(usize, u64)>,
    read: usize,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut u8) -> c_int {
    if let Err(code) = crate::api::initialized() {
        return code;
    }
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    let boxed = Box::into_raw(Box::<EventSet>::default());
    // SAFETY: checked non-null; the caller owns the handle until nvmlEventSetFree.
    unsafe { set.write(boxed.cast()) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut u8) -> c_int {
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a handle from nvmlEventSetCreate, freed once (the NVML contract).
    drop(unsafe { Box::from_raw(set.cast::<EventSet>()) });
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: *const u8,
    types: *mut u64,
) -> c_int {
    if let Err(code) = device_index(device) {
        return code;
    }
    if types.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { types.write(EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: *const u8,
    types: u64,
    set: *mut u8,
) -> c_int {
    let d = match device_index(device) {
        Ok(d) => d,
        Err(code) => return code,
    };
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a live handle from nvmlEventSetCreate.
    let set = unsafe { &*set.cast::<EventSet>() };
    let mut state = set.inner.lock().unwrap_or_else(|p| p.into_inner());
    state.registered.retain(|(r, _)| *r != d);
    state.registered.push((d, types));
    SUCCESS
}

/// The next injected XID for a registered device after `state.read`, advancing past it
/// (and past lines for devices not registered).
fn next_event(state: &mut SetState) -> Option<(usize, u64)> {
    let path = std::env::var_os("FAKE_NVML_XID_FILE")?;
    let text = std::fs::read_to_string(path).ok()?;
    // Whole lines only: a line still being written is read next time.
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    while state.read < complete {
        let end = text[state.read..complete]
            .find('\n')
            .map_or(complete, |i| state.read + i);
        let line = text[state.read..end].trim();
        state.read = end + 1;
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let parsed = (
            words.next().and_then(|w| w.parse::<usize>().ok()),
            words.next().and_then(|w| w.parse::<u64>().ok()),
        );
        let (Some(device), Some(xid)) = parsed else {
            eprintln!(
                "[stand-in libnvidia-ml] FAKE_NVML_XID_FILE line {line:?} skipped: write `<device index> <xid>`"
            );
            continue;
        };
        if state
            .registered
            .iter()
            .any(|(d, mask)| *d == device && mask & EVENT_XID_CRITICAL != 0)
        {
            return Some((device, xid));
        }
    }
    None
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut u8,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> c_int {
    if let Err(code) = crate::api::initialized() {
        return code;
    }
    if set.is_null() || data.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a live handle from nvmlEventSetCreate.
    let set = unsafe { &*set.cast::<EventSet>() };
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let found = {
            let mut state = set.inner.lock().unwrap_or_else(|p| p.into_inner());
            next_event(&mut state)
        };
        if let Some((device, xid)) = found {
            // SAFETY: checked non-null; the caller's nvmlEventData_t.
            unsafe {
                data.write(EventData {
                    device: crate::api::handle_of(device),
                    event_type: EVENT_XID_CRITICAL,
                    event_data: xid,
                    gpu_instance_id: 0xFFFF_FFFF,
                    compute_instance_id: 0xFFFF_FFFF,
                })
            };
            return SUCCESS;
        }
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

/// `nvmlEventSetWait` (v1): the 24-byte `nvmlEventData_t` of NVML before 11 (no instance
/// ids), so only its first three fields are written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: *mut u8,
    data: *mut u8,
    timeout_ms: c_uint,
) -> c_int {
    if data.is_null() {
        return INVALID_ARGUMENT;
    }
    let mut full = EventData {
        device: std::ptr::null(),
        event_type: 0,
        event_data: 0,
        gpu_instance_id: 0,
        compute_instance_id: 0,
    };
    // SAFETY: full is a valid v2 struct; the caller's arguments per the NVML contract.
    let rc = unsafe { nvmlEventSetWait_v2(set, &mut full, timeout_ms) };
    if rc == SUCCESS {
        // SAFETY: the caller's struct holds 24 bytes, the first 24 of the v2 layout.
        unsafe { std::ptr::copy_nonoverlapping((&raw const full).cast::<u8>(), data, 24) };
    }
    rc
}
