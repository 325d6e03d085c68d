//! The wrappers handed to callers outside the HIP runtime. Each reserves before the real
//! allocation and releases on failure, frees return bytes to the allocating device, and the
//! memory queries report the limit. Nothing here may panic into C: bodies run in
//! [`guarded`], and allocations fail closed.
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
/// `undo` frees an allocation that turned out bigger than the limit allows.
fn accounted(
    runtime: usize,
    what: &str,
    device: Option<usize>,
    reserve: u64,
    space: Space,
    allocate: impl FnOnce() -> Result<Option<Allocated>, HipError>,
    undo: impl FnOnce(usize),
) -> HipError {
    guarded(what, HIP_ERROR_OUT_OF_MEMORY, || {
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
    })
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

fn out_address(out: *mut *mut c_void) -> usize {
    if out.is_null() {
        return 0;
    }
    // SAFETY: non-null out-pointer the real call just wrote.
    unsafe { *out as usize }
}

fn call_ok(code: HipError, address: usize, bytes: u64) -> Result<Option<Allocated>, HipError> {
    match code {
        HIP_SUCCESS if address == 0 => Ok(None),
        HIP_SUCCESS => Ok(Some(Allocated { address, bytes })),
        code => Err(code),
    }
}

fn linear(
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
        || call_ok(call(), out_address(ptr), size as u64),
        |_| {},
    )
}

// --- Linear allocations ---

pub extern "C" fn hipMalloc<const R: usize>(ptr: *mut *mut c_void, size: usize) -> HipError {
    let oversubscribe = guarded("hipMalloc", false, || state().config.oversubscribe);
    if oversubscribe {
        let Some(managed) = real_fn::<MallocFlagsFn>(R, Sym::HipMallocManaged) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: real hipMallocManaged with the caller's arguments.
        return linear(R, "hipMalloc", None, ptr, size, || unsafe {
            managed(ptr, size, MEM_ATTACH_GLOBAL)
        });
    }
    let Some(real) = real_fn::<MallocFn>(R, Sym::HipMalloc) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear(R, "hipMalloc", None, ptr, size, || unsafe {
        real(ptr, size)
    })
}

pub extern "C" fn hipExtMallocWithFlags<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MallocFlagsFn>(R, Sym::HipExtMallocWithFlags) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear(R, "hipExtMallocWithFlags", None, ptr, size, || unsafe {
        real(ptr, size, flags)
    })
}

pub extern "C" fn hipMallocManaged<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MallocFlagsFn>(R, Sym::HipMallocManaged) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear(R, "hipMallocManaged", None, ptr, size, || unsafe {
        real(ptr, size, flags)
    })
}

pub extern "C" fn hipMallocAsync<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    stream: *mut c_void,
) -> HipError {
    let Some(real) = real_fn::<MallocStreamFn>(R, Sym::HipMallocAsync) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear(R, "hipMallocAsync", None, ptr, size, || unsafe {
        real(ptr, size, stream)
    })
}

pub extern "C" fn hipMallocFromPoolAsync<const R: usize>(
    ptr: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> HipError {
    let Some(real) = real_fn::<MallocPoolFn>(R, Sym::HipMallocFromPoolAsync) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // A pool we did not see created is taken to be on the current device.
    let device = guarded("hipMallocFromPoolAsync", None, || {
        state().tracker().pool_device(pool as usize)
    });
    // SAFETY: the real function with the caller's arguments.
    linear(R, "hipMallocFromPoolAsync", device, ptr, size, || unsafe {
        real(ptr, size, pool, stream)
    })
}

pub extern "C" fn hipMallocPitch<const R: usize>(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
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
            call_ok(code, out_address(ptr), bytes)
        },
        undo_linear::<R>,
    )
}

pub extern "C" fn hipMalloc3D<const R: usize>(
    pitched: *mut HipPitchedPtr,
    extent: HipExtent,
) -> HipError {
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
            let (address, pitch) = unsafe { ((*pitched).ptr as usize, (*pitched).pitch as u64) };
            call_ok(code, address, pitch.saturating_mul(rows))
        },
        undo_linear::<R>,
    )
}

