//! The symbols the hook knows: which it redirects, and where each one's real function is.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Every symbol the hook redirects or needs to call. The discriminant indexes [`REAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Sym {
    HipMalloc,
    HipFree,
    HipMallocAsync,
    HipFreeAsync,
    HipMallocFromPoolAsync,
    HipMalloc3D,
    HipMallocPitch,
    HipMallocArray,
    HipMalloc3DArray,
    HipFreeArray,
    HipMallocManaged,
    HipExtMallocWithFlags,
    HipMemCreate,
    HipMemRelease,
    HipMemPoolCreate,
    HipDeviceGetDefaultMemPool,
    HipMemGetInfo,
    HipGetDeviceProperties,
    HipGetDevicePropertiesR0600,
    HipDeviceGetAttribute,
    HipDeviceTotalMem,
    HipGetProcAddress,
    Getenv,
    SecureGetenv,
    /// Called, never redirected.
    HipGetDevice,
}

pub const COUNT: usize = Sym::HipGetDevice as usize + 1;

const NAMES: [(&str, Sym); COUNT] = [
    ("hipMalloc", Sym::HipMalloc),
    ("hipFree", Sym::HipFree),
    ("hipMallocAsync", Sym::HipMallocAsync),
    ("hipFreeAsync", Sym::HipFreeAsync),
    ("hipMallocFromPoolAsync", Sym::HipMallocFromPoolAsync),
    ("hipMalloc3D", Sym::HipMalloc3D),
    ("hipMallocPitch", Sym::HipMallocPitch),
    ("hipMallocArray", Sym::HipMallocArray),
    ("hipMalloc3DArray", Sym::HipMalloc3DArray),
    ("hipFreeArray", Sym::HipFreeArray),
    ("hipMallocManaged", Sym::HipMallocManaged),
    ("hipExtMallocWithFlags", Sym::HipExtMallocWithFlags),
    ("hipMemCreate", Sym::HipMemCreate),
    ("hipMemRelease", Sym::HipMemRelease),
    ("hipMemPoolCreate", Sym::HipMemPoolCreate),
    (
        "hipDeviceGetDefaultMemPool",
        Sym::HipDeviceGetDefaultMemPool,
    ),
    ("hipMemGetInfo", Sym::HipMemGetInfo),
    ("hipGetDeviceProperties", Sym::HipGetDeviceProperties),
    (
        "hipGetDevicePropertiesR0600",
        Sym::HipGetDevicePropertiesR0600,
    ),
    ("hipDeviceGetAttribute", Sym::HipDeviceGetAttribute),
    ("hipDeviceTotalMem", Sym::HipDeviceTotalMem),
    ("hipGetProcAddress", Sym::HipGetProcAddress),
    ("getenv", Sym::Getenv),
    ("secure_getenv", Sym::SecureGetenv),
    ("hipGetDevice", Sym::HipGetDevice),
];

impl Sym {
    pub fn from_name(name: &[u8]) -> Option<Sym> {
        // Cheap rejection first: this runs for every audited binding.
        match name.first() {
            Some(b'h') | Some(b'g') | Some(b's') => {}
            _ => return None,
        }
        NAMES
            .iter()
            .find(|(n, _)| n.as_bytes() == name)
            .map(|(_, sym)| *sym)
    }

    pub fn name(self) -> &'static str {
        NAMES[self as usize].0
    }

    /// Symbols bound from libc rather than from HIP.
    pub fn is_libc(self) -> bool {
        matches!(self, Sym::Getenv | Sym::SecureGetenv)
    }

    /// Whether callers get a wrapper for this symbol.
    pub fn is_redirected(self) -> bool {
        self != Sym::HipGetDevice
    }
}

/// The real function of each symbol, as first seen bound (0 = not yet known).
pub static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

/// Remembers `address` as the real `sym` unless one is known already.
pub fn note_real(sym: Sym, address: usize) {
    if address != 0 {
        let _ = REAL[sym as usize].compare_exchange(0, address, Relaxed, Relaxed);
    }
}

/// The path of the HIP runtime as the linker loaded it (from `la_objopen`).
pub static HIP_PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

/// A `dlsym` handle of the HIP runtime in the application's namespace (0 = none yet).
static HIP_HANDLE: AtomicUsize = AtomicUsize::new(0);

fn hip_handle() -> Option<usize> {
    let known = HIP_HANDLE.load(Relaxed);
    if known != 0 {
        return Some(known);
    }
    let path = HIP_PATH.get()?;
    // SAFETY: dlmopen of an object already loaded in the base namespace (RTLD_NOLOAD: never
    // loads anything); the path is NUL-terminated. The handle is kept for the process's life.
    let handle = unsafe {
        libc::dlmopen(
            libc::LM_ID_BASE,
            path.as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    } as usize;
    if handle == 0 {
        return None;
    }
    HIP_HANDLE.store(handle, Relaxed);
    Some(handle)
}

/// The real function of `sym`: as bound, or looked up in the HIP runtime.
pub fn real(sym: Sym) -> Option<usize> {
    let known = REAL[sym as usize].load(Relaxed);
    if known != 0 {
        return Some(known);
    }
    if sym.is_libc() {
        return None;
    }
    let handle = hip_handle()?;
    let name = std::ffi::CString::new(sym.name()).ok()?;
    // SAFETY: a handle from dlmopen and a NUL-terminated name. dlsym from the audit namespace
    // does not re-enter la_symbind.
    let address = unsafe { libc::dlsym(handle as *mut libc::c_void, name.as_ptr()) } as usize;
    note_real(sym, address);
    (address != 0).then_some(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_table_order() {
        for (index, (name, sym)) in NAMES.iter().enumerate() {
            assert_eq!(*sym as usize, index);
            assert_eq!(Sym::from_name(name.as_bytes()), Some(*sym));
            assert_eq!(sym.name(), *name);
        }
        assert_eq!(Sym::from_name(b"hipMallocMipmappedArray"), None);
        assert_eq!(Sym::from_name(b"malloc"), None);
        assert_eq!(Sym::from_name(b""), None);
    }
}
