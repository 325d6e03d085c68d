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

fn init() -> Result<Runtime, String> {
    let mut config = Config::from_lookup(|key| {
        let key = std::ffi::CString::new(key).ok()?;
        getenv(&key)
    })?;
    // With a driver, the devices are the render nodes this process can see, as ROCr finds
    // them: a container has exactly the ones kubelet gave it.
    let minors = if config.driver_socket.is_some() {
        let minors = render_minors(std::path::Path::new("/dev/dri"));
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
