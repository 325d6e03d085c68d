//! Linear allocations (`hipMalloc` and its flavours, pitched and 3-D, the driver API's
//! pitched allocation) and their frees.

use std::ffi::{c_uint, c_void};

use super::books::{accounted, call_ok, free_wrapper, linear, out_address, undo_linear};
use super::real_fn;
use crate::ffi_guard::guarded;
use crate::hip_abi::*;
use crate::sizing::pitched_estimate;
use crate::state::state;
use crate::symbols::Sym;
use crate::tracker::Space;

/// `hipMalloc` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMalloc`: each pointer argument is NULL or valid for what that function reads
/// and writes during the call.
pub unsafe extern "C" fn hipMalloc<const R: usize>(ptr: *mut *mut c_void, size: usize) -> HipError {
    guarded("hipMalloc", HIP_ERROR_OUT_OF_MEMORY, || {
        if state().config.oversubscribe {
            let Some(managed) = real_fn::<MallocFlagsFn>(R, Sym::HipMallocManaged) else {
                return HIP_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
            // the closure calls the real function with the caller's arguments.
            return unsafe {
                linear(R, "hipMalloc", None, ptr, size, || {
                    managed(ptr, size, MEM_ATTACH_GLOBAL)
                })
            };
        }
        let Some(real) = real_fn::<MallocFn>(R, Sym::HipMalloc) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe { linear(R, "hipMalloc", None, ptr, size, || real(ptr, size)) }
    })
}

/// `hipExtMallocWithFlags` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipExtMallocWithFlags`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipExtMallocWithFlags<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    guarded("hipExtMallocWithFlags", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocFlagsFn>(R, Sym::HipExtMallocWithFlags) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            linear(R, "hipExtMallocWithFlags", None, ptr, size, || {
                real(ptr, size, flags)
            })
        }
    })
}

/// `hipMallocManaged` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocManaged`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMallocManaged<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    guarded("hipMallocManaged", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocFlagsFn>(R, Sym::HipMallocManaged) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            linear(R, "hipMallocManaged", None, ptr, size, || {
                real(ptr, size, flags)
            })
        }
    })
}

/// `hipMallocAsync` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocAsync`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMallocAsync<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    stream: *mut c_void,
) -> HipError {
    guarded("hipMallocAsync", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocStreamFn>(R, Sym::HipMallocAsync) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            linear(R, "hipMallocAsync", None, ptr, size, || {
                real(ptr, size, stream)
            })
        }
    })
}

/// `hipMallocFromPoolAsync` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocFromPoolAsync`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipMallocFromPoolAsync<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> HipError {
    guarded("hipMallocFromPoolAsync", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocPoolFn>(R, Sym::HipMallocFromPoolAsync) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // A pool we did not see created is taken to be on the current device.
        let device = guarded("hipMallocFromPoolAsync", None, || {
            state().tracker().pool_device(pool as usize)
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            linear(R, "hipMallocFromPoolAsync", device, ptr, size, || {
                real(ptr, size, pool, stream)
            })
        }
    })
}

/// `hipMallocPitch` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocPitch`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMallocPitch<const R: usize>(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    guarded("hipMallocPitch", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocPitchFn>(R, Sym::HipMallocPitch) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        if ptr.is_null() || pitch.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        let Some(estimate) = pitched_estimate(width as u64, height as u64) else {
            return HIP_ERROR_OUT_OF_MEMORY;
        };
        accounted(
            R,
            "hipMallocPitch",
            None,
            estimate,
            Space::Pointer,
            || {
                // SAFETY: the real function with the caller's (non-null) arguments.
                let code = unsafe { real(ptr, pitch, width, height) };
                // SAFETY: pitch is non-null and was just written on success.
                let bytes = (unsafe { *pitch } as u64).saturating_mul(height.max(1) as u64);
                // SAFETY: ptr is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(ptr) }, bytes)
            },
            undo_linear::<R>,
        )
    })
}

/// `hipMalloc3D` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMalloc3D`: each pointer argument is NULL or valid for what that function reads
/// and writes during the call.
pub unsafe extern "C" fn hipMalloc3D<const R: usize>(
    pitched: *mut HipPitchedPtr,
    extent: HipExtent,
) -> HipError {
    guarded("hipMalloc3D", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<Malloc3DFn>(R, Sym::HipMalloc3D) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        if pitched.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        let rows = (extent.height.max(1) as u64).saturating_mul(extent.depth.max(1) as u64);
        let Some(estimate) = pitched_estimate(extent.width as u64, rows) else {
            return HIP_ERROR_OUT_OF_MEMORY;
        };
        accounted(
            R,
            "hipMalloc3D",
            None,
            estimate,
            Space::Pointer,
            || {
                // SAFETY: the real function with the caller's (non-null) arguments.
                let code = unsafe { real(pitched, extent) };
                // SAFETY: non-null; written by the real call on success.
                let (address, pitch) =
                    unsafe { ((*pitched).ptr as usize, (*pitched).pitch as u64) };
                call_ok(code, address, pitch.saturating_mul(rows))
            },
            undo_linear::<R>,
        )
    })
}

/// `hipMemAllocPitch` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMemAllocPitch`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMemAllocPitch<const R: usize>(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> HipError {
    guarded("hipMemAllocPitch", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MemAllocPitchFn>(R, Sym::HipMemAllocPitch) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        if ptr.is_null() || pitch.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        let Some(estimate) = pitched_estimate(width as u64, height as u64) else {
            return HIP_ERROR_OUT_OF_MEMORY;
        };
        accounted(
            R,
            "hipMemAllocPitch",
            None,
            estimate,
            Space::Pointer,
            || {
                // SAFETY: the real function with the caller's (non-null) arguments.
                let code = unsafe { real(ptr, pitch, width, height, element) };
                // SAFETY: pitch is non-null and was just written on success.
                let bytes = (unsafe { *pitch } as u64).saturating_mul(height.max(1) as u64);
                // SAFETY: ptr is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(ptr) }, bytes)
            },
            undo_linear::<R>,
        )
    })
}

free_wrapper!(hipFree, FreeFn, HipFree, Pointer, (ptr: *mut c_void));

free_wrapper!(hipFreeAsync, FreeStreamFn, HipFreeAsync, Pointer, (ptr: *mut c_void, stream: *mut c_void));
