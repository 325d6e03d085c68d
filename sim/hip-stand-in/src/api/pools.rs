//! Virtual memory (`hipMemCreate`/`hipMemRelease`) and memory pools.

use std::ffi::{c_int, c_ulonglong, c_void};

use crate::abi::*;
use crate::allocations::Kind;

use crate::runtime::Runtime;

use super::*;

#[unsafe(no_mangle)]
pub extern "C" fn hipMemCreate(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const c_void,
    _flags: c_ulonglong,
) -> HipError {
    entry(|rt| {
        if prop.is_null() || handle.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // The layout of the version this runtime claims to be, as the real ones read it.
        let id = if rt.config.runtime_version >= 60_000_000 {
            // SAFETY: non-null pointer to the caller's ROCm 6 properties.
            unsafe { (*prop.cast::<HipMemAllocationProp>()).location.id }
        } else {
            // SAFETY: non-null pointer to the caller's ROCm 5 properties.
            unsafe { (*prop.cast::<HipMemAllocationPropR5>()).location.id }
        };
        let device = rt.check_device(id)?;
        let address = allocate(rt, device, size as u64, Kind::Physical)?;
        put(handle, address as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemRelease(handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, handle as usize, Kind::Physical))
}

/// A pool handle points at one of these (leaked for the process's life, like the runtime's).
pub struct Pool {
    pub device: usize,
}

pub(super) static DEFAULT_POOLS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();

pub(super) fn pool_device(rt: &Runtime, pool: *mut c_void) -> Result<usize, HipError> {
    if pool.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: pool handles are `Pool`s this library leaked; we only read.
    let device = unsafe { (*pool.cast::<Pool>()).device };
    rt.check_device(device as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) -> HipError {
    entry(|rt| {
        let device = rt.check_device(device)?;
        let pools = DEFAULT_POOLS.get_or_init(|| {
            (0..rt.config.device_count)
                .map(|device| Box::into_raw(Box::new(Pool { device })) as usize)
                .collect()
        });
        put(pool, pools[device] as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolCreate(
    pool: *mut *mut c_void,
    props: *const HipMemPoolProps,
) -> HipError {
    entry(|rt| {
        if props.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null pointer to the caller's properties.
        let device = rt.check_device(unsafe { (*props).location.id })?;
        put(pool, Box::into_raw(Box::new(Pool { device })).cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolDestroy(pool: *mut c_void) -> HipError {
    // The handle stays valid memory (leaked): a late hipMallocFromPoolAsync on it is the
    // caller's bug, not a crash.
    entry(|rt| pool_device(rt, pool).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolTrimTo(pool: *mut c_void, _keep: usize) -> HipError {
    entry(|rt| pool_device(rt, pool).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    _stream: *mut c_void,
) -> HipError {
    entry(|rt| linear(rt, ptr, pool_device(rt, pool)?, size))
}
