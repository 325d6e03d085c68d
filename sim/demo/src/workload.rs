//! `hami-workload`: the demo's GPU-busy container process. It opens the vendor runtime with
//! `dlopen` as applications with vendored runtimes do (`libamdhip64.so.6` or
//! `libcuda.so.1`, found through the image's library path), allocates the requested memory
//! on each visible device (an allocation the slice refuses is reported, and a smaller
//! fallback tried, as a framework retrying with a smaller batch does), then keeps each
//! device busy `--busy-percent` of the wall time (one share for all, or one per device) with 1 ms kernels (1000 blocks at the
//! stand-ins' default 1 µs per block): a kernel is launched whenever the device's busy
//! time since start is below the share, else the process sleeps, so the long-run share is
//! exact whatever the scheduler does. Runs until killed.

use std::ffi::{CStr, CString, c_int, c_uint, c_void};
use std::time::{Duration, Instant};

/// The vendor runtime the workload opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// HIP (`libamdhip64.so.6`), under the `LD_AUDIT` hook in a sliced AMD container.
    Hip,
    /// The CUDA driver API (`libcuda.so.1`), under the `LD_PRELOAD` hook.
    Cuda,
}

/// Flags of `hami-workload`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "hami-workload",
    about = "A GPU-busy process for the demo's pods"
)]
pub struct WorkloadArgs {
    /// Which vendor runtime to open.
    #[arg(long, value_enum)]
    pub runtime: Runtime,
    /// Device memory to allocate on each visible device, MiB.
    #[arg(long, default_value_t = 1024)]
    pub memory_mib: u64,
    /// What to allocate instead when `--memory-mib` is refused, MiB (0: nothing).
    #[arg(long, default_value_t = 0)]
    pub fallback_mib: u64,
    /// Share of the wall time each device is kept busy, 1..=100; a comma-separated list
    /// gives one per device in the runtime's order (the last one repeats).
    #[arg(long, value_delimiter = ',', default_value = "30")]
    pub busy_percent: Vec<f64>,
}

