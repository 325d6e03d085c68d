//! Arrays and mipmapped arrays, runtime and driver API: sized from their descriptors before
//! the real call, and their frees.

use std::ffi::{c_uint, c_void};

use super::books::{accounted, call_ok, free_wrapper, out_address};
use super::real_fn;
use crate::ffi_guard::guarded;
use crate::hip_abi::*;
use crate::sizing::{array_bytes, descriptor_bytes, format_bytes, mipmap_bytes};

use crate::symbols::Sym;
use crate::tracker::Space;

/// Bits per element of a channel format (0 for a NULL `desc`).
///
/// # Safety
/// `desc` is NULL or points at the caller's live `hipChannelFormatDesc`.
unsafe fn element_bits(desc: *const HipChannelFormatDesc) -> u64 {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: non-null, and valid by this function's contract.
    let desc = unsafe { &*desc };
    [desc.x, desc.y, desc.z, desc.w]
        .iter()
        .map(|bits| u64::try_from(*bits).unwrap_or(0))
        .sum()
}

/// `hipMallocArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocArray`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMallocArray<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> HipError {
    guarded("hipMallocArray", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocArrayFn>(R, Sym::HipMallocArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract).
        let Some(bytes) = array_bytes(
            unsafe { element_bits(desc) },
            [width as u64, height as u64, 1],
        ) else {
            // The runtime rejects the descriptor itself.
            // SAFETY: the real function with the caller's arguments.
            return unsafe { real(array, desc, width, height, flags) };
        };
        if array.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        accounted(
            R,
            "hipMallocArray",
            None,
            bytes,
            Space::Array,
            || {
                // SAFETY: the real function with the caller's arguments.
                let code = unsafe { real(array, desc, width, height, flags) };
                // SAFETY: array is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(array) }, bytes)
            },
            |_| {},
        )
    })
}

/// `hipMalloc3DArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMalloc3DArray`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipMalloc3DArray<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    flags: c_uint,
) -> HipError {
    guarded("hipMalloc3DArray", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<Malloc3DArrayFn>(R, Sym::HipMalloc3DArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        let dims = [
            extent.width as u64,
            extent.height as u64,
            extent.depth as u64,
        ];
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract).
        let Some(bytes) = array_bytes(unsafe { element_bits(desc) }, dims) else {
            // SAFETY: the real function with the caller's arguments.
            return unsafe { real(array, desc, extent, flags) };
        };
        if array.is_null() {
            return HIP_ERROR_INVALID_VALUE;
        }
        accounted(
            R,
            "hipMalloc3DArray",
            None,
            bytes,
            Space::Array,
            || {
                // SAFETY: the real function with the caller's arguments.
                let code = unsafe { real(array, desc, extent, flags) };
                // SAFETY: array is the caller's out-pointer, NULL or readable by the wrapper's contract.
                call_ok(code, unsafe { out_address(array) }, bytes)
            },
            |_| {},
        )
    })
}

free_wrapper!(hipFreeArray, FreeFn, HipFreeArray, Array, (array: *mut c_void));

/// Runs an array-style allocation of `bytes` (`None`: the runtime rejects the descriptor
/// itself, so the call passes through uncounted).
///
/// # Safety
/// `out` is NULL or valid for reading a pointer once `call` has succeeded.
unsafe fn array_like(
    runtime: usize,
    what: &str,
    out: *mut *mut c_void,
    bytes: Option<u64>,
    space: Space,
    call: impl FnOnce() -> HipError,
) -> HipError {
    let Some(bytes) = bytes else {
        return call();
    };
    if out.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    accounted(
        runtime,
        what,
        None,
        bytes,
        space,
        // SAFETY: out is non-null and readable by this function's contract.
        || call_ok(call(), unsafe { out_address(out) }, bytes),
        |_| {},
    )
}

/// The caller's descriptor, if any.
///
/// # Safety
/// `desc` is NULL or points at a `T` that stays valid while the reference is used (the
/// wrapper's call; the reference must not outlive it).
unsafe fn read_descriptor<'a, T>(desc: *const T) -> Option<&'a T> {
    // SAFETY: NULL or valid for `'a`, by this function's contract.
    unsafe { desc.as_ref() }
}

