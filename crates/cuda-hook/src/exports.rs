//! The exported functions: `dlsym`, `cuGetProcAddress[_v2]`, the allocation calls and frees,
//! the virtualized memory queries, the launches. Every body runs under `guarded`, whole; on an
//! internal failure an allocation is refused with `CUDA_ERROR_OUT_OF_MEMORY`, `dlsym` answers
//! NULL (never an unlimited real function), `cuGetProcAddress[_v2]` `CUDA_ERROR_NOT_FOUND`,
//! `cuInit` `CUDA_ERROR_NOT_INITIALIZED`, frees, queries and launches `CUDA_ERROR_UNKNOWN`
//! (`NVML_ERROR_UNKNOWN` for NVML); the inner guards keep the real call's answer once it has
//! run. Never a non-CUDA code, never an abort.
//!
//! Each export taking a pointer is an `unsafe extern "C" fn` whose contract is the CUDA (or
//! NVML, or libc) function of the same name: every pointer NULL or valid for what that function
//! reads and writes during the call. (`missing_safety_doc` is allowed here for that reason.)

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::cuda_abi::*;
use crate::ffi_guard::guarded;
use crate::sampler::{average_cost, before_launch, note_kernel};
use crate::state::{Kind, state};
use crate::symbols::{Sym, note_real, real_dlsym, real_fn, redirected_at};

/// The wrapper handed out for `sym`.
fn wrapper(sym: Sym) -> *mut c_void {
    let f: usize = match sym {
        Sym::CuInit => cuInit as *const () as usize,
        Sym::CuGetProcAddress => cuGetProcAddress as *const () as usize,
        Sym::CuGetProcAddressV2 => cuGetProcAddress_v2 as *const () as usize,
        Sym::CuMemAllocV2 => cuMemAlloc_v2 as *const () as usize,
        Sym::CuMemFreeV2 => cuMemFree_v2 as *const () as usize,
        Sym::CuMemAllocManaged => cuMemAllocManaged as *const () as usize,
        Sym::CuMemAllocPitchV2 => cuMemAllocPitch_v2 as *const () as usize,
        Sym::CuMemAllocAsync => cuMemAllocAsync as *const () as usize,
        Sym::CuMemAllocAsyncPtsz => cuMemAllocAsync_ptsz as *const () as usize,
        Sym::CuMemAllocFromPoolAsync => cuMemAllocFromPoolAsync as *const () as usize,
        Sym::CuMemAllocFromPoolAsyncPtsz => cuMemAllocFromPoolAsync_ptsz as *const () as usize,
        Sym::CuMemFreeAsync => cuMemFreeAsync as *const () as usize,
        Sym::CuMemFreeAsyncPtsz => cuMemFreeAsync_ptsz as *const () as usize,
        Sym::CuMemCreate => cuMemCreate as *const () as usize,
        Sym::CuMemRelease => cuMemRelease as *const () as usize,
        Sym::CuArrayCreateV2 => cuArrayCreate_v2 as *const () as usize,
        Sym::CuArray3DCreateV2 => cuArray3DCreate_v2 as *const () as usize,
        Sym::CuArrayDestroy => cuArrayDestroy as *const () as usize,
        Sym::CuMemGetInfoV2 => cuMemGetInfo_v2 as *const () as usize,
        Sym::CuDeviceTotalMemV2 => cuDeviceTotalMem_v2 as *const () as usize,
        Sym::CuLaunchKernel => cuLaunchKernel as *const () as usize,
        Sym::CuLaunchKernelPtsz => cuLaunchKernel_ptsz as *const () as usize,
        Sym::CuLaunchKernelEx => cuLaunchKernelEx as *const () as usize,
        Sym::CuLaunchKernelExPtsz => cuLaunchKernelEx_ptsz as *const () as usize,
        Sym::CuLaunchCooperativeKernel => cuLaunchCooperativeKernel as *const () as usize,
        Sym::CuLaunchCooperativeKernelPtsz => cuLaunchCooperativeKernel_ptsz as *const () as usize,
        Sym::CuGraphLaunch => cuGraphLaunch as *const () as usize,
        Sym::CuGraphLaunchPtsz => cuGraphLaunch_ptsz as *const () as usize,
        Sym::NvmlDeviceGetMemoryInfo => nvmlDeviceGetMemoryInfo as *const () as usize,
        Sym::NvmlDeviceGetMemoryInfoV2 => nvmlDeviceGetMemoryInfo_v2 as *const () as usize,
        _ => 0,
    };
    f as *mut c_void
}