type Fn0 = unsafe extern "C" fn(c_uint) -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type SetFn = unsafe extern "C" fn(c_int) -> c_int;
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type HipLaunchFn = unsafe extern "C" fn(
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
type CuDeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuCtxCreateFn = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_int;
type CuCtxSetFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuMallocFn = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuLaunchFn = HipLaunchFn;

/// A library opened with `dlopen`.
struct Library(*mut c_void);

impl Library {
    fn open(names: &[&str]) -> Result<(Library, String), String> {
        let mut errors = Vec::new();
        for name in names {
            let c = CString::new(*name).map_err(|e| e.to_string())?;
            // SAFETY: dlopen with a NUL-terminated name; the handle is kept for the process.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok((Library(handle), (*name).to_owned()));
            }
            // SAFETY: dlerror returns NULL or a NUL-terminated message.
            let message = unsafe { libc::dlerror() };
            if !message.is_null() {
                // SAFETY: non-null result of dlerror, copied at once.
                errors.push(
                    unsafe { CStr::from_ptr(message) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        Err(errors.join("; "))
    }

    /// A function of the library, cast to `T` (a function pointer type of its signature).
    fn get<T: Copy>(&self, name: &str) -> Result<T, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: dlsym on a live handle with a NUL-terminated name.
        let address = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        if address.is_null() {
            return Err(format!("the runtime has no {name}"));
        }
        assert_eq!(size_of::<T>(), size_of::<*mut c_void>());
        // SAFETY: T is a function pointer type matching the C declaration of `name`.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&address) })
    }
}

/// What the duty loop needs per device.
trait Device {
    /// Runs one kernel of `blocks` blocks; Err with the runtime's code.
    fn launch(&self, blocks: c_uint) -> Result<(), c_int>;
}

/// One kernel launch of `blocks` blocks of 128 threads through `launch`
/// (`hipModuleLaunchKernel` and `cuLaunchKernel` take the same arguments), on the device
/// made current before.
fn launch_1d(launch: HipLaunchFn, blocks: c_uint) -> Result<(), c_int> {
    // SAFETY: the runtime's launch entry point with valid arguments; no code runs on the
    // stand-ins, so any non-null function handle will do, and no kernel parameters.
    let rc = unsafe {
        launch(
            std::ptr::dangling_mut::<c_void>(),
            blocks,
            1,
            1,
            128,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if rc == 0 { Ok(()) } else { Err(rc) }
}

struct HipDevice {
    index: c_int,
    set: SetFn,
    launch: HipLaunchFn,
}

impl Device for HipDevice {
    fn launch(&self, blocks: c_uint) -> Result<(), c_int> {
        // SAFETY: a HIP entry point with a valid device index.
        match unsafe { (self.set)(self.index) } {
            0 => launch_1d(self.launch, blocks),
            rc => Err(rc),
        }
    }
}

struct CudaDevice {
    context: *mut c_void,
    set: CuCtxSetFn,
    launch: CuLaunchFn,
}

impl Device for CudaDevice {
    fn launch(&self, blocks: c_uint) -> Result<(), c_int> {
        // SAFETY: a driver API call with a context this process created.
        match unsafe { (self.set)(self.context) } {
            0 => launch_1d(self.launch, blocks),
            rc => Err(rc),
        }
    }
}

const MIB: u64 = 1 << 20;

/// Allocates `mib` (or `fallback`) through `alloc`, saying what happened.
fn allocate(
    device: usize,
    call: &str,
    mib: u64,
    fallback: u64,
    out_of_memory: (c_int, &str),
    mut alloc: impl FnMut(u64) -> c_int,
) -> u64 {
    match alloc(mib * MIB) {
        0 => {
            println!("device {device}: allocated {mib} MiB");
            mib
        }
        rc => {
            let why = if rc == out_of_memory.0 {
                format!("out of memory ({})", out_of_memory.1)
            } else {
                format!("error {rc}")
            };
            println!("device {device}: {call} of {mib} MiB refused: {why}");
            if fallback == 0 {
                return 0;
            }
            match alloc(fallback * MIB) {
                0 => {
                    println!("device {device}: allocated {fallback} MiB instead");
                    fallback
                }
                rc => {
                    println!("device {device}: {call} of {fallback} MiB refused too: error {rc}");
                    0
                }
            }
        }
    }
}

fn hip(args: &WorkloadArgs) -> Result<Vec<Box<dyn Device>>, String> {
    let (lib, name) = Library::open(&["libamdhip64.so.6", "libamdhip64.so"])?;
    let init: Fn0 = lib.get("hipInit")?;
    let count: CountFn = lib.get("hipGetDeviceCount")?;
    let set: SetFn = lib.get("hipSetDevice")?;
    let malloc: MallocFn = lib.get("hipMalloc")?;
    let info: InfoFn = lib.get("hipMemGetInfo")?;
    let launch: HipLaunchFn = lib.get("hipModuleLaunchKernel")?;
    let mut n: c_int = 0;
    // SAFETY: HIP entry points with valid out-pointers.
    let rc = unsafe { init(0).max(count(&mut n)) };
    if rc != 0 {
        return Err(format!("hipInit/hipGetDeviceCount failed: error {rc}"));
    }
    println!("HIP runtime {name}: {n} device(s)");
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    for index in 0..n {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: as above.
        unsafe {
            set(index);
            info(&mut free, &mut total);
        }
        println!(
            "device {index}: {} MiB of {} MiB free (hipMemGetInfo)",
            free as u64 / MIB,
            total as u64 / MIB
        );
        allocate(
            index as usize,
            "hipMalloc",
            args.memory_mib,
            args.fallback_mib,
            (2, "hipErrorOutOfMemory"),
            |bytes| {
                let mut p = std::ptr::null_mut();
                // SAFETY: hipMalloc with a valid out-pointer; the memory is kept for life.
                unsafe { malloc(&mut p, bytes as usize) }
            },
        );
        devices.push(Box::new(HipDevice { index, set, launch }));
    }
    Ok(devices)
}

fn cuda(args: &WorkloadArgs) -> Result<Vec<Box<dyn Device>>, String> {
    let (lib, name) = Library::open(&["libcuda.so.1"])?;
    let init: Fn0 = lib.get("cuInit")?;
    let count: CountFn = lib.get("cuDeviceGetCount")?;
    let get: CuDeviceGetFn = lib.get("cuDeviceGet")?;
    let create: CuCtxCreateFn = lib.get("cuCtxCreate_v2")?;
    let set: CuCtxSetFn = lib.get("cuCtxSetCurrent")?;
    let malloc: CuMallocFn = lib.get("cuMemAlloc_v2")?;
    let info: InfoFn = lib.get("cuMemGetInfo_v2")?;
    let launch: CuLaunchFn = lib.get("cuLaunchKernel")?;
    let mut n: c_int = 0;
    // SAFETY: driver API entry points with valid out-pointers.
    let rc = unsafe { init(0).max(count(&mut n)) };
    if rc != 0 {
        return Err(format!("cuInit/cuDeviceGetCount failed: error {rc}"));
    }
    println!("CUDA driver {name}: {n} device(s)");
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    for index in 0..n {
        let (mut dev, mut context) = (0, std::ptr::null_mut());
        // SAFETY: as above.
        let rc = unsafe { get(&mut dev, index).max(create(&mut context, 0, dev)) };
        if rc != 0 {
            println!("device {index}: no context: error {rc}");
            continue;
        }
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: as above, with this thread's current context.
        unsafe { info(&mut free, &mut total) };
        println!(
            "device {index}: {} MiB of {} MiB free (cuMemGetInfo)",
            free as u64 / MIB,
            total as u64 / MIB
        );
        allocate(
            index as usize,
            "cuMemAlloc",
            args.memory_mib,
            args.fallback_mib,
            (2, "CUDA_ERROR_OUT_OF_MEMORY"),
            |bytes| {
                let mut p = 0u64;
                // SAFETY: cuMemAlloc with a valid out-pointer; the memory is kept for life.
                unsafe { malloc(&mut p, bytes as usize) }
            },
        );
        devices.push(Box::new(CudaDevice {
            context,
            set,
            launch,
        }));
    }
    Ok(devices)
}

/// Runs the workload; returns only on an error (the exit status).
pub fn run(args: &WorkloadArgs) -> std::process::ExitCode {
    if let Some(bad) = args
        .busy_percent
        .iter()
        .find(|p| !(**p > 0.0 && **p <= 100.0))
        .or(args.busy_percent.is_empty().then_some(&0.0))
    {
        eprintln!("--busy-percent {bad}: write shares from 1 to 100");
        return std::process::ExitCode::from(2);
    }
    let devices = match args.runtime {
        Runtime::Hip => hip(args),
        Runtime::Cuda => cuda(args),
    };
    let devices = match devices {
        Ok(d) if !d.is_empty() => d,
        Ok(_) => {
            println!("no device visible: nothing to keep busy");
            return std::process::ExitCode::from(1);
        }
        Err(e) => {
            println!("cannot use the GPU runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let shares: Vec<f64> = (0..devices.len())
        .map(|i| args.busy_percent[i.min(args.busy_percent.len() - 1)] / 100.0)
        .collect();
    let said: Vec<String> = shares.iter().map(|s| format!("{}%", s * 100.0)).collect();
    println!(
        "keeping {} device(s) busy {} of the time",
        devices.len(),
        said.join(", ")
    );
    let start = Instant::now();
    let mut busy = vec![Duration::ZERO; devices.len()];
    loop {
        let wall = start.elapsed();
        let behind = busy
            .iter()
            .enumerate()
            .filter(|(i, b)| b.as_secs_f64() < shares[*i] * wall.as_secs_f64())
            .min_by_key(|(_, b)| **b)
            .map(|(i, _)| i);
        match behind {
            Some(i) => {
                let t = Instant::now();
                if let Err(rc) = devices[i].launch(1000) {
                    println!("device {i}: kernel launch failed: error {rc}");
                    return std::process::ExitCode::from(1);
                }
                busy[i] += t.elapsed();
            }
            None => {
                let next = busy
                    .iter()
                    .zip(&shares)
                    .map(|(b, share)| b.as_secs_f64() / share - wall.as_secs_f64())
                    .fold(f64::INFINITY, f64::min);
                std::thread::sleep(Duration::from_secs_f64(next.clamp(0.0005, 0.05)));
            }
        }
    }
}
