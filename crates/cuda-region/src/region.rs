//! The region file: create or attach, map, lock. Thin shell over [`crate::accounting`].

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use crate::accounting::{self, Refusal, SlotError};
use crate::layout::{FILE_SIZE, MAGIC, MAX_DEVICES, MAX_PROCS, REGION_SIZE, SharedRegion};
use hami_kernel_locks::file_lock::{flock, record_locked_elsewhere, try_lock_record};

/// First byte of the per-slot liveness locks: past the end of the file, so the reference's
/// `lockf(fd, F_LOCK, sizeof)` range never overlaps them.
const LIVENESS_BASE: usize = FILE_SIZE + 4096;

/// What a creating process writes into a new region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitValues {
    /// Bytes per device, 0 = no limit.
    pub limits: [u64; MAX_DEVICES],
    /// Percent per device.
    pub sm_limits: [u64; MAX_DEVICES],
    pub priority: i32,
}

impl Default for InitValues {
    fn default() -> Self {
        InitValues {
            limits: [0; MAX_DEVICES],
            sm_limits: [100; MAX_DEVICES],
            priority: 1,
        }
    }
}

#[derive(Debug)]
pub enum RegionError {
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The file exists with another size: another layout (v0, pre-v0) or something else.
    WrongSize {
        path: PathBuf,
        size: u64,
    },
    /// The file carries another magic or version.
    Foreign {
        path: PathBuf,
        magic: i32,
        major: u32,
        minor: u32,
    },
    Slots(SlotError),
}

impl std::fmt::Display for RegionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegionError::Io { what, path, source } => write!(
                f,
                "cannot {what} the shared region {}: {source}; make the directory writable or set CUDA_DEVICE_MEMORY_SHARED_CACHE to a writable path",
                path.display()
            ),
            RegionError::WrongSize { path, size } => write!(
                f,
                "{} has {size} bytes, not the {FILE_SIZE} of a HAMi-core 1.2 region; it is from another version: delete it (with no GPU process running) or point CUDA_DEVICE_MEMORY_SHARED_CACHE elsewhere",
                path.display()
            ),
            RegionError::Foreign {
                path,
                magic,
                major,
                minor,
            } => write!(
                f,
                "{} is not a HAMi-core 1.1/1.2 region (magic {magic}, version {major}.{minor}); delete it (with no GPU process running) or point CUDA_DEVICE_MEMORY_SHARED_CACHE elsewhere",
                path.display()
            ),
            RegionError::Slots(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for RegionError {}

/// A mapped region with this process's slot. Dropping it frees the slot and unmaps.
pub struct Region {
    map: *mut SharedRegion,
    file: File,
    path: PathBuf,
    slot: usize,
    /// Serialises this process's writers (threads share the file's locks).
    writers: Mutex<()>,
}

// SAFETY: the mapping is only accessed through `&SharedRegion` (atomics); the raw pointer is
// valid until Drop.
unsafe impl Send for Region {}
// SAFETY: as above; mutation goes through atomics and the `writers` mutex.
unsafe impl Sync for Region {}

/// This process's start time in clock ticks since boot (`/proc/self/stat` field 22).
pub fn own_start_time() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}

