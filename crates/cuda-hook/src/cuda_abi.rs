//! The bits of `cuda.h` and `nvml.h` the hook needs.

#![allow(dead_code)]

use std::ffi::{c_int, c_uint, c_void};

pub type CuResult = c_int;
pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
/// Returned when the real driver cannot be found (never a non-CUDA code).
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
/// `CUDA_ERROR_UNKNOWN`: what a free, query or launch that failed inside the hook answers.
pub const CUDA_ERROR_UNKNOWN: CuResult = 999;

pub const NVML_SUCCESS: c_int = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
pub const NVML_ERROR_NOT_FOUND: c_int = 6;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: c_int = 12;
/// `NVML_ERROR_UNKNOWN`: what a memory query that failed inside the hook answers.
pub const NVML_ERROR_UNKNOWN: c_int = 999;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_DEVICE: c_int = 1;

/// Head of `CUmemAllocationProp`.
#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// Head of `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: *mut c_void,
}

#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}
