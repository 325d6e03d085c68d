//! The wrappers handed to callers outside the HIP runtime. Each reserves before the real
//! allocation and releases on failure, frees return bytes to the allocating device, and the
//! memory queries report the limit. Nothing here may panic into C: every wrapper's whole body
//! runs in [`guarded`] with its fallback (allocations: out of memory; frees and queries:
//! `hipErrorUnknown`; `hipGetProcAddress`: `hipErrorNotFound`; environment changes: refused),
//! and the few inner guards keep the real call's answer once the real call has run.
//!
//! Every wrapper is an `unsafe extern "C" fn` whose contract is the HIP (or libc) function of
//! the same name; the helpers that read or write through a caller's pointer are `unsafe fn`s
//! that say which pointer must be valid for what.
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use hami_region::ReserveError;
use hami_region::accounting::{free_under_limit, total_under_limit};
use hami_region::layout::LIMIT_NONE;

use crate::ffi_guard::guarded;
use crate::hip_abi::*;
use crate::sizing::{array_bytes, descriptor_bytes, format_bytes, mipmap_bytes, pitched_estimate};
use crate::state::{ProcessState, state};
use crate::symbols::{MAX_RUNTIMES, Sym, note_real, real};
use crate::tracker::{Record, Space};

/// The real function of `sym` as a typed pointer.
fn real_fn<F: Copy>(runtime: usize, sym: Sym) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<usize>()) };
    let address = real(runtime, sym)?;
    // SAFETY: F is the C function-pointer type of `sym` (see hip_abi), and the address is
    // the runtime's (or libc's) definition of that symbol.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
}

fn current_device(runtime: usize) -> Result<usize, HipError> {
    let Some(get_device) = real_fn::<GetDeviceFn>(runtime, Sym::HipGetDevice) else {
        crate::log::error(format_args!(
            "hipGetDevice is not defined by HIP runtime {runtime}: the allocating device is unknown"
        ));
        return Err(HIP_ERROR_NOT_INITIALIZED);
    };
    let mut device: c_int = 0;
    // SAFETY: real hipGetDevice with a valid out-pointer.
    match unsafe { get_device(&mut device) } {
        HIP_SUCCESS => usize::try_from(device).map_err(|_| HIP_ERROR_INVALID_VALUE),
        code => Err(code),
    }
}

/// What a real allocation produced: the address or handle, and the bytes it really holds.
struct Allocated {
    address: usize,
    bytes: u64,
}

