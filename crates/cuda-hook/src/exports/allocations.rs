//! The allocations: reserve on the device, run the real call, track the address or handle
//! (`cuMemAlloc*`, the async and pool flavours, `cuMemCreate`, arrays sized from their
//! descriptors).

use std::ffi::{c_uint, c_void};

use super::frees::FreeFn;

use crate::cuda_abi::*;
use crate::ffi_guard::guarded;

use crate::state::{Kind, state};
use crate::symbols::{Sym, real_fn};

/// Reserve on the current device, allocate, release on failure, track on success. Runs
/// inside the export's guard, whose fallback (out of memory) is this function's failure too.
fn counted(
    kind: Kind,
    index: Option<usize>,
    bytes: u64,
    alloc: impl FnOnce() -> (CuResult, u64),
) -> CuResult {
    let st = state();
    let index = match index {
        Some(i) => i,
        None => match st.current_index() {
            Ok(i) => i,
            // No context: the real call fails the same way; let it say so.
            Err(_) => return alloc().0,
        },
    };
    if let Err(rc) = st.reserve(index, bytes) {
        return rc;
    }
    let (rc, key) = alloc();
    if rc == CUDA_SUCCESS {
        st.track(kind, key, index, bytes);
    } else {
        st.release(index, bytes);
    }
    rc
}

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
type AllocAsyncFn = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> CuResult;
type AllocPoolFn = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> CuResult;

