//! NVML, loaded at run time with `dlopen` (the real `libnvidia-ml.so.1` on a node, the
//! stand-in in tests): the few queries the NVIDIA plugin's discovery and the monitor's host
//! metrics ([`Nvml::usage`]) need, and XID events for the plugin's health ([`Nvml::watch_xids`]). All unsafe NVML FFI of the project is in this file. The library stays loaded for the life of the process (never `dlclose`d: NVML
//! may own threads).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_int;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type TextFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type MemoryFn = unsafe extern "C" fn(Device, *mut Memory) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type UtilizationFn = unsafe extern "C" fn(Device, *mut Utilization) -> c_int;

type EventSetHandle = *mut c_void;
type EventSetCreateFn = unsafe extern "C" fn(*mut EventSetHandle) -> c_int;
type EventSetFreeFn = unsafe extern "C" fn(EventSetHandle) -> c_int;
type SupportedEventsFn = unsafe extern "C" fn(Device, *mut u64) -> c_int;
type RegisterEventsFn = unsafe extern "C" fn(Device, u64, EventSetHandle) -> c_int;
type EventSetWaitFn = unsafe extern "C" fn(EventSetHandle, *mut EventData, c_uint) -> c_int;

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID_CRITICAL: u64 = 0x8;
/// `NVML_ERROR_TIMEOUT`: no event within the wait.
const ERROR_TIMEOUT: c_int = 10;

/// `nvmlEventData_t` (NVML 11 and later; `nvmlEventSetWait_v2` fills all of it).
#[repr(C)]
struct EventData {
    device: Device,
    event_type: u64,
    event_data: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// The event functions, present in every NVML since R285 (optional here: the monitor's
/// older stand-ins lack them).
#[derive(Debug, Clone, Copy)]
struct EventFns {
    create: EventSetCreateFn,
    free: EventSetFreeFn,
    supported: SupportedEventsFn,
    register: RegisterEventsFn,
    wait: EventSetWaitFn,
}

/// One NVML event: which GPU, what kind, and its data (the XID of an
/// [`EVENT_XID_CRITICAL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlEvent {
    /// The GPU's UUID; `None` when NVML cannot name it (then it concerns an unknown GPU).
    pub uuid: Option<String>,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// `eventData`: the XID for [`EVENT_XID_CRITICAL`] (999 = unknown XID).
    pub data: u64,
}

/// An NVML event set with every GPU registered for XID events; freed on drop. Waiting
/// blocks the calling thread (run it on a blocking thread).
#[derive(Debug)]
pub struct XidWatch {
    nvml: Nvml,
    fns: EventFns,
    set: EventSetHandle,
    /// GPUs that could not be registered, each with why (their XIDs are not seen).
    pub unwatched: Vec<String>,
}

// SAFETY: an NVML event set may be used from any thread (NVML is thread-safe); the handle
// is only read, and freed once, on drop.
unsafe impl Send for XidWatch {}

impl XidWatch {
    /// Waits up to `timeout_ms` for the next event: `Ok(None)` when none came.
    pub fn wait(&self, timeout_ms: u32) -> Result<Option<NvmlEvent>, NvmlError> {
        let mut data = EventData {
            device: std::ptr::null_mut(),
            event_type: 0,
            event_data: 0,
            gpu_instance_id: 0,
            compute_instance_id: 0,
        };
        // SAFETY: set is a live event set; data is a valid out-pointer of the v2 layout.
        let rc = unsafe { (self.fns.wait)(self.set, &mut data, timeout_ms) };
        if rc == ERROR_TIMEOUT {
            return Ok(None);
        }
        self.nvml.check("nvmlEventSetWait_v2", rc)?;
        let uuid = (!data.device.is_null())
            .then(|| {
                self.nvml
                    .text("nvmlDeviceGetUUID", self.nvml.uuid, data.device)
                    .ok()
            })
            .flatten();
        Ok(Some(NvmlEvent {
            uuid,
            event_type: data.event_type,
            data: data.event_data,
        }))
    }
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        // SAFETY: the set was created by nvmlEventSetCreate and is freed only here.
        let _ = unsafe { (self.fns.free)(self.set) };
    }
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// What one GPU is doing now (host metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlUsage {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Device memory in use by all processes, bytes.
    pub memory_used: u64,
    /// Percent of the last sample period in which a kernel ran (`nvmlUtilization_t.gpu`);
    /// `None` when this NVML has no `nvmlDeviceGetUtilizationRates` or the call failed.
    pub gpu_percent: Option<u32>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID (what `NVIDIA_VISIBLE_DEVICES` accepts).
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    /// Total device memory in bytes.
    pub memory_bytes: u64,
}

/// What discovery found: GPUs, and a warning per GPU that could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlDiscovery {
    /// The GPUs NVML could read, in NVML index order.
    pub gpus: Vec<NvmlGpu>,
    /// One line per GPU skipped, saying which and why (discovery goes on without it).
    pub warnings: Vec<String>,
}