/// Reserve `reserve` bytes on `device`, run the real allocation, then settle the books.
/// `undo` frees an allocation that turned out bigger than the limit allows. Runs inside the
/// wrapper's guard, whose fallback (out of memory) is this function's failure too.
fn accounted(
    runtime: usize,
    what: &str,
    device: Option<usize>,
    reserve: u64,
    space: Space,
    allocate: impl FnOnce() -> Result<Option<Allocated>, HipError>,
    undo: impl FnOnce(usize),
) -> HipError {
    let state = state();
    let device = match device {
        Some(device) => device,
        None => match current_device(runtime) {
            Ok(device) => device,
            Err(code) => {
                if !state.any_limit() {
                    // Nothing to enforce: the runtime decides (and answers) itself.
                    crate::log::info(format_args!(
                        "{what}: the current device is unknown (hipGetDevice returned {code}); no device is limited, passing the call through"
                    ));
                    return allocate().err().unwrap_or(HIP_SUCCESS);
                }
                crate::log::info(format_args!(
                    "{what}: the runtime has no current device (hipGetDevice returned {code}); returning its error"
                ));
                return code;
            }
        },
    };
    let Some(session) = &state.session else {
        if state.limit(device) == LIMIT_NONE {
            return allocate().err().unwrap_or(HIP_SUCCESS);
        }
        return HIP_ERROR_OUT_OF_MEMORY; // fail closed: the limit cannot be enforced
    };
    match session.reserve(device, reserve) {
        Ok(()) => {}
        Err(ReserveError::OverLimit { over, .. }) => {
            crate::log::info(format_args!(
                "{what}: {} bytes refused on device {device}: {} of {} bytes in use",
                over.requested, over.used, over.limit
            ));
            oom_killer_check(state, device);
            return HIP_ERROR_OUT_OF_MEMORY;
        }
        Err(err @ ReserveError::NoSuchDevice(_)) => {
            crate::log::error(format_args!("{what}: {err}; refusing"));
            return HIP_ERROR_OUT_OF_MEMORY;
        }
    }
    let allocated = match allocate() {
        Ok(Some(allocated)) => allocated,
        Ok(None) => {
            session.release(device, reserve);
            return HIP_SUCCESS;
        }
        Err(code) => {
            session.release(device, reserve);
            return code;
        }
    };
    let mut bytes = reserve;
    if allocated.bytes < reserve {
        session.release(device, reserve - allocated.bytes);
        bytes = allocated.bytes;
    } else if allocated.bytes > reserve {
        match session.reserve(device, allocated.bytes - reserve) {
            Ok(()) => bytes = allocated.bytes,
            Err(err) => {
                crate::log::info(format_args!("{what}: padded allocation refused: {err}"));
                undo(allocated.address);
                session.release(device, reserve);
                return HIP_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    let stale = state
        .tracker()
        .insert(space, allocated.address, Record { device, bytes });
    if let Some(stale) = stale {
        session.release(stale.device, stale.bytes);
    }
    HIP_SUCCESS
}

/// ACTIVE_OOM_KILLER: a process holding bytes on a device whose usage is above its limit
/// (possible only through paths the hook cannot refuse, e.g. a limit lowered live) ends.
fn oom_killer_check(state: &ProcessState, device: usize) {
    let Some(session) = &state.session else {
        return;
    };
    if !state.config.active_oom_killer {
        return;
    }
    let Some(usage) = session.device_usage(device) else {
        return;
    };
    if usage.limit != LIMIT_NONE && usage.used > usage.limit && session.own_used(device) > 0 {
        crate::log::error(format_args!(
            "ACTIVE_OOM_KILLER: device {device} holds {} bytes over its limit of {}, {} of them this process's; terminating",
            usage.used,
            usage.limit,
            session.own_used(device)
        ));
        // SAFETY: sends SIGKILL to ourselves; a deliberate, logged termination.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Takes the record out, runs the real free, then returns the bytes if it succeeded, or puts
/// the record back if it failed.
///
/// The order matters: once the real free returns, the runtime may hand the same address to
/// a concurrent allocation (caching allocators reuse the last freed block first), whose
/// wrapper then records it. Removing our record *after* the free would delete that new
/// record and its bytes would never be counted (issue 14: 1.25–1.5× the limit with 8
/// threads). The bytes stay reserved until the real free succeeded, so the device never
/// holds more than the books say.
fn freed(what: &str, space: Space, address: usize, free: impl FnOnce() -> HipError) -> HipError {
    if address == 0 {
        return free();
    }
    let record = guarded(what, None, || {
        let state = state();
        state.tracker().remove(space, address)
    });
    let code = free();
    let Some(record) = record else {
        return code;
    };
    guarded(what, (), || {
        let state = state();
        if code == HIP_SUCCESS {
            if let Some(session) = &state.session {
                session.release(record.device, record.bytes);
            }
        } else if let Some(stale) = state.tracker().insert(space, address, record) {
            // The free failed, so the address is still ours; nothing else can have been
            // recorded there. Keep the books whole if it somehow was.
            if let Some(session) = &state.session {
                session.release(stale.device, stale.bytes);
            }
        }
    });
    code
}

/// The address a real call wrote through `out` (0 for a NULL `out`).
///
/// # Safety
/// `out` is NULL or valid for reading a pointer (the caller's out-parameter, written by the
/// real call that just succeeded).
unsafe fn out_address(out: *mut *mut c_void) -> usize {
    if out.is_null() {
        return 0;
    }
    // SAFETY: non-null, and readable by this function's contract.
    unsafe { *out as usize }
}

fn call_ok(code: HipError, address: usize, bytes: u64) -> Result<Option<Allocated>, HipError> {
    match code {
        HIP_SUCCESS if address == 0 => Ok(None),
        HIP_SUCCESS => Ok(Some(Allocated { address, bytes })),
        code => Err(code),
    }
}

/// A linear allocation of `size` bytes whose address the real `call` writes through `ptr`.
///
/// # Safety
/// `ptr` is NULL or valid for reading a pointer once `call` has succeeded.
unsafe fn linear(
    runtime: usize,
    what: &str,
    device: Option<usize>,
    ptr: *mut *mut c_void,
    size: usize,
    call: impl FnOnce() -> HipError,
) -> HipError {
    if ptr.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    accounted(
        runtime,
        what,
        device,
        size as u64,
        Space::Pointer,
        // SAFETY: ptr is non-null and readable by this function's contract.
        || call_ok(call(), unsafe { out_address(ptr) }, size as u64),
        |_| {},
    )
}

// --- Linear allocations ---

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

/// Frees a pitched allocation that does not fit once its real size is known.
fn undo_linear<const R: usize>(address: usize) {
    if let Some(free) = real_fn::<FreeFn>(R, Sym::HipFree) {
        // SAFETY: the real hipFree on the allocation the real call just made.
        unsafe { free(address as *mut c_void) };
    }
}

/// `hipFree` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipFree`: each pointer argument is NULL or valid for what that function reads and
/// writes during the call.
pub unsafe extern "C" fn hipFree<const R: usize>(ptr: *mut c_void) -> HipError {
    guarded("hipFree", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeFn>(R, Sym::HipFree) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's argument.
        freed("hipFree", Space::Pointer, ptr as usize, || unsafe {
            real(ptr)
        })
    })
}

/// `hipFreeAsync` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipFreeAsync`: each pointer argument is NULL or valid for what that function reads
/// and writes during the call.
pub unsafe extern "C" fn hipFreeAsync<const R: usize>(
    ptr: *mut c_void,
    stream: *mut c_void,
) -> HipError {
    guarded("hipFreeAsync", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeStreamFn>(R, Sym::HipFreeAsync) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        freed("hipFreeAsync", Space::Pointer, ptr as usize, || unsafe {
            real(ptr, stream)
        })
    })
}

// --- Arrays ---

/// Bits per element of a channel format (0 for a NULL `desc`).
///
/// # Safety
/// `desc` is NULL or points at the caller's live `hipChannelFormatDesc`.
unsafe fn element_bits(desc: *const HipChannelFormatDesc) -> u64 {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: non-null, and valid by this function's contract.
    let desc = unsafe { &*desc };
    [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|bits| u64::try_from(*bits).unwrap_or(0))
        .sum()
}

/// `hipMallocArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocArray`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMallocArray<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> HipError {
    guarded("hipMallocArray", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocArrayFn>(R, Sym::HipMallocArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract).
        let Some(bytes) = array_bytes(
            unsafe { element_bits(desc) },
            [width as u64, height as u64, 1],
        ) else {
            // The runtime rejects the descriptor itself.
            // SAFETY: the real function with the caller's arguments.
            return unsafe { real(array, desc, width, height, flags) };
        };
        if array.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        accounted(
            R,
            "hipMallocArray",
            None,
            bytes,
            Space::Array,
            || {
                // SAFETY: the real function with the caller's arguments.
                let code = unsafe { real(array, desc, width, height, flags) };
                // SAFETY: array is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(array) }, bytes)
            },
            |_| {},
        )
    })
}

/// `hipMalloc3DArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMalloc3DArray`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMalloc3DArray<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    flags: c_uint,
) -> HipError {
    guarded("hipMalloc3DArray", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<Malloc3DArrayFn>(R, Sym::HipMalloc3DArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        let dims = [
            extent.width as u64,
            extent.height as u64,
            extent.depth as u64,
        ];
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract).
        let Some(bytes) = array_bytes(unsafe { element_bits(desc) }, dims) else {
            // SAFETY: the real function with the caller's arguments.
            return unsafe { real(array, desc, extent, flags) };
        };
        if array.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        accounted(
            R,
            "hipMalloc3DArray",
            None,
            bytes,
            Space::Array,
            || {
                // SAFETY: the real function with the caller's arguments.
                let code = unsafe { real(array, desc, extent, flags) };
                // SAFETY: array is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(array) }, bytes)
            },
            |_| {},
        )
    })
}

