//! Virtual memory (`hipMemCreate`/`hipMemRelease`), memory pools (whose device later pool
//! allocations are charged to), and graph memory nodes (refused on a limited device): the
//! calls whose device is read from a caller's properties struct.

use std::ffi::{c_int, c_void};

use hami_region::layout::LIMIT_NONE;

use super::books::{accounted, call_ok, free_wrapper, out_address};
use super::real_fn;
use crate::ffi_guard::guarded;
use crate::hip_abi::*;

use crate::state::state;
use crate::symbols::{MAX_RUNTIMES, Sym};
use crate::tracker::Space;

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

free_wrapper!(hipMemRelease, FreeFn, HipMemRelease, Physical, (handle: *mut c_void));

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
