//! Linear memory: `hipMalloc` and its flavours, pitched and 3-D allocations, frees; and the
//! calls the runtime makes into itself through the dynamic linker, as the real runtime's
//! internals do.

use std::ffi::{CStr, c_uint, c_void};

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::abi::*;
use crate::allocations::Kind;

use super::*;

pub(super) type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError;
pub(super) type MallocPitchFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> HipError;

pub(super) static SELF_MALLOC: AtomicUsize = AtomicUsize::new(0);
pub(super) static SELF_MALLOC_PITCH: AtomicUsize = AtomicUsize::new(0);

/// This library's own exported `name`, resolved with `dlsym` so that the binding is made
/// (and audited) with this library as the caller.
pub(super) fn own_export(cache: &AtomicUsize, name: &CStr) -> Result<usize, HipError> {
    let cached = cache.load(Relaxed);
    if cached != 0 {
        return Ok(cached);
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    if address == 0 {
        return Err(HIP_ERROR_NOT_FOUND);
    }
    cache.store(address, Relaxed);
    Ok(address)
}

pub(super) fn internal_malloc(out: *mut *mut c_void, size: usize) -> Result<(), HipError> {
    let address = own_export(&SELF_MALLOC, c"hipMalloc")?;
    // SAFETY: the address is this library's hipMalloc (or a wrapper with its signature).
    let malloc: MallocFn = unsafe { std::mem::transmute::<usize, MallocFn>(address) };
    // SAFETY: calling hipMalloc with the caller's out-pointer.
    match unsafe { malloc(out, size) } {
        HIP_SUCCESS => Ok(()),
        code => Err(code),
    }
}

pub(super) fn internal_malloc_pitch(
    out: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> Result<(), HipError> {
    let address = own_export(&SELF_MALLOC_PITCH, c"hipMallocPitch")?;
    // SAFETY: the address is this library's hipMallocPitch (or a wrapper with its signature).
    let malloc_pitch: MallocPitchFn =
        unsafe { std::mem::transmute::<usize, MallocPitchFn>(address) };
    // SAFETY: calling hipMallocPitch with valid out-pointers.
    match unsafe { malloc_pitch(out, pitch, width, height) } {
        HIP_SUCCESS => Ok(()),
        code => Err(code),
    }
}

/// Row pitch of the stand-in: rows aligned to 512 bytes.
pub const PITCH_ALIGNMENT: usize = 512;

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError {
    entry(|rt| linear(rt, ptr, rt.current_device()?, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipExtMallocWithFlags(
    ptr: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> HipError {
    entry(|_| internal_malloc(ptr, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> HipError {
    entry(|rt| linear(rt, ptr, rt.current_device()?, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    _stream: *mut c_void,
) -> HipError {
    entry(|rt| linear(rt, ptr, rt.current_device()?, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    entry(|_| {
        let row = width.max(1).next_multiple_of(PITCH_ALIGNMENT);
        let size = row.checked_mul(height).ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        put(pitch, row)?;
        internal_malloc(ptr, size)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc3D(pitched: *mut HipPitchedPtr, extent: HipExtent) -> HipError {
    entry(|_| {
        if pitched.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let mut ptr = std::ptr::null_mut();
        let mut pitch = 0usize;
        let rows = extent
            .height
            .max(1)
            .checked_mul(extent.depth.max(1))
            .ok_or(HIP_ERROR_OUT_OF_MEMORY)?;
        internal_malloc_pitch(&mut ptr, &mut pitch, extent.width, rows)?;
        put(
            pitched,
            HipPitchedPtr {
                ptr,
                pitch,
                xsize: extent.width,
                ysize: extent.height,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    entry(|rt| {
        if ptr.is_null() {
            Ok(())
        } else {
            free(rt, ptr as usize, Kind::Linear)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeAsync(ptr: *mut c_void, _stream: *mut c_void) -> HipError {
    entry(|rt| {
        if ptr.is_null() {
            Ok(())
        } else {
            free(rt, ptr as usize, Kind::Linear)
        }
    })
}
