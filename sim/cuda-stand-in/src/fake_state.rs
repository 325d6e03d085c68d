//! What the stand-in devices hold, shared by every process (and by the stand-in NVML, which
//! includes this file) through a mapped file, like a physical GPU is shared: memory in use
//! per device, and per process the busy time of its kernels in 100 ms windows, from which
//! NVML reports process utilization. The file is `FAKE_CUDA_SHARED_STATE`, default
//! `/tmp/hami-fake-cuda-<uid>.state`.
//!
//! Like a real driver, the device memory a process holds goes back to the device when the
//! process dies or exits without freeing it: each driver process owns an entry of
//! [`State::owners`] (its bytes per device) and holds an OFD record lock on that entry's byte
//! for life; an entry whose lock nobody holds belongs to a dead process and is reclaimed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI32, AtomicU64};

use hami_protocol::memory_limit::parse_memory_limit;

/// Devices the shared state has room for (`FAKE_CUDA_DEVICE_COUNT` at most this).
pub const MAX_DEVICES: usize = 16;
/// Processes per device whose kernel busy time can be recorded at once.
pub const MAX_PROCS: usize = 64;
/// Driver processes that can hold device memory at once.
pub const MAX_OWNERS: usize = 256;
/// Byte of the owner lock of entry 0 (far past the end of the file: record locks need no data).
const OWNER_LOCK_BASE: usize = 1 << 30;
/// Length of one utilization window.
pub const WINDOW_NS: u64 = 100_000_000;
const WINDOWS: usize = 4;

/// Busy time of one process in one utilization window.
#[repr(C)]
pub struct Window {
    /// Which window (`now_ns() / WINDOW_NS`) `busy_ns` counts; the slot is reset for a later one.
    pub index: AtomicU64,
    /// Kernel time in that window, in nanoseconds.
    pub busy_ns: AtomicU64,
}

/// One process's kernel busy time on one device, over the last few windows.
#[repr(C)]
pub struct ProcBusy {
    /// Host pid (0 = free).
    pub pid: AtomicI32,
    _pad: u32,
    /// A ring indexed by window number modulo its length.
    pub windows: [Window; WINDOWS],
}

/// One device: memory in use and the busy time of the processes running kernels on it.
#[repr(C)]
pub struct DeviceState {
    /// Bytes allocated on the device, all processes together.
    pub used: AtomicU64,
    /// Highest `used` since the state file was created.
    pub peak: AtomicU64,
    /// Busy records, one per process that ran kernels on the device.
    pub procs: [ProcBusy; MAX_PROCS],
}

/// Device memory one driver process holds (its pid 0 when free).
#[repr(C)]
pub struct MemOwner {
    /// Host pid of the owner.
    pub pid: AtomicI32,
    _pad: u32,
    /// Bit `d`: the owner has a context on device `d` (NVML lists it as a compute process).
    pub contexts: AtomicU64,
    /// Bytes this owner holds per device, given back to the devices when it dies.
    pub used: [AtomicU64; MAX_DEVICES],
}

/// The whole shared file: one fixed `repr(C)` layout every process maps (its size is the file's).
#[repr(C)]
pub struct State {
    /// Memory and busy time per device (only the first `device_count` are used).
    pub devices: [DeviceState; MAX_DEVICES],
    /// Device memory per driver process (see the module doc).
    pub owners: [MemOwner; MAX_OWNERS],
}

/// The mapped state and the open file whose record locks say which owners live.
pub struct Mapped {
    /// The mapping, leaked on purpose: it lives as long as the process.
    pub state: &'static State,
    /// The state file, kept open: its OFD record locks are what mark live owners.
    pub file: File,
}

/// The stand-in's configuration, from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `FAKE_CUDA_DEVICE_COUNT` (default 1, at most [`MAX_DEVICES`]).
    pub device_count: usize,
    /// `FAKE_CUDA_DEVICE_MEMORY` in bytes, per device (default 16 GiB).
    pub device_memory: u64,
    /// Multiprocessors per device (108, as on an A100).
    pub sm_count: i32,
    /// Device time of one thread block of a kernel.
    pub block_ns: u64,
    /// `FAKE_CUDA_FREE_YIELD` (default on): a free yields the CPU once the block is reusable.
    pub free_yield: bool,
    /// `FAKE_CUDA_SHARED_STATE`, default `/tmp/hami-fake-cuda-<uid>.state`.
    pub state_path: String,
}

impl Config {
    /// Reads the configuration through `get` (the environment, or a test's map); `Err` names
    /// the bad variable and what to write instead.
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
        let free_yield = match get("FAKE_CUDA_FREE_YIELD").as_deref().map(str::trim) {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                return Err(format!(
                    "FAKE_CUDA_FREE_YIELD={other:?}: write 1 (a free yields the CPU, default) or 0"
                ));
            }
        };
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        Ok(Config {
            device_count,
            device_memory,
            sm_count: 108,
            block_ns,
            free_yield,
            state_path: get("FAKE_CUDA_SHARED_STATE")
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| format!("/tmp/hami-fake-cuda-{uid}.state")),
        })
    }

    /// [`Config::from_lookup`] over the process environment.
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

