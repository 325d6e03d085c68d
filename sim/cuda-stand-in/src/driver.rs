//! The driver's process state: configuration, visible devices, the current context of each
//! thread, and the allocations this process holds.
//!
//! Addresses are handed out like a real caching allocator does (PyTorch's, the driver's own
//! pools): a freed block goes on a stack and the next allocation that fits in it gets the
//! most recently freed address back (LIFO; a smaller request may take a larger cached block,
//! as PyTorch's allocator does). Hooks that free before they forget an address are caught.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::fake_state::{Config, Mapped, State, map_state};

pub const SUCCESS: i32 = 0;
pub const INVALID_VALUE: i32 = 1;
pub const OUT_OF_MEMORY: i32 = 2;
pub const NOT_INITIALIZED: i32 = 3;
pub const NO_DEVICE: i32 = 100;
pub const INVALID_DEVICE: i32 = 101;
pub const INVALID_CONTEXT: i32 = 201;
pub const INVALID_HANDLE: i32 = 400;
pub const NOT_FOUND: i32 = 500;

/// This process's device memory: live blocks and freed addresses ready for reuse.
#[derive(Default)]
pub struct Heap {
    /// Address or handle → (device index, bytes, block size).
    live: HashMap<u64, (usize, u64, u64)>,
    /// Freed blocks (device, block size, address), most recent last.
    freed: Vec<(usize, u64, u64)>,
}

/// How many of the most recently freed blocks an allocation looks at.
const REUSE_WINDOW: usize = 32;

pub struct Driver {
    pub config: Config,
    pub state: &'static State,
    /// The state file (its record locks say which processes live).
    pub mapped: Mapped,
    /// This process's entry in `state.owners` (None when all are taken by live processes).
    pub owner: Option<usize>,
    /// CUDA ordinal → stand-in device index (`CUDA_VISIBLE_DEVICES`).
    pub visible: Vec<usize>,
    pub heap: Mutex<Heap>,
    pub host_pid: i32,
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
static NEXT_ADDRESS: AtomicU64 = AtomicU64::new(0x7f00_0000_0000);

thread_local! {
    /// Current context: CUDA ordinal + 1 (0 = none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn visible_devices(spec: Option<String>, count: usize) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..count).collect();
    };
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        let index = item.parse::<usize>().ok().or_else(|| {
            (0..count)
                .find(|i| crate::fake_state::uuid_text(*i).starts_with(item) && !item.is_empty())
        });
        match index {
            // CUDA stops at the first invalid entry.
            Some(i) if i < count && !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// Initialises the driver once (cuInit).
pub fn init() -> i32 {
    let driver = DRIVER.get_or_init(|| {
        let config = Config::from_env()?;
        let mapped = map_state(&config.state_path)?;
        let visible = visible_devices(
            std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            config.device_count,
        );
        let host_pid = crate::fake_state::host_pid();
        let owner = mapped.claim_owner(host_pid);
        if owner.is_none() {
            eprintln!(
                "[stand-in libcuda] all {} owner entries of {} are live: this process's memory is not returned if it dies",
                crate::fake_state::MAX_OWNERS,
                config.state_path
            );
        }
        Ok(Driver {
            config,
            state: mapped.state,
            mapped,
            owner,
            visible,
            heap: Mutex::new(Heap::default()),
            host_pid,
        })
    });
    match driver {
        Ok(_) => SUCCESS,
        Err(message) => {
            eprintln!("[stand-in libcuda] {message}");
            NO_DEVICE
        }
    }
}

pub fn driver() -> Result<&'static Driver, i32> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(_)) => Err(NO_DEVICE),
        None => Err(NOT_INITIALIZED),
    }
}