/// `hipFreeArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipFreeArray`: each pointer argument is NULL or valid for what that function reads
/// and writes during the call.
pub unsafe extern "C" fn hipFreeArray<const R: usize>(array: *mut c_void) -> HipError {
    guarded("hipFreeArray", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeFn>(R, Sym::HipFreeArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's argument.
        freed("hipFreeArray", Space::Array, array as usize, || unsafe {
            real(array)
        })
    })
}

// --- Driver-API arrays, mipmapped arrays, pitched driver allocations ---

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

/// Runs an array-style allocation of `bytes` (`None`: the runtime rejects the descriptor
/// itself, so the call passes through uncounted).
///
/// # Safety
/// `out` is NULL or valid for reading a pointer once `call` has succeeded.
unsafe fn array_like(
    runtime: usize,
    what: &str,
    out: *mut *mut c_void,
    bytes: Option<u64>,
    space: Space,
    call: impl FnOnce() -> HipError,
) -> HipError {
    let Some(bytes) = bytes else {
        return call();
    };
    if out.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    accounted(
        runtime,
        what,
        None,
        bytes,
        space,
        // SAFETY: out is non-null and readable by this function's contract.
        || call_ok(call(), unsafe { out_address(out) }, bytes),
        |_| {},
    )
}

/// The caller's descriptor, if any.
///
/// # Safety
/// `desc` is NULL or points at a `T` that stays valid while the reference is used (the
/// wrapper's call; the reference must not outlive it).
unsafe fn read_descriptor<'a, T>(desc: *const T) -> Option<&'a T> {
    // SAFETY: NULL or valid for `'a`, by this function's contract.
    unsafe { desc.as_ref() }
}

