//! HIP's C ABI as far as the stand-in speaks it: error codes, enum values and structs, with
//! the values and layouts of ROCm 6 (`hip_runtime_api.h`).

use std::ffi::c_int;

pub type HipError = c_int;
pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub const HIP_ERROR_INVALID_DEVICE_POINTER: HipError = 17;
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
pub const HIP_ERROR_INVALID_DEVICE: HipError = 101;
pub const HIP_ERROR_INVALID_HANDLE: HipError = 400;
pub const HIP_ERROR_NOT_FOUND: HipError = 500;
pub const HIP_ERROR_UNKNOWN: HipError = 999;

/// `hipDeviceAttributeMultiprocessorCount`.
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
/// `hipDeviceAttributeTotalGlobalMem`.
pub const ATTR_TOTAL_GLOBAL_MEM: c_int = 84;

/// `hipDriverProcAddressQueryResult`.
pub const PROC_ADDRESS_SUCCESS: c_int = 0;
pub const PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;

/// `hipDeviceProp_tR0600` field offsets (name[256], uuid[16], luid[8], mask u32, then
/// totalGlobalMem aligned to 8).
pub const R0600_TOTAL_GLOBAL_MEM: usize = 288;
pub const R0600_MULTIPROCESSOR_COUNT: usize = 388;
/// Legacy `hipDeviceProp_tR0000` (`hipGetDeviceProperties` symbol): name[256], then
/// totalGlobalMem.
pub const R0000_TOTAL_GLOBAL_MEM: usize = 256;
pub const R0000_MULTIPROCESSOR_COUNT: usize = 336;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HipExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

#[repr(C)]
pub struct HipPitchedPtr {
    pub ptr: *mut std::ffi::c_void,
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

#[repr(C)]
pub struct HipMemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `hipMemAllocationProp`.
#[repr(C)]
pub struct HipMemAllocationProp {
    pub kind: c_int,
    pub requested_handle_type: c_int,
    pub location: HipMemLocation,
    pub win32_handle_meta_data: *mut std::ffi::c_void,
    pub alloc_flags: [u8; 4],
}

/// ROCm 5's `hipMemAllocationProp` (`hip_runtime_api.h` of 5.2.3).
#[repr(C)]
pub struct HipMemAllocationPropR5 {
    pub compression_type: u8,
    pub location: HipMemLocation,
    pub requested_handle_type: c_int,
    pub kind: c_int,
    pub usage: u16,
    pub win32_handle_meta_data: *mut std::ffi::c_void,
}

/// `HIP_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct HipArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub channels: std::ffi::c_uint,
}

/// `HIP_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct HipArray3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub channels: std::ffi::c_uint,
    pub flags: std::ffi::c_uint,
}

/// Bytes per channel of `hipArray_Format` (`HIP_AD_FORMAT_*`).
pub fn format_bytes(format: c_int) -> Option<usize> {
    match format {
        0x01 | 0x08 => Some(1),
        0x02 | 0x09 | 0x10 => Some(2),
        0x03 | 0x0a | 0x20 => Some(4),
        _ => None,
    }
}

/// `hipMemPoolProps`.
#[repr(C)]
pub struct HipMemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: HipMemLocation,
    pub win32_security_attributes: *mut std::ffi::c_void,
    pub max_size: usize,
    pub reserved: [u8; 56],
}

const _: () = {
    assert!(size_of::<HipExtent>() == 24);
    assert!(size_of::<HipPitchedPtr>() == 32);
    assert!(size_of::<HipChannelFormatDesc>() == 20);
    assert!(std::mem::offset_of!(HipMemAllocationProp, location) == 8);
    assert!(std::mem::offset_of!(HipMemAllocationPropR5, location) == 4);
    assert!(size_of::<HipMemAllocationPropR5>() == 32);
    assert!(std::mem::offset_of!(HipMemPoolProps, location) == 8);
    assert!(size_of::<HipMemPoolProps>() == 88);
};

/// `hipGetErrorName` text.
pub fn error_name(code: HipError) -> &'static std::ffi::CStr {
    match code {
        HIP_SUCCESS => c"hipSuccess",
        HIP_ERROR_INVALID_VALUE => c"hipErrorInvalidValue",
        HIP_ERROR_OUT_OF_MEMORY => c"hipErrorOutOfMemory",
        HIP_ERROR_INVALID_DEVICE_POINTER => c"hipErrorInvalidDevicePointer",
        HIP_ERROR_NO_DEVICE => c"hipErrorNoDevice",
        HIP_ERROR_INVALID_DEVICE => c"hipErrorInvalidDevice",
        HIP_ERROR_INVALID_HANDLE => c"hipErrorInvalidHandle",
        HIP_ERROR_NOT_FOUND => c"hipErrorNotFound",
        _ => c"hipErrorUnknown",
    }
}
