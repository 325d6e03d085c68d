//! The parts of HIP's C ABI (ROCm 6 `hip_runtime_api.h`) the wrappers read or write.

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type HipError = c_int;
pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub const HIP_ERROR_NOT_INITIALIZED: HipError = 3;
/// `hipErrorNotFound`: what a lookup that failed inside the hook answers.
pub const HIP_ERROR_NOT_FOUND: HipError = 500;
/// `hipErrorUnknown`: what a free or query that failed inside the hook answers.
pub const HIP_ERROR_UNKNOWN: HipError = 999;

/// `hipDeviceAttributeTotalGlobalMem`.
pub const ATTR_TOTAL_GLOBAL_MEM: c_int = 84;
/// `hipMemAttachGlobal`, for managed allocations under `HIP_OVERSUBSCRIBE`.
pub const MEM_ATTACH_GLOBAL: c_uint = 1;

/// Offset of `totalGlobalMem` in `hipDeviceProp_tR0600` (after name[256], uuid[16],
/// luid[8], luidDeviceNodeMask, aligned to 8).
pub const R0600_TOTAL_GLOBAL_MEM: usize = 288;
/// Offset of `totalGlobalMem` in the legacy `hipDeviceProp_tR0000` (after name[256]).
pub const R0000_TOTAL_GLOBAL_MEM: usize = 256;
/// Offset of `location.id` in `hipMemPoolProps` (`allocType`, `handleTypes`, `location`):
/// the same in ROCm 5.1+ and 6.x.
pub const POOL_LOCATION_ID: usize = 12;

/// `hipRuntimeGetVersion` of ROCm 6.0 (`major * 10^7 + minor * 10^5 + patch`).
pub const ROCM_6_0: c_int = 60_000_000;
/// `hipRuntimeGetVersion` of ROCm 5.1, the first with `hipMemCreate`.
pub const ROCM_5_1: c_int = 50_100_000;

/// Offset of `location.id` in `hipMemAllocationProp` of the runtime whose
/// `hipRuntimeGetVersion` is `version`; `None` for a runtime without `hipMemCreate`.
///
/// - ROCm 5.x (`hip_runtime_api.h` of 5.2.3): `unsigned char compressionType;
///   hipMemLocation location; hipMemAllocationHandleType requestedHandleType;
///   hipMemAllocationType type; unsigned short usage; void* win32HandleMetaData;` →
///   `location` at 4, `location.id` at **8** (checked against the real 5.2 header by
///   `tests/it/real_runtime.rs`).
/// - ROCm 6.x (CUDA's order): `type; requestedHandleType; location; win32HandleMetaData;
///   allocFlags` → `location` at 8, `location.id` at **12**.
pub fn allocation_prop_location_id(version: c_int) -> Option<usize> {
    if version >= ROCM_6_0 {
        Some(12)
    } else if version >= ROCM_5_1 {
        Some(8)
    } else {
        None
    }
}

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

/// `HIP_ARRAY_DESCRIPTOR` (driver API).
#[repr(C)]
pub struct HipArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub channels: c_uint,
}

/// `HIP_ARRAY3D_DESCRIPTOR` (driver API).
#[repr(C)]
pub struct HipArray3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `hipErrorNotSupported`: what a refused graph memory node returns.
pub const HIP_ERROR_NOT_SUPPORTED: HipError = 801;

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
pub type RuntimeVersionFn = unsafe extern "C" fn(*mut c_int) -> HipError;
pub type ProcAddressFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> HipError;
pub type MemAllocPitchFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize, c_uint) -> HipError;
pub type ArrayCreateFn =
    unsafe extern "C" fn(*mut *mut c_void, *const HipArrayDescriptor) -> HipError;
pub type Array3DCreateFn =
    unsafe extern "C" fn(*mut *mut c_void, *const HipArray3DDescriptor) -> HipError;
pub type MallocMipmappedFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *const HipChannelFormatDesc,
    HipExtent,
    c_uint,
    c_uint,
) -> HipError;
pub type MipmappedCreateFn =
    unsafe extern "C" fn(*mut *mut c_void, *const HipArray3DDescriptor, c_uint) -> HipError;
pub type GraphAddMemAllocFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    usize,
    *mut c_void,
) -> HipError;
pub type GetenvFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;

const _: () = {
    assert!(size_of::<HipExtent>() == 24);
    assert!(size_of::<HipPitchedPtr>() == 32);
    assert!(size_of::<HipChannelFormatDesc>() == 20);
    assert!(size_of::<HipArrayDescriptor>() == 24);
    assert!(size_of::<HipArray3DDescriptor>() == 40);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_prop_layout_follows_the_runtime_version() {
        assert_eq!(allocation_prop_location_id(50_221_153), Some(8)); // Debian's 5.2.3
        assert_eq!(allocation_prop_location_id(50_100_000), Some(8));
        assert_eq!(allocation_prop_location_id(50_731_921), Some(8));
        assert_eq!(allocation_prop_location_id(60_000_000), Some(12));
        assert_eq!(allocation_prop_location_id(60_443_483), Some(12));
        assert_eq!(allocation_prop_location_id(50_000_000), None);
        assert_eq!(allocation_prop_location_id(-1), None);
    }
}