/// `hipArrayCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipArrayCreate`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipArrayCreate<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipArrayDescriptor,
) -> HipError {
    guarded("hipArrayCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<ArrayCreateFn>(R, Sym::HipArrayCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract), read during
        // the call only.
        let bytes = unsafe { read_descriptor(desc) }.and_then(|d| {
            descriptor_bytes(d.format, d.channels, [d.width as u64, d.height as u64, 0])
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(R, "hipArrayCreate", array, bytes, Space::Array, || {
                real(array, desc)
            })
        }
    })
}

/// `hipArray3DCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipArray3DCreate`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipArray3DCreate<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
) -> HipError {
    guarded("hipArray3DCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<Array3DCreateFn>(R, Sym::HipArray3DCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract), read during
        // the call only.
        let bytes = unsafe { read_descriptor(desc) }.and_then(|d| {
            let dims = [d.width as u64, d.height as u64, d.depth as u64];
            descriptor_bytes(d.format, d.channels, dims)
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(R, "hipArray3DCreate", array, bytes, Space::Array, || {
                real(array, desc)
            })
        }
    })
}

/// `hipArrayDestroy` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipArrayDestroy`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipArrayDestroy<const R: usize>(array: *mut c_void) -> HipError {
    guarded("hipArrayDestroy", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeFn>(R, Sym::HipArrayDestroy) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's argument.
        freed("hipArrayDestroy", Space::Array, array as usize, || unsafe {
            real(array)
        })
    })
}

/// `hipMallocMipmappedArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocMipmappedArray`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipMallocMipmappedArray<const R: usize>(
    mipmapped: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    levels: c_uint,
    flags: c_uint,
) -> HipError {
    guarded("hipMallocMipmappedArray", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocMipmappedFn>(R, Sym::HipMallocMipmappedArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract).
        let bits = unsafe { element_bits(desc) };
        let dims = [
            extent.width as u64,
            extent.height as u64,
            extent.depth as u64,
        ];
        let bytes = (bits > 0 && bits.is_multiple_of(8))
            .then(|| mipmap_bytes(bits / 8, dims, levels))
            .flatten();
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(
                R,
                "hipMallocMipmappedArray",
                mipmapped,
                bytes,
                Space::Mipmapped,
                || real(mipmapped, desc, extent, levels, flags),
            )
        }
    })
}

/// `hipMipmappedArrayCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMipmappedArrayCreate`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipMipmappedArrayCreate<const R: usize>(
    mipmapped: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
    levels: c_uint,
) -> HipError {
    guarded("hipMipmappedArrayCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MipmappedCreateFn>(R, Sym::HipMipmappedArrayCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract), read during
        // the call only.
        let bytes = unsafe { read_descriptor(desc) }.and_then(|d| {
            let element = format_bytes(d.format)?.checked_mul(u64::from(d.channels))?;
            let dims = [d.width as u64, d.height as u64, d.depth as u64];
            mipmap_bytes(element, dims, levels)
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(
                R,
                "hipMipmappedArrayCreate",
                mipmapped,
                bytes,
                Space::Mipmapped,
                || real(mipmapped, desc, levels),
            )
        }
    })
}

/// `hipFreeMipmappedArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipFreeMipmappedArray`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipFreeMipmappedArray<const R: usize>(mipmapped: *mut c_void) -> HipError {
    guarded("hipFreeMipmappedArray", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeFn>(R, Sym::HipFreeMipmappedArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's argument.
        freed(
            "hipFreeMipmappedArray",
            Space::Mipmapped,
            mipmapped as usize,
            || unsafe { real(mipmapped) },
        )
    })
}

/// `hipMipmappedArrayDestroy` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMipmappedArrayDestroy`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipMipmappedArrayDestroy<const R: usize>(
    mipmapped: *mut c_void,
) -> HipError {
    guarded("hipMipmappedArrayDestroy", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeFn>(R, Sym::HipMipmappedArrayDestroy) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's argument.
        freed(
            "hipMipmappedArrayDestroy",
            Space::Mipmapped,
            mipmapped as usize,
            || unsafe { real(mipmapped) },
        )
    })
}

