//! The wrappers handed to callers outside the HIP runtime. Each reserves before the real
//! allocation and releases on failure, frees return bytes to the allocating device, and the
//! memory queries report the limit. Nothing here may panic into C: every wrapper's whole body
//! runs in [`guarded`](crate::ffi_guard::guarded) with its fallback (allocations: out of
//! memory; frees and queries: `hipErrorUnknown`; `hipGetProcAddress`: `hipErrorNotFound`;
//! environment changes: refused),
//! and the few inner guards keep the real call's answer once the real call has run.
//!
//! Every wrapper is an `unsafe extern "C" fn` whose contract is the HIP (or libc) function of
//! the same name; the helpers that read or write through a caller's pointer are `unsafe fn`s
//! that say which pointer must be valid for what.
//!
//! | module | family |
//! |---|---|
//! | `books` | reserve, settle, free: the accounting every wrapper shares; the free-wrapper macro |
//! | `linear` | `hipMalloc` and its flavours, pitched and 3-D allocations, `hipFree(Async)` |
//! | `arrays` | arrays and mipmapped arrays (runtime and driver API) and their frees |
//! | `pools` | virtual memory, memory pools, graph memory nodes |
//! | `queries` | `hipMemGetInfo`, device properties and attributes: the limit reported |
//! | `proc_address` | `hipGetProcAddress`: looked-up entry points swapped for wrappers |
//! | `env_calls` | pinned `getenv`, the filtered `setenv` family |
#![allow(non_snake_case)]

mod arrays;
mod books;
mod env_calls;
mod linear;
mod pools;
mod proc_address;
mod queries;

use std::ffi::c_int;

use arrays::*;
use env_calls::*;
use linear::*;
use pools::*;
use proc_address::*;
use queries::*;

use crate::hip_abi::*;
use crate::symbols::{MAX_RUNTIMES, Sym, real};

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
