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
use crate::sizing::{array_bytes, pitched_estimate};
use crate::state::{ProcessState, state};
use crate::symbols::{Sym, note_real, real};
use crate::tracker::{Record, Space};

/// The real function of `sym` as a typed pointer.
fn real_fn<F: Copy>(sym: Sym) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<usize>()) };
    let address = real(sym)?;
    // SAFETY: F is the C function-pointer type of `sym` (see hip_abi), and the address is
    // the runtime's (or libc's) definition of that symbol.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
}

fn current_device() -> Result<usize, HipError> {
    let get_device: GetDeviceFn = real_fn(Sym::HipGetDevice).ok_or(HIP_ERROR_NOT_INITIALIZED)?;
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
            None => match current_device() {
                Ok(device) => device,
                Err(code) => return code,
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

/// Runs the real free, then returns the bytes if it succeeded.
fn freed(what: &str, space: Space, address: usize, free: impl FnOnce() -> HipError) -> HipError {
    let code = free();
    if code == HIP_SUCCESS && address != 0 {
        guarded(what, (), || {
            let state = state();
            let record = state.tracker().remove(space, address);
            if let (Some(record), Some(session)) = (record, &state.session) {
                session.release(record.device, record.bytes);
            }
        });
    }
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
        what,
        device,
        size as u64,
        Space::Pointer,
        || call_ok(call(), out_address(ptr), size as u64),
        |_| {},
    )
}

// --- Linear allocations ---

pub extern "C" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError {
    let oversubscribe = guarded("hipMalloc", false, || state().config.oversubscribe);
    if oversubscribe {
        let Some(managed) = real_fn::<MallocFlagsFn>(Sym::HipMallocManaged) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: real hipMallocManaged with the caller's arguments.
        return linear("hipMalloc", None, ptr, size, || unsafe {
            managed(ptr, size, MEM_ATTACH_GLOBAL)
        });
    }
    let Some(real) = real_fn::<MallocFn>(Sym::HipMalloc) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear("hipMalloc", None, ptr, size, || unsafe { real(ptr, size) })
}

pub extern "C" fn hipExtMallocWithFlags(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MallocFlagsFn>(Sym::HipExtMallocWithFlags) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear("hipExtMallocWithFlags", None, ptr, size, || unsafe {
        real(ptr, size, flags)
    })
}

pub extern "C" fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> HipError {
    let Some(real) = real_fn::<MallocFlagsFn>(Sym::HipMallocManaged) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear("hipMallocManaged", None, ptr, size, || unsafe {
        real(ptr, size, flags)
    })
}

pub extern "C" fn hipMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    stream: *mut c_void,
) -> HipError {
    let Some(real) = real_fn::<MallocStreamFn>(Sym::HipMallocAsync) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    linear("hipMallocAsync", None, ptr, size, || unsafe {
        real(ptr, size, stream)
    })
}

pub extern "C" fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> HipError {
    let Some(real) = real_fn::<MallocPoolFn>(Sym::HipMallocFromPoolAsync) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // A pool we did not see created is taken to be on the current device.
    let device = guarded("hipMallocFromPoolAsync", None, || {
        state().tracker().pool_device(pool as usize)
    });
    // SAFETY: the real function with the caller's arguments.
    linear("hipMallocFromPoolAsync", device, ptr, size, || unsafe {
        real(ptr, size, pool, stream)
    })
}

pub extern "C" fn hipMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    let Some(real) = real_fn::<MallocPitchFn>(Sym::HipMallocPitch) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    if ptr.is_null() || pitch.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    let Some(estimate) = pitched_estimate(width as u64, height as u64) else {
        return HIP_ERROR_OUT_OF_MEMORY;
    };
    accounted(
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
        undo_linear,
    )
}

pub extern "C" fn hipMalloc3D(pitched: *mut HipPitchedPtr, extent: HipExtent) -> HipError {
    let Some(real) = real_fn::<Malloc3DFn>(Sym::HipMalloc3D) else {
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
        undo_linear,
    )
}

/// Frees a pitched allocation that does not fit once its real size is known.
fn undo_linear(address: usize) {
    if let Some(free) = real_fn::<FreeFn>(Sym::HipFree) {
        // SAFETY: the real hipFree on the allocation the real call just made.
        unsafe { free(address as *mut c_void) };
    }
}

pub extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeFn>(Sym::HipFree) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's argument.
    freed("hipFree", Space::Pointer, ptr as usize, || unsafe {
        real(ptr)
    })
}