/// Graph memory nodes allocate when the graph is launched, perhaps many times, and free
/// through free nodes or `hipFree` of an address the hook never saw returned: they cannot
/// be reserved before allocation. On a limited device they are refused with a reason;
/// elsewhere they pass through.
///
/// # Safety
/// As HIP's `hipGraphAddMemAllocNode`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipGraphAddMemAllocNode<const R: usize>(
    node: *mut *mut c_void,
    graph: *mut c_void,
    dependencies: *const *mut c_void,
    count: usize,
    params: *mut c_void,
) -> HipError {
    guarded("hipGraphAddMemAllocNode", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<GraphAddMemAllocFn>(R, Sym::HipGraphAddMemAllocNode) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // hipMemAllocNodeParams starts with hipMemPoolProps (location.id at 12).
        let refused = guarded("hipGraphAddMemAllocNode", true, || {
            let state = state();
            // SAFETY: params is NULL or the caller's hipMemAllocNodeParams (the wrapper's
            // contract), which starts with a hipMemPoolProps.
            let limited = match unsafe { location_id(params) } {
                Some(device) => state.limit(device) != LIMIT_NONE,
                None => state.config.limits.bytes.iter().any(|b| *b != LIMIT_NONE),
            };
            if limited {
                crate::log::error(format_args!(
                    "hipGraphAddMemAllocNode refused (hipErrorNotSupported): graph memory nodes allocate at every launch and cannot be counted against the device memory limit; allocate with hipMalloc or hipMallocAsync outside the graph"
                ));
            }
            limited
        });
        if refused {
            return HIP_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the real function with the caller's arguments.
        unsafe { real(node, graph, dependencies, count, params) }
    })
}

// --- Virtual memory and pools ---

/// Reads the `int` at `offset` of a caller's struct (`None` for NULL or a negative value).
///
/// # Safety
/// `props` is NULL or points at a live struct at least `offset + 4` bytes long (the
/// `hipMemPoolProps` or `hipMemAllocationProp` of the runtime's version this offset is for).
unsafe fn int_at(props: *const c_void, offset: usize) -> Option<usize> {
    if props.is_null() {
        return None;
    }
    // SAFETY: non-null and long enough, by this function's contract; read unaligned.
    let id = unsafe {
        props
            .cast::<u8>()
            .add(offset)
            .cast::<c_int>()
            .read_unaligned()
    };
    usize::try_from(id).ok()
}

/// The device of a `hipMemPoolProps` (or a struct that starts with one).
///
/// # Safety
/// `props` is NULL or points at a live `hipMemPoolProps`.
unsafe fn location_id(props: *const c_void) -> Option<usize> {
    // SAFETY: a hipMemPoolProps is longer than location.id's offset + 4.
    unsafe { int_at(props, POOL_LOCATION_ID) }
}

/// The runtime's `hipRuntimeGetVersion`, asked once (0 = not yet asked, -1 = unknown).
static RUNTIME_VERSION: [std::sync::atomic::AtomicI32; MAX_RUNTIMES] =
    [const { std::sync::atomic::AtomicI32::new(0) }; MAX_RUNTIMES];

fn runtime_version(runtime: usize) -> Option<c_int> {
    use std::sync::atomic::Ordering::Relaxed;
    let cache = RUNTIME_VERSION.get(runtime)?;
    let known = cache.load(Relaxed);
    if known != 0 {
        return (known > 0).then_some(known);
    }
    let mut version: c_int = 0;
    let code = match real_fn::<RuntimeVersionFn>(runtime, Sym::HipRuntimeGetVersion) {
        // SAFETY: the real hipRuntimeGetVersion with a valid out-pointer.
        Some(get) => unsafe { get(&mut version) },
        None => HIP_ERROR_NOT_INITIALIZED,
    };
    let stored = if code == HIP_SUCCESS && version > 0 {
        version
    } else {
        crate::log::error(format_args!(
            "hipRuntimeGetVersion failed ({code}): the layout of hipMemAllocationProp is unknown"
        ));
        -1
    };
    cache.store(stored, Relaxed);
    (stored > 0).then_some(stored)
}

/// The device a `hipMemAllocationProp` names, read at the offset of the runtime's layout.
///
/// # Safety
/// `prop` is NULL or points at a live `hipMemAllocationProp` of runtime `runtime`'s version.
unsafe fn allocation_device(runtime: usize, prop: *const c_void) -> Result<Option<usize>, String> {
    let version = runtime_version(runtime).ok_or_else(|| {
        "the runtime's version (hipRuntimeGetVersion) is unknown, so hipMemAllocationProp cannot be read".to_owned()
    })?;
    let offset = allocation_prop_location_id(version).ok_or_else(|| {
        format!("runtime version {version} predates hipMemCreate; its hipMemAllocationProp layout is unknown")
    })?;
    // SAFETY: `offset` is location.id's in the layout of the runtime's version, which is the
    // layout of `prop` by this function's contract.
    Ok(unsafe { int_at(prop, offset) })
}