/// `hipArrayCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipArrayCreate`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipArrayCreate<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipArrayDescriptor,
) -> HipError {
    guarded("hipArrayCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<ArrayCreateFn>(R, Sym::HipArrayCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract), read during
        // the call only.
        let bytes = unsafe { read_descriptor(desc) }.and_then(|d| {
            descriptor_bytes(d.format, d.channels, [d.width as u64, d.height as u64, 0])
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(R, "hipArrayCreate", array, bytes, Space::Array, || {
                real(array, desc)
            })
        }
    })
}

/// `hipArray3DCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipArray3DCreate`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipArray3DCreate<const R: usize>(
    array: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
) -> HipError {
    guarded("hipArray3DCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<Array3DCreateFn>(R, Sym::HipArray3DCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract), read during
        // the call only.
        let bytes = unsafe { read_descriptor(desc) }.and_then(|d| {
            let dims = [d.width as u64, d.height as u64, d.depth as u64];
            descriptor_bytes(d.format, d.channels, dims)
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(R, "hipArray3DCreate", array, bytes, Space::Array, || {
                real(array, desc)
            })
        }
    })
}

free_wrapper!(hipArrayDestroy, FreeFn, HipArrayDestroy, Array, (array: *mut c_void));

/// `hipMallocMipmappedArray` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMallocMipmappedArray`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipMallocMipmappedArray<const R: usize>(
    mipmapped: *mut *mut c_void,
    desc: *const HipChannelFormatDesc,
    extent: HipExtent,
    levels: c_uint,
    flags: c_uint,
) -> HipError {
    guarded("hipMallocMipmappedArray", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MallocMipmappedFn>(R, Sym::HipMallocMipmappedArray) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract).
        let bits = unsafe { element_bits(desc) };
        let dims = [
            extent.width as u64,
            extent.height as u64,
            extent.depth as u64,
        ];
        let bytes = (bits > 0 && bits.is_multiple_of(8))
            .then(|| mipmap_bytes(bits / 8, dims, levels))
            .flatten();
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(
                R,
                "hipMallocMipmappedArray",
                mipmapped,
                bytes,
                Space::Mipmapped,
                || real(mipmapped, desc, extent, levels, flags),
            )
        }
    })
}

/// `hipMipmappedArrayCreate` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipMipmappedArrayCreate`: each pointer argument is NULL or valid for what that
/// function reads and writes during the call.
pub unsafe extern "C" fn hipMipmappedArrayCreate<const R: usize>(
    mipmapped: *mut *mut c_void,
    desc: *const HipArray3DDescriptor,
    levels: c_uint,
) -> HipError {
    guarded("hipMipmappedArrayCreate", HIP_ERROR_OUT_OF_MEMORY, || {
        let Some(real) = real_fn::<MipmappedCreateFn>(R, Sym::HipMipmappedArrayCreate) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: desc is NULL or the caller's descriptor (the wrapper's contract), read during
        // the call only.
        let bytes = unsafe { read_descriptor(desc) }.and_then(|d| {
            let element = format_bytes(d.format)?.checked_mul(u64::from(d.channels))?;
            let dims = [d.width as u64, d.height as u64, d.depth as u64];
            mipmap_bytes(element, dims, levels)
        });
        // SAFETY: the out-pointer is the caller's (NULL or valid, as the HIP API requires), and
        // the closure calls the real function with the caller's arguments.
        unsafe {
            array_like(
                R,
                "hipMipmappedArrayCreate",
                mipmapped,
                bytes,
                Space::Mipmapped,
                || real(mipmapped, desc, levels),
            )
        }
    })
}

free_wrapper!(hipFreeMipmappedArray, FreeFn, HipFreeMipmappedArray, Mipmapped, (mipmapped: *mut c_void));

free_wrapper!(hipMipmappedArrayDestroy, FreeFn, HipMipmappedArrayDestroy, Mipmapped, (mipmapped: *mut c_void));