/// `dlsym`: a lookup of a wrapped name gets the wrapper when the library really has the
/// symbol (NULL when it does not: never a wrapper around nothing); everything else is
/// glibc's answer. `RTLD_NEXT` lookups are resolved relative to libvgpu.so (README). An
/// internal error answers NULL, as for a missing symbol: never an unlimited real function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    guarded("dlsym", std::ptr::null_mut(), || {
        let Some(real) = real_dlsym() else {
            return std::ptr::null_mut();
        };
        // SAFETY: glibc's dlsym with the caller's arguments.
        let found = unsafe { real(handle, symbol) };
        if found.is_null() || symbol.is_null() {
            return found;
        }
        // SAFETY: non-null NUL-terminated name from the caller (glibc just read it).
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        match crate::symbols::Sym::from_name(name) {
            Some(sym) if sym.is_redirected() && found != wrapper(sym) => {
                note_real(sym, found as usize);
                wrapper(sym)
            }
            _ => found,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    guarded("cuInit", CUDA_ERROR_NOT_INITIALIZED, || {
        let Some(real) = real_fn!(Sym::CuInit, unsafe extern "C" fn(c_uint) -> CuResult) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real cuInit.
        let rc = unsafe { real(flags) };
        if rc == CUDA_SUCCESS {
            state().after_init();
        }
        rc
    })
}

/// Replaces a real entry point by its wrapper when we wrap that exact symbol: the driver
/// chose the symbol for the requested version and flags, so the wrapper's ABI matches.
///
/// # Safety
/// `pfn` is NULL or valid for reading and writing a pointer (the caller's out-parameter,
/// just written by the real `cuGetProcAddress`).
unsafe fn swap_entry(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: the driver just wrote the entry point there.
    let found = unsafe { *pfn } as usize;
    if found == 0 {
        return;
    }
    if let Some(sym) = redirected_at(found) {
        // SAFETY: same pointer, a function pointer of the same signature.
        unsafe { *pfn = wrapper(sym) };
    }
}