/// `hipMemCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMemCreate`: each pointer argument is NULL or valid for what that function reads
/// and writes during the call.
pub unsafe extern "C" fn hipMemCreate<const R: usize>(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> HipError {
    guarded("hipMemCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MemCreateFn>(R, Sym::HipMemCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: prop is NULL or the caller's hipMemAllocationProp, of the layout of the
        // runtime the caller was bound to (the wrapper's contract).
        let device = match unsafe { allocation_device(R, prop) } {
            Ok(Some(device)) => device,
            // SAFETY: the real function with the caller's arguments (it rejects them).
            Ok(None) => return unsafe { real(handle, size, prop, flags) },
            Err(reason) => {
                if state().config.limits.bytes.iter().all(|b| *b == LIMIT_NONE) {
                    // SAFETY: the real function with the caller's arguments.
                    return unsafe { real(handle, size, prop, flags) };
                }
                // Fail closed: the device cannot be known, so the allocation cannot be charged.
                crate::log::error(format_args!("hipMemCreate refused: {reason}"));
                return HIP_ERROR_OUT_OF_MEMORY;
            }
        };
        if handle.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        accounted(
            R,
            "hipMemCreate",
            Some(device),
            size as u64,
            Space::Physical,
            || {
                // SAFETY: the real function with the caller's arguments.
                let code = unsafe { real(handle, size, prop, flags) };
                // SAFETY: handle is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(handle) }, size as u64)
            },
            |_| {},
        )
    })
}

/// `hipMemRelease` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMemRelease`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMemRelease<const R: usize>(handle: *mut c_void) -> HipError {
    guarded("hipMemRelease", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<FreeFn>(R, Sym::HipMemRelease) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's argument.
        freed(
            "hipMemRelease",
            Space::Physical,
            handle as usize,
            || unsafe { real(handle) },
        )
    })
}

/// `hipMemPoolCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMemPoolCreate`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMemPoolCreate<const R: usize>(
    pool: *mut *mut c_void,
    props: *const c_void,
) -> HipError {
    guarded("hipMemPoolCreate", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<PoolCreateFn>(R, Sym::HipMemPoolCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(pool, props) };
        if code == HIP_SUCCESS
            // SAFETY: props is NULL or the caller's hipMemPoolProps (the wrapper's contract).
            && let Some(device) = unsafe { location_id(props) }
        {
            // SAFETY: pool is the caller's out-pointer, readable by the wrapper's contract.
            let address = unsafe { out_address(pool) };
            guarded("hipMemPoolCreate", (), || {
                state().tracker().note_pool(address, device)
            });
        }
        code
    })
}

/// `hipDeviceGetDefaultMemPool` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipDeviceGetDefaultMemPool`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipDeviceGetDefaultMemPool<const R: usize>(
    pool: *mut *mut c_void,
    device: c_int,
) -> HipError {
    guarded("hipDeviceGetDefaultMemPool", HIP_ERROR_UNKNOWN, || {
        let Some(real) = real_fn::<DefaultPoolFn>(R, Sym::HipDeviceGetDefaultMemPool) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(pool, device) };
        if code == HIP_SUCCESS
            && let Ok(device) = usize::try_from(device)
        {
            // SAFETY: pool is the caller's out-pointer, readable by the wrapper's contract.
            let address = unsafe { out_address(pool) };
            guarded("hipDeviceGetDefaultMemPool", (), || {
                state().tracker().note_pool(address, device)
            });
        }
        code
    })
}

// --- Queries that report the limit ---

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

// --- Entry-point lookup ---

/// `hipGetProcAddress` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipGetProcAddress`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipGetProcAddress<const R: usize>(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    hip_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> HipError {
    guarded("hipGetProcAddress", HIP_ERROR_NOT_FOUND, || {
        let Some(real) = real_fn::<ProcAddressFn>(R, Sym::HipGetProcAddress) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(symbol, pfn, hip_version, flags, status) };
        if code != HIP_SUCCESS || symbol.is_null() || pfn.is_null() {
            return code;
        }
        let swapped = guarded("hipGetProcAddress", false, || {
            // SAFETY: non-null NUL-terminated name; pfn non-null and written by the real call.
            let (name, found) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn as usize) };
            if let Some(sym) = Sym::from_name(name)
                && found != 0
                && sym.is_redirected()
                && !sym.is_libc()
            {
                note_real(R, sym, found);
                if let Some(wrapper) = wrapper_address(sym, R) {
                    // SAFETY: pfn non-null.
                    unsafe { *pfn = wrapper as *mut c_void };
                }
            }
            true
        });
        if !swapped {
            // An internal error after the real lookup: no function rather than the real,
            // unlimited one.
            // SAFETY: pfn non-null, the caller's out-pointer.
            unsafe { *pfn = std::ptr::null_mut() };
            return HIP_ERROR_NOT_FOUND;
        }
        code
    })
}

// --- The runtime's environment reads ---

