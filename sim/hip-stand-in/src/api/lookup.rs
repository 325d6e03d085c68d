//! Error names and entry-point lookup (`hipGetProcAddress`).

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::abi::*;

use super::*;

#[unsafe(no_mangle)]
pub extern "C" fn hipGetErrorName(code: HipError) -> *const c_char {
    error_name(code).as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetErrorString(code: HipError) -> *const c_char {
    error_name(code).as_ptr()
}

/// Every entry point `hipGetProcAddress` hands out.
pub(super) fn exported(name: &[u8]) -> Option<usize> {
    let address = match name {
        b"hipInit" => hipInit as *const () as usize,
        b"hipGetDeviceCount" => hipGetDeviceCount as *const () as usize,
        b"hipSetDevice" => hipSetDevice as *const () as usize,
        b"hipModuleLaunchKernel" => hipModuleLaunchKernel as *const () as usize,
        b"hipGetDevice" => hipGetDevice as *const () as usize,
        b"hipDeviceTotalMem" => hipDeviceTotalMem as *const () as usize,
        b"hipDeviceGetAttribute" => hipDeviceGetAttribute as *const () as usize,
        b"hipGetDeviceProperties" => hipGetDevicePropertiesR0600 as *const () as usize,
        b"hipGetDevicePropertiesR0600" => hipGetDevicePropertiesR0600 as *const () as usize,
        b"hipMemGetInfo" => hipMemGetInfo as *const () as usize,
        b"hipMalloc" => hipMalloc as *const () as usize,
        b"hipExtMallocWithFlags" => hipExtMallocWithFlags as *const () as usize,
        b"hipMallocManaged" => hipMallocManaged as *const () as usize,
        b"hipMallocAsync" => hipMallocAsync as *const () as usize,
        b"hipMallocPitch" => hipMallocPitch as *const () as usize,
        b"hipMalloc3D" => hipMalloc3D as *const () as usize,
        b"hipFree" => hipFree as *const () as usize,
        b"hipFreeAsync" => hipFreeAsync as *const () as usize,
        b"hipMallocArray" => hipMallocArray as *const () as usize,
        b"hipMalloc3DArray" => hipMalloc3DArray as *const () as usize,
        b"hipFreeArray" => hipFreeArray as *const () as usize,
        b"hipMemCreate" => hipMemCreate as *const () as usize,
        b"hipMemRelease" => hipMemRelease as *const () as usize,
        b"hipMallocFromPoolAsync" => hipMallocFromPoolAsync as *const () as usize,
        b"hipDeviceGetDefaultMemPool" => hipDeviceGetDefaultMemPool as *const () as usize,
        b"hipMemPoolCreate" => hipMemPoolCreate as *const () as usize,
        b"hipMemPoolDestroy" => hipMemPoolDestroy as *const () as usize,
        b"hipGetProcAddress" => hipGetProcAddress as *const () as usize,
        b"hipMemAllocPitch" => hipMemAllocPitch as *const () as usize,
        b"hipArrayCreate" => hipArrayCreate as *const () as usize,
        b"hipArray3DCreate" => hipArray3DCreate as *const () as usize,
        b"hipArrayDestroy" => hipArrayDestroy as *const () as usize,
        b"hipMallocMipmappedArray" => hipMallocMipmappedArray as *const () as usize,
        b"hipFreeMipmappedArray" => hipFreeMipmappedArray as *const () as usize,
        b"hipMipmappedArrayCreate" => hipMipmappedArrayCreate as *const () as usize,
        b"hipMipmappedArrayDestroy" => hipMipmappedArrayDestroy as *const () as usize,
        b"hipGraphAddMemAllocNode" => hipGraphAddMemAllocNode as *const () as usize,
        _ => return None,
    };
    Some(address)
}

/// `hipGetProcAddress(symbol, pfn, hipVersion, flags, symbolStatus)`.
#[unsafe(no_mangle)]
pub extern "C" fn hipGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _hip_version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> HipError {
    entry(|_| {
        if symbol.is_null() || pfn.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null NUL-terminated symbol name from the caller.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        let found = exported(name);
        if !status.is_null() {
            let code = if found.is_some() {
                PROC_ADDRESS_SUCCESS
            } else {
                PROC_ADDRESS_SYMBOL_NOT_FOUND
            };
            put(status, code)?;
        }
        put(pfn, found.unwrap_or(0) as *mut c_void)?;
        found.map(drop).ok_or(HIP_ERROR_NOT_FOUND)
    })
}
