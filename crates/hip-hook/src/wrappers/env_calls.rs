//! The environment calls: the runtime's `getenv` reads the pinned values; the application's
//! `setenv` family leaves a pinned variable as it was; `clearenv` puts them back.

use std::ffi::{CStr, c_char, c_int};

use super::real_fn;
use crate::ffi_guard::guarded;
use crate::hip_abi::*;

use crate::symbols::Sym;

/// The pinned value of `name`, or libc's answer for any other name.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string (as for libc's `getenv`).
unsafe fn pinned_getenv(sym: Sym, name: *const c_char) -> *mut c_char {
    if !name.is_null() {
        // SAFETY: non-null and NUL-terminated by this function's contract.
        let key = unsafe { CStr::from_ptr(name) }.to_bytes();
        if let Some(index) = crate::pinned_env::pinned_index(key) {
            return crate::pinned_env::pinned_c_value(index).cast_mut();
        }
    }
    match real_fn::<GetenvFn>(0, sym) {
        // SAFETY: libc's getenv/secure_getenv with the caller's argument.
        Some(real) => unsafe { real(name) },
        None => std::ptr::null_mut(),
    }
}

/// `getenv` as the runtime (and ROCr) get it: the pinned variables read as the slice set them.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string (as for libc's `getenv`).
pub unsafe extern "C" fn getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: the caller's name, as this function's contract requires.
    guarded("getenv", std::ptr::null_mut(), || unsafe {
        pinned_getenv(Sym::Getenv, name)
    })
}

/// `secure_getenv` as the runtime gets it (see [`getenv`]).
///
/// # Safety
/// As [`getenv`].
pub unsafe extern "C" fn secure_getenv(name: *const c_char) -> *mut c_char {
    // SAFETY: the caller's name, as this function's contract requires.
    guarded("secure_getenv", std::ptr::null_mut(), || unsafe {
        pinned_getenv(Sym::SecureGetenv, name)
    })
}

type SetenvFn = unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> c_int;

type PutenvFn = unsafe extern "C" fn(*mut c_char) -> c_int;

type UnsetenvFn = unsafe extern "C" fn(*const c_char) -> c_int;

type ClearenvFn = unsafe extern "C" fn() -> c_int;

/// Whether the application's change of `entry` is kept away from a pinned variable (and
/// says so once per call).
///
/// # Safety
/// `entry` is NULL or a NUL-terminated string (`NAME` or `NAME=value`).
unsafe fn keeps_pinned(what: &str, entry: *const c_char) -> bool {
    if entry.is_null() {
        return false;
    }
    // SAFETY: non-null and NUL-terminated by this function's contract.
    let text = unsafe { CStr::from_ptr(entry) }.to_bytes();
    let pinned = crate::pinned_env::is_pinned_assignment(text);
    if pinned {
        let name = text.split(|b| *b == b'=').next().unwrap_or(text);
        crate::log::warn(format_args!(
            "{what}({}) left as it was: the slice's variables are pinned",
            String::from_utf8_lossy(name)
        ));
    }
    pinned
}

/// `setenv` as the application gets it: a pinned name is left as it was. An internal error
/// refuses the change (-1): a pinned variable is never changed because the hook failed.
///
/// # Safety
/// As libc's `setenv`.
pub unsafe extern "C" fn setenv(
    name: *const c_char,
    value: *const c_char,
    overwrite: c_int,
) -> c_int {
    guarded("setenv", -1, || {
        // SAFETY: the caller's name, NUL-terminated as setenv requires.
        if unsafe { keeps_pinned("setenv", name) } {
            return 0;
        }
        match real_fn::<SetenvFn>(0, Sym::Setenv) {
            // SAFETY: libc's setenv with the caller's arguments.
            Some(real) => unsafe { real(name, value, overwrite) },
            None => -1,
        }
    })
}

/// `putenv` as the application gets it (see [`setenv`]).
///
/// # Safety
/// As libc's `putenv`.
pub unsafe extern "C" fn putenv(entry: *mut c_char) -> c_int {
    guarded("putenv", -1, || {
        // SAFETY: the caller's entry, NUL-terminated as putenv requires.
        if unsafe { keeps_pinned("putenv", entry) } {
            return 0;
        }
        match real_fn::<PutenvFn>(0, Sym::Putenv) {
            // SAFETY: libc's putenv with the caller's argument.
            Some(real) => unsafe { real(entry) },
            None => -1,
        }
    })
}

/// `unsetenv` as the application gets it (see [`setenv`]).
///
/// # Safety
/// As libc's `unsetenv`.
pub unsafe extern "C" fn unsetenv(name: *const c_char) -> c_int {
    guarded("unsetenv", -1, || {
        // SAFETY: the caller's name, NUL-terminated as unsetenv requires.
        if unsafe { keeps_pinned("unsetenv", name) } {
            return 0;
        }
        match real_fn::<UnsetenvFn>(0, Sym::Unsetenv) {
            // SAFETY: libc's unsetenv with the caller's argument.
            Some(real) => unsafe { real(name) },
            None => -1,
        }
    })
}

/// `clearenv`, then the pinned values back.
///
/// # Safety
/// As libc's `clearenv`.
pub unsafe extern "C" fn clearenv() -> c_int {
    guarded("clearenv", -1, || {
        let code = match real_fn::<ClearenvFn>(0, Sym::Clearenv) {
            // SAFETY: libc's clearenv.
            Some(real) => unsafe { real() },
            None => return -1,
        };
        // The environment is cleared already: whatever happens next, clearenv's answer stands.
        // SAFETY: inside the application's clearenv, which excludes concurrent environment use.
        guarded("clearenv", (), || unsafe {
            crate::pinned_env::apply_to_environ()
        });
        code
    })
}