/// The pinned value of `name`, or libc's answer for any other name.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string (as for libc's `getenv`).
unsafe fn pinned_getenv(sym: Sym, name: *const c_char) -> *mut c_char {
    if !name.is_null() {
        // SAFETY: non-null and NUL-terminated by this function's contract.
        let key = unsafe { CStr::from_ptr(name) }.to_bytes();
        if let Some(index) = crate::pinned_env::pinned_index(key) {
            return crate::pinned_env::pinned_c_value(index).cast_mut();
        }
    }
    match real_fn::<GetenvFn>(0, sym) {
        // SAFETY: libc's getenv/secure_getenv with the caller's argument.
        Some(real) => unsafe { real(name) },
        None => std::ptr::null_mut(),
    }
}

/// `getenv` as the runtime (and ROCr) get it: the pinned variables read as the slice set them.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string (as for libc's `getenv`).
pub unsafe extern "C" fn getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: the caller's name, as this function's contract requires.
    guarded("getenv", std::ptr::null_mut(), || unsafe {
        pinned_getenv(Sym::Getenv, name)
    })
}

/// `secure_getenv` as the runtime gets it (see [`getenv`]).
///
/// # Safety
/// As [`getenv`].
pub unsafe extern "C" fn secure_getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: the caller's name, as this function's contract requires.
    guarded("secure_getenv", std::ptr::null_mut(), || unsafe {
        pinned_getenv(Sym::SecureGetenv, name)
    })
}

// --- The application's environment changes ---

type SetenvFn = unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> c_int;
type PutenvFn = unsafe extern "C" fn(*mut c_char) -> c_int;
type UnsetenvFn = unsafe extern "C" fn(*const c_char) -> c_int;
type ClearenvFn = unsafe extern "C" fn() -> c_int;

/// Whether the application's change of `entry` is kept away from a pinned variable (and
/// says so once per call).
///
/// # Safety
/// `entry` is NULL or a NUL-terminated string (`NAME` or `NAME=value`).
unsafe fn keeps_pinned(what: &str, entry: *const c_char) -> bool {
    if entry.is_null() {
        return false;
    }
    // SAFETY: non-null and NUL-terminated by this function's contract.
    let text = unsafe { CStr::from_ptr(entry) }.to_bytes();
    let pinned = crate::pinned_env::is_pinned_assignment(text);
    if pinned {
        let name = text.split(|b| *b == b'=').next().unwrap_or(text);
        crate::log::warn(format_args!(
            "{what}({}) left as it was: the slice's variables are pinned",
            String::from_utf8_lossy(name)
        ));
    }
    pinned
}

/// `setenv` as the application gets it: a pinned name is left as it was. An internal error
/// refuses the change (-1): a pinned variable is never changed because the hook failed.
///
/// # Safety
/// As libc's `setenv`.
pub unsafe extern "C" fn setenv(
    name: *const c_char,
    value: *const c_char,
    overwrite: c_int,
) -> c_int {
    guarded("setenv", -1, || {
        // SAFETY: the caller's name, NUL-terminated as setenv requires.
        if unsafe { keeps_pinned("setenv", name) } {
            return 0;
        }
        match real_fn::<SetenvFn>(0, Sym::Setenv) {
            // SAFETY: libc's setenv with the caller's arguments.
            Some(real) => unsafe { real(name, value, overwrite) },
            None => -1,
        }
    })
}

/// `putenv` as the application gets it (see [`setenv`]).
///
/// # Safety
/// As libc's `putenv`.
pub unsafe extern "C" fn putenv(entry: *mut c_char) -> c_int {
    guarded("putenv", -1, || {
        // SAFETY: the caller's entry, NUL-terminated as putenv requires.
        if unsafe { keeps_pinned("putenv", entry) } {
            return 0;
        }
        match real_fn::<PutenvFn>(0, Sym::Putenv) {
            // SAFETY: libc's putenv with the caller's argument.
            Some(real) => unsafe { real(entry) },
            None => -1,
        }
    })
}

/// `unsetenv` as the application gets it (see [`setenv`]).
///
/// # Safety
/// As libc's `unsetenv`.
pub unsafe extern "C" fn unsetenv(name: *const c_char) -> c_int {
    guarded("unsetenv", -1, || {
        // SAFETY: the caller's name, NUL-terminated as unsetenv requires.
        if unsafe { keeps_pinned("unsetenv", name) } {
            return 0;
        }
        match real_fn::<UnsetenvFn>(0, Sym::Unsetenv) {
            // SAFETY: libc's unsetenv with the caller's argument.
            Some(real) => unsafe { real(name) },
            None => -1,
        }
    })
}

