//! The memory queries answered as the container sees them: CUDA's `cuMemGetInfo_v2` and
//! `cuDeviceTotalMem_v2`, NVML's `nvmlDeviceGetMemoryInfo[_v2]`.

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda_abi::*;
use crate::ffi_guard::guarded;

use crate::state::state;
use crate::symbols::{Sym, real_fn};

/// (total, free) as the container sees them: total = min(limit, physical), free =
/// min(limit − container usage, physical free), never negative. A device that refuses every
/// allocation (fail closed) shows no free memory: an application that sized its pool from
/// the free figure would only be refused.
pub fn virtual_memory(limit: u64, usage: u64, total: u64, free: u64, refusing: bool) -> (u64, u64) {
    let total = if limit == 0 { total } else { limit.min(total) };
    if refusing {
        return (total, 0);
    }
    if limit == 0 {
        return (total, free);
    }
    (total, total.saturating_sub(usage).min(free))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    guarded("cuMemGetInfo_v2", CUDA_ERROR_UNKNOWN, || {
        type F = unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult;
        let Some(real) = real_fn!(Sym::CuMemGetInfoV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        if free.is_null() || total.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the real function with checked pointers.
        let rc = unsafe { real(free, total) };
        if rc != CUDA_SUCCESS {
            return rc;
        }
        guarded("cuMemGetInfo_v2", (), || {
            let st = state();
            if let Ok(index) = st.current_index() {
                // SAFETY: written by the successful call.
                let (t, f) = unsafe { (*total as u64, *free as u64) };
                let (t, f) = virtual_memory(
                    st.limit(index),
                    st.usage(index),
                    t,
                    f,
                    st.refuses_all(index),
                );
                // SAFETY: checked non-null.
                unsafe {
                    *total = t as usize;
                    *free = f as usize;
                }
            }
        });
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) -> CuResult {
    guarded("cuDeviceTotalMem_v2", CUDA_ERROR_UNKNOWN, || {
        type F = unsafe extern "C" fn(*mut usize, c_int) -> CuResult;
        let Some(real) = real_fn!(Sym::CuDeviceTotalMemV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(bytes, device) };
        if rc == CUDA_SUCCESS && !bytes.is_null() {
            guarded("cuDeviceTotalMem_v2", (), || {
                let st = state();
                st.after_init();
                if let Some(index) = st.index_of(device) {
                    let limit = st.limit(index);
                    if limit != 0 {
                        // SAFETY: written by the successful call.
                        unsafe { *bytes = (*bytes as u64).min(limit) as usize };
                    }
                }
            });
        }
        rc
    })
}

/// The NVML index of `device`.
///
/// # Safety
/// `device` is an `nvmlDevice_t` as NVML accepts it (the caller's handle, passed on).
unsafe fn nvml_index(device: *mut c_void) -> Option<usize> {
    let get = real_fn!(
        Sym::NvmlDeviceGetIndex,
        unsafe extern "C" fn(*mut c_void, *mut c_uint) -> c_int
    )?;
    let mut index: c_uint = 0;
    // SAFETY: the real NVML call with a valid out pointer.
    (unsafe { get(device, &mut index) } == NVML_SUCCESS).then_some(index as usize)
}

/// Applies the container's view to NVML (total, free, used). An internal error leaves
/// NVML's figures as they are (logged).
///
/// # Safety
/// As [`nvml_index`].
unsafe fn nvml_view(device: *mut c_void, total: &mut u64, free: &mut u64, used: &mut u64) {
    guarded("nvmlDeviceGetMemoryInfo", (), || {
        let st = state();
        // SAFETY: the caller's handle, by this function's contract.
        let Some(index) = (unsafe { nvml_index(device) }) else {
            return;
        };
        let limit = st.limit(index);
        let refusing = st.refuses_all(index);
        if limit == 0 && !refusing {
            return;
        }
        let usage = st.usage(index);
        let (t, f) = virtual_memory(limit, usage, *total, *free, refusing);
        *total = t;
        *free = f;
        *used = if refusing { t } else { usage.min(t) };
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    memory: *mut NvmlMemory,
) -> c_int {
    guarded("nvmlDeviceGetMemoryInfo", NVML_ERROR_UNKNOWN, || {
        type F = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_int;
        let Some(real) = real_fn!(Sym::NvmlDeviceGetMemoryInfo, F) else {
            return NVML_ERROR_LIBRARY_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(device, memory) };
        if rc == NVML_SUCCESS && !memory.is_null() {
            // SAFETY: written by the successful call; `device` is the handle NVML just
            // accepted.
            unsafe {
                let m = &mut *memory;
                nvml_view(device, &mut m.total, &mut m.free, &mut m.used);
            }
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    memory: *mut NvmlMemoryV2,
) -> c_int {
    guarded("nvmlDeviceGetMemoryInfo_v2", NVML_ERROR_UNKNOWN, || {
        type F = unsafe extern "C" fn(*mut c_void, *mut NvmlMemoryV2) -> c_int;
        let Some(real) = real_fn!(Sym::NvmlDeviceGetMemoryInfoV2, F) else {
            return NVML_ERROR_LIBRARY_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(device, memory) };
        if rc == NVML_SUCCESS && !memory.is_null() {
            // SAFETY: written by the successful call; `device` is the handle NVML just
            // accepted.
            unsafe {
                let m = &mut *memory;
                nvml_view(device, &mut m.total, &mut m.free, &mut m.used);
            }
        }
        rc
    })
}

#[cfg(test)]
mod tests {
    use super::virtual_memory;

    #[test]
    fn the_container_view_never_underflows_or_exceeds_the_device() {
        assert_eq!(virtual_memory(0, 5, 100, 40, false), (100, 40));
        assert_eq!(virtual_memory(50, 20, 100, 90, false), (50, 30));
        assert_eq!(virtual_memory(50, 20, 100, 10, false), (50, 10));
        assert_eq!(virtual_memory(50, 80, 100, 90, false), (50, 0));
        assert_eq!(virtual_memory(500, 0, 100, 90, false), (100, 90));
    }

    #[test]
    fn a_refusing_device_shows_no_free_memory() {
        assert_eq!(virtual_memory(0, 0, 100, 90, true), (100, 0));
        assert_eq!(virtual_memory(50, 0, 100, 90, true), (50, 0));
    }
}
