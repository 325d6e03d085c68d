//! The queries that report the limit instead of the physical memory: free/total memory,
//! device properties, attributes.

use std::ffi::{c_int, c_void};

use hami_region::accounting::{free_under_limit, total_under_limit};
use hami_region::layout::LIMIT_NONE;

use super::{current_device, real_fn};
use crate::ffi_guard::guarded;
use crate::hip_abi::*;

use crate::state::state;
use crate::symbols::Sym;

/// `hipMemGetInfo` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMemGetInfo`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMemGetInfo<const R: usize>(
    free: *mut usize,
    total: *mut usize,
) -> HipError {
    guarded("hipMemGetInfo", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<MemGetInfoFn>(R, Sym::HipMemGetInfo) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(free, total) };
        if code != HIP_SUCCESS || free.is_null() || total.is_null() {
            return code;
        }
        guarded("hipMemGetInfo", code, || {
            let state = state();
            let Ok(device) = current_device(R) else {
                return code;
            };
            let limit = state.limit(device);
            if limit == LIMIT_NONE {
                return code;
            }
            let used = match &state.session {
                Some(session) => {
                    state.reclaim_now_and_then();
                    session
                        .device_usage(device)
                        .map_or(limit, |usage| usage.used)
                }
                None => limit, // nothing can be allocated: report no free memory
            };
            // SAFETY: both non-null, written by the real call.
            unsafe {
                *free = free_under_limit(limit, used, *free as u64) as usize;
                *total = total_under_limit(limit, *total as u64) as usize;
            }
            code
        })
    })
}

/// Lowers `totalGlobalMem` (a `size_t` at `offset`) of a device-properties struct to the limit.
///
/// # Safety
/// `props` is NULL or points at the caller's writable `hipDeviceProp_t` of the layout whose
/// `totalGlobalMem` is at `offset`.
unsafe fn patch_total(props: *mut c_void, device: c_int, offset: usize) {
    let Ok(device) = usize::try_from(device) else {
        return;
    };
    if props.is_null() {
        return;
    }
    let limit = state().limit(device);
    if limit == LIMIT_NONE {
        return;
    }
    // SAFETY: non-null and of the layout `offset` is for, by this function's contract.
    unsafe {
        let field = props.cast::<u8>().add(offset).cast::<usize>();
        let physical = field.read_unaligned() as u64;
        field.write_unaligned(total_under_limit(limit, physical) as usize);
    }
}

/// `hipGetDevicePropertiesR0600` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipGetDevicePropertiesR0600`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipGetDevicePropertiesR0600<const R: usize>(
    props: *mut c_void,
    device: c_int,
) -> HipError {
    guarded("hipGetDevicePropertiesR0600", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<PropsFn>(R, Sym::HipGetDevicePropertiesR0600) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(props, device) };
        if code == HIP_SUCCESS {
            guarded("hipGetDevicePropertiesR0600", (), || {
                // SAFETY: props is the caller's struct of the layout this symbol serves (the
                // wrapper's contract), just filled by the real call.
                unsafe { patch_total(props, device, R0600_TOTAL_GLOBAL_MEM) }
            });
        }
        code
    })
}

/// `hipGetDeviceProperties` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipGetDeviceProperties`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipGetDeviceProperties<const R: usize>(
    props: *mut c_void,
    device: c_int,
) -> HipError {
    guarded("hipGetDeviceProperties", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<PropsFn>(R, Sym::HipGetDeviceProperties) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(props, device) };
        if code == HIP_SUCCESS {
            guarded("hipGetDeviceProperties", (), || {
                // SAFETY: props is the caller's struct of the layout this symbol serves (the
                // wrapper's contract), just filled by the real call.
                unsafe { patch_total(props, device, R0000_TOTAL_GLOBAL_MEM) }
            });
        }
        code
    })
}

/// `hipDeviceGetAttribute` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipDeviceGetAttribute`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipDeviceGetAttribute<const R: usize>(
    value: *mut c_int,
    attribute: c_int,
    device: c_int,
) -> HipError {
    guarded("hipDeviceGetAttribute", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<AttributeFn>(R, Sym::HipDeviceGetAttribute) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(value, attribute, device) };
        if code == HIP_SUCCESS && attribute == ATTR_TOTAL_GLOBAL_MEM && !value.is_null() {
            guarded("hipDeviceGetAttribute", (), || {
                let Ok(device) = usize::try_from(device) else {
                    return;
                };
                let limit = state().limit(device);
                // SAFETY: non-null, written by the real call.
                unsafe {
                    let physical = u64::try_from(*value).unwrap_or(0);
                    *value = total_under_limit(limit, physical).min(c_int::MAX as u64) as c_int;
                }
            });
        }
        code
    })
}

/// `hipDeviceTotalMem` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipDeviceTotalMem`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipDeviceTotalMem<const R: usize>(
    bytes: *mut usize,
    device: c_int,
) -> HipError {
    guarded("hipDeviceTotalMem", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<TotalMemFn>(R, Sym::HipDeviceTotalMem) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(bytes, device) };
        if code == HIP_SUCCESS && !bytes.is_null() {
            guarded("hipDeviceTotalMem", (), || {
                let Ok(device) = usize::try_from(device) else {
                    return;
                };
                let limit = state().limit(device);
                // SAFETY: non-null, written by the real call.
                unsafe { *bytes = total_under_limit(limit, *bytes as u64) as usize };
            });
        }
        code
    })
}
