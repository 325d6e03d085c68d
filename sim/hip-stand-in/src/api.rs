//! The exported HIP entry points (C names, signatures and error codes of ROCm 6).
#![allow(non_snake_case)]
//!
//! | module | entry points |
//! |---|---|
//! | `devices` | init, devices, attributes, properties, memory info, launches |
//! | `linear` | linear allocations and frees; calls into itself through the dynamic linker |
//! | `arrays` | arrays, mipmapped arrays, graph memory nodes |
//! | `pools` | virtual memory and memory pools |
//! | `lookup` | error names, `hipGetProcAddress` |

mod arrays;
mod devices;
mod linear;
mod lookup;
mod pools;

use arrays::*;
use devices::*;
use linear::*;
use pools::*;

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::abi::*;
use crate::allocations::{Allocation, Kind};

use crate::runtime::{Runtime, runtime};

/// Runs an entry point's body; a panic becomes `hipErrorUnknown` instead of crossing into C.
fn entry(body: impl FnOnce(&'static Runtime) -> Result<(), HipError>) -> HipError {
    catch_unwind(AssertUnwindSafe(|| runtime().and_then(body))).map_or(
        HIP_ERROR_UNKNOWN,
        |result| match result {
            Ok(()) => HIP_SUCCESS,
            Err(code) => code,
        },
    )
}

/// Writes through an out-pointer, refusing NULL.
fn put<T>(out: *mut T, value: T) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller (C) passed a non-null pointer to a `T` it owns.
    unsafe { out.write(value) };
    Ok(())
}

fn allocate(rt: &Runtime, device: usize, size: u64, kind: Kind) -> Result<usize, HipError> {
    if !rt.memory.take(device, size) {
        return Err(HIP_ERROR_OUT_OF_MEMORY);
    }
    Ok(rt.table().insert(Allocation { device, size, kind }))
}

fn free(rt: &Runtime, address: usize, kind: Kind) -> Result<(), HipError> {
    let allocation = rt
        .table()
        .remove(address, kind)
        .ok_or(if kind == Kind::Linear {
            HIP_ERROR_INVALID_DEVICE_POINTER
        } else {
            HIP_ERROR_INVALID_HANDLE
        })?;
    rt.memory.give_back(allocation.device, allocation.size);
    Ok(())
}

fn linear(rt: &Runtime, out: *mut *mut c_void, device: usize, size: usize) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    if size == 0 {
        return put(out, std::ptr::null_mut());
    }
    let address = allocate(rt, device, size as u64, Kind::Linear)?;
    put(out, address as *mut c_void)
}
