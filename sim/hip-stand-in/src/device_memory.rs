//! The devices' memory: how many bytes are in use on each, and the most ever in use. With
//! `FAKE_HIP_SHARED_STATE` the counters live in a file every process maps, so, like a real
//! GPU, the devices are shared by all processes and their peaks are what the device saw.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::config::MAX_DEVICES;

/// One device's counters; the shared file is `[DeviceCounters; 64]`, 1 KiB.
#[repr(C)]
pub struct DeviceCounters {
    pub used: AtomicU64,
    pub peak: AtomicU64,
}

pub struct DeviceMemory {
    counters: &'static [DeviceCounters; MAX_DEVICES],
    capacity: u64,
}

const STATE_SIZE: usize = size_of::<[DeviceCounters; MAX_DEVICES]>();

impl DeviceMemory {
    pub fn open(shared_state: Option<&Path>, capacity: u64) -> Result<DeviceMemory, String> {
        let counters = match shared_state {
            None => Box::leak(Box::new(std::array::from_fn(|_| DeviceCounters {
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
            }))),
            Some(path) => map_shared(path)?,
        };
        Ok(DeviceMemory { counters, capacity })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used(&self, device: usize) -> u64 {
        self.counters[device].used.load(Relaxed)
    }

    /// Takes `size` bytes of `device` if the device has them.
    pub fn take(&self, device: usize, size: u64) -> bool {
        let counters = &self.counters[device];
        let taken = counters.used.fetch_update(Relaxed, Relaxed, |used| {
            used.checked_add(size)
                .filter(|total| *total <= self.capacity)
        });
        match taken {
            Ok(before) => {
                counters.peak.fetch_max(before + size, Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    pub fn give_back(&self, device: usize, size: u64) {
        let _ = self.counters[device]
            .used
            .fetch_update(Relaxed, Relaxed, |used| Some(used.saturating_sub(size)));
    }
}

fn map_shared(path: &Path) -> Result<&'static [DeviceCounters; MAX_DEVICES], String> {
    let fail = |what: &str, err: std::io::Error| {
        format!(
            "FAKE_HIP_SHARED_STATE {}: cannot {what}: {err}",
            path.display()
        )
    };
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| fail("open", e))?;
    file.lock().map_err(|e| fail("lock", e))?;
    let len = file.metadata().map_err(|e| fail("stat", e))?.len();
    if len < STATE_SIZE as u64 {
        file.set_len(STATE_SIZE as u64)
            .map_err(|e| fail("size", e))?;
    }
    let _ = file.unlock();
    // SAFETY: maps STATE_SIZE bytes of a file at least that long, shared, never unmapped
    // (the stand-in lives as long as the process); checked before use.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STATE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if raw == libc::MAP_FAILED || raw.is_null() {
        return Err(fail("map", std::io::Error::last_os_error()));
    }
    // SAFETY: page-aligned, STATE_SIZE bytes, all atomics, alive for the process's life.
    Ok(unsafe { &*raw.cast::<[DeviceCounters; MAX_DEVICES]>() })
}