/// `clearenv`, then the pinned values back.
///
/// # Safety
/// As libc's `clearenv`.
pub unsafe extern "C" fn clearenv() -> c_int {
    guarded("clearenv", -1, || {
        let code = match real_fn::<ClearenvFn>(0, Sym::Clearenv) {
            // SAFETY: libc's clearenv.
            Some(real) => unsafe { real() },
            None => return -1,
        };
        // The environment is cleared already: whatever happens next, clearenv's answer stands.
        // SAFETY: inside the application's clearenv, which excludes concurrent environment use.
        guarded("clearenv", (), || unsafe {
            crate::pinned_env::apply_to_environ()
        });
        code
    })
}

/// The wrapper callers of runtime `runtime` get for `sym`: one instance of every wrapper
/// per runtime, so each calls the runtime its caller was bound to.
pub fn wrapper_address(sym: Sym, runtime: usize) -> Option<usize> {
    match runtime {
        0 => addresses::<0>(sym),
        1 => addresses::<1>(sym),
        2 => addresses::<2>(sym),
        3 => addresses::<3>(sym),
        _ => None,
    }
}

const _: () = assert!(MAX_RUNTIMES == 4, "wrapper_address instantiates 4 runtimes");

fn addresses<const R: usize>(sym: Sym) -> Option<usize> {
    let address = match sym {
        Sym::HipMalloc => hipMalloc::<R> as *const () as usize,
        Sym::HipFree => hipFree::<R> as *const () as usize,
        Sym::HipMallocAsync => hipMallocAsync::<R> as *const () as usize,
        Sym::HipFreeAsync => hipFreeAsync::<R> as *const () as usize,
        Sym::HipMallocFromPoolAsync => hipMallocFromPoolAsync::<R> as *const () as usize,
        Sym::HipMalloc3D => hipMalloc3D::<R> as *const () as usize,
        Sym::HipMallocPitch => hipMallocPitch::<R> as *const () as usize,
        Sym::HipMallocArray => hipMallocArray::<R> as *const () as usize,
        Sym::HipMalloc3DArray => hipMalloc3DArray::<R> as *const () as usize,
        Sym::HipFreeArray => hipFreeArray::<R> as *const () as usize,
        Sym::HipMallocManaged => hipMallocManaged::<R> as *const () as usize,
        Sym::HipExtMallocWithFlags => hipExtMallocWithFlags::<R> as *const () as usize,
        Sym::HipMemCreate => hipMemCreate::<R> as *const () as usize,
        Sym::HipMemRelease => hipMemRelease::<R> as *const () as usize,
        Sym::HipMemPoolCreate => hipMemPoolCreate::<R> as *const () as usize,
        Sym::HipDeviceGetDefaultMemPool => hipDeviceGetDefaultMemPool::<R> as *const () as usize,
        Sym::HipMemGetInfo => hipMemGetInfo::<R> as *const () as usize,
        Sym::HipGetDeviceProperties => hipGetDeviceProperties::<R> as *const () as usize,
        Sym::HipGetDevicePropertiesR0600 => hipGetDevicePropertiesR0600::<R> as *const () as usize,
        Sym::HipDeviceGetAttribute => hipDeviceGetAttribute::<R> as *const () as usize,
        Sym::HipDeviceTotalMem => hipDeviceTotalMem::<R> as *const () as usize,
        Sym::HipGetProcAddress => hipGetProcAddress::<R> as *const () as usize,
        Sym::HipMemAllocPitch => hipMemAllocPitch::<R> as *const () as usize,
        Sym::HipArrayCreate => hipArrayCreate::<R> as *const () as usize,
        Sym::HipArray3DCreate => hipArray3DCreate::<R> as *const () as usize,
        Sym::HipArrayDestroy => hipArrayDestroy::<R> as *const () as usize,
        Sym::HipMallocMipmappedArray => hipMallocMipmappedArray::<R> as *const () as usize,
        Sym::HipFreeMipmappedArray => hipFreeMipmappedArray::<R> as *const () as usize,
        Sym::HipMipmappedArrayCreate => hipMipmappedArrayCreate::<R> as *const () as usize,
        Sym::HipMipmappedArrayDestroy => hipMipmappedArrayDestroy::<R> as *const () as usize,
        Sym::HipGraphAddMemAllocNode => hipGraphAddMemAllocNode::<R> as *const () as usize,
        Sym::Getenv => getenv as *const () as usize,
        Sym::Setenv => setenv as *const () as usize,
        Sym::Putenv => putenv as *const () as usize,
        Sym::Unsetenv => unsetenv as *const () as usize,
        Sym::Clearenv => clearenv as *const () as usize,
        Sym::SecureGetenv => secure_getenv as *const () as usize,
        Sym::HipGetDevice | Sym::HipRuntimeGetVersion => return None,
    };
    Some(address)
}