/// Why NVML could not be used; each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    #[error(
        "cannot load NVML from {library:?}: {reason}. Install the NVIDIA driver on the node and make its libnvidia-ml.so.1 visible to the plugin (mount the driver libraries, or pass --nvml-library PATH)"
    )]
    /// `dlopen` failed.
    Load {
        /// The path or soname given to `dlopen`.
        library: String,
        /// `dlerror`'s text.
        reason: String,
    },
    #[error(
        "{library:?} is not NVML: symbol {symbol} is missing. Point --nvml-library at the driver's libnvidia-ml.so.1"
    )]
    /// The library loaded but lacks a function this crate calls.
    Symbol {
        /// The library that was loaded.
        library: String,
        /// The missing function.
        symbol: &'static str,
    },
    #[error("{call} failed: {message} (NVML error {code})")]
    /// An NVML function returned an error.
    Call {
        /// The NVML function.
        call: &'static str,
        /// Its `nvmlReturn_t`.
        code: i32,
        /// `nvmlErrorString` of that code.
        message: String,
    },
}

/// A loaded and initialized NVML.
#[derive(Debug, Clone, Copy)]
pub struct Nvml {
    init: InitFn,
    count: CountFn,
    handle: HandleFn,
    uuid: TextFn,
    name: TextFn,
    memory: MemoryFn,
    error_string: ErrorStringFn,
    utilization: Option<UtilizationFn>,
    events: Option<EventFns>,
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Nvml {
    /// Loads `library` (a file name searched like the dynamic linker does, or a path) and
    /// calls `nvmlInit_v2`.
    pub fn load(library: &str) -> Result<Nvml, NvmlError> {
        let c_library = CString::new(library).map_err(|_| NvmlError::Load {
            library: library.into(),
            reason: "the name contains a NUL byte".into(),
        })?;
        // SAFETY: c_library is a valid C string; dlopen has no other precondition.
        let handle = unsafe { libc::dlopen(c_library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(NvmlError::Load {
                library: library.into(),
                reason: dlerror_text(),
            });
        }
        let symbol = |name: &'static str| -> Result<*mut c_void, NvmlError> {
            let c_name = CString::new(name).map_err(|_| NvmlError::Symbol {
                library: library.into(),
                symbol: name,
            })?;
            // SAFETY: handle is a live dlopen handle, c_name a valid C string.
            let f = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
            if f.is_null() {
                Err(NvmlError::Symbol {
                    library: library.into(),
                    symbol: name,
                })
            } else {
                Ok(f)
            }
        };
        // SAFETY: each symbol is NVML's function of that name, whose C signature (nvml.h)
        // is the one transmuted to; the library is never unloaded, so they stay valid.
        let nvml = unsafe {
            Nvml {
                init: std::mem::transmute::<*mut c_void, InitFn>(symbol("nvmlInit_v2")?),
                count: std::mem::transmute::<*mut c_void, CountFn>(symbol(
                    "nvmlDeviceGetCount_v2",
                )?),
                handle: std::mem::transmute::<*mut c_void, HandleFn>(symbol(
                    "nvmlDeviceGetHandleByIndex_v2",
                )?),
                uuid: std::mem::transmute::<*mut c_void, TextFn>(symbol("nvmlDeviceGetUUID")?),
                name: std::mem::transmute::<*mut c_void, TextFn>(symbol("nvmlDeviceGetName")?),
                memory: std::mem::transmute::<*mut c_void, MemoryFn>(symbol(
                    "nvmlDeviceGetMemoryInfo",
                )?),
                error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(symbol(
                    "nvmlErrorString",
                )?),
                utilization: symbol("nvmlDeviceGetUtilizationRates")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, UtilizationFn>(f)),
                events: (|| {
                    Some(EventFns {
                        create: std::mem::transmute::<*mut c_void, EventSetCreateFn>(
                            symbol("nvmlEventSetCreate").ok()?,
                        ),
                        free: std::mem::transmute::<*mut c_void, EventSetFreeFn>(
                            symbol("nvmlEventSetFree").ok()?,
                        ),
                        supported: std::mem::transmute::<*mut c_void, SupportedEventsFn>(
                            symbol("nvmlDeviceGetSupportedEventTypes").ok()?,
                        ),
                        register: std::mem::transmute::<*mut c_void, RegisterEventsFn>(
                            symbol("nvmlDeviceRegisterEvents").ok()?,
                        ),
                        wait: std::mem::transmute::<*mut c_void, EventSetWaitFn>(
                            symbol("nvmlEventSetWait_v2").ok()?,
                        ),
                    })
                })(),
            }
        };
        // SAFETY: nvmlInit_v2 takes no arguments; it may be called more than once.
        let rc = unsafe { (nvml.init)() };
        nvml.check("nvmlInit_v2", rc)?;
        Ok(nvml)
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), NvmlError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: nvmlErrorString accepts any code and returns NULL or a static string.
        let text = unsafe { (self.error_string)(code) };
        let message = if text.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: non-NULL: a NUL-terminated static string owned by NVML.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(NvmlError::Call {
            call,
            code,
            message,
        })
    }

    fn text(&self, call: &'static str, f: TextFn, device: Device) -> Result<String, NvmlError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: buf holds buf.len() bytes; NVML writes at most that many, NUL included.
        let rc = unsafe { f(device, buf.as_mut_ptr(), buf.len() as c_uint) };
        self.check(call, rc)?;
        // The last byte stays NUL whatever NVML wrote, so the text always ends.
        buf[buf.len() - 1] = 0;
        // SAFETY: buf is NUL-terminated (ensured above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    fn device(&self, index: u32) -> Result<Device, NvmlError> {
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: device is a valid out-pointer.
        let rc = unsafe { (self.handle)(index, &mut device) };
        self.check("nvmlDeviceGetHandleByIndex_v2", rc)?;
        Ok(device)
    }

    /// Memory in use and utilization of GPU `index`.
    pub fn usage(&self, index: u32) -> Result<NvmlUsage, NvmlError> {
        let device = self.device(index)?;
        let uuid = self.text("nvmlDeviceGetUUID", self.uuid, device)?;
        let name = self.text("nvmlDeviceGetName", self.name, device)?;
        let mut memory = Memory::default();
        // SAFETY: memory is a valid out-pointer of nvmlMemory_t's layout.
        let rc = unsafe { (self.memory)(device, &mut memory) };
        self.check("nvmlDeviceGetMemoryInfo", rc)?;
        let gpu_percent = self.utilization.and_then(|f| {
            let mut util = Utilization::default();
            // SAFETY: util is a valid out-pointer of nvmlUtilization_t's layout.
            let rc = unsafe { f(device, &mut util) };
            (rc == 0).then_some(util.gpu.min(100))
        });
        Ok(NvmlUsage {
            index,
            uuid,
            name,
            memory_used: memory.used,
            gpu_percent,
        })
    }

    /// Number of GPUs.
    pub fn count(&self) -> Result<u32, NvmlError> {
        let mut count: c_uint = 0;
        // SAFETY: count is a valid out-pointer.
        let rc = unsafe { (self.count)(&mut count) };
        self.check("nvmlDeviceGetCount_v2", rc)?;
        Ok(count)
    }

    fn gpu(&self, index: u32) -> Result<NvmlGpu, NvmlError> {
        let device = self.device(index)?;
        let uuid = self.text("nvmlDeviceGetUUID", self.uuid, device)?;
        let name = self.text("nvmlDeviceGetName", self.name, device)?;
        let mut memory = Memory::default();
        // SAFETY: memory is a valid out-pointer of nvmlMemory_t's layout.
        let rc = unsafe { (self.memory)(device, &mut memory) };
        self.check("nvmlDeviceGetMemoryInfo", rc)?;
        Ok(NvmlGpu {
            index,
            uuid,
            name,
            memory_bytes: memory.total,
        })
    }

    /// An event set with every GPU registered for XID events (those that cannot be are
    /// listed in [`XidWatch::unwatched`]); an error when this NVML has no event API or the
    /// set cannot be made.
    pub fn watch_xids(&self) -> Result<XidWatch, NvmlError> {
        let fns = self.events.ok_or(NvmlError::Symbol {
            library: "the loaded NVML".into(),
            symbol: "nvmlEventSetWait_v2",
        })?;
        let mut set: EventSetHandle = std::ptr::null_mut();
        // SAFETY: set is a valid out-pointer.
        let rc = unsafe { (fns.create)(&mut set) };
        self.check("nvmlEventSetCreate", rc)?;
        let mut watch = XidWatch {
            nvml: *self,
            fns,
            set,
            unwatched: Vec::new(),
        };
        for index in 0..self.count()? {
            let registered = self.device(index).and_then(|device| {
                let mut supported = 0u64;
                // SAFETY: device is a live handle; supported a valid out-pointer.
                let rc = unsafe { (fns.supported)(device, &mut supported) };
                self.check("nvmlDeviceGetSupportedEventTypes", rc)?;
                if supported & EVENT_XID_CRITICAL == 0 {
                    return Err(NvmlError::Call {
                        call: "nvmlDeviceGetSupportedEventTypes",
                        code: 3,
                        message: "XID events not supported by this GPU".into(),
                    });
                }
                // SAFETY: device and set are live handles.
                let rc = unsafe { (fns.register)(device, EVENT_XID_CRITICAL, set) };
                self.check("nvmlDeviceRegisterEvents", rc)
            });
            if let Err(e) = registered {
                watch
                    .unwatched
                    .push(format!("GPU {index}: XIDs not watched: {e}"));
            }
        }
        Ok(watch)
    }

    /// The GPUs; one that cannot be read is skipped with a warning naming the call.
    pub fn discover(&self) -> Result<NvmlDiscovery, NvmlError> {
        let count = self.count()?;
        let mut out = NvmlDiscovery::default();
        for index in 0..count {
            match self.gpu(index) {
                Ok(gpu) => out.gpus.push(gpu),
                Err(e) => out.warnings.push(format!("GPU {index} skipped: {e}")),
            }
        }
        Ok(out)
    }
}
