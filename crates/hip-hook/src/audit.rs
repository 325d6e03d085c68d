//! The rtld-audit interface (`man 7 rtld-audit`): the dynamic linker calls these to let the
//! hook see which object binds which symbol, and to substitute the wrappers.

use std::ffi::{CStr, c_char, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::elf_symbols::DynTables;
use crate::ffi_guard::guarded;
use crate::symbols::{LIBC, MAIN_PROGRAM, Sym, add_runtime, note_real, runtime_index};

const LA_FLG_BINDTO: c_uint = 0x01;
const LA_FLG_BINDFROM: c_uint = 0x02;
const LA_SYMB_NOPLTENTER: c_uint = 0x01;
const LA_SYMB_NOPLTEXIT: c_uint = 0x02;

/// The first members of glibc's `struct link_map` (the public part).
#[repr(C)]
pub struct LinkMap {
    /// Difference between the object's addresses in the file and in memory.
    pub l_addr: usize,
    /// Path of the object (empty for the main program).
    pub l_name: *const c_char,
    /// The object's dynamic section.
    pub l_ld: *mut libc::c_void,
    /// Next object in load order.
    pub l_next: *mut LinkMap,
    /// Previous object in load order.
    pub l_prev: *mut LinkMap,
}

/// Link maps of other parts of the runtime that read the slice's variables (ROCr, which
/// defines `hsa_init`): their `getenv` is pinned and their HIP calls stay real.
static RUNTIME_PARTS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// What an object is, by what it defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// Defines `hipMalloc` and `hipRuntimeGetVersion`: a HIP runtime, whatever its name.
    HipRuntime,
    /// Defines `hsa_init`: ROCr, which reads the slice's variables.
    RuntimePart,
    /// Anything else (the program, its other libraries): its HIP calls are redirected.
    Other,
}

/// Classifies an object from what its dynamic symbol table defines.
pub fn classify(defines: &dyn Fn(&[u8]) -> bool) -> ObjectKind {
    if defines(b"hipMalloc") && defines(b"hipRuntimeGetVersion") {
        ObjectKind::HipRuntime
    } else if defines(b"hsa_init") {
        ObjectKind::RuntimePart
    } else {
        ObjectKind::Other
    }
}

/// Whether a file name looks like a HIP runtime or ROCr, to log when one cannot be read.
fn named_like_runtime(path: &[u8]) -> bool {
    let file = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
    file.starts_with(b"libamdhip64") || file.starts_with(b"libhsa-runtime64")
}

fn is_runtime_part(map: usize) -> bool {
    map != 0 && RUNTIME_PARTS.iter().any(|c| c.load(Relaxed) == map)
}

fn remember_part(map: usize) {
    for slot in &RUNTIME_PARTS {
        if slot.compare_exchange(0, map, Relaxed, Relaxed).is_ok() || slot.load(Relaxed) == map {
            return;
        }
    }
}

/// Whether calls made by the object `map` are the runtime's own.
fn is_runtime_caller(map: usize) -> bool {
    runtime_index(map).is_some() || is_runtime_part(map)
}

/// Accepts the interface version the linker offers, up to 2 (glibc 2.35 raised LAV_CURRENT to
/// 2; answering 1 would be refused on aarch64). An internal error still accepts it: the
/// hook stays loaded, at the default log level.
#[unsafe(no_mangle)]
pub extern "C" fn la_version(version: c_uint) -> c_uint {
    guarded("la_version", version.min(2), || {
        crate::log::set_level(crate::log::parse_level(
            std::env::var("LIBHIP_LOG_LEVEL").ok().as_deref(),
        ));
        version.min(2)
    })
}

