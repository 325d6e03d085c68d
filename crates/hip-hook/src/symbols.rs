//! The symbols the hook knows: which it redirects, and where each one's real function is.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Every symbol the hook redirects or needs to call. The discriminant indexes [`REAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Sym {
    /// `hipMalloc`.
    HipMalloc,
    /// `hipFree`.
    HipFree,
    /// `hipMallocAsync`.
    HipMallocAsync,
    /// `hipFreeAsync`.
    HipFreeAsync,
    /// `hipMallocFromPoolAsync`.
    HipMallocFromPoolAsync,
    /// `hipMalloc3D`.
    HipMalloc3D,
    /// `hipMallocPitch`.
    HipMallocPitch,
    /// `hipMallocArray`.
    HipMallocArray,
    /// `hipMalloc3DArray`.
    HipMalloc3DArray,
    /// `hipFreeArray`.
    HipFreeArray,
    /// `hipMallocManaged`.
    HipMallocManaged,
    /// `hipExtMallocWithFlags`.
    HipExtMallocWithFlags,
    /// `hipMemCreate`.
    HipMemCreate,
    /// `hipMemRelease`.
    HipMemRelease,
    /// `hipMemPoolCreate`.
    HipMemPoolCreate,
    /// `hipDeviceGetDefaultMemPool`.
    HipDeviceGetDefaultMemPool,
    /// `hipMemGetInfo`.
    HipMemGetInfo,
    /// `hipGetDeviceProperties`.
    HipGetDeviceProperties,
    /// `hipGetDevicePropertiesR0600`.
    HipGetDevicePropertiesR0600,
    /// `hipDeviceGetAttribute`.
    HipDeviceGetAttribute,
    /// `hipDeviceTotalMem`.
    HipDeviceTotalMem,
    /// `hipGetProcAddress`.
    HipGetProcAddress,
    /// `hipMemAllocPitch`.
    HipMemAllocPitch,
    /// `hipArrayCreate`.
    HipArrayCreate,
    /// `hipArray3DCreate`.
    HipArray3DCreate,
    /// `hipArrayDestroy`.
    HipArrayDestroy,
    /// `hipMallocMipmappedArray`.
    HipMallocMipmappedArray,
    /// `hipFreeMipmappedArray`.
    HipFreeMipmappedArray,
    /// `hipMipmappedArrayCreate`.
    HipMipmappedArrayCreate,
    /// `hipMipmappedArrayDestroy`.
    HipMipmappedArrayDestroy,
    /// `hipGraphAddMemAllocNode`.
    HipGraphAddMemAllocNode,
    /// `getenv` of the runtime and its parts: pinned names answer the pod spec's value.
    Getenv,
    /// `secure_getenv` of the runtime and its parts: pinned names answer the pod spec's value.
    SecureGetenv,
    /// The application's environment changes (libc): pinned names are kept.
    Setenv,
    /// `putenv` of the application (libc): pinned names are kept.
    Putenv,
    /// `unsetenv` of the application (libc): pinned names are kept.
    Unsetenv,
    /// `clearenv` of the application (libc): pinned names are kept.
    Clearenv,
    /// Called, never redirected.
    HipGetDevice,
    /// Called, never redirected: picks the struct layouts (`hipMemAllocationProp`).
    HipRuntimeGetVersion,
}

/// Number of [`Sym`]s (the length of [`REAL`]).
pub const COUNT: usize = Sym::HipRuntimeGetVersion as usize + 1;

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
    ("hipMemAllocPitch", Sym::HipMemAllocPitch),
    ("hipArrayCreate", Sym::HipArrayCreate),
    ("hipArray3DCreate", Sym::HipArray3DCreate),
    ("hipArrayDestroy", Sym::HipArrayDestroy),
    ("hipMallocMipmappedArray", Sym::HipMallocMipmappedArray),
    ("hipFreeMipmappedArray", Sym::HipFreeMipmappedArray),
    ("hipMipmappedArrayCreate", Sym::HipMipmappedArrayCreate),
    ("hipMipmappedArrayDestroy", Sym::HipMipmappedArrayDestroy),
    ("hipGraphAddMemAllocNode", Sym::HipGraphAddMemAllocNode),
    ("getenv", Sym::Getenv),
    ("secure_getenv", Sym::SecureGetenv),
    ("setenv", Sym::Setenv),
    ("putenv", Sym::Putenv),
    ("unsetenv", Sym::Unsetenv),
    ("clearenv", Sym::Clearenv),
    ("hipGetDevice", Sym::HipGetDevice),
    ("hipRuntimeGetVersion", Sym::HipRuntimeGetVersion),
];

impl Sym {
    /// The symbol named `name`, if the hook knows it.
    pub fn from_name(name: &[u8]) -> Option<Sym> {
        // Cheap rejection first: this runs for every audited binding.
        match name.first() {
            Some(b'h' | b'g' | b's' | b'p' | b'u' | b'c') => {}
            _ => return None,
        }
        NAMES
            .iter()
            .find(|(n, _)| n.as_bytes() == name)
            .map(|(_, sym)| *sym)
    }