pub extern "C" fn hipFreeAsync(ptr: *mut c_void, stream: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeStreamFn>(Sym::HipFreeAsync) else {
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

pub extern "C" fn hipMallocArray(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<MallocArrayFn>(Sym::HipMallocArray) else {
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

pub extern "C" fn hipMalloc3DArray(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    flags: c_uint,
) -> HipError {
    let Some(real) = real_fn::<Malloc3DArrayFn>(Sym::HipMalloc3DArray) else {
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

pub extern "C" fn hipFreeArray(array: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeFn>(Sym::HipFreeArray) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's argument.
    freed("hipFreeArray", Space::Array, array as usize, || unsafe {
        real(array)
    })
}

// --- Virtual memory and pools ---

fn location_id(props: *const c_void) -> Option<usize> {
    if props.is_null() {
        return None;
    }
    // SAFETY: hipMemAllocationProp and hipMemPoolProps both hold location.id (an int) at
    // LOCATION_ID; the caller passed one of them.
    let id = unsafe {
        props
            .cast::<u8>()
            .add(LOCATION_ID)
            .cast::<c_int>()
            .read_unaligned()
    };
    usize::try_from(id).ok()
}

pub extern "C" fn hipMemCreate(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> HipError {
    let Some(real) = real_fn::<MemCreateFn>(Sym::HipMemCreate) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    let Some(device) = location_id(prop) else {
        // SAFETY: the real function with the caller's arguments (it rejects them).
        return unsafe { real(handle, size, prop, flags) };
    };
    if handle.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    accounted(
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

pub extern "C" fn hipMemRelease(handle: *mut c_void) -> HipError {
    let Some(real) = real_fn::<FreeFn>(Sym::HipMemRelease) else {
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

pub extern "C" fn hipMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) -> HipError {
    let Some(real) = real_fn::<PoolCreateFn>(Sym::HipMemPoolCreate) else {
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

pub extern "C" fn hipDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) -> HipError {
    let Some(real) = real_fn::<DefaultPoolFn>(Sym::HipDeviceGetDefaultMemPool) else {
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

pub extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    let Some(real) = real_fn::<MemGetInfoFn>(Sym::HipMemGetInfo) else {
        return HIP_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the real function with the caller's arguments.
    let code = unsafe { real(free, total) };
    if code != HIP_SUCCESS || free.is_null() || total.is_null() {
        return code;
    }
    guarded("hipMemGetInfo", code, || {
        let state = state();
        let Ok(device) = current_device() else {
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

pub extern "C" fn hipGetDevicePropertiesR0600(props: *mut c_void, device: c_int) -> HipError {
    let Some(real) = real_fn::<PropsFn>(Sym::HipGetDevicePropertiesR0600) else {
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

pub extern "C" fn hipGetDeviceProperties(props: *mut c_void, device: c_int) -> HipError {
    let Some(real) = real_fn::<PropsFn>(Sym::HipGetDeviceProperties) else {
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

pub extern "C" fn hipDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    device: c_int,
) -> HipError {
    let Some(real) = real_fn::<AttributeFn>(Sym::HipDeviceGetAttribute) else {
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

pub extern "C" fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> HipError {
    let Some(real) = real_fn::<TotalMemFn>(Sym::HipDeviceTotalMem) else {
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

pub extern "C" fn hipGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    hip_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> HipError {
    let Some(real) = real_fn::<ProcAddressFn>(Sym::HipGetProcAddress) else {
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
            note_real(sym, found);
            if let Some(wrapper) = wrapper_address(sym) {
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
        match real_fn::<GetenvFn>(sym) {
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

/// The wrapper callers get for `sym`.
pub fn wrapper_address(sym: Sym) -> Option<usize> {
    let address = match sym {
        Sym::HipMalloc => hipMalloc as *const () as usize,
        Sym::HipFree => hipFree as *const () as usize,
        Sym::HipMallocAsync => hipMallocAsync as *const () as usize,
        Sym::HipFreeAsync => hipFreeAsync as *const () as usize,
        Sym::HipMallocFromPoolAsync => hipMallocFromPoolAsync as *const () as usize,
        Sym::HipMalloc3D => hipMalloc3D as *const () as usize,
        Sym::HipMallocPitch => hipMallocPitch as *const () as usize,
        Sym::HipMallocArray => hipMallocArray as *const () as usize,
        Sym::HipMalloc3DArray => hipMalloc3DArray as *const () as usize,
        Sym::HipFreeArray => hipFreeArray as *const () as usize,
        Sym::HipMallocManaged => hipMallocManaged as *const () as usize,
        Sym::HipExtMallocWithFlags => hipExtMallocWithFlags as *const () as usize,
        Sym::HipMemCreate => hipMemCreate as *const () as usize,
        Sym::HipMemRelease => hipMemRelease as *const () as usize,
        Sym::HipMemPoolCreate => hipMemPoolCreate as *const () as usize,
        Sym::HipDeviceGetDefaultMemPool => hipDeviceGetDefaultMemPool as *const () as usize,
        Sym::HipMemGetInfo => hipMemGetInfo as *const () as usize,
        Sym::HipGetDeviceProperties => hipGetDeviceProperties as *const () as usize,
        Sym::HipGetDevicePropertiesR0600 => hipGetDevicePropertiesR0600 as *const () as usize,
        Sym::HipDeviceGetAttribute => hipDeviceGetAttribute as *const () as usize,
        Sym::HipDeviceTotalMem => hipDeviceTotalMem as *const () as usize,
        Sym::HipGetProcAddress => hipGetProcAddress as *const () as usize,
        Sym::Getenv => getenv as *const () as usize,
        Sym::SecureGetenv => secure_getenv as *const () as usize,
        Sym::HipGetDevice => return None,
    };
    Some(address)
}