/// Asks for bindings from and to every object (a HIP runtime is known by what it defines,
/// so any object may turn out to be one), and records which objects are HIP runtimes. An
/// internal error leaves the object unrecorded (its calls are not limited: logged).
///
/// # Safety
/// Called by the dynamic linker: `map` is NULL or a live link map (`l_name` NULL or
/// NUL-terminated, `l_ld` the dynamic section of the object mapped at `l_addr`), `cookie`
/// NULL or its cookie.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_objopen(
    map: *mut LinkMap,
    lmid: libc::c_long,
    cookie: *mut usize,
) -> c_uint {
    const ALL: c_uint = LA_FLG_BINDTO | LA_FLG_BINDFROM;
    guarded("la_objopen", ALL, || {
        if map.is_null() || cookie.is_null() {
            return ALL;
        }
        // SAFETY: the linker passes a live link map; l_name is NULL or NUL-terminated.
        let (name, base, dynamic) = unsafe { ((*map).l_name, (*map).l_addr, (*map).l_ld) };
        let path = if name.is_null() {
            &b""[..]
        } else {
            // SAFETY: non-null NUL-terminated string owned by the linker.
            unsafe { CStr::from_ptr(name) }.to_bytes()
        };
        // glibc's cookie starts as the link map's address, which the symbol-binding callback
        // gets back as `refcook`/`defcook`.
        let key = map as usize;
        // SAFETY: l_ld of the live link map of an object mapped at l_addr.
        let kind = match unsafe { DynTables::read(base, dynamic) } {
            Some(tables) => {
                if lmid == libc::LM_ID_BASE {
                    // The program is the first object of the base namespace; libc is the
                    // one defining environ and setenv (the environment the pin rewrites).
                    let _ = MAIN_PROGRAM.compare_exchange(0, key, Relaxed, Relaxed);
                    if key != MAIN_PROGRAM.load(Relaxed)
                        && tables.lookup(b"environ").is_some()
                        && tables.lookup(b"setenv").is_some()
                    {
                        let _ = LIBC.compare_exchange(0, key, Relaxed, Relaxed);
                    }
                }
                classify(&|name| tables.lookup(name).is_some())
            }
            None => {
                if named_like_runtime(path) {
                    crate::log::error(format_args!(
                        "cannot read the dynamic symbol table of {}: its HIP calls are not limited",
                        String::from_utf8_lossy(path)
                    ));
                }
                ObjectKind::Other
            }
        };
        match kind {
            ObjectKind::HipRuntime => match add_runtime(key) {
                Some(index) => crate::log::debug(format_args!(
                    "HIP runtime {index}: {}",
                    String::from_utf8_lossy(path)
                )),
                None => crate::log::error(format_args!(
                    "more than {} HIP runtimes are loaded; calls to {} are not limited",
                    crate::symbols::MAX_RUNTIMES,
                    String::from_utf8_lossy(path)
                )),
            },
            ObjectKind::RuntimePart => remember_part(key),
            ObjectKind::Other => {
                if named_like_runtime(path) && !path.is_empty() {
                    crate::log::error(format_args!(
                        "{} is named like a HIP runtime but defines neither hipMalloc and hipRuntimeGetVersion nor hsa_init: its calls are not limited",
                        String::from_utf8_lossy(path)
                    ));
                }
            }
        }
        ALL
    })
}

/// Before the program's constructors and `main`: puts the pinned values into the process's
/// `environ`, which the HIP layer walks (rocclr's flag parser does not use `getenv`). An
/// internal error leaves `environ` as it was (logged).
///
/// # Safety
/// Called by the dynamic linker once, before any of the application's code runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_preinit(_cookie: *mut usize) {
    // SAFETY: before the program's constructors: no other code uses the environment yet.
    guarded("la_preinit", (), || unsafe {
        crate::pinned_env::apply_to_environ()
    });
}

/// What a binding should resolve to: the wrapper of runtime `index`, or the real address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The real function, unredirected.
    Real,
    /// The wrapper for the runtime of this index (0 for the environment wrappers).
    Wrapper(usize),
}

/// The routing rule, over plain data: a HIP name bound *to* runtime `definer` from a caller
/// outside every runtime gets that runtime's wrapper; the runtime's own calls stay real (no
/// double counting); `getenv` is redirected only when the runtime (or ROCr) reads it.
pub fn decide(sym: Sym, definer: Option<usize>, caller_is_runtime: bool) -> Route {
    if !sym.is_redirected() {
        return Route::Real;
    }
    if sym.is_libc() {
        // The runtime's reads are pinned; the application's changes are filtered.
        return if caller_is_runtime != sym.changes_environment() {
            Route::Wrapper(0)
        } else {
            Route::Real
        };
    }
    match definer {
        Some(index) if !caller_is_runtime => Route::Wrapper(index),
        _ => Route::Real,
    }
}