/// Host pid of this process, as a real driver knows it (the kernel module sees host pids,
/// whatever PID namespace the caller runs in). With `FAKE_CUDA_DRIVER_SOCKET` set, the
/// stand-in's "kernel side" (a server in the host PID namespace, see
/// `cuda-hook/tests/common::DriverSocket`) answers with the pid it learned from the kernel
/// (`SO_PEERCRED` of this connection). Without it: the first `NSpid` entry, else getpid —
/// which inside a container with its own `/proc` is the container's pid, not the host's.
pub fn host_pid() -> i32 {
    if let Some(pid) = std::env::var_os("FAKE_CUDA_DRIVER_SOCKET").and_then(driver_side_pid) {
        return pid;
    }
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

/// Asks the driver side for our host pid: it replies with the decimal pid it read from
/// `SO_PEERCRED` (translated by the kernel into its own, the host's, PID namespace).
fn driver_side_pid(path: std::ffi::OsString) -> Option<i32> {
    use std::io::Read;
    let mut stream = std::os::unix::net::UnixStream::connect(path).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.trim().parse().ok().filter(|pid: &i32| *pid > 0)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the one clock every process numbers windows by.
pub fn now_ns() -> u64 {
    // SAFETY: clock_gettime writes the struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above; CLOCK_MONOTONIC is shared by every process of the machine.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Maps the shared state file (created zeroed when absent).
pub fn map_state(path: &str) -> Result<Mapped, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let size = size_of::<State>();
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC)
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
    let state = unsafe { &*(map as *const State) };
    Ok(Mapped { state, file })
}

/// An OFD record lock request on one byte (OFD locks belong to the open file, not the pid,
/// and the kernel drops them when the process dies).
fn record(kind: i32, offset: usize) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all-zero is valid.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = offset as libc::off_t;
    lock.l_len = 1;
    lock
}

/// Takes the lock without waiting; false when another open file holds it (or on error).
fn try_lock_record(file: &File, offset: usize) -> bool {
    let lock = record(libc::F_WRLCK, offset);
    // SAFETY: F_OFD_SETLK reads the struct, which outlives the call.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) == 0 }
}

fn unlock_record(file: &File, offset: usize) {
    let lock = record(libc::F_UNLCK, offset);
    // SAFETY: as above.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
}

/// Whether another open file holds the lock (true on error: never take on doubt).
fn record_locked_elsewhere(file: &File, offset: usize) -> bool {
    let mut lock = record(libc::F_WRLCK, offset);
    // SAFETY: F_OFD_GETLK writes into the struct, which outlives the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
    rc != 0 || lock.l_type != libc::F_UNLCK as libc::c_short
}

impl Mapped {
    /// Claims an owner entry for `pid` (returning a dead owner's bytes first), held for the
    /// process's life by the entry's record lock. `None` when all entries are live.
    pub fn claim_owner(&self, pid: i32) -> Option<usize> {
        (0..MAX_OWNERS).find(|&index| {
            let taken = try_lock_record(&self.file, OWNER_LOCK_BASE + index);
            if taken {
                self.return_bytes(index);
                self.state.owners[index].pid.store(pid, Release);
            }
            taken
        })
    }

    /// Gives the bytes of entry `index` back to the devices (its lock held by us).
    fn return_bytes(&self, index: usize) {
        let owner = &self.state.owners[index];
        for (device, used) in owner.used.iter().enumerate() {
            let bytes = used.swap(0, AcqRel);
            if bytes > 0 {
                self.state.devices[device].give(bytes);
            }
        }
        owner.contexts.store(0, Release);
        owner.pid.store(0, Release);
    }

    /// Returns the device memory of every dead owner (not `mine`); how many bytes came back.
    pub fn reclaim_dead(&self, mine: Option<usize>) -> u64 {
        let mut returned = 0;
        for index in (0..MAX_OWNERS).filter(|i| Some(*i) != mine) {
            let owner = &self.state.owners[index];
            if owner.pid.load(Acquire) == 0 && owner.used.iter().all(|u| u.load(Acquire) == 0) {
                continue;
            }
            let offset = OWNER_LOCK_BASE + index;
            if try_lock_record(&self.file, offset) {
                returned += owner.used.iter().map(|u| u.load(Acquire)).sum::<u64>();
                self.return_bytes(index);
                unlock_record(&self.file, offset);
            }
        }
        returned
    }

    /// Whether entry `index` belongs to a live process (other than through this file).
    pub fn owner_alive(&self, index: usize) -> bool {
        record_locked_elsewhere(&self.file, OWNER_LOCK_BASE + index)
    }

    /// Whether host pid `pid` is a live process of this driver: an owner entry with that pid
    /// whose record lock is held. Driver-side knowledge, as a real driver has: `kill(pid, 0)`
    /// cannot tell from inside a PID namespace, where host pids do not exist.
    pub fn pid_alive(&self, pid: i32) -> bool {
        pid > 0
            && (0..MAX_OWNERS).any(|index| {
                self.state.owners[index].pid.load(Acquire) == pid && self.owner_alive(index)
            })
    }
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

    /// Gives `size` bytes back to the device (saturating at zero).
    pub fn give(&self, size: u64) {
        let _ = self
            .used
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(size)));
    }

    /// The busy record of `pid`, claimed when first needed (records of pids `alive` denies
    /// are reused).
    pub fn proc_entry(&self, pid: i32, alive: &dyn Fn(i32) -> bool) -> Option<&ProcBusy> {
        if let Some(p) = self.procs.iter().find(|p| p.pid.load(Acquire) == pid) {
            return Some(p);
        }
        for p in &self.procs {
            let owner = p.pid.load(Acquire);
            if (owner == 0 || !alive(owner))
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
}
