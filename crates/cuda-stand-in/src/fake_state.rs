//! What the stand-in devices hold, shared by every process (and by the stand-in NVML, which
//! includes this file) through a mapped file, like a physical GPU is shared: memory in use
//! per device, and per process the busy time of its kernels in 100 ms windows, from which
//! NVML reports process utilization. The file is `FAKE_CUDA_SHARED_STATE`, default
//! `/tmp/hami-fake-cuda-<uid>.state`.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI32, AtomicU64};

use hami_protocol::memory_limit::parse_memory_limit;

pub const MAX_DEVICES: usize = 16;
pub const MAX_PROCS: usize = 64;
/// Length of one utilization window.
pub const WINDOW_NS: u64 = 100_000_000;
const WINDOWS: usize = 4;

#[repr(C)]
pub struct Window {
    pub index: AtomicU64,
    pub busy_ns: AtomicU64,
}

#[repr(C)]
pub struct ProcBusy {
    /// Host pid (0 = free).
    pub pid: AtomicI32,
    _pad: u32,
    pub windows: [Window; WINDOWS],
}

#[repr(C)]
pub struct DeviceState {
    pub used: AtomicU64,
    pub peak: AtomicU64,
    pub procs: [ProcBusy; MAX_PROCS],
}

#[repr(C)]
pub struct State {
    pub devices: [DeviceState; MAX_DEVICES],
}

/// The stand-in's configuration, from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub device_count: usize,
    pub device_memory: u64,
    pub sm_count: i32,
    /// Device time of one thread block of a kernel.
    pub block_ns: u64,
    pub state_path: String,
}

impl Config {
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let device_count = match get("FAKE_CUDA_DEVICE_COUNT") {
            None => 1,
            Some(t) => match t.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    return Err(format!(
                        "FAKE_CUDA_DEVICE_COUNT={t:?}: write a number of devices from 0 to {MAX_DEVICES}"
                    ));
                }
            },
        };
        let device_memory = match get("FAKE_CUDA_DEVICE_MEMORY") {
            None => 16 << 30,
            Some(t) => {
                parse_memory_limit(&t).map_err(|e| format!("FAKE_CUDA_DEVICE_MEMORY: {e}"))?
            }
        };
        let block_ns = match get("FAKE_CUDA_BLOCK_NS") {
            None => 1000,
            Some(t) => t
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("FAKE_CUDA_BLOCK_NS={t:?}: write nanoseconds per block"))?,
        };
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        Ok(Config {
            device_count,
            device_memory,
            sm_count: 108,
            block_ns,
            state_path: get("FAKE_CUDA_SHARED_STATE")
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| format!("/tmp/hami-fake-cuda-{uid}.state")),
        })
    }

    pub fn from_env() -> Result<Config, String> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }
}

/// The UUID NVML reports for stand-in device `index`.
pub fn uuid_text(index: usize) -> String {
    let b = uuid_bytes(index);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The 16 bytes `cuDeviceGetUuid` reports for stand-in device `index`.
pub fn uuid_bytes(index: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&(0xfa4e_0000u32 + index as u32).to_be_bytes());
    b[6] = 0x40;
    b[8] = 0x80;
    b[15] = index as u8;
    b
}

/// Host pid of this process: the first `NSpid` entry (`/proc` of the host namespace shows
/// the outermost pid first), else getpid.
pub fn host_pid() -> i32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        // SAFETY: getpid has no preconditions.
        .unwrap_or_else(|| unsafe { libc::getpid() })
}

pub fn now_ns() -> u64 {
    // SAFETY: clock_gettime writes the struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above; CLOCK_MONOTONIC is shared by every process of the machine.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Maps the shared state file (created zeroed when absent).
pub fn map_state(path: &str) -> Result<&'static State, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let size = size_of::<State>();
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
        .map_err(|e| format!("FAKE_CUDA_SHARED_STATE {path}: {e}"))?;
    if file.metadata().map_err(|e| e.to_string())?.len() < size as u64 {
        file.set_len(size as u64)
            .map_err(|e| format!("FAKE_CUDA_SHARED_STATE {path}: {e}"))?;
    }
    // SAFETY: maps `size` bytes of a file at least that long, shared; checked below; the
    // mapping lives for the process (leaked on purpose, like a driver's device memory).
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(format!(
            "FAKE_CUDA_SHARED_STATE {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the mapping is size_of::<State>() bytes, page-aligned, every field is an atomic
    // valid for any bit pattern, and it is never unmapped.
    Ok(unsafe { &*(map as *const State) })
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH))
}

impl DeviceState {
    /// Takes `size` bytes if the device has them.
    pub fn take(&self, size: u64, capacity: u64) -> bool {
        let ok = self
            .used
            .fetch_update(AcqRel, Acquire, |u| {
                u.checked_add(size).filter(|t| *t <= capacity)
            })
            .is_ok();
        if ok {
            self.peak.fetch_max(self.used.load(Acquire), AcqRel);
        }
        ok
    }

    pub fn give(&self, size: u64) {
        let _ = self
            .used
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(size)));
    }

    /// The busy record of `pid`, claimed when first needed (dead owners' records are reused).
    pub fn proc_entry(&self, pid: i32) -> Option<&ProcBusy> {
        if let Some(p) = self.procs.iter().find(|p| p.pid.load(Acquire) == pid) {
            return Some(p);
        }
        for p in &self.procs {
            let owner = p.pid.load(Acquire);
            if (owner == 0 || !pid_alive(owner))
                && p.pid.compare_exchange(owner, pid, AcqRel, Acquire).is_ok()
            {
                for w in &p.windows {
                    w.index.store(0, Relaxed);
                    w.busy_ns.store(0, Relaxed);
                }
                return Some(p);
            }
        }
        None
    }
}

impl ProcBusy {
    fn add(&self, window: u64, ns: u64) {
        let w = &self.windows[(window % WINDOWS as u64) as usize];
        let seen = w.index.load(Acquire);
        if seen != window
            && w.index
                .compare_exchange(seen, window, AcqRel, Acquire)
                .is_ok()
        {
            w.busy_ns.store(0, Release);
        }
        w.busy_ns.fetch_add(ns, AcqRel);
    }

    /// Records busy time over `[start, end)` nanoseconds, split over the windows it spans.
    pub fn record_busy(&self, start: u64, end: u64) {
        let mut at = start;
        while at < end {
            let window = at / WINDOW_NS;
            let stop = ((window + 1) * WINDOW_NS).min(end);
            self.add(window, stop - at);
            at = stop;
        }
    }

    /// Busy nanoseconds in window `window` (0 when not recorded).
    pub fn busy_in(&self, window: u64) -> u64 {
        let w = &self.windows[(window % WINDOWS as u64) as usize];
        if w.index.load(Acquire) == window {
            w.busy_ns.load(Acquire)
        } else {
            0
        }
    }

    pub fn owner_alive(&self) -> bool {
        pid_alive(self.pid.load(Acquire))
    }
}
