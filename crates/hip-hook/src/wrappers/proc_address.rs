//! `hipGetProcAddress`: a looked-up entry point of a redirected function is swapped for its
//! wrapper, so callers that resolve HIP at run time are limited too.

use std::ffi::{CStr, c_char, c_int, c_void};

use super::{real_fn, wrapper_address};
use crate::ffi_guard::guarded;
use crate::hip_abi::*;

use crate::symbols::{Sym, note_real};

/// `hipGetProcAddress` as callers bound to runtime `R` get it.
///
/// # Safety
/// As HIP's `hipGetProcAddress`: each pointer argument is NULL or valid for what that function
/// reads and writes during the call.
pub unsafe extern "C" fn hipGetProcAddress<const R: usize>(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    hip_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> HipError {
    guarded("hipGetProcAddress", HIP_ERROR_NOT_FOUND, || {
        let Some(real) = real_fn::<ProcAddressFn>(R, Sym::HipGetProcAddress) else {
            return HIP_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the real function with the caller's arguments.
        let code = unsafe { real(symbol, pfn, hip_version, flags, status) };
        if code != HIP_SUCCESS || symbol.is_null() || pfn.is_null() {
            return code;
        }
        let swapped = guarded("hipGetProcAddress", false, || {
            // SAFETY: non-null NUL-terminated name; pfn non-null and written by the real call.
            let (name, found) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn as usize) };
            if let Some(sym) = Sym::from_name(name)
                && found != 0
                && sym.is_redirected()
                && !sym.is_libc()
            {
                note_real(R, sym, found);
                if let Some(wrapper) = wrapper_address(sym, R) {
                    // SAFETY: pfn non-null.
                    unsafe { *pfn = wrapper as *mut c_void };
                }
            }
            true
        });
        if !swapped {
            // An internal error after the real lookup: no function rather than the real,
            // unlimited one.
            // SAFETY: pfn non-null, the caller's out-pointer.
            unsafe { *pfn = std::ptr::null_mut() };
            return HIP_ERROR_NOT_FOUND;
        }
        code
    })
}