impl Region {
    /// Opens `path` (creating it with `init` when new) and claims a slot for this process.
    pub fn attach(path: &Path, init: &InitValues) -> Result<Region, RegionError> {
        let io_err = |what: &'static str| {
            let path = path.to_path_buf();
            move |source| RegionError::Io { what, path, source }
        };
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o666)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(io_err("open"))?;
        // Held until the slot is claimed; closing the file on an error path drops it too.
        flock(&file, libc::LOCK_EX).map_err(io_err("lock"))?;
        let size = file.metadata().map_err(io_err("stat"))?.len();
        if size == 0 {
            // 0666 without touching the process umask (the reference sets umask(0)).
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
            file.set_len(FILE_SIZE as u64).map_err(io_err("size"))?;
        } else if size != FILE_SIZE as u64 && size != REGION_SIZE as u64 {
            return Err(RegionError::WrongSize {
                path: path.to_path_buf(),
                size,
            });
        }
        // SAFETY: maps REGION_SIZE bytes of a file at least that long, shared read-write; the
        // result is checked before use and unmapped in Drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io_err("map")(io::Error::last_os_error()));
        }
        let mut region = Region {
            map: map.cast(),
            file,
            path: path.to_path_buf(),
            slot: usize::MAX,
            writers: Mutex::new(()),
        };
        let result = region.init_and_claim(init);
        let _ = flock(&region.file, libc::LOCK_UN);
        result.map(|slot| {
            region.slot = slot;
            region
        })
    }

    fn init_and_claim(&self, init: &InitValues) -> Result<usize, RegionError> {
        let shared = self.shared();
        let magic = shared.initialized_flag.load(Acquire);
        if magic == 0 {
            accounting::initialize(shared, &init.limits, &init.sm_limits, init.priority);
        } else {
            let (major, minor) = (
                shared.major_version.load(Relaxed),
                shared.minor_version.load(Relaxed),
            );
            if magic != MAGIC || major != 1 || !matches!(minor, 1 | 2) {
                return Err(RegionError::Foreign {
                    path: self.path.clone(),
                    magic,
                    major,
                    minor,
                });
            }
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let slot = accounting::claim_slot(shared, pid, own_start_time(), &|i| self.slot_alive(i))
            .map_err(RegionError::Slots)?;
        match try_lock_record(&self.file, LIVENESS_BASE + slot) {
            Ok(true) => Ok(slot),
            Ok(false) => Err(RegionError::Io {
                what: "lock the process slot of",
                path: self.path.clone(),
                source: io::Error::other("slot lock held elsewhere"),
            }),
            Err(source) => Err(RegionError::Io {
                what: "lock the process slot of",
                path: self.path.clone(),
                source,
            }),
        }
    }

    pub fn shared(&self) -> &SharedRegion {
        // SAFETY: the mapping is REGION_SIZE bytes, page-aligned, alive until Drop; every
        // field is valid for any bit pattern and only accessed through atomics.
        unsafe { &*self.map }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn slot_index(&self) -> usize {
        self.slot
    }

    /// A slot is alive while its owner holds the slot's record lock and its pid exists. A
    /// failing probe counts as alive: never take bytes away on doubt.
    pub fn slot_alive(&self, index: usize) -> bool {
        if index == self.slot {
            return true;
        }
        let locked = record_locked_elsewhere(&self.file, LIVENESS_BASE + index).unwrap_or(true);
        let pid = self.shared().procs[index].pid.load(Relaxed);
        // SAFETY: kill with signal 0 only checks for existence.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        locked && !gone
    }

    /// Limits stored in the region that differ from `init` (the stored ones win).
    pub fn limit_mismatches(&self, init: &InitValues) -> Vec<(usize, u64, u64)> {
        (0..MAX_DEVICES)
            .filter_map(|d| {
                let stored = self.shared().limit[d].load(Relaxed);
                (stored != init.limits[d]).then_some((d, stored, init.limits[d]))
            })
            .collect()
    }

    pub fn limit(&self, device: usize) -> u64 {
        self.shared()
            .limit
            .get(device)
            .map_or(0, |l| l.load(Relaxed))
    }

    pub fn sm_limit(&self, device: usize) -> u64 {
        self.shared()
            .sm_limit
            .get(device)
            .map_or(100, |l| l.load(Relaxed))
    }

    pub fn device_usage(&self, device: usize) -> u64 {
        accounting::device_usage(self.shared(), device)
    }

    /// Reserves `bytes` on `device` for this process (region lock held for the check+add).
    pub fn reserve(&self, device: usize, bytes: u64) -> Result<(), Refusal> {
        let _writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        if flock(&self.file, libc::LOCK_EX).is_err() {
            return Err(Refusal {
                device,
                requested: bytes,
                used: 0,
                limit: 0,
            });
        }
        let mut result = accounting::reserve(self.shared(), self.slot, device, bytes);
        if result.is_err() {
            // Dead processes' bytes are reclaimed, then the check runs once more.
            let freed = accounting::reclaim_dead(self.shared(), &|i| self.slot_alive(i));
            if freed > 0 {
                result = accounting::reserve(self.shared(), self.slot, device, bytes);
            }
        }
        let _ = flock(&self.file, libc::LOCK_UN);
        result
    }

    /// Returns `bytes` of `device`.
    pub fn release(&self, device: usize, bytes: u64) -> u64 {
        let _writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        accounting::release(self.shared(), self.slot, device, bytes)
    }

    /// Frees dead processes' slots now.
    pub fn reclaim_dead(&self) -> usize {
        if flock(&self.file, libc::LOCK_EX).is_err() {
            return 0;
        }
        let freed = accounting::reclaim_dead(self.shared(), &|i| self.slot_alive(i));
        let _ = flock(&self.file, libc::LOCK_UN);
        freed
    }

    pub fn set_hostpid(&self, hostpid: i32) {
        self.shared().procs[self.slot]
            .hostpid
            .store(hostpid, Relaxed);
    }

    /// Records the device count and UUIDs (when not yet recorded or different).
    pub fn set_devices(&self, uuids: &[String]) {
        let same = self.shared().device_num.load(Relaxed) as usize == uuids.len().min(MAX_DEVICES)
            && uuids
                .iter()
                .enumerate()
                .all(|(d, u)| self.shared().uuid(d) == *u);
        if !same {
            accounting::set_devices(self.shared(), uuids);
        }
    }

    /// Occupied slots as (index, pid, hostpid).
    pub fn occupied_slots(&self) -> Vec<(usize, i32, i32)> {
        let shared = self.shared();
        let count = shared.proc_num.load(Acquire).clamp(0, MAX_PROCS as i32) as usize;
        (0..count)
            .filter(|i| shared.procs[*i].status.load(Acquire) != 0)
            .map(|i| {
                let slot = &shared.procs[i];
                (i, slot.pid.load(Relaxed), slot.hostpid.load(Relaxed))
            })
            .collect()
    }

    /// Leaves the region without freeing the slot or unmapping (a forked child dropping its
    /// parent's handle: the slot belongs to the parent).
    pub fn forget(self) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: reads the fields out of a ManuallyDrop that is never used again; the file
        // is closed, the mapping removed, the slot left to its owner.
        unsafe {
            let file = std::ptr::read(&this.file);
            drop(file);
            let path = std::ptr::read(&this.path);
            drop(path);
            libc::munmap(this.map.cast(), REGION_SIZE);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.slot < MAX_PROCS && flock(&self.file, libc::LOCK_EX).is_ok() {
            accounting::free_slot(self.shared(), self.slot);
            let _ = flock(&self.file, libc::LOCK_UN);
        }
        // SAFETY: unmaps the mapping made in attach; no reference into it outlives self.
        unsafe { libc::munmap(self.map.cast(), REGION_SIZE) };
    }
}