/// The handle or address a successful real call wrote through `dptr`.
///
/// # Safety
/// `dptr` is non-null and valid for reading a `u64` (the caller's out-parameter, written by
/// the real call that just succeeded).
unsafe fn out_value(dptr: *mut u64) -> u64 {
    // SAFETY: non-null and readable by this function's contract.
    unsafe { *dptr }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CuResult {
    guarded("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn!(Sym::CuMemAllocV2, AllocFn) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        if dptr.is_null() {
            // SAFETY: the driver reports the NULL itself.
            return unsafe { real(dptr, size) };
        }
        counted(Kind::Pointer, None, size as u64, || {
            // SAFETY: the real function with the caller's arguments.
            let rc = unsafe { real(dptr, size) };
            (
                rc,
                if rc == CUDA_SUCCESS {
                    // SAFETY: non-null (checked above) and just written by the real call.
                    unsafe { out_value(dptr) }
                } else {
                    0
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> CuResult {
    guarded("cuMemAllocManaged", CUDA_ERROR_OUT_OF_MEMORY, || {
        type F = unsafe extern "C" fn(*mut u64, usize, c_uint) -> CuResult;
        let Some(real) = real_fn!(Sym::CuMemAllocManaged, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        if dptr.is_null() {
            // SAFETY: the driver reports the NULL itself.
            return unsafe { real(dptr, size, flags) };
        }
        counted(Kind::Pointer, None, size as u64, || {
            // SAFETY: the real function with the caller's arguments.
            let rc = unsafe { real(dptr, size, flags) };
            (
                rc,
                if rc == CUDA_SUCCESS {
                    // SAFETY: non-null (checked above) and just written by the real call.
                    unsafe { out_value(dptr) }
                } else {
                    0
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CuResult {
    guarded("cuMemAllocPitch_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        type F = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CuResult;
        let Some(real) = real_fn!(Sym::CuMemAllocPitchV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        let estimate = crate::sizing::pitch_estimate(width as u64, height as u64);
        let (Some(estimate), false) = (estimate, dptr.is_null() || pitch.is_null()) else {
            // SAFETY: the driver validates its own arguments.
            return unsafe { real(dptr, pitch, width, height, element) };
        };
        let st = state();
        let Ok(index) = st.current_index() else {
            // SAFETY: as above.
            return unsafe { real(dptr, pitch, width, height, element) };
        };
        if let Err(rc) = st.reserve(index, estimate) {
            return rc;
        }
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(dptr, pitch, width, height, element) };
        if rc != CUDA_SUCCESS {
            st.release(index, estimate);
            return rc;
        }
        // SAFETY: both written by the successful call.
        let (address, row) = unsafe { (*dptr, *pitch as u64) };
        let actual = row.saturating_mul(height as u64);
        if actual > estimate {
            if st.reserve(index, actual - estimate).is_err() {
                st.release(index, estimate);
                if let Some(free) = real_fn!(Sym::CuMemFreeV2, FreeFn) {
                    // SAFETY: frees what the driver just allocated.
                    unsafe { free(address) };
                }
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        } else {
            st.release(index, estimate - actual);
        }
        st.track(Kind::Pointer, address, index, actual);
        CUDA_SUCCESS
    })
}

macro_rules! alloc_async {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut u64,
            size: usize,
            stream: *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_OUT_OF_MEMORY, || {
                let Some(real) = real_fn!($sym, AllocAsyncFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                if dptr.is_null() {
                    // SAFETY: the driver reports the NULL itself.
                    return unsafe { real(dptr, size, stream) };
                }
                counted(Kind::Pointer, None, size as u64, || {
                    // SAFETY: the real function with the caller's arguments.
                    let rc = unsafe { real(dptr, size, stream) };
                    (
                        rc,
                        if rc == CUDA_SUCCESS {
                            // SAFETY: non-null (checked above) and just written by the real call.
                            unsafe { out_value(dptr) }
                        } else {
                            0
                        },
                    )
                })
            })
        }
    };
}
alloc_async!(cuMemAllocAsync, Sym::CuMemAllocAsync);
alloc_async!(cuMemAllocAsync_ptsz, Sym::CuMemAllocAsyncPtsz);

macro_rules! alloc_pool {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut u64,
            size: usize,
            pool: *mut c_void,
            stream: *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_OUT_OF_MEMORY, || {
                let Some(real) = real_fn!($sym, AllocPoolFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                if dptr.is_null() {
                    // SAFETY: the driver reports the NULL itself.
                    return unsafe { real(dptr, size, pool, stream) };
                }
                counted(Kind::Pointer, None, size as u64, || {
                    // SAFETY: the real function with the caller's arguments.
                    let rc = unsafe { real(dptr, size, pool, stream) };
                    (
                        rc,
                        if rc == CUDA_SUCCESS {
                            // SAFETY: non-null (checked above) and just written by the real call.
                            unsafe { out_value(dptr) }
                        } else {
                            0
                        },
                    )
                })
            })
        }
    };
}
alloc_pool!(cuMemAllocFromPoolAsync, Sym::CuMemAllocFromPoolAsync);
alloc_pool!(
    cuMemAllocFromPoolAsync_ptsz,
    Sym::CuMemAllocFromPoolAsyncPtsz
);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CuResult {
    guarded("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, || {
        type F = unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> CuResult;
        let Some(real) = real_fn!(Sym::CuMemCreate, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller's property struct, read only when non-null.
        let device = (!prop.is_null() && !handle.is_null())
            .then(|| unsafe { ((*prop).location_type, (*prop).location_id) })
            .filter(|(kind, _)| *kind == LOCATION_DEVICE)
            .map(|(_, id)| id);
        let Some(ordinal) = device else {
            // Host memory or bad arguments: not device memory to count.
            // SAFETY: the real function with the caller's arguments.
            return unsafe { real(handle, size, prop, flags) };
        };
        let index = guarded("cuMemCreate", None, || {
            let st = state();
            st.after_init();
            st.index_of(ordinal)
        });
        let Some(index) = index else {
            // SAFETY: the driver rejects the bad ordinal itself.
            return unsafe { real(handle, size, prop, flags) };
        };
        counted(Kind::Handle, Some(index), size as u64, || {
            // SAFETY: the real function with the caller's arguments.
            let rc = unsafe { real(handle, size, prop, flags) };
            (
                rc,
                if rc == CUDA_SUCCESS {
                    // SAFETY: non-null (checked above) and just written by the real call.
                    unsafe { out_value(handle) }
                } else {
                    0
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut u64,
    desc: *const ArrayDescriptor,
) -> CuResult {
    guarded("cuArrayCreate_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        type F = unsafe extern "C" fn(*mut u64, *const ArrayDescriptor) -> CuResult;
        let Some(real) = real_fn!(Sym::CuArrayCreateV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller's descriptor, read only when non-null.
        let bytes = (!desc.is_null() && !array.is_null())
            .then(|| unsafe { &*desc })
            .and_then(|d| {
                crate::sizing::array_bytes(d.width as u64, d.height as u64, 1, d.format, d.channels)
            });
        let Some(bytes) = bytes else {
            // SAFETY: the driver validates its own arguments.
            return unsafe { real(array, desc) };
        };
        counted(Kind::Array, None, bytes, || {
            // SAFETY: the real function with the caller's arguments.
            let rc = unsafe { real(array, desc) };
            (
                rc,
                if rc == CUDA_SUCCESS {
                    // SAFETY: non-null (checked above) and just written by the real call.
                    unsafe { out_value(array) }
                } else {
                    0
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut u64,
    desc: *const Array3dDescriptor,
) -> CuResult {
    guarded("cuArray3DCreate_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        type F = unsafe extern "C" fn(*mut u64, *const Array3dDescriptor) -> CuResult;
        let Some(real) = real_fn!(Sym::CuArray3DCreateV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller's descriptor, read only when non-null.
        let bytes = (!desc.is_null() && !array.is_null())
            .then(|| unsafe { &*desc })
            .and_then(|d| {
                crate::sizing::array_bytes(
                    d.width as u64,
                    d.height as u64,
                    d.depth as u64,
                    d.format,
                    d.channels,
                )
            });
        let Some(bytes) = bytes else {
            // SAFETY: the driver validates its own arguments.
            return unsafe { real(array, desc) };
        };
        counted(Kind::Array, None, bytes, || {
            // SAFETY: the real function with the caller's arguments.
            let rc = unsafe { real(array, desc) };
            (
                rc,
                if rc == CUDA_SUCCESS {
                    // SAFETY: non-null (checked above) and just written by the real call.
                    unsafe { out_value(array) }
                } else {
                    0
                },
            )
        })
    })
}
