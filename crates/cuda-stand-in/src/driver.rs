//! The driver's process state: configuration, visible devices, the current context of each
//! thread, and the allocations this process holds.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::fake_state::{Config, State, map_state};

pub const SUCCESS: i32 = 0;
pub const INVALID_VALUE: i32 = 1;
pub const OUT_OF_MEMORY: i32 = 2;
pub const NOT_INITIALIZED: i32 = 3;
pub const NO_DEVICE: i32 = 100;
pub const INVALID_DEVICE: i32 = 101;
pub const INVALID_CONTEXT: i32 = 201;
pub const INVALID_HANDLE: i32 = 400;
pub const NOT_FOUND: i32 = 500;

pub struct Driver {
    pub config: Config,
    pub state: &'static State,
    /// CUDA ordinal → stand-in device index (`CUDA_VISIBLE_DEVICES`).
    pub visible: Vec<usize>,
    /// Live allocations: address or handle → (device index, bytes).
    pub allocations: Mutex<HashMap<u64, (usize, u64)>>,
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
        let state = map_state(&config.state_path)?;
        let visible = visible_devices(
            std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            config.device_count,
        );
        Ok(Driver {
            config,
            state,
            visible,
            allocations: Mutex::new(HashMap::new()),
            host_pid: crate::fake_state::host_pid(),
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

    pub fn take(&self, device: usize, size: u64) -> Result<u64, i32> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        if !self.state.devices[device].take(size, self.config.device_memory) {
            return Err(OUT_OF_MEMORY);
        }
        let address = NEXT_ADDRESS.fetch_add(size.next_multiple_of(4096).max(4096), Relaxed);
        self.allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(address, (device, size));
        Ok(address)
    }

    pub fn give(&self, address: u64) -> i32 {
        let entry = self
            .allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&address);
        match entry {
            Some((device, size)) => {
                self.state.devices[device].give(size);
                SUCCESS
            }
            None => INVALID_VALUE,
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
        if let Some(entry) = self.state.devices[device].proc_entry(self.host_pid) {
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