/// Frees a pitched allocation that does not fit once its real size is known.
fn undo_linear<const R: usize>(address: usize) {
    if let Some(free) = real_fn::<FreeFn>(R, Sym::HipFree) {
        // SAFETY: the real hipFree on the allocation the real call just made.
        unsafe { free(address as *mut c_void) };
    }
}

pub extern "C" fn hipFree<const R: usize>(ptr: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeFn>(R, Sym::HipFree) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's argument.
    freed("hipFree", Space::Pointer, ptr as usize, || unsafe {
        real(ptr)
    })
}

pub extern "C" fn hipFreeAsync<const R: usize>(ptr: *mut c_void, stream: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeStreamFn>(R, Sym::HipFreeAsync) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    freed("hipFreeAsync", Space::Pointer, ptr as usize, || unsafe {
        real(ptr, stream)
    })
}

// --- Arrays ---

fn element_bits(desc: *const HipChannelFormatDesc) -> u64 {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: non-null pointer to the caller's descriptor.
    let desc = unsafe { &*desc };
    [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|bits| u64::try_from(*bits).unwrap_or(0))
        .sum()
}

pub extern "C" fn hipMallocArray<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MallocArrayFn>(R, Sym::HipMallocArray) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let Some(bytes) = array_bytes(element_bits(desc), [width as u64, height as u64, 1]) else {
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
            call_ok(code, out_address(array), bytes)
        },
        |_| {},
    )
}

pub extern "C" fn hipMalloc3DArray<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<Malloc3DArrayFn>(R, Sym::HipMalloc3DArray) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let dims = [
        extent.width as u64,
        extent.height as u64,
        extent.depth as u64,
    ];
    let Some(bytes) = array_bytes(element_bits(desc), dims) else {
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
            call_ok(code, out_address(array), bytes)
        },
        |_| {},
    )
}

pub extern "C" fn hipFreeArray<const R: usize>(array: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeFn>(R, Sym::HipFreeArray) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's argument.
    freed("hipFreeArray", Space::Array, array as usize, || unsafe {
        real(array)
    })
}

// --- Driver-API arrays, mipmapped arrays, pitched driver allocations ---

pub extern "C" fn hipMemAllocPitch<const R: usize>(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> HipError {
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
            call_ok(code, out_address(ptr), bytes)
        },
        undo_linear::<R>,
    )
}

/// Runs an array-style allocation of `bytes` (`None`: the runtime rejects the descriptor
/// itself, so the call passes through uncounted).
fn array_like(
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
        || call_ok(call(), out_address(out), bytes),
        |_| {},
    )
}

fn read_descriptor<'a, T>(desc: *const T) -> Option<&'a T> {
    // SAFETY: the caller's descriptor, valid for the duration of the call (the reference
    // does not outlive the wrapper that uses it).
    unsafe { desc.as_ref() }
}

pub extern "C" fn hipArrayCreate<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipArrayDescriptor,
) -> HipError {
    let Some(real) = real_fn::<ArrayCreateFn>(R, Sym::HipArrayCreate) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let bytes = read_descriptor(desc)
        .and_then(|d| descriptor_bytes(d.format, d.channels, [d.width as u64, d.height as u64, 0]));
    // SAFETY: the real function with the caller's arguments.
    array_like(R, "hipArrayCreate", array, bytes, Space::Array, || unsafe {
        real(array, desc)
    })
}

pub extern "C" fn hipArray3DCreate<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
) -> HipError {
    let Some(real) = real_fn::<Array3DCreateFn>(R, Sym::HipArray3DCreate) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let bytes = read_descriptor(desc).and_then(|d| {
        let dims = [d.width as u64, d.height as u64, d.depth as u64];
        descriptor_bytes(d.format, d.channels, dims)
    });
    // SAFETY: the real function with the caller's arguments.
    array_like(
        R,
        "hipArray3DCreate",
        array,
        bytes,
        Space::Array,
        || unsafe { real(array, desc) },
    )
}

