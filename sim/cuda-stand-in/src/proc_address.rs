//! `cuGetProcAddress` / `_v2` as the driver does it: the base name at a CUDA version picks a
//! versioned symbol (`cuMemAlloc` at ≥ 3.2 is `cuMemAlloc_v2`), and the per-thread default
//! stream flag picks the `_ptsz` variant of stream functions.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::api::*;
use crate::driver::{INVALID_VALUE, NOT_FOUND, SUCCESS};

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 2;
/// `CUdriverProcAddressQueryResult`.
const FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

/// (base name, first CUDA version of the `_v2` symbol).
const VERSIONED: &[(&str, c_int)] = &[
    ("cuMemAlloc", 3020),
    ("cuMemFree", 3020),
    ("cuMemAllocPitch", 3020),
    ("cuMemGetInfo", 3020),
    ("cuDeviceTotalMem", 3020),
    ("cuCtxCreate", 3020),
    ("cuArrayCreate", 3020),
    ("cuArray3DCreate", 3020),
    ("cuCtxDestroy", 4000),
    ("cuDevicePrimaryCtxRelease", 11000),
    ("cuDeviceGetUuid", 11040),
    ("cuGetProcAddress", 12000),
];

/// Functions with a per-thread-default-stream variant.
const PER_THREAD_NAMES: &[&str] = &[
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
    "cuGraphLaunch",
];

/// First CUDA version of each base name the stand-in has.
const INTRODUCED: &[(&str, c_int)] = &[
    ("cuMemAllocAsync", 11020),
    ("cuMemAllocFromPoolAsync", 11020),
    ("cuMemFreeAsync", 11020),
    ("cuMemCreate", 10020),
    ("cuMemRelease", 10020),
    ("cuLaunchKernelEx", 11080),
    ("cuGraphInstantiateWithFlags", 11040),
    ("cuGetProcAddress", 11030),
];

fn table() -> Vec<(&'static str, *const c_void)> {
    macro_rules! t {
        ($($f:ident),* $(,)?) => { vec![$((stringify!($f), $f as *const c_void)),*] };
    }
    t![
        cuInit,
        cuDriverGetVersion,
        cuDeviceGetCount,
        cuDeviceGet,
        cuDeviceGetName,
        cuDeviceGetUuid,
        cuDeviceGetUuid_v2,
        cuDeviceTotalMem_v2,
        cuDeviceGetAttribute,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2,
        cuCtxCreate_v2,
        cuCtxDestroy_v2,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxGetDevice,
        cuCtxSynchronize,
        cuMemAlloc_v2,
        cuMemAllocManaged,
        cuMemAllocPitch_v2,
        cuMemAllocAsync,
        cuMemAllocAsync_ptsz,
        cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz,
        cuMemFree_v2,
        cuMemFreeAsync,
        cuMemFreeAsync_ptsz,
        cuMemCreate,
        cuMemRelease,
        cuArrayCreate_v2,
        cuArray3DCreate_v2,
        cuArrayDestroy,
        cuMemGetInfo_v2,
        cuLaunchKernel,
        cuLaunchKernel_ptsz,
        cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz,
        cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz,
        cuGraphCreate,
        cuGraphInstantiateWithFlags,
        cuGraphLaunch,
        cuGraphLaunch_ptsz,
        cuGraphExecDestroy,
        cuGraphDestroy,
        cuGetErrorString,
        cuGetProcAddress,
        cuGetProcAddress_v2,
    ]
}

/// The symbol the driver hands out for `base` at `version` with `flags`.
pub fn resolve_name(base: &str, version: c_int, flags: u64) -> Result<String, c_int> {
    if let Some((_, since)) = INTRODUCED.iter().find(|(n, _)| *n == base)
        && version < *since
    {
        return Err(VERSION_NOT_SUFFICIENT);
    }
    if flags & PER_THREAD != 0 && PER_THREAD_NAMES.contains(&base) {
        return Ok(format!("{base}_ptsz"));
    }
    match VERSIONED.iter().find(|(n, _)| *n == base) {
        Some((_, since)) if version >= *since => Ok(format!("{base}_v2")),
        _ => Ok(base.to_owned()),
    }
}

fn lookup(symbol: *const c_char, version: c_int, flags: u64) -> Result<*const c_void, c_int> {
    if symbol.is_null() {
        return Err(SYMBOL_NOT_FOUND);
    }
    // SAFETY: non-null NUL-terminated name from the caller.
    let base = unsafe { CStr::from_ptr(symbol) }
        .to_str()
        .map_err(|_| SYMBOL_NOT_FOUND)?;
    let name = resolve_name(base, version, flags)?;
    table()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| f)
        .ok_or(SYMBOL_NOT_FOUND)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
) -> c_int {
    if pfn.is_null() {
        return INVALID_VALUE;
    }
    match lookup(symbol, version, flags) {
        Ok(f) => {
            // SAFETY: checked non-null.
            unsafe { pfn.write(f) };
            SUCCESS
        }
        Err(_) => {
            // SAFETY: checked non-null.
            unsafe { pfn.write(std::ptr::null()) };
            NOT_FOUND
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *const c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    if pfn.is_null() {
        return INVALID_VALUE;
    }
    let (code, state, f) = match lookup(symbol, version, flags) {
        Ok(f) => (SUCCESS, FOUND, f),
        Err(state) => (NOT_FOUND, state, std::ptr::null()),
    };
    // SAFETY: pfn checked non-null; status is optional (NULL allowed).
    unsafe {
        pfn.write(f);
        if !status.is_null() {
            status.write(state);
        }
    }
    code
}

#[cfg(test)]
#[path = "proc_address_tests.rs"]
mod tests;
