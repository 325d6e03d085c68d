//! The parts of HIP's C ABI (ROCm 6 `hip_runtime_api.h`) the wrappers read or write.

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type HipError = c_int;
pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub const HIP_ERROR_NOT_INITIALIZED: HipError = 3;

/// `hipDeviceAttributeTotalGlobalMem`.
pub const ATTR_TOTAL_GLOBAL_MEM: c_int = 84;
/// `hipMemAttachGlobal`, for managed allocations under `HIP_OVERSUBSCRIBE`.
pub const MEM_ATTACH_GLOBAL: c_uint = 1;

/// Offset of `totalGlobalMem` in `hipDeviceProp_tR0600` (after name[256], uuid[16],
/// luid[8], luidDeviceNodeMask, aligned to 8).
pub const R0600_TOTAL_GLOBAL_MEM: usize = 288;
/// Offset of `totalGlobalMem` in the legacy `hipDeviceProp_tR0000` (after name[256]).
pub const R0000_TOTAL_GLOBAL_MEM: usize = 256;
/// Offset of `location.id` in `hipMemAllocationProp` and in `hipMemPoolProps`.
pub const LOCATION_ID: usize = 12;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HipExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

#[repr(C)]
pub struct HipPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

#[repr(C)]
pub struct HipChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: c_int,
}

pub type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError;
pub type MallocFlagsFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError;
pub type MallocStreamFn = unsafe extern "C" fn(*mut *mut c_void, usize, *mut c_void) -> HipError;
pub type MallocPoolFn =
    unsafe extern "C" fn(*mut *mut c_void, usize, *mut c_void, *mut c_void) -> HipError;
pub type Malloc3DFn = unsafe extern "C" fn(*mut HipPitchedPtr, HipExtent) -> HipError;
pub type MallocPitchFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> HipError;
pub type MallocArrayFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *const HipChannelFormatDesc,
    usize,
    usize,
    c_uint,
) -> HipError;
pub type Malloc3DArrayFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *const HipChannelFormatDesc,
    HipExtent,
    c_uint,
) -> HipError;
pub type FreeFn = unsafe extern "C" fn(*mut c_void) -> HipError;
pub type FreeStreamFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> HipError;
pub type MemCreateFn =
    unsafe extern "C" fn(*mut *mut c_void, usize, *const c_void, u64) -> HipError;
pub type PoolCreateFn = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> HipError;
pub type DefaultPoolFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> HipError;
pub type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> HipError;
pub type PropsFn = unsafe extern "C" fn(*mut c_void, c_int) -> HipError;
pub type AttributeFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError;
pub type TotalMemFn = unsafe extern "C" fn(*mut usize, c_int) -> HipError;
pub type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> HipError;
pub type ProcAddressFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> HipError;
pub type GetenvFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;

const _: () = {
    assert!(size_of::<HipExtent>() == 24);
    assert!(size_of::<HipPitchedPtr>() == 32);
    assert!(size_of::<HipChannelFormatDesc>() == 20);
};
