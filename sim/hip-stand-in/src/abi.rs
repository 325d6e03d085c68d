//! HIP's C ABI as far as the stand-in speaks it: error codes, enum values and structs, with
//! the values and layouts of ROCm 6 (`hip_runtime_api.h`).

use std::ffi::c_int;

/// `hipError_t`: the status every HIP call returns.
pub type HipError = c_int;
/// `hipSuccess`.
pub const HIP_SUCCESS: HipError = 0;
/// `hipErrorInvalidValue`: a null pointer, bad flag or size.
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
/// `hipErrorOutOfMemory`: the device has not got the bytes, or a size overflows.
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
/// `hipErrorInvalidDevicePointer`: freeing a pointer that is not a live linear allocation.
pub const HIP_ERROR_INVALID_DEVICE_POINTER: HipError = 17;
/// `hipErrorNoDevice`: the stand-in could not start (bad configuration), or has no devices.
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipErrorInvalidDevice`: an ordinal past the visible devices.
pub const HIP_ERROR_INVALID_DEVICE: HipError = 101;
/// `hipErrorInvalidHandle`: freeing an array, mipmapped array or physical-memory handle
/// that is not live.
pub const HIP_ERROR_INVALID_HANDLE: HipError = 400;
/// `hipErrorNotFound`: a symbol lookup (`hipGetProcAddress`) that finds nothing.
pub const HIP_ERROR_NOT_FOUND: HipError = 500;
/// `hipErrorUnknown`: what a call returns if it panicked (caught before the FFI boundary).
pub const HIP_ERROR_UNKNOWN: HipError = 999;

/// `hipDeviceAttributeMultiprocessorCount`.
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
/// `hipDeviceAttributeTotalGlobalMem`.
pub const ATTR_TOTAL_GLOBAL_MEM: c_int = 84;

/// `hipDriverProcAddressQueryResult`.
pub const PROC_ADDRESS_SUCCESS: c_int = 0;
/// `HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;

/// `hipDeviceProp_tR0600` field offsets (`name[256]`, `uuid[16]`, `luid[8]`, mask u32, then
/// `totalGlobalMem` aligned to 8).
pub const R0600_TOTAL_GLOBAL_MEM: usize = 288;
/// Offset of `multiProcessorCount` in `hipDeviceProp_tR0600`.
pub const R0600_MULTIPROCESSOR_COUNT: usize = 388;
/// Legacy `hipDeviceProp_tR0000` (`hipGetDeviceProperties` symbol): `name[256]`, then
/// `totalGlobalMem`.
pub const R0000_TOTAL_GLOBAL_MEM: usize = 256;
/// Offset of `multiProcessorCount` in `hipDeviceProp_tR0000`.
pub const R0000_MULTIPROCESSOR_COUNT: usize = 336;

/// `hipExtent`: the size of a 3D allocation or copy.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HipExtent {
    /// Bytes per row for linear memory, elements for arrays.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Slices.
    pub depth: usize,
}

/// `hipPitchedPtr`: a pitched 3D allocation as `hipMalloc3D` returns it.
#[repr(C)]
pub struct HipPitchedPtr {
    /// The allocation's device address.
    pub ptr: *mut std::ffi::c_void,
    /// Bytes per row, padding included.
    pub pitch: usize,
    /// The requested width (`hipExtent::width`, bytes).
    pub xsize: usize,
    /// The requested height in rows.
    pub ysize: usize,
}

/// `hipChannelFormatDesc`: an array element's format.
#[repr(C)]
pub struct HipChannelFormatDesc {
    /// Bits of the first component.
    pub x: c_int,
    /// Bits of the second component.
    pub y: c_int,
    /// Bits of the third component.
    pub z: c_int,
    /// Bits of the fourth component.
    pub w: c_int,
    /// `hipChannelFormatKind` (signed, unsigned, float, none).
    pub f: c_int,
}

/// `hipMemLocation`: where virtual-memory and pool allocations live.
#[repr(C)]
pub struct HipMemLocation {
    /// `hipMemLocationType` (1 = device).
    pub kind: c_int,
    /// The device ordinal, for a device location.
    pub id: c_int,
}

/// `hipMemAllocationProp`.
#[repr(C)]
pub struct HipMemAllocationProp {
    /// `hipMemAllocationType` (1 = pinned).
    pub kind: c_int,
    /// `hipMemAllocationHandleType` an exportable handle needs (0 = none).
    pub requested_handle_type: c_int,
    /// The device the memory is created on.
    pub location: HipMemLocation,
    /// Windows only; ignored.
    pub win32_handle_meta_data: *mut std::ffi::c_void,
    /// `allocFlags`: compression type, RDMA capability and usage bytes, unused here.
    pub alloc_flags: [u8; 4],
}

/// ROCm 5's `hipMemAllocationProp` (`hip_runtime_api.h` of 5.2.3).
#[repr(C)]
pub struct HipMemAllocationPropR5 {
    /// `compressionType`, unused here.
    pub compression_type: u8,
    /// The device the memory is created on (at offset 4 in ROCm 5, 8 in 6).
    pub location: HipMemLocation,
    /// `hipMemAllocationHandleType` (0 = none).
    pub requested_handle_type: c_int,
    /// `hipMemAllocationType` (1 = pinned).
    pub kind: c_int,
    /// `usage` flags, unused here.
    pub usage: u16,
    /// Windows only; ignored.
    pub win32_handle_meta_data: *mut std::ffi::c_void,
}

/// `HIP_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct HipArrayDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height in elements (0 for a 1D array).
    pub height: usize,
    /// `hipArray_Format` of each channel (`HIP_AD_FORMAT_*`, see [`format_bytes`]).
    pub format: c_int,
    /// Channels per element (1, 2 or 4).
    pub channels: std::ffi::c_uint,
}

/// `HIP_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct HipArray3DDescriptor {
    /// Width in elements.
    pub width: usize,
    /// Height in elements (0 for 1D).
    pub height: usize,
    /// Depth in elements (0 for 1D and 2D).
    pub depth: usize,
    /// `hipArray_Format` of each channel (`HIP_AD_FORMAT_*`, see [`format_bytes`]).
    pub format: c_int,
    /// Channels per element (1, 2 or 4).
    pub channels: std::ffi::c_uint,
    /// `hipArray*` flags (layered, surface load/store, ...).
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
    /// `hipMemAllocationType` of the pool's blocks (1 = pinned).
    pub alloc_type: c_int,
    /// `hipMemAllocationHandleType`s the pool may export (0 = none).
    pub handle_types: c_int,
    /// The device the pool allocates on.
    pub location: HipMemLocation,
    /// Windows only; ignored.
    pub win32_security_attributes: *mut std::ffi::c_void,
    /// Largest size the pool may reach (0: the system's default).
    pub max_size: usize,
    /// Reserved bytes of the C struct (to be zero; not checked here).
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
