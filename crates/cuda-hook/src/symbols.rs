//! The symbols the hook knows, where each real function is, and the real `dlsym`.
//!
//! Real functions are looked up in the libraries themselves (`libcuda.so.1`,
//! `libnvidia-ml.so.1`, opened with `dlopen` — already loaded ones are just referenced), never
//! through the global scope, which would find our own wrappers (HAMi-core's internal calls
//! hit its own wrappers, §1.3 of the reference notes).

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

macro_rules! symbols {
    ($($variant:ident = $name:literal, $redirected:literal;)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Sym { $($variant,)* }
        const NAMES: &[(&str, Sym, bool)] = &[$(($name, Sym::$variant, $redirected),)*];
    };
}

symbols! {
    CuInit = "cuInit", true;
    CuGetProcAddress = "cuGetProcAddress", true;
    CuGetProcAddressV2 = "cuGetProcAddress_v2", true;
    CuMemAllocV2 = "cuMemAlloc_v2", true;
    CuMemFreeV2 = "cuMemFree_v2", true;
    CuMemAllocManaged = "cuMemAllocManaged", true;
    CuMemAllocPitchV2 = "cuMemAllocPitch_v2", true;
    CuMemAllocAsync = "cuMemAllocAsync", true;
    CuMemAllocAsyncPtsz = "cuMemAllocAsync_ptsz", true;
    CuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync", true;
    CuMemAllocFromPoolAsyncPtsz = "cuMemAllocFromPoolAsync_ptsz", true;
    CuMemFreeAsync = "cuMemFreeAsync", true;
    CuMemFreeAsyncPtsz = "cuMemFreeAsync_ptsz", true;
    CuMemCreate = "cuMemCreate", true;
    CuMemRelease = "cuMemRelease", true;
    CuArrayCreateV2 = "cuArrayCreate_v2", true;
    CuArray3DCreateV2 = "cuArray3DCreate_v2", true;
    CuArrayDestroy = "cuArrayDestroy", true;
    CuMemGetInfoV2 = "cuMemGetInfo_v2", true;
    CuDeviceTotalMemV2 = "cuDeviceTotalMem_v2", true;
    CuLaunchKernel = "cuLaunchKernel", true;
    CuLaunchKernelPtsz = "cuLaunchKernel_ptsz", true;
    CuLaunchKernelEx = "cuLaunchKernelEx", true;
    CuLaunchKernelExPtsz = "cuLaunchKernelEx_ptsz", true;
    CuLaunchCooperativeKernel = "cuLaunchCooperativeKernel", true;
    CuLaunchCooperativeKernelPtsz = "cuLaunchCooperativeKernel_ptsz", true;
    CuGraphLaunch = "cuGraphLaunch", true;
    CuGraphLaunchPtsz = "cuGraphLaunch_ptsz", true;
    NvmlDeviceGetMemoryInfo = "nvmlDeviceGetMemoryInfo", true;
    NvmlDeviceGetMemoryInfoV2 = "nvmlDeviceGetMemoryInfo_v2", true;
    CuCtxGetDevice = "cuCtxGetDevice", false;
    CuDeviceGetCount = "cuDeviceGetCount", false;
    CuDeviceGetUuid = "cuDeviceGetUuid", false;
    NvmlInitV2 = "nvmlInit_v2", false;
    NvmlDeviceGetCountV2 = "nvmlDeviceGetCount_v2", false;
    NvmlDeviceGetHandleByIndexV2 = "nvmlDeviceGetHandleByIndex_v2", false;
    NvmlDeviceGetUuid = "nvmlDeviceGetUUID", false;
    NvmlDeviceGetIndex = "nvmlDeviceGetIndex", false;
    NvmlDeviceGetProcessUtilization = "nvmlDeviceGetProcessUtilization", false;
}

pub const COUNT: usize = NAMES.len();

/// The real function of each symbol (0 = not yet known).
static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