/// [`swap_entry`] under its own guard: an internal error clears the entry, so the caller
/// gets `CUDA_ERROR_NOT_FOUND` and no function rather than the real, unlimited one.
///
/// # Safety
/// As [`swap_entry`].
unsafe fn swapped_or_cleared(what: &str, pfn: *mut *mut c_void) -> bool {
    let swapped = guarded(what, false, || {
        // SAFETY: as this function's contract requires.
        unsafe { swap_entry(pfn) };
        true
    });
    if !swapped && !pfn.is_null() {
        // SAFETY: non-null and writable by this function's contract.
        unsafe { *pfn = std::ptr::null_mut() };
    }
    swapped
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    guarded("cuGetProcAddress", CUDA_ERROR_NOT_FOUND, || {
        type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
        let Some(real) = real_fn!(Sym::CuGetProcAddress, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(symbol, pfn, version, flags) };
        // SAFETY: pfn as written by the driver.
        if rc == CUDA_SUCCESS && !unsafe { swapped_or_cleared("cuGetProcAddress", pfn) } {
            return CUDA_ERROR_NOT_FOUND;
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    guarded("cuGetProcAddress_v2", CUDA_ERROR_NOT_FOUND, || {
        type F = unsafe extern "C" fn(
            *const c_char,
            *mut *mut c_void,
            c_int,
            u64,
            *mut c_int,
        ) -> CuResult;
        let Some(real) = real_fn!(Sym::CuGetProcAddressV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(symbol, pfn, version, flags, status) };
        // SAFETY: pfn as written by the driver.
        if rc == CUDA_SUCCESS && !unsafe { swapped_or_cleared("cuGetProcAddress_v2", pfn) } {
            return CUDA_ERROR_NOT_FOUND;
        }
        rc
    })
}

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
type FreeFn = unsafe extern "C" fn(u64) -> CuResult;
type FreeAsyncFn = unsafe extern "C" fn(u64, *mut c_void) -> CuResult;

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

/// The record is taken out first (a racing allocation handed the same address by the
/// driver records its own), then the real free; the bytes go back only once the driver has
/// freed them, so the device never holds more than the container's accounting says. A failed
/// free puts the record back. Unknown pointers pass through untouched (the reference
/// returns -1 and leaks them).
fn counted_free(what: &str, kind: Kind, key: u64, free: impl FnOnce() -> CuResult) -> CuResult {
    let record = guarded(what, None, || state().forget(kind, key));
    let rc = free();
    if let Some((index, bytes)) = record {
        guarded(what, (), || {
            let st = state();
            if rc == CUDA_SUCCESS {
                st.release(index, bytes);
            } else {
                st.restore(kind, key, (index, bytes));
            }
        });
    }
    rc
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CuResult {
    guarded("cuMemFree_v2", CUDA_ERROR_UNKNOWN, || {
        let Some(real) = real_fn!(Sym::CuMemFreeV2, FreeFn) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's argument.
        counted_free("cuMemFree_v2", Kind::Pointer, dptr, || unsafe {
            real(dptr)
        })
    })
}

macro_rules! free_async {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: u64, stream: *mut c_void) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, FreeAsyncFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                // SAFETY: the real function with the caller's arguments.
                counted_free(stringify!($name), Kind::Pointer, dptr, || unsafe {
                    real(dptr, stream)
                })
            })
        }
    };
}
free_async!(cuMemFreeAsync, Sym::CuMemFreeAsync);
free_async!(cuMemFreeAsync_ptsz, Sym::CuMemFreeAsyncPtsz);

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
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    guarded("cuMemRelease", CUDA_ERROR_UNKNOWN, || {
        let Some(real) = real_fn!(Sym::CuMemRelease, FreeFn) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's argument.
        counted_free("cuMemRelease", Kind::Handle, handle, || unsafe {
            real(handle)
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

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: u64) -> CuResult {
    guarded("cuArrayDestroy", CUDA_ERROR_UNKNOWN, || {
        let Some(real) = real_fn!(Sym::CuArrayDestroy, FreeFn) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's argument.
        counted_free("cuArrayDestroy", Kind::Array, array, || unsafe {
            real(array)
        })
    })
}

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

/// Limiter and handshake before a launch of `cost` tokens (`None`: a graph).
fn gate(what: &str, blocks: Option<u64>) {
    guarded(what, (), || {
        let st = state();
        let Ok(index) = st.current_index() else {
            return;
        };
        let cost = match blocks {
            Some(b) => {
                note_kernel(st, b);
                b
            }
            None => average_cost(st),
        };
        before_launch(st, index, cost);
    });
}

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type CoopFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type LaunchExFn = unsafe extern "C" fn(
    *const LaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type GraphFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult;

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

macro_rules! launch_kernel {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, LaunchFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                gate(stringify!($name), Some(blocks(gx, gy, gz)));
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
            })
        }
    };
}
launch_kernel!(cuLaunchKernel, Sym::CuLaunchKernel);
launch_kernel!(cuLaunchKernel_ptsz, Sym::CuLaunchKernelPtsz);

macro_rules! launch_coop {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: *mut c_void,
            params: *mut *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, CoopFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                gate(stringify!($name), Some(blocks(gx, gy, gz)));
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
            })
        }
    };
}
launch_coop!(cuLaunchCooperativeKernel, Sym::CuLaunchCooperativeKernel);
launch_coop!(
    cuLaunchCooperativeKernel_ptsz,
    Sym::CuLaunchCooperativeKernelPtsz
);

macro_rules! launch_ex {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfig,
            f: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, LaunchExFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                if !config.is_null() {
                    // SAFETY: the caller's launch configuration, non-null.
                    let g = unsafe { (*config).grid };
                    gate(stringify!($name), Some(blocks(g[0], g[1], g[2])));
                }
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(config, f, params, extra) }
            })
        }
    };
}
launch_ex!(cuLaunchKernelEx, Sym::CuLaunchKernelEx);
launch_ex!(cuLaunchKernelEx_ptsz, Sym::CuLaunchKernelExPtsz);

macro_rules! launch_graph {
    ($name:ident, $sym:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: *mut c_void, stream: *mut c_void) -> CuResult {
            guarded(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let Some(real) = real_fn!($sym, GraphFn) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                gate(stringify!($name), None);
                // SAFETY: the real function with the caller's arguments.
                unsafe { real(exec, stream) }
            })
        }
    };
}
launch_graph!(cuGraphLaunch, Sym::CuGraphLaunch);
launch_graph!(cuGraphLaunch_ptsz, Sym::CuGraphLaunchPtsz);

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
