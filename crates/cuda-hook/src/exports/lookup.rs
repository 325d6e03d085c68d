//! Entry-point lookup: `dlsym` and `cuGetProcAddress[_v2]` hand out the wrapper of a
//! redirected symbol; `cuInit` starts the per-process state.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use super::wrapper;
use crate::cuda_abi::*;
use crate::ffi_guard::guarded;

use crate::state::state;
use crate::symbols::{Sym, note_real, real_dlsym, real_fn, redirected_at};

/// `dlsym`: a lookup of a wrapped name gets the wrapper when the library really has the
/// symbol (NULL when it does not: never a wrapper around nothing); everything else is
/// glibc's answer. `RTLD_NEXT` lookups are resolved relative to libvgpu.so (README). An
/// internal error answers NULL, as for a missing symbol: never an unlimited real function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    guarded("dlsym", std::ptr::null_mut(), || {
        let Some(real) = real_dlsym() else {
            return std::ptr::null_mut();
        };
        // SAFETY: glibc's dlsym with the caller's arguments.
        let found = unsafe { real(handle, symbol) };
        if found.is_null() || symbol.is_null() {
            return found;
        }
        // SAFETY: non-null NUL-terminated name from the caller (glibc just read it).
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        match crate::symbols::Sym::from_name(name) {
            Some(sym) if sym.is_redirected() && found != wrapper(sym) => {
                note_real(sym, found as usize);
                wrapper(sym)
            }
            _ => found,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    guarded("cuInit", CUDA_ERROR_NOT_INITIALIZED, || {
        let Some(real) = real_fn!(Sym::CuInit, unsafe extern "C" fn(c_uint) -> CuResult) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real cuInit.
        let rc = unsafe { real(flags) };
        if rc == CUDA_SUCCESS {
            state().after_init();
        }
        rc
    })
}

/// Replaces a real entry point by its wrapper when we wrap that exact symbol: the driver
/// chose the symbol for the requested version and flags, so the wrapper's ABI matches.
///
/// # Safety
/// `pfn` is NULL or valid for reading and writing a pointer (the caller's out-parameter,
/// just written by the real `cuGetProcAddress`).
unsafe fn swap_entry(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: the driver just wrote the entry point there.
    let found = unsafe { *pfn } as usize;
    if found == 0 {
        return;
    }
    if let Some(sym) = redirected_at(found) {
        // SAFETY: same pointer, a function pointer of the same signature.
        unsafe { *pfn = wrapper(sym) };
    }
}

/// [`swap_entry`] under its own guard: an internal error clears the entry, so the caller
/// gets `CUDA_ERROR_NOT_FOUND` and no function rather than the real, unlimited one.
///
/// # Safety
/// As [`swap_entry`].
unsafe fn swapped_or_cleared(what: &str, pfn: *mut *mut c_void) -> bool {
    let swapped = guarded(what, false, || {
        // SAFETY: as this function's contract requires.
        unsafe { swap_entry(pfn) };
        true
    });
    if !swapped && !pfn.is_null() {
        // SAFETY: non-null and writable by this function's contract.
        unsafe { *pfn = std::ptr::null_mut() };
    }
    swapped
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    guarded("cuGetProcAddress", CUDA_ERROR_NOT_FOUND, || {
        type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
        let Some(real) = real_fn!(Sym::CuGetProcAddress, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(symbol, pfn, version, flags) };
        // SAFETY: pfn as written by the driver.
        if rc == CUDA_SUCCESS && !unsafe { swapped_or_cleared("cuGetProcAddress", pfn) } {
            return CUDA_ERROR_NOT_FOUND;
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    guarded("cuGetProcAddress_v2", CUDA_ERROR_NOT_FOUND, || {
        type F = unsafe extern "C" fn(
            *const c_char,
            *mut *mut c_void,
            c_int,
            u64,
            *mut c_int,
        ) -> CuResult;
        let Some(real) = real_fn!(Sym::CuGetProcAddressV2, F) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the real function with the caller's arguments.
        let rc = unsafe { real(symbol, pfn, version, flags, status) };
        // SAFETY: pfn as written by the driver.
        if rc == CUDA_SUCCESS && !unsafe { swapped_or_cleared("cuGetProcAddress_v2", pfn) } {
            return CUDA_ERROR_NOT_FOUND;
        }
        rc
    })
}