pub extern "C" fn hipArrayDestroy<const R: usize>(array: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeFn>(R, Sym::HipArrayDestroy) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's argument.
    freed("hipArrayDestroy", Space::Array, array as usize, || unsafe {
        real(array)
    })
}

pub extern "C" fn hipMallocMipmappedArray<const R: usize>(
    mipmapped: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    levels: c_uint,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MallocMipmappedFn>(R, Sym::HipMallocMipmappedArray) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let bits = element_bits(desc);
    let dims = [
        extent.width as u64,
        extent.height as u64,
        extent.depth as u64,
    ];
    let bytes = (bits > 0 && bits.is_multiple_of(8))
        .then(|| mipmap_bytes(bits / 8, dims, levels))
        .flatten();
    // SAFETY: the real function with the caller's arguments.
    array_like(
        R,
        "hipMallocMipmappedArray",
        mipmapped,
        bytes,
        Space::Mipmapped,
        || unsafe { real(mipmapped, desc, extent, levels, flags) },
    )
}

pub extern "C" fn hipMipmappedArrayCreate<const R: usize>(
    mipmapped: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
    levels: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MipmappedCreateFn>(R, Sym::HipMipmappedArrayCreate) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let bytes = read_descriptor(desc).and_then(|d| {
        let element = format_bytes(d.format)?.checked_mul(u64::from(d.channels))?;
        let dims = [d.width as u64, d.height as u64, d.depth as u64];
        mipmap_bytes(element, dims, levels)
    });
    // SAFETY: the real function with the caller's arguments.
    array_like(
        R,
        "hipMipmappedArrayCreate",
        mipmapped,
        bytes,
        Space::Mipmapped,
        || unsafe { real(mipmapped, desc, levels) },
    )
}

pub extern "C" fn hipFreeMipmappedArray<const R: usize>(mipmapped: *mut c_void) -> HipError {
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
}

pub extern "C" fn hipMipmappedArrayDestroy<const R: usize>(mipmapped: *mut c_void) -> HipError {
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
}

