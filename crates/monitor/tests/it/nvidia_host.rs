//! Issue 15 item 5: NVIDIA host metrics (`hami_host_gpu_*`) through NVML loaded with dlopen.
//! The stand-in driver (`libcuda.so`) and NVML (`libnvidia_ml.so`) share one device state,
//! as the real driver and NVML do: memory a process allocates and kernels it runs through
//! the driver are what the monitor reports for the host GPU.

use std::ffi::{CString, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common;

use hami_monitor::metrics::{LegacyMetrics, render};
use hami_monitor::node_monitor::{MonitorConfig, NodeMonitor};
use hami_monitor::pods::PodIndex;

/// The directory of this test binary, where cargo puts the stand-in libraries.
fn deps_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this test binary: {e}"))?;
    exe.parent()
        .map(PathBuf::from)
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))
}

/// The stand-in driver, loaded in this process.
struct Driver(*mut c_void);

impl Driver {
    fn load() -> Result<Driver, String> {
        let file = deps_dir()?.join("libcuda.so");
        let path = CString::new(file.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{} holds a NUL byte", file.display()))?;
        // SAFETY: a valid path; the handle is never closed.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("the stand-in {} was not built", file.display()));
        }
        Ok(Driver(handle))
    }
    fn sym(&self, name: &str) -> Result<*mut c_void, String> {
        let c = CString::new(name).map_err(|_| format!("{name:?} holds a NUL byte"))?;
        // SAFETY: a live handle and a valid name.
        let f = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        if f.is_null() {
            return Err(format!("the stand-in libcuda.so does not export {name}"));
        }
        Ok(f)
    }
}

type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;

#[test]
fn nvidia_host_gpus_report_memory_in_use_and_utilization() -> Result<(), String> {
    let scratch = std::env::temp_dir().join(format!("hami-monitor-nvml-{}", std::process::id()));
    // The stand-ins' settings: the body runs in a child process started with them.
    let state = scratch.join("state");
    if !common::in_child_with_env(
        "nvidia_host::nvidia_host_gpus_report_memory_in_use_and_utilization",
        &[
            ("FAKE_CUDA_DEVICE_COUNT", "2".as_ref()),
            ("FAKE_CUDA_DEVICE_MEMORY", "16g".as_ref()),
            ("FAKE_CUDA_SHARED_STATE", state.as_os_str()),
        ],
    ) {
        let _ = std::fs::remove_dir_all(&scratch);
        return Ok(());
    }
    // In the child: the parent's scratch directory, named by the state file it passed.
    let state = PathBuf::from(
        std::env::var_os("FAKE_CUDA_SHARED_STATE")
            .ok_or("the child was started without FAKE_CUDA_SHARED_STATE")?,
    );
    let scratch = state
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", state.display()))?
        .to_path_buf();
    let _ = std::fs::remove_dir_all(&scratch);
    for dir in ["hook/containers", "proc", "sys"] {
        let dir = scratch.join(dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let driver = Driver::load()?;
    let cu_init = driver.sym("cuInit")?;
    let cu_ctx_create = driver.sym("cuCtxCreate_v2")?;
    let cu_mem_alloc = driver.sym("cuMemAlloc_v2")?;
    let cu_launch = driver.sym("cuLaunchKernel")?;
    let cu_ctx_set_current = driver.sym("cuCtxSetCurrent")?;
    // SAFETY: the stand-in's exports, called with their C signatures (cuda.h).
    let launcher = unsafe {
        let init: unsafe extern "C" fn(c_uint) -> c_int = std::mem::transmute(cu_init);
        let create: unsafe extern "C" fn(*mut usize, c_uint, c_int) -> c_int =
            std::mem::transmute(cu_ctx_create);
        let alloc: unsafe extern "C" fn(*mut u64, usize) -> c_int =
            std::mem::transmute(cu_mem_alloc);
        assert_eq!(init(0), 0);
        let mut ctx = 0usize;
        assert_eq!(create(&mut ctx, 0, 1), 0, "context on device 1");
        let mut ptr = 0u64;
        assert_eq!(alloc(&mut ptr, 3 << 30), 0);
        let launch: Launch = std::mem::transmute(cu_launch);
        let set_current: unsafe extern "C" fn(usize) -> c_int =
            std::mem::transmute(cu_ctx_set_current);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            set_current(ctx);
            let mut kernel = 0u8;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let f = (&mut kernel as *mut u8).cast();
                let null = std::ptr::null_mut();
                launch(f, 64, 1, 1, 1, 1, 1, 0, null, null.cast(), null.cast());
            }
        });
        (stop, thread)
    };

    let monitor = NodeMonitor::new(MonitorConfig {
        hook_path: scratch.join("hook"),
        proc_root: scratch.join("proc"),
        sys_root: scratch.join("sys"),
        node_name: "gpu-node".into(),
        gc_grace: Duration::from_secs(60),
        nvml_library: Some(deps_dir()?.join("libnvidia_ml.so").display().to_string()),
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let host = loop {
        monitor.refresh(PodIndex::default());
        let host = monitor.snapshot().host;
        let busy = host.get(1).and_then(|g| g.busy_percent).unwrap_or(0.0);
        if busy > 0.0 || Instant::now() > deadline {
            break host;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    launcher.0.store(true, std::sync::atomic::Ordering::Relaxed);
    launcher
        .1
        .join()
        .map_err(|_| "the kernel-launching thread panicked".to_string())?;
    assert_eq!(host.len(), 2, "{host:?}");
    assert!(host[0].uuid.starts_with("GPU-fa4e0000"), "{host:?}");
    assert_eq!(host[0].memory_used, Some(0));
    assert_eq!(
        host[1].memory_used,
        Some(3 << 30),
        "the 3 GiB allocated on device 1"
    );
    let busy = host[1]
        .busy_percent
        .ok_or_else(|| format!("no utilization for device 1: {host:?}"))?;
    assert!(busy > 0.0 && busy <= 100.0, "{host:?}");
    assert!(host[1].device_type.starts_with("NVIDIA"), "{host:?}");

    let body = render(&monitor.snapshot(), LegacyMetrics::default());
    let line = body
        .lines()
        .find(|l| l.starts_with("hami_host_gpu_memory_used_bytes{") && l.contains(&host[1].uuid))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        line.contains("node=\"gpu-node\"") && line.contains("device_index=\"1\""),
        "{line}"
    );
    assert!(
        line.ends_with(&format!(" {}", 3u64 << 30)) || line.ends_with(" 3221225472.0"),
        "{line}"
    );
    assert!(body.contains("hami_host_gpu_utilization_ratio{"));
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
