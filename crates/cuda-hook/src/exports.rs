//! The exported functions: `dlsym`, `cuGetProcAddress[_v2]`, the allocation calls and frees,
//! the virtualized memory queries, the launches. Every body runs under `guarded`, whole; on an
//! internal failure an allocation is refused with `CUDA_ERROR_OUT_OF_MEMORY`, `dlsym` answers
//! NULL (never an unlimited real function), `cuGetProcAddress[_v2]` `CUDA_ERROR_NOT_FOUND`,
//! `cuInit` `CUDA_ERROR_NOT_INITIALIZED`, frees, queries and launches `CUDA_ERROR_UNKNOWN`
//! (`NVML_ERROR_UNKNOWN` for NVML); the inner guards keep the real call's answer once it has
//! run. Never a non-CUDA code, never an abort.
//!
//! Each export taking a pointer is an `unsafe extern "C" fn` whose contract is the CUDA (or
//! NVML, or libc) function of the same name: every pointer NULL or valid for what that function
//! reads and writes during the call. (`missing_safety_doc` is allowed here for that reason.)
//!
//! | module | family |
//! |---|---|
//! | `lookup` | `dlsym`, `cuGetProcAddress[_v2]`, `cuInit` |
//! | `allocations` | `cuMemAlloc*`, async and pool allocations, `cuMemCreate`, arrays |
//! | `frees` | every free, made by one macro over `counted_free` |
//! | `queries` | `cuMemGetInfo_v2`, `cuDeviceTotalMem_v2`, NVML memory info |
//! | `launches` | kernel, cooperative, `Ex` and graph launches behind the limiter |

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod allocations;
mod frees;
mod launches;
mod lookup;
mod queries;

use std::ffi::c_void;

use allocations::*;
use frees::*;
use launches::*;
use lookup::*;
use queries::*;

use crate::symbols::Sym;

/// The wrapper handed out for `sym`.
fn wrapper(sym: Sym) -> *mut c_void {
    let f: usize = match sym {
        Sym::CuInit => cuInit as *const () as usize,
        Sym::CuGetProcAddress => cuGetProcAddress as *const () as usize,
        Sym::CuGetProcAddressV2 => cuGetProcAddress_v2 as *const () as usize,
        Sym::CuMemAllocV2 => cuMemAlloc_v2 as *const () as usize,
        Sym::CuMemFreeV2 => cuMemFree_v2 as *const () as usize,
        Sym::CuMemAllocManaged => cuMemAllocManaged as *const () as usize,
        Sym::CuMemAllocPitchV2 => cuMemAllocPitch_v2 as *const () as usize,
        Sym::CuMemAllocAsync => cuMemAllocAsync as *const () as usize,
        Sym::CuMemAllocAsyncPtsz => cuMemAllocAsync_ptsz as *const () as usize,
        Sym::CuMemAllocFromPoolAsync => cuMemAllocFromPoolAsync as *const () as usize,
        Sym::CuMemAllocFromPoolAsyncPtsz => cuMemAllocFromPoolAsync_ptsz as *const () as usize,
        Sym::CuMemFreeAsync => cuMemFreeAsync as *const () as usize,
        Sym::CuMemFreeAsyncPtsz => cuMemFreeAsync_ptsz as *const () as usize,
        Sym::CuMemCreate => cuMemCreate as *const () as usize,
        Sym::CuMemRelease => cuMemRelease as *const () as usize,
        Sym::CuArrayCreateV2 => cuArrayCreate_v2 as *const () as usize,
        Sym::CuArray3DCreateV2 => cuArray3DCreate_v2 as *const () as usize,
        Sym::CuArrayDestroy => cuArrayDestroy as *const () as usize,
        Sym::CuMemGetInfoV2 => cuMemGetInfo_v2 as *const () as usize,
        Sym::CuDeviceTotalMemV2 => cuDeviceTotalMem_v2 as *const () as usize,
        Sym::CuLaunchKernel => cuLaunchKernel as *const () as usize,
        Sym::CuLaunchKernelPtsz => cuLaunchKernel_ptsz as *const () as usize,
        Sym::CuLaunchKernelEx => cuLaunchKernelEx as *const () as usize,
        Sym::CuLaunchKernelExPtsz => cuLaunchKernelEx_ptsz as *const () as usize,
        Sym::CuLaunchCooperativeKernel => cuLaunchCooperativeKernel as *const () as usize,
        Sym::CuLaunchCooperativeKernelPtsz => cuLaunchCooperativeKernel_ptsz as *const () as usize,
        Sym::CuGraphLaunch => cuGraphLaunch as *const () as usize,
        Sym::CuGraphLaunchPtsz => cuGraphLaunch_ptsz as *const () as usize,
        Sym::NvmlDeviceGetMemoryInfo => nvmlDeviceGetMemoryInfo as *const () as usize,
        Sym::NvmlDeviceGetMemoryInfoV2 => nvmlDeviceGetMemoryInfo_v2 as *const () as usize,
        _ => 0,
    };
    f as *mut c_void
}
