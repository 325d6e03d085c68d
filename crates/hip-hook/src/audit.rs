//! The rtld-audit interface (`man 7 rtld-audit`): the dynamic linker calls these to let the
//! hook see which object binds which symbol, and to substitute the wrappers.

use std::ffi::{CStr, c_char, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::ffi_guard::guarded;
use crate::symbols::{HIP_PATH, Sym, note_real};

const LA_FLG_BINDTO: c_uint = 0x01;
const LA_FLG_BINDFROM: c_uint = 0x02;
const LA_SYMB_NOPLTENTER: c_uint = 0x01;
const LA_SYMB_NOPLTEXIT: c_uint = 0x02;

/// The first members of glibc's `struct link_map` (the public part).
#[repr(C)]
pub struct LinkMap {
    pub l_addr: usize,
    pub l_name: *const c_char,
    pub l_ld: *mut libc::c_void,
    pub l_next: *mut LinkMap,
    pub l_prev: *mut LinkMap,
}

/// Cookies of the HIP runtime's objects (libamdhip64, libhsa-runtime64): calls they make are
/// the runtime's own and are never redirected (except their `getenv`, which is pinned).
static HIP_COOKIES: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Which kind of object a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// libamdhip64: HIP calls are bound to it.
    HipRuntime,
    /// Other parts of the runtime that read the slice's variables (ROCr).
    RuntimePart,
    /// libc: `getenv` is bound to it.
    Libc,
    Other,
}

pub fn classify(path: &[u8]) -> ObjectKind {
    let file = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
    if file.starts_with(b"libamdhip64.so") {
        ObjectKind::HipRuntime
    } else if file.starts_with(b"libhsa-runtime64.so") {
        ObjectKind::RuntimePart
    } else if file.starts_with(b"libc.so") {
        ObjectKind::Libc
    } else {
        ObjectKind::Other
    }
}

fn is_hip_cookie(cookie: usize) -> bool {
    cookie != 0 && HIP_COOKIES.iter().any(|c| c.load(Relaxed) == cookie)
}

fn remember_hip_cookie(cookie: usize) {
    for slot in &HIP_COOKIES {
        if slot.compare_exchange(0, cookie, Relaxed, Relaxed).is_ok()
            || slot.load(Relaxed) == cookie
        {
            return;
        }
    }
}

/// Accepts the interface version the linker offers, up to 2 (glibc 2.35 raised LAV_CURRENT to
/// 2; answering 1 would be refused on aarch64).
#[unsafe(no_mangle)]
pub extern "C" fn la_version(version: c_uint) -> c_uint {
    guarded("la_version", version.min(2), || {
        crate::log::set_level(crate::log::parse_level(
            std::env::var("LIBHIP_LOG_LEVEL").ok().as_deref(),
        ));
        version.min(2)
    })
}

/// Asks for bindings from every object, and to the HIP runtime and libc.
///
/// # Safety
/// Called by the dynamic linker with a valid link map and cookie.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_objopen(
    map: *mut LinkMap,
    _lmid: libc::c_long,
    cookie: *mut usize,
) -> c_uint {
    guarded("la_objopen", LA_FLG_BINDFROM, || {
        if map.is_null() || cookie.is_null() {
            return LA_FLG_BINDFROM;
        }
        // SAFETY: the linker passes a live link map; l_name is NULL or NUL-terminated.
        let name = unsafe { (*map).l_name };
        let path_with_nul = if name.is_null() {
            &[0u8][..]
        } else {
            // SAFETY: non-null NUL-terminated string owned by the linker.
            unsafe { CStr::from_ptr(name) }.to_bytes_with_nul()
        };
        let path = &path_with_nul[..path_with_nul.len() - 1];
        // SAFETY: cookie points at the linker's cookie for this object.
        let cookie_value = unsafe { *cookie };
        match classify(path) {
            ObjectKind::HipRuntime => {
                remember_hip_cookie(cookie_value);
                let _ = HIP_PATH.set(
                    CStr::from_bytes_with_nul(path_with_nul)
                        .map_or_else(|_| c"libamdhip64.so.6".to_owned(), CStr::to_owned),
                );
                LA_FLG_BINDTO | LA_FLG_BINDFROM
            }
            ObjectKind::RuntimePart => {
                remember_hip_cookie(cookie_value);
                LA_FLG_BINDFROM
            }
            ObjectKind::Libc => LA_FLG_BINDTO | LA_FLG_BINDFROM,
            ObjectKind::Other => LA_FLG_BINDFROM,
        }
    })
}

/// What a binding of `sym` by a caller should resolve to.
pub fn decide(sym: Sym, caller_is_runtime: bool) -> bool {
    if !sym.is_redirected() {
        return false;
    }
    // The runtime's own HIP calls stay real (no double counting); only its getenv is pinned.
    if sym.is_libc() {
        caller_is_runtime
    } else {
        !caller_is_runtime
    }
}

/// Substitutes the wrapper for intercepted HIP calls of callers outside the runtime.
///
/// # Safety
/// Called by the dynamic linker with valid pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_symbind64(
    sym: *mut libc::Elf64_Sym,
    _ndx: c_uint,
    refcook: *mut usize,
    _defcook: *mut usize,
    flags: *mut c_uint,
    symname: *const c_char,
) -> usize {
    if sym.is_null() {
        return 0;
    }
    // SAFETY: the linker passes a valid symbol whose st_value is the resolved address.
    let real = unsafe { (*sym).st_value } as usize;
    guarded("la_symbind64", real, || {
        if symname.is_null() {
            return real;
        }
        // SAFETY: non-null NUL-terminated name owned by the linker.
        let Some(which) = Sym::from_name(unsafe { CStr::from_ptr(symname) }.to_bytes()) else {
            return real;
        };
        note_real(which, real);
        // SAFETY: refcook points at the referencing object's cookie when non-null.
        let caller = if refcook.is_null() {
            0
        } else {
            unsafe { *refcook }
        };
        if !decide(which, is_hip_cookie(caller)) {
            return real;
        }
        if !flags.is_null() {
            // SAFETY: flags points at the linker's flag word.
            unsafe { *flags |= LA_SYMB_NOPLTENTER | LA_SYMB_NOPLTEXIT };
        }
        crate::wrappers::wrapper_address(which).unwrap_or(real)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_classified_by_file_name() {
        assert_eq!(
            classify(b"/opt/rocm/lib/libamdhip64.so.6"),
            ObjectKind::HipRuntime
        );
        assert_eq!(classify(b"libamdhip64.so"), ObjectKind::HipRuntime);
        assert_eq!(
            classify(b"/opt/rocm/lib/libhsa-runtime64.so.1"),
            ObjectKind::RuntimePart
        );
        assert_eq!(
            classify(b"/lib/x86_64-linux-gnu/libc.so.6"),
            ObjectKind::Libc
        );
        assert_eq!(classify(b""), ObjectKind::Other);
        assert_eq!(classify(b"/x/libamdhip64_wrapper.so"), ObjectKind::Other);
        assert_eq!(classify(b"/libc.so.6/libfoo.so"), ObjectKind::Other);
    }

    #[test]
    fn runtime_internal_calls_stay_real_but_its_getenv_is_pinned() {
        assert!(decide(Sym::HipMalloc, false));
        assert!(!decide(Sym::HipMalloc, true));
        assert!(decide(Sym::Getenv, true));
        assert!(!decide(Sym::Getenv, false));
        assert!(!decide(Sym::HipGetDevice, false));
    }
}