impl Sym {
    pub fn from_name(name: &[u8]) -> Option<Sym> {
        // Cheap rejection first: this runs for every dlsym of the process.
        if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
            return None;
        }
        NAMES
            .iter()
            .find(|(n, _, _)| n.as_bytes() == name)
            .map(|(_, s, _)| *s)
    }

    pub fn name(self) -> &'static str {
        NAMES[self as usize].0
    }

    pub fn is_redirected(self) -> bool {
        NAMES[self as usize].2
    }

    fn is_nvml(self) -> bool {
        self.name().starts_with("nvml")
    }

    pub fn all() -> impl Iterator<Item = Sym> {
        NAMES.iter().map(|(_, s, _)| *s)
    }
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// glibc's own `dlsym` (ours shadows it), found with `dlvsym`, which we do not export.
pub fn real_dlsym() -> Option<DlsymFn> {
    let known = REAL_DLSYM.load(Relaxed);
    if known != 0 {
        // SAFETY: only addresses of glibc's dlsym are stored.
        return Some(unsafe { std::mem::transmute::<usize, DlsymFn>(known) });
    }
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings; it does not call dlsym.
        let found = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            REAL_DLSYM.store(found as usize, Relaxed);
            // SAFETY: the address of glibc's dlsym.
            return Some(unsafe { std::mem::transmute::<usize, DlsymFn>(found as usize) });
        }
    }
    None
}

static CUDA_HANDLE: AtomicUsize = AtomicUsize::new(0);
static NVML_HANDLE: AtomicUsize = AtomicUsize::new(0);

fn library(slot: &AtomicUsize, name: &CStr) -> Option<usize> {
    let known = slot.load(Relaxed);
    if known != 0 {
        return Some(known);
    }
    // SAFETY: dlopen of a NUL-terminated name; the handle is kept for the process's life.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY) } as usize;
    if handle == 0 {
        return None;
    }
    slot.store(handle, Relaxed);
    Some(handle)
}

/// Whether `libnvidia-ml.so.1` can be loaded.
pub fn nvml_available() -> bool {
    library(&NVML_HANDLE, c"libnvidia-ml.so.1").is_some()
}

/// Remembers `address` as the real `sym` (first one wins).
pub fn note_real(sym: Sym, address: usize) {
    if address != 0 {
        let _ = REAL[sym as usize].compare_exchange(0, address, Relaxed, Relaxed);
    }
}

/// The real function of `sym`.
pub fn real(sym: Sym) -> Option<usize> {
    let known = REAL[sym as usize].load(Relaxed);
    if known != 0 {
        return Some(known);
    }
    let handle = if sym.is_nvml() {
        library(&NVML_HANDLE, c"libnvidia-ml.so.1")?
    } else {
        library(&CUDA_HANDLE, c"libcuda.so.1")?
    };
    let dlsym = real_dlsym()?;
    let name = std::ffi::CString::new(sym.name()).ok()?;
    // SAFETY: glibc's dlsym with a dlopen handle and a NUL-terminated name.
    let address = unsafe { dlsym(handle as *mut c_void, name.as_ptr()) } as usize;
    note_real(sym, address);
    (address != 0).then_some(address)
}

/// The symbol whose real function is at `address` (for `cuGetProcAddress` results).
pub fn redirected_at(address: usize) -> Option<Sym> {
    Sym::all().find(|s| s.is_redirected() && !s.is_nvml() && real(*s) == Some(address))
}

/// Calls the real `sym` as a function of type `F`.
macro_rules! real_fn {
    ($sym:expr, $ty:ty) => {
        $crate::symbols::real($sym).map(|a| {
            // SAFETY: the address is the real function of this name, whose C signature is $ty.
            unsafe { std::mem::transmute::<usize, $ty>(a) }
        })
    };
}
pub(crate) use real_fn;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_table_order() {
        for (index, (name, sym, _)) in NAMES.iter().enumerate() {
            assert_eq!(*sym as usize, index);
            assert_eq!(Sym::from_name(name.as_bytes()), Some(*sym));
        }
        assert_eq!(
            Sym::from_name(b"cuMemAlloc"),
            None,
            "the 32-bit v1 ABI is not wrapped"
        );
        assert_eq!(Sym::from_name(b"malloc"), None);
    }
}
