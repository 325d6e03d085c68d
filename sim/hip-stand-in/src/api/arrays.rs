//! Arrays and mipmapped arrays, runtime and driver API, and graph memory nodes.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::*;
use crate::allocations::Kind;

use crate::runtime::Runtime;

use super::*;

pub(super) fn element_bytes(desc: *const HipChannelFormatDesc) -> Result<usize, HipError> {
    if desc.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null pointer to the caller's descriptor.
    let desc = unsafe { &*desc };
    let bits = [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|b| usize::try_from(*b).unwrap_or(0))
        .sum::<usize>();
    if bits == 0 || bits % 8 != 0 {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    Ok(bits / 8)
}

pub(super) fn array(
    rt: &Runtime,
    out: *mut *mut c_void,
    elements: [usize; 3],
    element: usize,
) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let size = elements
        .iter()
        .try_fold(element, |acc, n| acc.checked_mul((*n).max(1)))
        .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
    let address = allocate(rt, rt.current_device()?, size as u64, Kind::Array)?;
    put(out, address as *mut c_void)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocArray(
    array_out: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    width: usize,
    height: usize,
    _flags: c_uint,
) -> HipError {
    entry(|rt| array(rt, array_out, [width, height, 1], element_bytes(desc)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc3DArray(
    array_out: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    _flags: c_uint,
) -> HipError {
    entry(|rt| {
        array(
            rt,
            array_out,
            [extent.width, extent.height, extent.depth],
            element_bytes(desc)?,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeArray(array_handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, array_handle as usize, Kind::Array))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemAllocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element: c_uint,
) -> HipError {
    entry(|rt| {
        let row = width.max(1).next_multiple_of(PITCH_ALIGNMENT);
        let size = row
            .checked_mul(height.max(1))
            .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        put(pitch, row)?;
        linear(rt, ptr, rt.current_device()?, size)
    })
}

pub(super) fn descriptor_element(format: c_int, channels: c_uint) -> Result<usize, HipError> {
    let bytes = format_bytes(format).ok_or(HIP_ERROR_INVALID_VALUE)?;
    match channels {
        1 | 2 | 4 => Ok(bytes * channels as usize),
        _ => Err(HIP_ERROR_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArrayCreate(
    array_out: *mut *mut c_void,
    desc: *const HipArrayDescriptor,
) -> HipError {
    entry(|rt| {
        // SAFETY: the caller's descriptor, NULL checked.
        let desc = unsafe { desc.as_ref() }.ok_or(HIP_ERROR_INVALID_VALUE)?;
        let element = descriptor_element(desc.format, desc.channels)?;
        array(rt, array_out, [desc.width, desc.height, 1], element)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArray3DCreate(
    array_out: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
) -> HipError {
    entry(|rt| {
        // SAFETY: the caller's descriptor, NULL checked.
        let desc = unsafe { desc.as_ref() }.ok_or(HIP_ERROR_INVALID_VALUE)?;
        let element = descriptor_element(desc.format, desc.channels)?;
        array(
            rt,
            array_out,
            [desc.width, desc.height, desc.depth],
            element,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArrayDestroy(array_handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, array_handle as usize, Kind::Array))
}

/// Sum of every level's bytes, each dimension halved per level (at least 1).
pub(super) fn mipmap_size(
    element: usize,
    dims: [usize; 3],
    levels: c_uint,
) -> Result<usize, HipError> {
    let largest = dims.iter().copied().max().unwrap_or(0).max(1);
    let chain = (usize::BITS - largest.leading_zeros()) as c_uint;
    let mut total = 0usize;
    for level in 0..levels.clamp(1, chain) {
        let size = dims.iter().try_fold(element, |acc, d| {
            let d = if *d == 0 { 1 } else { (*d >> level).max(1) };
            acc.checked_mul(d)
        });
        total = size
            .and_then(|s| total.checked_add(s))
            .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
    }
    Ok(total)
}

pub(super) fn mipmapped(
    rt: &Runtime,
    out: *mut *mut c_void,
    element: usize,
    dims: [usize; 3],
    levels: c_uint,
) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let size = mipmap_size(element, dims, levels)?;
    let address = allocate(rt, rt.current_device()?, size as u64, Kind::Mipmapped)?;
    put(out, address as *mut c_void)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocMipmappedArray(
    out: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    levels: c_uint,
    _flags: c_uint,
) -> HipError {
    entry(|rt| {
        let element = element_bytes(desc)?;
        mipmapped(
            rt,
            out,
            element,
            [extent.width, extent.height, extent.depth],
            levels,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMipmappedArrayCreate(
    out: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
    levels: c_uint,
) -> HipError {
    entry(|rt| {
        // SAFETY: the caller's descriptor, NULL checked.
        let desc = unsafe { desc.as_ref() }.ok_or(HIP_ERROR_INVALID_VALUE)?;
        let element = descriptor_element(desc.format, desc.channels)?;
        mipmapped(
            rt,
            out,
            element,
            [desc.width, desc.height, desc.depth],
            levels,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeMipmappedArray(handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, handle as usize, Kind::Mipmapped))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMipmappedArrayDestroy(handle: *mut c_void) -> HipError {
    entry(|rt| free(rt, handle as usize, Kind::Mipmapped))
}

/// A graph memory node: its memory is taken when the graph is launched, which the stand-in
/// does not model; it hands out a node handle and the address the allocation will have.
#[unsafe(no_mangle)]
pub extern "C" fn hipGraphAddMemAllocNode(
    node: *mut *mut c_void,
    _graph: *mut c_void,
    _dependencies: *const *mut c_void,
    _count: usize,
    params: *mut c_void,
) -> HipError {
    entry(|_| {
        if params.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(node, Box::into_raw(Box::new(0u64)).cast())
    })
}