impl Driver {
    /// Stand-in device index of CUDA ordinal `ordinal`.
    pub fn device(&self, ordinal: i32) -> Result<usize, i32> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.visible.get(o).copied())
            .ok_or(INVALID_DEVICE)
    }

    fn owner_used(&self, device: usize) -> Option<&std::sync::atomic::AtomicU64> {
        self.owner
            .map(|index| &self.state.owners[index].used[device])
    }

    /// Records that this process has a context on `device` (NVML lists it from then on).
    pub fn note_context(&self, device: usize) {
        if let Some(index) = self.owner {
            self.state.owners[index]
                .contexts
                .fetch_or(1 << device, Relaxed);
        }
    }

    pub fn take(&self, device: usize, size: u64) -> Result<u64, i32> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let capacity = self.config.device_memory;
        let dev = &self.state.devices[device];
        // Memory of processes that died or exited without freeing goes back first.
        if !dev.take(size, capacity)
            && (self.mapped.reclaim_dead(self.owner) == 0 || !dev.take(size, capacity))
        {
            return Err(OUT_OF_MEMORY);
        }
        if let Some(used) = self.owner_used(device) {
            used.fetch_add(size, Relaxed);
        }
        let rounded = size.next_multiple_of(4096).max(4096);
        let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        let reuse = heap
            .freed
            .iter()
            .enumerate()
            .rev()
            .take(REUSE_WINDOW)
            .find(|(_, (d, block, _))| *d == device && *block >= rounded)
            .map(|(at, _)| at);
        let (block, address) = match reuse {
            Some(at) => {
                let (_, block, address) = heap.freed.remove(at);
                (block, address)
            }
            None => (rounded, NEXT_ADDRESS.fetch_add(rounded, Relaxed)),
        };
        heap.live.insert(address, (device, size, block));
        Ok(address)
    }

    pub fn give(&self, address: u64) -> i32 {
        let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        match heap.live.remove(&address) {
            Some((device, size, block)) => {
                if let Some(used) = self.owner_used(device) {
                    let _ = used.fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(size)));
                }
                self.state.devices[device].give(size);
                heap.freed.push((device, block, address));
                if heap.freed.len() > 4 * REUSE_WINDOW {
                    heap.freed.remove(0);
                }
                drop(heap);
                // A real free returns through an ioctl after the block is already reusable:
                // other threads run here and may be handed this address.
                if self.config.free_yield {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
                SUCCESS
            }
            None => INVALID_VALUE,
        }
    }

    /// Frees every block this process holds on `device` (a destroyed context).
    pub fn free_device(&self, device: usize) {
        let addresses: Vec<u64> = {
            let heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
            heap.live
                .iter()
                .filter(|(_, (d, _, _))| *d == device)
                .map(|(a, _)| *a)
                .collect()
        };
        for address in addresses {
            self.give(address);
        }
    }

    /// Runs a kernel of `blocks` thread blocks on `device`: the caller waits for its device
    /// time, which is recorded as this process's busy time.
    pub fn run_kernel(&self, device: usize, blocks: u64) {
        let ns = blocks
            .saturating_mul(self.config.block_ns)
            .min(10_000_000_000);
        let start = crate::fake_state::now_ns();
        std::thread::sleep(std::time::Duration::from_nanos(ns));
        let end = crate::fake_state::now_ns();
        let alive = |pid: i32| self.mapped.pid_alive(pid);
        if let Some(entry) = self.state.devices[device].proc_entry(self.host_pid, &alive) {
            entry.record_busy(start, end);
        }
    }
}

/// The current context's CUDA ordinal.
pub fn current_ordinal() -> Result<i32, i32> {
    driver()?;
    match CURRENT.with(Cell::get) {
        0 => Err(INVALID_CONTEXT),
        n => Ok(n as i32 - 1),
    }
}

/// The current context's stand-in device index.
pub fn current_device() -> Result<usize, i32> {
    let d = driver()?;
    d.device(current_ordinal()?)
}

pub fn set_current(ordinal: Option<i32>) {
    CURRENT.with(|c| c.set(ordinal.map_or(0, |o| o as usize + 1)));
}

/// Context handles: the ordinal in a recognisable pointer.
pub fn context_handle(ordinal: i32) -> usize {
    0xc0_0000 + ordinal as usize * 0x100
}

pub fn context_ordinal(handle: usize) -> Option<i32> {
    ((0xc0_0000..0xc0_0000 + 0x100 * 64).contains(&handle) && handle.is_multiple_of(0x100))
        .then(|| ((handle - 0xc0_0000) / 0x100) as i32)
}