    /// The symbol's C name.
    pub fn name(self) -> &'static str {
        NAMES[self as usize].0
    }

    /// Every symbol, in table order.
    pub fn all() -> impl Iterator<Item = Sym> {
        NAMES.iter().map(|(_, sym)| *sym)
    }

    /// Symbols bound from libc rather than from HIP.
    pub fn is_libc(self) -> bool {
        matches!(
            self,
            Sym::Getenv
                | Sym::SecureGetenv
                | Sym::Setenv
                | Sym::Putenv
                | Sym::Unsetenv
                | Sym::Clearenv
        )
    }

    /// libc functions that change the environment (redirected for the application, not for
    /// the runtime).
    pub fn changes_environment(self) -> bool {
        matches!(
            self,
            Sym::Setenv | Sym::Putenv | Sym::Unsetenv | Sym::Clearenv
        )
    }

    /// Whether callers get a wrapper for this symbol.
    pub fn is_redirected(self) -> bool {
        !matches!(self, Sym::HipGetDevice | Sym::HipRuntimeGetVersion)
    }
}

/// HIP runtimes one process can hold at once (each gets its own wrappers, so every call
/// goes to the runtime it was bound to).
pub const MAX_RUNTIMES: usize = 4;

/// Link maps of the recognised HIP runtimes (0 = free slot), in order of loading.
pub static RUNTIMES: [AtomicUsize; MAX_RUNTIMES] = [const { AtomicUsize::new(0) }; MAX_RUNTIMES];

/// The real function of each symbol per runtime, as first seen bound (0 = not yet known).
/// libc's `getenv`/`secure_getenv` live in runtime 0's row.
pub static REAL: [[AtomicUsize; COUNT]; MAX_RUNTIMES] =
    [const { [const { AtomicUsize::new(0) }; COUNT] }; MAX_RUNTIMES];

/// The index of the runtime whose link map is `map`, if it is one.
pub fn runtime_index(map: usize) -> Option<usize> {
    if map == 0 {
        return None;
    }
    RUNTIMES.iter().position(|slot| slot.load(Relaxed) == map)
}

/// Records `map` as a HIP runtime; `None` when [`MAX_RUNTIMES`] are known already.
pub fn add_runtime(map: usize) -> Option<usize> {
    for (index, slot) in RUNTIMES.iter().enumerate() {
        match slot.compare_exchange(0, map, Relaxed, Relaxed) {
            Ok(_) => return Some(index),
            Err(existing) if existing == map => return Some(index),
            Err(_) => {}
        }
    }
    None
}

/// Link maps of the application's program and of its libc (the object of the base namespace
/// that defines `environ` and `setenv`), from `la_objopen`.
pub static MAIN_PROGRAM: AtomicUsize = AtomicUsize::new(0);
/// See [`MAIN_PROGRAM`].
pub static LIBC: AtomicUsize = AtomicUsize::new(0);

/// Looks `name` up in the object whose link map is `map` (0: none).
///
/// # Safety
/// `map` is 0 or the address of a link map recorded by `la_objopen` ([`RUNTIMES`],
/// [`MAIN_PROGRAM`], [`LIBC`]) of an object that is still loaded.
pub unsafe fn lookup_in(map: usize, name: &str) -> Option<usize> {
    if map == 0 {
        return None;
    }
    let map = map as *const crate::audit::LinkMap;
    // SAFETY: a live link map by this function's contract; its l_ld is the dynamic section of
    // the object mapped at l_addr.
    let tables = unsafe { crate::elf_symbols::DynTables::read((*map).l_addr, (*map).l_ld) }?;
    tables.lookup(name.as_bytes())
}

/// Remembers `address` as runtime `runtime`'s real `sym` unless one is known already.
pub fn note_real(runtime: usize, sym: Sym, address: usize) {
    let row = if sym.is_libc() { 0 } else { runtime };
    if address != 0
        && let Some(row) = REAL.get(row)
    {
        let _ = row[sym as usize].compare_exchange(0, address, Relaxed, Relaxed);
    }
}

/// The real function of `sym` in runtime `runtime`: as bound, or looked up in that
/// runtime's own dynamic symbol table.
pub fn real(runtime: usize, sym: Sym) -> Option<usize> {
    let row = if sym.is_libc() { 0 } else { runtime };
    let known = REAL.get(row)?[sym as usize].load(Relaxed);
    if known != 0 {
        return Some(known);
    }
    // HIP runtimes are not unloaded while their wrappers can still be called (dlclose of a
    // runtime with live allocations is the application's bug, documented in the README).
    let map = if sym.is_libc() {
        LIBC.load(Relaxed)
    } else {
        RUNTIMES.get(runtime)?.load(Relaxed)
    };
    // SAFETY: a runtime's or libc's link map from la_objopen; those objects stay loaded (a
    // program and its libc for the process's life, runtimes while their wrappers run).
    let address = unsafe { lookup_in(map, sym.name()) }?;
    note_real(runtime, sym, address);
    Some(address)
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
        assert_eq!(
            Sym::from_name(b"hipMallocMipmappedArray"),
            Some(Sym::HipMallocMipmappedArray)
        );
        assert_eq!(Sym::from_name(b"hipMallocHost"), None);
        assert_eq!(Sym::from_name(b"malloc"), None);
        assert_eq!(Sym::from_name(b""), None);
    }
}