/// Substitutes the wrapper for intercepted HIP calls of callers outside the runtime. An
/// internal error binds the symbol where the linker resolved it (the caller still runs).
///
/// # Safety
/// Called by the dynamic linker: `sym` is NULL or its symbol, whose `st_value` is the
/// resolved address; `refcook`/`defcook` are NULL or the objects' cookies; `flags` is NULL or
/// the linker's flag word; `symname` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_symbind64(
    sym: *mut libc::Elf64_Sym,
    _ndx: c_uint,
    refcook: *mut usize,
    defcook: *mut usize,
    flags: *mut c_uint,
    symname: *const c_char,
) -> usize {
    // The fallback is the linker's own answer, read before the guard (a load cannot panic).
    let real = if sym.is_null() {
        0
    } else {
        // SAFETY: non-null: the linker's symbol, by this function's contract.
        unsafe { (*sym).st_value as usize }
    };
    guarded("la_symbind64", real, || {
        if sym.is_null() || symname.is_null() {
            return real;
        }
        // SAFETY: non-null NUL-terminated name owned by the linker.
        let Some(which) = Sym::from_name(unsafe { CStr::from_ptr(symname) }.to_bytes()) else {
            return real;
        };
        let read = |cookie: *mut usize| {
            if cookie.is_null() {
                0
            } else {
                // SAFETY: non-null: an object's cookie, by this function's contract.
                unsafe { *cookie }
            }
        };
        let (caller, definer) = (read(refcook), read(defcook));
        let definer_index = runtime_index(definer);
        if which.is_libc() {
            note_real(0, which, real);
        } else if let Some(index) = definer_index {
            note_real(index, which, real);
        }
        match decide(which, definer_index, is_runtime_caller(caller)) {
            Route::Real => real,
            Route::Wrapper(index) => {
                crate::log::debug(format_args!(
                    "binding {} to the hook's wrapper (runtime {index})",
                    which.name()
                ));
                if !flags.is_null() {
                    // SAFETY: flags points at the linker's flag word.
                    unsafe { *flags |= LA_SYMB_NOPLTENTER | LA_SYMB_NOPLTEXIT };
                }
                crate::wrappers::wrapper_address(which, index).unwrap_or(real)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_classified_by_what_they_define() {
        let defines = |names: &'static [&'static str]| {
            move |name: &[u8]| names.iter().any(|n| n.as_bytes() == name)
        };
        assert_eq!(
            classify(&defines(&["hipMalloc", "hipRuntimeGetVersion", "hipFree"])),
            ObjectKind::HipRuntime
        );
        assert_eq!(classify(&defines(&["hsa_init"])), ObjectKind::RuntimePart);
        // A shim that only forwards hipMalloc is not a runtime.
        assert_eq!(classify(&defines(&["hipMalloc"])), ObjectKind::Other);
        assert_eq!(classify(&defines(&[])), ObjectKind::Other);
        assert!(named_like_runtime(b"/venv/lib/libamdhip64-1a2b3c4d.so.5"));
        assert!(!named_like_runtime(b"/lib/libc.so.6"));
    }

    #[test]
    fn each_binding_goes_to_the_runtime_that_defines_it() {
        assert_eq!(decide(Sym::HipMalloc, Some(0), false), Route::Wrapper(0));
        assert_eq!(decide(Sym::HipMalloc, Some(1), false), Route::Wrapper(1));
        assert_eq!(decide(Sym::HipMalloc, Some(1), true), Route::Real);
        // Bound to something that is not a runtime (a forwarding shim): its own call into
        // the runtime is the one counted.
        assert_eq!(decide(Sym::HipMalloc, None, false), Route::Real);
        assert_eq!(decide(Sym::Getenv, None, true), Route::Wrapper(0));
        assert_eq!(decide(Sym::Getenv, None, false), Route::Real);
        assert_eq!(decide(Sym::Setenv, None, false), Route::Wrapper(0));
        assert_eq!(decide(Sym::Clearenv, None, false), Route::Wrapper(0));
        assert_eq!(decide(Sym::Setenv, None, true), Route::Real);
        assert_eq!(decide(Sym::HipGetDevice, Some(0), false), Route::Real);
    }
}