/// Graph memory nodes allocate when the graph is launched, perhaps many times, and free
/// through free nodes or `hipFree` of an address the hook never saw returned: they cannot
/// be reserved before allocation. On a limited device they are refused with a reason;
/// elsewhere they pass through.
pub extern "C" fn hipGraphAddMemAllocNode<const R: usize>(
    node: *mut *mut c_void,
    graph: *mut c_void,
    dependencies: *const *mut c_void,
    count: usize,
    params: *mut c_void,
) -> HipError {
    let Some(real) = real_fn::<GraphAddMemAllocFn>(R, Sym::HipGraphAddMemAllocNode) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // hipMemAllocNodeParams starts with hipMemPoolProps (location.id at 12).
    let refused = guarded("hipGraphAddMemAllocNode", true, || {
        let state = state();
        let limited = match location_id(params) {
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
}

// --- Virtual memory and pools ---

/// Reads the `int` at `offset` of a caller's struct.
fn int_at(props: *const c_void, offset: usize) -> Option<usize> {
    if props.is_null() {
        return None;
    }
    // SAFETY: the caller passed the struct this offset belongs to (hipMemPoolProps or
    // hipMemAllocationProp of the runtime's version), which is longer than offset + 4.
    let id = unsafe {
        props
            .cast::<u8>()
            .add(offset)
            .cast::<c_int>()
            .read_unaligned()
    };
    usize::try_from(id).ok()
}

fn location_id(props: *const c_void) -> Option<usize> {
    int_at(props, POOL_LOCATION_ID)
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
fn allocation_device(runtime: usize, prop: *const c_void) -> Result<Option<usize>, String> {
    let version = runtime_version(runtime).ok_or_else(|| {
        "the runtime's version (hipRuntimeGetVersion) is unknown, so hipMemAllocationProp cannot be read".to_owned()
    })?;
    let offset = allocation_prop_location_id(version).ok_or_else(|| {
        format!("runtime version {version} predates hipMemCreate; its hipMemAllocationProp layout is unknown")
    })?;
    Ok(int_at(prop, offset))
}

pub extern "C" fn hipMemCreate<const R: usize>(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> HipError {
    let Some(real) = real_fn::<MemCreateFn>(R, Sym::HipMemCreate) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let device = guarded("hipMemCreate", Err("internal error".to_owned()), || {
        allocation_device(R, prop)
    });
    let device = match device {
        Ok(Some(device)) => device,
        // SAFETY: the real function with the caller's arguments (it rejects them).
        Ok(None) => return unsafe { real(handle, size, prop, flags) },
        Err(reason) => {
            let unlimited = guarded("hipMemCreate", false, || {
                state().config.limits.bytes.iter().all(|b| *b == LIMIT_NONE)
            });
            if unlimited {
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
            call_ok(code, out_address(handle), size as u64)
        },
        |_| {},
    )
}

pub extern "C" fn hipMemRelease<const R: usize>(handle: *mut c_void) -> HipError {
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
}

pub extern "C" fn hipMemPoolCreate<const R: usize>(
    pool: *mut *mut c_void,
    props: *const c_void,
) -> HipError {
    let Some(real) = real_fn::<PoolCreateFn>(R, Sym::HipMemPoolCreate) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    let code = unsafe { real(pool, props) };
    if code == HIP_SUCCESS
        && let Some(device) = location_id(props)
    {
        let address = out_address(pool);
        guarded("hipMemPoolCreate", (), || {
            state().tracker().note_pool(address, device)
        });
    }
    code
}

pub extern "C" fn hipDeviceGetDefaultMemPool<const R: usize>(
    pool: *mut *mut c_void,
    device: c_int,
) -> HipError {
    let Some(real) = real_fn::<DefaultPoolFn>(R, Sym::HipDeviceGetDefaultMemPool) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    let code = unsafe { real(pool, device) };
    if code == HIP_SUCCESS
        && let Ok(device) = usize::try_from(device)
    {
        let address = out_address(pool);
        guarded("hipDeviceGetDefaultMemPool", (), || {
            state().tracker().note_pool(address, device)
        });
    }
    code
}

// --- Queries that report the limit ---

pub extern "C" fn hipMemGetInfo<const R: usize>(free: *mut usize, total: *mut usize) -> HipError {
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
}

fn patch_total(props: *mut c_void, device: c_int, offset: usize) {
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
    // SAFETY: the caller's hipDeviceProp_t of the layout this symbol serves, just filled by
    // the real call; totalGlobalMem is a size_t at `offset`.
    unsafe {
        let field = props.cast::<u8>().add(offset).cast::<usize>();
        let physical = field.read_unaligned() as u64;
        field.write_unaligned(total_under_limit(limit, physical) as usize);
    }
}

pub extern "C" fn hipGetDevicePropertiesR0600<const R: usize>(
    props: *mut c_void,
    device: c_int,
) -> HipError {
    let Some(real) = real_fn::<PropsFn>(R, Sym::HipGetDevicePropertiesR0600) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    let code = unsafe { real(props, device) };
    if code == HIP_SUCCESS {
        guarded("hipGetDevicePropertiesR0600", (), || {
            patch_total(props, device, R0600_TOTAL_GLOBAL_MEM)
        });
    }
    code
}

pub extern "C" fn hipGetDeviceProperties<const R: usize>(
    props: *mut c_void,
    device: c_int,
) -> HipError {
    let Some(real) = real_fn::<PropsFn>(R, Sym::HipGetDeviceProperties) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    let code = unsafe { real(props, device) };
    if code == HIP_SUCCESS {
        guarded("hipGetDeviceProperties", (), || {
            patch_total(props, device, R0000_TOTAL_GLOBAL_MEM)
        });
    }
    code
}

pub extern "C" fn hipDeviceGetAttribute<const R: usize>(
    value: *mut c_int,
    attribute: c_int,
    device: c_int,
) -> HipError {
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
}

pub extern "C" fn hipDeviceTotalMem<const R: usize>(bytes: *mut usize, device: c_int) -> HipError {
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
}

// --- Entry-point lookup ---

pub extern "C" fn hipGetProcAddress<const R: usize>(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    hip_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> HipError {
    let Some(real) = real_fn::<ProcAddressFn>(R, Sym::HipGetProcAddress) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    let code = unsafe { real(symbol, pfn, hip_version, flags, status) };
    if code != HIP_SUCCESS || symbol.is_null() || pfn.is_null() {
        return code;
    }
    guarded("hipGetProcAddress", code, || {
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
        code
    })
}

// --- The runtime's environment reads ---

fn pinned_getenv(sym: Sym, name: *const c_char) -> *mut c_char {
    guarded("getenv", std::ptr::null_mut(), || {
        if !name.is_null() {
            // SAFETY: non-null NUL-terminated name from the caller.
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
    })
}

/// # Safety
/// `name` is NULL or a NUL-terminated string (as for libc's `getenv`).
pub unsafe extern "C" fn getenv(name: *const c_char) -> *mut c_char {
    pinned_getenv(Sym::Getenv, name)
}

/// # Safety
/// As [`getenv`].
pub unsafe extern "C" fn secure_getenv(name: *const c_char) -> *mut c_char {
    pinned_getenv(Sym::SecureGetenv, name)
}

// --- The application's environment changes ---

type SetenvFn = unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> c_int;
type PutenvFn = unsafe extern "C" fn(*mut c_char) -> c_int;
type UnsetenvFn = unsafe extern "C" fn(*const c_char) -> c_int;
type ClearenvFn = unsafe extern "C" fn() -> c_int;

/// Whether the application's change of `entry` is kept away from a pinned variable (and
/// says so once per call).
fn keeps_pinned(what: &str, entry: *const c_char) -> bool {
    guarded(what, false, || {
        if entry.is_null() {
            return false;
        }
        // SAFETY: non-null NUL-terminated string from the caller.
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
    })
}

/// # Safety
/// As libc's `setenv`.
pub unsafe extern "C" fn setenv(
    name: *const c_char,
    value: *const c_char,
    overwrite: c_int,
) -> c_int {
    if keeps_pinned("setenv", name) {
        return 0;
    }
    match real_fn::<SetenvFn>(0, Sym::Setenv) {
        // SAFETY: libc's setenv with the caller's arguments.
        Some(real) => unsafe { real(name, value, overwrite) },
        None => -1,
    }
}

/// # Safety
/// As libc's `putenv`.
pub unsafe extern "C" fn putenv(entry: *mut c_char) -> c_int {
    if keeps_pinned("putenv", entry) {
        return 0;
    }
    match real_fn::<PutenvFn>(0, Sym::Putenv) {
        // SAFETY: libc's putenv with the caller's argument.
        Some(real) => unsafe { real(entry) },
        None => -1,
    }
}

/// # Safety
/// As libc's `unsetenv`.
pub unsafe extern "C" fn unsetenv(name: *const c_char) -> c_int {
    if keeps_pinned("unsetenv", name) {
        return 0;
    }
    match real_fn::<UnsetenvFn>(0, Sym::Unsetenv) {
        // SAFETY: libc's unsetenv with the caller's argument.
        Some(real) => unsafe { real(name) },
        None => -1,
    }
}

/// `clearenv`, then the pinned values back.
///
/// # Safety
/// As libc's `clearenv`.
pub unsafe extern "C" fn clearenv() -> c_int {
    let code = match real_fn::<ClearenvFn>(0, Sym::Clearenv) {
        // SAFETY: libc's clearenv.
        Some(real) => unsafe { real() },
        None => return -1,
    };
    guarded("clearenv", (), crate::pinned_env::apply_to_environ);
    code
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
