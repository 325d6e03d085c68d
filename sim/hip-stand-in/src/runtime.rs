//! The stand-in runtime's process state, created on the first HIP call (like the real one).

use std::cell::Cell;
use std::ffi::{CStr, c_int};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::abi::{HIP_ERROR_INVALID_DEVICE, HIP_ERROR_NO_DEVICE, HipError};
use crate::allocations::Table;
use crate::config::Config;
use crate::device_memory::DeviceMemory;
use crate::drm_client::{DrmClients, render_minors};

pub struct Runtime {
    pub config: Config,
    pub memory: DeviceMemory,
    table: Mutex<Table>,
    /// `HSA_CU_MASK` as read (through `getenv`) at initialisation, as ROCr ≥ 6.0 does;
    /// `None` on a runtime claiming ROCm 5.x, whose ROCr does not read it.
    pub cu_mask: Option<String>,
    /// `ROC_GLOBAL_CU_MASK` as HIP's flag parser reads it at initialisation: by walking
    /// `environ`, not through `getenv` (rocclr's `Flag::init`).
    pub global_cu_mask: Option<String>,
    /// What the amdgpu driver records of this process's kernels (`drm_client.rs`).
    pub drm: DrmClients,
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

thread_local! {
    static CURRENT_DEVICE: Cell<usize> = const { Cell::new(0) };
}

type GetenvFn = unsafe extern "C" fn(*const libc::c_char) -> *mut libc::c_char;

/// Reads a variable through libc's `getenv` bound by the dynamic linker for this library, as
/// ROCr's reads are, so that an `LD_AUDIT` hook sees this library bind it. (Rust calls libc
/// through the GOT without a PLT, which the linker does not audit; `dlsym` it is.)
fn getenv(name: &CStr) -> Option<String> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getenv".as_ptr()) } as usize;
    if address == 0 {
        return None;
    }
    // SAFETY: the address is libc's getenv (or an audit hook's wrapper with its signature).
    let getenv: GetenvFn = unsafe { std::mem::transmute::<usize, GetenvFn>(address) };
    // SAFETY: name is NUL-terminated; the result is NULL or a NUL-terminated string that we
    // copy at once.
    let value = unsafe { getenv(name.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: non-null result of getenv.
    Some(
        unsafe { CStr::from_ptr(value) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Reads `name` by walking the process's `environ` array (Rust's `vars_os` iterates it
/// directly), as rocclr's flag parser does: an `LD_AUDIT` hook's `getenv` never sees this.
fn from_environ(name: &str) -> Option<String> {
    std::env::vars_os()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.to_string_lossy().into_owned())
}

/// The devices `HIP_VISIBLE_DEVICES` leaves, in its order: indices into what the process
/// can see, as HIP reads it; the list stops at the first entry that is not a visible
/// index (or repeats one), as the runtime does.
pub fn visible(minors: Vec<u32>, spec: Option<&str>) -> Vec<u32> {
    let Some(spec) = spec else { return minors };
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        match item.parse::<usize>().ok().and_then(|i| minors.get(i)) {
            Some(m) if !out.contains(m) => out.push(*m),
            _ => break,
        }
    }
    out
}

fn init() -> Result<Runtime, String> {
    let mut config = Config::from_lookup(|key| {
        let key = std::ffi::CString::new(key).ok()?;
        getenv(&key)
    })?;
    // With a driver, the devices are the render nodes this process can see, as ROCr finds
    // them: a container has exactly the ones kubelet gave it.
    let minors = if config.driver_socket.is_some() {
        let minors = visible(
            render_minors(std::path::Path::new("/dev/dri")),
            getenv(c"HIP_VISIBLE_DEVICES").as_deref(),
        );
        config.device_count = minors.len().min(crate::config::MAX_DEVICES);
        minors
    } else {
        Vec::new()
    };
    let memory = DeviceMemory::open(config.shared_state.as_deref(), config.device_memory)?;
    Ok(Runtime {
        memory,
        table: Mutex::new(Table::default()),
        cu_mask: if config.runtime_version >= 60_000_000 {
            getenv(c"HSA_CU_MASK")
        } else {
            None
        },
        global_cu_mask: from_environ("ROC_GLOBAL_CU_MASK"),
        drm: DrmClients::new(config.driver_socket.clone(), minors),
        config,
    })
}

/// The runtime, or the error that made initialisation fail (printed once).
pub fn runtime() -> Result<&'static Runtime, HipError> {
    match RUNTIME.get_or_init(|| {
        let runtime = init();
        if let Err(err) = &runtime {
            eprintln!("libamdhip64 (stand-in): {err}");
        }
        runtime
    }) {
        Ok(runtime) => Ok(runtime),
        Err(_) => Err(HIP_ERROR_NO_DEVICE),
    }
}

impl Runtime {
    pub fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn check_device(&self, device: c_int) -> Result<usize, HipError> {
        usize::try_from(device)
            .ok()
            .filter(|d| *d < self.config.device_count)
            .ok_or(HIP_ERROR_INVALID_DEVICE)
    }

    pub fn current_device(&self) -> Result<usize, HipError> {
        let device = CURRENT_DEVICE.with(Cell::get);
        if device < self.config.device_count {
            Ok(device)
        } else {
            Err(HIP_ERROR_NO_DEVICE)
        }
    }

    pub fn set_current_device(&self, device: usize) {
        CURRENT_DEVICE.with(|current| current.set(device));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hip_visible_devices_reorders_and_stops_at_a_bad_entry() {
        let minors = vec![128, 129, 130];
        assert_eq!(super::visible(minors.clone(), None), minors);
        assert_eq!(super::visible(minors.clone(), Some("2,0")), vec![130, 128]);
        assert_eq!(super::visible(minors.clone(), Some("1,7,0")), vec![129]);
        assert_eq!(super::visible(minors.clone(), Some("1,1")), vec![129]);
        assert!(super::visible(minors, Some("x")).is_empty());
    }
}
